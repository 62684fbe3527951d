//! Child processes of the lab: started with their output in a log file, waited on until ready with a bounded
//! timeout, and stopped by PID (SIGTERM, a short grace period, then SIGKILL). Never by name.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a stopped process gets to exit after SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(5);

/// A running lab process and the log file its stdout and stderr go to.
#[derive(Debug)]
pub(crate) struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// Signals go to the process group the child leads, not only to the child.
    group: bool,
    /// What asks it to stop (SIGTERM unless [`Proc::stopped_by`] says otherwise).
    stop_signal: libc::c_int,
    /// A node's runtime: the lab fails the test when it died ([`Proc::watched`]).
    watched: bool,
}

impl Proc {
    /// Starts `command` with stdin closed and stdout + stderr appended to `log`.
    pub(crate) fn spawn(name: &str, command: Command, log: &Path) -> Result<Proc> {
        Proc::start(name, command, log, false)
    }

    /// [`Proc::spawn`] in a process group of its own, which stopping and killing signal as a whole: for a
    /// command that runs the real process as its child (`nsenter` entering a PID namespace forks).
    pub(crate) fn spawn_group(name: &str, mut command: Command, log: &Path) -> Result<Proc> {
        command.process_group(0);
        Proc::start(name, command, log, true)
    }

    fn start(name: &str, mut command: Command, log: &Path, group: bool) -> Result<Proc> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        // If the test process dies without unwinding (SIGTERM, SIGKILL, abort), Drop never runs: have the
        // kernel kill the child with it, so no containerd or registry outlives its lab. The kernel ties this
        // to the spawning *thread*: start a lab on the thread that owns it (never inside spawn_blocking).
        // SAFETY: prctl is async-signal-safe and touches only the calling (child) process.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            group,
            stop_signal: libc::SIGTERM,
            watched: false,
        })
    }

    /// The same process, asked to stop with `signal` rather than SIGTERM (stargz-snapshotter unmounts its
    /// layers on SIGINT only).
    pub(crate) fn stopped_by(mut self, signal: libc::c_int) -> Proc {
        self.stop_signal = signal;
        self
    }

    /// The same process, watched: a node's runtime, which must not die during a test. When the lab stops,
    /// [`Proc::death`] says whether it did.
    pub(crate) fn watched(mut self) -> Proc {
        self.watched = true;
        self
    }

    /// When this watched process exited by itself: its name, how it exited and the end of its log.
    pub(crate) fn death(&mut self) -> Option<String> {
        if !self.watched {
            return None;
        }
        let status = self.child.try_wait().ok()??;
        Some(format!(
            "{} died during the test ({status})\n{}",
            self.name,
            log_tail(&self.log)
        ))
    }

    /// Polls `probe` every 100 ms until it returns true, failing early if the process exits and after
    /// `timeout`. Errors carry the tail of the process log.
    pub(crate) fn wait_ready(
        &mut self,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if probe() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during startup ({status})\n{}",
                    self.name,
                    log_tail(&self.log)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} was not ready after {timeout:?}\n{}",
                    self.name,
                    log_tail(&self.log)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Proc {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.has_exited() {
            if Instant::now() >= deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILL, as a crash: the process gets no chance to clean up. Returns once it is gone.
    pub(crate) fn kill(&mut self) -> Result<()> {
        self.signal(libc::SIGKILL);
        self.child.wait()?;
        Ok(())
    }

    /// Sends `signal` to the process (or its group), unless it has exited.
    fn signal(&mut self, signal: libc::c_int) {
        if let Ok(None) = self.child.try_wait() {
            let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
            let target = if self.group { -pid } else { pid };
            // SAFETY: kill(2) takes no pointers; the PID is our own unreaped child (and the group it leads),
            // so it cannot have been reused by another process.
            unsafe { libc::kill(target, signal) };
        }
    }
}

/// Stops all `procs`: each one's stop signal (SIGTERM unless it says otherwise), then SIGKILL to those still
/// running after [`GRACE`].
pub(crate) fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        p.signal(p.stop_signal);
    }
    let deadline = Instant::now() + GRACE;
    for p in procs.iter_mut() {
        while matches!(p.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = p.child.try_wait() {
            eprintln!(
                "lab: {} did not exit when asked to stop; killing it",
                p.name
            );
            p.signal(libc::SIGKILL);
            let _ = p.child.wait();
        }
    }
}

/// A loopback port that was free a moment ago (bind port 0, read it, close).
/// `command` with SIGHUP's default disposition, for a shell that traps it: a shell cannot trap a signal
/// ignored when it starts, and tests run under `nohup` ignore SIGHUP.
pub(crate) fn hup_trappable(command: &mut Command) -> &mut Command {
    // SAFETY: signal() is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        })
    }
}

pub fn free_port() -> Result<u16> {
    free_port_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A port of `ip` (an address of this machine) that was free a moment ago.
pub(crate) fn free_port_on(ip: IpAddr) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// The last lines of a log file, headed by its path, for error messages.
pub(crate) fn log_tail(log: &Path) -> String {
    const LINES: usize = 30;
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("(unreadable: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
    format!("--- last {LINES} lines of {} ---\n{tail}", log.display())
}

/// Runs a short command to completion, failing with its output if it does not succeed.
pub(crate) fn run(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

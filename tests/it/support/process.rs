//! Child processes of the lab: started with their output in a log file, waited on until ready with a bounded
//! timeout, and stopped by PID (SIGTERM, a short grace period, then SIGKILL). Never by name.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a stopped process gets to exit after SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(5);

/// A running lab process and the log file its stdout and stderr go to.
pub(crate) struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `command` with stdin closed and stdout + stderr appended to `log`.
    pub(crate) fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Proc> {
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
        })
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

    /// SIGKILL, as a crash: the process gets no chance to clean up. Returns once it is gone.
    pub(crate) fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

/// Stops all `procs`: SIGTERM to each, then SIGKILL to those still running after [`GRACE`].
pub(crate) fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        if let Ok(None) = p.child.try_wait() {
            let pid = libc::pid_t::try_from(p.child.id()).expect("pid fits pid_t");
            // SAFETY: kill(2) takes no pointers; the PID is our own unreaped child, so it cannot have been
            // reused by another process.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    let deadline = Instant::now() + GRACE;
    for p in procs.iter_mut() {
        while matches!(p.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = p.child.try_wait() {
            eprintln!("lab: {} did not exit after SIGTERM; killing it", p.name);
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// A loopback port that was free a moment ago (bind port 0, read it, close).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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

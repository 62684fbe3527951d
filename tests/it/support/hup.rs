//! A process that only records SIGHUPs: it stands in for a CRI-O that pinboard signals through its
//! pidfile, where the stand-in of `crio.rs` (a whole CRI server) is more than a test needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Appends a line to `log` on every SIGHUP, its pid in `pidfile`; killed when dropped.
pub struct HupRecorder {
    child: Child,
    pub pidfile: PathBuf,
    pub log: PathBuf,
}

impl HupRecorder {
    /// Starts it with `crio.pid` and `hup.log` in `dir`, and returns once its trap is set: a SIGHUP before
    /// that would end it, as a HUP ends any shell.
    pub fn start(dir: &Path) -> HupRecorder {
        std::fs::create_dir_all(dir).expect("the recorder's directory");
        let (pidfile, log, ready) = (
            dir.join("crio.pid"),
            dir.join("hup.log"),
            dir.join("hup.ready"),
        );
        let mut command = Command::new("bash");
        command.arg("-c").arg(format!(
            "trap 'echo hup >> {}' HUP; touch {}; while :; do sleep 0.05; done",
            log.display(),
            ready.display()
        ));
        super::process::hup_trappable(&mut command);
        let child = command.spawn().expect("bash runs");
        std::fs::write(&pidfile, format!("{}\n", child.id())).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "the SIGHUP recorder never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        HupRecorder {
            child,
            pidfile,
            log,
        }
    }

    /// SIGHUPs recorded so far.
    pub fn hups(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |t| t.lines().count())
    }

    /// SIGHUPs recorded once `count` have arrived (or 5 s passed), and a pending trap has had time to run:
    /// so a test also sees one too many.
    pub fn settled_hups(&self, count: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.hups() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        self.hups()
    }
}

impl Drop for HupRecorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

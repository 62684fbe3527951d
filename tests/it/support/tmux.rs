//! A real terminal for TUI tests: a tmux server of the test's own (so no other session interferes), one
//! session running a command at a given size; the server is killed when dropped.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const SESSION: &str = "test";
/// A pause after each key, so the TUI handles them one at a time, in order.
const KEY_PAUSE: Duration = Duration::from_millis(150);

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `command` (through the shell) in a `width`×`height` session of a new server named after
    /// `name`, this process and a number unique in it (suites running at once may pick the same name).
    pub fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmux = Tmux {
            socket: format!("pinboard-{name}-{}-{n}", std::process::id()),
        };
        let (width, height) = (width.to_string(), height.to_string());
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            &width,
            "-y",
            &height,
            command,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends keys by their tmux names (`Enter`, `Escape`, `a`).
    pub fn keys(&self, keys: &[&str]) {
        for key in keys {
            self.run(&["send-keys", "-t", SESSION, key]);
            std::thread::sleep(KEY_PAUSE);
        }
    }

    /// Types `text` as it is.
    pub fn literal(&self, text: &str) {
        self.run(&["send-keys", "-t", SESSION, "-l", text]);
        std::thread::sleep(KEY_PAUSE);
    }

    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-t", SESSION, "-p"])
    }

    /// A pane variable, e.g. `alternate_on`.
    pub fn pane(&self, variable: &str) -> String {
        let format = format!("#{{{variable}}}");
        self.run(&["display-message", "-p", "-t", SESSION, &format])
            .trim()
            .to_string()
    }

    /// Waits until the screen shows `text`; panics with the screen when it does not within `limit`.
    pub fn wait_for(&self, text: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} did not appear within {limit:?}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

//! Running the `pinboard` binary from integration tests: its exit code and both output streams.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables that point pinboard at the machine user's auth files, certificates or kubeconfig.
const USER_FILES: [&str; 7] = [
    "REGISTRY_AUTH_FILE",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "DOCKER_CONFIG",
    "KUBECONFIG",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The binary cargo built for these tests; for the lab example (which cargo gives no such variable),
/// `PINBOARD_BIN` or the debug build.
pub fn binary() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_pinboard") {
        Some(binary) => PathBuf::from(binary),
        None => std::env::var_os("PINBOARD_BIN").map_or_else(
            || super::lab::target_dir().join("debug/pinboard"),
            PathBuf::from,
        ),
    }
}

/// Runs the binary cargo built for these tests with `args`.
pub fn pinboard<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Run {
    pinboard_with(args, |_| {})
}

/// [`pinboard`], with the command adjusted first (its environment, say).
pub fn pinboard_with<S: AsRef<OsStr>>(
    args: impl IntoIterator<Item = S>,
    adjust: impl FnOnce(&mut Command),
) -> Run {
    let mut command = Command::new(binary());
    command.args(args);
    adjust(&mut command);
    let out = command.output().expect("pinboard runs");
    Run {
        code: out
            .status
            .code()
            .expect("pinboard exited, not killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// For [`pinboard_with`]: `home` as `HOME`, and none of the variables that name the machine user's auth
/// files, certificates or kubeconfig, so only what the test puts there is read.
pub fn isolated(home: &Path) -> impl FnOnce(&mut Command) + '_ {
    move |command| {
        command.env("HOME", home);
        for var in USER_FILES {
            command.env_remove(var);
        }
    }
}

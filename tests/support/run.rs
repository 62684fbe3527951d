//! Running the `pinboard` binary from integration tests: its exit code and both output streams.

use std::ffi::OsStr;
use std::process::Command;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary cargo built for these tests with `args`.
pub fn pinboard<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Run {
    // Only test and bench targets get this variable; the lab example compiles this module too.
    let Some(binary) = option_env!("CARGO_BIN_EXE_pinboard") else {
        panic!("only integration tests and benches run the pinboard binary")
    };
    let out = Command::new(binary)
        .args(args)
        .output()
        .expect("pinboard runs");
    Run {
        code: out
            .status
            .code()
            .expect("pinboard exited, not killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

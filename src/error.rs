//! Exit codes and the one error type the commands end with. Every message names the problem and the fix.

use std::fmt;

/// pinboard's documented exit codes (docs/exit-codes.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// `check`: not every image is present and pinned everywhere.
    NotReady = 1,
    /// The input is wrong: a set breaks a rule, a file is malformed, an image cannot be resolved.
    BadInput = 2,
    /// No target could be reached.
    Unreachable = 3,
}

/// Why a command stopped: one or more lines for stderr and the exit code they mean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub exit: Exit,
    pub lines: Vec<String>,
}

impl Failure {
    pub fn bad_input(line: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::BadInput,
            lines: vec![line.into()],
        }
    }

    pub fn unreachable(lines: Vec<String>) -> Failure {
        Failure {
            exit: Exit::Unreachable,
            lines,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

impl std::error::Error for Failure {}

//! The `pinboard` binary: parses the command line, runs the command, maps the outcome to an exit code.

use std::io::Write;
use std::process::ExitCode;

use pinboard::cli::{Command, parse, run, stderr_log};

fn main() -> ExitCode {
    pinboard::install_crypto_provider();
    let cli = parse();
    let command = cli.command.unwrap_or(Command::Tui(cli.tui));
    // The TUI owns the terminal: it logs to a file. Headless commands log to stderr (warnings by default,
    // as `warning:` lines; PINBOARD_LOG=debug for more) and keep stdout for their output.
    let _log_guard = match &command {
        Command::Tui(_) => match pinboard::ui::run::init_file_logging() {
            Ok(guard) => Some(guard),
            Err(e) => {
                eprintln!(
                    "error: cannot open the log file: {e:#}; set XDG_STATE_HOME to a writable directory"
                );
                return ExitCode::from(pinboard::error::Exit::BadInput as u8);
            }
        },
        _ => {
            // The agent says what it does (its pod's log); a command only what went wrong.
            stderr_log::init(match &command {
                Command::Agent(_) => stderr_log::AGENT_FILTER,
                _ => stderr_log::COMMAND_FILTER,
            });
            None
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime starts");
    match runtime.block_on(run(command)) {
        Ok(output) => {
            // A closed pipe (`pinboard plan | head`) is not an error worth a panic.
            let _ = std::io::stdout().write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(failure) => {
            for line in &failure.lines {
                eprintln!("error: {line}");
            }
            ExitCode::from(failure.exit as u8)
        }
    }
}

//! The headless commands' logs on stderr, beside their own `error:` and `warning:` lines: a warning or an
//! error logged reads like those, one line, `warning: MESSAGE (FIELD: VALUE, …)`, without a timestamp or
//! module path (a dependency's line names its crate: `warning: rustls: …`). Levels below warning (only
//! with `PINBOARD_LOG=info` or `debug`) keep tracing's full line, with its timestamp, level and module
//! path, for finding where something happened. Colour only on a terminal, and never with `NO_COLOR`.

use std::fmt::{self, Write as _};
use std::io::IsTerminal as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Warnings, but not kube's "Server cert bypassed" once per connection (`cluster::connect` says it once),
/// nor its error line for every refused request (pinboard says what each refusal means).
pub const COMMAND_FILTER: &str =
    "warn,kube_client::client::tls=error,kube_client::client::builder=off";

/// The agent's: what it starts, rolls out and releases, as well as the warnings.
pub const AGENT_FILTER: &str =
    "info,kube_client=warn,kube_runtime=warn,kube_client::client::tls=error";

/// Logs to stderr, at `PINBOARD_LOG`'s levels (default: `default_filter`).
pub fn init(default_filter: &str) {
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("PINBOARD_LOG")
                .unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .event_format(StderrLines {
            full: Format::default().with_ansi(colour),
        })
        .init();
}

/// `warning: …` and `error: …` lines; tracing's full format below warning.
struct StderrLines {
    full: Format,
}

impl<S, N> FormatEvent<S, N> for StderrLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let word = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            _ => return self.full.format_event(ctx, writer, event),
        };
        let mut said = Said::default();
        event.record(&mut said);
        let target = said
            .log_target
            .as_deref()
            .unwrap_or(event.metadata().target());
        writeln!(writer, "{}", said.line(word, target))
    }
}

/// What an event says: its message and fields, and for a `log` record the target it was logged under.
#[derive(Default)]
struct Said {
    message: String,
    fields: Vec<(&'static str, String)>,
    log_target: Option<String>,
}

impl Said {
    /// `warning: [crate: ]message (field: value, …)`, on one line.
    fn line(&self, word: &str, target: &str) -> String {
        let mut line = format!("{word}: ");
        let source = target.split("::").next().unwrap_or(target);
        if source != env!("CARGO_CRATE_NAME") {
            let _ = write!(line, "{source}: ");
        }
        line.push_str(&self.message);
        if !self.fields.is_empty() {
            let fields: Vec<String> = self
                .fields
                .iter()
                .map(|(name, value)| format!("{name}: {value}"))
                .collect();
            let _ = write!(line, " ({})", fields.join(", "));
        }
        // A message of several lines is still one problem: one line on stderr.
        line.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Visit for Said {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "log.target" => self.log_target = Some(value.to_string()),
            // The `log` record's source location: the module path and file this line leaves out.
            name if name.starts_with("log.") => {}
            name => self.fields.push((name, value.to_string())),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            name if name.starts_with("log.") => {}
            name => self.fields.push((name, format!("{value:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(message: &str, fields: &[(&'static str, &str)]) -> Said {
        Said {
            message: message.into(),
            fields: fields.iter().map(|(n, v)| (*n, v.to_string())).collect(),
            log_target: None,
        }
    }

    #[test]
    fn a_warning_reads_like_pinboards_own_lines() {
        let line = said("n1: cannot ask whether the runtime is ready: timeout", &[])
            .line("warning", "pinboard::backend::readiness");
        assert_eq!(
            line,
            "warning: n1: cannot ask whether the runtime is ready: timeout"
        );
    }

    #[test]
    fn fields_follow_the_message_and_a_dependency_is_named() {
        let line = said(
            "skipping unreadable auth file",
            &[("path", "/a.json"), ("error", "denied")],
        )
        .line("error", "pinboard::backend::credentials");
        assert_eq!(
            line,
            "error: skipping unreadable auth file (path: /a.json, error: denied)"
        );
        let line = said("handshake failed", &[]).line("warning", "rustls::client::hs");
        assert_eq!(line, "warning: rustls: handshake failed");
    }

    #[test]
    fn a_message_of_several_lines_is_one_line() {
        let line = said("first\nsecond\n", &[]).line("warning", "pinboard");
        assert_eq!(line, "warning: first; second");
    }
}

//! The terminal loop: one task owns the state; terminal events, backend messages and a 1 s tick become
//! [`Msg`]s; [`update`] turns them into [`Cmd`]s for the [`UiBackend`]; the screen is drawn only when the
//! state says something changed. The terminal is restored on every exit path, panics included.

use std::io::stdout;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::cursor::Show;
use crossterm::event::{
    DisableBracketedPaste, EnableBracketedPaste, Event as TermEvent, EventStream, KeyEventKind,
};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use futures::StreamExt;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tracing_subscriber::EnvFilter;

use super::msg::{Cmd, Msg};
use super::render::render;
use super::state::State;
use super::update::update;
use crate::backend::registry::Registry;
use crate::error::Failure;
use crate::fleet::sets::release_note;
use crate::model::image::Platform;
use crate::model::release_payload::SetOptions;

/// Messages handled before a redraw at most: a burst of engine events gives one frame, not thousands.
const BATCH: usize = 1024;

/// What carries out the UI's commands: surveys, the engine, node config writers, files. Implementations
/// must not block: start the work (e.g. `tokio::spawn`) and report back through `tx`.
pub trait UiBackend {
    /// Called once before the first frame, e.g. to start observing nodes (`Msg::NodesUpdated`).
    fn start(&mut self, tx: &UnboundedSender<Msg>);
    /// Every command but [`Cmd::Quit`], which the loop handles.
    fn execute(&mut self, cmd: Cmd, tx: &UnboundedSender<Msg>);
}

/// Carries out the file commands on tokio tasks, answering with `Msg::FileRead` / `Msg::FileWritten`;
/// hands every other command back. For [`UiBackend::execute`] implementations to call first.
pub fn execute_file_cmd(cmd: Cmd, tx: &UnboundedSender<Msg>) -> Option<Cmd> {
    let tx = tx.clone();
    match cmd {
        Cmd::ReadFile(path, purpose) => {
            tokio::spawn(async move {
                let result = tokio::fs::read_to_string(&path)
                    .await
                    .map_err(|e| Failure::bad_input(e.to_string()));
                let _ = tx.send(Msg::FileRead {
                    path,
                    purpose,
                    result,
                });
            });
            None
        }
        Cmd::WriteFile(path, text) => {
            tokio::spawn(async move {
                let result = tokio::fs::write(&path, text)
                    .await
                    .map_err(|e| Failure::bad_input(e.to_string()));
                let _ = tx.send(Msg::FileWritten { path, result });
            });
            None
        }
        other => Some(other),
    }
}

/// Reads the sets of the release `pullspec` for the import prompt, off the UI task, and sends them (or why
/// not) as [`Msg::ReleaseRead`]. The same path as `--release`.
pub fn read_release(
    registry: Arc<Registry>,
    platform: Platform,
    options: SetOptions,
    pullspec: String,
    tx: &UnboundedSender<Msg>,
) {
    let tx = tx.clone();
    tokio::spawn(async move {
        let read = crate::fleet::payload::sets(&registry, &pullspec, &platform, &options)
            .await
            .map(|(resolved, made)| {
                let note = release_note(&resolved, &made);
                (made.sets, note)
            })
            .map_err(Failure::from);
        let _ = tx.send(Msg::ReleaseRead(read));
    });
}

/// Runs the TUI until `:q`, `q` or Ctrl-C.
pub async fn run(mut state: State, mut backend: impl UiBackend) -> anyhow::Result<()> {
    let _guard = TerminalGuard::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout()))?;
    let (tx, mut rx) = unbounded_channel();
    backend.start(&tx);
    let size = terminal.size()?;
    update(
        &mut state,
        Msg::Resize {
            width: size.width,
            height: size.height,
        },
    );
    let mut events = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        if state.take_dirty() {
            terminal.draw(|frame| render(&state, frame))?;
        }
        let msg = tokio::select! {
            event = events.next() => match event {
                Some(event) => match terminal_msg(event?) {
                    Some(msg) => msg,
                    None => continue,
                },
                None => return Ok(()),
            },
            // `tx` lives here, so the channel never closes.
            Some(msg) = rx.recv() => msg,
            _ = tick.tick() => Msg::Tick(Instant::now()),
        };
        if handle(&mut state, &mut backend, &tx, msg) {
            return Ok(());
        }
        for _ in 0..BATCH {
            let Ok(msg) = rx.try_recv() else { break };
            if handle(&mut state, &mut backend, &tx, msg) {
                return Ok(());
            }
        }
    }
}

/// Updates the state and runs the resulting commands; true when the UI should quit.
fn handle(
    state: &mut State,
    backend: &mut impl UiBackend,
    tx: &UnboundedSender<Msg>,
    msg: Msg,
) -> bool {
    for cmd in update(state, msg) {
        match cmd {
            Cmd::Quit => return true,
            cmd => backend.execute(cmd, tx),
        }
    }
    false
}

fn terminal_msg(event: TermEvent) -> Option<Msg> {
    match event {
        // Windows also reports releases; one key press is one message.
        TermEvent::Key(key) if key.kind == KeyEventKind::Press => Some(Msg::Key(key)),
        TermEvent::Paste(text) => Some(Msg::Paste(text)),
        TermEvent::Resize(width, height) => Some(Msg::Resize { width, height }),
        _ => None,
    }
}

/// Raw mode, alternate screen and bracketed paste while alive; restored on drop and on panic.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> anyhow::Result<TerminalGuard> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        enable_raw_mode().context("cannot put the terminal in raw mode")?;
        ENTERED.store(true, Ordering::SeqCst);
        let guard = TerminalGuard;
        execute!(stdout(), EnterAlternateScreen, EnableBracketedPaste)?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Whether the terminal is in the TUI's modes. A panic restores it twice (the hook, then the guard while
/// unwinding); leaving the alternate screen a second time would put the cursor back where the TUI started,
/// and what follows would be printed over the panic message.
static ENTERED: AtomicBool = AtomicBool::new(false);

fn restore_terminal() {
    if !ENTERED.swap(false, Ordering::SeqCst) {
        return;
    }
    // Best effort: there is nowhere left to report a failure to.
    let _ = execute!(stdout(), DisableBracketedPaste, LeaveAlternateScreen, Show);
    let _ = disable_raw_mode();
}

/// Logs to `$XDG_STATE_HOME/pinboard/pinboard.log` (default `~/.local/state/pinboard/`): the TUI owns the
/// terminal, so nothing may be written to it. `PINBOARD_LOG` sets the level (default info). Keep the guard
/// alive until exit: it flushes the log.
pub fn init_file_logging() -> anyhow::Result<tracing_appender::non_blocking::WorkerGuard> {
    let dir = log_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (writer, guard) =
        tracing_appender::non_blocking(tracing_appender::rolling::never(&dir, "pinboard.log"));
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("PINBOARD_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(writer)
        .with_ansi(false)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot start logging: {e}"))?;
    Ok(guard)
}

fn log_dir() -> anyhow::Result<PathBuf> {
    // The XDG spec says relative values are to be ignored.
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let state = match state {
        Some(dir) => dir,
        None => std::env::home_dir()
            .context("no HOME to put the log in: set XDG_STATE_HOME")?
            .join(".local/state"),
    };
    Ok(state.join("pinboard"))
}

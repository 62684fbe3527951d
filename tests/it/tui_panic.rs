//! A panic inside the TUI restores the terminal: this test runs its own test binary in tmux, where a TUI
//! whose backend panics on its first command is drawn, then panics; tmux then says the pane left the
//! alternate screen and shows the cursor, the shell after it finds the terminal cooked again (`stty`, and
//! typed text echoed and read line by line), and the panic message is on the normal screen, at the start
//! of its line (output processing was back before it was printed).

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use pinboard::model::node_summary::NodeSummary;
use pinboard::ui::msg::{Cmd, Msg};
use pinboard::ui::run::{UiBackend, run};
use pinboard::ui::state::State;
use pinboard::ui::theme::Theme;
use support::tmux::Tmux;
use tokio::sync::mpsc::UnboundedSender;

/// Set in the child's environment: only then does [`child_tui_that_panics`] run the TUI.
const CHILD: &str = "PINBOARD_TUI_PANIC_CHILD";
const MESSAGE: &str = "the backend panicked on purpose";

/// Panics on the first command it is given.
struct PanickingBackend;

impl UiBackend for PanickingBackend {
    fn start(&mut self, _tx: &UnboundedSender<Msg>) {}

    fn execute(&mut self, cmd: Cmd, _tx: &UnboundedSender<Msg>) {
        panic!("{MESSAGE} (on {cmd:?})");
    }
}

/// The child: the TUI on a terminal, one node, until `L` asks the backend to toggle lazy pulling.
#[test]
#[ignore = "run by a_panic_in_the_tui_restores_the_terminal, in tmux"]
fn child_tui_that_panics() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let theme = Theme::named("monochrome").unwrap();
    let mut state = State::new("panic test", theme, false, Instant::now());
    state.nodes = vec![NodeSummary {
        name: "n1".into(),
        reachable: Some(true),
        ..NodeSummary::default()
    }];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(run(state, PanickingBackend));
    panic!("the TUI returned instead of panicking: {result:?}");
}

/// The child test, then what the terminal is like after it: its `stty` flags, and a line read.
fn script(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("child.sh");
    let exe = std::env::current_exe().unwrap();
    let text = format!(
        "{CHILD}=1 RUST_BACKTRACE=0 '{exe}' --exact tui_panic::child_tui_that_panics --ignored --nocapture --test-threads=1\n\
         echo \"EXITED $?\"\n\
         echo \"STTY $(stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo|isig|opost)' | tr '\\n' ' ')\"\n\
         read -r line\n\
         echo \"READ:$line\"\n\
         sleep 60\n",
        exe = exe.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_panic_in_the_tui_restores_the_terminal() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let command = format!("bash --norc --noprofile {}", script.display());
    let tmux = Tmux::start("panic", 100, 30, &command);

    // The TUI is up: on the alternate screen, the cursor hidden.
    let tui = tmux.wait_for("1/1 reachable", Duration::from_secs(30));
    assert!(tui.contains(" pinboard  1 Nodes"), "{tui}");
    assert_eq!(tmux.pane("alternate_on"), "1", "{tui}");
    tmux.keys(&["L"]);

    let after = tmux.wait_for("STTY", Duration::from_secs(10));
    assert!(after.contains("EXITED 101"), "the child panicked:\n{after}");
    assert_eq!(
        tmux.pane("alternate_on"),
        "0",
        "the alternate screen was left:\n{after}"
    );
    assert!(
        !after.contains("1 Nodes"),
        "the TUI is not on the normal screen:\n{after}"
    );
    assert_eq!(tmux.pane("cursor_flag"), "1", "the cursor is shown again");
    // Cooked: line editing, echo, signals and output processing are back.
    let stty = after.lines().find(|l| l.starts_with("STTY")).unwrap();
    let mut flags: Vec<&str> = stty.split_whitespace().skip(1).collect();
    flags.sort();
    assert_eq!(flags, ["echo", "icanon", "isig", "opost"], "{after}");
    // The panic message was printed after the restore: on the normal screen, each line at column 0.
    assert!(
        after
            .lines()
            .any(|l| l.starts_with("thread '") && l.contains("panicked at tests/it/tui_panic.rs")),
        "the panic's location is readable:\n{after}"
    );
    assert!(
        after.lines().any(|l| l.starts_with(MESSAGE)),
        "the panic's message is readable:\n{after}"
    );

    // The shell after it reads a typed line, echoed as typed.
    let typed = "typed after the panic";
    tmux.literal(typed);
    tmux.keys(&["Enter"]);
    let read = tmux.wait_for(&format!("READ:{typed}"), Duration::from_secs(10));
    assert!(
        read.lines().any(|l| l == typed),
        "the terminal echoes what is typed:\n{read}"
    );
}

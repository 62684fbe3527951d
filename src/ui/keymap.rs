//! The one table of key bindings: `update` looks keys up in it, `?` and the status line print it, so help
//! cannot drift from what the keys do; and help's lines, grouped by where the bindings work.

use std::fmt;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::state::Screen;

/// A key as bound: code plus Ctrl/Alt (Shift is part of the character: `L`, not Shift-l).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub code: KeyCode,
    pub ctrl: bool,
}

const fn key(c: char) -> Key {
    Key {
        code: KeyCode::Char(c),
        ctrl: false,
    }
}

const fn code(code: KeyCode) -> Key {
    Key { code, ctrl: false }
}

const fn ctrl(c: char) -> Key {
    Key {
        code: KeyCode::Char(c),
        ctrl: true,
    }
}

impl Key {
    pub fn matches(&self, event: &KeyEvent) -> bool {
        self.code == event.code && self.ctrl == event.modifiers.contains(KeyModifiers::CONTROL)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ctrl {
            f.write_str("Ctrl-")?;
        }
        match self.code {
            KeyCode::Char(' ') => f.write_str("Space"),
            KeyCode::Char(c) => write!(f, "{c}"),
            KeyCode::Up => f.write_str("↑"),
            KeyCode::Down => f.write_str("↓"),
            KeyCode::PageUp => f.write_str("PgUp"),
            KeyCode::PageDown => f.write_str("PgDn"),
            KeyCode::Home => f.write_str("Home"),
            KeyCode::End => f.write_str("End"),
            KeyCode::Tab => f.write_str("Tab"),
            KeyCode::Esc => f.write_str("Esc"),
            KeyCode::Enter => f.write_str("Enter"),
            other => write!(f, "{other:?}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    Command,
    Filter,
    Help,
    Back,
    Goto(Screen),
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    /// Next pane of a screen with several (Sets: sets, entries, targets; Rollout: nodes, images; Config:
    /// nodes, diff).
    NextPane,
    Apply,
    Unpin,
    Survey,
    AddImages,
    Import,
    Export,
    NewSet,
    Rename,
    Remove,
    ToggleTarget,
    ToggleLazy,
    ToggleFanOut,
    Retry,
    Cancel,
    /// Judge the rollout's set as `pinboard check` does (on agents: each asks its runtime now).
    CheckNow,
}

pub struct Binding {
    pub keys: &'static [Key],
    pub action: Action,
    pub description: &'static str,
    /// Where it works; empty: everywhere.
    pub screens: &'static [Screen],
    /// Its short name in the status line on its screens, if shown there.
    pub status: Option<&'static str>,
}

const ALL: &[Screen] = &[];
const fn bind(
    keys: &'static [Key],
    action: Action,
    description: &'static str,
    screens: &'static [Screen],
    status: Option<&'static str>,
) -> Binding {
    Binding {
        keys,
        action,
        description,
        screens,
        status,
    }
}

use Screen::{Config, Nodes, Plan, Rollout, Sets};

pub const KEYMAP: &[Binding] = &[
    bind(&[key('q'), ctrl('c')], Action::Quit, "quit", ALL, None),
    bind(
        &[key(':')],
        Action::Command,
        "command: view name, q",
        ALL,
        Some("command"),
    ),
    bind(
        &[key('/')],
        Action::Filter,
        "filter the table",
        ALL,
        Some("filter"),
    ),
    bind(&[key('?')], Action::Help, "help", ALL, Some("help")),
    bind(
        &[code(KeyCode::Esc)],
        Action::Back,
        "close, clear filter, back",
        ALL,
        None,
    ),
    bind(&[key('1')], Action::Goto(Nodes), "nodes screen", ALL, None),
    bind(&[key('2')], Action::Goto(Sets), "sets screen", ALL, None),
    bind(&[key('3')], Action::Goto(Plan), "plan screen", ALL, None),
    bind(
        &[key('4')],
        Action::Goto(Rollout),
        "rollout screen",
        ALL,
        None,
    ),
    bind(
        &[key('5')],
        Action::Goto(Config),
        "config screen",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::Up), key('k')],
        Action::Up,
        "previous row, scroll up",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::Down), key('j')],
        Action::Down,
        "next row, scroll down",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::PageUp)],
        Action::PageUp,
        "page up",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::PageDown)],
        Action::PageDown,
        "page down",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::Home), key('g')],
        Action::Top,
        "first row, top",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::End), key('G')],
        Action::Bottom,
        "last row, bottom",
        ALL,
        None,
    ),
    bind(
        &[code(KeyCode::Tab)],
        Action::NextPane,
        "next pane",
        &[Sets, Rollout, Config],
        Some("pane"),
    ),
    bind(
        &[key('a')],
        Action::Apply,
        "apply the selected set",
        &[Sets, Plan],
        Some("apply"),
    ),
    bind(
        &[key('U')],
        Action::Unpin,
        "unpin the selected set (images stay)",
        &[Sets],
        None,
    ),
    bind(
        &[key('p')],
        Action::Survey,
        "survey: plan every set",
        &[Sets, Plan],
        Some("survey"),
    ),
    bind(
        &[key('i')],
        Action::AddImages,
        "add images (type/paste)",
        &[Sets],
        Some("add"),
    ),
    bind(
        &[key('I')],
        Action::Import,
        "import a list, YAML file or release",
        &[Sets],
        Some("import"),
    ),
    bind(
        &[key('e')],
        Action::Export,
        "export set as YAML",
        &[Sets],
        Some("export"),
    ),
    bind(&[key('n')], Action::NewSet, "new set", &[Sets], None),
    bind(&[key('R')], Action::Rename, "rename set", &[Sets], None),
    bind(
        &[key('d')],
        Action::Remove,
        "remove entry or set",
        &[Sets],
        None,
    ),
    bind(
        &[key(' ')],
        Action::ToggleTarget,
        "toggle target node",
        &[Sets],
        None,
    ),
    bind(
        &[key('L')],
        Action::ToggleLazy,
        "toggle lazy pulling",
        &[Nodes],
        Some("lazy"),
    ),
    bind(
        &[key('f')],
        Action::ToggleFanOut,
        "toggle fan-out (each blob once)",
        &[Plan],
        Some("fan-out"),
    ),
    bind(
        &[key('r')],
        Action::Retry,
        "retry selected image",
        &[Rollout],
        Some("retry"),
    ),
    bind(
        &[key('c')],
        Action::Cancel,
        "cancel selected image",
        &[Rollout],
        Some("cancel"),
    ),
    bind(
        &[key('v')],
        Action::CheckNow,
        "check the set now (agents)",
        &[Rollout],
        Some("check"),
    ),
];

impl Binding {
    pub fn applies_to(&self, screen: Screen) -> bool {
        self.screens.is_empty() || self.screens.contains(&screen)
    }

    /// `↑/k`.
    pub fn keys_label(&self) -> String {
        let keys: Vec<String> = self.keys.iter().map(Key::to_string).collect();
        keys.join("/")
    }
}

/// What a key does on `screen`, if anything.
pub fn lookup(event: &KeyEvent, screen: Screen) -> Option<Action> {
    KEYMAP
        .iter()
        .find(|b| b.applies_to(screen) && b.keys.iter().any(|k| k.matches(event)))
        .map(|b| b.action)
}

/// One line of help.
#[derive(Clone, Copy)]
pub enum HelpLine {
    /// Where the bindings below it work; empty: everywhere.
    Heading(&'static [Screen]),
    Binding(&'static Binding),
}

/// Help's lines: a heading per run of bindings that work on the same screens, then those bindings.
pub fn help_lines() -> impl Iterator<Item = HelpLine> {
    KEYMAP
        .chunk_by(|a, b| a.screens == b.screens)
        .flat_map(|group| {
            std::iter::once(HelpLine::Heading(group[0].screens))
                .chain(group.iter().map(HelpLine::Binding))
        })
}

//! The TUI's state, what can happen to it ([`Msg`]), what it asks the outside world to do ([`Cmd`]), and
//! [`update`], the one pure function between them: no I/O, no clock (time arrives in [`Msg::Tick`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::cluster::ClusterSession;
use super::keymap::{Action, lookup};
use super::layout::{HelpFlow, diff_rows, page_rows};
use super::theme::Theme;
use crate::model::cluster::{ClusterUpdate, KubeletSettings};
use crate::model::config_view::ConfigView;
use crate::model::export::pinned_image_set_yaml;
use crate::model::node_info::NodeInfo;
use crate::model::plan::Verdict;
use crate::model::rollout::{Event, ImageState, NodeRollout, NodeState, Rollout};
use crate::model::set::{self, Entry, ImageSet, Origin, Problem};
use crate::model::units::human;
use crate::survey::Survey;

/// How long a flash message stays.
const FLASH_FOR: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Screen {
    Nodes,
    Sets,
    Plan,
    Rollout,
    Config,
}

impl Screen {
    /// In number-key order.
    pub const ALL: [Screen; 5] = [
        Screen::Nodes,
        Screen::Sets,
        Screen::Plan,
        Screen::Rollout,
        Screen::Config,
    ];

    /// The `:` command that opens it.
    pub fn name(self) -> &'static str {
        match self {
            Screen::Nodes => "nodes",
            Screen::Sets => "sets",
            Screen::Plan => "plan",
            Screen::Rollout => "rollout",
            Screen::Config => "config",
        }
    }
}

/// A set being composed, with the nodes it targets and its validation, kept current on every edit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetDraft {
    pub set: ImageSet,
    pub targets: BTreeSet<String>,
    problems: Vec<Problem>,
}

impl SetDraft {
    pub fn new(set: ImageSet, targets: BTreeSet<String>) -> SetDraft {
        let problems = set.validate();
        SetDraft {
            set,
            targets,
            problems,
        }
    }

    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// The rule this entry breaks, if any. Origins tell duplicates apart.
    pub fn entry_problem(&self, entry: &Entry) -> Option<&Problem> {
        self.problems
            .iter()
            .find(|p| p.entry.as_ref() == Some(&entry.reference) && p.origin == entry.origin)
    }

    fn edit(&mut self, change: impl FnOnce(&mut ImageSet)) {
        change(&mut self.set);
        self.problems = self.set.validate();
    }
}

/// Why a file is read: its text comes back in [`Msg::FileRead`] with the same purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilePurpose {
    /// A list file or PinnedImageSet YAML for the Sets screen.
    ImportSet,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    Paste(String),
    Resize {
        width: u16,
        height: u16,
    },
    Tick(Instant),
    NodesUpdated(Vec<NodeInfo>),
    SurveyDone(Result<Survey, String>),
    Rollout(Event),
    /// The rollout is fanned out, but for these nodes, which pull directly.
    FanOut(Vec<String>),
    /// Fan-out: bytes the blob cache took over the registry link since the rollout started.
    LinkBytes(u64),
    /// The engine has nothing more to do; `Err` says why it stopped early.
    EngineFinished(Result<(), String>),
    FileRead {
        path: PathBuf,
        purpose: FilePurpose,
        result: Result<String, String>,
    },
    FileWritten {
        path: PathBuf,
        result: Result<(), String>,
    },
    /// Per node, replacing what was there for those nodes.
    ConfigViews(BTreeMap<String, ConfigView>),
    /// What the backend has to say (a failure, a warning, an outcome): shown as a flash message.
    Notice(String),
    /// Cluster mode: a change from the watchers.
    Cluster(ClusterUpdate),
    /// Cluster mode: what some nodes' kubelet configurations say (read once per node).
    Kubelets(HashMap<String, KubeletSettings>),
    /// A release read for import: its sets and what to say of it, or why it could not be read.
    ReleaseRead(Result<(Vec<ImageSet>, String), String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    Quit,
    /// Survey `nodes` (the union of the sets' targets) for every set.
    Survey {
        sets: Vec<ImageSet>,
        nodes: Vec<String>,
    },
    /// Pull and pin `set` on `nodes`; without `force`, the engine refuses nodes whose verdict is no-space;
    /// with `fan_out`, the nodes pull through pinboard's blob cache.
    Apply {
        set: ImageSet,
        nodes: Vec<String>,
        force: bool,
        fan_out: bool,
    },
    /// Remove `set`'s pins from `nodes`; images stay.
    Unpin {
        set: ImageSet,
        nodes: Vec<String>,
    },
    Retry {
        node: String,
        image: String,
    },
    Cancel {
        node: String,
        image: String,
    },
    ReadFile(PathBuf, FilePurpose),
    /// Read a release payload's sets (a pull spec typed at the import prompt).
    ImportRelease(String),
    WriteFile(PathBuf, String),
    ToggleLazy {
        node: String,
        enable: bool,
    },
}

/// A table whose selection is remembered, by the selected row's identity (node name, set name, reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pane {
    Nodes,
    Sets,
    Entries,
    Targets,
    Plan,
    RolloutNodes,
    RolloutImages,
    Config,
    /// The selected node's diff on the Config screen: not a table, the moving keys scroll it.
    ConfigDiff,
}

/// What a one-line input box is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prompt {
    AddImages,
    ImportPath,
    ExportPath,
    NewSet,
    Rename,
}

impl Prompt {
    pub fn label(self) -> &'static str {
        match self {
            Prompt::AddImages => "add images (paste or type, space/newline separated)",
            Prompt::ImportPath => {
                "import: a file (list or PinnedImageSet YAML) or a release pull spec"
            }
            Prompt::ExportPath => "export PinnedImageSet YAML to",
            Prompt::NewSet => "new set name",
            Prompt::Rename => "rename set to",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirm {
    pub set: String,
    /// Every target node; `skipped` are the no-space ones the engine will refuse without force.
    pub nodes: Vec<String>,
    pub skipped: Vec<String>,
    /// Unpin the set from its nodes instead of applying it.
    pub unpin: bool,
    /// Whether the nodes will pull through fan-out.
    pub fan_out: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Command(String),
    /// Editing the current screen's filter (applied as typed).
    Filter,
    Help,
    Input {
        prompt: Prompt,
        text: String,
    },
    Confirm(Confirm),
}

/// Everything the screens show. Data fields are public for the backend wiring and tests; navigation is
/// changed only through [`update`].
#[derive(Clone, Debug)]
pub struct State {
    /// `direct: 3 nodes`.
    pub target: String,
    pub readonly: bool,
    pub theme: Theme,
    pub now: Instant,
    pub stall_after: Duration,
    /// Sorted by name.
    pub nodes: Vec<NodeInfo>,
    pub sets: Vec<SetDraft>,
    pub survey: Option<Survey>,
    pub surveying: bool,
    /// Whether applying fans out (`--fan-out`; `f` on the Plan screen toggles it). Direct mode only.
    pub fan_out: bool,
    pub rollout: Rollout,
    pub config: BTreeMap<String, ConfigView>,
    /// Cluster mode: the watched view; None in direct mode.
    pub cluster: Option<Box<ClusterSession>>,
    /// Why writes are refused, when they are.
    pub(super) readonly_reason: String,
    pub(super) screen: Screen,
    pub(super) history: Vec<Screen>,
    pub(super) mode: Mode,
    pub(super) sets_pane: Pane,
    pub(super) rollout_pane: Pane,
    pub(super) config_pane: Pane,
    pub(super) selected: HashMap<Pane, String>,
    pub(super) filters: HashMap<Screen, String>,
    pub(super) flash: Option<(String, Instant)>,
    /// Rollout nodes by (rank, name), kept sorted as events arrive: no per-frame sort of thousands of rows.
    pub(super) rollout_order: Vec<String>,
    /// Rows a page moves, from the last terminal size.
    pub(super) page: usize,
    /// The last terminal size, width × height: how far help scrolls.
    pub(super) size: (u16, u16),
    /// Help's first shown line.
    pub(super) help_scroll: usize,
    /// The Config diffs' first shown lines, by node (a diff never scrolled starts at the top).
    pub(super) diff_scroll: HashMap<String, usize>,
    /// Counts typed entries, so each has its own origin (duplicates stay distinguishable).
    typed: usize,
    dirty: bool,
}

impl State {
    pub fn new(target: impl Into<String>, theme: Theme, readonly: bool, now: Instant) -> State {
        State {
            target: target.into(),
            readonly,
            theme,
            now,
            stall_after: Duration::from_secs(60),
            nodes: Vec::new(),
            sets: Vec::new(),
            survey: None,
            surveying: false,
            fan_out: false,
            rollout: Rollout::default(),
            config: BTreeMap::new(),
            cluster: None,
            readonly_reason: "started with --readonly".into(),
            screen: Screen::Nodes,
            history: Vec::new(),
            mode: Mode::Normal,
            sets_pane: Pane::Entries,
            rollout_pane: Pane::RolloutNodes,
            config_pane: Pane::Config,
            selected: HashMap::new(),
            filters: HashMap::new(),
            flash: None,
            rollout_order: Vec::new(),
            page: 10,
            size: (80, 24),
            help_scroll: 0,
            diff_scroll: HashMap::new(),
            typed: 0,
            dirty: true,
        }
    }

    /// Replaces the whole rollout (e.g. one read back from a finished run) and re-sorts its rows once.
    pub fn set_rollout(&mut self, rollout: Rollout) {
        self.rollout = rollout;
        let mut order: Vec<(u8, String)> = self
            .rollout
            .nodes()
            .iter()
            .map(|(name, node)| (rank(node), name.clone()))
            .collect();
        order.sort();
        self.rollout_order = order.into_iter().map(|(_, name)| name).collect();
        self.dirty = true;
    }

    pub fn screen(&self) -> Screen {
        self.screen
    }

    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    pub fn flash(&self) -> Option<&str> {
        self.flash.as_ref().map(|(text, _)| text.as_str())
    }

    /// Whether something changed since the last call: the run loop draws only then.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    pub fn filter(&self, screen: Screen) -> &str {
        self.filters.get(&screen).map_or("", String::as_str)
    }

    /// The pane that Up/Down move in on the current screen.
    pub(super) fn focus(&self) -> Pane {
        match self.screen {
            Screen::Nodes => Pane::Nodes,
            Screen::Sets => self.sets_pane,
            Screen::Plan => Pane::Plan,
            Screen::Rollout => self.rollout_pane,
            Screen::Config => self.config_pane,
        }
    }

    /// The Config diff's first shown line for the selected node (may be past the end; drawing clamps it).
    pub(super) fn diff_scroll(&self) -> usize {
        self.selected(Pane::Config)
            .and_then(|node| self.diff_scroll.get(node))
            .copied()
            .unwrap_or(0)
    }

    /// A pane's rows in display order, filtered: the identities selection is kept by.
    pub(super) fn rows(&self, pane: Pane) -> Box<dyn Iterator<Item = &str> + '_> {
        let by = |screen: Screen| {
            let filter = self.filter(screen);
            move |name: &&str| matches(name, filter)
        };
        match pane {
            Pane::Nodes => Box::new(
                self.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .filter(by(Screen::Nodes)),
            ),
            Pane::Sets => Box::new(self.sets.iter().map(|s| s.set.name.as_str())),
            Pane::Entries => Box::new(
                self.selected_set()
                    .into_iter()
                    .flat_map(|s| s.set.references())
                    .filter(by(Screen::Sets)),
            ),
            Pane::Targets => match &self.cluster {
                // In cluster mode a set targets a pool, through its role label.
                Some(session) => Box::new(session.view.pools.iter().map(|p| p.name())),
                None => Box::new(self.nodes.iter().map(|n| n.name.as_str())),
            },
            Pane::Plan => Box::new(
                self.survey
                    .iter()
                    .flat_map(|s| s.nodes.iter().map(|n| n.node.as_str()))
                    .filter(by(Screen::Plan)),
            ),
            Pane::RolloutNodes => match &self.cluster {
                Some(session) => Box::new(
                    super::cluster::followed_set(self)
                        .and_then(|set| session.members.get(set))
                        .into_iter()
                        .flatten()
                        .map(String::as_str)
                        .filter(by(Screen::Rollout)),
                ),
                None => Box::new(
                    self.rollout_order
                        .iter()
                        .map(String::as_str)
                        .filter(by(Screen::Rollout)),
                ),
            },
            Pane::RolloutImages => Box::new(
                self.selected_rollout_node()
                    .into_iter()
                    .flat_map(|(_, n)| n.images().map(|(image, _)| image)),
            ),
            Pane::Config => Box::new(
                self.config
                    .keys()
                    .map(String::as_str)
                    .filter(by(Screen::Config)),
            ),
            Pane::ConfigDiff => Box::new(std::iter::empty()),
        }
    }

    /// The selected row: the remembered one if still shown, else the first. One pass, no allocation.
    pub(super) fn cursor(&self, pane: Pane) -> Cursor<'_> {
        let wanted = self.selected.get(&pane).map(String::as_str);
        let mut cursor = Cursor::default();
        for (i, row) in self.rows(pane).enumerate() {
            if i == 0 || Some(row) == wanted {
                cursor.selected = Some((i, row));
            }
            cursor.len = i + 1;
        }
        cursor
    }

    pub fn selected(&self, pane: Pane) -> Option<&str> {
        self.cursor(pane).selected.map(|(_, row)| row)
    }

    /// Selects the row `id` (a node, set or reference) of `pane`, as moving to it with the keys would.
    pub fn select(&mut self, pane: Pane, id: &str) {
        self.selected.insert(pane, id.to_owned());
        self.dirty = true;
    }

    pub fn selected_set(&self) -> Option<&SetDraft> {
        let name = self.selected.get(&Pane::Sets);
        name.and_then(|name| self.sets.iter().find(|s| &s.set.name == name))
            .or(self.sets.first())
    }

    pub(super) fn selected_set_mut(&mut self) -> Option<&mut SetDraft> {
        let name = self.selected_set()?.set.name.clone();
        self.sets.iter_mut().find(|s| s.set.name == name)
    }

    pub(super) fn selected_rollout_node(&self) -> Option<(&str, &NodeRollout)> {
        let name = self.selected(Pane::RolloutNodes)?;
        Some((name, &self.rollout.nodes()[name]))
    }

    pub(super) fn say(&mut self, text: impl Into<String>) {
        self.flash = Some((text.into(), self.now));
    }

    fn goto(&mut self, screen: Screen) {
        if screen != self.screen {
            self.history.push(self.screen);
            self.screen = screen;
        }
    }

    /// Write keys are refused under --readonly, with a message instead of a command.
    fn writable(&mut self, what: &str) -> bool {
        if self.readonly {
            self.say(format!(
                "read-only: {what} is disabled ({})",
                self.readonly_reason
            ));
        }
        !self.readonly
    }

    fn move_selection(&mut self, pane: Pane, step: impl FnOnce(usize, usize) -> usize) {
        let Cursor { len, selected } = self.cursor(pane);
        if let Some((at, _)) = selected {
            let to = step(at, len).min(len - 1);
            let row = self.rows(pane).nth(to).map(str::to_string);
            self.selected.extend(row.map(|row| (pane, row)));
        }
    }

    /// Folds an event in and re-places its node in `rollout_order` if its rank changed (most events do
    /// not change it).
    fn apply_rollout(&mut self, event: Event) {
        let name = event.node().to_string();
        let before = self.rollout.nodes().get(&name).map(rank);
        self.rollout.apply(event);
        let after = rank(&self.rollout.nodes()[&name]);
        if before == Some(after) {
            return;
        }
        if let Some(before) = before
            && let Ok(at) = self.order_position(before, &name)
        {
            self.rollout_order.remove(at);
        }
        if let Err(at) = self.order_position(after, &name) {
            self.rollout_order.insert(at, name);
        }
    }

    /// Where `name` at rank `rank_of` is or belongs in `rollout_order`. Ranks are the nodes' current ones
    /// except `name`'s own, which may have changed since it was placed.
    fn order_position(&self, rank_of: u8, name: &str) -> Result<usize, usize> {
        self.rollout_order.binary_search_by(|other| {
            if other == name {
                return std::cmp::Ordering::Equal;
            }
            (rank(&self.rollout.nodes()[other]), other.as_str()).cmp(&(rank_of, name))
        })
    }

    /// Whether a visible figure changes with time alone (elapsed, ETA, stalls, a flash to expire).
    fn time_visible(&self) -> bool {
        self.flash.is_some()
            || (self.screen == Screen::Rollout && self.cluster.is_some())
            || (self.screen == Screen::Rollout
                && self
                    .rollout
                    .nodes()
                    .values()
                    .any(|n| matches!(n.state, NodeState::Pulling { .. })))
    }

    fn unique_set_name(&self, base: &str) -> String {
        let taken = |name: &str| self.sets.iter().any(|s| s.set.name == name);
        let mut name = base.to_string();
        let mut n = 2;
        while taken(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }

    fn add_set(&mut self, set: ImageSet) {
        let targets = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.selected.insert(Pane::Sets, set.name.clone());
        self.sets.push(SetDraft::new(set, targets));
    }
}

/// Where a pane's selection is, and how many rows it shows.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cursor<'a> {
    pub len: usize,
    pub selected: Option<(usize, &'a str)>,
}

/// Case-insensitive substring match without allocating (filters run over every row every frame).
pub(super) fn matches(text: &str, filter: &str) -> bool {
    let (text, filter) = (text.as_bytes(), filter.as_bytes());
    filter.is_empty()
        || text
            .windows(filter.len())
            .any(|w| w.eq_ignore_ascii_case(filter))
}

/// Rollout rows sort by what needs attention first: problems, pulling, waiting, refused, pinned.
/// Depends on the node's state only (not time), so each event re-places only its own node.
fn rank(node: &NodeRollout) -> u8 {
    match node.state {
        NodeState::Stopped { .. } | NodeState::PinFailed { .. } => 0,
        _ if node.failed() > 0 => 0,
        NodeState::Pulling { .. } => 1,
        NodeState::Waiting => 2,
        NodeState::Refused { .. } => 3,
        NodeState::Pinned { .. } => 4,
    }
}

/// Folds one message into the state; returns what the outside world should do.
pub fn update(state: &mut State, msg: Msg) -> Vec<Cmd> {
    let mut dirty = true;
    let cmds = match msg {
        Msg::Key(key) => on_key(state, key),
        Msg::Paste(text) => {
            on_paste(state, &text);
            Vec::new()
        }
        Msg::Resize { width, height } => {
            state.page = page_rows(height);
            state.size = (width, height);
            Vec::new()
        }
        Msg::Tick(now) => {
            state.now = now;
            let expired = state
                .flash
                .as_ref()
                .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= FLASH_FOR);
            dirty = state.time_visible();
            if expired {
                state.flash = None;
            }
            Vec::new()
        }
        Msg::NodesUpdated(mut nodes) => {
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            state.nodes = nodes;
            Vec::new()
        }
        Msg::SurveyDone(result) => {
            state.surveying = false;
            match result {
                Ok(survey) => {
                    state.say(format!("survey done: {} nodes", survey.nodes.len()));
                    state.survey = Some(survey);
                }
                Err(err) => state.say(format!("survey failed: {err}")),
            }
            Vec::new()
        }
        Msg::Rollout(event) => {
            let was_finished = state.rollout.is_finished();
            state.apply_rollout(event);
            // The engine stays up for retries while a node has failures: say so when nothing is moving.
            if !was_finished && state.rollout.is_finished() {
                state.say(finished_message(&state.rollout));
            }
            Vec::new()
        }
        Msg::FanOut(direct) => {
            state.rollout.set_fan_out(direct);
            Vec::new()
        }
        Msg::LinkBytes(bytes) => {
            state.rollout.record_link_bytes(bytes);
            Vec::new()
        }
        Msg::EngineFinished(result) => {
            state.say(match result {
                Ok(()) => finished_message(&state.rollout),
                Err(err) => format!("rollout stopped: {err}"),
            });
            Vec::new()
        }
        Msg::FileRead {
            path,
            purpose: FilePurpose::ImportSet,
            result,
        } => {
            match result {
                Ok(text) => import(state, &path, &text),
                Err(err) => state.say(format!("cannot read {}: {err}", path.display())),
            }
            Vec::new()
        }
        Msg::FileWritten { path, result } => {
            state.say(match result {
                Ok(()) => format!("wrote {}", path.display()),
                Err(err) => format!("cannot write {}: {err}", path.display()),
            });
            Vec::new()
        }
        Msg::ConfigViews(views) => {
            state.config.extend(views);
            Vec::new()
        }
        Msg::Notice(text) => {
            state.say(text);
            Vec::new()
        }
        Msg::Cluster(change) => {
            super::cluster::apply(state, change);
            Vec::new()
        }
        Msg::Kubelets(read) => {
            if let Some(session) = state.cluster.as_mut() {
                session.learn_kubelets(read);
            }
            Vec::new()
        }
        Msg::ReleaseRead(read) => {
            match read {
                Ok((sets, note)) => {
                    for mut set in sets {
                        set.name = state.unique_set_name(&set.name);
                        state.add_set(set);
                    }
                    state.say(note);
                }
                Err(err) => state.say(format!("cannot read the release: {err}")),
            }
            Vec::new()
        }
    };
    state.dirty |= dirty;
    cmds
}

fn on_key(state: &mut State, key: KeyEvent) -> Vec<Cmd> {
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        return vec![Cmd::Quit];
    }
    match std::mem::replace(&mut state.mode, Mode::Normal) {
        Mode::Normal => match lookup(&key, state.screen) {
            Some(action) => on_action(state, action),
            None => Vec::new(),
        },
        Mode::Help => {
            if !matches!(key.code, KeyCode::Esc | KeyCode::Char('?' | 'q')) {
                state.mode = Mode::Help;
                if let Some(action) = lookup(&key, state.screen) {
                    let flow = HelpFlow::for_state(state);
                    let at = scrolled(state.help_scroll, action, flow.page(), flow.max_scroll);
                    state.help_scroll = at;
                }
            }
            Vec::new()
        }
        Mode::Command(mut text) => {
            match key.code {
                KeyCode::Enter => return run_command(state, text.trim()),
                KeyCode::Esc => {}
                code => {
                    edit(&mut text, code);
                    state.mode = Mode::Command(text);
                }
            }
            Vec::new()
        }
        Mode::Filter => {
            match key.code {
                KeyCode::Enter if state.filter(state.screen).is_empty() => {
                    state.filters.remove(&state.screen);
                }
                KeyCode::Enter => {}
                KeyCode::Esc => {
                    state.filters.remove(&state.screen);
                }
                code => {
                    edit(state.filters.entry(state.screen).or_default(), code);
                    state.mode = Mode::Filter;
                }
            }
            Vec::new()
        }
        Mode::Input { prompt, mut text } => match key.code {
            KeyCode::Enter => submit(state, prompt, &text),
            KeyCode::Esc => Vec::new(),
            code => {
                edit(&mut text, code);
                state.mode = Mode::Input { prompt, text };
                Vec::new()
            }
        },
        Mode::Confirm(confirm) => match key.code {
            KeyCode::Char('y') if confirm.unpin => unpin(state, confirm),
            KeyCode::Char('y') => apply(state, confirm, false),
            KeyCode::Char('F') if !confirm.skipped.is_empty() && !confirm.unpin => {
                apply(state, confirm, true)
            }
            KeyCode::Char('n') | KeyCode::Esc => {
                state.say(if confirm.unpin {
                    "unpin cancelled"
                } else {
                    "apply cancelled"
                });
                Vec::new()
            }
            _ => {
                state.mode = Mode::Confirm(confirm);
                Vec::new()
            }
        },
    }
}

fn edit(text: &mut String, code: KeyCode) {
    match code {
        KeyCode::Backspace => {
            text.pop();
        }
        KeyCode::Char(c) => text.push(c),
        _ => {}
    }
}

fn on_paste(state: &mut State, pasted: &str) {
    match &mut state.mode {
        Mode::Input {
            prompt: Prompt::AddImages,
            text,
        } => {
            text.push(' ');
            text.push_str(pasted);
        }
        // One-line boxes take the first line only.
        Mode::Input { text, .. } | Mode::Command(text) => {
            text.push_str(pasted.lines().next().unwrap_or("").trim());
        }
        Mode::Filter => {
            let first = pasted.lines().next().unwrap_or("").trim();
            state
                .filters
                .entry(state.screen)
                .or_default()
                .push_str(first);
        }
        Mode::Normal if state.screen == Screen::Sets => {
            state.mode = Mode::Input {
                prompt: Prompt::AddImages,
                text: pasted.to_string(),
            };
        }
        _ => {}
    }
}

fn run_command(state: &mut State, command: &str) -> Vec<Cmd> {
    if matches!(command, "q" | "q!" | "quit") {
        return vec![Cmd::Quit];
    }
    match Screen::ALL.iter().find(|s| s.name() == command) {
        Some(screen) => state.goto(*screen),
        None => {
            let names: Vec<&str> = Screen::ALL.iter().map(|s| s.name()).collect();
            state.say(format!(
                "no command {command:?}: try {} or q",
                names.join(", ")
            ));
        }
    }
    Vec::new()
}

/// Where a view that scrolls up to `max` starts after a moving key; other keys leave it.
fn scrolled(at: usize, action: Action, page: usize, max: usize) -> usize {
    let to = match action {
        Action::Up => at.saturating_sub(1),
        Action::Down => at + 1,
        Action::PageUp => at.saturating_sub(page),
        Action::PageDown => at + page,
        Action::Top => 0,
        Action::Bottom => max,
        _ => at,
    };
    to.min(max)
}

fn on_action(state: &mut State, action: Action) -> Vec<Cmd> {
    let pane = state.focus();
    let page = state.page;
    match action {
        Action::Quit => return vec![Cmd::Quit],
        Action::Command => state.mode = Mode::Command(String::new()),
        Action::Filter => state.mode = Mode::Filter,
        Action::Help => {
            state.mode = Mode::Help;
            state.help_scroll = 0;
        }
        Action::Back => {
            if state.filters.remove(&state.screen).is_none()
                && let Some(previous) = state.history.pop()
            {
                state.screen = previous;
            }
        }
        Action::Goto(screen) => state.goto(screen),
        Action::Up
        | Action::Down
        | Action::PageUp
        | Action::PageDown
        | Action::Top
        | Action::Bottom
            if pane == Pane::ConfigDiff =>
        {
            scroll_diff(state, action)
        }
        Action::Up => state.move_selection(pane, |at, _| at.saturating_sub(1)),
        Action::Down => state.move_selection(pane, |at, _| at + 1),
        Action::PageUp => state.move_selection(pane, |at, _| at.saturating_sub(page)),
        Action::PageDown => state.move_selection(pane, |at, _| at + page),
        Action::Top => state.move_selection(pane, |_, _| 0),
        Action::Bottom => state.move_selection(pane, |_, len| len - 1),
        Action::NextPane => match state.screen {
            Screen::Sets => {
                state.sets_pane = match state.sets_pane {
                    Pane::Sets => Pane::Entries,
                    Pane::Entries => Pane::Targets,
                    _ => Pane::Sets,
                }
            }
            Screen::Config => {
                state.config_pane = match state.config_pane {
                    Pane::Config => Pane::ConfigDiff,
                    _ => Pane::Config,
                }
            }
            _ => {
                state.rollout_pane = match state.rollout_pane {
                    Pane::RolloutNodes => Pane::RolloutImages,
                    _ => Pane::RolloutNodes,
                }
            }
        },
        Action::Apply => confirm(state, false),
        Action::ToggleFanOut => toggle_fan_out(state),
        Action::Unpin => confirm(state, true),
        Action::Survey => return survey(state),
        Action::AddImages => {
            if state.sets.is_empty() {
                let name = state.unique_set_name("images");
                state.add_set(set::from_flags(&name, &[]));
            }
            open(state, Prompt::AddImages, String::new());
        }
        Action::Import => open(state, Prompt::ImportPath, String::new()),
        Action::Export => {
            if state.writable("export")
                && let Some(draft) = state.selected_set()
            {
                let path = format!("{}.yaml", draft.set.name);
                open(state, Prompt::ExportPath, path);
            }
        }
        Action::NewSet => open(state, Prompt::NewSet, String::new()),
        Action::Rename => {
            if let Some(draft) = state.selected_set() {
                let name = draft.set.name.clone();
                open(state, Prompt::Rename, name);
            }
        }
        Action::Remove => remove(state),
        Action::ToggleTarget => toggle_target(state),
        Action::ToggleLazy => {
            if state.writable("lazy pulling")
                && let Some(name) = state.selected(Pane::Nodes)
            {
                let node = state.nodes.iter().find(|n| n.name == name);
                let enable = !node.and_then(|n| n.lazy_pulling).unwrap_or(false);
                return vec![Cmd::ToggleLazy {
                    node: name.to_string(),
                    enable,
                }];
            }
        }
        Action::Retry | Action::Cancel => return retry_or_cancel(state, action),
    }
    Vec::new()
}

/// Scrolls the selected node's diff, as far as its last line at the bottom of the pane.
fn scroll_diff(state: &mut State, action: Action) {
    let Some(node) = state.selected(Pane::Config).map(str::to_string) else {
        return;
    };
    let view = &state.config[&node];
    // The notes above the diff take rows of their own.
    let rows = diff_rows(state.size).saturating_sub(view.notes.len());
    let max = view.lines.len().saturating_sub(rows);
    let at = scrolled(state.diff_scroll(), action, rows.max(1), max);
    state.diff_scroll.insert(node, at);
}

fn open(state: &mut State, prompt: Prompt, text: String) {
    state.mode = Mode::Input { prompt, text };
}

fn survey(state: &mut State) -> Vec<Cmd> {
    if state.sets.is_empty() {
        state.say("no sets to survey: add images on the Sets screen (2)");
        return Vec::new();
    }
    if let Some(bad) = state.sets.iter().find(|s| !s.problems().is_empty()) {
        let text = format!(
            "set {} breaks {} rule(s): fix it before surveying",
            bad.set.name,
            bad.problems().len()
        );
        state.say(text);
        return Vec::new();
    }
    let nodes: BTreeSet<&String> = state.sets.iter().flat_map(|s| &s.targets).collect();
    let cmd = Cmd::Survey {
        sets: state.sets.iter().map(|s| s.set.clone()).collect(),
        nodes: nodes.into_iter().cloned().collect(),
    };
    state.surveying = true;
    state.say("surveying nodes and registry…");
    vec![cmd]
}

/// Asks y/n before applying (or unpinning) the selected set on its target nodes.
fn confirm(state: &mut State, unpin: bool) {
    let verb = if unpin { "unpin" } else { "apply" };
    if !state.writable(verb) {
        return;
    }
    let Some(draft) = state.selected_set() else {
        state.say(format!("no set to {verb}: add one on the Sets screen (2)"));
        return;
    };
    let (name, problems) = (draft.set.name.clone(), draft.problems().len());
    // Unpinning a broken set is fine: its valid entries may be pinned.
    if problems > 0 && !unpin {
        state.say(format!(
            "set {name} breaks {problems} rule(s): fix it before applying"
        ));
        return;
    }
    if draft.targets.is_empty() {
        let what = if state.cluster.is_some() {
            "a pool"
        } else {
            "some"
        };
        state.say(format!(
            "set {name} targets no node: choose {what} on the Sets screen (Space)"
        ));
        return;
    }
    let nodes: Vec<String> = draft.targets.iter().cloned().collect();
    let skipped = state
        .survey
        .iter()
        .flat_map(|s| &s.nodes)
        // The engine skips them; in cluster mode the daemons decide (the Plan shows the risk).
        .filter(|n| state.cluster.is_none() && !unpin && n.verdict == Verdict::NoSpace)
        .filter(|n| draft.targets.contains(&n.node))
        .map(|n| n.node.clone())
        .collect();
    state.mode = Mode::Confirm(Confirm {
        set: name,
        nodes,
        skipped,
        unpin,
        fan_out: state.fan_out && state.cluster.is_none() && !unpin,
    });
}

/// `f`: fan-out on or off for the next apply, saying what it changes on the link.
fn toggle_fan_out(state: &mut State) {
    if state.cluster.is_some() {
        state.say(
            "fan-out is for direct mode: in a cluster the machine-config daemons pull; serve them with \
             `pinboard mirror` and an ImageDigestMirrorSet",
        );
        return;
    }
    state.fan_out = !state.fan_out;
    let link = state.survey.as_ref().map(|s| s.link_bytes);
    state.say(match (state.fan_out, link) {
        (true, Some(link)) => format!(
            "fan-out on: {} over the registry link instead of {}; nodes pull through pinboard's blob cache",
            human(link.fan_out),
            human(link.direct)
        ),
        (true, None) => "fan-out on: nodes pull through pinboard's blob cache".into(),
        (false, _) => "fan-out off: every node pulls from the registry itself".into(),
    });
}

fn unpin(state: &mut State, confirm: Confirm) -> Vec<Cmd> {
    let Some(draft) = state.sets.iter().find(|s| s.set.name == confirm.set) else {
        return Vec::new();
    };
    let cmd = Cmd::Unpin {
        set: draft.set.clone(),
        nodes: confirm.nodes,
    };
    state.say(format!(
        "unpinning set {} (images stay on the nodes)",
        confirm.set
    ));
    vec![cmd]
}

fn apply(state: &mut State, confirm: Confirm, force: bool) -> Vec<Cmd> {
    let Some(draft) = state.sets.iter().find(|s| s.set.name == confirm.set) else {
        return Vec::new();
    };
    let set = draft.set.clone();
    state.set_rollout(Rollout::expecting(&confirm.nodes));
    let cmd = Cmd::Apply {
        set,
        nodes: confirm.nodes,
        force,
        fan_out: confirm.fan_out,
    };
    state.say(format!("applying set {}", confirm.set));
    state.goto(Screen::Rollout);
    vec![cmd]
}

fn submit(state: &mut State, prompt: Prompt, text: &str) -> Vec<Cmd> {
    let text = text.trim();
    if text.is_empty() {
        return Vec::new();
    }
    match prompt {
        Prompt::AddImages => add_images(state, text),
        Prompt::ImportPath if is_pullspec(text) => {
            state.say(format!("reading release {text}…"));
            return vec![Cmd::ImportRelease(text.to_owned())];
        }
        Prompt::ImportPath => {
            return vec![Cmd::ReadFile(PathBuf::from(text), FilePurpose::ImportSet)];
        }
        Prompt::ExportPath => {
            if let Some(draft) = state.selected_set() {
                let yaml = pinned_image_set_yaml(&draft.set);
                return vec![Cmd::WriteFile(PathBuf::from(text), yaml)];
            }
        }
        Prompt::NewSet | Prompt::Rename => {
            if state.sets.iter().any(|s| s.set.name == text) {
                state.say(format!("a set named {text} exists already"));
            } else if prompt == Prompt::NewSet {
                state.add_set(set::from_flags(text, &[]));
                state.sets_pane = Pane::Entries;
            } else if let Some(draft) = state.selected_set_mut() {
                draft.set.name = text.to_string();
                state.selected.insert(Pane::Sets, text.to_string());
            }
        }
    }
    Vec::new()
}

fn add_images(state: &mut State, text: &str) {
    let first = state.typed + 1;
    let entries: Vec<Entry> = text
        .split_whitespace()
        .enumerate()
        .map(|(i, reference)| Entry {
            reference: reference.to_string(),
            origin: Origin::File {
                path: "typed".into(),
                line: Some(first + i),
            },
        })
        .collect();
    state.typed += entries.len();
    let added = entries.len();
    if let Some(draft) = state.selected_set_mut() {
        draft.edit(|set| set.entries.extend(entries));
        let broken = draft
            .problems()
            .iter()
            .filter(|p| p.entry.is_some())
            .count();
        let text = format!("added {added} image(s); {broken} entry problem(s) in the set");
        state.say(text);
    }
}

/// Whether what was typed at the import prompt names a release image rather than a file: a registry host,
/// and a tag or a digest.
fn is_pullspec(text: &str) -> bool {
    let host = text.split('/').next().unwrap_or("");
    let last = text.rsplit('/').next().unwrap_or("");
    text.contains('/')
        && host.contains('.')
        && !text.starts_with(['.', '/', '~'])
        && (last.contains(':') || last.contains('@'))
}

fn import(state: &mut State, path: &Path, text: &str) {
    let shown = path.display().to_string();
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    ) || text.contains("kind:");
    if yaml {
        match set::parse_yaml(text, &shown) {
            Ok(sets) => {
                let count = sets.len();
                for mut set in sets {
                    set.name = state.unique_set_name(&set.name);
                    state.add_set(set);
                }
                state.say(format!("imported {count} set(s) from {shown}"));
            }
            Err(problems) => state.say(format!(
                "{shown}: {} problem(s): {}",
                problems.len(),
                problems[0]
            )),
        }
        return;
    }
    // Named after its images, as the headless commands name a list file's set.
    let mut list = set::parse_list(text, &shown);
    list.name = state.unique_set_name(&list.name);
    let count = list.entries.len();
    match state.selected_set_mut() {
        Some(draft) => draft.edit(|set| set.entries.extend(list.entries)),
        None => state.add_set(list),
    }
    state.say(format!("imported {count} image(s) from {shown}"));
}

fn remove(state: &mut State) {
    match state.sets_pane {
        Pane::Sets => {
            if let Some(name) = state.selected_set().map(|s| s.set.name.clone()) {
                state.sets.retain(|s| s.set.name != name);
                state.selected.remove(&Pane::Sets);
                state.say(format!("removed set {name}"));
            }
        }
        Pane::Entries => {
            if let Some(reference) = state.selected(Pane::Entries).map(str::to_string)
                && let Some(draft) = state.selected_set_mut()
            {
                draft.edit(|set| {
                    if let Some(at) = set.entries.iter().position(|e| e.reference == reference) {
                        set.entries.remove(at);
                    }
                });
                state.selected.remove(&Pane::Entries);
            }
        }
        _ => state.say("Tab to the sets or entries pane to remove"),
    }
}

fn toggle_target(state: &mut State) {
    if state.sets_pane != Pane::Targets {
        state.say("Tab to the targets pane to choose nodes (a pool in cluster mode)");
        return;
    }
    let Some(node) = state.selected(Pane::Targets).map(str::to_string) else {
        return;
    };
    if state.cluster.is_some() {
        return super::cluster::toggle_pool(state, &node);
    }
    if let Some(draft) = state.selected_set_mut()
        && !draft.targets.remove(&node)
    {
        draft.targets.insert(node);
    }
}

fn retry_or_cancel(state: &mut State, action: Action) -> Vec<Cmd> {
    let what = if action == Action::Retry {
        "retry"
    } else {
        "cancel"
    };
    if !state.writable(what) {
        return Vec::new();
    }
    let Some((node_name, node)) = state.selected_rollout_node() else {
        state.say("no rollout yet");
        return Vec::new();
    };
    let Some(image) = state.selected(Pane::RolloutImages) else {
        return Vec::new();
    };
    let stalled = node
        .stalled(state.now, state.stall_after)
        .any(|s| s == image);
    let Some(rollout) = node.image(image) else {
        return Vec::new();
    };
    let allowed = match (&rollout.state, action) {
        (ImageState::Failed { .. } | ImageState::Cancelled, Action::Retry) => true,
        (ImageState::Pulling { .. }, Action::Retry) => stalled,
        (
            ImageState::Queued | ImageState::Pulling { .. } | ImageState::Retrying { .. },
            Action::Cancel,
        ) => true,
        _ => false,
    };
    let (node, image) = (node_name.to_string(), image.to_string());
    if !allowed {
        state.say(format!(
            "nothing to {what}: {image} on {node} is not in a state for it"
        ));
        return Vec::new();
    }
    vec![if action == Action::Retry {
        Cmd::Retry { node, image }
    } else {
        Cmd::Cancel { node, image }
    }]
}

/// `rollout finished: 2 pinned, 1 refused` — every node counted by how it ended.
fn finished_message(rollout: &Rollout) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for node in rollout.nodes().values() {
        let word = match node.state {
            NodeState::Pinned { .. } => "pinned",
            NodeState::Refused { .. } => "refused",
            NodeState::Stopped { .. } => "stopped (r retries)",
            NodeState::PinFailed { .. } => "pin failed",
            NodeState::Waiting | NodeState::Pulling { .. } => "running",
        };
        *counts.entry(word).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(word, n)| format!("{n} {word}"))
        .collect();
    format!("rollout finished: {}", parts.join(", "))
}

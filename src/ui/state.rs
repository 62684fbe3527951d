//! The TUI's state: everything the screens show, where the operator is (screen, pane, selection, filter,
//! mode), and the questions the screens and [`super::update`] ask of it. Changed only by `update`, apart
//! from the data fields the backends fill in.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use super::theme::Theme;
use crate::fleet::{Puller, Targets, Traits};
use crate::model::cluster_session::ClusterSession;
use crate::model::config_view::ConfigView;
use crate::model::machine_config::ROLE_LABEL;
use crate::model::node_summary::NodeSummary;
use crate::model::rollout::{Event, NodeRollout, NodeState, Rollout};
use crate::model::set::{Entry, ImageSet, Problem};
use crate::survey::Survey;

/// How the status line, the confirm dialog and the Rollout's summary say that fan-out has no cache.
pub const NO_CACHE: &str = "no agent serves the in-cluster cache";

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

    /// Changes the set and validates it again.
    pub(super) fn edit(&mut self, change: impl FnOnce(&mut ImageSet)) {
        change(&mut self.set);
        self.problems = self.set.validate();
    }

    /// Cluster mode: the pool the draft targets, through its role label.
    pub fn targeted_pool(&self) -> Option<&str> {
        self.set.labels.get(ROLE_LABEL).map(String::as_str)
    }
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
    /// Every target node.
    pub nodes: Vec<String>,
    /// The target nodes the plan says have no room: the engine (here or in each agent) skips them unless
    /// forced; the machine-config daemons try them and fail.
    pub no_space: Vec<String>,
    /// Whether `no_space` nodes are skipped (pinboard's engine pulls) rather than tried.
    pub skips_no_space: bool,
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
/// changed only through [`super::update::update`].
#[derive(Clone, Debug)]
pub struct State {
    /// `direct: 3 nodes`.
    pub target: String,
    pub readonly: bool,
    pub theme: Theme,
    pub now: Instant,
    pub stall_after: Duration,
    /// Sorted by name.
    pub nodes: Vec<NodeSummary>,
    pub sets: Vec<SetDraft>,
    pub survey: Option<Survey>,
    pub surveying: bool,
    /// Whether applying fans out (`--fan-out`; `f` on the Plan screen toggles it). Direct mode only.
    pub fan_out: bool,
    pub rollout: Rollout,
    /// The set the Rollout follows, once one was applied in this session.
    pub rolled_out: Option<String>,
    pub config: BTreeMap<String, ConfigView>,
    /// What the fleet is like: what a set targets and who pulls.
    pub fleet: Traits,
    /// The watched MachineConfig objects (pools as targets, MachineConfigNode conditions), which only a
    /// fleet of machine-config daemons has; None for the others.
    pub machine_config: Option<Box<ClusterSession>>,
    /// A wall-clock time and the tick time it was read at: conditions carry wall-clock times, ticks
    /// monotonic ones.
    pub(super) epoch: (Instant, SystemTime),
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
    pub(super) typed: usize,
    /// Whether to draw again: set by every change, taken by the run loop.
    pub(super) dirty: bool,
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
            rolled_out: None,
            config: BTreeMap::new(),
            fleet: Traits::DIRECT,
            machine_config: None,
            epoch: (now, SystemTime::UNIX_EPOCH),
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
            Pane::Targets => match self
                .machine_config
                .as_ref()
                .filter(|_| self.targets_pools())
            {
                // A set targets a pool, through its role label.
                Some(session) => Box::new(session.view.pools.iter().map(|p| p.name())),
                None => Box::new(self.nodes.iter().map(|n| n.name.as_str())),
            },
            Pane::Plan => Box::new(
                self.survey
                    .iter()
                    .flat_map(|s| s.nodes.iter().map(|n| n.node.as_str()))
                    .filter(by(Screen::Plan)),
            ),
            Pane::RolloutNodes => match &self.machine_config {
                Some(session) => Box::new(
                    self.followed_set()
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

    /// Whether pinboard's engine pulls from here (retries, cancels, fan-out), rather than the nodes' own
    /// daemons or agents.
    pub fn steers_pulls(&self) -> bool {
        self.fleet.puller.steered_from_here()
    }

    /// Whether the nodes' agents pull, so that `v` asks them to check now.
    pub fn on_agents(&self) -> bool {
        self.fleet.puller == Puller::Agents
    }

    /// Whether `f` can fan a rollout's blobs out on this fleet.
    pub fn fans_out(&self) -> bool {
        self.fleet.puller.fans_out()
    }

    /// The in-cluster cache, on agents: its holder and address, when some node's agent serves it.
    pub fn cluster_cache(&self) -> Option<(&str, &str)> {
        self.nodes
            .iter()
            .find_map(|n| Some((n.name.as_str(), n.cache.as_deref()?)))
    }

    /// Whether a set targets pools (through its role label) rather than nodes.
    pub fn targets_pools(&self) -> bool {
        self.fleet.targets == Targets::Pools
    }

    /// The wall-clock time at tick time `now`.
    pub fn wall(&self, now: Instant) -> SystemTime {
        self.epoch.1 + now.saturating_duration_since(self.epoch.0)
    }

    /// Cluster mode: the set the Rollout screen follows, the one selected on the Sets screen if the cluster
    /// has it, else the cluster's first.
    pub fn followed_set(&self) -> Option<&str> {
        let view = &self.machine_config.as_ref()?.view;
        let selected = self.selected_set().map(|d| d.set.name.as_str());
        selected
            .filter(|name| view.set(name).is_some())
            .or_else(|| view.sets.first().map(|s| s.name()))
    }

    pub(super) fn selected_rollout_node(&self) -> Option<(&str, &NodeRollout)> {
        let name = self.selected(Pane::RolloutNodes)?;
        Some((name, &self.rollout.nodes()[name]))
    }

    pub(super) fn say(&mut self, text: impl Into<String>) {
        self.flash = Some((text.into(), self.now));
    }

    pub(super) fn goto(&mut self, screen: Screen) {
        if screen != self.screen {
            self.history.push(self.screen);
            self.screen = screen;
        }
    }

    /// Write keys are refused under --readonly, with a message instead of a command.
    pub(super) fn writable(&mut self, what: &str) -> bool {
        if self.readonly {
            self.say(format!(
                "read-only: {what} is disabled ({})",
                self.readonly_reason
            ));
        }
        !self.readonly
    }

    /// Folds an event in and re-places its node in `rollout_order` if its rank changed (most events do
    /// not change it).
    pub(super) fn apply_rollout(&mut self, event: Event) {
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
        NodeState::Restoring { .. } => 0,
        NodeState::Pulling { .. } => 1,
        NodeState::Waiting => 2,
        NodeState::Refused { .. } => 3,
        NodeState::Pinned { .. } => 4,
    }
}

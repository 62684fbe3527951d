//! The nodes pinboard works on, however it reaches them. A [`Fleet`] is what every command and the terminal
//! UI talk to: the same few operations — plan, readiness, apply, unpin, lazy pulling, and the TUI's watch,
//! refresh and lazy-pull toggle — whichever way the nodes are reached:
//!
//! - [`direct`]: nodes reached over their CRI sockets from where pinboard runs (`--cri`, `--nodes`, or
//!   crictl's endpoint); pinboard pulls and pins through [`crate::engine`];
//! - [`machine_config`]: an OpenShift cluster, whose machine-config daemons pull and pin the PinnedImageSets
//!   pinboard writes;
//! - [`agents`]: any Kubernetes cluster with pinboard's agents, which pull and pin the PinSets pinboard
//!   writes, each on its own node through [`crate::engine`], and report in a PinboardNode.
//!
//! [`crate::options::CommonArgs::fleet`] is the one place that chooses between them. What the operations
//! return is the same for every fleet ([`Survey`], [`Readiness`], [`Applied`], [`Unpinned`]); each fleet
//! says what it can do through [`Traits`], which is all the TUI's pure state knows of it.

pub mod agents;
pub mod direct;
mod first_list;
pub mod machine_config;
mod outcome;
pub mod payload;
pub mod sets;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc::UnboundedSender;

use crate::backend::lazy::Apply;
use crate::backend::registry::Registry;
use crate::engine::Control;
use crate::error::Failure;
use crate::fanout::Update;
use crate::model::config_view::ConfigView;
use crate::model::export::SetKind;
use crate::model::lazy::NodeLazy;
use crate::model::machine_config::{ClusterUpdate, ImageFsSpace, KubeletSettings};
use crate::model::node_summary::NodeSummary;
use crate::model::readiness::Readiness;
use crate::model::rollout::Rollout;
use crate::model::set::ImageSet;
use crate::survey::Survey;

pub use outcome::{
    Applied, NodeOutcome, NodeUnpinned, NodesUnpinned, Reported, Rolled, SetDeleted, SetUsed,
    Unpinned,
};
pub use sets::SetSources;

/// What a set is aimed at on this fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Targets {
    /// Nodes, chosen one by one.
    Nodes,
    /// The MachineConfigPools its `machineconfiguration.openshift.io/role` label selects.
    Pools,
}

/// Who pulls and pins on this fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Puller {
    /// pinboard's engine: a pull can be retried or cancelled, a full node is skipped unless forced, and
    /// the blobs can fan out through pinboard's cache.
    Pinboard,
    /// The nodes' own daemons (OpenShift's machine-config daemon), which report generations.
    Daemons,
    /// pinboard's agent on each node: pinboard's engine there, which skips a node without room and
    /// retries on its own; pinboard follows their reports, byte by byte.
    Agents,
}

impl Puller {
    /// Whether a node the plan says has no room is left out unless forced.
    pub fn skips_no_space(self) -> bool {
        matches!(self, Puller::Pinboard | Puller::Agents)
    }

    /// Whether an operator can retry or cancel a pull from here.
    pub fn steered_from_here(self) -> bool {
        self == Puller::Pinboard
    }

    /// Whether a rollout can fan the blobs out, each over the registry link once: through pinboard's blob
    /// cache (direct mode), or the agents' in-cluster cache (a set's `spec.fanOut`).
    pub fn fans_out(self) -> bool {
        matches!(self, Puller::Pinboard | Puller::Agents)
    }
}

/// What the TUI needs to know of a fleet: how sets target it and who pulls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traits {
    pub targets: Targets,
    pub puller: Puller,
}

impl Traits {
    /// The kind a set is written as for this fleet: the agents' PinSet, else a PinnedImageSet.
    pub fn set_kind(self) -> SetKind {
        match self.puller {
            Puller::Agents => SetKind::PinSet,
            Puller::Pinboard | Puller::Daemons => SetKind::PinnedImageSet,
        }
    }

    pub const DIRECT: Traits = Traits {
        targets: Targets::Nodes,
        puller: Puller::Pinboard,
    };
    pub const AGENTS: Traits = Traits {
        targets: Targets::Nodes,
        puller: Puller::Agents,
    };
    pub const MACHINE_CONFIG: Traits = Traits {
        targets: Targets::Pools,
        puller: Puller::Daemons,
    };
}

/// How `apply` runs: what the command line says beyond the sets.
#[derive(Clone, Debug)]
pub struct ApplyOptions {
    /// Start nodes whose plan verdict is no-space too (cluster mode: write a set that lands in no pool).
    pub force: bool,
    /// Serve the nodes from pinboard's blob cache (direct mode); through the agents, the sets get
    /// `spec.fanOut` (the in-cluster cache).
    pub fan_out: bool,
    /// Cluster mode: how long to wait for the daemons.
    pub wait: Duration,
}

/// What `unpin` releases besides the named sets' holds (direct mode).
#[derive(Clone, Copy, Debug, Default)]
pub struct UnpinOptions {
    pub all_sets: bool,
    pub release_unowned: bool,
}

/// What a headless `apply` shows while pinboard pulls.
pub trait ApplyProgress: Send {
    /// After each update is folded into `rollout`.
    fn update(&mut self, update: &Update, rollout: &Rollout);
    /// Once the nodes are done, before fan-out's files are put back.
    fn finish(&mut self, rollout: &Rollout);
}

/// Something a fleet tells the TUI while it watches or works.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetEvent {
    /// What each node is like now, replacing what was known.
    Nodes(Vec<NodeSummary>),
    /// Per node (or per set, on a cluster), what pinning writes against what is there.
    ConfigViews(BTreeMap<String, ConfigView>),
    /// OpenShift: a change from the watchers.
    Cluster(ClusterUpdate),
    /// OpenShift: what some nodes' kubelet configurations say.
    Kubelets(HashMap<String, KubeletSettings>),
    /// OpenShift: some nodes' image filesystems, as their kubelets' summaries say (the Plan's figures).
    ImageFs(HashMap<String, ImageFsSpace>),
    /// A fresh survey made for a rollout.
    Surveyed(Survey),
    /// A rollout's progress.
    Rollout(Update),
    /// The rollout has nothing more to do; `Err` says why it stopped early.
    RolloutFinished(Result<(), Failure>),
    /// What to tell the operator: an outcome, a warning, a failure.
    Notice(String),
}

/// Where a fleet sends what it tells the TUI.
pub type Events = UnboundedSender<FleetEvent>;

/// A registry client, and what could not be used for it (a cluster's pull secret it may not read).
pub type ReadingRegistry = (Arc<Registry>, Vec<String>);

/// A rollout the TUI started: what an operator's retry or cancel goes to.
pub type RolloutControl = UnboundedSender<Control>;

/// The nodes pinboard works on. Every operation is the same call whichever way they are reached.
pub trait Fleet: Send + Sync {
    /// `direct: 3 nodes`, `cluster: ~/.kube/config (context admin)`: for the TUI's status line.
    fn label(&self) -> String;

    fn traits(&self) -> Traits;

    /// The nodes known before watching (a set targets them all at first); a cluster's come from its watch.
    fn nodes(&self) -> Vec<String>;

    /// The registry client that reads images as the nodes would (with a cluster's pull secret), and what
    /// could not be used for it.
    fn registry(&self) -> BoxFuture<'_, Result<ReadingRegistry, Failure>>;

    /// TUI: connects before the first frame; an error ends the TUI before it starts.
    fn connect(&self) -> BoxFuture<'_, Result<(), Failure>>;

    /// TUI: why this session may not write, when the fleet refuses it (an account without the rights).
    fn write_denied(&self) -> BoxFuture<'_, Option<String>>;

    /// What pre-loading the sets `sources` names costs each node they land on.
    fn plan<'a>(&'a self, sources: &'a SetSources) -> BoxFuture<'a, Result<Survey, Failure>>;

    /// The sets `sources` names, judged on every node they land on; with `wait`, once every node is
    /// ready or that long has passed (one line on stderr per change).
    fn readiness<'a>(
        &'a self,
        sources: &'a SetSources,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Readiness, Failure>>;

    /// Pre-loads and pins the sets `sources` names, `progress` told how it goes; ends with the readiness
    /// check `pinboard check` makes. Where pinboard pulls, `interrupt` (a signal's name) stops the rollout
    /// and puts the nodes' files back.
    fn apply<'a>(
        &'a self,
        sources: &'a SetSources,
        options: ApplyOptions,
        progress: &'a mut dyn ApplyProgress,
        interrupt: BoxFuture<'a, &'static str>,
    ) -> BoxFuture<'a, Result<Applied, Failure>>;

    /// Releases the holds of the sets `sources` names (by file or by name).
    fn unpin<'a>(
        &'a self,
        sources: &'a SetSources,
        options: UnpinOptions,
    ) -> BoxFuture<'a, Result<Unpinned, Failure>>;

    /// TUI: starts following the fleet, telling `events` what changes.
    fn watch(&self, events: Events);

    /// TUI: the nodes and the config views for `sets`, told to `events`.
    fn refresh(&self, sets: Vec<ImageSet>, events: Events);

    /// TUI: surveys `nodes` for `sets`.
    fn survey(
        &self,
        sets: Vec<ImageSet>,
        nodes: Vec<String>,
    ) -> BoxFuture<'_, Result<Survey, Failure>>;

    /// TUI: applies `set` to `nodes`, telling `events` how it goes; where pinboard pulls, what an
    /// operator's retry and cancel go to.
    fn roll_out(
        &self,
        set: ImageSet,
        nodes: Vec<String>,
        force: bool,
        fan_out: bool,
        events: Events,
    ) -> Option<RolloutControl>;

    /// TUI: releases `set`'s holds on `nodes`; what happened, told to `events`.
    fn release(&self, set: ImageSet, nodes: Vec<String>, events: Events);

    /// TUI: lazy pulling on or off for `node` (on a cluster, for its pool); told to `events`.
    fn set_lazy(&self, node: String, enable: bool, events: Events);

    /// `pinboard lazy`: each node's lazy pulling, after turning it on or off where `wanted` says so (as
    /// `apply` says: written, or only said; the runtimes restarted). Nodes reached over CRI or through
    /// pinboard's agents.
    fn lazy(
        &self,
        wanted: Option<bool>,
        apply: Apply,
    ) -> BoxFuture<'_, Result<Vec<NodeLazy>, Failure>> {
        let _ = (wanted, apply);
        async {
            Err(Failure::bad_input(
                "`pinboard lazy` works on nodes reached over their CRI sockets (--cri, --nodes) or through \
                 pinboard's agents; on OpenShift, `L` on the Nodes screen sets lazy pulling for a node's pool",
            ))
        }
        .boxed()
    }

    /// Waits for rollouts the TUI left running to put their nodes' files back.
    fn shut_down(&self) -> BoxFuture<'_, ()>;
}

//! What can happen to the TUI ([`Msg`]) and what it asks the outside world to do ([`Cmd`]): what goes
//! into [`super::update::update`] and what comes out.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use crossterm::event::KeyEvent;

use crate::error::Failure;
use crate::model::config_view::ConfigView;
use crate::model::machine_config::{ClusterUpdate, ImageFsSpace, KubeletSettings};
use crate::model::node_summary::NodeSummary;
use crate::model::readiness::Readiness;
use crate::model::rollout::{Event, FanOutNodes};
use crate::model::set::ImageSet;
use crate::survey::Survey;

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
    NodesUpdated(Vec<NodeSummary>),
    SurveyDone(Result<Survey, Failure>),
    /// What [`Cmd::Check`] of `set` found.
    Checked {
        set: String,
        result: Result<Readiness, Failure>,
    },
    Rollout(Event),
    /// The rollout is fanned out, but for these nodes, which pull (partly) from the source.
    FanOut(FanOutNodes),
    /// Fan-out: bytes the blob cache took over the registry link since the rollout started.
    LinkBytes(u64),
    /// The engine has nothing more to do; `Err` says why it stopped early.
    EngineFinished(Result<(), Failure>),
    FileRead {
        path: PathBuf,
        purpose: FilePurpose,
        result: Result<String, Failure>,
    },
    FileWritten {
        path: PathBuf,
        result: Result<(), Failure>,
    },
    /// Per node, replacing what was there for those nodes.
    ConfigViews(BTreeMap<String, ConfigView>),
    /// What the backend has to say (a failure, a warning, an outcome): shown as a flash message.
    Notice(String),
    /// Cluster mode: a change from the watchers.
    Cluster(ClusterUpdate),
    /// Cluster mode: what some nodes' kubelet configurations say (read once per node).
    Kubelets(HashMap<String, KubeletSettings>),
    /// Cluster mode: some nodes' image filesystems, as their kubelets' summaries say.
    ImageFs(HashMap<String, ImageFsSpace>),
    /// A release read for import: its sets and what to say of it, or why it could not be read.
    ReleaseRead(Result<(Vec<ImageSet>, String), Failure>),
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
    /// Judge set `set` as `pinboard check` does: on agents, each node's agent asks its runtime now.
    Check {
        set: String,
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

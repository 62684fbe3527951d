//! What `apply` and `unpin` come back with, from any fleet: the commands print it, as a table or as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fanout::FanOutReport;
use crate::model::holders::UnpinReport;
use crate::model::pinboard_api::SetOutcome;
use crate::model::readiness::Readiness;
use crate::model::rollout::Rollout;
use crate::model::set::{ImageSet, Origin, content_name};

/// How an `apply` ended.
pub enum Applied {
    /// pinboard pulled and pinned.
    Rolled(Box<Rolled>),
    /// The sets were written for the nodes' agents, which pulled and pinned and reported what they did.
    Reported(Box<Reported>),
    /// The sets were written for the nodes' daemons: the readiness once they were done, or the wait ended.
    Written(Readiness),
}

/// A rollout the nodes' agents ran, as their reports tell it.
pub struct Reported {
    pub sets: Vec<SetUsed>,
    /// Node by node, each summed over the sets.
    pub outcomes: Vec<NodeOutcome>,
    /// What the in-cluster cache took from the registries and served meanwhile; None without fan-out.
    pub fan_out: Option<FanOutReport>,
    /// The readiness once every node was ready, or the wait ended.
    pub readiness: Readiness,
}

/// How the rollout ended on one node, as `apply` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub node: String,
    /// `pinned`, `refused`, `stopped`, `pin-failed`, as the TUI's Rollout screen says.
    pub state: String,
    /// Whether the runtime confirmed the pins (containerd 1.6 does not report them); None unless pinned.
    pub confirmed: Option<bool>,
    /// Why the node was refused, stopped or not pinned.
    pub reason: Option<String>,
    /// Its images present, pulled and pinned, and the bytes fetched beside what the plan said.
    #[serde(flatten)]
    pub figures: SetOutcome,
    /// `REF: reason` of every pull that failed.
    pub failed: Vec<String>,
}

/// A rollout pinboard ran.
pub struct Rolled {
    pub sets: Vec<SetUsed>,
    /// Node by node.
    pub rollout: Rollout,
    /// What the plan counted each node would fetch, by node.
    pub planned: BTreeMap<String, u64>,
    /// What fan-out moved; None without it.
    pub fan_out: Option<FanOutReport>,
    /// The readiness check after the rollout; None when it was interrupted.
    pub readiness: Option<Readiness>,
    /// The signal that stopped the rollout, when one did.
    pub interrupted: Option<&'static str>,
}

/// A set as a command used it: its name (what holds its pins on the nodes) and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetUsed {
    pub name: String,
    /// `a.yaml`, `list.txt`, `--image`, or None for a set `unpin` was given by name.
    pub from: Option<String>,
    /// The name was derived from the set's images (a list file or `--image` flags have none).
    pub named_after_images: bool,
}

impl SetUsed {
    pub fn of(set: &ImageSet) -> SetUsed {
        SetUsed {
            name: set.name.clone(),
            from: Some(match &set.origin {
                Origin::File { path, .. } => path.clone(),
                Origin::Flag { .. } => "--image".into(),
                Origin::Release { version, image, .. } => format!("release {version}, {image}"),
            }),
            named_after_images: set.name == content_name(set.references()),
        }
    }

    pub fn named(name: &str) -> SetUsed {
        SetUsed {
            name: name.to_string(),
            from: None,
            named_after_images: false,
        }
    }
}

/// How an `unpin` ended.
pub enum Unpinned {
    /// pinboard released the holds on each node.
    Nodes(NodesUnpinned),
    /// The sets were deleted for the nodes' daemons to unpin.
    Sets(Vec<SetDeleted>),
}

/// What `unpin -o json|yaml` prints when pinboard released the holds itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodesUnpinned {
    /// The sets whose holds were released (empty with `--all-sets` alone).
    pub sets: Vec<SetUsed>,
    pub all_sets: bool,
    pub nodes: Vec<NodeUnpinned>,
}

/// What unpinning did on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUnpinned {
    pub node: String,
    pub ok: bool,
    /// False when the node's runtime did not answer: nothing was unpinned there.
    pub reachable: bool,
    #[serde(flatten)]
    pub report: UnpinReport,
    /// What else to know (a CRI-O that keeps removed pins until it restarts), or why it failed.
    pub message: Option<String>,
}

/// What `unpin` did with one set on a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetDeleted {
    pub set: String,
    pub message: String,
}

//! What a node's rollout is given: its job (the node, its plan, how to pin, who holds each pin), and the
//! operator's controls while it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::backend::lazy::LazyConfig;
use crate::backend::pins::PinTarget;
use crate::backend::target::DirectNode;
use crate::model::plan::NodePlan;

/// One node to roll out: where it is, its plan from the survey (verdict and images, in order), how to
/// pin, which sets hold each image's pin ([`crate::model::holders::holders_of`]), and where its lazy
/// pulling is configured (its remote snapshotter's socket, which lazy pulls go through).
#[derive(Clone, Debug)]
pub struct NodeJob {
    pub node: DirectNode,
    pub plan: NodePlan,
    pub pin: PinTarget,
    pub holders: Arc<BTreeMap<String, BTreeSet<String>>>,
    pub lazy: LazyConfig,
}

/// What an operator can do while the engine runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Pull the image again on that node: after a failure or cancel, or now if it is running (stalled).
    Retry { node: String, image: String },
    /// Abort that pull (or drop it from the queue).
    Cancel { node: String, image: String },
    /// Abort every pull on every node; nothing is pinned afterwards.
    CancelAll,
}

impl Control {
    /// The node it is for; None: every node.
    pub(super) fn node(&self) -> Option<&str> {
        match self {
            Control::Retry { node, .. } | Control::Cancel { node, .. } => Some(node),
            Control::CancelAll => None,
        }
    }
}

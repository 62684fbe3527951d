//! What is known about a node for the Nodes screen: its runtime, space, images and pins, as the backends
//! found them (a node's runtime in direct mode, its Node object in cluster mode, its agent's report on
//! agents).

use std::collections::HashMap;
use std::time::SystemTime;

use super::agents_view::{AgentsView, NodeWithSet};
use super::lazy::LazyPulling;
use super::machine_config::{ClusterView, ImageFsSpace};
use super::pinboard_api::{NodeReport, NodeSetPhase, PROGRESSING};
use super::rollout::PinMethod;

/// What the Nodes screen knows about a node. `None`: unknown, shown as such.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSummary {
    pub name: String,
    /// `containerd 1.7.24`.
    pub runtime: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub images: Option<usize>,
    pub pinned: Option<usize>,
    pub pin_method: Option<PinMethod>,
    pub lazy_pulling: Option<LazyPulling>,
    pub reachable: Option<bool>,
    /// Worth knowing about the node, though it works (e.g. a kubelet whose image GC ignores pins).
    pub warning: Option<String>,
    /// On agents: where the in-cluster cache serves, when this node's agent holds its role.
    pub cache: Option<String>,
}

/// On agents: each node with an agent, as its report says, at `now`; a node whose agent is stale is
/// unreachable, with its last figures.
pub fn of_agents(view: &AgentsView, now: SystemTime) -> Vec<NodeSummary> {
    view.reports
        .iter()
        .filter_map(|(name, node)| Some((name, node.status.as_ref()?)))
        .map(|(name, report)| {
            let fs = report.image_filesystem.as_ref();
            let untrusted = view.agent_untrusted(name, now);
            NodeSummary {
                name: name.clone(),
                runtime: report
                    .runtime
                    .as_ref()
                    .map(|r| format!("{} {}", r.name, r.version)),
                capacity_bytes: fs.map(|f| f.capacity_bytes),
                used_bytes: fs.map(|f| f.used_bytes),
                available_bytes: fs.map(|f| f.available_bytes),
                images: Some(report.image_count),
                pinned: Some(report.pinned_count),
                pin_method: report.pin_method.as_deref().and_then(pin_method_named),
                lazy_pulling: report.lazy_pulling.clone(),
                reachable: Some(untrusted.is_none() && report.runtime_error.is_none()),
                warning: match untrusted {
                    Some(NodeWithSet::Stale { .. }) => {
                        Some("its agent's heartbeat is stale: these are its last figures".into())
                    }
                    _ => report.runtime_error.clone().or_else(|| restoring(report)),
                },
                cache: report
                    .cache
                    .as_ref()
                    .filter(|_| untrusted.is_none())
                    .map(|c| c.address.clone()),
            }
        })
        .collect()
}

/// What the node's agent is putting back, when an image or pin of a set was lost there.
fn restoring(report: &NodeReport) -> Option<String> {
    let set = report
        .sets
        .iter()
        .find(|s| s.state == NodeSetPhase::Restoring)?;
    let lost = set
        .conditions
        .iter()
        .find(|c| c.type_ == PROGRESSING && c.status == "True")
        .map_or("an image or pin was lost", |c| c.message.as_str());
    Some(format!("set {}: {lost}", set.name))
}

/// A pin method by the name reports and nodes files give it.
pub fn pin_method_named(name: &str) -> Option<PinMethod> {
    match name {
        "crio-drop-in" => Some(PinMethod::CrioDropIn),
        "containerd-label" => Some(PinMethod::ContainerdLabel),
        _ => None,
    }
}

/// What the Nodes screen shows of each Node, by name: its image filesystem as its kubelet's summary says
/// (`image_fs`, the figures the Plan counts), else its ephemeral storage, as the Plan falls back to.
pub fn of_cluster(
    view: &ClusterView,
    image_fs: &HashMap<String, ImageFsSpace>,
) -> Vec<NodeSummary> {
    let lazy = view.lazy_pools();
    view.nodes()
        .iter()
        .map(|node| {
            let summary = image_fs.get(&node.name);
            (node, summary)
        })
        .map(|(node, summary)| NodeSummary {
            name: node.name.clone(),
            runtime: node.runtime.clone(),
            capacity_bytes: summary.map_or(node.capacity_ephemeral, |s| s.capacity_bytes),
            used_bytes: summary.and_then(|s| s.used_bytes),
            available_bytes: summary.map_or(node.allocatable_ephemeral, |s| s.available_bytes),
            images: Some(node.image_entries),
            pinned: None,
            // The machine-config daemon pins through CRI-O's drop-in.
            pin_method: Some(PinMethod::CrioDropIn),
            lazy_pulling: view
                .pool_of(&node.name)
                .and_then(|p| lazy.get(p).copied())
                .map(LazyPulling::of_pool),
            reachable: node.ready,
            warning: node.pins_ignored_warning(),
            cache: None,
        })
        .collect()
}

//! What is known about a node for the Nodes screen: its runtime, space, images and pins, as the backends
//! found them (a node's runtime in direct mode, its Node object in cluster mode).

use super::lazy::LazyPulling;
use super::machine_config::ClusterView;
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
}

/// What the Nodes screen shows of each Node, by name.
pub fn of_cluster(view: &ClusterView) -> Vec<NodeSummary> {
    let lazy = view.lazy_pools();
    view.nodes()
        .iter()
        .map(|node| NodeSummary {
            name: node.name.clone(),
            runtime: node.runtime.clone(),
            capacity_bytes: node.capacity_ephemeral,
            used_bytes: None,
            available_bytes: node.allocatable_ephemeral,
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
        })
        .collect()
}

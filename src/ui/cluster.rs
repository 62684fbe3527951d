//! Cluster mode in the TUI, pure: the watched [`ClusterView`] inside the [`State`], and what the screens
//! make of it. Nodes come from the Node objects (space from allocatable ephemeral-storage, image counts from
//! `status.images`, lazy pulling from the pool's ContainerRuntimeConfigs); the cluster's PinnedImageSets
//! join the composer's sets; the Rollout screen shows, per node, where it is with the chosen set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use super::app::{NodeInfo, SetDraft, State};
use crate::model::cluster::{ClusterUpdate, ClusterView};
use crate::model::rollout::PinMethod;

/// The cluster as the TUI holds it.
#[derive(Clone, Debug)]
pub struct ClusterSession {
    pub view: ClusterView,
    /// Per set on the cluster, the nodes it lands on, by name: the Rollout screen's rows.
    pub members: BTreeMap<String, Vec<String>>,
    /// A wall-clock time and the tick time it was read at: conditions carry wall-clock times, ticks
    /// monotonic ones.
    epoch: (Instant, SystemTime),
}

impl ClusterSession {
    /// The wall-clock time at tick time `now`.
    pub fn wall(&self, now: Instant) -> SystemTime {
        self.epoch.1 + now.saturating_duration_since(self.epoch.0)
    }
}

impl State {
    /// Switches the state to cluster mode at wall-clock time `wall`; `denied` says why this account may not
    /// write, which makes the session read-only.
    pub fn start_cluster(&mut self, denied: Option<String>, wall: SystemTime) {
        self.cluster = Some(Box::new(ClusterSession {
            view: ClusterView::default(),
            members: BTreeMap::new(),
            epoch: (self.now, wall),
        }));
        if let Some(why) = denied {
            self.readonly = true;
            self.say(format!("read-only: {why}"));
            self.readonly_reason = why;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChangeKind {
    Sets,
    Connection,
    /// Nodes, pools, MachineConfigNodes or runtime configs.
    Nodes,
}

/// Applies a change from the watchers and refreshes what is derived from it.
pub(super) fn apply(state: &mut State, change: ClusterUpdate) {
    let Some(session) = state.cluster.as_mut() else {
        return;
    };
    let change_kind = match change {
        ClusterUpdate::Sets(_) => ChangeKind::Sets,
        ClusterUpdate::Connection(..) => ChangeKind::Connection,
        _ => ChangeKind::Nodes,
    };
    let sets_changed = change_kind == ChangeKind::Sets;
    let nodes_changed = change_kind == ChangeKind::Nodes;
    session.view.apply(change);
    let view = &session.view;
    if !matches!(change_kind, ChangeKind::Connection) {
        session.members = view
            .sets
            .iter()
            .map(|set| (set.name().to_owned(), view.nodes_of(&set.metadata.labels)))
            .collect();
    }
    if nodes_changed {
        state.nodes = node_infos(view);
    }
    if sets_changed {
        // The cluster's sets join the composer; a draft of the same name (being edited) is left alone.
        for set in &view.sets {
            if !state.sets.iter().any(|d| d.set.name == set.name()) {
                let image_set = set.to_image_set();
                let targets: BTreeSet<String> =
                    view.nodes_of(&image_set.labels).into_iter().collect();
                state.sets.push(SetDraft::new(image_set, targets));
            }
        }
    }
}

/// What the Nodes screen shows of each Node, by name.
pub fn node_infos(view: &ClusterView) -> Vec<NodeInfo> {
    let lazy = view.lazy_pools();
    view.nodes
        .iter()
        .map(|node| NodeInfo {
            name: node.name.clone(),
            runtime: node.runtime.clone(),
            capacity_bytes: node.capacity_ephemeral,
            used_bytes: None,
            available_bytes: node.allocatable_ephemeral,
            images: Some(node.image_entries),
            pinned: None,
            // The machine-config daemon pins through CRI-O's drop-in.
            pin_method: Some(PinMethod::CrioDropIn),
            lazy_pulling: view.pool_of(&node.name).and_then(|p| lazy.get(p).copied()),
            reachable: node.ready,
        })
        .collect()
}

/// The set the Rollout screen follows: the one selected on the Sets screen if the cluster has it, else
/// the cluster's first.
pub fn followed_set(state: &State) -> Option<&str> {
    let view = &state.cluster.as_ref()?.view;
    let selected = state.selected_set().map(|d| d.set.name.as_str());
    selected
        .filter(|name| view.set(name).is_some())
        .or_else(|| view.sets.first().map(|s| s.name()))
}

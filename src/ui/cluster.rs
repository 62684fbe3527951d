//! Cluster mode in the TUI, pure: the watched [`ClusterView`] as the state holds it, and the Nodes screen's
//! rows made of it: nodes come from the Node objects (space from allocatable ephemeral-storage, image
//! counts from `status.images`, lazy pulling from the pool's ContainerRuntimeConfigs). How watch updates
//! change the state is in `update::cluster`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime};

use crate::model::cluster::{ClusterView, KubeletSettings};
use crate::model::node_info::NodeInfo;
use crate::model::readiness::{NodeReadiness, WantedSet, assess_cluster_node};
use crate::model::rollout::PinMethod;

/// The cluster as the TUI holds it.
#[derive(Clone, Debug)]
pub struct ClusterSession {
    pub view: ClusterView,
    /// Per set on the cluster, the nodes it lands on, by name: the Rollout screen's rows.
    pub members: BTreeMap<String, Vec<String>>,
    /// What each node's kubelet configuration says, as the backend read it.
    pub kubelets: HashMap<String, KubeletSettings>,
    /// A wall-clock time and the tick time it was read at: conditions carry wall-clock times, ticks
    /// monotonic ones.
    epoch: (Instant, SystemTime),
}

impl ClusterSession {
    /// A session that has heard nothing from the watchers yet, started at tick time `now`, which is
    /// wall-clock time `wall`.
    pub fn new(now: Instant, wall: SystemTime) -> ClusterSession {
        ClusterSession {
            view: ClusterView::default(),
            members: BTreeMap::new(),
            kubelets: HashMap::new(),
            epoch: (now, wall),
        }
    }

    /// The wall-clock time at tick time `now`.
    pub fn wall(&self, now: Instant) -> SystemTime {
        self.epoch.1 + now.saturating_duration_since(self.epoch.0)
    }

    /// Takes in kubelet configurations read again; a kubelet that did not answer this time keeps what it
    /// said before, rather than the defaults.
    pub fn learn_kubelets(&mut self, read: HashMap<String, KubeletSettings>) {
        for (node, settings) in read {
            let answered_before = self
                .kubelets
                .get(&node)
                .is_some_and(|known| known.assumed.is_none());
            if settings.assumed.is_none() || !answered_before {
                self.kubelets.insert(node, settings);
            }
        }
    }

    /// Set `set_name` on `node` judged as `pinboard check` judges it, at tick time `now`.
    pub fn readiness(&self, set_name: &str, node: &str, now: Instant) -> Option<NodeReadiness> {
        let wanted = WantedSet {
            set: self.view.set(set_name)?.to_image_set(),
            min_generation: 0,
        };
        assess_cluster_node(&self.view, &[wanted], &self.kubelets, node, self.wall(now))
    }
}

/// What the Nodes screen shows of each Node, by name.
pub fn node_infos(view: &ClusterView) -> Vec<NodeInfo> {
    let lazy = view.lazy_pools();
    view.nodes()
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
            warning: node.pins_ignored_warning(),
        })
        .collect()
}

//! A cluster as pinboard follows it, the one session both the headless commands and the TUI keep: the
//! watched [`ClusterView`], what each node's kubelet configuration says, and which nodes each set lands on.
//! Pure: the watchers' updates and the kubelets' answers come in, judgements come out.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use super::machine_config::{ClusterUpdate, ClusterView, ImageFsSpace, KubeletSettings};
use super::readiness::{
    NodeReadiness, Readiness, UnknownSets, WantedSet, assess_cluster, assess_cluster_node,
    wanted_sets,
};
use super::set::ImageSet;

/// What an update changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Sets,
    Connection,
    /// Nodes, pools, MachineConfigNodes or runtime configs.
    Nodes,
}

#[derive(Clone, Debug, Default)]
pub struct ClusterSession {
    pub view: ClusterView,
    /// What each node's kubelet configuration says, as read.
    pub kubelets: HashMap<String, KubeletSettings>,
    /// Each node's image filesystem as its kubelet's summary last said.
    pub image_fs: HashMap<String, ImageFsSpace>,
    /// Per set on the cluster, the nodes it lands on, by name.
    pub members: BTreeMap<String, Vec<String>>,
}

impl ClusterSession {
    /// Applies a change from the watchers and refreshes the set memberships it affects.
    pub fn apply(&mut self, update: ClusterUpdate) -> Changed {
        let changed = match update {
            ClusterUpdate::Sets(_) => Changed::Sets,
            ClusterUpdate::Connection(..) => Changed::Connection,
            _ => Changed::Nodes,
        };
        self.view.apply(update);
        if changed != Changed::Connection {
            let view = &self.view;
            self.members = view
                .sets
                .iter()
                .map(|set| (set.name().to_owned(), view.nodes_of(&set.metadata.labels)))
                .collect();
        }
        changed
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

    /// The wanted sets judged on every node they land on, at `now`.
    pub fn readiness(&self, wanted: &[WantedSet], now: SystemTime) -> Readiness {
        Readiness::of(assess_cluster(&self.view, wanted, &self.kubelets, now))
    }

    /// Set `set_name` on `node` judged as `pinboard check` judges it, at `now`.
    pub fn node_readiness(
        &self,
        set_name: &str,
        node: &str,
        now: SystemTime,
    ) -> Option<NodeReadiness> {
        let wanted = WantedSet {
            set: self.view.set(set_name)?.to_image_set(),
            min_generation: 0,
        };
        assess_cluster_node(&self.view, &[wanted], &self.kubelets, node, now)
    }

    /// The sets to check: `files` as read, and those `names` names on the cluster.
    pub fn wanted(
        &self,
        files: Vec<ImageSet>,
        names: Vec<String>,
    ) -> Result<Vec<WantedSet>, UnknownSets> {
        wanted_sets(
            files,
            names,
            |name| self.view.set(name).map(|s| s.to_image_set()),
            || self.view.sets.iter().map(|s| s.name().to_owned()).collect(),
        )
    }
}

//! Cluster mode in the TUI, pure: the watched [`ClusterView`] inside the [`State`], and what the screens
//! make of it. Nodes come from the Node objects (space from allocatable ephemeral-storage, image counts from
//! `status.images`, lazy pulling from the pool's ContainerRuntimeConfigs); the cluster's PinnedImageSets
//! join the composer's sets; the Rollout screen shows, per node, where it is with the chosen set.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Instant, SystemTime};

use super::app::{SetDraft, State};
use crate::model::cluster::{ClusterUpdate, ClusterView, KubeletSettings, ROLE_LABEL};
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

impl State {
    /// Switches the state to cluster mode at wall-clock time `wall`; `denied` says why this account may not
    /// write, which makes the session read-only.
    pub fn start_cluster(&mut self, denied: Option<String>, wall: SystemTime) {
        self.cluster = Some(Box::new(ClusterSession {
            view: ClusterView::default(),
            members: BTreeMap::new(),
            kubelets: HashMap::new(),
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
    if change_kind != ChangeKind::Connection {
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
                state
                    .sets
                    .push(SetDraft::new(set.to_image_set(), BTreeSet::new()));
            }
        }
    }
    if change_kind != ChangeKind::Connection {
        // A set's nodes are those of the pools its labels land in, as they are now.
        for draft in &mut state.sets {
            draft.targets = view.nodes_of(&draft.set.labels).into_iter().collect();
        }
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

/// The set the Rollout screen follows: the one selected on the Sets screen if the cluster has it, else
/// the cluster's first.
pub fn followed_set(state: &State) -> Option<&str> {
    let view = &state.cluster.as_ref()?.view;
    let selected = state.selected_set().map(|d| d.set.name.as_str());
    selected
        .filter(|name| view.set(name).is_some())
        .or_else(|| view.sets.first().map(|s| s.name()))
}

/// Targets the selected set at `pool` (its role label), or at none when it already was; the set's nodes
/// follow.
pub(super) fn toggle_pool(state: &mut State, pool: &str) {
    let (Some(session), Some(draft)) = (state.cluster.as_ref(), state.selected_set()) else {
        return;
    };
    let mut labels = draft.set.labels.clone();
    if labels.get(ROLE_LABEL).map(String::as_str) == Some(pool) {
        labels.remove(ROLE_LABEL);
    } else {
        labels.insert(ROLE_LABEL.to_owned(), pool.to_owned());
    }
    let targets = session.view.nodes_of(&labels).into_iter().collect();
    if let Some(draft) = state.selected_set_mut() {
        draft.set.labels = labels;
        draft.targets = targets;
    }
}

/// The pool a draft targets, through its role label.
pub fn targeted_pool(draft: &SetDraft) -> Option<&str> {
    draft.set.labels.get(ROLE_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::super::app::{Msg, Pane, update};
    use super::super::demo::cluster_state;
    use super::super::theme::Theme;
    use super::*;

    fn press(state: &mut State, code: KeyCode) {
        update(state, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)));
    }

    #[test]
    fn in_cluster_mode_a_set_targets_a_pool_and_its_nodes_follow() {
        let mut state = cluster_state(Instant::now(), Theme::named("monochrome").unwrap());
        for code in [KeyCode::Char('2'), KeyCode::Tab] {
            press(&mut state, code);
        }
        assert_eq!(
            state.selected(Pane::Targets),
            Some("worker"),
            "pools, not nodes"
        );
        let draft = || state.selected_set().unwrap().clone();
        assert_eq!(targeted_pool(&draft()), Some("worker"));
        assert_eq!(draft().targets.len(), 5);
        press(&mut state, KeyCode::Char(' '));
        let untargeted = state.selected_set().unwrap();
        assert_eq!(targeted_pool(untargeted), None);
        assert!(untargeted.targets.is_empty(), "no pool, no nodes");
        press(&mut state, KeyCode::Char(' '));
        let retargeted = state.selected_set().unwrap();
        assert_eq!(targeted_pool(retargeted), Some("worker"));
        assert_eq!(retargeted.targets.len(), 5);
    }

    #[test]
    fn a_kubelet_read_again_replaces_what_it_said_unless_it_did_not_answer() {
        let theme = Theme::named("monochrome").unwrap();
        let mut state = State::new("cluster", theme, false, Instant::now());
        state.start_cluster(None, std::time::SystemTime::now());
        let said = |max| KubeletSettings {
            node_status_max_images: max,
            ..KubeletSettings::assumed("")
        };
        let answered = |max| KubeletSettings {
            assumed: None,
            ..said(max)
        };
        let silent = KubeletSettings::assumed("configz: connection refused");
        let read = |pairs: &[(&str, &KubeletSettings)]| {
            let read = pairs.iter().map(|(n, k)| (n.to_string(), (*k).clone()));
            Msg::Kubelets(read.collect())
        };
        update(&mut state, read(&[("w1", &answered(-1)), ("w2", &silent)]));
        update(&mut state, read(&[("w1", &silent), ("w2", &answered(100))]));
        let kubelets = &state.cluster.as_ref().unwrap().kubelets;
        assert_eq!(
            kubelets["w1"],
            answered(-1),
            "kept: it did not answer again"
        );
        assert_eq!(kubelets["w2"], answered(100), "it answered at last");
        update(&mut state, read(&[("w1", &answered(200))]));
        let kubelets = &state.cluster.as_ref().unwrap().kubelets;
        assert_eq!(kubelets["w1"], answered(200), "reconfigured");
    }

    #[test]
    fn a_set_loaded_before_the_cluster_arrives_targets_its_pool_nodes_once_they_do() {
        let theme = Theme::named("monochrome").unwrap();
        let demo = cluster_state(Instant::now(), theme.clone());
        let view = &demo.cluster.as_ref().unwrap().view;
        let mut state = State::new("cluster", theme, false, Instant::now());
        state.start_cluster(None, std::time::SystemTime::now());
        let mut set = crate::model::set::from_flags("from-file", &["quay.io/a/b@sha256:1".into()]);
        set.labels.insert(ROLE_LABEL.into(), "worker".into());
        state.sets.push(SetDraft::new(set, BTreeSet::new()));
        update(
            &mut state,
            Msg::Cluster(ClusterUpdate::Pools(view.pools.clone())),
        );
        assert!(state.sets[0].targets.is_empty(), "no nodes yet");
        update(
            &mut state,
            Msg::Cluster(ClusterUpdate::Nodes(view.nodes().to_vec())),
        );
        let mcns = view.machine_config_nodes().to_vec();
        update(
            &mut state,
            Msg::Cluster(ClusterUpdate::MachineConfigNodes(mcns)),
        );
        assert_eq!(state.sets[0].targets.len(), 5, "every worker");
    }

    #[test]
    fn watch_updates_refresh_nodes_sets_and_members() {
        let state = cluster_state(Instant::now(), Theme::named("monochrome").unwrap());
        let session = state.cluster.as_ref().unwrap();
        assert_eq!(state.nodes.len(), 5);
        assert_eq!(
            state.nodes[3].reachable,
            Some(false),
            "worker-3 is NotReady"
        );
        assert!(state.nodes.iter().all(|n| n.lazy_pulling == Some(true)));
        assert_eq!(session.members["ocp-4.19-release"].len(), 5);
        assert_eq!(state.sets.len(), 1, "the cluster's set joined the composer");
        assert_eq!(followed_set(&state), Some("ocp-4.19-release"));
    }
}

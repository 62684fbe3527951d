//! Cluster mode's changes to the state: starting it, folding in what the watchers report (nodes, pools,
//! the cluster's PinnedImageSets joining the composer's sets, each set's nodes), and targeting a set at a
//! pool.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use crate::fleet::{Targets, Traits};
use crate::model::cluster_session::Changed;
use crate::model::machine_config::{ClusterUpdate, ImageFsSpace, ROLE_LABEL};
use crate::model::node_summary;
use crate::ui::state::{SetDraft, State};

impl State {
    /// Takes in what the fleet is like at wall-clock time `wall`: on a cluster, the watched session starts
    /// empty; `denied` says why this account may not write, which makes the session read-only.
    pub fn join_fleet(&mut self, fleet: Traits, denied: Option<String>, wall: SystemTime) {
        self.fleet = fleet;
        self.epoch = (self.now, wall);
        if fleet.targets == Targets::Pools {
            self.machine_config = Some(Box::default());
        }
        if let Some(why) = denied {
            self.readonly = true;
            self.say(format!("read-only: {why}"));
            self.readonly_reason = why;
        }
    }
}

/// Takes in some nodes' image filesystems: the Nodes screen shows the figures the Plan counts.
pub(super) fn learn_image_fs(state: &mut State, read: HashMap<String, ImageFsSpace>) {
    let Some(session) = state.machine_config.as_mut() else {
        return;
    };
    session.image_fs.extend(read);
    state.nodes = node_summary::of_cluster(&session.view, &session.image_fs);
}

/// Applies a change from the watchers and refreshes what is derived from it.
pub(super) fn apply(state: &mut State, change: ClusterUpdate) {
    let Some(session) = state.machine_config.as_mut() else {
        return;
    };
    let changed = session.apply(change);
    let view = &session.view;
    if changed == Changed::Nodes {
        state.nodes = node_summary::of_cluster(view, &session.image_fs);
    }
    if changed == Changed::Sets {
        // The cluster's sets join the composer; a draft of the same name (being edited) is left alone.
        for set in &view.sets {
            if !state.sets.iter().any(|d| d.set.name == set.name()) {
                state
                    .sets
                    .push(SetDraft::new(set.to_image_set(), BTreeSet::new()));
            }
        }
    }
    if changed != Changed::Connection {
        // A set's nodes are those of the pools its labels land in, as they are now.
        for draft in &mut state.sets {
            draft.targets = view.nodes_of(&draft.set.labels).into_iter().collect();
        }
    }
}

/// Targets the selected set at `pool` (its role label), or at none when it already was; the set's nodes
/// follow.
pub(super) fn toggle_pool(state: &mut State, pool: &str) {
    let (Some(session), Some(draft)) = (state.machine_config.as_ref(), state.selected_set()) else {
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::model::machine_config::KubeletSettings;
    use crate::ui::demo::cluster_state;
    use crate::ui::msg::Msg;
    use crate::ui::state::Pane;
    use crate::ui::theme::Theme;
    use crate::ui::update::update;

    fn press(state: &mut State, code: KeyCode) {
        update(state, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)));
    }

    #[test]
    fn retry_and_cancel_say_the_daemons_pull_in_cluster_mode() {
        let mut state = cluster_state(Instant::now(), Theme::named("monochrome").unwrap());
        for code in [KeyCode::Char('4'), KeyCode::Char('r')] {
            assert!(
                update(
                    &mut state,
                    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
                )
                .is_empty()
            );
        }
        assert!(
            state
                .flash()
                .unwrap()
                .contains("machine-config daemons pull"),
            "{:?}",
            state.flash()
        );
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
        assert_eq!(draft().targeted_pool(), Some("worker"));
        assert_eq!(draft().targets.len(), 5);
        press(&mut state, KeyCode::Char(' '));
        let untargeted = state.selected_set().unwrap();
        assert_eq!(untargeted.targeted_pool(), None);
        assert!(untargeted.targets.is_empty(), "no pool, no nodes");
        press(&mut state, KeyCode::Char(' '));
        let retargeted = state.selected_set().unwrap();
        assert_eq!(retargeted.targeted_pool(), Some("worker"));
        assert_eq!(retargeted.targets.len(), 5);
    }

    #[test]
    fn a_kubelet_read_again_replaces_what_it_said_unless_it_did_not_answer() {
        let theme = Theme::named("monochrome").unwrap();
        let mut state = State::new("cluster", theme, false, Instant::now());
        state.join_fleet(Traits::MACHINE_CONFIG, None, std::time::SystemTime::now());
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
        let kubelets = &state.machine_config.as_ref().unwrap().kubelets;
        assert_eq!(
            kubelets["w1"],
            answered(-1),
            "kept: it did not answer again"
        );
        assert_eq!(kubelets["w2"], answered(100), "it answered at last");
        update(&mut state, read(&[("w1", &answered(200))]));
        let kubelets = &state.machine_config.as_ref().unwrap().kubelets;
        assert_eq!(kubelets["w1"], answered(200), "reconfigured");
    }

    #[test]
    fn the_nodes_screen_shows_the_image_filesystem_the_plan_counts_once_the_kubelet_says_it() {
        let mut state = cluster_state(Instant::now(), Theme::named("monochrome").unwrap());
        let name = state.nodes[0].name.clone();
        let allocatable = state.nodes[0].available_bytes;
        let space = ImageFsSpace {
            capacity_bytes: Some(200 << 20),
            available_bytes: Some(160 << 20),
            used_bytes: Some(40 << 20),
        };
        update(&mut state, Msg::ImageFs([(name.clone(), space)].into()));
        let node = state.nodes.iter().find(|n| n.name == name).unwrap();
        assert_ne!(
            allocatable,
            Some(160 << 20),
            "the demo's ephemeral storage differs"
        );
        assert_eq!(
            (node.capacity_bytes, node.available_bytes, node.used_bytes),
            (Some(200 << 20), Some(160 << 20), Some(40 << 20)),
            "the kubelet summary's image filesystem, as survey_cluster counts it"
        );
    }

    #[test]
    fn a_set_loaded_before_the_cluster_arrives_targets_its_pool_nodes_once_they_do() {
        let theme = Theme::named("monochrome").unwrap();
        let demo = cluster_state(Instant::now(), theme.clone());
        let view = &demo.machine_config.as_ref().unwrap().view;
        let mut state = State::new("cluster", theme, false, Instant::now());
        state.join_fleet(Traits::MACHINE_CONFIG, None, std::time::SystemTime::now());
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
        let session = state.machine_config.as_ref().unwrap();
        assert_eq!(state.nodes.len(), 5);
        assert_eq!(
            state.nodes[3].reachable,
            Some(false),
            "worker-3 is NotReady"
        );
        assert!(
            state
                .nodes
                .iter()
                .all(|n| n.lazy_pulling.as_ref().is_some_and(|l| l.configured()))
        );
        assert_eq!(session.members["ocp-4.19-release"].len(), 5);
        assert_eq!(state.sets.len(), 1, "the cluster's set joined the composer");
        assert_eq!(state.followed_set(), Some("ocp-4.19-release"));
    }
}

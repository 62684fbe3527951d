//! Readiness on an OpenShift cluster: the machine-config daemon's report is the proof that a node pulled and
//! pinned a set. A node is ready for a set when its MachineConfigNode reports the set's current generation
//! as both desired and current, no Degraded condition stands for it, and the Node is Ready.
//! `Node.status.images` can only contradict that: when the kubelet's list is complete (shorter than its
//! `nodeStatusMaxImages`, or that is -1) and lacks an image of the set, the node is not ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use super::direct::image_readiness;
use super::{
    Evidence, ImageObserved, ImageReadiness, ImageReason, KubeletReport, NodeReadiness, SetOnNode,
    SetState, WantedSet, not_as_wanted, with_reason,
};
use crate::model::machine_config::{
    ClusterNode, ClusterView, ImageList, KubeletSettings, Presence, SetProgress,
};
use crate::model::reference::{count_images, some_of};
use crate::model::units::clock;

/// Cluster mode: every node of every pool a wanted set lands in, judged from the watched view at `now`.
/// `kubelets` holds what each node's kubelet configuration says (read from `/configz`); a node missing from
/// it is judged with the kubelet's defaults. Nodes by name; each node's images are the union of its sets'
/// images, in set order.
pub fn assess_cluster(
    view: &ClusterView,
    wanted: &[WantedSet],
    kubelets: &HashMap<String, KubeletSettings>,
    now: SystemTime,
) -> Vec<NodeReadiness> {
    let sets: Vec<SetOnCluster> = wanted.iter().map(|w| SetOnCluster::new(view, w)).collect();
    let mut per_node: BTreeMap<String, Vec<(&SetOnCluster, SetProgress)>> = BTreeMap::new();
    for set in &sets {
        let name = &set.wanted.set.name;
        let labels = set.wanted.labels(view);
        let generation = set.generation.unwrap_or(set.wanted.min_generation);
        for (node, state) in view.rollout_of(name, labels, generation, now) {
            per_node.entry(node).or_default().push((set, state));
        }
    }
    let not_asked = KubeletSettings::assumed("its kubelet was not asked");
    per_node
        .into_iter()
        .map(|(node, sets)| {
            let kubelet = kubelets.get(&node).unwrap_or(&not_asked);
            assess_node(view, &node, &sets, kubelet)
        })
        .collect()
}

/// Cluster mode, for one node (the TUI's selected row): [`assess_cluster`] of the wanted sets that land on
/// it; None when none does.
pub fn assess_cluster_node(
    view: &ClusterView,
    wanted: &[WantedSet],
    kubelets: &HashMap<String, KubeletSettings>,
    node: &str,
    now: SystemTime,
) -> Option<NodeReadiness> {
    let node_view = view.node(node)?;
    let sets: Vec<SetOnCluster> = wanted
        .iter()
        .filter(|w| view.nodes_of(w.labels(view)).iter().any(|n| n == node))
        .map(|w| SetOnCluster::new(view, w))
        .collect();
    if sets.is_empty() {
        return None;
    }
    let states: Vec<(&SetOnCluster, SetProgress)> = sets
        .iter()
        .map(|set| {
            let generation = set.generation.unwrap_or(set.wanted.min_generation);
            let state = node_view.set_state(view, &set.wanted.set.name, generation, now);
            (set, state)
        })
        .collect();
    let not_asked = KubeletSettings::assumed("its kubelet was not asked");
    let kubelet = kubelets.get(node).unwrap_or(&not_asked);
    Some(assess_node(view, node, &states, kubelet))
}

/// What is judged the same way on every node a wanted set lands on: worked out once per set.
struct SetOnCluster<'a> {
    wanted: &'a WantedSet,
    /// The generation nodes must reach; None when the set is not on the cluster.
    generation: Option<i64>,
    /// The images of the set as the cluster has it.
    listed: HashSet<&'a str>,
    /// Why the cluster's set is not the wanted one: it is missing, or lacks some of its images.
    not_as_wanted: Option<String>,
    /// Whether some node's daemon has reported on the set: a node of its pools that has not was added
    /// after it was applied.
    reported_somewhere: bool,
}

impl<'a> SetOnCluster<'a> {
    fn new(view: &'a ClusterView, wanted: &'a WantedSet) -> SetOnCluster<'a> {
        let name = &wanted.set.name;
        let on_cluster = view.set(name);
        let listed: HashSet<&str> = on_cluster.into_iter().flat_map(|s| s.images()).collect();
        let not_as_wanted = not_as_wanted(wanted, on_cluster.map(|s| s.images()));
        let reported_somewhere = view.machine_config_nodes().iter().any(|mcn| {
            mcn.set_status(name)
                .is_some_and(|e| e.desired_generation.unwrap_or(0) > 0)
        });
        SetOnCluster {
            wanted,
            generation: on_cluster.map(|s| s.generation().max(wanted.min_generation)),
            listed,
            not_as_wanted,
            reported_somewhere,
        }
    }
}

/// One image on one node in cluster mode: a set done with it (the daemon's report) makes it present and
/// pinned unless the kubelet's complete list lacks it; otherwise the kubelet's list says what it can.
fn cluster_image(reference: &str, done: bool, presence: Option<Presence>) -> ImageReadiness {
    let (present, pinned, evidence) = match (done, presence) {
        (true, Some(Presence::Absent)) => (Some(false), Some(true), Evidence::KubeletList),
        (true, _) => (Some(true), Some(true), Evidence::Daemon),
        (false, Some(Presence::Present)) => (Some(true), Some(false), Evidence::KubeletList),
        (false, Some(Presence::Absent)) => (Some(false), Some(false), Evidence::KubeletList),
        (false, Some(Presence::Unknown) | None) => (None, Some(false), Evidence::None),
    };
    let mut image = image_readiness(&ImageObserved {
        reference: reference.to_owned(),
        present,
        recorded_pinned: pinned,
        ..ImageObserved::default()
    });
    image.evidence = evidence;
    image
}

fn assess_node(
    view: &ClusterView,
    node: &str,
    sets: &[(&SetOnCluster, SetProgress)],
    kubelet: &KubeletSettings,
) -> NodeReadiness {
    let node_view = view.node(node);
    let mcn = view.machine_config_node(node);
    let max_images = kubelet.node_status_max_images;
    let mut reasons = Vec::new();
    match node_view.map(|n| n.ready) {
        None => reasons.push(format!(
            "no Node object {node:?}: its MachineConfigNode names a node the cluster does not have"
        )),
        Some(Some(false)) => reasons.push(
            "node not ready: the kubelet reports Ready=False, so nothing is pulled or pinned there"
                .into(),
        ),
        Some(_) => {}
    }
    let mut on_node = Vec::new();
    let mut images: Vec<ImageReadiness> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut lacking_done: Vec<String> = Vec::new();
    for (on_cluster, state) in sets {
        let (wanted, generation) = (on_cluster.wanted, on_cluster.generation);
        let entry = mcn.and_then(|m| m.set_status(&wanted.set.name));
        if let Some(generation) = generation {
            let joined = on_cluster.reported_somewhere
                && entry.is_none()
                && matches!(state, SetProgress::Waiting | SetProgress::Unknown);
            reasons.extend(match joined {
                true => Some(format!(
                    "set {:?}: joined pool {} after the set was applied; its machine-config daemon has \
                     not reported on this node yet",
                    wanted.set.name,
                    view.pool_of(node).unwrap_or("?")
                )),
                false => {
                    let desired = entry.and_then(|e| e.desired_generation);
                    set_state_reason(&wanted.set.name, generation, desired, state)
                }
            });
        }
        reasons.extend(on_cluster.not_as_wanted.clone());
        for reference in wanted.set.references() {
            let done = *state == SetProgress::Done && on_cluster.listed.contains(reference);
            let presence = node_view.map(|n| n.presence(reference, max_images));
            let image = cluster_image(reference, done, presence);
            if done && image.present == Some(false) && !lacking_done.iter().any(|r| r == reference)
            {
                lacking_done.push(reference.to_owned());
            }
            match position.get(reference) {
                // An image in several sets is pinned when any of them is done with it.
                Some(&i) if done => images[i] = image,
                Some(_) => {}
                None => {
                    position.insert(reference.to_owned(), images.len());
                    images.push(image);
                }
            }
        }
        let elapsed = match state {
            SetProgress::Progressing { elapsed } | SetProgress::SlowButWorking { elapsed, .. } => {
                elapsed.map(|d| d.as_secs())
            }
            _ => None,
        };
        on_node.push(SetOnNode {
            name: wanted.set.name.clone(),
            generation,
            desired_generation: entry.and_then(|e| e.desired_generation),
            current_generation: entry.and_then(|e| e.current_generation),
            last_failed_generation: entry.and_then(|e| e.last_failed_generation),
            state: match generation {
                Some(_) => SetState::from(state),
                None => SetState::Absent,
            },
            error: match state {
                SetProgress::Failed { error, .. } => Some(error.clone()),
                SetProgress::SlowButWorking { message, .. } => Some(message.clone()),
                _ => None,
            },
            elapsed_seconds: elapsed,
        });
    }
    let report = node_view.map(|n| kubelet_report(n, kubelet, &images));
    let list_words = report.as_ref().map_or_else(String::new, |r| {
        format!("{} of {}", r.image_entries, r.settings.max_images_words())
    });
    if !lacking_done.is_empty() {
        reasons.push(format!(
            "the kubelet's complete image list ({list_words}) lacks {}: {}; the machine-config daemon \
             reported the set done, so the image was removed since (image GC, or `crictl rmi`), and the \
             daemon pulls it again only for a new generation of the set",
            count_images(lacking_done.len()),
            some_of(&lacking_done)
        ));
    }
    let missing: Vec<&str> = with_reason(&images, ImageReason::Missing)
        .into_iter()
        .filter(|r| !lacking_done.iter().any(|l| l == r))
        .collect();
    if !missing.is_empty() {
        reasons.push(format!(
            "the kubelet's complete image list ({list_words}) lacks {}: {}",
            count_images(missing.len()),
            some_of(&missing)
        ));
    }
    NodeReadiness {
        node: node.to_owned(),
        runtime: node_view.and_then(|n| n.runtime.clone()),
        reachable: true,
        pin_method: Some(MACHINE_CONFIG_PINS.into()),
        pinned_by: None,
        ready: reasons.is_empty(),
        reasons,
        images,
        sets: on_node,
        warnings: node_view.map_or_else(Vec::new, |n| kubelet_warnings(n, kubelet)),
        kubelet: report,
        lazy_pulling: None,
        cache: None,
        agent: None,
    }
}

fn kubelet_report(
    node: &ClusterNode,
    settings: &KubeletSettings,
    images: &[ImageReadiness],
) -> KubeletReport {
    KubeletReport {
        settings: settings.clone(),
        image_entries: node.image_entries,
        image_list_complete: node.image_list(settings.node_status_max_images)
            == ImageList::Complete,
        images_listed: images
            .iter()
            .filter(|i| node.images.contains(&i.reference))
            .count(),
    }
}

/// What a cluster node's kubelet makes worth knowing: its configuration could not be read, or it is too
/// old to keep pinned images from image GC.
fn kubelet_warnings(node: &ClusterNode, settings: &KubeletSettings) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(why) = &settings.assumed {
        warnings.push(format!(
            "the kubelet's configuration could not be read ({why}): assumed its defaults \
             (nodeStatusMaxImages {}, image GC thresholds {}% / {}%)",
            settings.node_status_max_images,
            settings.image_gc_high_threshold_percent,
            settings.image_gc_low_threshold_percent
        ));
    }
    warnings.extend(node.pins_ignored_warning());
    warnings
}

/// How cluster-mode nodes pin: the machine-config daemon writes CRI-O's drop-in from PinnedImageSets.
pub const MACHINE_CONFIG_PINS: &str = "pinned-image-set";

/// Why a node is not done with generation `generation` of set `name`; None when it is.
fn set_state_reason(
    name: &str,
    generation: i64,
    desired: Option<i64>,
    state: &SetProgress,
) -> Option<String> {
    let took = |elapsed: &Option<std::time::Duration>| {
        elapsed.map_or_else(String::new, |d| format!(" for {}", clock(d)))
    };
    Some(match state {
        SetProgress::Done => return None,
        SetProgress::Waiting => format!(
            "set {name:?}: the node has not seen generation {generation} yet ({}); the machine-config \
             daemon picks it up next",
            desired.map_or(
                "its MachineConfigNode has no entry for the set".into(),
                |d| { format!("its MachineConfigNode wants generation {d}") }
            )
        ),
        SetProgress::Progressing { elapsed } => {
            format!(
                "set {name:?} generation {generation}: pulling{}",
                took(elapsed)
            )
        }
        SetProgress::SlowButWorking { elapsed, message } => format!(
            "set {name:?} generation {generation}: still pulling{} (the daemon's sync window ended and it \
             carries on: {message})",
            took(elapsed)
        ),
        SetProgress::Failed { generation, error } => {
            format!("set {name:?} generation {generation} failed: {error}")
        }
        SetProgress::Unknown => format!(
            "set {name:?}: no MachineConfigNode reports on this node, so nothing shows the set there; \
             check that the machine-config daemon runs on it"
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::time::SystemTime;

    use serde_json::{Value, json};

    use super::super::*;
    use crate::model::machine_config::{ClusterUpdate, DEGRADED, PROGRESSING, ROLE_LABEL};

    const A: &str = "quay.io/x/a@sha256:aa";
    const B: &str = "quay.io/x/b@sha256:bb";

    fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    /// Node `name`, Ready as given, listing `images` (padded to `entries` entries).
    fn node(
        name: &str,
        ready: bool,
        images: &[&str],
        entries: usize,
    ) -> k8s_openapi::api::core::v1::Node {
        let mut list: Vec<Value> = images.iter().map(|i| json!({"names": [i]})).collect();
        list.extend(
            (list.len()..entries)
                .map(|n| json!({"names": [format!("quay.io/other/{n}@sha256:0")]})),
        );
        from(json!({
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "nodeInfo": {"containerRuntimeVersion": "cri-o://1.33.2", "architecture": "", "bootID": "",
                             "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                             "operatingSystem": "", "osImage": "", "systemUUID": ""},
                "images": list,
            },
        }))
    }

    fn mcn(name: &str, desired: i64, current: i64, degraded: Option<&str>) -> Value {
        json!({
            "metadata": {"name": name},
            "spec": {"node": {"name": name}, "pool": {"name": "worker"}},
            "status": {
                "pinnedImageSets": [{"name": "s", "desiredGeneration": desired, "currentGeneration": current,
                                     "lastFailedGeneration": degraded.map(|_| desired),
                                     "lastFailedGenerationError": degraded}],
                "conditions": [
                    {"type": PROGRESSING, "status": if desired != current && degraded.is_none() { "True" } else { "False" }},
                    {"type": DEGRADED, "status": if degraded.is_some() { "True" } else { "False" }},
                ],
            },
        })
    }

    fn view(
        set_generation: i64,
        nodes: Vec<k8s_openapi::api::core::v1::Node>,
        mcns: Vec<Value>,
    ) -> ClusterView {
        let mut view = ClusterView::default();
        view.apply(ClusterUpdate::Pools(vec![from(
            json!({"metadata": {"name": "worker"}, "spec": {
                "machineConfigSelector": {"matchLabels": {ROLE_LABEL: "worker"}},
                "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
            }}),
        )]));
        view.apply(ClusterUpdate::Sets(vec![from(json!({
                "metadata": {"name": "s", "generation": set_generation, "labels": {ROLE_LABEL: "worker"}},
                "spec": {"pinnedImages": [{"name": A}, {"name": B}]},
            }))]));
        view.apply(ClusterUpdate::Nodes(nodes.iter().map(Into::into).collect()));
        view.apply(ClusterUpdate::MachineConfigNodes(
            mcns.into_iter().map(from).collect(),
        ));
        view
    }

    fn wanted(min_generation: i64) -> WantedSet {
        WantedSet {
            set: crate::model::set::from_flags("s", &[A.into(), B.into()]),
            min_generation,
        }
    }

    fn judge(view: &ClusterView, min_generation: i64) -> Readiness {
        Readiness::of(assess_cluster(
            view,
            &[wanted(min_generation)],
            &HashMap::new(),
            SystemTime::now(),
        ))
    }

    /// Judged with each node's kubelet allowing `max_images` entries in its image list.
    fn judge_with(view: &ClusterView, max_images: i64) -> Readiness {
        let kubelets = view
            .nodes()
            .iter()
            .map(|n| {
                let mut settings = KubeletSettings::assumed("");
                settings.node_status_max_images = max_images;
                settings.assumed = None;
                (n.name.clone(), settings)
            })
            .collect();
        Readiness::of(assess_cluster(
            view,
            &[wanted(0)],
            &kubelets,
            SystemTime::now(),
        ))
    }

    #[test]
    fn done_and_listed_everywhere_is_ready() {
        let v = view(
            2,
            vec![node("n1", true, &[A, B], 2), node("n2", true, &[A, B], 50)],
            vec![mcn("n1", 2, 2, None), mcn("n2", 2, 2, None)],
        );
        let r = judge(&v, 0);
        assert!(r.ready, "{:#?}", r.nodes);
        assert_eq!(r.nodes[0].runtime.as_deref(), Some("cri-o://1.33.2"));
        assert_eq!(r.nodes[0].pin_method.as_deref(), Some(MACHINE_CONFIG_PINS));
        let set = &r.nodes[0].sets[0];
        assert_eq!(
            (set.generation, set.current_generation, set.state),
            (Some(2), Some(2), SetState::Done)
        );
    }

    #[test]
    fn every_case_a_pipeline_must_not_pass_says_why() {
        let v = view(
            3,
            vec![
                node("n1", true, &[A, B], 2),
                node("n2", true, &[A], 50),
                node("n3", true, &[A, B], 2),
                node("n4", false, &[A, B], 2),
                node("n5", true, &[A], 2),
            ],
            vec![
                mcn("n1", 2, 2, None),
                mcn("n2", 3, 3, None),
                mcn(
                    "n3",
                    3,
                    2,
                    Some("failed to pull quay.io/x/b: no space left on device"),
                ),
                mcn("n4", 3, 3, None),
                mcn("n5", 3, 3, None),
            ],
        );
        let r = judge(&v, 0);
        assert!(!r.ready);
        assert_eq!(r.ready_nodes, 1, "n2: done, its full list proves nothing");
        let reasons = |n: usize| r.nodes[n].reasons.join(" | ");
        assert!(
            reasons(0).contains(
                "has not seen generation 3 yet (its MachineConfigNode wants generation 2)"
            ),
            "{}",
            reasons(0)
        );
        assert!(r.nodes[1].ready, "{}", reasons(1));
        assert_eq!(r.nodes[1].images[1].evidence, Evidence::Daemon);
        assert_eq!(
            r.nodes[1].evidence_words().as_deref(),
            Some("daemon's report; the kubelet lists 1 of 2 images")
        );
        assert!(
            reasons(2).contains(
                "set \"s\" generation 3 failed: failed to pull quay.io/x/b: no space left"
            ),
            "{}",
            reasons(2)
        );
        assert_eq!(r.nodes[2].sets[0].state, SetState::Failed);
        assert!(reasons(3).starts_with("node not ready"), "{}", reasons(3));
        assert!(
                reasons(4).starts_with(
                    "the kubelet's complete image list (2 of at most 50) lacks 1 image: quay.io/x/b@sha256:bb; \
                     the machine-config daemon reported the set done"
                ),
                "{}",
                reasons(4)
            );
        assert_eq!(r.nodes[4].images[1].evidence, Evidence::KubeletList);
        assert_eq!(r.nodes[4].summary(), "1 image missing");
        assert_eq!(r.nodes[0].summary(), "s waiting, 2 images not pinned");
    }

    #[test]
    fn an_empty_or_full_image_list_proves_nothing_and_a_complete_one_can_contradict() {
        let v = view(
            2,
            vec![node("n1", true, &[], 0), node("n2", true, &[A], 50)],
            vec![mcn("n1", 2, 2, None), mcn("n2", 2, 2, None)],
        );
        let r = judge(&v, 0);
        assert!(r.ready, "{:#?}", r.nodes);
        assert!(
            r.nodes[0]
                .images
                .iter()
                .all(|i| i.evidence == Evidence::Daemon)
        );
        // A kubelet allowed 200 entries: n2's 50 are everything it has, and B is not among them.
        let r = judge_with(&v, 200);
        assert!(r.nodes[0].ready, "an empty list still proves nothing");
        assert!(!r.nodes[1].ready);
        assert!(
            r.nodes[1].reasons[0]
                .starts_with("the kubelet's complete image list (50 of at most 200) lacks 1 image"),
            "{:?}",
            r.nodes[1].reasons
        );
        assert!(judge_with(&v, -1).nodes[1].reasons[0].contains("(50 of no limit)"));
        let json = serde_json::to_value(&r.nodes[1]).unwrap();
        assert_eq!(json["kubelet"]["nodeStatusMaxImages"], 200);
        assert_eq!(json["kubelet"]["imageListComplete"], true);
        assert_eq!(json["images"][1]["evidence"], "kubelet-list");
        assert_eq!(json["images"][0]["evidence"], "daemon");
    }

    #[test]
    fn a_node_that_joined_after_the_set_was_applied_is_named() {
        let mut v = view(
            2,
            vec![node("n1", true, &[A, B], 2), node("w4", true, &[], 0)],
            vec![mcn("n1", 2, 2, None)],
        );
        let r = judge(&v, 0);
        assert!(!r.ready);
        let w4 = &r.nodes[1];
        assert_eq!(w4.node, "w4");
        assert_eq!(
            w4.reasons,
            [
                "set \"s\": joined pool worker after the set was applied; its machine-config daemon \
                  has not reported on this node yet"
            ]
        );
        // Its MachineConfigNode appears, without an entry for the set yet: still named.
        let mut empty = mcn("w4", 2, 2, None);
        empty["status"]["pinnedImageSets"] = json!([]);
        v.apply(ClusterUpdate::MachineConfigNodes(vec![
            from(mcn("n1", 2, 2, None)),
            from(empty),
        ]));
        assert!(judge(&v, 0).nodes[1].reasons[0].contains("joined pool worker"));
        v.apply(ClusterUpdate::MachineConfigNodes(vec![
            from(mcn("n1", 2, 2, None)),
            from(mcn("w4", 2, 2, None)),
        ]));
        assert!(judge(&v, 0).ready);
    }

    #[test]
    fn old_kubelets_and_unread_configs_are_warnings_not_failures() {
        let mut old = node("n1", true, &[A, B], 2);
        old.status
            .as_mut()
            .unwrap()
            .node_info
            .as_mut()
            .unwrap()
            .kubelet_version = "v1.24.17".into();
        let v = view(2, vec![old], vec![mcn("n1", 2, 2, None)]);
        let r = judge(&v, 0);
        assert!(r.ready, "{:?}", r.nodes[0].reasons);
        let warnings = r.nodes[0].warnings.join(" | ");
        assert!(
            warnings.contains("kubelet v1.24.17 predates pinned-image support"),
            "{warnings}"
        );
        assert!(
            warnings
                .contains("could not be read (its kubelet was not asked): assumed its defaults"),
            "{warnings}"
        );
        assert!(judge_with(&v, 50).nodes[0].warnings.len() == 1);
    }

    #[test]
    fn a_generation_just_applied_is_waited_for_even_before_the_watch_shows_it() {
        let v = view(
            2,
            vec![node("n1", true, &[A, B], 2)],
            vec![mcn("n1", 2, 2, None)],
        );
        assert!(judge(&v, 2).ready);
        let r = judge(&v, 3);
        assert!(!r.ready);
        assert_eq!(r.nodes[0].sets[0].generation, Some(3));
    }

    #[test]
    fn slow_pulls_are_not_failures_and_absent_sets_are_named() {
        let timeout = format!(
            "{}: 3 of 9 left",
            crate::model::machine_config::REQUEUE_TIMEOUT
        );
        let v = view(
            2,
            vec![node("n1", true, &[A], 2)],
            vec![mcn("n1", 2, 1, Some(&timeout))],
        );
        let r = judge(&v, 0);
        assert_eq!(r.nodes[0].sets[0].state, SetState::Slow);
        assert!(
            r.nodes[0].reasons[0].contains("still pulling"),
            "{:?}",
            r.nodes[0].reasons
        );
        let mut other = wanted(0);
        other.set.name = "t".into();
        other.set.labels = BTreeMap::from([(ROLE_LABEL.into(), "worker".into())]);
        let r = Readiness::of(assess_cluster(
            &v,
            &[other],
            &HashMap::new(),
            SystemTime::now(),
        ));
        assert_eq!(r.nodes[0].sets[0].state, SetState::Absent);
        assert!(
            r.nodes[0].reasons[0].contains("\"t\" is not on the cluster"),
            "{:?}",
            r.nodes[0].reasons
        );
    }

    #[test]
    fn cluster_json_reads_back() {
        let v = view(
            2,
            vec![node("n1", true, &[A, B], 2)],
            vec![mcn("n1", 2, 1, None)],
        );
        let status = NodesStatus::from(judge(&v, 0));
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["nodes"][0]["sets"][0]["desiredGeneration"], 2);
        assert_eq!(json["nodes"][0]["sets"][0]["state"], "pulling");
        let back: NodesStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }
}

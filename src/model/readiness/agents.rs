//! Readiness on a cluster of pinboard's agents: each node's agent asks its own runtime and reports what
//! the node holds and pins ([`crate::model::pinboard_api::PinboardNode`]); a fresh report is the runtime's
//! word, relayed. A node is ready for a set when its agent's heartbeat is fresh, its report has the set at
//! the set's generation (or a newer one) pinned, and its complete image list holds every image of the set,
//! pinned. A node the set selects whose agent never reported, or whose heartbeat is stale, is not ready,
//! and the reason names it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::direct::image_readiness;
use super::{
    Evidence, ImageObserved, ImageReadiness, ImageReason, NodeReadiness, PinnedBy, SetOnNode,
    SetState, WantedSet, lazily_present, not_as_wanted, with_reason,
};
use crate::model::agents_view::{AgentsView, NodeWithSet};
use crate::model::holders::HeldBy;
use crate::model::pinboard_api::{DEGRADED, NodeReport, NodeSetPhase};
use crate::model::reference::{count_images, some_of};
use crate::model::units::{clock, human};

/// Every node a wanted set lands on, judged from the agents' reports at `now`; nodes by name, each
/// node's images the union of its sets' images, in set order.
pub fn assess_agents(
    view: &AgentsView,
    wanted: &[WantedSet],
    now: SystemTime,
) -> Vec<NodeReadiness> {
    let mut per_node: BTreeMap<&str, Vec<SetOnAgents>> = BTreeMap::new();
    for wanted in wanted {
        let set = SetOnAgents::new(view, wanted);
        for node in view.nodes_selected(set.selector.as_ref()) {
            per_node.entry(&node.name).or_default().push(set.clone());
        }
    }
    per_node
        .into_iter()
        .map(|(node, sets)| assess_node(view, node, &sets, now))
        .collect()
}

/// What is judged the same way on every node a wanted set lands on.
#[derive(Clone)]
struct SetOnAgents<'a> {
    wanted: &'a WantedSet,
    /// The generation the agents must reach; None when the set is not on the cluster.
    generation: Option<i64>,
    selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// Why the cluster's set is not the wanted one.
    not_as_wanted: Option<String>,
}

impl<'a> SetOnAgents<'a> {
    fn new(view: &AgentsView, wanted: &'a WantedSet) -> SetOnAgents<'a> {
        let name = &wanted.set.name;
        let on_cluster = view.set(name);
        let not_as_wanted = not_as_wanted(wanted, on_cluster.map(|s| s.images()));
        SetOnAgents {
            wanted,
            generation: on_cluster.map(|s| s.generation().max(wanted.min_generation)),
            // The cluster's selector once the set is there; the wanted set's own before.
            selector: match on_cluster {
                Some(set) => set.spec.node_selector.clone(),
                None => wanted.set.node_selector.as_ref().map(|s| s.0.clone()),
            },
            not_as_wanted,
        }
    }
}

fn assess_node(
    view: &AgentsView,
    node: &str,
    sets: &[SetOnAgents],
    now: SystemTime,
) -> NodeReadiness {
    let mut reasons = Vec::new();
    let mut on_node = Vec::new();
    let mut references: Vec<&str> = Vec::new();
    // The report counts only while the agent's heartbeat is fresh.
    let mut report = view.report(node);
    for set in sets {
        let name = &set.wanted.set.name;
        for reference in set.wanted.set.references() {
            if !references.contains(&reference) {
                references.push(reference);
            }
        }
        reasons.extend(set.not_as_wanted.clone());
        let Some(generation) = set.generation else {
            on_node.push(set_on_node(name, None, None, SetState::Absent, None));
            continue;
        };
        let with_set = view.node_with_set(node, name, generation, now);
        let observed = report
            .and_then(|r| r.sets.iter().find(|s| s.name == *name))
            .map(|s| s.observed_generation);
        let (state, error) = match &with_set {
            NodeWithSet::Ready => (SetState::Done, None),
            NodeWithSet::NoAgent | NodeWithSet::Stale { .. } => (SetState::Unknown, None),
            NodeWithSet::Waiting { .. } => (SetState::Waiting, None),
            NodeWithSet::Pulling => (SetState::Pulling, None),
            NodeWithSet::Failed { reason } => (SetState::Failed, Some(reason.clone())),
            NodeWithSet::Restoring { reason } => (SetState::Restoring, Some(reason.clone())),
        };
        match &with_set {
            NodeWithSet::NoAgent | NodeWithSet::Stale { .. } => report = None,
            other => reasons.extend(set_reason(name, generation, other, report)),
        }
        on_node.push(set_on_node(name, Some(generation), observed, state, error));
    }
    let agent_reason = match view.agent_untrusted(node, now) {
        Some(NodeWithSet::NoAgent) => Some(format!(
            "no pinboard agent reports on node {node:?}: its DaemonSet has no running pod there; \
             `kubectl -n {ns} get pods -o wide` shows why (docs/agents.md)",
            ns = crate::model::pinboard_api::DEFAULT_NAMESPACE
        )),
        Some(NodeWithSet::Stale { seconds, valid_for }) => Some(format!(
            "the agent on node {node:?} is stale: {}; it stopped or cannot reach the API server, so \
             what it last reported is not trusted",
            match seconds {
                u64::MAX => "it never renewed its heartbeat".to_string(),
                s => format!(
                    "{} since its last heartbeat, which stood for {}",
                    clock(Duration::from_secs(s)),
                    clock(Duration::from_secs(valid_for))
                ),
            },
        )),
        _ => None,
    };
    if let Some(reason) = agent_reason {
        reasons.insert(0, reason);
    }
    let images: Vec<ImageReadiness> = references
        .iter()
        .map(|reference| reported_image(report, reference))
        .collect();
    let done = on_node.iter().all(|s| s.state == SetState::Done);
    let missing = with_reason(&images, ImageReason::Missing);
    if report.is_some() && done && !missing.is_empty() {
        reasons.push(format!(
            "the agent's complete image list lacks {}: {}; they were removed since they were pinned \
             (`crictl rmi`, image GC), and the agent puts them back at its next check (--verify-every)",
            count_images(missing.len()),
            some_of(&missing)
        ));
    }
    if report.is_some() && done {
        let runtime = report
            .and_then(|r| r.runtime.as_ref())
            .map(|r| r.name.as_str());
        reasons.extend(lazily_present(&images, runtime));
    }
    let not_pinned = with_reason(&images, ImageReason::NotPinned);
    if report.is_some() && done && !not_pinned.is_empty() {
        reasons.push(format!(
            "the runtime says {} not pinned: {}",
            count_images(not_pinned.len()),
            some_of(&not_pinned)
        ));
    }
    NodeReadiness {
        node: node.to_owned(),
        runtime: report
            .and_then(|r| r.runtime.as_ref())
            .map(|r| format!("{} {}", r.name, r.version)),
        reachable: report.is_some(),
        pin_method: report.and_then(|r| r.pin_method.clone()),
        lazy_pulling: report.and_then(|r| r.lazy_pulling.clone()),
        pinned_by: report.map(pinned_by),
        ready: reasons.is_empty(),
        reasons,
        images,
        sets: on_node,
        kubelet: None,
        warnings: report.map_or_else(Vec::new, |r| fought(r, sets)),
        cache: report.and_then(|r| r.cache.clone()),
    }
}

/// The sets pinned again after losses that recur: ready, but something on the node fights the pins.
fn fought(report: &NodeReport, sets: &[SetOnAgents]) -> Vec<String> {
    report
        .sets
        .iter()
        .filter(|s| {
            s.state == NodeSetPhase::Pinned && sets.iter().any(|w| w.wanted.set.name == s.name)
        })
        .filter_map(|s| {
            let degraded = s
                .conditions
                .iter()
                .find(|c| c.type_ == DEGRADED && c.status == "True")?;
            Some(format!("set {:?}: {}", s.name, degraded.message))
        })
        .collect()
}

fn set_on_node(
    name: &str,
    generation: Option<i64>,
    observed: Option<i64>,
    state: SetState,
    error: Option<String>,
) -> SetOnNode {
    SetOnNode {
        name: name.to_owned(),
        generation,
        desired_generation: None,
        current_generation: observed,
        last_failed_generation: None,
        state,
        error,
        elapsed_seconds: None,
    }
}

/// Why a node whose agent reports is not done with generation `generation` of set `name`.
fn set_reason(
    name: &str,
    generation: i64,
    with_set: &NodeWithSet,
    report: Option<&NodeReport>,
) -> Option<String> {
    Some(match with_set {
        NodeWithSet::Waiting { observed: None } => format!(
            "set {name:?}: the node's agent has not taken the set up yet (generation {generation})"
        ),
        NodeWithSet::Waiting {
            observed: Some(observed),
        } => format!(
            "set {name:?}: the node's agent is at generation {observed}, not yet {generation}"
        ),
        NodeWithSet::Pulling => {
            let on_node = report.and_then(|r| r.sets.iter().find(|s| s.name == name));
            match on_node {
                Some(s) if s.total_bytes > 0 => format!(
                    "set {name:?}: pulling, {} of {}",
                    human(s.done_bytes),
                    human(s.total_bytes)
                ),
                _ => format!("set {name:?}: pulling"),
            }
        }
        NodeWithSet::Failed { reason } => format!("set {name:?} failed: {reason}"),
        NodeWithSet::Restoring { reason } => format!("set {name:?}: {reason}"),
        NodeWithSet::Ready | NodeWithSet::NoAgent | NodeWithSet::Stale { .. } => return None,
    })
}

/// One image as the node's report has it: its complete image list is the runtime's word on presence and
/// pins; without a report (no agent, or a stale one) nothing is known.
fn reported_image(report: Option<&NodeReport>, reference: &str) -> ImageReadiness {
    let Some(report) = report else {
        return image_readiness(&ImageObserved {
            reference: reference.to_owned(),
            ..ImageObserved::default()
        });
    };
    let held = report
        .images
        .iter()
        .find(|i| i.names.iter().any(|n| n == reference));
    let mut image = image_readiness(&ImageObserved {
        reference: reference.to_owned(),
        present: Some(held.is_some()),
        reported_pinned: held.map(|i| i.pinned),
        lazy: held.and_then(|i| i.lazy.clone()),
        ..ImageObserved::default()
    });
    image.evidence = Evidence::Runtime;
    image.held_by = held.filter(|i| i.pinned).map(|i| HeldBy {
        sets: i
            .held_by
            .iter()
            .filter(|h| !matches!(h.as_str(), "admin" | "unowned"))
            .cloned()
            .collect(),
        admin: i.held_by.iter().any(|h| h == "admin"),
        unowned: i.held_by.iter().any(|h| h == "unowned"),
    });
    image
}

/// What the agent's pins rest on: the runtime's word, unless the agent said it had only the node's record
/// to go by for some image (a runtime that cannot report pins).
fn pinned_by(report: &NodeReport) -> PinnedBy {
    let record = report
        .sets
        .iter()
        .flat_map(|s| &s.images)
        .any(|i| i.evidence.as_deref() == Some("record"));
    match record {
        true => PinnedBy::Record,
        false => PinnedBy::Runtime,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::model::agents_view::AgentsUpdate;
    use crate::model::machine_config::ClusterNode;
    use crate::model::pinboard_api::{
        Heartbeat, ImagePhase, ImageReport, NodeSetPhase, ObjectMeta, PinSet, PinSetSpec,
        PinboardNode, PinnedImage, SetImageReport, SetReport,
    };
    use crate::model::set::from_flags;

    const IMAGE: &str = "r.example/app@sha256:aa";

    fn node(name: &str) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            ..ClusterNode::default()
        }
    }

    /// n1 pinned the set, n2's agent went quiet 10 minutes ago, n3 has none but the set selects it.
    fn view(now: SystemTime) -> AgentsView {
        let set = PinSet {
            metadata: ObjectMeta {
                name: "web".into(),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            spec: PinSetSpec {
                pinned_images: vec![PinnedImage { name: IMAGE.into() }],
                node_selector: Some(Default::default()),
                ..PinSetSpec::default()
            },
            status: None,
        };
        let report = |name: &str| PinboardNode {
            metadata: ObjectMeta {
                name: name.into(),
                ..ObjectMeta::default()
            },
            spec: Default::default(),
            status: Some(NodeReport {
                images: vec![ImageReport {
                    names: vec![IMAGE.into()],
                    size_bytes: 10,
                    pinned: true,
                    held_by: vec!["web".into()],
                    lazy: None,
                }],
                sets: vec![SetReport {
                    name: "web".into(),
                    observed_generation: 2,
                    state: NodeSetPhase::Pinned,
                    images: vec![SetImageReport {
                        name: IMAGE.into(),
                        state: ImagePhase::Pinned,
                        evidence: Some("runtime".into()),
                        ..SetImageReport::default()
                    }],
                    ..SetReport::default()
                }],
                ..NodeReport::default()
            }),
        };
        let beat = |ago: u64| Heartbeat {
            renewed: now - Duration::from_secs(ago),
            valid_for: Duration::from_secs(120),
        };
        let mut view = AgentsView::default();
        view.apply(AgentsUpdate::Sets(vec![set]));
        view.apply(AgentsUpdate::Nodes(vec![
            node("n1"),
            node("n2"),
            node("n3"),
        ]));
        view.apply(AgentsUpdate::Reports(vec![
            report("n1").into(),
            report("n2").into(),
        ]));
        view.apply(AgentsUpdate::Heartbeats(
            [("n1".to_string(), beat(5)), ("n2".to_string(), beat(600))].into(),
        ));
        view
    }

    #[test]
    fn a_node_is_ready_on_its_fresh_agents_word_and_a_stale_or_missing_agent_is_named() {
        let now = SystemTime::now();
        let wanted = [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }];
        let nodes = assess_agents(&view(now), &wanted, now);
        assert_eq!(
            nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
            ["n1", "n2", "n3"]
        );
        let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
        assert!(n1.ready, "{:?}", n1.reasons);
        assert_eq!(n1.images[0].evidence, Evidence::Runtime);
        assert_eq!(n1.pinned_by, Some(PinnedBy::Runtime));
        assert_eq!(
            n1.images[0].held_by.as_ref().map(|h| h.sets.clone()),
            Some(vec!["web".to_string()])
        );
        assert!(!n2.ready);
        assert!(
            n2.reasons[0].contains("n2") && n2.reasons[0].contains("stale"),
            "{:?}",
            n2.reasons
        );
        assert_eq!(n2.images[0].present, None, "a stale report proves nothing");
        assert!(!n3.ready);
        assert!(
            n3.reasons[0].contains("no pinboard agent reports on node \"n3\""),
            "{:?}",
            n3.reasons
        );
    }

    #[test]
    fn a_newer_generation_waits_for_the_agent_and_an_image_removed_since_is_named() {
        let now = SystemTime::now();
        let mut view = view(now);
        view.sets[0].metadata.generation = Some(3);
        let wanted = [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }];
        let n1 = &assess_agents(&view, &wanted, now)[0];
        assert!(!n1.ready);
        assert!(
            n1.reasons
                .iter()
                .any(|r| r.contains("generation 2, not yet 3")),
            "{:?}",
            n1.reasons
        );
        view.sets[0].metadata.generation = Some(2);
        if let Some(report) = view
            .reports
            .get_mut("n1")
            .and_then(|r| Arc::make_mut(r).status.as_mut())
        {
            report.images.clear();
        }
        let n1 = &assess_agents(&view, &wanted, now)[0];
        assert!(!n1.ready);
        assert!(
            n1.reasons.iter().any(|r| r.contains("lacks 1 image")),
            "{:?}",
            n1.reasons
        );
    }

    #[test]
    fn an_image_the_agent_reports_present_only_lazily_is_not_pre_loaded() {
        let now = SystemTime::now();
        let mut view = view(now);
        if let Some(report) = view
            .reports
            .get_mut("n1")
            .and_then(|r| Arc::make_mut(r).status.as_mut())
        {
            report.images[0].lazy = Some(crate::model::lazy::RemoteLayers {
                remote_layers: vec![1, 2],
                layers: 3,
            });
        }
        let wanted = [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }];
        let judged = assess_agents(&view, &wanted, now);
        let n1 = judged.iter().find(|n| n.node == "n1").unwrap();
        assert!(!n1.ready);
        assert_eq!(n1.images[0].reason, Some(ImageReason::Lazy));
        assert!(
            n1.reasons
                .iter()
                .any(|r| r.contains("1 image present only lazily") && r.contains("crictl rmi")),
            "{:?}",
            n1.reasons
        );
    }
}

//! Readiness on a cluster of pinboard's agents: each node's agent asks its own runtime and reports what
//! the node holds and pins ([`crate::model::pinboard_api::PinboardNode`]); a fresh report is the runtime's
//! word, relayed. A node is ready for a set when its agent's heartbeat is fresh, its report has the set at
//! the set's generation (or a newer one) pinned, and its complete image list holds every image of the set,
//! pinned. The nodes judged are chosen by [`AgentsView::choose`]: a node an agents' DaemonSet should run
//! on whose agent never reported ("no agent yet", with its pod's state when it was looked up), or whose
//! heartbeat is stale, is not ready, and the reason names it; the nodes left out are counted, by why.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::direct::image_readiness;
use super::{
    Evidence, ImageObserved, ImageReadiness, ImageReason, LeftOut, NodeReadiness, PinnedBy,
    Readiness, SetOnNode, SetState, WantedSet, lazily_present, not_as_wanted, unserved,
    with_reason,
};
use crate::model::agent_daemonsets::{AGENTS_DAEMONSET_LABEL, AgentDaemonSet, Placement};
use crate::model::agent_pods::{AgentPods, PodsOnNode};
use crate::model::agents_view::{AgentsView, NodeWithSet};
use crate::model::holders::HeldBy;
use crate::model::machine_config::ClusterNode;
use crate::model::pinboard_api::{CheckAnswer, DEGRADED, NodeReport, NodeSetPhase};
use crate::model::reference::{count_images, some_of};
use crate::model::units::{clock, human};

/// Every node the wanted sets are judged on, from the agents' reports at `now`, with what `pods` says of
/// the agent pods of nodes whose agent does not report; nodes by name, each node's images the union of its
/// sets' images, in set order; and the nodes the sets select but leave out, by why.
pub fn assess_agents(
    view: &AgentsView,
    wanted: &[WantedSet],
    now: SystemTime,
    pods: &AgentPods,
    asked: Option<&AskedCheck>,
) -> Readiness {
    let mut per_node: BTreeMap<&str, (&ClusterNode, Vec<SetOnAgents>)> = BTreeMap::new();
    let mut left_out = BTreeMap::new();
    for wanted in wanted {
        let set = SetOnAgents::new(view, wanted);
        let choice = view.choose(set.selector.as_ref(), now);
        for node in choice.judged {
            let (_, sets) = per_node.entry(&node.name).or_insert((node, Vec::new()));
            sets.push(set.clone());
        }
        left_out.extend(choice.left_out);
    }
    let nodes = per_node
        .into_values()
        .map(|(node, sets)| assess_node(view, node, &sets, now, pods, asked))
        .collect();
    let mut readiness = Readiness::of(nodes);
    readiness.left_out = LeftOut::grouped(left_out);
    if view.daemonsets.listed.is_empty() {
        readiness.warnings.push(format!(
            "no pinboard agent DaemonSet in namespace {:?} (label {AGENTS_DAEMONSET_LABEL}): judged only the \
             nodes whose agent has reported, and every node a set's nodeSelector selects, so a node whose \
             agent never started is not counted; install the agents with `pinboard agent manifests`, or \
             pass their namespace with --namespace",
            view.daemonsets.namespace
        ));
    }
    readiness
}

/// A check asked of the agents of the wanted sets' nodes
/// ([`crate::model::pinboard_api::CHECK_REQUEST_ANNOTATION`]): a node's report
/// counts as ready only once its agent answered it, having asked its runtime after it saw the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskedCheck {
    pub request: String,
    pub at: SystemTime,
}

impl AskedCheck {
    /// Why set `set` on `node` is not ready though its report says pinned: its agent has not answered
    /// the check (`answer` is its last one); None when it has.
    fn unanswered(
        &self,
        node: &str,
        set: &str,
        answer: Option<&CheckAnswer>,
        now: SystemTime,
    ) -> Option<String> {
        if answer.is_some_and(|a| a.request == self.request) {
            return None;
        }
        let ago = |at: SystemTime| clock(now.duration_since(at).unwrap_or_default());
        let evidence = match answer {
            Some(last) => format!(
                "its last answer, {} ago, is no evidence of now",
                ago(SystemTime::from(last.at.0))
            ),
            None => "it has never answered one (an agent older than this pinboard answers none: \
                 upgrade the agents)"
                .to_string(),
        };
        Some(format!(
            "set {set:?}: the agent on node {node:?} has not answered this check, asked {} ago, by asking its \
             runtime; {evidence}",
            ago(self.at)
        ))
    }
}

/// How many nodes the wanted sets are judged on at `now` report a wanted set pinned without having
/// answered `asked`: those whose answer decides.
pub fn unanswered(
    view: &AgentsView,
    wanted: &[WantedSet],
    asked: &AskedCheck,
    now: SystemTime,
) -> usize {
    let mut waiting = std::collections::BTreeSet::new();
    for wanted in wanted {
        let name = &wanted.set.name;
        let set = SetOnAgents::new(view, wanted);
        let Some(generation) = set.generation else {
            continue;
        };
        for node in view.choose(set.selector.as_ref(), now).judged {
            let ready = view.node_with_set(&node.name, name, generation, now);
            let answered = view
                .report(&node.name)
                .and_then(|r| r.sets.iter().find(|s| s.name == *name))
                .and_then(|s| s.checked.as_ref())
                .is_some_and(|a| a.request == asked.request);
            if matches!(ready, NodeWithSet::Ready) && !answered {
                waiting.insert(node.name.as_str());
            }
        }
    }
    waiting.len()
}

/// The nodes the wanted sets are judged on at `now` whose agent is not alive though an agents' DaemonSet
/// should run one there, by name, with that DaemonSet: those whose pods may say why.
pub fn missing_agents(
    view: &AgentsView,
    wanted: &[WantedSet],
    now: SystemTime,
) -> Vec<(String, AgentDaemonSet)> {
    let mut missing = BTreeMap::new();
    for wanted in wanted {
        let selector = SetOnAgents::new(view, wanted).selector;
        for node in view.choose(selector.as_ref(), now).judged {
            if let Placement::DaemonSet(daemonset) = view.daemonsets.placement(node)
                && !view.live_agent(&node.name, now)
            {
                missing.insert(node.name.clone(), daemonset.clone());
            }
        }
    }
    missing.into_iter().collect()
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
    cluster_node: &ClusterNode,
    sets: &[SetOnAgents],
    now: SystemTime,
    pods: &AgentPods,
    asked: Option<&AskedCheck>,
) -> NodeReadiness {
    let node = cluster_node.name.as_str();
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
            NodeWithSet::Ready => {
                let on_node = report.and_then(|r| r.sets.iter().find(|s| s.name == *name));
                let answer = on_node.and_then(|s| s.checked.as_ref());
                reasons.extend(asked.and_then(|a| a.unanswered(node, name, answer, now)));
            }
            other => reasons.extend(set_reason(name, generation, other, report)),
        }
        on_node.push(set_on_node(name, Some(generation), observed, state, error));
    }
    let agent = view
        .agent_untrusted(node, now)
        .map(|untrusted| agent_untrusted(view, cluster_node, &untrusted, now, pods));
    if let Some((reason, _)) = &agent {
        reasons.insert(0, reason.clone());
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
        reasons.extend(unserved(&images));
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
        agent: agent.map(|(_, words)| words),
    }
}

/// Why `node`'s agent is not trusted (`untrusted`: [`NodeWithSet::NoAgent`] or [`NodeWithSet::Stale`]), in
/// a sentence with what `pods` says of its pod, and in a few words.
fn agent_untrusted(
    view: &AgentsView,
    node: &ClusterNode,
    untrusted: &NodeWithSet,
    now: SystemTime,
    pods: &AgentPods,
) -> (String, String) {
    let name = &node.name;
    let daemonset = match view.daemonsets.placement(node) {
        Placement::DaemonSet(daemonset) => Some(daemonset),
        _ => None,
    };
    let (mut reason, mut words) = match (untrusted, daemonset) {
        (NodeWithSet::Stale { seconds, valid_for }, _) => (
            format!(
                "the agent on node {name:?} is stale: {}; it stopped or cannot reach the API server, so \
                 what it last reported is not trusted",
                match *seconds {
                    u64::MAX => "it never renewed its heartbeat".to_string(),
                    s => format!(
                        "{} since its last heartbeat, which stood for {}",
                        clock(Duration::from_secs(s)),
                        clock(Duration::from_secs(*valid_for))
                    ),
                },
            ),
            "agent stale".to_string(),
        ),
        // No report.
        _ if view.live_agent(name, now) => (
            format!(
                "the agent on node {name:?} renews its heartbeat but has not written its report yet"
            ),
            "no report yet".to_string(),
        ),
        (_, Some(daemonset)) => (
            format!(
                "no agent yet on node {name:?}: DaemonSet {}/{} should run one there, and none has \
                 reported",
                daemonset.namespace, daemonset.name
            ),
            "no agent yet".to_string(),
        ),
        (_, None) => (
            format!(
                "no pinboard agent reports on node {name:?}, and no pinboard agent DaemonSet was found; \
                 start one there, or narrow the set's nodeSelector (docs/agents.md)"
            ),
            "no agent".to_string(),
        ),
    };
    if let Some(daemonset) = daemonset {
        let (clause, short) = pod_clause(daemonset, name, pods.get(name));
        reason.push_str(&format!("; {clause}"));
        if let Some(short) = short {
            words.push_str(&format!(" ({short})"));
        }
    }
    (reason, words)
}

/// What `looked` found of `daemonset`'s pod on `node`, in a clause, and the pod's state in a few words.
fn pod_clause(
    daemonset: &AgentDaemonSet,
    node: &str,
    looked: Option<&PodsOnNode>,
) -> (String, Option<String>) {
    match looked {
        Some(PodsOnNode::Found(pods)) if pods.is_empty() => {
            ("it has no pod there yet".into(), Some("no pod".into()))
        }
        Some(PodsOnNode::Found(pods)) => (
            pods.iter()
                .map(|p| p.words())
                .collect::<Vec<_>>()
                .join("; "),
            pods.first().map(|p| p.short()),
        ),
        Some(PodsOnNode::Unreadable(why)) => {
            (format!("its pod could not be looked up: {why}"), None)
        }
        None => (
            format!(
                "`kubectl -n {} get pods -o wide -l {AGENTS_DAEMONSET_LABEL} --field-selector \
                 spec.nodeName={node}` shows its pod",
                daemonset.namespace
            ),
            None,
        ),
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
        } if *observed >= generation => {
            format!("set {name:?}: queued by the node's agent (generation {generation})")
        }
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

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    use super::*;
    use crate::model::agent_daemonsets::AgentDaemonSets;
    use crate::model::agent_pods::AgentPod;
    use crate::model::agents_view::AgentsUpdate;
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
        let judged = assess_agents(&view(now), &wanted, now, &AgentPods::new(), None);
        assert!(
            judged.left_out.is_empty(),
            "a selector's every node, as before DaemonSets"
        );
        let nodes = judged.nodes;
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
    fn a_check_asked_counts_a_pinned_node_ready_only_once_its_agent_answered_it() {
        let now = SystemTime::now();
        let wanted = [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }];
        let mut view = view(now);
        let asked = AskedCheck {
            request: "2".into(),
            at: now - Duration::from_secs(3),
        };
        let n1 = |view: &AgentsView| {
            assess_agents(view, &wanted, now, &AgentPods::new(), Some(&asked)).nodes[0].clone()
        };
        // n1's report says pinned, but its last answer was to an earlier check, a minute ago.
        let pinned = view.report("n1").cloned().unwrap();
        let answered = |request: &str, ago: u64| {
            let mut report = pinned.clone();
            report.sets[0].checked = Some(CheckAnswer {
                request: request.into(),
                at: Time(
                    k8s_openapi::jiff::Timestamp::try_from(now - Duration::from_secs(ago)).unwrap(),
                ),
            });
            PinboardNode {
                metadata: ObjectMeta {
                    name: "n1".into(),
                    ..ObjectMeta::default()
                },
                spec: Default::default(),
                status: Some(report),
            }
        };
        view.apply(AgentsUpdate::Reports(vec![answered("1", 60).into()]));
        assert_eq!(unanswered(&view, &wanted, &asked, now), 1);
        let waiting = n1(&view);
        assert!(!waiting.ready);
        assert!(
            waiting.reasons[0]
                .contains("has not answered this check, asked 3s ago, by asking its runtime; ")
                && waiting.reasons[0].contains("its last answer, 1m00s ago")
                && !waiting.reasons[0].contains("  "),
            "{:?}",
            waiting.reasons
        );
        view.apply(AgentsUpdate::Reports(vec![answered("2", 1).into()]));
        assert_eq!(unanswered(&view, &wanted, &asked, now), 0);
        assert!(n1(&view).ready, "{:?}", n1(&view).reasons);
    }

    #[test]
    fn without_an_agents_daemonset_a_set_without_selector_counts_the_nodes_with_an_agent_and_says_so()
     {
        let now = SystemTime::now();
        let mut view = view(now);
        view.sets[0].spec.node_selector = None;
        view.apply(AgentsUpdate::DaemonSets(AgentDaemonSets {
            namespace: "pins".into(),
            listed: Vec::new(),
        }));
        let judged = assess_agents(&view, &wanted(), now, &AgentPods::new(), None);
        let names: Vec<&str> = judged.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["n1", "n2"], "n3 never had an agent");
        assert_eq!(
            judged.left_out,
            [LeftOut {
                reason:
                    "no agent has reported there, and no pinboard agent DaemonSet says one should"
                        .into(),
                count: 1,
                nodes: vec!["n3".into()],
            }]
        );
        assert!(
            judged.warnings[0].starts_with(
                "no pinboard agent DaemonSet in namespace \"pins\" (label \
                 app.kubernetes.io/name=pinboard-agent): judged only the nodes whose agent has reported"
            ),
            "{:?}",
            judged.warnings
        );
        assert!(missing_agents(&view, &wanted(), now).is_empty());
    }

    fn wanted() -> [WantedSet; 1] {
        [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }]
    }

    const POD_LABEL: &str = "pinboard.dev/agent-pod";

    /// The lab's layout: the DaemonSet runs on the nodes labelled for it (n1-n4, n8), agents run by hand
    /// elsewhere. n1 is pinned; n2-n4 have no agent yet; n5's agent runs by hand and pinned; n6 never had
    /// an agent; n7's agent, run by hand, went stale; n8's agent, of the DaemonSet, went stale.
    fn daemonset_view(now: SystemTime) -> AgentsView {
        let mut view = view(now);
        view.sets[0].spec.node_selector = None;
        let labelled = |name: &str| ClusterNode {
            labels: [(POD_LABEL.to_string(), "true".to_string())].into(),
            ..node(name)
        };
        let nodes = vec![
            labelled("n1"),
            labelled("n2"),
            labelled("n3"),
            labelled("n4"),
            node("n5"),
            node("n6"),
            node("n7"),
            labelled("n8"),
        ];
        view.apply(AgentsUpdate::Nodes(nodes));
        let n1 = Arc::clone(&view.reports["n1"]);
        let renamed = |name: &str| {
            let mut report = PinboardNode::clone(&n1);
            report.metadata.name = name.into();
            Arc::new(report)
        };
        view.apply(AgentsUpdate::Reports(vec![
            n1.clone(),
            renamed("n5"),
            renamed("n7"),
            renamed("n8"),
        ]));
        let beat = |ago: u64| Heartbeat {
            renewed: now - Duration::from_secs(ago),
            valid_for: Duration::from_secs(120),
        };
        view.apply(AgentsUpdate::Heartbeats(
            [("n1", 5), ("n5", 5), ("n7", 600), ("n8", 600)]
                .map(|(n, ago)| (n.to_string(), beat(ago)))
                .into(),
        ));
        view.apply(AgentsUpdate::DaemonSets(AgentDaemonSets {
            namespace: "pinboard-system".into(),
            listed: vec![AgentDaemonSet {
                name: "pinboard-agent-containerd".into(),
                namespace: "pinboard-system".into(),
                node_selector: [(POD_LABEL.to_string(), "true".to_string())].into(),
                ..AgentDaemonSet::default()
            }],
        }));
        view
    }

    fn agent_pod(name: &str, node: &str) -> AgentPod {
        AgentPod {
            name: name.into(),
            node: Some(node.into()),
            phase: "Pending".into(),
            ..AgentPod::default()
        }
    }

    #[test]
    fn a_node_the_daemonset_should_run_on_without_an_agent_is_not_ready_with_its_pods_state() {
        let now = SystemTime::now();
        let view = daemonset_view(now);
        let pods: AgentPods = [
            (
                "n3".to_string(),
                PodsOnNode::Found(vec![AgentPod {
                    waiting: Some("ImagePullBackOff: Back-off pulling image \"agent:1\"".into()),
                    ..agent_pod("pinboard-agent-containerd-n3pod", "n3")
                }]),
            ),
            (
                "n4".to_string(),
                PodsOnNode::Found(vec![AgentPod {
                    phase: "Running".into(),
                    waiting: Some("CrashLoopBackOff: back-off 2m40s".into()),
                    restarts: 5,
                    last_ended: Some("Error, exit code 2".into()),
                    ..agent_pod("pinboard-agent-containerd-n4pod", "n4")
                }]),
            ),
            ("n8".to_string(), PodsOnNode::Found(Vec::new())),
        ]
        .into();
        let judged = assess_agents(&view, &wanted(), now, &pods, None);
        let names: Vec<&str> = judged.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["n1", "n2", "n3", "n4", "n5", "n8"]);
        let node = |name: &str| judged.nodes.iter().find(|n| n.node == name).unwrap();
        assert!(node("n1").ready && node("n5").ready, "{judged:?}");
        assert!(!judged.ready);
        // n2: no agent, its pod not looked up: how to see it.
        let n2 = node("n2");
        assert!(!n2.ready);
        assert_eq!(
            n2.reasons[0],
            "no agent yet on node \"n2\": DaemonSet pinboard-system/pinboard-agent-containerd should run \
             one there, and none has reported; `kubectl -n pinboard-system get pods -o wide -l \
             app.kubernetes.io/name=pinboard-agent --field-selector spec.nodeName=n2` shows its pod"
        );
        assert_eq!(n2.summary(), "no agent yet");
        assert_eq!(n2.images[0].reason, Some(ImageReason::Unknown));
        // n3 and n4: the pod's state, said.
        let n3 = node("n3");
        assert!(
            n3.reasons[0].ends_with(
                "none has reported; its pod pinboard-agent-containerd-n3pod is Pending, its agent \
                 waiting: ImagePullBackOff: Back-off pulling image \"agent:1\""
            ),
            "{:?}",
            n3.reasons
        );
        assert_eq!(n3.summary(), "no agent yet (pod ImagePullBackOff)");
        let n4 = node("n4");
        assert!(
            n4.reasons[0].contains("CrashLoopBackOff: back-off 2m40s (5 restarts, the last run ended: Error, exit code 2)"),
            "{:?}",
            n4.reasons
        );
        assert_eq!(n4.summary(), "no agent yet (pod CrashLoopBackOff)");
        // n8: its DaemonSet's agent went stale, and has no pod there now.
        let n8 = node("n8");
        assert!(
            n8.reasons[0]
                .starts_with("the agent on node \"n8\" is stale: 10m00s since its last heartbeat")
                && n8.reasons[0].ends_with("; it has no pod there yet"),
            "{:?}",
            n8.reasons
        );
        assert_eq!(n8.summary(), "agent stale (no pod)");
        // n6 and n7: left out, counted, with why; n7's stale report holds nothing back.
        let excluded = "no pinboard agent DaemonSet runs there (pinboard-agent-containerd: nodeSelector \
                        pinboard.dev/agent-pod=true)";
        assert_eq!(
            judged.left_out,
            [
                LeftOut {
                    reason: excluded.into(),
                    count: 1,
                    nodes: vec!["n6".into()],
                },
                LeftOut {
                    reason: format!("{excluded}, and the agent that ran there is stale"),
                    count: 1,
                    nodes: vec!["n7".into()],
                },
            ]
        );
        assert!(judged.warnings.is_empty());
        assert_eq!(
            judged.progress_line(),
            "2/6 nodes ready (2 left out); n2: no agent yet; n3: no agent yet (pod ImagePullBackOff); n4: \
             no agent yet (pod CrashLoopBackOff); n8: agent stale (no pod)"
        );
        let json = serde_json::to_value(&judged).unwrap();
        assert_eq!(json["leftOut"][0]["count"], 1);
        assert_eq!(json["leftOut"][0]["nodes"][0], "n6");
        assert_eq!(json["nodes"][1]["agent"], "no agent yet");
        // The pods worth looking up: the DaemonSet's nodes without a live agent.
        let missing: Vec<String> = missing_agents(&view, &wanted(), now)
            .into_iter()
            .map(|(node, daemonset)| format!("{node} {}", daemonset.name))
            .collect();
        assert_eq!(
            missing,
            [
                "n2 pinboard-agent-containerd",
                "n3 pinboard-agent-containerd",
                "n4 pinboard-agent-containerd",
                "n8 pinboard-agent-containerd"
            ]
        );
        // The aggregating agent counts the same nodes.
        let status = view.summary(&view.sets[0], now);
        assert_eq!((status.nodes, status.ready), (6, 2));
    }

    #[test]
    fn five_thousand_nodes_left_out_are_a_count_and_five_names() {
        let now = SystemTime::now();
        let mut view = daemonset_view(now);
        let mut nodes = view.nodes.clone();
        nodes.extend((0..5000).map(|i| node(&format!("w{i:04}"))));
        view.apply(AgentsUpdate::Nodes(nodes));
        let judged = assess_agents(&view, &wanted(), now, &AgentPods::new(), None);
        let excluded = &judged.left_out[0];
        assert_eq!(excluded.count, 5001, "n6 and the 5,000");
        assert_eq!(excluded.nodes, ["n6", "w0000", "w0001", "w0002", "w0003"]);
        assert!(
            excluded
                .line()
                .starts_with("5001 nodes left out: no pinboard agent DaemonSet runs there")
                && excluded
                    .line()
                    .ends_with(": n6, w0000, w0001, w0002, w0003 and 4996 more"),
            "{}",
            excluded.line()
        );
        let json = serde_json::to_string(&judged.left_out).unwrap();
        assert!(json.len() < 1024, "{} bytes", json.len());
    }

    #[test]
    fn pods_that_cannot_be_read_are_said_so_and_the_node_is_judged_the_same() {
        let now = SystemTime::now();
        let view = daemonset_view(now);
        let why = "your account may not list pods in namespace \"pinboard-system\": bind the Role \
                   pinboard-agents-viewer-pods there to it (docs/agents.md)";
        let pods: AgentPods = [("n2".to_string(), PodsOnNode::Unreadable(why.into()))].into();
        let judged = assess_agents(&view, &wanted(), now, &pods, None);
        let n2 = judged.nodes.iter().find(|n| n.node == "n2").unwrap();
        assert!(!n2.ready);
        assert!(
            n2.reasons[0].ends_with(&format!(
                "none has reported; its pod could not be looked up: {why}"
            )),
            "{:?}",
            n2.reasons
        );
        assert_eq!(n2.summary(), "no agent yet");
    }

    #[test]
    fn a_selector_narrows_the_choice_and_the_daemonset_still_decides_within_it() {
        let now = SystemTime::now();
        let mut view = daemonset_view(now);
        // Selects n2 (the DaemonSet's, no agent) and n6 (no DaemonSet, no agent) by their names.
        view.sets[0].spec.node_selector = Some(LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "kubernetes.io/hostname".into(),
                    operator: "In".into(),
                    values: Some(vec!["n2".into(), "n6".into()]),
                },
            ]),
            match_labels: None,
        });
        let nodes: Vec<ClusterNode> = view
            .nodes
            .iter()
            .map(|n| {
                let mut n = n.clone();
                n.labels
                    .insert("kubernetes.io/hostname".into(), n.name.clone());
                n
            })
            .collect();
        view.apply(AgentsUpdate::Nodes(nodes));
        let judged = assess_agents(&view, &wanted(), now, &AgentPods::new(), None);
        assert_eq!(judged.nodes.len(), 1);
        assert_eq!(judged.nodes[0].node, "n2");
        assert_eq!(judged.left_out[0].nodes, ["n6"]);
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
        let n1 = &assess_agents(&view, &wanted, now, &AgentPods::new(), None).nodes[0];
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
        let n1 = &assess_agents(&view, &wanted, now, &AgentPods::new(), None).nodes[0];
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
            report.images[0].lazy = crate::model::lazy::RemoteLayers::of(&[false, true, true]);
        }
        let wanted = [WantedSet {
            set: from_flags("web", &[IMAGE.to_string()]),
            min_generation: 0,
        }];
        let judged = assess_agents(&view, &wanted, now, &AgentPods::new(), None).nodes;
        let n1 = judged.iter().find(|n| n.node == "n1").unwrap();
        assert!(!n1.ready);
        assert_eq!(n1.images[0].reason, Some(ImageReason::Lazy));
        assert!(
            n1.reasons
                .iter()
                .any(|r| r.contains("1 image present only lazily")
                    && r.contains("`pinboard apply` makes them whole")),
            "{:?}",
            n1.reasons
        );
    }
}

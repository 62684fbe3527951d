//! What is known about a node for the Nodes screen: its runtime, space, images and pins, as the backends
//! found them (a node's runtime in direct mode, its Node object in cluster mode, its agent's report on
//! agents, or that its agent is awaited).

use std::collections::HashMap;
use std::time::SystemTime;

use super::agent_daemonsets::Placement;
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
/// unreachable, with its last figures; and each node an agents' DaemonSet should run on whose agent has not
/// reported yet, unreachable, so the gap shows.
pub fn of_agents(view: &AgentsView, now: SystemTime) -> Vec<NodeSummary> {
    let reported = view
        .reports
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
        });
    let awaited = view
        .nodes
        .iter()
        .filter(|node| view.report(&node.name).is_none())
        .filter_map(|node| match view.daemonsets.placement(node) {
            Placement::DaemonSet(daemonset) => Some(NodeSummary {
                name: node.name.clone(),
                reachable: Some(false),
                warning: Some(format!(
                    "no agent yet: DaemonSet {} should run one here",
                    daemonset.name
                )),
                ..NodeSummary::default()
            }),
            _ => None,
        });
    let mut summaries: Vec<NodeSummary> = reported.chain(awaited).collect();
    summaries.sort_by(|a, b| a.name.cmp(&b.name));
    summaries
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::agent_daemonsets::{AgentDaemonSet, AgentDaemonSets};
    use crate::model::agents_view::AgentsUpdate;
    use crate::model::machine_config::ClusterNode;
    use crate::model::pinboard_api::{NodeReport, PinboardNode};

    #[test]
    fn the_nodes_screen_on_agents_shows_a_node_its_daemonset_should_run_on_before_its_agent_reports()
     {
        let node = |name: &str, labelled: bool| ClusterNode {
            name: name.into(),
            labels: match labelled {
                true => [("pool".to_string(), "pins".to_string())].into(),
                false => Default::default(),
            },
            ..ClusterNode::default()
        };
        let mut view = AgentsView::default();
        view.apply(AgentsUpdate::Nodes(vec![
            node("n1", true),
            node("n2", true),
            node("n3", false),
        ]));
        let mut report = PinboardNode::default();
        report.metadata.name = "n1".into();
        report.status = Some(NodeReport::default());
        view.apply(AgentsUpdate::Reports(vec![report.into()]));
        let names = |view: &AgentsView| -> Vec<String> {
            of_agents(view, SystemTime::now())
                .into_iter()
                .map(|n| n.name)
                .collect()
        };
        assert_eq!(names(&view), ["n1"], "without a DaemonSet: the reports");
        view.apply(AgentsUpdate::DaemonSets(AgentDaemonSets {
            namespace: "pinboard-system".into(),
            listed: vec![AgentDaemonSet {
                name: "pinboard-agent-containerd".into(),
                node_selector: [("pool".to_string(), "pins".to_string())].into(),
                ..AgentDaemonSet::default()
            }],
        }));
        let shown = of_agents(&view, SystemTime::now());
        assert_eq!(shown.len(), 2, "n3 is none of the agents' business");
        assert_eq!(shown[1].name, "n2");
        assert_eq!(shown[1].reachable, Some(false));
        assert_eq!(
            shown[1].warning.as_deref(),
            Some("no agent yet: DaemonSet pinboard-agent-containerd should run one here")
        );
    }
}

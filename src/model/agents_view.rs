//! A cluster of pinboard's agents as the commands, the TUI and the aggregating agent follow it: the sets,
//! each node's report, the Nodes (for their labels and taints), each agent's last heartbeat and the agents'
//! DaemonSets, kept current by the watches' updates. Pure: which nodes a set is judged on (and which it
//! leaves out, and why), whether a node is ready for it and why not, and a set's summary come from here.
//!
//! The nodes a set is judged on are those it selects (by its `nodeSelector`; without one, every node) that
//! an agents' DaemonSet should run on ([`super::agent_daemonsets`]), or whose agent is alive (a fresh
//! heartbeat) though no DaemonSet runs there: an agent run by hand. A node the DaemonSets leave out whose
//! agent is gone or never was is left out, named with why, so a stale leftover report does not hold a set
//! back for ever. Without any agents' DaemonSet, the rule before them stands: a set's selector's nodes, and
//! without a selector every node with an agent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::agent_daemonsets::{AgentDaemonSets, Placement};
use super::labels::selector_matches;
use super::machine_config::{ClusterNode, Connection};
use super::pinboard_api::{
    Heartbeat, NodeReport, NodeSetPhase, PinSet, PinSetStatus, PinboardNode, PinboardNodeImages,
};
use super::pinboard_kinds::{IMAGES_KIND, NODE_KIND, SET_KIND};
use super::rollout::FanOutNodes;

/// The kinds a view of the whole cluster watches: each must have listed before the view is whole.
pub const WATCHED_KINDS: [&str; 5] = [SET_KIND, NODE_KIND, "Node", "Lease", "DaemonSet"];

/// What the watches have said so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentsView {
    pub sets: Vec<PinSet>,
    /// Each node's report, with its image lists once the reports' detail is watched too (see
    /// [`AgentsView::images_synced`]); without, the very objects the watch shares.
    pub reports: BTreeMap<String, Arc<PinboardNode>>,
    /// The reports as watched, and their detail, by node: what `reports` is made of.
    watched: BTreeMap<String, Arc<PinboardNode>>,
    images: BTreeMap<String, Arc<PinboardNodeImages>>,
    /// What each merged report in `reports` was made of.
    merged_from: BTreeMap<String, (Arc<PinboardNode>, Arc<PinboardNodeImages>)>,
    pub nodes: Vec<ClusterNode>,
    /// Each node's agent's last heartbeat.
    pub heartbeats: BTreeMap<String, Heartbeat>,
    /// Where the agents should run.
    pub daemonsets: AgentDaemonSets,
    pub connections: BTreeMap<&'static str, Connection>,
}

/// The nodes a set selects, split: those it is judged on, and those left out with why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeChoice<'a> {
    pub judged: Vec<&'a ClusterNode>,
    /// Node and why, by name.
    pub left_out: Vec<(&'a str, String)>,
}

/// Where a node is with a set, as readiness sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeWithSet {
    /// Every image pinned at the set's generation, the agent's heartbeat fresh.
    Ready,
    /// No agent has ever reported on the node.
    NoAgent,
    /// Its agent's heartbeat lapsed: how old it is and how long it stood, in seconds (no heartbeat at
    /// all: `u64::MAX` old).
    Stale {
        seconds: u64,
        valid_for: u64,
    },
    /// The agent has not reached this generation yet.
    Waiting {
        observed: Option<i64>,
    },
    Pulling,
    Failed {
        reason: String,
    },
    /// It was pinned, then an image or pin was lost: the agent puts it back. `reason` names the images and
    /// what was found, and how often it recurs.
    Restoring {
        reason: String,
    },
}

impl AgentsView {
    pub fn set(&self, name: &str) -> Option<&PinSet> {
        self.sets.iter().find(|s| s.name() == name)
    }

    /// Every watch has listed once, and none is failing now (a watch that has not said a word yet counts
    /// as not listed: its task may start after another's list is in).
    pub fn synced(&self) -> bool {
        WATCHED_KINDS
            .iter()
            .all(|kind| self.connections.get(kind) == Some(&Connection::Synced))
    }

    /// The reports' detail (every node's images) has been listed, and its watch is not failing now.
    pub fn images_synced(&self) -> bool {
        self.connections.get(IMAGES_KIND) == Some(&Connection::Synced)
    }

    /// The nodes a set with `selector` is judged on at `now`, and those it selects but leaves out (see the
    /// module's doc).
    pub fn choose(&self, selector: Option<&LabelSelector>, now: SystemTime) -> NodeChoice<'_> {
        let mut choice = NodeChoice::default();
        let selected = self
            .nodes
            .iter()
            .filter(|n| selector.is_none_or(|s| selector_matches(Some(s), &n.labels)));
        for node in selected {
            match self.left_out_because(node, selector.is_some(), now) {
                None => choice.judged.push(node),
                Some(why) => choice.left_out.push((&node.name, why)),
            }
        }
        choice
    }

    /// Why `node`, which a set selects (`by_selector`: through its selector), is not judged; None when it
    /// is.
    fn left_out_because(
        &self,
        node: &ClusterNode,
        by_selector: bool,
        now: SystemTime,
    ) -> Option<String> {
        let has_agent = self.has_agent(&node.name);
        match self.daemonsets.placement(node) {
            Placement::DaemonSet(_) => None,
            _ if self.live_agent(&node.name, now) => None,
            Placement::Excluded(why) if has_agent => Some(format!(
                "no pinboard agent DaemonSet runs there ({why}), and the agent that ran there is stale"
            )),
            Placement::Excluded(why) => {
                Some(format!("no pinboard agent DaemonSet runs there ({why})"))
            }
            Placement::NoDaemonSet if by_selector || has_agent => None,
            Placement::NoDaemonSet => Some(
                "no agent has reported there, and no pinboard agent DaemonSet says one should"
                    .into(),
            ),
        }
    }

    /// Whether `node` ever had an agent: one that reported or renewed its heartbeat.
    fn has_agent(&self, node: &str) -> bool {
        self.reports.contains_key(node) || self.heartbeats.contains_key(node)
    }

    /// Whether `node`'s agent's heartbeat is fresh at `now`.
    pub fn live_agent(&self, node: &str, now: SystemTime) -> bool {
        self.heartbeats.get(node).is_some_and(|b| !b.stale(now))
    }

    /// The nodes whose agent ever reported or renewed its heartbeat: those an agent can be asked through.
    pub fn nodes_with_agent(&self) -> Vec<&ClusterNode> {
        self.nodes
            .iter()
            .filter(|n| self.has_agent(&n.name))
            .collect()
    }

    /// A node's report, when its agent wrote one.
    pub fn report(&self, node: &str) -> Option<&NodeReport> {
        self.reports.get(node)?.status.as_ref()
    }

    /// Where `node` is with generation `generation` of set `name`, at `now`.
    pub fn node_with_set(
        &self,
        node: &str,
        name: &str,
        generation: i64,
        now: SystemTime,
    ) -> NodeWithSet {
        if let Some(untrusted) = self.agent_untrusted(node, now) {
            return untrusted;
        }
        let Some(on_node) = self
            .report(node)
            .and_then(|r| r.sets.iter().find(|s| s.name == name))
        else {
            return NodeWithSet::Waiting { observed: None };
        };
        if on_node.observed_generation < generation {
            return NodeWithSet::Waiting {
                observed: Some(on_node.observed_generation),
            };
        }
        match on_node.state {
            NodeSetPhase::Pinned => NodeWithSet::Ready,
            NodeSetPhase::Queued => NodeWithSet::Waiting {
                observed: Some(on_node.observed_generation),
            },
            NodeSetPhase::Pulling => NodeWithSet::Pulling,
            NodeSetPhase::Failed => NodeWithSet::Failed {
                reason: condition_message(on_node, super::pinboard_api::DEGRADED)
                    .unwrap_or_else(|| "failed".into()),
            },
            NodeSetPhase::Restoring => NodeWithSet::Restoring {
                // Degraded says the loss recurs and when it is put back; Progressing names the images.
                reason: condition_message(on_node, super::pinboard_api::DEGRADED)
                    .or_else(|| condition_message(on_node, super::pinboard_api::PROGRESSING))
                    .unwrap_or_else(|| "an image or pin was lost".into()),
            },
        }
    }

    /// Why `node`'s report cannot be trusted at `now` ([`NodeWithSet::NoAgent`] or
    /// [`NodeWithSet::Stale`]); None when its agent reported and its heartbeat is fresh.
    pub fn agent_untrusted(&self, node: &str, now: SystemTime) -> Option<NodeWithSet> {
        if self.report(node).is_none() {
            return Some(NodeWithSet::NoAgent);
        }
        match self.heartbeats.get(node) {
            Some(beat) if !beat.stale(now) => None,
            Some(beat) => Some(NodeWithSet::Stale {
                seconds: now
                    .duration_since(beat.renewed)
                    .unwrap_or_default()
                    .as_secs(),
                valid_for: beat.valid_for.as_secs(),
            }),
            None => Some(NodeWithSet::Stale {
                seconds: u64::MAX,
                valid_for: 0,
            }),
        }
    }

    /// Bytes the in-cluster cache took from the registries, as its holders report them (summed: a new
    /// holder counts from zero, and the last figure of one that went stands).
    pub fn cache_link_bytes(&self) -> u64 {
        self.cache_bytes().0
    }

    /// Whether a holder of the in-cluster cache reported figures read after check `request` was asked.
    pub fn cache_answered(&self, request: &str) -> bool {
        self.reports.values().any(|r| {
            r.status
                .as_ref()
                .and_then(|s| s.cache.as_ref())
                .is_some_and(|c| c.answered.iter().any(|a| a == request))
        })
    }

    /// The registry link's budget the in-cluster cache keeps (`--link-rate`), as a holder reports it.
    pub fn cache_link_rate(&self) -> Option<u64> {
        self.reports
            .values()
            .filter_map(|r| r.status.as_ref()?.cache.as_ref()?.link_rate)
            .max()
    }

    /// Bytes the in-cluster cache took from the registries and served to the nodes, summed over its
    /// holders as [`Self::cache_link_bytes`].
    pub fn cache_bytes(&self) -> (u64, u64) {
        self.reports
            .values()
            .filter_map(|r| r.status.as_ref()?.cache.as_ref())
            .fold((0, 0), |(link, served), c| {
                (link + c.link_bytes, served + c.served_bytes)
            })
    }

    /// The nodes whose agent pulled set `name` from the source rather than through the cache, and those
    /// that pulled through it but sent some pulls to the source while it was away.
    pub fn pulled_from_source(&self, name: &str) -> FanOutNodes {
        let mut nodes = FanOutNodes {
            link_rate: self.cache_link_rate(),
            ..FanOutNodes::default()
        };
        for (node, report) in &self.reports {
            let fan_out = report
                .status
                .as_ref()
                .and_then(|s| s.sets.iter().find(|set| set.name == name))
                .and_then(|set| set.fan_out.as_ref());
            match fan_out {
                Some(f) if f.cache.is_none() => nodes.direct.push(node.clone()),
                Some(f) if f.source_reason.is_some() => nodes.partly.push(node.clone()),
                _ => {}
            }
        }
        nodes
    }

    /// A set's summary over the nodes it lands on, at `now`.
    pub fn summary(&self, set: &PinSet, now: SystemTime) -> PinSetStatus {
        let mut status = PinSetStatus {
            observed_generation: set.generation(),
            ..PinSetStatus::default()
        };
        for node in self.choose(set.spec.node_selector.as_ref(), now).judged {
            status.nodes += 1;
            match self.node_with_set(&node.name, set.name(), set.generation(), now) {
                NodeWithSet::Ready => status.ready += 1,
                NodeWithSet::Pulling => status.pulling += 1,
                NodeWithSet::Failed { .. } => status.failed += 1,
                NodeWithSet::Restoring { .. } => status.restoring += 1,
                _ => {}
            }
        }
        status
    }
}

/// The message of `report`'s condition `kind` when it is true.
fn condition_message(report: &super::pinboard_api::SetReport, kind: &str) -> Option<String> {
    report
        .conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
        .map(|c| c.message.clone())
}

/// One change from the watches.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentsUpdate {
    Sets(Vec<PinSet>),
    Reports(Vec<Arc<PinboardNode>>),
    /// The reports' detail.
    Images(Vec<Arc<PinboardNodeImages>>),
    Nodes(Vec<ClusterNode>),
    /// Each node's agent's last heartbeat, by node.
    Heartbeats(BTreeMap<String, Heartbeat>),
    DaemonSets(AgentDaemonSets),
    Connection(&'static str, Connection),
}

impl AgentsView {
    pub fn apply(&mut self, update: AgentsUpdate) {
        match update {
            AgentsUpdate::Sets(sets) => self.sets = sets,
            AgentsUpdate::Reports(reports) => {
                self.watched = reports
                    .into_iter()
                    .map(|r| (r.metadata.name.clone(), r))
                    .collect();
                self.merge();
            }
            AgentsUpdate::Images(images) => {
                self.images = images
                    .into_iter()
                    .map(|i| (i.metadata.name.clone(), i))
                    .collect();
                self.merge();
            }
            AgentsUpdate::Nodes(nodes) => self.nodes = nodes,
            AgentsUpdate::Heartbeats(heartbeats) => self.heartbeats = heartbeats,
            AgentsUpdate::DaemonSets(daemonsets) => self.daemonsets = daemonsets,
            AgentsUpdate::Connection(kind, state) => {
                self.connections.insert(kind, state);
            }
        }
    }

    /// Makes `reports` of the watched reports and their detail: a report whose object and detail are the
    /// ones merged before keeps its merged copy (a change to one of thousands of nodes merges one).
    fn merge(&mut self) {
        let mut reports = BTreeMap::new();
        let mut merged_from = BTreeMap::new();
        for (name, watched) in &self.watched {
            let Some(images) = self.images.get(name).filter(|i| i.status.is_some()) else {
                reports.insert(name.clone(), Arc::clone(watched));
                continue;
            };
            let unchanged = self
                .merged_from
                .get(name)
                .is_some_and(|(w, i)| Arc::ptr_eq(w, watched) && Arc::ptr_eq(i, images));
            let report = match (unchanged, self.reports.get(name)) {
                (true, Some(before)) => Arc::clone(before),
                _ => Arc::new(PinboardNode {
                    status: watched
                        .status
                        .as_ref()
                        .map(|s| s.with_images(images.status.as_ref().expect("filtered"))),
                    ..PinboardNode::clone(watched)
                }),
            };
            merged_from.insert(name.clone(), (Arc::clone(watched), Arc::clone(images)));
            reports.insert(name.clone(), report);
        }
        self.reports = reports;
        self.merged_from = merged_from;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_is_whole_only_once_every_watched_kind_has_listed() {
        let mut view = AgentsView::default();
        assert!(!view.synced());
        // The sets' watch listed before the others' tasks said a word: not whole, no node judged yet.
        view.apply(AgentsUpdate::Connection(SET_KIND, Connection::Synced));
        assert!(!view.synced());
        for kind in &WATCHED_KINDS[1..] {
            view.apply(AgentsUpdate::Connection(kind, Connection::Synced));
        }
        assert!(view.synced());
        view.apply(AgentsUpdate::Connection("Lease", Connection::Connecting));
        assert!(!view.synced());
    }

    fn report(node: &str, free: u64) -> Arc<PinboardNode> {
        let mut report = PinboardNode::default();
        report.metadata.name = node.into();
        report.status = Some(NodeReport {
            image_filesystem: Some(super::super::pinboard_api::FilesystemReport {
                available_bytes: free,
                ..Default::default()
            }),
            ..NodeReport::default()
        });
        Arc::new(report)
    }

    fn images(node: &str, image: &str) -> Arc<PinboardNodeImages> {
        let mut detail = PinboardNodeImages::default();
        detail.metadata.name = node.into();
        detail.status = Some(super::super::pinboard_api::NodeImages {
            images: vec![super::super::pinboard_api::ImageReport {
                names: vec![image.into()],
                ..Default::default()
            }],
            sets: Vec::new(),
        });
        Arc::new(detail)
    }

    #[test]
    fn reports_get_their_images_once_watched_and_a_change_remakes_only_its_node() {
        let mut view = AgentsView::default();
        let (n1, n2) = (report("n1", 1), report("n2", 2));
        view.apply(AgentsUpdate::Reports(vec![n1.clone(), n2.clone()]));
        // Without the detail, the very objects the watch shares, without images.
        assert!(Arc::ptr_eq(&view.reports["n1"], &n1));
        assert!(view.report("n1").unwrap().images.is_empty());
        view.apply(AgentsUpdate::Images(vec![
            images("n1", "a@sha256:1"),
            images("n2", "b@sha256:2"),
        ]));
        assert_eq!(view.report("n1").unwrap().images[0].names, ["a@sha256:1"]);
        assert_eq!(view.report("n2").unwrap().images[0].names, ["b@sha256:2"]);
        let merged_n2 = Arc::clone(&view.reports["n2"]);
        // n1's report changes: n1 is merged again, n2 keeps its merged copy.
        let n1_again = report("n1", 10);
        view.apply(AgentsUpdate::Reports(vec![n1_again, n2]));
        assert_eq!(
            view.report("n1")
                .unwrap()
                .image_filesystem
                .as_ref()
                .unwrap()
                .available_bytes,
            10
        );
        assert_eq!(view.report("n1").unwrap().images[0].names, ["a@sha256:1"]);
        assert!(Arc::ptr_eq(&view.reports["n2"], &merged_n2));
    }
}

//! What the cluster tells about a node's room for images, for the planner: the image filesystem from the
//! kubelet's summary through the API server's node proxy (`/api/v1/nodes/NAME/proxy/stats/summary`,
//! `node.runtime.imageFs`) when RBAC allows (`get nodes/proxy`) and the kubelet answers; otherwise the
//! Node's `ephemeral-storage` capacity and allocatable, labelled as such (what the OpenShift daemon checks).
//! Presence of images comes from `Node.status.images`; when that list is full, a missing image is unknown.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use serde::Deserialize;

use super::Cluster;
use crate::backend::node::NodeObservation;
use crate::model::cluster::{NodeView, Presence};
use crate::model::plan::{NodeFacts, SpaceSource};

/// Summaries asked at once.
const CONCURRENCY: usize = 32;
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(5);

/// The part of the kubelet's `/stats/summary` pinboard reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Summary {
    node: SummaryNode,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SummaryNode {
    runtime: Option<RuntimeStats>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RuntimeStats {
    image_fs: Option<FsStats>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct FsStats {
    available_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
    used_bytes: Option<u64>,
}

impl Cluster {
    /// The image filesystem of `node` from its kubelet's summary; Err says why not (403, no kubelet...).
    async fn image_fs(&self, node: &str) -> Result<FsStats, String> {
        let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary"))
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let summary =
            tokio::time::timeout(SUMMARY_TIMEOUT, self.client.request::<Summary>(request))
                .await
                .map_err(|_| format!("no answer within {SUMMARY_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
        summary
            .node
            .runtime
            .and_then(|r| r.image_fs)
            .ok_or_else(|| "the summary has no node.runtime.imageFs".into())
    }

    /// Each node observed for the planner, with the references it must hold, in the order given.
    pub async fn observe(&self, nodes: &[(&NodeView, Vec<String>)]) -> Vec<NodeObservation> {
        // Owned names: a stream of futures borrowing `nodes` is not Send-general enough for tokio::spawn.
        let names: Vec<String> = nodes.iter().map(|(node, _)| node.name.clone()).collect();
        let summaries: Vec<Option<FsStats>> = futures::stream::iter(names)
            .map(|name| {
                let cluster = self.clone();
                async move {
                    let summary = cluster.image_fs(&name).await;
                    if let Err(why) = &summary {
                        tracing::debug!("{name}: kubelet summary unavailable: {why}");
                    }
                    summary.ok()
                }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        nodes
            .iter()
            .zip(summaries)
            .map(|((node, references), summary)| observation(node, references, summary))
            .collect()
    }
}

/// `node`'s facts and the presence of `references`, with the space figures of `image_fs` when there is one.
fn observation(
    node: &NodeView,
    references: &[String],
    image_fs: Option<FsStats>,
) -> NodeObservation {
    let mut facts = NodeFacts {
        name: node.name.clone(),
        runtime: node.runtime.clone(),
        ..NodeFacts::default()
    };
    match image_fs {
        Some(fs) => {
            facts.capacity_bytes = fs.capacity_bytes;
            facts.available_bytes = fs.available_bytes;
            facts.used_bytes = fs.used_bytes;
            facts.space_source = Some(SpaceSource::KubeletSummary);
        }
        None => {
            facts.capacity_bytes = node.capacity_ephemeral;
            facts.available_bytes = node.allocatable_ephemeral;
            facts.space_source = Some(SpaceSource::AllocatableEphemeralStorage);
            if node.allocatable_ephemeral.is_none() {
                facts.space_unknown_reason = Some(
                    "the kubelet summary is unavailable and the Node reports no ephemeral-storage"
                        .into(),
                );
            }
        }
    }
    let presence = references
        .iter()
        .map(|r| {
            let known = match node.presence(r) {
                Presence::Present => Some(true),
                Presence::Absent => Some(false),
                Presence::Unknown => None,
            };
            (r.clone(), known)
        })
        .collect::<HashMap<_, _>>();
    NodeObservation { facts, presence }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cluster::NODE_IMAGES_LIMIT;

    #[test]
    fn kubelet_summary_wire_format_is_read() {
        // As the kubelet serves it (trimmed): stats/v1alpha1 Summary.
        let text = r#"{"node": {"nodeName": "n1", "fs": {"availableBytes": 1},
            "runtime": {"imageFs": {"time": "2026-11-21T10:00:00Z", "availableBytes": 60000000000,
                                    "capacityBytes": 100000000000, "usedBytes": 40000000000, "inodesFree": 5}}},
            "pods": []}"#;
        let summary: Summary = serde_json::from_str(text).unwrap();
        let fs = summary.node.runtime.unwrap().image_fs.unwrap();
        assert_eq!(
            (fs.available_bytes, fs.capacity_bytes, fs.used_bytes),
            (
                Some(60_000_000_000),
                Some(100_000_000_000),
                Some(40_000_000_000)
            )
        );
    }

    #[test]
    fn without_a_summary_the_allocatable_figures_are_used_and_labelled() {
        let mut node = NodeView {
            name: "n1".into(),
            allocatable_ephemeral: Some(90 << 30),
            capacity_ephemeral: Some(100 << 30),
            images: ["quay.io/a@sha256:1".to_string()].into(),
            image_entries: 1,
            ..NodeView::default()
        };
        let refs = [
            "quay.io/a@sha256:1".to_string(),
            "quay.io/b@sha256:2".to_string(),
        ];
        let o = observation(&node, &refs, None);
        assert_eq!(
            o.facts.space_source,
            Some(SpaceSource::AllocatableEphemeralStorage)
        );
        assert_eq!(
            (o.facts.capacity_bytes, o.facts.available_bytes),
            (Some(100 << 30), Some(90 << 30))
        );
        assert_eq!(o.presence[&refs[0]], Some(true));
        assert_eq!(o.presence[&refs[1]], Some(false));
        node.image_entries = NODE_IMAGES_LIMIT;
        assert_eq!(
            observation(&node, &refs, None).presence[&refs[1]],
            None,
            "full list: unknown"
        );
        let fs = FsStats {
            available_bytes: Some(1),
            capacity_bytes: Some(2),
            used_bytes: Some(1),
        };
        let o = observation(&node, &refs, Some(fs));
        assert_eq!(o.facts.space_source, Some(SpaceSource::KubeletSummary));
        assert_eq!(o.facts.capacity_bytes, Some(2));
    }
}

//! What the cluster tells about a node's room for images and its kubelet, for the planner and readiness:
//! the image filesystem from the kubelet's summary through the API server's node proxy
//! (`/api/v1/nodes/NAME/proxy/stats/summary`, `node.runtime.imageFs`) when RBAC allows (`get nodes/proxy`)
//! and the kubelet answers, otherwise the Node's `ephemeral-storage` capacity and allocatable, labelled as
//! such (what the OpenShift daemon checks); and the kubelet's running configuration (`.../proxy/configz`:
//! `nodeStatusMaxImages` and the image GC thresholds), or its defaults, labelled as assumed, when it does not
//! answer. Presence of images comes from `Node.status.images`, judged against that `nodeStatusMaxImages`.

use std::collections::HashMap;

use futures::StreamExt as _;

use super::Cluster;
use crate::backend::kubelet;
use crate::backend::node::SurveyedNode;
use crate::model::machine_config::{ClusterNode, ImageFsSpace, KubeletSettings, Presence};
use crate::model::plan::{NodeFacts, SpaceSource};

/// Summaries asked at once.
const CONCURRENCY: usize = 32;

impl Cluster {
    /// Each named node's kubelet configuration, asked concurrently.
    pub async fn kubelet_settings(&self, nodes: &[String]) -> HashMap<String, KubeletSettings> {
        kubelet::settings_of(&self.client, nodes).await
    }

    /// Each of `nodes`' image filesystem, as its kubelet's summary says (what the planner counts too).
    pub async fn image_fs(&self, nodes: &[String]) -> HashMap<String, ImageFsSpace> {
        kubelet::image_fs_of(&self.client, nodes).await
    }

    /// Each node observed for the planner, with the references it must hold, in the order given.
    pub async fn observe(&self, nodes: &[(&ClusterNode, Vec<String>)]) -> Vec<SurveyedNode> {
        // Owned names: a stream of futures borrowing `nodes` is not Send-general enough for tokio::spawn.
        let names: Vec<String> = nodes.iter().map(|(node, _)| node.name.clone()).collect();
        let asked: Vec<(Option<ImageFsSpace>, KubeletSettings)> = futures::stream::iter(names)
            .map(|name| {
                let cluster = self.clone();
                async move {
                    let (summary, settings) = tokio::join!(
                        kubelet::image_fs(&cluster.client, &name),
                        kubelet::settings(&cluster.client, &name)
                    );
                    if let Err(why) = &summary {
                        tracing::debug!("{name}: kubelet summary unavailable: {why}");
                    }
                    (summary.ok(), settings)
                }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        nodes
            .iter()
            .zip(asked)
            .map(|((node, references), (summary, settings))| {
                observation(node, references, summary, settings)
            })
            .collect()
    }
}

/// `node`'s facts and the presence of `references`, with the space figures of `image_fs` when there is one
/// and what its kubelet's configuration says.
fn observation(
    node: &ClusterNode,
    references: &[String],
    image_fs: Option<ImageFsSpace>,
    kubelet: KubeletSettings,
) -> SurveyedNode {
    let max_images = kubelet.node_status_max_images;
    let mut facts = NodeFacts {
        name: node.name.clone(),
        runtime: node.runtime.clone(),
        kubelet: Some(kubelet),
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
            let known = match node.presence(r, max_images) {
                Presence::Present => Some(true),
                Presence::Absent => Some(false),
                Presence::Unknown => None,
            };
            (r.clone(), known)
        })
        .collect::<HashMap<_, _>>();
    SurveyedNode { facts, presence }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_summary_the_allocatable_figures_are_used_and_labelled() {
        let mut node = ClusterNode {
            name: "n1".into(),
            allocatable_ephemeral: Some(90 << 30),
            capacity_ephemeral: Some(100 << 30),
            images: ["quay.io/a@sha256:1".to_string()].into(),
            image_entries: 1,
            ..ClusterNode::default()
        };
        let refs = [
            "quay.io/a@sha256:1".to_string(),
            "quay.io/b@sha256:2".to_string(),
        ];
        let defaults = || KubeletSettings::assumed("not asked");
        let o = observation(&node, &refs, None, defaults());
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
        node.image_entries = 50;
        assert_eq!(
            observation(&node, &refs, None, defaults()).presence[&refs[1]],
            None,
            "full list: unknown"
        );
        let mut roomy = defaults();
        roomy.node_status_max_images = 200;
        assert_eq!(
            observation(&node, &refs, None, roomy).presence[&refs[1]],
            Some(false),
            "50 of at most 200: complete"
        );
        let fs = ImageFsSpace {
            available_bytes: Some(1),
            capacity_bytes: Some(2),
            used_bytes: Some(1),
        };
        let o = observation(&node, &refs, Some(fs), defaults());
        assert_eq!(o.facts.space_source, Some(SpaceSource::KubeletSummary));
        assert_eq!(o.facts.capacity_bytes, Some(2));
    }
}

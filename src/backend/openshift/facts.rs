//! What the cluster tells about a node's room for images and its kubelet, for the planner and readiness:
//! the image filesystem from the kubelet's summary through the API server's node proxy
//! (`/api/v1/nodes/NAME/proxy/stats/summary`, `node.runtime.imageFs`) when RBAC allows (`get nodes/proxy`)
//! and the kubelet answers, otherwise the Node's `ephemeral-storage` capacity and allocatable, labelled as
//! such (what the OpenShift daemon checks); and the kubelet's running configuration (`.../proxy/configz`:
//! `nodeStatusMaxImages` and the image GC thresholds), or its defaults, labelled as assumed, when it does not
//! answer. Presence of images comes from `Node.status.images`, judged against that `nodeStatusMaxImages`.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use serde::Deserialize;

use super::Cluster;
use crate::backend::node::SurveyedNode;
use crate::model::machine_config::{
    ClusterNode, KUBELET_DEFAULT_GC_HIGH, KUBELET_DEFAULT_GC_LOW, KUBELET_DEFAULT_MAX_IMAGES,
    KubeletSettings, Presence,
};
use crate::model::plan::{NodeFacts, SpaceSource};

/// Summaries asked at once.
const CONCURRENCY: usize = 32;
/// How long one kubelet is given to answer through the node proxy.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a kubelet's word could not be had through the node proxy.
#[derive(Debug, thiserror::Error)]
enum KubeletError {
    #[error("{0}")]
    Request(http::Error),
    #[error("no answer within {KUBELET_TIMEOUT:?}")]
    Timeout,
    #[error("HTTP {code}: {message}")]
    Refused { code: u16, message: String },
    #[error("{0}")]
    Kube(kube::Error),
    #[error("the summary has no node.runtime.imageFs")]
    NoImageFs,
}

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

/// The part of the kubelet's `/configz` pinboard reads: `{"kubeletconfig": {...}}`.
#[derive(Debug, Deserialize)]
struct Configz {
    kubeletconfig: KubeletConfig,
}

/// A field the kubelet leaves out has its default.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct KubeletConfig {
    node_status_max_images: Option<i64>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
}

impl From<KubeletConfig> for KubeletSettings {
    fn from(config: KubeletConfig) -> KubeletSettings {
        let percent =
            |value: Option<i64>, default: u8| value.map_or(default, |v| v.clamp(0, 100) as u8);
        KubeletSettings {
            node_status_max_images: config
                .node_status_max_images
                .unwrap_or(KUBELET_DEFAULT_MAX_IMAGES),
            image_gc_high_threshold_percent: percent(
                config.image_gc_high_threshold_percent,
                KUBELET_DEFAULT_GC_HIGH,
            ),
            image_gc_low_threshold_percent: percent(
                config.image_gc_low_threshold_percent,
                KUBELET_DEFAULT_GC_LOW,
            ),
            assumed: None,
        }
    }
}

impl Cluster {
    /// `path` of `node`'s kubelet through the API server's node proxy; Err says why not (403, no kubelet...).
    async fn kubelet<T: serde::de::DeserializeOwned>(
        &self,
        node: &str,
        path: &str,
    ) -> Result<T, KubeletError> {
        let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/{path}"))
            .body(Vec::new())
            .map_err(KubeletError::Request)?;
        tokio::time::timeout(KUBELET_TIMEOUT, self.client.request::<T>(request))
            .await
            .map_err(|_| KubeletError::Timeout)?
            .map_err(|e| match e {
                kube::Error::Api(status) => KubeletError::Refused {
                    code: status.code,
                    message: status.message,
                },
                other => KubeletError::Kube(other),
            })
    }

    /// The image filesystem of `node` from its kubelet's summary.
    async fn image_fs(&self, node: &str) -> Result<FsStats, KubeletError> {
        let summary: Summary = self.kubelet(node, "stats/summary").await?;
        summary
            .node
            .runtime
            .and_then(|r| r.image_fs)
            .ok_or(KubeletError::NoImageFs)
    }

    /// `node`'s kubelet configuration, or its defaults labelled with why they are assumed.
    async fn kubelet_config(&self, node: &str) -> KubeletSettings {
        match self.kubelet::<Configz>(node, "configz").await {
            Ok(configz) => configz.kubeletconfig.into(),
            Err(why) => {
                tracing::debug!("{node}: kubelet configz unavailable: {why}");
                KubeletSettings::assumed(format!("/configz through the node proxy: {why}"))
            }
        }
    }

    /// Each named node's kubelet configuration (see [`Cluster::kubelet_config`]), asked concurrently.
    pub async fn kubelet_settings(&self, nodes: &[String]) -> HashMap<String, KubeletSettings> {
        futures::stream::iter(nodes.to_vec())
            .map(|name| {
                let cluster = self.clone();
                async move {
                    let settings = cluster.kubelet_config(&name).await;
                    (name, settings)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await
    }

    /// Each node observed for the planner, with the references it must hold, in the order given.
    pub async fn observe(&self, nodes: &[(&ClusterNode, Vec<String>)]) -> Vec<SurveyedNode> {
        // Owned names: a stream of futures borrowing `nodes` is not Send-general enough for tokio::spawn.
        let names: Vec<String> = nodes.iter().map(|(node, _)| node.name.clone()).collect();
        let asked: Vec<(Option<FsStats>, KubeletSettings)> = futures::stream::iter(names)
            .map(|name| {
                let cluster = self.clone();
                async move {
                    let (summary, settings) =
                        tokio::join!(cluster.image_fs(&name), cluster.kubelet_config(&name));
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
    image_fs: Option<FsStats>,
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
    fn kubelet_configz_wire_format_is_read_and_missing_fields_are_the_defaults() {
        // As the kubelet serves /configz (trimmed): {"kubeletconfig": KubeletConfiguration}.
        let text = r#"{"kubeletconfig": {"enableServer": true, "nodeStatusMaxImages": 200,
            "imageGCHighThresholdPercent": 90, "imageGCLowThresholdPercent": 70, "imageMinimumGCAge": "2m0s"}}"#;
        let settings: KubeletSettings = serde_json::from_str::<Configz>(text)
            .unwrap()
            .kubeletconfig
            .into();
        assert_eq!(
            (
                settings.node_status_max_images,
                settings.image_gc_high_threshold_percent,
                settings.image_gc_low_threshold_percent,
                settings.assumed
            ),
            (200, 90, 70, None)
        );
        let bare: KubeletSettings = serde_json::from_str::<Configz>(r#"{"kubeletconfig": {}}"#)
            .unwrap()
            .kubeletconfig
            .into();
        assert_eq!(
            (
                bare.node_status_max_images,
                bare.image_gc_high_threshold_percent
            ),
            (50, 85)
        );
    }

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
        let fs = FsStats {
            available_bytes: Some(1),
            capacity_bytes: Some(2),
            used_bytes: Some(1),
        };
        let o = observation(&node, &refs, Some(fs), defaults());
        assert_eq!(o.facts.space_source, Some(SpaceSource::KubeletSummary));
        assert_eq!(o.facts.capacity_bytes, Some(2));
    }
}

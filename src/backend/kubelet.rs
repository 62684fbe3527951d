//! A node's kubelet, through the API server's node proxy (`get nodes/proxy`): its image filesystem from its
//! summary (`/stats/summary`, `node.runtime.imageFs`), and its running configuration (`/configz`:
//! `nodeStatusMaxImages` and the image GC thresholds), or its defaults, labelled as assumed, when it does
//! not answer.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use kube::Client;
use serde::Deserialize;

use crate::model::machine_config::{
    ImageFsSpace, KUBELET_DEFAULT_GC_HIGH, KUBELET_DEFAULT_GC_LOW, KUBELET_DEFAULT_MAX_IMAGES,
    KubeletSettings,
};

/// Kubelets asked at once.
const CONCURRENCY: usize = 32;
/// How long one kubelet is given to answer through the node proxy.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a kubelet's word could not be had through the node proxy.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
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
    image_fs: Option<ImageFsSpace>,
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

/// `path` of `node`'s kubelet through the API server's node proxy; Err says why not (403, no kubelet...).
async fn proxied<T: serde::de::DeserializeOwned>(
    client: &Client,
    node: &str,
    path: &str,
) -> Result<T, KubeletError> {
    let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/{path}"))
        .body(Vec::new())
        .map_err(KubeletError::Request)?;
    tokio::time::timeout(KUBELET_TIMEOUT, client.request::<T>(request))
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
pub async fn image_fs(client: &Client, node: &str) -> Result<ImageFsSpace, KubeletError> {
    let summary: Summary = proxied(client, node, "stats/summary").await?;
    summary
        .node
        .runtime
        .and_then(|r| r.image_fs)
        .ok_or(KubeletError::NoImageFs)
}

/// `node`'s kubelet configuration, or its defaults labelled with why they are assumed.
pub async fn settings(client: &Client, node: &str) -> KubeletSettings {
    match proxied::<Configz>(client, node, "configz").await {
        Ok(configz) => configz.kubeletconfig.into(),
        Err(why) => {
            tracing::debug!("{node}: kubelet configz unavailable: {why}");
            KubeletSettings::assumed(format!("/configz through the node proxy: {why}"))
        }
    }
}

/// Each named node's kubelet configuration ([`settings`]), asked concurrently.
pub async fn settings_of(client: &Client, nodes: &[String]) -> HashMap<String, KubeletSettings> {
    futures::stream::iter(nodes.to_vec())
        .map(|name| async move {
            let settings = settings(client, &name).await;
            (name, settings)
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await
}

/// Each of `nodes`' image filesystem from its kubelet's summary; a node whose kubelet does not say is
/// left out.
pub async fn image_fs_of(client: &Client, nodes: &[String]) -> HashMap<String, ImageFsSpace> {
    futures::stream::iter(nodes.to_vec())
        .map(|name| async move {
            let space = image_fs(client, &name).await;
            (name, space)
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|(name, space)| async move { Some((name, space.ok()?)) })
        .collect()
        .await
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
}

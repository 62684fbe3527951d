//! What an agent reports of its node, read from the node itself: the runtime and its version, the image
//! filesystem (statvfs of the mountpoint CRI ImageFsInfo names, mounted into the agent), every image with
//! its size, whether it is pinned and who holds the pin (as readiness observes it: the runtime's word, the
//! node's record), lazy pulling, the registry config directory, and the kubelet's image GC thresholds.

use std::time::Duration;

use kube::Client;

use crate::backend::cri::CriClient;
use crate::backend::lazy::{read_lazy, runtime_kind};
use crate::backend::node::survey_node;
use crate::backend::readiness::observe;
use crate::backend::target::NodeTarget;
use crate::backend::wiring::containerd_config_path;
use crate::model::holders::Holder;
use crate::model::pinboard_api::{
    FilesystemReport, ImageReport, KUBELET_CONFIG_SOURCE, KubeletThresholds, NodeReport,
    RuntimeReport,
};
use crate::model::readiness::pin_method_name;

/// The node as it is now; what could not be read is left out, and why the runtime could not be asked is
/// said.
pub async fn read(target: &NodeTarget, kube: &Client, timeout: Duration) -> NodeReport {
    let mut report = NodeReport {
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        ..NodeReport::default()
    };
    let client = match CriClient::connect(&target.node.endpoint, timeout).await {
        Ok(client) => client,
        Err(e) => {
            report.runtime_error = Some(e.to_string());
            return report;
        }
    };
    let version = match client.version().await {
        Ok(version) => version,
        Err(e) => {
            report.runtime_error = Some(e.to_string());
            return report;
        }
    };
    report.runtime = Some(RuntimeReport {
        name: version.runtime_name.clone(),
        version: version.runtime_version.clone(),
    });
    let space = survey_node(&target.node, &[], timeout).await.facts;
    if let (Some(capacity), Some(available)) = (space.capacity_bytes, space.available_bytes) {
        report.image_filesystem = Some(FilesystemReport {
            mountpoint: String::new(),
            capacity_bytes: capacity,
            available_bytes: available,
            used_bytes: space.used_bytes.unwrap_or_default(),
            available: crate::model::units::human(available),
        });
    }
    let images = client.list_images().await.unwrap_or_default();
    let names: Vec<String> = images
        .iter()
        .filter_map(|i| i.repo_digests.first().or(i.repo_tags.first()).cloned())
        .collect();
    let observed = observe(target, &names, timeout).await;
    report.pin_method = observed.pin_method.map(|m| pin_method_name(m).to_string());
    report.images = images
        .iter()
        .map(|image| {
            let seen = observed.images.iter().find(|o| {
                image.repo_digests.contains(&o.reference) || image.repo_tags.contains(&o.reference)
            });
            let pinned = seen
                .and_then(|s| s.reported_pinned.or(s.recorded_pinned))
                .unwrap_or(image.pinned);
            let held_by = seen
                .and_then(|s| s.holders.as_ref())
                .map(|holders| {
                    holders
                        .iter()
                        .map(|h| match h {
                            Holder::Set(name) => name.clone(),
                            Holder::Admin => "admin".into(),
                            Holder::Unowned => "unowned".into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            ImageReport {
                names: [&image.repo_digests[..], &image.repo_tags[..]].concat(),
                size_bytes: image.size,
                pinned,
                held_by,
                lazy: seen.and_then(|s| s.lazy.clone()),
            }
        })
        .collect();
    report.image_count = report.images.len();
    report.pinned_count = report.images.iter().filter(|i| i.pinned).count();
    let lazy = match runtime_kind(&version.runtime_name) {
        Ok(kind) => read_lazy(&client, kind, &target.lazy)
            .await
            .map(|(lazy, _)| lazy)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    (report.lazy_pulling, report.lazy_pulling_error) = match lazy {
        Ok(lazy) => (Some(lazy), None),
        Err(why) => (None, Some(why)),
    };
    let containerd_config = &target.lazy.containerd_config;
    report.registry_config_dir = containerd_config_path(&target.wiring, containerd_config, &client)
        .await
        .ok()
        .flatten()
        .map(|dir| dir.display().to_string());
    let kubelet = crate::backend::kubelet::settings(kube, &target.node.name).await;
    report.kubelet = Some(KubeletThresholds {
        image_gc_high_threshold_percent: kubelet.image_gc_high_threshold_percent,
        image_gc_low_threshold_percent: kubelet.image_gc_low_threshold_percent,
        source: match kubelet.assumed {
            None => KUBELET_CONFIG_SOURCE.into(),
            Some(why) => format!("default ({why})"),
        },
    });
    report
}

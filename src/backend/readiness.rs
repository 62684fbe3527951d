//! Observes what [`crate::model::readiness`] judges, on one node reached over its CRI socket: whether each
//! image is there, whether the runtime reports it pinned, and what the node's own pin record says,
//! including who holds each pin ([`crate::model::holders`]).
//!
//! One ListImages per node gives presence (and `pinned`, where the runtime reports pins there:
//! [`Runtime::reports_pinned`]: CRI-O, containerd from 1.6.22 / 1.7.3); a single image is asked with
//! ImageStatus, as it always works. The record is CRI-O's configuration as CRI-O
//! reads it ([`pins::read_crio_config`]: the effective `pinned_images`, so an administrator's glob
//! counts), or the containerd pin label, which decides only where the runtime cannot report it; the
//! drop-in's marks or the holder labels say who holds each pin (one containerd List per node). How the node pins
//! is resolved exactly as the engine resolves it when it writes pins ([`pins::resolve`]). On containerd,
//! pulls in flight for missing images are read from its content ingests ([`observe_pulls`]). Also which present
//! images are there only lazily ([`remote_layers`]), and lazy pulling as the runtime has it ([`read_lazy`]).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::cri::{CriClient, CriError};
use super::lazy::read_lazy;
use super::pins::{self, PinTarget};
use super::progress;
use super::proto::cri::Image;
use super::remote_layers::remote_layers;
use super::target::NodeTarget;
use crate::model::crio::CrioConfig;
use crate::model::holders::{CrioEntry, crio_holders};
use crate::model::image::ImageFacts;
use crate::model::readiness::{CrioObserved, ImageObserved, ObservedNode};
use crate::model::rollout::PinMethod;
use crate::model::runtime::{Runtime, RuntimeKind};

/// Observes one node. Never fails: an unreachable node comes back with `unreachable` set.
pub async fn observe(
    target: &NodeTarget,
    references: &[String],
    timeout: Duration,
) -> ObservedNode {
    let name = target.node.name.clone();
    let connected = async {
        let client = CriClient::connect(&target.node.endpoint, timeout).await?;
        let version = client.version().await?;
        Ok::<_, CriError>((client, version))
    };
    let (client, version) = match connected.await {
        Ok(c) => c,
        Err(e) => {
            return ObservedNode {
                node: name,
                unreachable: Some(e.to_string()),
                images: references
                    .iter()
                    .map(|r| ImageObserved {
                        reference: r.clone(),
                        ..ImageObserved::default()
                    })
                    .collect(),
                ..ObservedNode::default()
            };
        }
    };
    let runtime = Runtime::identify(&version.runtime_name, &version.runtime_version);
    let reports = runtime
        .as_ref()
        .map(Runtime::reports_pinned)
        .unwrap_or_default();
    // One ListImages serves many images whatever the runtime reports of pins there (where it reports
    // none, `pinned` is not read from it): an agent checking 200 images every 30 s makes 2 calls a
    // minute of it instead of 400 ImageStatus.
    let listed = reports.list_images || references.len() > 1;
    let records = client.image_records(references, listed).await;
    let not_ready = client.not_ready().await.unwrap_or_else(|e| {
        tracing::warn!("{name}: cannot ask whether the runtime is ready: {e}");
        None
    });
    let mut observed = ObservedNode {
        node: name,
        not_ready,
        runtime: Some(format!(
            "{} {}",
            version.runtime_name, version.runtime_version
        )),
        runtime_kind: runtime.as_ref().map(|r| r.kind),
        ..ObservedNode::default()
    };
    let mut crio_broken = None;
    let record = match pins::resolve(target.pin.clone(), &version.runtime_name, &client) {
        Ok(PinTarget::CrioDropIn { config_dir, .. }) => {
            observed.pin_method = Some(PinMethod::CrioDropIn);
            let read = tokio::task::spawn_blocking(move || {
                (
                    pins::read_crio_config(&config_dir),
                    pins::read_drop_in(&config_dir),
                )
            })
            .await;
            match read {
                Ok((config, Ok(entries))) => match config {
                    Ok(config) => Record::Crio(config, entries),
                    // CRI-O cannot load it either: its pins stay as they were, and that is the news.
                    Err(e @ pins::PinError::CrioConfig(_)) => {
                        crio_broken = Some(e.to_string());
                        Record::Crio(CrioConfig::default(), entries)
                    }
                    Err(e) => Record::Unreadable(format!("reading CRI-O's configuration: {e}")),
                },
                Ok((_, Err(e))) => {
                    Record::Unreadable(format!("reading CRI-O's configuration: {e}"))
                }
                Err(e) => Record::Unreadable(format!("reading CRI-O's configuration: {e}")),
            }
        }
        Ok(_) => {
            observed.pin_method = Some(PinMethod::ContainerdLabel);
            match pins::containerd_images(&client).await {
                Ok(images) => Record::Labels(images),
                Err(e) => Record::Unreadable(format!("reading the pin labels: {e}")),
            }
        }
        Err(e) => Record::Unreadable(e.to_string()),
    };
    if let (Some(runtime), Record::Crio(config, _)) = (&runtime, &record)
        && runtime.kind == RuntimeKind::Crio
    {
        observed.crio = Some(CrioObserved {
            runtime: runtime.to_string(),
            version: runtime.version,
            config: config.clone(),
            broken: crio_broken,
        });
    }
    let kind = runtime.as_ref().map(|r| r.kind);
    if let Some(kind) = kind {
        observed.lazy_pulling = match read_lazy(&client, kind, &target.lazy).await {
            Ok((lazy, _)) => Some(lazy),
            Err(e) => {
                tracing::warn!("{}: cannot read lazy pulling: {e}", observed.node);
                None
            }
        };
    }
    let present: Vec<&Image> = records
        .iter()
        .filter_map(|r| r.as_ref().ok()?.as_ref())
        .collect();
    let mut remote = remote_layers(&observed.node, &client, kind, &present)
        .await
        .into_iter();
    for (reference, record_of) in references.iter().zip(records) {
        let mut image = ImageObserved {
            reference: reference.clone(),
            ..ImageObserved::default()
        };
        let status = match record_of {
            Ok(status) => status,
            Err(e) => {
                observed.error.get_or_insert(e.to_string());
                observed.images.push(image);
                continue;
            }
        };
        image.present = Some(status.is_some());
        if let Some(status) = &status {
            image.lazy = remote.next().flatten();
            image.names = status
                .repo_tags
                .iter()
                .chain(&status.repo_digests)
                .cloned()
                .collect();
            image.tags.clone_from(&status.repo_tags);
        }
        // Only where the call used carries the runtime's word; otherwise `false` would mean nothing.
        image.reported_pinned = status.as_ref().filter(|_| reports.any()).map(|s| s.pinned);
        let names: Vec<&str> = std::iter::once(reference.as_str())
            .chain(image.names.iter().map(String::as_str))
            .collect();
        (image.recorded_pinned, image.holders) = match &record {
            Record::Crio(config, entries) => (
                Some(config.pins(&names)),
                Some(crio_holders(entries, config, pins::CRIO_DROP_IN, &names)),
            ),
            Record::Labels(images) => {
                // A missing image has no record to carry a label.
                let labelled = status
                    .as_ref()
                    .and_then(|s| pins::image_named(images, &pins::cri_names(reference, s)));
                // Where the runtime reports pins, its word decides; the labels then only say who holds them.
                let pinned = labelled.is_some_and(pins::ContainerdImage::pin_labelled);
                (
                    (!reports.any()).then_some(pinned),
                    Some(
                        labelled
                            .map(pins::ContainerdImage::holders)
                            .unwrap_or_default(),
                    ),
                )
            }
            Record::Unreadable(e) => {
                if reports.any() {
                    tracing::debug!("{}: {e}", observed.node);
                } else {
                    observed.error.get_or_insert(e.clone());
                }
                (None, None)
            }
        };
        observed.images.push(image);
    }
    observed
}

/// Adds the pulls in flight to the missing images of a containerd node: its content ingests
/// (`ListStatuses`) mapped to each image's blobs, as the registry described them in `facts`. CRI-O does not
/// tell; a node that cannot be asked keeps its images as they were.
pub async fn observe_pulls(
    target: &NodeTarget,
    observed: &mut ObservedNode,
    facts: &HashMap<String, ImageFacts>,
    timeout: Duration,
) {
    let containerd = observed.runtime_kind == Some(RuntimeKind::Containerd);
    if !containerd || observed.images.iter().all(|i| i.present != Some(false)) {
        return;
    }
    let ingests = match CriClient::connect(&target.node.endpoint, timeout).await {
        Ok(client) => progress::list_ingests(client.channel())
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let ingests = match ingests {
        Ok(ingests) => ingests,
        Err(e) => {
            tracing::warn!("{}: cannot list containerd's ingests: {e}", observed.node);
            return;
        }
    };
    let now = SystemTime::now();
    for image in observed
        .images
        .iter_mut()
        .filter(|i| i.present == Some(false))
    {
        if let Some(facts) = facts.get(&image.reference) {
            image.pulling = progress::pull_seen(facts, &ingests, now);
        }
    }
}

/// Where a node keeps its pins.
enum Record {
    /// What CRI-O's files pin together, and who holds the entries of pinboard's drop-in.
    Crio(CrioConfig, Vec<CrioEntry>),
    /// The containerd images, their pin and holder labels.
    Labels(Vec<pins::ContainerdImage>),
    /// Could not be read: why.
    Unreadable(String),
}

//! What a node reached directly over its CRI socket says about itself: runtime, image filesystem space,
//! which of a set's images it already has, and which of those only lazily. Feeds [`crate::model::plan`].
//!
//! Free space: CRI's ImageFsInfo gives the image filesystem's mountpoint and used bytes, but no capacity.
//! On a local unix socket pinboard shares the node's filesystem and measures the mountpoint with statvfs;
//! over tcp it cannot, and says so instead of guessing.

use std::collections::HashMap;
use std::time::Duration;

use super::cri::{CriClient, CriEndpoint, CriError};
use super::held::held_blobs;
use super::remote_layers::remote_layers;
use super::target::DirectNode;
use crate::model::plan::{NodeFacts, Presence};
use crate::model::runtime::RuntimeKind;

#[derive(Clone, Debug, Default)]
pub struct SurveyedNode {
    pub facts: NodeFacts,
    /// By reference, as given.
    pub presence: HashMap<String, Presence>,
}

/// Observes one node. Never fails: an unreachable node comes back with `facts.unreachable` set.
pub async fn survey_node(
    node: &DirectNode,
    references: &[String],
    timeout: Duration,
) -> SurveyedNode {
    match observe_reachable(node, references, timeout).await {
        Ok(observation) => observation,
        Err(err) => SurveyedNode {
            facts: NodeFacts {
                name: node.name.clone(),
                unreachable: Some(err.to_string()),
                ..NodeFacts::default()
            },
            presence: references.iter().map(|r| (r.clone(), None)).collect(),
        },
    }
}

async fn observe_reachable(
    node: &DirectNode,
    references: &[String],
    timeout: Duration,
) -> Result<SurveyedNode, CriError> {
    let client = CriClient::connect(&node.endpoint, timeout).await?;
    let version = client.version().await?;
    let fs = client.image_fs_info().await?;
    let runtime = RuntimeKind::of_cri_name(&version.runtime_name);
    let mut facts = NodeFacts {
        name: node.name.clone(),
        runtime: Some(format!(
            "{} {}",
            version.runtime_name, version.runtime_version
        )),
        held: held_blobs(&node.name, &client, runtime).await,
        ..NodeFacts::default()
    };
    let mountpoint = fs
        .image_filesystems
        .first()
        .and_then(|f| f.fs_id.as_ref())
        .map(|id| id.mountpoint.clone());
    match (&node.endpoint, mountpoint) {
        (CriEndpoint::Tcp(_), _) => {
            facts.space_unknown_reason =
                Some("tcp endpoint: the image filesystem is not local, so its free space cannot be measured".into());
        }
        (_, None) => {
            facts.space_unknown_reason = Some("the runtime reported no image filesystem".into())
        }
        (_, Some(mountpoint)) => match nix::sys::statvfs::statvfs(mountpoint.as_str()) {
            Ok(stat) => {
                let block = stat.fragment_size();
                facts.capacity_bytes = Some(stat.blocks() * block);
                facts.available_bytes = Some(stat.blocks_available() * block);
                facts.used_bytes = Some((stat.blocks() - stat.blocks_free()) * block);
            }
            Err(err) => {
                facts.space_unknown_reason = Some(format!(
                    "cannot measure image filesystem {mountpoint}: {err}"
                ));
            }
        },
    }
    // One ListImages answers for the whole set: a release's ~190 ImageStatus calls cost more than it.
    let statuses = client.image_records(references, true).await;
    let mut presence = HashMap::with_capacity(references.len());
    let mut present = Vec::new();
    for (reference, status) in references.iter().zip(statuses) {
        let status = status?;
        presence.insert(reference.clone(), Some(status.is_some()));
        present.extend(status.map(|image| (reference.clone(), image)));
    }
    let records: Vec<_> = present.iter().map(|(_, image)| image).collect();
    let remote = remote_layers(&node.name, &client, runtime, &records).await;
    facts.lazy = present
        .into_iter()
        .zip(remote)
        .filter_map(|((reference, _), remote)| Some((reference, remote?)))
        .collect();
    Ok(SurveyedNode { facts, presence })
}

//! What the agent publishes of what its node's runtime holds, in the node's `PinboardNodeBlobs`
//! ([`NodeBlobs`]), so that a plan on agents is exact: read with the code direct mode's plan reads a node
//! with (what the runtime holds: [`held_blobs`]; its image records; which of them are only lazily present:
//! [`remote_layers`]) each time the agent reads its node (at its start, every 5 minutes, after a rollout
//! or a release, and 2 s after the runtime announces a change, such reads 10 s apart at least; on CRI-O,
//! which announces none, every 30 s), and written only when it changed. While a rollout runs the node is
//! read only periodically, so a rollout costs one write when it ends, and at most one a period before.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use crate::backend::cri::{CriClient, CriError};
use crate::backend::held::held_blobs;
use crate::backend::pinboard_api::PinboardApi;
use crate::backend::remote_layers::remote_layers;
use crate::backend::target::NodeTarget;
use crate::model::node_blobs::NodeBlobs;
use crate::model::runtime::RuntimeKind;

/// The node's holdings as last read, and as last written.
#[derive(Default)]
pub struct Publisher {
    read: Option<NodeBlobs>,
    written: Option<NodeBlobs>,
}

impl Publisher {
    /// Reads what the runtime holds now; what cannot be read keeps the last read (and says why).
    pub async fn read(&mut self, target: &NodeTarget, timeout: Duration) {
        match holdings(target, timeout).await {
            Ok(blobs) => self.read = Some(blobs),
            Err(e) => tracing::warn!("cannot read what the runtime holds, for the plans: {e}"),
        }
    }

    /// Writes the last read when it is not what was written; the object itself with the first write (and
    /// after a failed one: perhaps it is gone).
    pub async fn publish(&mut self, api: &PinboardApi, node: &Node) {
        let Some(read) = &self.read else {
            return;
        };
        if self.written.as_ref() == Some(read) {
            return;
        }
        match api.write_blobs(node, read, self.written.is_none()).await {
            Ok(()) => self.written = Some(read.clone()),
            Err(e) => {
                tracing::warn!("cannot write what the runtime holds: {e}");
                self.written = None;
            }
        }
    }
}

/// What `target`'s runtime holds, its image records, and which of them are only lazily present.
async fn holdings(target: &NodeTarget, timeout: Duration) -> Result<NodeBlobs, CriError> {
    let name = &target.node.name;
    let client = CriClient::connect(&target.node.endpoint, timeout).await?;
    let version = client.version().await?;
    let runtime = RuntimeKind::of_cri_name(&version.runtime_name);
    let held = held_blobs(name, &client, runtime).await;
    let images = client.list_images().await?;
    let records: Vec<_> = images.iter().collect();
    let lazy = remote_layers(name, &client, runtime, &records).await;
    let named = images.iter().map(|i| i.repo_digests.as_slice()).zip(lazy);
    Ok(NodeBlobs::published(&held, named))
}

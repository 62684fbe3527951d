//! What a node's runtime holds already, whichever image brought it: what the planner leaves out of what a
//! node will fetch, and what apply measures a pull by.
//!
//! - containerd skips every blob its content store holds (namespace `k8s.io`): the store is listed through
//!   the content service on the CRI socket (`Content/List`), digests and sizes.
//! - CRI-O (c/storage) reuses every layer it holds, matched by its uncompressed digest (diff ID): the
//!   image configs it holds (`ImageStatus` with `verbose`, `info["info"].imageSpec`) list them in
//!   `rootfs.diff_ids`, and an image's ID is its config's digest.
//!
//! Where neither can be asked, the holdings are unknown and a plan only counts the set's present images: an
//! upper bound.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;

use super::cri::{CriClient, CriError};
use super::pins::containerd::namespaced;
use super::proto::containerd_content::{Info, ListContentRequest, content_client::ContentClient};
use crate::model::image::config_diff_ids;
use crate::model::plan::HeldBlobs;
use crate::model::runtime::RuntimeKind;

/// Requests in flight at once for CRI-O's per-image configs.
const CONFIGS_AT_ONCE: usize = 8;

/// What `node`'s runtime holds; [`HeldBlobs::Unknown`] (and a log line) when it cannot be asked.
pub async fn held_blobs(node: &str, client: &CriClient, runtime: Option<RuntimeKind>) -> HeldBlobs {
    let held = match runtime {
        Some(RuntimeKind::Containerd) => content_store(client)
            .await
            .map(|blobs| HeldBlobs::Digests(blobs.into_keys().collect())),
        Some(RuntimeKind::Crio) => crio_layers(client).await,
        None => return HeldBlobs::Unknown,
    };
    held.unwrap_or_else(|e| {
        tracing::warn!(
            "{node}: cannot list what the runtime holds, so its plan counts only the sets' images (an \
             upper bound); check that the runtime answers on its CRI socket: {e}"
        );
        HeldBlobs::Unknown
    })
}

/// Every blob containerd's content store holds in the `k8s.io` namespace, by digest, with its size.
pub async fn content_store(client: &CriClient) -> Result<HashMap<String, u64>, CriError> {
    Ok(content_infos(client)
        .await?
        .into_iter()
        .map(|info| (info.digest, u64::try_from(info.size).unwrap_or(0)))
        .collect())
}

/// Every blob containerd's content store holds in the `k8s.io` namespace, with its size and labels.
pub async fn content_infos(client: &CriClient) -> Result<Vec<Info>, CriError> {
    let listing = async {
        let mut stream = ContentClient::new(client.channel())
            .list(namespaced(ListContentRequest::default()))
            .await?
            .into_inner();
        let mut blobs = Vec::new();
        while let Some(page) = stream.next().await {
            blobs.extend(page?.info);
        }
        Ok(blobs)
    };
    client.call_content("Content/List", listing).await
}

/// The diff IDs of every layer CRI-O holds and its image configs' digests.
async fn crio_layers(client: &CriClient) -> Result<HeldBlobs, CriError> {
    let images = client.list_images().await?;
    let configs: HashSet<String> = images.iter().map(|i| config_digest(&i.id)).collect();
    let specs = futures::stream::iter(
        images
            .into_iter()
            .map(|image| async move { client.image_spec(&image.id).await }),
    )
    .buffer_unordered(CONFIGS_AT_ONCE)
    .collect::<Vec<_>>()
    .await;
    let mut diff_ids = HashSet::new();
    for spec in specs {
        diff_ids.extend(spec?.map(|s| config_diff_ids(&s)).unwrap_or_default());
    }
    Ok(HeldBlobs::Layers { diff_ids, configs })
}

/// An image ID as a config digest: CRI-O reports the bare hex.
fn config_digest(id: &str) -> String {
    match id.contains(':') {
        true => id.to_string(),
        false => format!("sha256:{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_id_is_its_config_digest() {
        assert_eq!(config_digest("abc"), "sha256:abc");
        assert_eq!(config_digest("sha256:abc"), "sha256:abc");
    }
}

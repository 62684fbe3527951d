//! Which of a node's images are only lazily present: image record and layers there, some layers' bytes
//! still in the registry ([`crate::model::lazy::RemoteLayers`]), read the way each runtime keeps them:
//!
//! - containerd: the content store's blobs with their labels (`Content/List`: a manifest names its config
//!   and layers, a config its top snapshot) and the CRI plugin's snapshotter's snapshots (`Snapshots/List`,
//!   namespace `k8s.io`: parents, kinds and the remote label), both on the CRI socket; on a local socket,
//!   how much of each layer stargz-snapshotter fetched ([`super::stargz`]). A remote snapshotter that does
//!   not answer leaves the content store to say which layers are remote (their blobs absent), and them
//!   unreadable.
//! - CRI-O: containers-storage's records, on the node's disk where pinboard runs: the image filesystem CRI
//!   reports is `<graphroot>/<driver>-images`, whose `images.json` gives an image's top layer; the layers'
//!   `<driver>-layers/layers.json` their parents; an additional-layer-store layer has an `additionallayer`
//!   file in `<graphroot>/<driver>/<id>/`. Over tcp, where the files are not local, nothing can be said.
//!
//! Where the runtime cannot be asked, the images count as wholly there, and a warning says why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;

use super::cri::{CriClient, CriError};
use super::held::content_infos;
use super::pins::containerd::namespaced;
use super::proto::containerd_snapshots::{
    Kind, ListSnapshotsRequest, snapshots_client::SnapshotsClient,
};
use super::proto::cri::Image;
use super::stargz::layer_states;
use crate::model::lazy::{
    ContainerdHoldings, ContainerdSnapshot, REMOTE_SNAPSHOT_LABEL, REMOTE_SNAPSHOTTERS,
    RemoteLayers, layer_chain,
};
use crate::model::runtime::RuntimeKind;

/// The CRI plugin's label naming the layer a snapshot was pulled for.
const LAYER_DIGEST_LABEL: &str = "containerd.io/snapshot/cri.layer-digest";
/// The CRI plugin's label naming the reference a snapshot was pulled by.
const IMAGE_REF_LABEL: &str = "containerd.io/snapshot/cri.image-ref";
/// How long stargz's layer mounts get to say what they fetched.
const STATES_WITHIN: Duration = Duration::from_secs(2);

/// Per image of `images` (the runtime's records of present images on `node`), in order, its remote layers
/// when it is only lazily present.
pub async fn remote_layers(
    node: &str,
    client: &CriClient,
    runtime: Option<RuntimeKind>,
    images: &[&Image],
) -> Vec<Option<RemoteLayers>> {
    let none = || vec![None; images.len()];
    if images.is_empty() {
        return none();
    }
    let found = match runtime {
        Some(RuntimeKind::Containerd) => {
            containerd(client, images).await.map_err(|e| e.to_string())
        }
        Some(RuntimeKind::Crio) if client.endpoint().is_local() => crio(client, images).await,
        _ => return none(),
    };
    found.unwrap_or_else(|e| {
        tracing::warn!(
            "{node}: cannot tell whether images are only lazily present, so they count as there; check \
             that the runtime answers on its CRI socket: {e}"
        );
        none()
    })
}

async fn containerd(
    client: &CriClient,
    images: &[&Image],
) -> Result<Vec<Option<RemoteLayers>>, CriError> {
    let Some(mut holdings) = containerd_holdings(client).await? else {
        return Ok(vec![None; images.len()]);
    };
    if client.endpoint().is_local() && REMOTE_SNAPSHOTTERS.contains(&holdings.snapshotter()) {
        let image_fs = client.image_fs_info().await.ok().and_then(|fs| {
            let id = fs.image_filesystems.into_iter().next()?.fs_id?;
            Some(PathBuf::from(id.mountpoint))
        });
        holdings = holdings.with_fetch(layer_states(image_fs, STATES_WITHIN).await);
    }
    Ok(images
        .iter()
        .map(|i| holdings.remote_layers(&i.id))
        .collect())
}

/// What the containerd node `client` reaches holds of its images, for its CRI plugin's snapshotter (None:
/// it names none).
pub async fn containerd_holdings(
    client: &CriClient,
) -> Result<Option<ContainerdHoldings>, CriError> {
    let Some(snapshotter) = client.cri_snapshotter().await? else {
        return Ok(None);
    };
    let content = content_infos(client)
        .await?
        .into_iter()
        .map(|info| (info.digest, info.labels))
        .collect();
    let snapshots = match snapshots(client, &snapshotter).await {
        Ok(snapshots) => snapshots,
        // The remote snapshotter is a process of its own, which may be down while containerd serves.
        Err(e) if REMOTE_SNAPSHOTTERS.contains(&snapshotter.as_str()) => {
            let why = format!("the snapshotter {snapshotter} does not answer: {}", e.cause);
            return Ok(Some(ContainerdHoldings::unserved(
                &snapshotter,
                content,
                why,
            )));
        }
        Err(e) => return Err(e),
    };
    Ok(Some(ContainerdHoldings::new(
        &snapshotter,
        content,
        snapshots,
    )))
}

/// Every snapshot of `snapshotter` in the `k8s.io` namespace, by name.
async fn snapshots(
    client: &CriClient,
    snapshotter: &str,
) -> Result<HashMap<String, ContainerdSnapshot>, CriError> {
    let listing = async {
        let request = namespaced(ListSnapshotsRequest {
            snapshotter: snapshotter.to_string(),
            filters: Vec::new(),
        });
        let mut stream = SnapshotsClient::new(client.channel())
            .list(request)
            .await?
            .into_inner();
        let mut snapshots = HashMap::new();
        while let Some(page) = stream.next().await {
            for info in page?.info {
                let snapshot = ContainerdSnapshot {
                    remote: info.labels.contains_key(REMOTE_SNAPSHOT_LABEL),
                    committed: info.kind == Kind::Committed as i32,
                    layer: info.labels.get(LAYER_DIGEST_LABEL).cloned(),
                    image: info.labels.get(IMAGE_REF_LABEL).cloned(),
                    parent: info.parent,
                };
                snapshots.insert(info.name, snapshot);
            }
        }
        Ok(snapshots)
    };
    client.call_content("Snapshots/List", listing).await
}

/// An image in containers-storage's `images.json`: its ID (the config digest's hex) and top layer.
#[derive(Deserialize)]
struct StoredImage {
    id: String,
    #[serde(default)]
    layer: String,
}

/// A layer in containers-storage's `layers.json`.
#[derive(Deserialize)]
struct StoredLayer {
    id: String,
    #[serde(default)]
    parent: String,
}

async fn crio(client: &CriClient, images: &[&Image]) -> Result<Vec<Option<RemoteLayers>>, String> {
    let fs = client.image_fs_info().await.map_err(|e| e.to_string())?;
    let mountpoint = fs
        .image_filesystems
        .first()
        .and_then(|f| f.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint))
        .ok_or("CRI-O reported no image filesystem")?;
    let ids: Vec<String> = images
        .iter()
        .map(|i| i.id.trim_start_matches("sha256:").to_string())
        .collect();
    tokio::task::spawn_blocking(move || crio_storage(&mountpoint, &ids))
        .await
        .map_err(|e| e.to_string())?
}

/// Per image ID, its remote layers, from the containers-storage whose image filesystem is `images_dir`.
fn crio_storage(images_dir: &Path, ids: &[String]) -> Result<Vec<Option<RemoteLayers>>, String> {
    let name = images_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let (Some(driver), Some(graphroot)) = (name.strip_suffix("-images"), images_dir.parent())
    else {
        return Err(format!(
            "{}: not containers-storage's <driver>-images directory",
            images_dir.display()
        ));
    };
    let read = |path: PathBuf| -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let parse = |path: PathBuf| -> Result<Vec<StoredLayer>, String> {
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    };
    let stored: Vec<StoredImage> = serde_json::from_str(&read(images_dir.join("images.json"))?)
        .map_err(|e| format!("{}/images.json: {e}", images_dir.display()))?;
    let layers_dir = graphroot.join(format!("{driver}-layers"));
    let mut layers = parse(layers_dir.join("layers.json"))?;
    layers.extend(parse(layers_dir.join("volatile-layers.json"))?);
    let parents: HashMap<&str, Option<&str>> = layers
        .iter()
        .map(|l| {
            let parent = Some(l.parent.as_str()).filter(|p| !p.is_empty());
            (l.id.as_str(), parent)
        })
        .collect();
    let additional = |layer: &str| {
        graphroot
            .join(driver)
            .join(layer)
            .join("additionallayer")
            .exists()
    };
    Ok(ids
        .iter()
        .map(|id| {
            let top = stored.iter().find(|i| &i.id == id)?.layer.as_str();
            let chain = layer_chain(top, |l| parents.get(l).copied())?;
            let remote: Vec<bool> = chain.iter().map(|l| additional(l)).collect();
            RemoteLayers::of(&remote)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crio_layers_with_an_additionallayer_file_are_remote() {
        let root = tempfile::tempdir().unwrap();
        let images = root.path().join("overlay-images");
        let layers = root.path().join("overlay-layers");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::create_dir_all(&layers).unwrap();
        std::fs::write(
            images.join("images.json"),
            r#"[{"id": "aaa", "names": ["q.io/a@sha256:1"], "layer": "l3"},
                {"id": "bbb", "names": ["q.io/b@sha256:2"], "layer": "l1"},
                {"id": "ccc", "names": ["q.io/c@sha256:3"]}]"#,
        )
        .unwrap();
        std::fs::write(
            layers.join("layers.json"),
            r#"[{"id": "l1", "compressed-diff-digest": "sha256:c1"},
                {"id": "l2", "parent": "l1"}, {"id": "l3", "parent": "l2"}]"#,
        )
        .unwrap();
        for layer in ["l1", "l2", "l3"] {
            std::fs::create_dir_all(root.path().join("overlay").join(layer).join("diff")).unwrap();
        }
        for layer in ["l2", "l3"] {
            std::fs::write(
                root.path()
                    .join("overlay")
                    .join(layer)
                    .join("additionallayer"),
                "/var/lib/stargz-store/store/x",
            )
            .unwrap();
        }
        let ids = ["aaa", "bbb", "ccc", "ddd"].map(String::from);
        let found = crio_storage(&images, &ids).unwrap();
        assert_eq!(
            found,
            [RemoteLayers::of(&[false, true, true]), None, None, None]
        );
        assert!(crio_storage(root.path(), &ids).is_err());
    }
}

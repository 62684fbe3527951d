//! A [`Swap`] carried out on the node: its snapshots removed (children first), then each layer applied
//! from its blob in the content store (containerd's diff service) into a snapshot prepared without the
//! remote-snapshot labels, checked against its chain ID, and committed under that name. A layer whose
//! apply or commit fails leaves nothing behind but what the lease holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::Code;

use super::content::{blob_size, head};
use super::{WholeError, with_lease};
use crate::backend::cri::CriClient;
use crate::backend::pins::containerd::namespaced;
use crate::backend::proto::containerd_diff::{ApplyRequest, diff_client::DiffClient};
use crate::backend::proto::containerd_snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
    snapshots_client::SnapshotsClient,
};
use crate::backend::proto::containerd_types::Descriptor;
use crate::model::whole::{Build, Swap, chain_id, layer_media_type};

/// How long applying one layer may take (a few hundred MiB of tar written to disk).
const APPLY_WITHIN: Duration = Duration::from_secs(600);

/// Carries out `swap` with `snapshotter`, under the lease.
pub(super) async fn execute(
    client: &CriClient,
    lease: &str,
    snapshotter: &str,
    swap: &Swap,
) -> Result<(), WholeError> {
    for name in &swap.remove {
        remove(client, snapshotter, name).await?;
    }
    for build in &swap.build {
        apply(client, lease, snapshotter, build).await?;
    }
    Ok(())
}

/// Removes snapshot `key`; one gone already is as good.
async fn remove(client: &CriClient, snapshotter: &str, key: &str) -> Result<(), WholeError> {
    let request = namespaced(RemoveSnapshotRequest {
        snapshotter: snapshotter.to_string(),
        key: key.to_string(),
    });
    let removing = async {
        match SnapshotsClient::new(client.channel()).remove(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Ok(()),
            Err(status) => Err(status),
        }
    };
    Ok(client.call_content("Snapshots/Remove", removing).await?)
}

/// Applies one layer into a new snapshot named by its chain ID.
async fn apply(
    client: &CriClient,
    lease: &str,
    snapshotter: &str,
    build: &Build,
) -> Result<(), WholeError> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let key = format!("pinboard-whole {nanos} {}", build.name);
    let mut prepare = namespaced(PrepareSnapshotRequest {
        snapshotter: snapshotter.to_string(),
        key: key.clone(),
        parent: build.parent.clone(),
        ..PrepareSnapshotRequest::default()
    });
    with_lease(&mut prepare, lease);
    let mut snapshots = SnapshotsClient::new(client.channel());
    let mounts = client
        .call_content("Snapshots/Prepare", async {
            snapshots
                .prepare(prepare)
                .await
                .map(tonic::Response::into_inner)
        })
        .await?
        .mounts;
    let applied = async {
        let size = blob_size(client, &build.layer).await?;
        let media_type = layer_media_type(&head(client, &build.layer, 4).await?);
        let request = namespaced(ApplyRequest {
            diff: Some(Descriptor {
                media_type: media_type.to_string(),
                digest: build.layer.clone(),
                size,
                ..Descriptor::default()
            }),
            mounts,
        });
        let mut diff = DiffClient::new(client.channel());
        let applied = client
            .call_within("Diff/Apply", APPLY_WITHIN, async {
                diff.apply(request).await.map(tonic::Response::into_inner)
            })
            .await?
            .applied
            .map(|d| d.digest)
            .unwrap_or_default();
        if chain_id(&build.parent, &applied) != build.name {
            return Err(WholeError::Unpacked {
                layer: build.layer.clone(),
                applied,
                chain: build.name.clone(),
            });
        }
        let mut commit = namespaced(CommitSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            name: build.name.clone(),
            key: key.clone(),
            ..CommitSnapshotRequest::default()
        });
        with_lease(&mut commit, lease);
        let committing = async {
            match SnapshotsClient::new(client.channel()).commit(commit).await {
                Ok(_) => Ok(true),
                // Another image's swap built the same layer first.
                Err(status) if status.code() == Code::AlreadyExists => Ok(false),
                Err(status) => Err(status),
            }
        };
        Ok::<_, WholeError>(client.call_content("Snapshots/Commit", committing).await?)
    };
    match applied.await {
        Ok(true) => Ok(()),
        Ok(false) => remove(client, snapshotter, &key).await,
        Err(e) => {
            if let Err(left) = remove(client, snapshotter, &key).await {
                tracing::warn!("cannot remove the snapshot {key} a failed unpack left: {left}");
            }
            Err(e)
        }
    }
}

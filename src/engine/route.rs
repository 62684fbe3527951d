//! How a node's pulls go, decided once as its rollout starts. On a containerd node whose CRI snapshotter
//! pulls lazily (stargz): whole pulls ([`crate::backend::whole`]), every byte on the node, unless lazily
//! present images are accepted (`--allow-lazy`); lazy pulls then go through the snapshotter's own socket
//! when it serves CRI there (its CRI keychain takes each pull's credentials for the layers it mounts from
//! the registry: a private image pulled through containerd's socket gives it none, and it falls back to a
//! whole pull), else through containerd's. Everywhere else: CRI PullImage on the node's socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::job::NodeJob;
use super::shared::Shared;
use crate::backend::cri::{CriClient, CriEndpoint, CriError, CriErrorKind, DEFAULT_TIMEOUT};
use crate::backend::lazy::containerd::ContainerdFiles;
use crate::backend::whole::WholePull;
use crate::model::lazy::REMOTE_SNAPSHOTTERS;
use crate::model::readiness::LazyImages;
use crate::model::runtime::RuntimeKind;

/// How one node's pulls go.
pub(super) enum Route {
    /// CRI PullImage on the node's socket.
    Cri,
    /// Lazy pulls through the remote snapshotter's CRI socket, until it turns out not to serve CRI.
    Keychain {
        proxy: CriClient,
        serves: AtomicBool,
    },
    Whole(WholePull),
}

impl Route {
    /// Whether the node pulls whole, lazily present images included.
    pub(super) fn whole(&self) -> bool {
        matches!(self, Route::Whole(_))
    }

    /// Pulls `image` lazily (where the snapshotter's socket serves CRI) or through `client`.
    pub(super) async fn pull_cri(
        &self,
        client: &CriClient,
        image: &str,
        auth: Option<crate::backend::proto::cri::AuthConfig>,
        timeout: std::time::Duration,
    ) -> Result<String, CriError> {
        if let Route::Keychain { proxy, serves } = self
            && serves.load(Ordering::Relaxed)
        {
            match proxy
                .pull_image_v1alpha2(image, auth.clone(), timeout)
                .await
            {
                Err(e) if e.kind == CriErrorKind::Unimplemented => {
                    tracing::info!(
                        "{}: the snapshotter's socket does not serve CRI (its CRI keychain is off): pulling \
                         through containerd's, which passes no credentials to it",
                        proxy.endpoint()
                    );
                    serves.store(false, Ordering::Relaxed);
                }
                pulled => return pulled,
            }
        }
        client.pull_image(image, auth, timeout).await
    }
}

/// The route of `job`'s node, which `client` reaches and whose runtime is `runtime`.
pub(super) async fn route(
    client: &CriClient,
    runtime: Option<RuntimeKind>,
    job: &NodeJob,
    shared: &Shared,
) -> Route {
    if runtime != Some(RuntimeKind::Containerd) {
        return Route::Cri;
    }
    let snapshotter = match client.cri_snapshotter().await {
        Ok(Some(snapshotter)) if REMOTE_SNAPSHOTTERS.contains(&snapshotter.as_str()) => snapshotter,
        Ok(_) => return Route::Cri,
        Err(e) => {
            tracing::warn!(
                "{}: cannot ask containerd which snapshotter it uses, so its pulls go through CRI as on any \
                 node: {e}",
                job.node.name
            );
            return Route::Cri;
        }
    };
    if shared.config.lazy_images == LazyImages::NotReady {
        return Route::Whole(WholePull {
            client: client.clone(),
            registry: Arc::clone(&shared.registry),
            snapshotter,
            swapping: Arc::default(),
            kept: Arc::default(),
        });
    }
    let Some(socket) = snapshotter_socket(client, job).await else {
        return Route::Cri;
    };
    match CriClient::connect(&CriEndpoint::Unix(socket), DEFAULT_TIMEOUT).await {
        Ok(proxy) => Route::Keychain {
            proxy,
            serves: AtomicBool::new(true),
        },
        Err(e) => {
            tracing::warn!(
                "{}: lazy pulls go through containerd's socket, as the snapshotter's does not answer: {e}",
                job.node.name
            );
            Route::Cri
        }
    }
}

/// The remote snapshotter's socket, as containerd's config names it (else the one configured for the
/// node), on a node whose files are this machine's.
async fn snapshotter_socket(client: &CriClient, job: &NodeJob) -> Option<PathBuf> {
    if !client.endpoint().is_local() {
        return None;
    }
    let config = job.lazy.containerd_config.clone();
    let named =
        tokio::task::spawn_blocking(move || ContainerdFiles::read(&config).ok()?.snapshotter().1)
            .await
            .ok()
            .flatten();
    Some(named.unwrap_or_else(|| job.lazy.stargz_socket.clone()))
}

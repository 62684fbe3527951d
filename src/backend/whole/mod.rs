//! Whole pulls on a containerd node whose CRI snapshotter pulls lazily (stargz): what "pre-loaded" takes
//! there. A pull through CRI would mount the image's layers from the registry, and stargz-snapshotter 0.12
//! keeps what it fetches of them only while it runs (every start mounts them from the registry again,
//! with an empty cache, and it exits when one cannot be), so the image would still need the link.
//!
//! Instead pinboard does what containerd's own pull does, through containerd's services on the CRI socket,
//! under a lease that keeps what it writes from the garbage collector until an image refers to it:
//!
//! 1. the image's manifest, config and layer blobs into the content store ([`content`]), from the
//!    registry with pinboard's credentials (ingests named as containerd names its own, so byte progress is
//!    seen as for any pull);
//! 2. its layers unpacked into snapshots of the CRI plugin's snapshotter, named by their chain IDs but
//!    prepared without the remote-snapshot labels, so that stargz makes ordinary local ones; remote
//!    snapshots of the same names go first, with whatever stands on them, rebuilt from their blobs
//!    ([`crate::model::whole`], [`unpack`]), one image at a time per node;
//! 3. an image not on the node yet registered with CRI `PullImage`, which finds every blob and snapshot
//!    there and fetches nothing but the manifest's resolution.

mod content;
mod unpack;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::cri::{CriClient, CriError, CriErrorKind};
use super::pins::containerd::namespaced;
use super::proto::containerd_leases::{CreateRequest, DeleteRequest, leases_client::LeasesClient};
use super::proto::cri::AuthConfig;
use super::registry::{Registry, RegistryError};
use super::remote_layers::containerd_holdings;
use crate::model::image::{ImageFacts, config_diff_ids};
use crate::model::lazy::ContainerdHoldings;
use crate::model::served::Source;
use crate::model::whole::{Blocked, Target, chain_ids, swap};

/// How long a lease outlives a pinboard killed mid-pull, or a pull that failed for now: then containerd
/// collects what it held.
const LEASE_EXPIRES: Duration = Duration::from_secs(3600);
/// How long a swap waits for a snapshotter that does not answer before the attempt fails.
const SNAPSHOTTER_PATIENCE: Duration = Duration::from_secs(10);
const SNAPSHOTTER_POLL: Duration = Duration::from_millis(500);

/// Why an image could not be pulled whole.
#[derive(Debug, thiserror::Error)]
pub enum WholeError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("blob {digest} broke off on the way: {cause}")]
    BrokenOff { digest: String, cause: String },
    #[error("containerd closed the write of {reference} before answering")]
    Closed { reference: String },
    #[error("cannot make it whole: {0}")]
    Blocked(#[from] Blocked),
    #[error(
        "layer {layer} unpacked to {applied}, which does not give its snapshot's chain ID {chain}; the blob \
         or the image's config is not what the registry named"
    )]
    Unpacked {
        layer: String,
        applied: String,
        chain: String,
    },
    #[error("{0}")]
    Unserved(String),
    #[error("{reference}: its config lists {diff_ids} layers, its manifest {layers}")]
    Layers {
        reference: String,
        diff_ids: usize,
        layers: usize,
    },
}

impl WholeError {
    fn closed(reference: &str) -> WholeError {
        WholeError::Closed {
            reference: reference.to_string(),
        }
    }

    /// What the failure says about trying again, as for a CRI pull's.
    pub fn kind(&self) -> CriErrorKind {
        match self {
            WholeError::Cri(e) => e.kind,
            WholeError::Registry(e) if e.is_transient() => CriErrorKind::Transient,
            WholeError::Registry(RegistryError::NotFound { .. }) => CriErrorKind::NotFound,
            WholeError::Registry(RegistryError::Unauthorized { .. })
            | WholeError::Registry(RegistryError::NotGranted { .. }) => CriErrorKind::Refused,
            WholeError::Registry(_) | WholeError::Unpacked { .. } | WholeError::Layers { .. } => {
                CriErrorKind::Corrupt
            }
            // Another image's blobs may arrive, a snapshotter may come back: worth another try.
            WholeError::BrokenOff { .. }
            | WholeError::Closed { .. }
            | WholeError::Unserved(_)
            | WholeError::Blocked(Blocked::Shared { .. } | Blocked::Missing { .. }) => {
                CriErrorKind::Transient
            }
            // Not while a container runs from it.
            WholeError::Blocked(Blocked::InUse { .. }) => CriErrorKind::InUse,
        }
    }
}

/// Whole pulls on one node: its CRI client, the registry client with pinboard's credentials, and the CRI
/// plugin's snapshotter. Cheap to clone.
#[derive(Clone)]
pub struct WholePull {
    pub client: CriClient,
    pub registry: Arc<Registry>,
    pub snapshotter: String,
    /// Held while snapshots are removed and built: one image at a time on a node.
    pub swapping: Arc<tokio::sync::Mutex<()>>,
    /// The leases of attempts that failed for now, by image: they keep what those attempts fetched for the
    /// next one, until an attempt ends the pull.
    pub kept: Arc<std::sync::Mutex<HashMap<String, Vec<Lease>>>>,
}

/// How the image gets its CRI record once its blobs and snapshots are there: CRI `PullImage` with this
/// auth and deadline.
pub struct Register {
    pub auth: Option<AuthConfig>,
    pub timeout: Duration,
}

impl WholePull {
    /// Pulls `reference` (resolved as `facts`) whole; `register` when the node has no record of it yet.
    /// Cancelled while its blobs come, it leaves them to the next attempt (the ingest resumes); once they
    /// are all there, the snapshots are swapped to the end whatever happens to the caller, as a swap
    /// stopped halfway would leave the image without its layers. An attempt that fails for now (a
    /// snapshotter or the registry away) keeps what it fetched for the next one: only the bytes still
    /// missing cross the link again.
    pub async fn pull(
        &self,
        reference: &str,
        facts: &ImageFacts,
        register: Option<Register>,
    ) -> Result<(), WholeError> {
        let lease = Lease::create(&self.client).await?;
        let target = match self.fetch(&lease.id, reference, facts).await {
            Ok(target) => target,
            Err(e) => return Err(self.ended(reference, lease, e).await),
        };
        let whole = self.clone();
        let reference = reference.to_string();
        let swapped = tokio::spawn(async move {
            let done = whole.swap(&lease.id, &target).await;
            let registered = match (done, register) {
                (Ok(()), Some(register)) => whole
                    .client
                    .pull_image(&reference, register.auth, register.timeout)
                    .await
                    .map(drop)
                    .map_err(WholeError::from),
                (done, _) => done,
            };
            match registered {
                Ok(()) => {
                    whole.release(&reference, lease).await;
                    Ok(())
                }
                Err(e) => Err(whole.ended(&reference, lease, e).await),
            }
        });
        swapped
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// An attempt at `reference` that failed with `failure`: its lease is kept for the next attempt when
    /// another may succeed, else every lease of the image is released.
    async fn ended(&self, reference: &str, lease: Lease, failure: WholeError) -> WholeError {
        if failure.kind() == CriErrorKind::Transient {
            self.kept_leases()
                .entry(reference.to_string())
                .or_default()
                .push(lease);
        } else {
            self.release(reference, lease).await;
        }
        failure
    }

    /// Releases `lease` and those kept for `reference`: what they held is then kept only by the images
    /// that refer to it.
    async fn release(&self, reference: &str, lease: Lease) {
        let kept = self.kept_leases().remove(reference).unwrap_or_default();
        for lease in kept.into_iter().chain([lease]) {
            lease.release().await;
        }
    }

    fn kept_leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Lease>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The image's manifest, config and layer blobs into the content store, under the lease; what its
    /// layers' snapshots are called.
    async fn fetch(
        &self,
        lease: &str,
        reference: &str,
        facts: &ImageFacts,
    ) -> Result<Target, WholeError> {
        let client = &self.client;
        let source = Source::of(reference).map_err(|e| RegistryError::Invalid {
            reference: reference.to_string(),
            cause: e.to_string(),
        })?;
        let manifest = self
            .registry
            .manifest_bytes(&source, &facts.manifest_digest)
            .await?;
        content::write_bytes(
            client,
            lease,
            "manifest",
            &facts.manifest_digest,
            manifest.body,
        )
        .await?;
        let config = self.registry.config_blob(reference, facts).await?;
        let diff_ids = serde_json::from_slice(&config)
            .map(|config| config_diff_ids(&config))
            .unwrap_or_default();
        content::write_bytes(client, lease, "config", &facts.config_digest, config.into()).await?;
        if diff_ids.len() != facts.layers.len() {
            return Err(WholeError::Layers {
                reference: reference.to_string(),
                diff_ids: diff_ids.len(),
                layers: facts.layers.len(),
            });
        }
        for layer in &facts.layers {
            content::fetch_blob(
                client,
                &self.registry,
                lease,
                &source,
                &layer.digest,
                layer.size,
            )
            .await?;
        }
        Ok(Target {
            chain: chain_ids(&diff_ids),
            layers: facts.layers.iter().map(|l| l.digest.clone()).collect(),
        })
    }

    /// The target's snapshots made local, one image at a time on the node. Another image whose lazily
    /// pulled layers the target shares is made whole with it: its missing blobs are fetched too, from
    /// the repository it was pulled from.
    ///
    /// A snapshotter that does not answer (restarting: containerd reconnects within seconds) is waited
    /// for up to [`SNAPSHOTTER_PATIENCE`], so the attempt goes on rather than failing and starting again.
    async fn swap(&self, lease: &str, target: &Target) -> Result<(), WholeError> {
        let _one_at_a_time = self.swapping.lock().await;
        let deadline = tokio::time::Instant::now() + SNAPSHOTTER_PATIENCE;
        loop {
            let away = match self.swap_once(lease, target).await {
                Err(WholeError::Unserved(why)) => why,
                // Containerd lists no snapshot of an empty snapshotter from it: the first call to reach it
                // tells.
                Err(WholeError::Cri(e))
                    if e.rpc.starts_with("Snapshots/") && e.kind == CriErrorKind::Transient =>
                {
                    format!(
                        "the snapshotter {} does not answer: {}",
                        self.snapshotter, e.cause
                    )
                }
                done => return done,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(WholeError::Unserved(format!(
                    "{away} (waited {}s for it)",
                    SNAPSHOTTER_PATIENCE.as_secs()
                )));
            }
            tokio::time::sleep(SNAPSHOTTER_POLL).await;
        }
    }

    async fn swap_once(&self, lease: &str, target: &Target) -> Result<(), WholeError> {
        let mut fetched = HashSet::new();
        loop {
            let holdings = containerd_holdings(&self.client).await?.ok_or_else(|| {
                WholeError::Unserved("the CRI plugin names no snapshotter".into())
            })?;
            if let Some(why) = holdings.unserved_reason() {
                return Err(WholeError::Unserved(why.to_string()));
            }
            match swap(&holdings, target) {
                Ok(swap) => {
                    return unpack::execute(&self.client, lease, &self.snapshotter, &swap).await;
                }
                Err(Blocked::Shared { config, layer }) if fetched.insert(config.clone()) => {
                    self.fetch_sharing(lease, &holdings, &config)
                        .await
                        .ok_or(Blocked::Shared { config, layer })??;
                }
                Err(blocked) => return Err(blocked.into()),
            }
        }
    }

    /// The missing layer blobs of the image whose config is `config` (on the node, sharing a layer with
    /// the target), from the repository its snapshots say it was pulled from; None when they do not say.
    async fn fetch_sharing(
        &self,
        lease: &str,
        holdings: &ContainerdHoldings,
        config: &str,
    ) -> Option<Result<(), WholeError>> {
        let reference = holdings.reference_of(config)?;
        let source = Source::of(reference).ok()?;
        let manifest = holdings.manifest_of(config)?;
        tracing::info!(
            "{reference} shares lazily pulled layers with an image pulled whole: its missing layers are \
             fetched too, and both made whole"
        );
        let fetching = async {
            let manifest = content::read(&self.client, manifest).await?;
            let layers: Vec<(String, u64)> = serde_json::from_slice::<serde_json::Value>(&manifest)
                .ok()
                .and_then(|m| {
                    m["layers"]
                        .as_array()?
                        .iter()
                        .map(|l| Some((l["digest"].as_str()?.to_string(), l["size"].as_u64()?)))
                        .collect()
                })
                .unwrap_or_default();
            for (digest, size) in layers.iter().filter(|(d, _)| !holdings.has_blob(d)) {
                content::fetch_blob(&self.client, &self.registry, lease, &source, digest, *size)
                    .await?;
            }
            Ok(())
        };
        Some(fetching.await)
    }
}

/// A lease of pinboard's own on one node, expiring by itself should pinboard die holding it.
pub struct Lease {
    client: CriClient,
    id: String,
}

impl Lease {
    async fn create(client: &CriClient) -> Result<Lease, WholeError> {
        let now = SystemTime::now();
        let nanos = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id = format!("pinboard-whole-{nanos}");
        let expires = k8s_openapi::jiff::Timestamp::try_from(now + LEASE_EXPIRES)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let request = namespaced(CreateRequest {
            id: id.clone(),
            labels: [("containerd.io/gc.expire".to_string(), expires)].into(),
        });
        let mut leases = LeasesClient::new(client.channel());
        client
            .call_content("Leases/Create", async {
                leases.create(request).await.map(drop)
            })
            .await?;
        Ok(Lease {
            client: client.clone(),
            id,
        })
    }

    /// Deletes the lease: what it held is then kept only by the images that refer to it.
    async fn release(self) {
        let request = namespaced(DeleteRequest {
            id: self.id.clone(),
            sync: false,
        });
        let mut leases = LeasesClient::new(self.client.channel());
        let deleted = self
            .client
            .call_content("Leases/Delete", async {
                leases.delete(request).await.map(drop)
            })
            .await;
        if let Err(e) = deleted {
            tracing::warn!(
                "cannot delete lease {} (it expires within the hour): {e}",
                self.id
            );
        }
    }
}

/// Makes `request` a call under the lease `lease`.
fn with_lease<T>(request: &mut tonic::Request<T>, lease: &str) {
    request.metadata_mut().insert(
        "containerd-lease",
        lease.parse().expect("an ASCII lease id"),
    );
}

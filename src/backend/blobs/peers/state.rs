//! What a node's peer side shares between the runtime's downloads, its stripe tasks and the requests of
//! other nodes: the blobs it takes, the cache's token that admits other nodes, its serving cap and counts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::taking::Taking;
use super::transport::Transport;
use crate::backend::blobs::serving_cap::ServingCap;
use crate::backend::blobs::upstream::{Locate, Upstream};
use crate::model::cache_token::CacheToken;
use crate::model::pinboard_api::PeerReport;

/// The cache is asked where it is at most this often.
const LOCATE_EVERY: Duration = Duration::from_secs(1);

pub struct PeersState {
    pub node: String,
    /// Where other nodes reach this one, `http://NODE-IP:PORT`, once it listens.
    address: OnceLock<String>,
    pub dir: PathBuf,
    pub transport: Arc<dyn Transport>,
    pub locate: Locate,
    located: tokio::sync::Mutex<Option<(Upstream, Instant)>>,
    /// The cache's token as last seen: other nodes must present it.
    pub token: RwLock<Option<CacheToken>>,
    pub takings: Mutex<HashMap<String, Arc<Taking>>>,
    /// Told whenever a taking is added: a node may be asked for a blob the moment the tracker placed it,
    /// before it started taking it.
    pub added: tokio::sync::Notify,
    /// The node's serving cap (`--serve-rate`) every piece sent books against.
    pub serving_cap: Option<ServingCap>,
    pub served: AtomicU64,
    pub from_peers: AtomicU64,
    pub from_holder: AtomicU64,
    pub refused_pieces: AtomicU64,
    pub refused: AtomicU64,
}

impl PeersState {
    pub fn new(
        (node, dir): (String, PathBuf),
        transport: Arc<dyn Transport>,
        locate: Locate,
        serving_cap: Option<ServingCap>,
    ) -> PeersState {
        PeersState {
            node,
            address: OnceLock::new(),
            dir,
            transport,
            locate,
            located: tokio::sync::Mutex::new(None),
            token: RwLock::new(None),
            takings: Mutex::new(HashMap::new()),
            added: tokio::sync::Notify::new(),
            serving_cap,
            served: AtomicU64::new(0),
            from_peers: AtomicU64::new(0),
            from_holder: AtomicU64::new(0),
            refused_pieces: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Its listener's URL, once it listens.
    pub fn listening_at(&self, url: String) {
        let _ = self.address.set(url);
    }

    /// Where other nodes reach this one.
    pub fn address(&self) -> &str {
        self.address.get().map_or("", String::as_str)
    }

    /// The cache as it is now: the one last found unless it is `failed`, else found again (at most every
    /// second).
    pub async fn upstream(&self, failed: &Upstream) -> Option<Upstream> {
        let mut located = self.located.lock().await;
        match &*located {
            Some((upstream, at)) if upstream != failed || at.elapsed() < LOCATE_EVERY => {
                return Some(upstream.clone());
            }
            _ => {}
        }
        let found = (self.locate)().await?;
        *located = Some((found.clone(), Instant::now()));
        Some(found)
    }

    /// The token other nodes must present, from `upstream`.
    pub fn admit_with(&self, upstream: &Upstream) {
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = Some(upstream.token.clone());
    }

    pub fn taking(&self, digest: &str) -> Option<Arc<Taking>> {
        self.lock().get(digest).cloned()
    }

    /// Takes `taking` in from now on: other nodes may ask for its pieces.
    pub fn add(&self, taking: Arc<Taking>) {
        self.lock().insert(taking.digest.clone(), taking);
        self.added.notify_waiters();
    }

    /// The taking of `digest`, waiting up to `patience` for it to be added.
    pub async fn taking_within(&self, digest: &str, patience: Duration) -> Option<Arc<Taking>> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let added = self.added.notified();
            if let Some(taking) = self.taking(digest) {
                return Some(taking);
            }
            tokio::time::timeout_at(deadline, added).await.ok()?;
        }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Taking>>> {
        self.takings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `bytes` more fit under the serving cap.
    pub async fn may_send(&self, bytes: u64) {
        if let Some(cap) = &self.serving_cap {
            cap.wait_to_send(bytes).await;
        }
    }

    pub fn report(&self) -> PeerReport {
        let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
        PeerReport {
            address: self.address().to_string(),
            served_bytes: count(&self.served),
            from_peers_bytes: count(&self.from_peers),
            from_holder_bytes: count(&self.from_holder),
            refused_pieces: count(&self.refused_pieces),
            refused: count(&self.refused),
        }
    }
}

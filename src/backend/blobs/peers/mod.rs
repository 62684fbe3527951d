//! A node's side of nodes serving each other (`pinboard agent --peer-port`): for each blob the runtime
//! asks its relay for, the node asks the cache holder's tracker for its parents, one per stripe, takes
//! the blob's pieces from them ([`stripes`]), each checked against the hash the holder published before
//! it is kept, and passes the verified prefix on to the runtime as it grows ([`taking`]). Meanwhile it
//! serves the pieces it holds to the nodes below it, on its node's IP, to requests with the cache's token
//! only ([`serve`]), under its serving cap. When the tracker does not place it in time (the holder still
//! fetching a large blob over a slow link, or a holder without a tracker), the relay passes the runtime's
//! request on to the holder as before.
//!
//! Blobs are kept in `--peer-dir`, under the node's name, while they are used, and let go after [`LINGER`]
//! unused; an agent that starts clears its node's directory (what it held is in the runtime; a restarted
//! agent joins anew). Nodes sharing one `--peer-dir` (kubelets on one machine, one hostPath) never touch
//! each other's files.

mod serve;
mod state;
mod stripes;
pub mod taking;
mod tracker_client;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::blobs::cluster_client::cluster_client;
use crate::backend::blobs::serving_cap::ServingCap;
use crate::backend::blobs::upstream::{Locate, Upstream};
use crate::backend::http_server::Server;
use crate::model::peers::wire::Answer;
use crate::model::pinboard_api::PeerReport;
use state::PeersState;
pub use taking::Taking;

/// How long the runtime's request waits for the tracker to place the node before it goes to the holder
/// as before.
const JOIN_PATIENCE: Duration = Duration::from_secs(30);
/// A blob no runtime or node read for this long is let go.
pub const LINGER: Duration = Duration::from_secs(600);

/// Where the node serves its pieces and keeps them.
#[derive(Clone, Debug)]
pub struct PeerSetup {
    pub listen: SocketAddr,
    pub dir: PathBuf,
    pub node: String,
    /// `--serve-rate`: the node's serving cap, shared with its cache's endpoint.
    pub serving_cap: Option<ServingCap>,
}

/// A running peer side; dropping it stops serving.
pub struct Peers {
    state: Arc<PeersState>,
    _server: Server,
    /// One join per blob at a time: the runtime may ask for a blob twice at once.
    joins: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Peers {
    /// Clears the node's directory under `setup.dir` and serves pieces on `setup.listen`; `locate` finds
    /// the cache when its tracker stops answering.
    pub async fn start(setup: PeerSetup, locate: Locate) -> Result<Peers, String> {
        let dir = setup.dir.join(&setup.node);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot use {}: {e}; pass another --peer-dir", dir.display()))?;
        let client =
            cluster_client().map_err(|e| format!("cannot build the peers' HTTP client: {e}"))?;
        let state = Arc::new(PeersState::new(
            (setup.node, dir),
            client,
            locate,
            setup.serving_cap,
        ));
        let serving = Arc::clone(&state);
        let listen = setup.listen;
        let server = Server::start(listen, move |request| {
            serve::handle(Arc::clone(&serving), request)
        })
        .await
        .map_err(|e| format!("cannot serve pieces on {listen}: {e}; choose another --peer-port"))?;
        state.listening_at(server.url());
        tracing::info!(address = server.url(), "serving pieces to the other nodes");
        Ok(Peers {
            state,
            _server: server,
            joins: Mutex::default(),
        })
    }

    /// What it took and served so far; blobs unused for [`LINGER`] are let go first.
    pub fn report(&self) -> PeerReport {
        self.let_go(LINGER);
        self.state.report()
    }

    /// The blob the runtime asked the cache for at `target` (`/v2/<name>/blobs/<digest>?ns=…`), as it is
    /// taken from other nodes: the one under way or held, or a new one once the tracker placed the node.
    /// None when it did not within [`JOIN_PATIENCE`] (the caller goes to the holder as before).
    pub async fn take(&self, upstream: &Upstream, target: &str) -> Option<Arc<Taking>> {
        let digest = target.split('?').next()?.rsplit('/').next()?.to_string();
        self.state.admit_with(upstream);
        let join = {
            let mut joins = self.joins.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(joins.entry(digest.clone()).or_default())
        };
        let _joining = join.lock().await;
        if let Some(taking) = self.state.taking(&digest).filter(|t| t.failure().is_none()) {
            return Some(taking);
        }
        let (cut, parents) = self.placed(upstream, target, &digest).await?;
        let path = self.state.dir.join(digest.replace(':', "-"));
        let taking = match Taking::create(&path, &digest, cut) {
            Ok(taking) => Arc::new(taking),
            Err(e) => {
                tracing::warn!(
                    "cannot take {digest} from the other nodes: {}: {e}",
                    path.display()
                );
                return None;
            }
        };
        self.state.add(Arc::clone(&taking));
        stripes::spawn(
            Arc::clone(&self.state),
            Arc::clone(&taking),
            (upstream.clone(), target.to_string()),
            parents,
        );
        Some(taking)
    }

    /// Asks the tracker until it places the node, for up to [`JOIN_PATIENCE`].
    async fn placed(
        &self,
        upstream: &Upstream,
        target: &str,
        digest: &str,
    ) -> Option<(crate::model::peers::Cut, Vec<crate::model::peers::ParentAt>)> {
        let deadline = Instant::now() + JOIN_PATIENCE;
        let state = &self.state;
        loop {
            let answer = tracker_client::join(
                &state.client,
                upstream,
                target,
                &state.node,
                state.address(),
            )
            .await;
            let wait = match answer {
                Ok(Answer {
                    cut: Some(cut),
                    parents,
                    ..
                }) if cut.is_consistent() && parents.len() == cut.stripes => {
                    return Some((cut, parents));
                }
                Ok(Answer {
                    from_holder: true, ..
                }) => return None,
                Ok(Answer {
                    wait_ms: Some(ms), ..
                }) => Duration::from_millis(ms).min(Duration::from_secs(1)),
                Ok(answer) => {
                    tracing::warn!(digest, "the tracker's answer is not whole: {answer:?}");
                    return None;
                }
                Err(e) => {
                    tracing::info!(
                        digest,
                        "taking the blob from the holder, not the other nodes: {e:?}"
                    );
                    return None;
                }
            };
            if Instant::now() + wait >= deadline {
                tracing::info!(
                    digest,
                    "the tracker did not place this node within {}s: taking the blob from the holder",
                    JOIN_PATIENCE.as_secs()
                );
                return None;
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Lets go of blobs complete or failed and unused for `idle`: their files are removed.
    fn let_go(&self, idle: Duration) {
        let gone: Vec<Arc<Taking>> = {
            let mut takings = self.state.lock();
            let idle: Vec<String> = takings
                .iter()
                .filter(|(_, t)| t.idle_for(idle))
                .map(|(d, _)| d.clone())
                .collect();
            idle.iter().filter_map(|d| takings.remove(d)).collect()
        };
        let mut joins = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        for taking in gone {
            joins.remove(&taking.digest);
            let _ = std::fs::remove_file(taking.path());
        }
    }
}

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

mod http;
mod serve;
mod state;
mod stripes;
pub mod taking;
pub mod transport;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::backend::blobs::cluster_client::cluster_client;
use crate::backend::blobs::serving_cap::ServingCap;
use crate::backend::blobs::upstream::{Locate, Upstream};
use crate::backend::http_server::Server;
use crate::model::peers::wire::{Answer, Cut, ParentAt};
use crate::model::pinboard_api::PeerReport;
pub use serve::Refusal;
use state::PeersState;
pub use taking::Taking;
use transport::{Ask, Transport};

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
    /// None in process (the simulation at scale): other nodes call [`Peers::serve_piece`].
    _server: Option<Server>,
    /// One join per blob at a time: the runtime may ask for a blob twice at once.
    joins: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Peers {
    /// Clears the node's directory under `setup.dir` and serves pieces on `setup.listen`; `locate` finds
    /// the cache when its tracker stops answering.
    pub async fn start(setup: PeerSetup, locate: Locate) -> Result<Peers, String> {
        let client =
            cluster_client().map_err(|e| format!("cannot build the peers' HTTP client: {e}"))?;
        let transport = Arc::new(http::Http { client });
        let mut peers = Peers::in_process(
            (&setup.node, &setup.dir),
            transport,
            locate,
            setup.serving_cap,
        )?;
        let serving = Arc::clone(&peers.state);
        let listen = setup.listen;
        let server = Server::start(listen, move |request| {
            serve::handle(Arc::clone(&serving), request)
        })
        .await
        .map_err(|e| format!("cannot serve pieces on {listen}: {e}; choose another --peer-port"))?;
        peers.state.listening_at(server.url());
        tracing::info!(address = server.url(), "serving pieces to the other nodes");
        peers._server = Some(server);
        Ok(peers)
    }

    /// A peer side that sends through `transport` and serves no listener: other nodes in the same
    /// process reach it by its node's name and call [`Peers::serve_piece`] and [`Peers::serve_cut`].
    pub fn in_process(
        (node, dir): (&str, &Path),
        transport: Arc<dyn Transport>,
        locate: Locate,
        serving_cap: Option<ServingCap>,
    ) -> Result<Peers, String> {
        let dir = dir.join(node);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot use {}: {e}; pass another --peer-dir", dir.display()))?;
        let state = Arc::new(PeersState::new(
            (node.to_string(), dir),
            transport,
            locate,
            serving_cap,
        ));
        Ok(Peers {
            state,
            _server: None,
            joins: Mutex::default(),
        })
    }

    /// Bytes `range` (one piece) of `digest` for another node, as the HTTP listener serves them.
    pub async fn serve_piece(&self, digest: &str, range: Range<u64>) -> Result<Bytes, Refusal> {
        serve::piece(&self.state, digest, |_| Some(range))
            .await
            .map(|(bytes, _)| bytes)
    }

    /// The cut of `digest` for another node, as the HTTP listener serves it.
    pub async fn serve_cut(&self, digest: &str) -> Result<Cut, Refusal> {
        serve::cut(&self.state, digest).await
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

    /// Asks the tracker until it places the node, for up to [`JOIN_PATIENCE`], and takes the cut it names.
    async fn placed(
        &self,
        upstream: &Upstream,
        target: &str,
        digest: &str,
    ) -> Option<(Cut, Vec<ParentAt>)> {
        let deadline = Instant::now() + JOIN_PATIENCE;
        let state = &self.state;
        loop {
            let ask = Ask {
                upstream,
                node: &state.node,
            };
            let answer = state.transport.join(ask, target, state.address()).await;
            let wait = match answer {
                Ok(Answer {
                    cut_digest,
                    cut,
                    parents,
                    ..
                }) if cut_digest.is_some() || cut.is_some() => {
                    let cut = match (cut, &cut_digest) {
                        (Some(cut), Some(named)) => Some(cut).filter(|cut| cut.digest() == *named),
                        // A holder from before cuts were named by their digest (agents upgraded
                        // one node at a time) sends every node the cut whole.
                        (Some(cut), None) => Some(cut),
                        (None, Some(named)) => {
                            self.cut_from(upstream, digest, &parents, named).await
                        }
                        (None, None) => None,
                    };
                    return match cut {
                        Some(cut) if cut.is_consistent() && parents.len() == cut.stripes => {
                            Some((cut, parents))
                        }
                        _ => {
                            tracing::warn!(
                                digest,
                                cut = cut_digest,
                                "no parent gave the cut the tracker named: taking the blob from the holder"
                            );
                            None
                        }
                    };
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

    /// The cut of `digest` named `cut_digest`, from the first of `parents` that gives one matching it. A
    /// parent placed in the same batch may not have it yet: it is asked again while it says `not-yet`.
    async fn cut_from(
        &self,
        upstream: &Upstream,
        digest: &str,
        parents: &[ParentAt],
        cut_digest: &str,
    ) -> Option<Cut> {
        for parent in parents
            .iter()
            .filter(|p| matches!(p, ParentAt::Peer { .. }))
        {
            let deadline = Instant::now() + JOIN_PATIENCE;
            loop {
                match self.state.transport.cut(upstream, parent, digest).await {
                    Ok(cut) if cut.digest() == cut_digest => return Some(cut),
                    Ok(_) => {
                        tracing::warn!(
                            peer = parent.name(),
                            "a parent's cut is not the one the tracker named"
                        );
                        break;
                    }
                    Err(transport::Missed::NotYet) if Instant::now() < deadline => continue,
                    Err(e) => {
                        tracing::info!(peer = parent.name(), "no cut from a parent: {e:?}");
                        break;
                    }
                }
            }
        }
        None
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt as _;
    use futures::StreamExt as _;
    use futures::future::BoxFuture;

    use super::transport::{Missed, Unanswered};
    use super::*;
    use crate::model::cache_token::CacheToken;

    /// A tracker that places the node under one parent for every stripe, naming the cut by its digest,
    /// and a parent that sends the cut (tampered with when `tampered`) and the blob's pieces.
    struct OneParent {
        blob: Bytes,
        tampered: bool,
        done: AtomicBool,
    }

    impl OneParent {
        fn parent() -> ParentAt {
            ParentAt::Peer {
                node: "n2".into(),
                address: "n2".into(),
            }
        }
    }

    impl Transport for OneParent {
        fn join<'a>(
            &'a self,
            _: Ask<'a>,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
            let cut = Cut::of(&self.blob);
            let answer = Answer {
                cut_digest: Some(cut.digest()),
                parents: vec![OneParent::parent(); cut.stripes],
                ..Answer::default()
            };
            async move { Ok(answer) }.boxed()
        }

        fn lost<'a>(
            &'a self,
            _: Ask<'a>,
            _: (&'a str, usize),
            _: &'a str,
            _: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
            async { Err(Unanswered::Failed("no other parent".into())) }.boxed()
        }

        fn done<'a>(&'a self, _: Ask<'a>, _: &'a str) -> BoxFuture<'a, ()> {
            self.done.store(true, Ordering::Relaxed);
            async {}.boxed()
        }

        fn piece<'a>(
            &'a self,
            _: &'a Upstream,
            _: &'a ParentAt,
            _: (&'a str, &'a str),
            range: Range<u64>,
        ) -> BoxFuture<'a, Result<Bytes, Missed>> {
            let piece = self.blob.slice(range.start as usize..range.end as usize);
            async move { Ok(piece) }.boxed()
        }

        fn cut<'a>(
            &'a self,
            _: &'a Upstream,
            _: &'a ParentAt,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Cut, Missed>> {
            let mut cut = Cut::of(&self.blob);
            if self.tampered {
                cut.hashes[1] = cut.hashes[0].clone();
            }
            async move { Ok(cut) }.boxed()
        }
    }

    #[tokio::test]
    async fn a_cut_from_a_parent_is_taken_only_when_it_is_the_one_the_tracker_named() {
        let dir = tempfile::tempdir().unwrap();
        let blob: Bytes = (0..3u32 << 20)
            .map(|i| (i % 241) as u8)
            .collect::<Vec<u8>>()
            .into();
        let upstream = Upstream {
            address: "http://holder".into(),
            token: CacheToken::new("t0ken").unwrap(),
        };
        let located = upstream.clone();
        let locate: Locate = Arc::new(move || {
            let found = located.clone();
            async move { Some(found) }.boxed()
        });
        let target = "/v2/big/blobs/sha256:b?ns=registry.lab";
        for tampered in [true, false] {
            let transport = Arc::new(OneParent {
                blob: blob.clone(),
                tampered,
                done: AtomicBool::new(false),
            });
            let node = format!("n1-{tampered}");
            let peers = Peers::in_process(
                (&node, dir.path()),
                Arc::clone(&transport) as Arc<dyn Transport>,
                Arc::clone(&locate),
                None,
            )
            .unwrap();
            let taking = peers.take(&upstream, target).await;
            if tampered {
                // The holder's blob endpoint, as without peers: no piece checked against a false cut.
                assert!(taking.is_none(), "a cut not the tracker's is refused");
                continue;
            }
            let taking = taking.expect("taken by the tracker's cut");
            assert_eq!(taking.cut, Cut::of(&blob));
            let read: Vec<Bytes> = taking
                .prefix_stream(0..blob.len() as u64)
                .map(Result::unwrap)
                .collect()
                .await;
            assert!(read.concat() == blob, "the blob, whole and in order");
            // Served on to other nodes, the cut as taken.
            assert_eq!(peers.serve_cut("sha256:b").await.unwrap(), taking.cut);
            let range = taking.cut.geometry().range(1);
            let piece = peers.serve_piece("sha256:b", range.clone()).await.unwrap();
            assert!(piece == blob.slice(range.start as usize..range.end as usize));
            let heard = async {
                while !transport.done.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), heard)
                .await
                .expect("the tracker heard the blob is held");
        }
    }
}

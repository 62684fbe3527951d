//! The cache holder's tracker: who takes which stripe of a blob from whom ([`Swarm`], one per blob), with
//! the blob's [`Cut`] (each piece's hash) made once from the holder's verified copy. The holder's endpoint
//! answers the nodes' relays with it ([`crate::model::peers::wire`]); it keeps who was dropped for
//! serving corrupt pieces, and why, for its report.
//!
//! A node's first ask for a blob the holder does not hold yet starts its download (once over the
//! registry link, under the link's budget) and is told to ask again; the cut is made as the complete blob
//! is read back, so no piece hash comes from bytes the digest did not vouch for.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;

use crate::backend::blobs::cache::{BlobCache, BlobError};
use crate::model::peers::wire::{Answer, Cut, Cutter, HOLDER, ParentAt};
use crate::model::peers::{Loss, Parent, Placement, Swarm};
use crate::model::pinboard_api::DroppedPeer;
use crate::model::served::Source;

/// How soon a node asks again while the holder fetches and cuts the blob.
const CUTTING_RETRY: Duration = Duration::from_millis(250);
/// How long a blob the holder failed to fetch is answered with that failure before it is tried again.
const FAILED_FOR: Duration = Duration::from_secs(10);

/// What the tracker answers: a status and a JSON body, or why not.
pub type Reply = Result<Answer, (http::StatusCode, String)>;

/// A node asking for its parents for one blob.
pub struct Join<'a> {
    pub source: &'a Source,
    pub digest: &'a str,
    pub size: u64,
    pub node: &'a str,
    /// Where the node serves its pieces.
    pub address: &'a str,
}

/// A node's report that it lost its parent for a stripe.
pub struct Lost<'a> {
    pub digest: &'a str,
    pub node: &'a str,
    pub stripe: usize,
    /// The parent lost: a node's name, or [`HOLDER`].
    pub from: &'a str,
    /// None: gone; Some: the corrupt piece's reason.
    pub corrupt: Option<&'a str>,
}

/// Shared by the endpoint's requests; clones share one state.
#[derive(Clone, Default)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    swarms: HashMap<String, Swarm>,
    cuts: HashMap<String, Cutting>,
    /// Every node's peer URL, as it last said.
    addresses: HashMap<String, String>,
    /// Nodes that asked for any blob, and how many nodes have agents: a batch waits for the larger.
    nodes: BTreeSet<String>,
    expected: usize,
    dropped: Vec<DroppedPeer>,
}

enum Cutting {
    Under,
    Done(Arc<Cut>),
    Failed(String, Instant),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackerStats {
    /// Nodes that asked for parents.
    pub nodes: u64,
    /// Blobs with a swarm.
    pub blobs: u64,
}

impl Tracker {
    /// `join.node`'s parents for `join.digest`: placed, told to wait (its batch gathers, or the holder is
    /// still fetching the blob), or the holder's failure to fetch it.
    pub fn join(&self, cache: &Arc<BlobCache>, join: &Join<'_>) -> Reply {
        if !Answer::shared(join.size) {
            return Ok(Answer {
                from_holder: true,
                ..Answer::default()
            });
        }
        let now = Instant::now();
        let mut state = self.lock();
        let cut = match state.cuts.get(join.digest) {
            Some(Cutting::Done(cut)) => Arc::clone(cut),
            Some(Cutting::Under) => return Ok(wait(CUTTING_RETRY)),
            Some(Cutting::Failed(why, at)) if at.elapsed() < FAILED_FOR => {
                return Err((http::StatusCode::BAD_GATEWAY, why.clone()));
            }
            _ => {
                state.cuts.insert(join.digest.to_string(), Cutting::Under);
                drop(state);
                self.start_cut(cache, join);
                return Ok(wait(CUTTING_RETRY));
            }
        };
        state
            .addresses
            .insert(join.node.to_string(), join.address.to_string());
        state.nodes.insert(join.node.to_string());
        let expected = state.nodes.len().max(state.expected);
        let swarm = state
            .swarms
            .entry(join.digest.to_string())
            .or_insert_with(|| Swarm::new(cut.stripes, expected));
        swarm.expect(expected);
        match swarm.join(join.node, now) {
            Placement::Wait(at) => Ok(wait(at.saturating_duration_since(now))),
            Placement::Placed(parents) => Ok(Answer {
                cut: Some(Cut::clone(&cut)),
                parents: parents.iter().map(|p| state.parent_at(p)).collect(),
                ..Answer::default()
            }),
        }
    }

    /// Another parent for the stripe `lost.node` lost; the lost one is marked gone, or dropped and named.
    pub fn lost(&self, lost: &Lost<'_>) -> Reply {
        let mut state = self.lock();
        let from = match lost.from {
            HOLDER => Parent::Holder,
            node => Parent::Peer(node.to_string()),
        };
        let why = match lost.corrupt {
            Some(reason) => Loss::Corrupt(reason.to_string()),
            None => Loss::Gone,
        };
        let Some(swarm) = state.swarms.get_mut(lost.digest) else {
            return Err(not_placed(lost.node));
        };
        let Some(next) = swarm.lost(lost.node, lost.stripe, &from, why) else {
            return Err(not_placed(lost.node));
        };
        if let (Some(reason), Parent::Peer(peer)) = (lost.corrupt, &from) {
            tracing::warn!(
                peer,
                by = lost.node,
                digest = lost.digest,
                "dropped a peer that served a corrupt piece: {reason}"
            );
            let dropped = DroppedPeer {
                node: peer.clone(),
                digest: lost.digest.to_string(),
                reason: format!("{} refused it: {reason}", lost.node),
            };
            if !state.dropped.iter().any(|d| d.node == dropped.node) {
                state.dropped.push(dropped);
            }
        }
        Ok(Answer {
            parents: vec![state.parent_at(&next)],
            ..Answer::default()
        })
    }

    /// How many nodes may ask for a blob at about the same time (the nodes with a live agent): a batch
    /// closes once that many asked, or at its window.
    pub fn expect(&self, nodes: usize) {
        self.lock().expected = nodes;
    }

    /// `node` holds the whole of `digest`.
    pub fn done(&self, digest: &str, node: &str) {
        if let Some(swarm) = self.lock().swarms.get_mut(digest) {
            swarm.done(node);
        }
    }

    /// Forgets the swarms and cuts of the blobs `keep` refuses (the sets no longer name them).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut state = self.lock();
        state.swarms.retain(|digest, _| keep(digest));
        state.cuts.retain(|digest, _| keep(digest));
    }

    /// The peers dropped for serving corrupt pieces, each once, with why.
    pub fn dropped(&self) -> Vec<DroppedPeer> {
        self.lock().dropped.clone()
    }

    pub fn stats(&self) -> TrackerStats {
        let state = self.lock();
        TrackerStats {
            nodes: state.nodes.len() as u64,
            blobs: state.swarms.len() as u64,
        }
    }

    /// Fetches the blob into the cache (if it is not there) and cuts it, on a task of its own.
    fn start_cut(&self, cache: &Arc<BlobCache>, join: &Join<'_>) {
        let cache = Arc::clone(cache);
        let (source, digest, size) = (join.source.clone(), join.digest.to_string(), join.size);
        let done = tokio::spawn(async move { cut(&cache, &source, &digest, size).await });
        let digest = join.digest.to_string();
        let tracker = self.clone();
        tokio::spawn(async move {
            let outcome = match done.await {
                Ok(Ok(cut)) => Cutting::Done(Arc::new(cut)),
                Ok(Err(e)) => Cutting::Failed(e.to_string(), Instant::now()),
                Err(e) => Cutting::Failed(e.to_string(), Instant::now()),
            };
            match &outcome {
                Cutting::Failed(why, _) => {
                    tracing::warn!(digest, "the tracker cannot cut a blob: {why}");
                }
                _ => tracing::info!(digest, "the tracker cut a blob for the nodes"),
            }
            tracker.lock().cuts.insert(digest, outcome);
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn parent_at(&self, parent: &Parent) -> ParentAt {
        match parent {
            Parent::Holder => ParentAt::Holder,
            Parent::Peer(node) => ParentAt::Peer {
                node: node.clone(),
                address: self.addresses.get(node).cloned().unwrap_or_default(),
            },
        }
    }
}

/// Makes `digest` complete in `cache` and cuts it as it is read back.
async fn cut(
    cache: &Arc<BlobCache>,
    source: &Source,
    digest: &str,
    size: u64,
) -> Result<Cut, BlobError> {
    cache.fetch(source, digest, size).await?;
    let mut stream = cache.blob(source, digest, size)?.stream(0..size);
    let mut cutter = Cutter::new(size);
    while let Some(chunk) = stream.next().await {
        cutter.update(&chunk?);
    }
    Ok(cutter.finish())
}

fn wait(after: Duration) -> Answer {
    Answer {
        wait_ms: Some(after.as_millis().max(1) as u64),
        ..Answer::default()
    }
}

fn not_placed(node: &str) -> (http::StatusCode, String) {
    (
        http::StatusCode::CONFLICT,
        format!("{node} is not placed in this blob's swarm: ask for parents again"),
    )
}

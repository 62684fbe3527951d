//! The cache holder's tracker: who takes which stripe of a blob from whom ([`Swarm`], one per blob), with
//! the blob's [`Cut`] (each piece's hash) made once from the holder's verified copy. The holder's endpoint
//! answers the nodes' relays with it ([`crate::model::peers::wire`]); it keeps who was dropped for
//! serving corrupt pieces, and why, for its report.
//!
//! A node's first ask for a blob the holder does not hold yet starts its download (once over the
//! registry link, under the link's budget) and is told to ask again; the cut is made as the complete blob
//! is read back, so no piece hash comes from bytes the digest did not vouch for. A placed node hears the
//! cut's digest; the cut itself goes only to the nodes the holder serves a stripe (the others take it
//! from a parent), so what the tracker sends stays small whatever the number of nodes.
//!
//! Its clock is tokio's, so the simulation at scale (`benches/fan_out_scale`) runs it in virtual time.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};

use crate::backend::blobs::cache::{BlobCache, BlobError};
use crate::model::peers::wire::{Answer, Cut, Cutter, HOLDER, ParentAt};
use crate::model::peers::{Loss, Parent, Placement, Swarm};
use crate::model::pinboard_api::DroppedPeer;
use crate::model::served::Source;

/// How soon a node asks again while the holder fetches and cuts the blob (after its ask was held for
/// [`CUT_PATIENCE`]).
const CUTTING_RETRY: Duration = Duration::from_millis(250);
/// How long an ask for a blob the holder is still cutting is held before it is answered "ask again": the
/// nodes wait on the cut, not in a loop of asks (10,000 waiting asks polled every 250 ms would keep a
/// tracker at 100 µs an answer busy four times over).
const CUT_PATIENCE: Duration = Duration::from_secs(5);
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
    /// Told whenever a cut ends, made or failed.
    cut_ended: Arc<tokio::sync::Notify>,
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
    Done(Arc<Cut>, Arc<str>),
    Failed(String, Instant),
}

/// Where the tracker's cuts come from: in the product, the holder's blob cache, made whole over the
/// registry link and cut as it is read back.
pub trait Cuts: Send + Sync + 'static {
    /// The cut of `digest`, once the holder holds it whole.
    fn cut(
        &self,
        source: &Source,
        digest: &str,
        size: u64,
    ) -> BoxFuture<'static, Result<Cut, String>>;
}

impl Cuts for Arc<BlobCache> {
    fn cut(
        &self,
        source: &Source,
        digest: &str,
        size: u64,
    ) -> BoxFuture<'static, Result<Cut, String>> {
        let (cache, source, digest) = (Arc::clone(self), source.clone(), digest.to_string());
        async move {
            cut(&cache, &source, &digest, size)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackerStats {
    /// Nodes that asked for parents.
    pub nodes: u64,
    /// Blobs with a swarm.
    pub blobs: u64,
}

impl Tracker {
    /// [`Tracker::join`], an ask for a blob the holder is still cutting held until the cut ends (at most
    /// [`CUT_PATIENCE`]): what the endpoint answers.
    pub async fn join_when_cut(&self, cuts: &impl Cuts, join: &Join<'_>) -> Reply {
        let deadline = tokio::time::Instant::now() + CUT_PATIENCE;
        loop {
            let ended = self.cut_ended.notified();
            let reply = self.join(cuts, join);
            let cutting = matches!(self.lock().cuts.get(join.digest), Some(Cutting::Under));
            if !cutting || tokio::time::timeout_at(deadline, ended).await.is_err() {
                return reply;
            }
        }
    }

    /// `join.node`'s parents for `join.digest`: placed, told to wait (its batch gathers, or the holder is
    /// still fetching the blob), or the holder's failure to fetch it.
    fn join(&self, cuts: &impl Cuts, join: &Join<'_>) -> Reply {
        if !Answer::shared(join.size) {
            return Ok(Answer {
                from_holder: true,
                ..Answer::default()
            });
        }
        let now = now();
        let mut state = self.lock();
        let (cut, cut_digest) = match state.cuts.get(join.digest) {
            Some(Cutting::Done(cut, digest)) => (Arc::clone(cut), Arc::clone(digest)),
            Some(Cutting::Under) => return Ok(wait(CUTTING_RETRY)),
            Some(Cutting::Failed(why, at)) if now.duration_since(*at) < FAILED_FOR => {
                return Err((http::StatusCode::BAD_GATEWAY, why.clone()));
            }
            _ => {
                state.cuts.insert(join.digest.to_string(), Cutting::Under);
                drop(state);
                self.start_cut(cuts, join);
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
                cut_digest: Some(cut_digest.to_string()),
                cut: parents.contains(&Parent::Holder).then(|| Cut::clone(&cut)),
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
    fn start_cut(&self, cuts: &impl Cuts, join: &Join<'_>) {
        let done = tokio::spawn(cuts.cut(join.source, join.digest, join.size));
        let digest = join.digest.to_string();
        let tracker = self.clone();
        tokio::spawn(async move {
            let outcome = match done.await {
                Ok(Ok(cut)) => {
                    let digest = cut.digest().into();
                    Cutting::Done(Arc::new(cut), digest)
                }
                Ok(Err(why)) => Cutting::Failed(why, now()),
                Err(e) => Cutting::Failed(e.to_string(), now()),
            };
            match &outcome {
                Cutting::Failed(why, _) => {
                    tracing::warn!(digest, "the tracker cannot cut a blob: {why}");
                }
                _ => tracing::info!(digest, "the tracker cut a blob for the nodes"),
            }
            tracker.lock().cuts.insert(digest, outcome);
            tracker.cut_ended.notify_waiters();
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

/// Tokio's clock: the product's, or the simulation's virtual one.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The holder's cut of one blob, ready two seconds after it is asked for.
    struct SlowCut(Cut);

    impl Cuts for SlowCut {
        fn cut(&self, _: &Source, _: &str, _: u64) -> BoxFuture<'static, Result<Cut, String>> {
            let cut = self.0.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok(cut)
            }
            .boxed()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn asks_wait_on_the_cut_and_only_the_nodes_the_holder_serves_get_it_whole() {
        let blob: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
        let (cuts, size) = (SlowCut(Cut::of(&blob)), blob.len() as u64);
        let source = Source {
            registry: "registry.lab:5000".into(),
            repository: "big".into(),
        };
        let tracker = Tracker::default();
        tracker.expect(12);
        let started = tokio::time::Instant::now();
        let node = |i: usize| {
            let (tracker, cuts, source) = (&tracker, &cuts, &source);
            async move {
                let name = format!("n{i}");
                let join = Join {
                    source,
                    digest: "sha256:big",
                    size,
                    node: &name,
                    address: "",
                };
                let mut asks = 0;
                loop {
                    asks += 1;
                    let answer = tracker.join_when_cut(cuts, &join).await.unwrap();
                    match answer.wait_ms {
                        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                        None => return (answer, asks, started.elapsed()),
                    }
                }
            }
        };
        let placed = futures::future::join_all((0..12).map(node)).await;
        let digest = cuts.0.digest();
        let mut whole = 0;
        for (answer, asks, after) in &placed {
            assert_eq!(answer.cut_digest.as_deref(), Some(digest.as_str()));
            assert!(*after >= Duration::from_secs(2), "placed only once cut");
            // Held while the holder cut the blob, not asking in a loop: the first ask, then the batch's.
            assert!(*asks <= 3, "{asks} asks");
            let served_by_holder = answer.parents.contains(&ParentAt::Holder);
            assert_eq!(answer.cut.is_some(), served_by_holder, "{answer:?}");
            if let Some(cut) = &answer.cut {
                assert_eq!(*cut, cuts.0);
                whole += 1;
            }
        }
        assert_eq!(
            whole, 4,
            "the holder serves each stripe's tree its first member"
        );
    }
}

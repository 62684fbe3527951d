//! The simulation: N virtual nodes, each running pinboard's own peer side ([`Peers::in_process`]: joining,
//! taking the cut from a parent, the stripe tasks that ask, verify, keep and replace, [`Taking`] and the
//! code that serves pieces), and the holder's own [`Tracker`], in tokio's virtual time. Only HTTP is
//! replaced, by an in-process [`Transport`] that charges each request a round trip, each tracker request
//! the tracker's time (one at a time), and each piece its sender's and its receiver's cap.
//!
//! Bytes are scaled: every blob keeps its real number of pieces, with 1/[`SCALE`] of their bytes (and every
//! rate scaled alike), so the cut, its hashes and every answer of the tracker are as large as for the
//! real blob while a node's pieces fit in a few KB. Figures are reported in real bytes.
//!
//! - The registry link: the holder fetches each blob over it (shared between blobs), verifies and cuts it
//!   (`hash_rate`) before the tracker places anyone.
//! - The runtime: each node's agent starts at its own moment (spread over `start_spread`) and its runtime
//!   asks for every blob of the set at once (as containerd's concurrent layer downloads), each reading
//!   the verified prefix as it grows; what the peers fail to give comes from the holder, as the relay does.
//! - Faults: one node in `lost_every` (100) is lost at a random moment of the transfer, as a crashed
//!   agent is: every exchange with it is reset at once, and it reaches no one any more.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::{BoxFuture, FutureExt as _};
use pinboard::backend::blobs::peers::transport::{Ask, Missed, Transport, Unanswered};
use pinboard::backend::blobs::peers::{Peers, Refusal};
use pinboard::backend::blobs::tracker::{Cuts, Join, Lost, Tracker};
use pinboard::backend::blobs::{ServingCap, Upstream};
use pinboard::model::cache_token::CacheToken;
use pinboard::model::pacing::Pace;
use pinboard::model::peers::Geometry;
use pinboard::model::peers::wire::{Answer, Cut, Cutter, ParentAt};
use pinboard::model::served::Source;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::counting::live_bytes;

/// Real bytes per simulated byte: a 2 MiB piece (a 1.5 GB blob's) is 16 bytes here.
pub const SCALE: u64 = 1 << 17;
/// The tracker's time is booked in microseconds.
const MICROS: u64 = 1_000_000;
/// What the holder's fallback downloads book at a time, in real bytes.
const HOLDER_CHUNK: u64 = 64 << 20;

/// What is simulated.
#[derive(Clone, Debug)]
pub struct Setup {
    pub nodes: usize,
    /// Real bytes of each blob of the set.
    pub blobs: Vec<u64>,
    /// Bytes per second each node (and the holder) sends at most, and receives at most.
    pub cap: f64,
    /// Bytes per second of the holder's registry link.
    pub link: f64,
    /// Nodes start at uniformly random moments in `0..start_spread`.
    pub start_spread: Duration,
    pub rtt: Duration,
    /// The tracker's time per request.
    pub tracker_cost: Duration,
    /// Bytes per second a node (and the holder) verifies at.
    pub hash_rate: f64,
    /// One node in this many is lost mid-transfer (0: none).
    pub lost_every: usize,
    /// Nodes serve each other; false: every node takes everything from the holder, as without peers.
    pub peers: bool,
    pub seed: u64,
}

/// What came of it, in real bytes.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Per node not lost: from its agent's start until its runtime read every blob.
    pub times: Vec<Duration>,
    /// Per node not lost: bytes it sent to other nodes.
    pub served: Vec<u64>,
    /// Nodes lost mid-transfer.
    pub lost: usize,
    /// Blobs a runtime took (in part) from the holder because the peers did not give them.
    pub fell_back: u64,
    /// From the first agent's start until the tracker placed a node: the set over the registry link and
    /// cut.
    pub first_placed: Duration,
    /// Pieces the holder's blob endpoint sent.
    pub holder_pieces: u64,
    pub tracker_requests: u64,
    /// The tracker's answers, as JSON on the wire.
    pub tracker_bytes: u64,
    /// Cuts nodes took from their parents, as JSON on the wire.
    pub cuts_from_peers: u64,
    /// What the tracker holds at the end (its swarms, cuts and nodes): live heap bytes freed with it.
    pub tracker_memory: u64,
    pub refused_pieces: u64,
}

/// Everything the in-process transport reaches.
struct World {
    setup: Setup,
    tracker: RwLock<Option<Tracker>>,
    /// The tracker's time, booked per request: requests are answered one at a time.
    tracker_time: Mutex<Pace>,
    cuts: SimCuts,
    /// Every node's peer side, by index; emptied at the end (each holds this world through its transport).
    peers: RwLock<Vec<Arc<Peers>>>,
    /// Per node: lost (its agent gone, its connections reset).
    lost: Vec<watch::Sender<bool>>,
    receiving: Vec<Mutex<Pace>>,
    holder_sending: ServingCap,
    tracker_requests: AtomicU64,
    tracker_bytes: AtomicU64,
    cuts_from_peers: AtomicU64,
    holder_pieces: AtomicU64,
    /// When the tracker placed its first node: the set is over the link and cut.
    first_placed: Mutex<Option<Instant>>,
}

/// A blob's simulated bytes: a pattern of its own.
fn content(blob: usize, size: u64) -> Bytes {
    (0..size)
        .map(|i| (i.wrapping_mul(31) as u8) ^ (blob as u8))
        .collect::<Vec<u8>>()
        .into()
}

/// The holder's cuts: each blob over the shared registry link, then verified and cut as the real blob is
/// (its number of pieces and stripes), its pieces 1/[`SCALE`] of the real ones.
struct SimCuts {
    blobs: HashMap<String, Bytes>,
    link: ServingCap,
    hash_rate: f64,
}

impl Cuts for SimCuts {
    fn cut(&self, _: &Source, digest: &str, size: u64) -> BoxFuture<'static, Result<Cut, String>> {
        let (link, hash_rate) = (self.link.clone(), self.hash_rate);
        let blob = self.blobs.get(digest).cloned();
        async move {
            let blob = blob.ok_or("not a blob of the set")?;
            let mut left = size;
            while left > 0 {
                let chunk = left.min(HOLDER_CHUNK);
                link.wait_to_send(chunk.div_ceil(SCALE)).await;
                left -= chunk;
            }
            sleep(Duration::from_secs_f64(size as f64 / hash_rate)).await;
            let real = Geometry::of(size);
            let geometry = Geometry::with(blob.len() as u64, real.piece_size / SCALE, real.stripes);
            let mut cutter = Cutter::with(geometry);
            cutter.update(&blob);
            Ok(cutter.finish())
        }
        .boxed()
    }
}

fn digest_of(blob: usize) -> String {
    format!("sha256:{blob:064x}")
}

fn target_of(blob: usize) -> String {
    format!("/v2/sim/blobs/{}?ns=registry.sim", digest_of(blob))
}

fn name_of(node: usize) -> String {
    format!("n{node:05}")
}

fn index_of(name: &str) -> usize {
    name[1..].parse().expect("a simulated node's name")
}

/// Scaled bytes per second.
fn scaled(rate: f64) -> u64 {
    (rate / SCALE as f64).round() as u64
}

impl World {
    fn tracker(&self) -> Tracker {
        self.tracker.read().unwrap().clone().expect("the tracker")
    }

    /// `node`'s peer side; None once the simulation ended.
    fn peers(&self, node: usize) -> Option<Arc<Peers>> {
        self.peers.read().unwrap().get(node).cloned()
    }

    fn is_lost(&self, node: usize) -> bool {
        *self.lost[node].borrow()
    }

    /// Ends when `node` is lost.
    async fn until_lost(&self, node: usize) {
        if self.lost[node].subscribe().wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// `exchange` between `node` and the peer `from`, cut off (as a reset connection) the moment either
    /// is lost.
    async fn unless_lost<T>(
        &self,
        (node, from): (usize, Option<usize>),
        exchange: impl Future<Output = Result<T, Missed>>,
    ) -> Result<T, Missed> {
        let peer_lost = async {
            match from {
                Some(from) => self.until_lost(from).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = exchange => done,
            _ = self.until_lost(node) => Err(Missed::Gone("this node is cut off".into())),
            _ = peer_lost => Err(Missed::Gone("the parent's connection was reset".into())),
        }
    }

    /// One request of the tracker, from `node`: half a round trip each way, the tracker's time in turn
    /// (booked on one clock: it answers one request at a time), the answer as JSON on the wire.
    async fn ask(
        &self,
        node: &str,
        call: impl AsyncFnOnce(&Tracker) -> Result<Answer, (http::StatusCode, String)>,
    ) -> Result<Answer, Unanswered> {
        if self.is_lost(index_of(node)) {
            return Err(Unanswered::Failed("this node is cut off".into()));
        }
        sleep(self.setup.rtt / 2).await;
        // Answered (an ask for a blob under cut once the cut ends), then sent when the tracker's turn
        // for it comes.
        let reply = call(&self.tracker()).await;
        let cost = self.setup.tracker_cost.as_micros() as u64;
        let turn = self
            .tracker_time
            .lock()
            .unwrap()
            .book(cost, Instant::now().into_std());
        sleep_until(Instant::from_std(turn) + self.setup.rtt / 2).await;
        self.tracker_requests.fetch_add(1, Ordering::Relaxed);
        match reply {
            Ok(answer) => {
                if answer.cut_digest.is_some() {
                    let mut first = self.first_placed.lock().unwrap();
                    first.get_or_insert_with(Instant::now);
                }
                let json = serde_json::to_vec(&answer).expect("an answer serializes");
                self.tracker_bytes
                    .fetch_add(json.len() as u64, Ordering::Relaxed);
                Ok(serde_json::from_slice(&json).expect("an answer reads back"))
            }
            Err((http::StatusCode::CONFLICT, _)) => Err(Unanswered::NotPlaced),
            Err((status, why)) => Err(Unanswered::Failed(format!("{status}: {why}"))),
        }
    }

    /// `bytes` arrive at `node` no sooner than its receiving cap allows from `asked`, and are verified.
    async fn receive(&self, node: usize, bytes: u64, asked: Instant) {
        let booked = self.receiving[node]
            .lock()
            .unwrap()
            .book(bytes, asked.into_std());
        let verified = Duration::from_secs_f64((bytes * SCALE) as f64 / self.setup.hash_rate);
        sleep_until(Instant::from_std(booked).max(Instant::now()) + self.setup.rtt / 2 + verified)
            .await;
    }

    /// Bytes `range` of `digest` from the holder's blob endpoint.
    async fn take_from_holder(&self, node: usize, digest: &str, range: Range<u64>) -> Bytes {
        let asked = Instant::now();
        sleep(self.setup.rtt / 2).await;
        let blob = &self.cuts.blobs[digest];
        self.holder_sending
            .wait_to_send(range.end - range.start)
            .await;
        self.holder_pieces
            .fetch_add((range.end - range.start) * SCALE, Ordering::Relaxed);
        self.receive(node, range.end - range.start, asked).await;
        blob.slice(range.start as usize..range.end as usize)
    }
}

/// One node's transport: in process, to the tracker and to the other nodes' peer sides.
struct SimLink {
    node: usize,
    world: Arc<World>,
}

impl Transport for SimLink {
    fn join<'a>(
        &'a self,
        ask: Ask<'a>,
        target: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
        let world = &self.world;
        let blob = (0..world.setup.blobs.len())
            .find(|&b| target_of(b) == target)
            .expect("a blob of the set");
        let digest = digest_of(blob);
        let source = Source {
            registry: "registry.sim".into(),
            repository: "sim".into(),
        };
        async move {
            world
                .ask(ask.node, async |tracker| {
                    let join = Join {
                        source: &source,
                        digest: &digest,
                        size: world.setup.blobs[blob],
                        node: ask.node,
                        address,
                    };
                    tracker.join_when_cut(&world.cuts, &join).await
                })
                .await
        }
        .boxed()
    }

    fn lost<'a>(
        &'a self,
        ask: Ask<'a>,
        (digest, stripe): (&'a str, usize),
        from: &'a str,
        corrupt: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
        let lost = Lost {
            digest,
            node: ask.node,
            stripe,
            from,
            corrupt,
        };
        self.world
            .ask(ask.node, async move |tracker| tracker.lost(&lost))
            .boxed()
    }

    fn done<'a>(&'a self, ask: Ask<'a>, digest: &'a str) -> BoxFuture<'a, ()> {
        async move {
            let _ = self
                .world
                .ask(ask.node, async |tracker| {
                    tracker.done(digest, ask.node);
                    Ok(Answer::default())
                })
                .await;
        }
        .boxed()
    }

    fn piece<'a>(
        &'a self,
        _: &'a Upstream,
        parent: &'a ParentAt,
        (_, digest): (&'a str, &'a str),
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, Missed>> {
        let world = &self.world;
        async move {
            let from = match parent {
                ParentAt::Holder => None,
                ParentAt::Peer { node, .. } => Some(index_of(node)),
            };
            if world.is_lost(self.node) || from.is_some_and(|from| world.is_lost(from)) {
                return Err(Missed::Gone(format!("{} cannot be reached", parent.name())));
            }
            let exchange = async {
                let Some(from) = from else {
                    return Ok(world.take_from_holder(self.node, digest, range).await);
                };
                let asked = Instant::now();
                sleep(world.setup.rtt / 2).await;
                let bytes = world
                    .peers(from)
                    .ok_or_else(|| Missed::Gone("the simulation ended".into()))?
                    .serve_piece(digest, range)
                    .await
                    .map_err(|refusal| missed(parent.name(), refusal))?;
                world.receive(self.node, bytes.len() as u64, asked).await;
                Ok(bytes)
            };
            world.unless_lost((self.node, from), exchange).await
        }
        .boxed()
    }

    fn cut<'a>(
        &'a self,
        _: &'a Upstream,
        parent: &'a ParentAt,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Cut, Missed>> {
        let world = &self.world;
        async move {
            let ParentAt::Peer { node, .. } = parent else {
                return Err(Missed::Gone(
                    "the holder sends its cut in its answer".into(),
                ));
            };
            let from = index_of(node);
            if world.is_lost(self.node) || world.is_lost(from) {
                return Err(Missed::Gone(format!("{node} cannot be reached")));
            }
            let exchange = async {
                sleep(world.setup.rtt / 2).await;
                world
                    .peers(from)
                    .ok_or_else(|| Missed::Gone("the simulation ended".into()))?
                    .serve_cut(digest)
                    .await
                    .map_err(|refusal| missed(node, refusal))
            };
            let cut = world.unless_lost((self.node, Some(from)), exchange).await?;
            let json = serde_json::to_vec(&cut).expect("a cut serializes");
            world
                .cuts_from_peers
                .fetch_add(json.len() as u64, Ordering::Relaxed);
            sleep(world.setup.rtt / 2).await;
            Ok(serde_json::from_slice(&json).expect("a cut reads back"))
        }
        .boxed()
    }
}

fn missed(node: &str, refusal: Refusal) -> Missed {
    match refusal {
        Refusal::NotYet => Missed::NotYet,
        other => Missed::Gone(format!("{node} refused: {other:?}")),
    }
}

/// splitmix64: reproducible moments per seed.
fn random(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `setup` in virtual time, the nodes' pieces under `dir`.
pub fn run(setup: &Setup, dir: &Path) -> Outcome {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(simulate(setup, dir))
}

async fn simulate(setup: &Setup, dir: &Path) -> Outcome {
    let n = setup.nodes;
    let blobs: HashMap<String, Bytes> = setup
        .blobs
        .iter()
        .enumerate()
        .map(|(b, &size)| (digest_of(b), content(b, size.div_ceil(SCALE))))
        .collect();
    let world = Arc::new(World {
        setup: setup.clone(),
        tracker: RwLock::new(Some(Tracker::default())),
        tracker_time: Mutex::new(Pace::new(MICROS)),
        cuts: SimCuts {
            blobs,
            link: ServingCap::new(scaled(setup.link)),
            hash_rate: setup.hash_rate,
        },
        peers: RwLock::default(),
        lost: (0..n).map(|_| watch::channel(false).0).collect(),
        receiving: (0..n)
            .map(|_| Mutex::new(Pace::new(scaled(setup.cap))))
            .collect(),
        holder_sending: ServingCap::new(scaled(setup.cap)),
        tracker_requests: AtomicU64::new(0),
        tracker_bytes: AtomicU64::new(0),
        cuts_from_peers: AtomicU64::new(0),
        holder_pieces: AtomicU64::new(0),
        first_placed: Mutex::new(None),
    });
    world.tracker().expect(n);
    let upstream = Upstream {
        address: "sim://holder".into(),
        token: CacheToken::new("simulated-token").expect("a token"),
    };
    let located = upstream.clone();
    let locate: pinboard::backend::blobs::Locate = Arc::new(move || {
        let found = located.clone();
        async move { Some(found) }.boxed()
    });
    let peers: Vec<Arc<Peers>> = (0..n)
        .map(|node| {
            let link = Arc::new(SimLink {
                node,
                world: Arc::clone(&world),
            });
            let cap = ServingCap::new(scaled(setup.cap));
            Peers::in_process((&name_of(node), dir), link, Arc::clone(&locate), Some(cap))
                .map(Arc::new)
                .expect("a node's peer side")
        })
        .collect();
    *world.peers.write().unwrap() = peers;

    let mut seed = setup.seed;
    let set_bytes: u64 = setup.blobs.iter().sum();
    let largest = setup.blobs.iter().copied().max().unwrap_or(0);
    // The set over the link, its largest blob verified: then the nodes are placed, and take the set in
    // about the time one node takes it at its cap.
    let placed_at = set_bytes as f64 / setup.link + largest as f64 / setup.hash_rate;
    let transfer = set_bytes as f64 / setup.cap;
    let epoch = Instant::now();
    let fell_back = Arc::new(AtomicU64::new(0));
    let mut runtimes = Vec::new();
    let mut cutoffs = Vec::new();
    for node in 0..n {
        let start = epoch + setup.start_spread.mul_f64(random(&mut seed));
        if setup.lost_every > 0 && node % setup.lost_every == setup.lost_every - 1 {
            let at = epoch + Duration::from_secs_f64(placed_at + transfer * random(&mut seed));
            let world = Arc::clone(&world);
            cutoffs.push(tokio::spawn(async move {
                sleep_until(at).await;
                world.lost[node].send_replace(true);
            }));
        }
        let (world, upstream, fell_back) =
            (Arc::clone(&world), upstream.clone(), Arc::clone(&fell_back));
        runtimes.push(tokio::spawn(async move {
            sleep_until(start).await;
            let pulls = (0..world.setup.blobs.len())
                .map(|blob| pull(&world, node, blob, &upstream, &fell_back));
            futures::future::join_all(pulls).await;
            (node, start.elapsed())
        }));
    }
    let mut times = Vec::new();
    let mut served = Vec::new();
    let mut refused_pieces = 0;
    for runtime in runtimes {
        let (node, took) = runtime.await.expect("a node's runtime");
        let report = world.peers(node).expect("the nodes").report();
        refused_pieces += report.refused_pieces;
        if !world.is_lost(node) {
            times.push(took);
            served.push(report.served_bytes * SCALE);
        }
    }
    for cutoff in cutoffs {
        cutoff.abort();
    }
    // The nodes' files and memory go with them, not at the end of the process.
    world.peers.write().unwrap().clear();
    let tracker = world.tracker.write().unwrap().take();
    let before = live_bytes();
    drop(tracker);
    let tracker_memory = before.saturating_sub(live_bytes()) as u64;
    let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
    Outcome {
        times,
        served,
        lost: (0..n).filter(|&node| world.is_lost(node)).count(),
        fell_back: count(&fell_back),
        holder_pieces: count(&world.holder_pieces),
        first_placed: world
            .first_placed
            .lock()
            .unwrap()
            .map_or(Duration::ZERO, |at| at - epoch),
        tracker_requests: count(&world.tracker_requests),
        tracker_bytes: count(&world.tracker_bytes),
        cuts_from_peers: count(&world.cuts_from_peers),
        tracker_memory,
        refused_pieces,
    }
}

/// The runtime's download of `blob` on `node`, through the relay: from the other nodes as the tracker
/// places it, what they fail to give from the holder; nothing once the node is lost.
async fn pull(world: &World, node: usize, blob: usize, upstream: &Upstream, fell_back: &AtomicU64) {
    let digest = digest_of(blob);
    let size = world.setup.blobs[blob].div_ceil(SCALE);
    let mut read = 0;
    if world.setup.peers {
        let peers = world.peers(node).expect("the nodes");
        if let Some(taking) = peers.take(upstream, &target_of(blob)).await {
            let mut prefix = taking.prefix_stream(0..taking.cut.size);
            while let Some(Ok(chunk)) = prefix.next().await {
                read += chunk.len() as u64;
            }
        }
    }
    if read < size && !world.is_lost(node) {
        fell_back.fetch_add(1, Ordering::Relaxed);
        let chunk = HOLDER_CHUNK / SCALE;
        while read < size && !world.is_lost(node) {
            let end = (read + chunk).min(size);
            world.take_from_holder(node, &digest, read..end).await;
            read = end;
        }
    }
}

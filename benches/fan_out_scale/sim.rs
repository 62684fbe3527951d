//! The simulation: N virtual nodes taking a set of blobs, each from the parents pinboard's own tracker
//! ([`Swarm`]) gives it, piece by piece ([`Fetch`]), under a cap per node on what it sends and what it
//! receives; or, as today, every node from the cache's holder alone. Discrete events in virtual time.
//!
//! What it models: each node's agent starting at its own moment (spread over `start_spread`); one request
//! to the tracker per blob (a join, answered once its batch is placed) and one when the blob is done, the
//! tracker serving them one at a time (`tracker_cost` each), `rtt` per request; pieces forwarded once whole
//! and verified (`hash_rate`), so each hop down a tree delays a stripe by a piece; the bandwidth of a
//! piece's transfer set when it starts, as the sender's cap shared by its transfers under way and the
//! receiver's likewise. What it leaves out is in BENCHMARKS.md.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use pinboard::model::peers::{Fetch, Geometry, Parent, Placement, Swarm};

/// What is simulated.
#[derive(Clone, Debug)]
pub struct Setup {
    pub nodes: usize,
    /// Bytes of each blob of the set.
    pub blobs: Vec<u64>,
    /// Bytes per second each node (and the holder) sends at most, and receives at most.
    pub cap: f64,
    /// Nodes start at uniformly random moments in `0..start_spread`.
    pub start_spread: Duration,
    pub rtt: Duration,
    /// The tracker's time per request.
    pub tracker_cost: Duration,
    /// Bytes per second a node verifies a piece at.
    pub hash_rate: f64,
    /// Nodes serve each other (the tracker's forest); false: every node takes everything from the holder.
    pub peers: bool,
    pub seed: u64,
}

/// What came of it.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Per node: from its start until it held every blob.
    pub times: Vec<Duration>,
    /// Per node: bytes it sent to other nodes.
    pub served: Vec<u64>,
    pub holder_served: u64,
    pub tracker_requests: u64,
    /// How long the tracker was busy, all requests together.
    pub tracker_busy: Duration,
    /// The deepest stripe of any node, in hops from the holder.
    pub max_depth: usize,
}

/// Nanoseconds of virtual time.
type Time = u64;

const HOLDER: usize = usize::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Start(usize),
    /// A node's join for a blob reaches the tracker.
    Join(usize, usize),
    /// The tracker answers a join: the node's parents for the blob.
    Placed(usize, usize),
    /// The tracker looks at a gathering batch again (its window).
    Window(usize),
    /// A stream's request reaches its parent.
    Request(usize),
    /// A stream's piece has arrived whole and been verified.
    Piece(usize),
    /// A node's report that it holds a blob reaches the tracker.
    Done(usize, usize),
}

struct Stream {
    child: usize,
    /// A node, or [`HOLDER`].
    parent: usize,
    blob: usize,
    stripe: usize,
    /// The piece in flight.
    busy: Option<u32>,
}

struct Node {
    name: String,
    start: Time,
    fetch: Vec<Fetch>,
    finish: Option<Time>,
    served: u64,
    sending: u32,
    receiving: u32,
    /// Per blob: the streams it feeds.
    feeds: Vec<Vec<usize>>,
}

struct Sim<'a> {
    setup: &'a Setup,
    geometry: Vec<Geometry>,
    epoch: Instant,
    now: Time,
    events: BinaryHeap<Reverse<(Time, Event)>>,
    nodes: Vec<Node>,
    streams: Vec<Stream>,
    swarms: Vec<Swarm>,
    /// Per blob: nodes whose join waits for its batch.
    parked: Vec<Vec<usize>>,
    holder_sending: u32,
    holder_feeds: Vec<Vec<usize>>,
    holder_served: u64,
    tracker_free: Time,
    tracker_requests: u64,
}

fn nanos(d: Duration) -> Time {
    d.as_nanos() as Time
}

/// splitmix64: reproducible start times per seed.
fn random(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

pub fn run(setup: &Setup) -> Outcome {
    let geometry: Vec<Geometry> = setup.blobs.iter().map(|&b| Geometry::of(b)).collect();
    let mut seed = setup.seed;
    let nodes = (0..setup.nodes)
        .map(|i| Node {
            name: format!("node-{i}"),
            start: (random(&mut seed) * setup.start_spread.as_nanos() as f64) as Time,
            fetch: geometry.iter().map(|&g| Fetch::new(g)).collect(),
            finish: None,
            served: 0,
            sending: 0,
            receiving: 0,
            feeds: vec![Vec::new(); geometry.len()],
        })
        .collect();
    let mut sim = Sim {
        setup,
        swarms: geometry
            .iter()
            .map(|g| Swarm::new(g.stripes, setup.nodes))
            .collect(),
        parked: vec![Vec::new(); geometry.len()],
        holder_feeds: vec![Vec::new(); geometry.len()],
        geometry,
        epoch: Instant::now(),
        now: 0,
        events: BinaryHeap::new(),
        nodes,
        streams: Vec::new(),
        holder_sending: 0,
        holder_served: 0,
        tracker_free: 0,
        tracker_requests: 0,
    };
    for i in 0..setup.nodes {
        let start = sim.nodes[i].start;
        sim.at(start, Event::Start(i));
    }
    while let Some(Reverse((time, event))) = sim.events.pop() {
        sim.now = time;
        sim.handle(event);
    }
    sim.outcome()
}

impl Sim<'_> {
    fn at(&mut self, time: Time, event: Event) {
        self.events.push(Reverse((time, event)));
    }

    fn instant(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.now)
    }

    /// When a request sent now is handled by the tracker: after half a round trip and its queue.
    fn tracker(&mut self) -> Time {
        self.tracker_requests += 1;
        let arrives = self.now + nanos(self.setup.rtt) / 2;
        let handled = arrives.max(self.tracker_free) + nanos(self.setup.tracker_cost);
        self.tracker_free = handled;
        handled
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Start(node) => {
                for blob in 0..self.geometry.len() {
                    match self.setup.peers {
                        true => {
                            let at = self.tracker();
                            self.at(at, Event::Join(node, blob));
                        }
                        false => {
                            let half = nanos(self.setup.rtt) / 2;
                            self.at(self.now + half, Event::Placed(node, blob));
                        }
                    }
                }
            }
            Event::Join(node, blob) => {
                let name = self.nodes[node].name.clone();
                let now = self.instant();
                match self.swarms[blob].join(&name, now) {
                    Placement::Placed(_) => {
                        self.answer(node, blob);
                        self.sweep(blob);
                    }
                    Placement::Wait(until) => {
                        self.parked[blob].push(node);
                        let due = nanos(until.duration_since(self.epoch));
                        self.at(due, Event::Window(blob));
                    }
                }
            }
            Event::Window(blob) => self.sweep(blob),
            Event::Placed(node, blob) => self.placed(node, blob),
            Event::Request(stream) => self.try_send(stream),
            Event::Piece(stream) => self.piece(stream),
            Event::Done(node, blob) => {
                let name = self.nodes[node].name.clone();
                self.swarms[blob].done(&name);
            }
        }
    }

    /// Answers every parked join of `blob` that is placed now.
    fn sweep(&mut self, blob: usize) {
        let now = self.instant();
        let parked = std::mem::take(&mut self.parked[blob]);
        for node in parked {
            let name = self.nodes[node].name.clone();
            match self.swarms[blob].placement(&name, now) {
                Placement::Placed(_) => self.answer(node, blob),
                Placement::Wait(_) => self.parked[blob].push(node),
            }
        }
    }

    fn answer(&mut self, node: usize, blob: usize) {
        let back = self.now + nanos(self.setup.rtt) / 2;
        self.at(back, Event::Placed(node, blob));
    }

    /// `node` knows its parents for `blob`: a stream per stripe, each asking its parent.
    fn placed(&mut self, node: usize, blob: usize) {
        let stripes = self.geometry[blob].stripes;
        let parents: Vec<usize> = match self.setup.peers {
            true => {
                let name = self.nodes[node].name.clone();
                let now = self.instant();
                let Placement::Placed(parents) = self.swarms[blob].placement(&name, now) else {
                    unreachable!("answered once placed")
                };
                parents.iter().map(|p| self.index(p)).collect()
            }
            false => vec![HOLDER; stripes],
        };
        for (stripe, parent) in parents.into_iter().enumerate() {
            let id = self.streams.len();
            self.streams.push(Stream {
                child: node,
                parent,
                blob,
                stripe,
                busy: None,
            });
            match parent {
                HOLDER => self.holder_feeds[blob].push(id),
                p => self.nodes[p].feeds[blob].push(id),
            }
            let half = nanos(self.setup.rtt) / 2;
            self.at(self.now + half, Event::Request(id));
        }
    }

    fn index(&self, parent: &Parent) -> usize {
        match parent {
            Parent::Holder => HOLDER,
            Parent::Peer(name) => name["node-".len()..].parse().expect("a node's name"),
        }
    }

    fn holds(&self, node: usize, blob: usize, piece: u32) -> bool {
        node == HOLDER || self.nodes[node].fetch[blob].holds(piece)
    }

    /// Starts the stream's next piece when its parent holds it and it has none in flight.
    fn try_send(&mut self, id: usize) {
        let stream = &self.streams[id];
        if stream.busy.is_some() {
            return;
        }
        let (child, parent, blob) = (stream.child, stream.parent, stream.blob);
        let Some(piece) = self.nodes[child].fetch[blob].wanted(stream.stripe) else {
            return;
        };
        if !self.holds(parent, blob, piece) {
            return;
        }
        let sending = match parent {
            HOLDER => {
                self.holder_sending += 1;
                self.holder_sending
            }
            p => {
                self.nodes[p].sending += 1;
                self.nodes[p].sending
            }
        };
        self.nodes[child].receiving += 1;
        let rate = (self.setup.cap / f64::from(sending))
            .min(self.setup.cap / f64::from(self.nodes[child].receiving));
        let range = self.geometry[blob].range(piece);
        let bytes = (range.end - range.start) as f64;
        let took = bytes / rate + bytes / self.setup.hash_rate;
        self.streams[id].busy = Some(piece);
        let done = self.now + (took * 1e9) as Time;
        self.at(done, Event::Piece(id));
    }

    fn piece(&mut self, id: usize) {
        let (child, parent, blob) = {
            let s = &self.streams[id];
            (s.child, s.parent, s.blob)
        };
        let piece = self.streams[id].busy.take().expect("a piece in flight");
        let range = self.geometry[blob].range(piece);
        match parent {
            HOLDER => {
                self.holder_sending -= 1;
                self.holder_served += range.end - range.start;
            }
            p => {
                self.nodes[p].sending -= 1;
                self.nodes[p].served += range.end - range.start;
            }
        }
        self.nodes[child].receiving -= 1;
        self.nodes[child].fetch[blob].verified(piece);
        // Its children waiting for this piece, and its own next one.
        for feed in self.nodes[child].feeds[blob].clone() {
            self.try_send(feed);
        }
        self.try_send(id);
        if self.nodes[child].fetch[blob].complete() {
            if self.setup.peers {
                let at = self.tracker();
                self.at(at, Event::Done(child, blob));
            }
            if self.nodes[child].fetch.iter().all(Fetch::complete) {
                self.nodes[child].finish.get_or_insert(self.now);
            }
        }
    }

    fn outcome(&self) -> Outcome {
        let times = self
            .nodes
            .iter()
            .map(|n| Duration::from_nanos(n.finish.expect("every node finishes") - n.start))
            .collect();
        let max_depth = match self.setup.peers {
            true => self
                .nodes
                .iter()
                .flat_map(|n| {
                    self.swarms.iter().flat_map(move |swarm| {
                        (0..swarm.fan_out()).filter_map(move |s| swarm.depth(&n.name, s))
                    })
                })
                .max()
                .unwrap_or(0),
            false => 1,
        };
        Outcome {
            times,
            served: self.nodes.iter().map(|n| n.served).collect(),
            holder_served: self.holder_served,
            tracker_requests: self.tracker_requests,
            tracker_busy: self.setup.tracker_cost * self.tracker_requests as u32,
            max_depth,
        }
    }
}

//! Rollout state: node × image, fed by the engine's events. Pure: time comes in with the events and the
//! queries, never from a clock here, so every transition is unit-testable.
//!
//! The engine (src/engine.rs) sends [`Event`]s; the TUI and the headless commands fold them into one
//! [`Rollout`] with [`Rollout::apply`] and read states, bytes, throughput and ETA from it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lazy::lazy_words;

/// How a node enforces pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMethod {
    /// `pinned_images` in a CRI-O drop-in, then a reload.
    CrioDropIn,
    /// The image label `io.cri-containerd.pinned=pinned` through containerd's images service.
    ContainerdLabel,
}

/// How the bytes a node's runtime fetched are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchedSource {
    /// The blobs containerd's content store gained during the rollout, by their sizes: what the runtime
    /// really downloaded.
    ContentStore,
    /// What the plan counts for the images pulled: the runtime reports no bytes (CRI-O).
    Plan,
    /// What the node's relay passed on to its runtime from the in-cluster cache (an agent's fan-out set
    /// on CRI-O, every pull through the relay).
    Relay,
    /// The growth of CRI-O's pull-bytes counter during the rollout
    /// (`container_runtime_crio_image_pulls_bytes_total`): what the runtime itself counted.
    RuntimeCounters,
}

/// What the engine reports. `at` is when it happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The node will not be started (plan verdict no-space without --force, unreachable...).
    NodeRefused { node: String, reason: String },
    /// How the node's pull bytes are known, said once as its pulls start, when it is worth saying (a CRI-O
    /// node): `counted`, from the runtime's own counters, or not, with why and the fix.
    NodeBytes {
        node: String,
        counted: bool,
        note: String,
    },
    /// Pulls are about to start on the node, for these images in this order.
    NodeStarted {
        node: String,
        images: Vec<String>,
        at: Instant,
    },
    /// Already on the node: nothing to pull.
    ImagePresent { node: String, image: String },
    /// On the node only lazily: `remote` of its `layers` layers are still in the registry. Not pulled
    /// again: a pull through the same runtime would leave it so.
    ImageLazy {
        node: String,
        image: String,
        remote: usize,
        layers: usize,
    },
    PullStarted {
        node: String,
        image: String,
        attempt: u32,
        at: Instant,
    },
    /// Bytes fetched so far for this pull (sum over its in-flight and finished blobs) out of `total`.
    PullProgress {
        node: String,
        image: String,
        done: u64,
        total: u64,
        at: Instant,
    },
    /// The attempt failed and will be retried after `backoff`.
    PullRetry {
        node: String,
        image: String,
        attempt: u32,
        reason: String,
        backoff: Duration,
        at: Instant,
    },
    /// The pull made no byte progress for the progress timeout and was cancelled; a retry or a failure
    /// follows.
    PullStalled {
        node: String,
        image: String,
        at: Instant,
    },
    /// Pulled and confirmed with ImageStatus.
    PullDone {
        node: String,
        image: String,
        at: Instant,
    },
    PullFailed {
        node: String,
        image: String,
        reason: String,
        at: Instant,
    },
    PullCancelled {
        node: String,
        image: String,
        at: Instant,
    },
    /// What the node's runtime fetched for the rollout, once its pulls are over.
    Fetched {
        node: String,
        bytes: u64,
        source: FetchedSource,
    },
    /// The node stopped pulling (e.g. out of space): its remaining images will not be pulled.
    NodeStopped {
        node: String,
        reason: String,
        at: Instant,
    },
    /// Pins written (and, where the runtime reports it, confirmed).
    Pinned {
        node: String,
        method: PinMethod,
        confirmed: bool,
        at: Instant,
    },
    PinFailed {
        node: String,
        reason: String,
        at: Instant,
    },
    /// Pinned, then found lost on the node (absent, its pin gone, only lazily there): the node's agent
    /// puts it back.
    ImageLost {
        node: String,
        image: String,
        found: String,
        at: Instant,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImageState {
    Queued,
    Present,
    /// Present only lazily: `remote` of its `layers` layers still in the registry.
    Lazy {
        remote: u16,
        layers: u16,
    },
    Pulling {
        attempt: u32,
        since: Instant,
    },
    /// Waiting to retry after a failed attempt; why it failed is the last of [`ImageRollout::retries`].
    Retrying {
        attempt: u32,
        until: Instant,
    },
    Pulled {
        took: Duration,
    },
    Pinned {
        confirmed: bool,
    },
    // Boxed, not a String: the state is in every node × image, and this keeps it at 24 bytes.
    Failed {
        reason: Box<str>,
    },
    Cancelled,
    /// Never started: the node stopped or was refused first.
    Skipped,
    /// Pinned once, then found lost: `found` says what was there (`absent`, `present but not pinned`).
    Lost {
        found: Box<str>,
    },
}

impl ImageState {
    /// `lazy (2 of 3 layers remote)` for an image present only lazily.
    pub fn lazy_words(&self) -> Option<String> {
        match self {
            ImageState::Lazy { remote, layers } => {
                Some(lazy_words((*remote).into(), (*layers).into()))
            }
            _ => None,
        }
    }

    /// A state that will not change without an operator (retry) or a new rollout.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            ImageState::Present
                | ImageState::Lazy { .. }
                | ImageState::Pinned { .. }
                | ImageState::Failed { .. }
                | ImageState::Cancelled
                | ImageState::Skipped
        )
    }
}

/// One image on one node: 48 bytes, since a large rollout holds a million of them. The reference is the
/// node's (see [`NodeRollout::images`]); when its bytes last moved is kept only for running pulls.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageRollout {
    pub state: ImageState,
    pub done_bytes: u64,
    pub total_bytes: u64,
    #[expect(
        clippy::box_collection,
        reason = "most pulls never retry: 8 bytes for none instead of an empty Vec's 24"
    )]
    retries: Option<Box<Vec<String>>>,
}

impl ImageRollout {
    /// Every retry's reason, oldest first.
    pub fn retries(&self) -> &[String] {
        self.retries.as_deref().map_or(&[], Vec::as_slice)
    }

    fn failed(&self) -> bool {
        matches!(self.state, ImageState::Failed { .. })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeState {
    Waiting,
    Refused {
        reason: String,
    },
    Pulling {
        since: Instant,
    },
    Stopped {
        reason: String,
    },
    Pinned {
        method: PinMethod,
        confirmed: bool,
        took: Duration,
    },
    PinFailed {
        reason: String,
    },
    /// It was pinned, then an image or pin was lost: its agent puts it back.
    Restoring {
        since: Instant,
    },
}

impl NodeState {
    /// Still to be heard from, pulling, or putting back what was lost: the rollout is not finished.
    fn is_open(&self) -> bool {
        matches!(
            self,
            NodeState::Waiting | NodeState::Pulling { .. } | NodeState::Restoring { .. }
        )
    }
}

/// A node's references in pull order, each once, and where each is in that order. Nodes announced with the
/// same images (normally all of a rollout's) share one, so a node × image costs only its [`ImageRollout`].
#[derive(Clone, Debug, Default, PartialEq)]
struct Catalog {
    order: Vec<Arc<str>>,
    positions: HashMap<Arc<str>, usize>,
}

impl Catalog {
    fn position(&self, reference: &str) -> Option<usize> {
        self.positions.get(reference).copied()
    }

    /// Adds `reference` at the end unless it is there already.
    fn push(&mut self, reference: Arc<str>) {
        if !self.positions.contains_key(&reference) {
            self.positions
                .insert(Arc::clone(&reference), self.order.len());
            self.order.push(reference);
        }
    }
}

/// Every reference and every announced image list of a rollout, stored once and shared by its nodes.
#[derive(Clone, Debug, Default)]
struct Interner {
    references: HashSet<Arc<str>>,
    catalogs: Vec<Arc<Catalog>>,
}

impl Interner {
    fn reference(&mut self, reference: &str) -> Arc<str> {
        if let Some(shared) = self.references.get(reference) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = Arc::from(reference);
        self.references.insert(Arc::clone(&shared));
        shared
    }

    /// The catalog of a node announced with `images`: the one another node has for the same list, if any.
    fn catalog(&mut self, images: &[String]) -> Arc<Catalog> {
        let same = |c: &&Arc<Catalog>| {
            c.order
                .iter()
                .map(|r| &**r)
                .eq(images.iter().map(String::as_str))
        };
        if let Some(shared) = self.catalogs.iter().find(same) {
            return Arc::clone(shared);
        }
        // Catalogs no node uses any more (restarted with other images) go.
        self.catalogs.retain(|c| Arc::strong_count(c) > 1);
        let mut catalog = Catalog::default();
        for image in images {
            catalog.push(self.reference(image));
        }
        let shared = Arc::new(catalog);
        self.catalogs.push(Arc::clone(&shared));
        shared
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRollout {
    pub state: NodeState,
    catalog: Arc<Catalog>,
    /// One per catalog entry, in the same order.
    images: Vec<ImageRollout>,
    // Kept current by every image event, so that per-frame queries over thousands of nodes and the TUI's
    // per-event re-sort do not walk every image: sums of the images' done and total bytes, how many
    // failed, and the pulls now running.
    done: u64,
    total: u64,
    failed: usize,
    /// Running pulls (positions in `images`) and when their bytes last moved, by reference.
    pulling: Vec<(usize, Instant)>,
    /// Images found present, present only lazily, and pulled: kept apart, as pinning turns them all into
    /// pinned.
    present: usize,
    lazy: usize,
    pulled: usize,
    /// What the runtime fetched, once its pulls are over.
    fetched: Option<(u64, FetchedSource)>,
    /// How its pull bytes are known, when that was said ([`Event::NodeBytes`]).
    bytes_note: Option<(bool, String)>,
}

impl NodeRollout {
    fn new(state: NodeState, catalog: Arc<Catalog>) -> Self {
        NodeRollout {
            state,
            images: vec![queued(); catalog.order.len()],
            catalog,
            done: 0,
            total: 0,
            failed: 0,
            pulling: Vec::new(),
            present: 0,
            lazy: 0,
            pulled: 0,
            fetched: None,
            bytes_note: None,
        }
    }

    /// How its pull bytes are known: from the runtime's counters (true) or not, with the note that says
    /// so; None when nothing needed saying.
    pub fn bytes_note(&self) -> Option<(bool, &str)> {
        self.bytes_note
            .as_ref()
            .map(|(counted, note)| (*counted, note.as_str()))
    }

    /// Images that were on the node before the rollout, whole.
    pub fn present_count(&self) -> usize {
        self.present
    }

    /// Images that were on the node before the rollout only lazily: not pre-loaded.
    pub fn lazy_count(&self) -> usize {
        self.lazy
    }

    /// Images pinned now.
    pub fn pinned_count(&self) -> usize {
        self.images
            .iter()
            .filter(|i| matches!(i.state, ImageState::Pinned { .. }))
            .count()
    }

    /// Images the rollout pulled.
    pub fn pulled_count(&self) -> usize {
        self.pulled
    }

    /// What the runtime fetched for the rollout, and how that is known; None until its pulls are over.
    pub fn fetched(&self) -> Option<(u64, FetchedSource)> {
        self.fetched
    }

    /// The node's images in the order the engine pulls them.
    pub fn images(&self) -> impl ExactSizeIterator<Item = (&str, &ImageRollout)> {
        self.catalog.order.iter().map(|r| &**r).zip(&self.images)
    }

    pub fn image(&self, reference: &str) -> Option<&ImageRollout> {
        self.catalog.position(reference).map(|at| &self.images[at])
    }

    /// Bytes fetched so far on this node, finished pulls included.
    pub fn done_bytes(&self) -> u64 {
        self.done
    }

    /// Bytes this node's pulls are known to need so far (grows as pulls reveal their totals).
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Images that failed (and were not retried since).
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Changes one image (recording it if the node never announced it), keeping the node's byte sums,
    /// failures and running pulls current. `change` returns when the image's bytes moved, if they did.
    fn update_image(
        &mut self,
        interner: &mut Interner,
        image: &str,
        change: impl FnOnce(&mut ImageRollout) -> Option<Instant>,
    ) {
        let at = match self.catalog.position(image) {
            Some(at) => at,
            None => {
                Arc::make_mut(&mut self.catalog).push(interner.reference(image));
                self.images.push(queued());
                self.images.len() - 1
            }
        };
        let i = &mut self.images[at];
        let (done, total, failed) = (i.done_bytes, i.total_bytes, i.failed());
        let moved = change(i);
        self.done = self.done - done + i.done_bytes;
        self.total = self.total - total + i.total_bytes;
        self.failed = self.failed + usize::from(i.failed()) - usize::from(failed);
        let running = self.pulling.iter().position(|(p, _)| *p == at);
        match (&i.state, running) {
            (ImageState::Pulling { .. }, Some(r)) => {
                if let Some(moved) = moved {
                    self.pulling[r].1 = moved;
                }
            }
            (ImageState::Pulling { since, .. }, None) => {
                let order = &self.catalog.order;
                let r = self.pulling.partition_point(|(p, _)| order[*p] < order[at]);
                self.pulling.insert(r, (at, moved.unwrap_or(*since)));
            }
            (_, Some(r)) => {
                self.pulling.remove(r);
            }
            (_, None) => {}
        }
    }

    /// Folds in an event about this node.
    fn apply(&mut self, interner: &mut Interner, event: Event) {
        match event {
            Event::NodeRefused { reason, .. } => {
                *self = NodeRollout::new(NodeState::Refused { reason }, Arc::default());
            }
            Event::NodeStarted { images, at, .. } => {
                *self =
                    NodeRollout::new(NodeState::Pulling { since: at }, interner.catalog(&images));
            }
            Event::ImagePresent { image, .. } => {
                self.present += 1;
                self.update_image(interner, &image, |i| {
                    i.state = ImageState::Present;
                    None
                })
            }
            Event::ImageLazy {
                image,
                remote,
                layers,
                ..
            } => {
                self.lazy += 1;
                let count = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
                self.update_image(interner, &image, |i| {
                    i.state = ImageState::Lazy {
                        remote: count(remote),
                        layers: count(layers),
                    };
                    None
                })
            }
            Event::PullStarted {
                image, attempt, at, ..
            } => {
                // A retry on a stopped node (space freed, operator asked) resumes it; so does a restore.
                if matches!(
                    self.state,
                    NodeState::Stopped { .. } | NodeState::Waiting | NodeState::Restoring { .. }
                ) {
                    self.state = NodeState::Pulling { since: at };
                }
                self.update_image(interner, &image, |i| {
                    i.state = ImageState::Pulling { attempt, since: at };
                    Some(at)
                });
            }
            Event::PullProgress {
                image,
                done,
                total,
                at,
                ..
            } => self.update_image(interner, &image, |i| {
                let moved = (done != i.done_bytes).then_some(at);
                i.done_bytes = done;
                i.total_bytes = total.max(done);
                moved
            }),
            Event::PullRetry {
                image,
                attempt,
                reason,
                backoff,
                at,
                ..
            } => self.update_image(interner, &image, |i| {
                i.retries.get_or_insert_default().push(reason);
                i.state = ImageState::Retrying {
                    attempt,
                    until: at + backoff,
                };
                None
            }),
            Event::PullDone { image, at, .. } => {
                self.pulled += 1;
                self.update_image(interner, &image, |i| {
                    let took = match i.state {
                        ImageState::Pulling { since, .. } => at.saturating_duration_since(since),
                        _ => Duration::ZERO,
                    };
                    i.state = ImageState::Pulled { took };
                    i.total_bytes = i.total_bytes.max(i.done_bytes);
                    None
                })
            }
            Event::PullFailed { image, reason, .. } => self.update_image(interner, &image, |i| {
                i.state = ImageState::Failed {
                    reason: reason.into(),
                };
                None
            }),
            // Its retry or failure says so on the image.
            Event::PullStalled { .. } => {}
            Event::PullCancelled { image, .. } => self.update_image(interner, &image, |i| {
                i.state = ImageState::Cancelled;
                None
            }),
            Event::Fetched { bytes, source, .. } => self.fetched = Some((bytes, source)),
            Event::NodeBytes { counted, note, .. } => self.bytes_note = Some((counted, note)),
            Event::NodeStopped { reason, .. } => {
                self.state = NodeState::Stopped { reason };
                // Neither bytes, failures nor running pulls change.
                for i in self
                    .images
                    .iter_mut()
                    .filter(|i| matches!(i.state, ImageState::Queued))
                {
                    i.state = ImageState::Skipped;
                }
            }
            Event::Pinned {
                method,
                confirmed,
                at,
                ..
            } => {
                let took = match self.state {
                    NodeState::Pulling { since } | NodeState::Restoring { since } => {
                        at.saturating_duration_since(since)
                    }
                    _ => Duration::ZERO,
                };
                self.state = NodeState::Pinned {
                    method,
                    confirmed,
                    took,
                };
                // Neither bytes, failures nor running pulls change.
                for i in self.images.iter_mut().filter(|i| {
                    matches!(
                        i.state,
                        ImageState::Pulled { .. } | ImageState::Present | ImageState::Lost { .. }
                    )
                }) {
                    i.state = ImageState::Pinned { confirmed };
                }
            }
            Event::PinFailed { reason, .. } => self.state = NodeState::PinFailed { reason },
            Event::ImageLost {
                image, found, at, ..
            } => {
                if !matches!(self.state, NodeState::Restoring { .. }) {
                    self.state = NodeState::Restoring { since: at };
                }
                self.update_image(interner, &image, |i| {
                    i.state = ImageState::Lost {
                        found: found.into(),
                    };
                    i.done_bytes = 0;
                    None
                })
            }
        }
    }

    /// Average bytes per second since the node started pulling.
    pub fn throughput(&self, now: Instant) -> Option<f64> {
        let NodeState::Pulling { since } = self.state else {
            return None;
        };
        let seconds = now.saturating_duration_since(since).as_secs_f64();
        (seconds > 0.0).then(|| self.done_bytes() as f64 / seconds)
    }

    /// Time left at the current throughput, for the bytes known so far.
    pub fn eta(&self, now: Instant) -> Option<Duration> {
        let rate = self.throughput(now).filter(|r| *r > 0.0)?;
        let left = self.total_bytes().saturating_sub(self.done_bytes());
        Some(Duration::from_secs_f64(left as f64 / rate))
    }

    /// Pulls whose bytes have not moved for `stall_after`, by reference. Only running pulls are looked at.
    pub fn stalled(&self, now: Instant, stall_after: Duration) -> impl Iterator<Item = &str> {
        self.pulling
            .iter()
            .filter(move |(_, last)| now.saturating_duration_since(*last) >= stall_after)
            .map(|(at, _)| &*self.catalog.order[*at])
    }

    pub fn count(&self, pred: impl Fn(&ImageState) -> bool) -> usize {
        self.images.iter().filter(|i| pred(&i.state)).count()
    }
}

/// Every node's rollout.
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    nodes: BTreeMap<String, NodeRollout>,
    interner: Interner,
    /// Nodes waiting or pulling, kept current so that `is_finished` does not walk every node per event.
    open: usize,
    /// With fan-out, what crosses the registry link; None without (every node pulls over the link itself).
    link: Option<FanOutLink>,
}

/// What crosses the link under fan-out: what the blob cache took, and the bytes of the nodes that could not
/// be fanned out to and pull directly.
#[derive(Clone, Debug, Default)]
struct FanOutLink {
    cache: u64,
    nodes: FanOutNodes,
}

/// The nodes of a fanned-out rollout that do not pull wholly through the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FanOutNodes {
    /// Pull from the registries themselves: their bytes are the link's.
    pub direct: Vec<String>,
    /// Pull through the cache, but some of their pulls went to the source while it was away (the
    /// in-cluster cache's relay gave up): what those took crosses the link uncounted, as the runtime
    /// fetched it itself.
    pub partly: Vec<String>,
    /// `--link-rate`: the budget of the registry link the cache keeps, bytes per second.
    pub link_rate: Option<u64>,
}

/// Equal when every node is: how the references happen to be shared does not count.
impl PartialEq for Rollout {
    fn eq(&self, other: &Rollout) -> bool {
        self.nodes == other.nodes
    }
}

impl Rollout {
    /// A rollout about to start on `nodes`: each waits until the engine reports on it, so the rollout is
    /// not finished while any has yet to be heard from.
    pub fn expecting(nodes: &[String]) -> Rollout {
        let nodes: BTreeMap<String, NodeRollout> = nodes
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    NodeRollout::new(NodeState::Waiting, Arc::default()),
                )
            })
            .collect();
        Rollout {
            open: nodes.len(),
            nodes,
            interner: Interner::default(),
            link: None,
        }
    }

    /// The nodes pull through fan-out, but for those `nodes` names: link bytes are counted from here on
    /// ([`Rollout::record_link_bytes`]).
    pub fn set_fan_out(&mut self, nodes: FanOutNodes) {
        self.link = Some(FanOutLink { cache: 0, nodes });
    }

    /// Whether every node of a fanned-out rollout pulled from the registries itself: no cache carried
    /// its bytes.
    pub fn all_direct(&self) -> bool {
        self.link.as_ref().is_some_and(|l| {
            !self.nodes.is_empty() && self.nodes.keys().all(|n| l.nodes.direct.contains(n))
        })
    }

    /// The nodes that pulled from the registries themselves, their bytes counted as the link's
    /// ([`FanOutNodes::direct`]).
    pub fn direct_from_source(&self) -> &[String] {
        self.link.as_ref().map_or(&[], |l| &l.nodes.direct)
    }

    /// The nodes some of whose pulls went to the source uncounted ([`FanOutNodes::partly`]).
    pub fn partly_from_source(&self) -> &[String] {
        self.link.as_ref().map_or(&[], |l| &l.nodes.partly)
    }

    /// The bytes fan-out's blob cache has taken from the registries so far (sampled from the cache, not an
    /// engine event).
    pub fn record_link_bytes(&mut self, bytes: u64) {
        if let Some(link) = &mut self.link {
            link.cache = bytes;
        }
    }

    /// Bytes over the registry link so far with fan-out: the cache's and those of the nodes that pull
    /// directly. None without fan-out, where every node's bytes cross the link ([`Rollout::bytes`]).
    pub fn link_bytes(&self) -> Option<u64> {
        let link = self.link.as_ref()?;
        let direct = link.nodes.direct.iter().filter_map(|n| self.nodes.get(n));
        Some(link.cache + direct.map(NodeRollout::done_bytes).sum::<u64>())
    }

    /// The budget of the registry link the cache keeps (`--link-rate`), when it has one.
    pub fn link_rate(&self) -> Option<u64> {
        self.link.as_ref()?.nodes.link_rate
    }

    /// Under a budget, how long the rest of `planned` link bytes (the plan's `linkBytes.fanOut`) takes at
    /// it: the budget's own bound on the rollout's end.
    pub fn link_eta(&self, planned: u64) -> Option<Duration> {
        let rest = planned.saturating_sub(self.link.as_ref()?.cache);
        Some(crate::model::pacing::time_at(rest, self.link_rate()?))
    }

    /// Every node by name. Read-only: events are the only way in.
    pub fn nodes(&self) -> &BTreeMap<String, NodeRollout> {
        &self.nodes
    }

    /// Folds one event in. Events for nodes or images never announced are recorded as they come.
    pub fn apply(&mut self, event: Event) {
        if !self.nodes.contains_key(event.node()) {
            let waiting = NodeRollout::new(NodeState::Waiting, Arc::default());
            self.nodes.insert(event.node().to_string(), waiting);
            self.open += 1;
        }
        let node = self.nodes.get_mut(event.node()).expect("inserted above");
        let was_open = node.state.is_open();
        node.apply(&mut self.interner, event);
        self.open = self.open + usize::from(node.state.is_open()) - usize::from(was_open);
    }

    /// Bytes done and known total over every node.
    pub fn bytes(&self) -> (u64, u64) {
        self.nodes.values().fold((0, 0), |(d, t), n| {
            (d + n.done_bytes(), t + n.total_bytes())
        })
    }

    /// Whether nothing more will happen without an operator: every node refused, stopped, pinned or failed.
    pub fn is_finished(&self) -> bool {
        !self.nodes.is_empty() && self.open == 0
    }
}

impl Event {
    /// The node the event is about.
    pub fn node(&self) -> &str {
        match self {
            Event::NodeRefused { node, .. }
            | Event::NodeStarted { node, .. }
            | Event::NodeBytes { node, .. }
            | Event::ImagePresent { node, .. }
            | Event::ImageLazy { node, .. }
            | Event::PullStarted { node, .. }
            | Event::PullProgress { node, .. }
            | Event::PullRetry { node, .. }
            | Event::PullStalled { node, .. }
            | Event::PullDone { node, .. }
            | Event::PullFailed { node, .. }
            | Event::PullCancelled { node, .. }
            | Event::Fetched { node, .. }
            | Event::NodeStopped { node, .. }
            | Event::Pinned { node, .. }
            | Event::PinFailed { node, .. }
            | Event::ImageLost { node, .. } => node,
        }
    }
}

fn queued() -> ImageRollout {
    ImageRollout {
        state: ImageState::Queued,
        done_bytes: 0,
        total_bytes: 0,
        retries: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> String {
        text.to_string()
    }

    /// Where a node's copy of a reference is stored.
    fn reference(r: &Rollout, node: &str, image: &str) -> *const u8 {
        let mut images = r.nodes()[node].images();
        images.find(|(i, _)| *i == image).unwrap().0.as_ptr()
    }

    #[test]
    fn under_fan_out_the_link_carries_the_caches_bytes_and_those_of_nodes_pulling_directly() {
        let at = Instant::now();
        let mut r = Rollout::expecting(&[s("n1"), s("n2"), s("n3")]);
        let progress = |node: &str, done| Event::PullProgress {
            node: s(node),
            image: s("a"),
            done,
            total: 100,
            at,
        };
        for node in ["n1", "n2", "n3"] {
            r.apply(progress(node, 40));
        }
        assert_eq!(
            r.link_bytes(),
            None,
            "without fan-out the nodes' bytes are the link's"
        );
        assert_eq!(r.bytes().0, 120);
        r.set_fan_out(FanOutNodes {
            direct: vec![s("n3")],
            partly: Vec::new(),
            link_rate: None,
        });
        assert_eq!(r.link_eta(1000), None, "no budget, no ETA of its own");
        r.record_link_bytes(50);
        assert_eq!(
            r.link_bytes(),
            Some(50 + 40),
            "the cache's, and n3's own pulls"
        );
        r.apply(progress("n3", 100));
        r.apply(progress("n1", 100));
        assert_eq!(r.link_bytes(), Some(50 + 100), "n1 pulls through the cache");
    }

    #[test]
    fn a_link_budget_bounds_the_rollout_by_the_link_bytes_left() {
        let mut r = Rollout::expecting(&[s("n1")]);
        assert_eq!(r.link_rate(), None);
        r.set_fan_out(FanOutNodes {
            link_rate: Some(4 << 20),
            ..FanOutNodes::default()
        });
        assert_eq!(r.link_rate(), Some(4 << 20));
        assert_eq!(r.link_eta(40 << 20), Some(Duration::from_secs(10)));
        r.record_link_bytes(20 << 20);
        assert_eq!(r.link_eta(40 << 20), Some(Duration::from_secs(5)));
        // More than planned (the manifests, a resumed blob): nothing left, not a negative time.
        r.record_link_bytes(41 << 20);
        assert_eq!(r.link_eta(40 << 20), Some(Duration::ZERO));
    }

    #[test]
    fn a_lazily_present_image_stays_lazy_when_its_node_pins() {
        let at = Instant::now();
        let mut r = Rollout::default();
        r.apply(Event::NodeStarted {
            node: s("n1"),
            images: vec![s("a"), s("b")],
            at,
        });
        r.apply(Event::ImagePresent {
            node: s("n1"),
            image: s("a"),
        });
        r.apply(Event::ImageLazy {
            node: s("n1"),
            image: s("b"),
            remote: 2,
            layers: 3,
        });
        r.apply(Event::Pinned {
            node: s("n1"),
            method: PinMethod::ContainerdLabel,
            confirmed: true,
            at,
        });
        let n = &r.nodes()["n1"];
        assert_eq!(
            n.image("a").unwrap().state,
            ImageState::Pinned { confirmed: true }
        );
        assert_eq!(
            n.image("b").unwrap().state,
            ImageState::Lazy {
                remote: 2,
                layers: 3
            }
        );
        assert!(n.image("b").unwrap().state.is_final());
    }

    #[test]
    fn a_node_goes_from_queued_through_pulls_to_pinned() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut r = Rollout::default();
        r.apply(Event::NodeStarted {
            node: s("n1"),
            images: vec![s("a"), s("b"), s("c")],
            at: at(0),
        });
        r.apply(Event::ImagePresent {
            node: s("n1"),
            image: s("c"),
        });
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("a"),
            attempt: 1,
            at: at(0),
        });
        r.apply(Event::PullProgress {
            node: s("n1"),
            image: s("a"),
            done: 50,
            total: 100,
            at: at(1),
        });
        let n = &r.nodes()["n1"];
        assert_eq!((n.done_bytes(), n.total_bytes()), (50, 100));
        assert_eq!(n.throughput(at(1)), Some(50.0));
        assert_eq!(n.eta(at(1)), Some(Duration::from_secs(1)));

        r.apply(Event::PullProgress {
            node: s("n1"),
            image: s("a"),
            done: 100,
            total: 100,
            at: at(2),
        });
        r.apply(Event::PullDone {
            node: s("n1"),
            image: s("a"),
            at: at(2),
        });
        assert_eq!(
            r.nodes()["n1"].image("a").unwrap().state,
            ImageState::Pulled {
                took: Duration::from_secs(2)
            }
        );
        assert_eq!(
            r.nodes()["n1"].done_bytes(),
            100,
            "finished pulls keep counting"
        );

        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("b"),
            attempt: 1,
            at: at(2),
        });
        r.apply(Event::PullRetry {
            node: s("n1"),
            image: s("b"),
            attempt: 1,
            reason: s("connection reset"),
            backoff: Duration::from_secs(1),
            at: at(3),
        });
        assert_eq!(
            r.nodes()["n1"].image("b").unwrap().retries(),
            ["connection reset"]
        );
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("b"),
            attempt: 2,
            at: at(4),
        });
        r.apply(Event::PullDone {
            node: s("n1"),
            image: s("b"),
            at: at(5),
        });
        assert!(!r.is_finished());
        assert_eq!(r.nodes()["n1"].fetched(), None, "not measured yet");
        r.apply(Event::Fetched {
            node: s("n1"),
            bytes: 180,
            source: FetchedSource::ContentStore,
        });
        r.apply(Event::Pinned {
            node: s("n1"),
            method: PinMethod::ContainerdLabel,
            confirmed: false,
            at: at(5),
        });
        let n = &r.nodes()["n1"];
        assert_eq!(
            (n.present_count(), n.lazy_count(), n.pulled_count()),
            (1, 0, 2),
            "told apart after pinning turned every image pinned"
        );
        assert_eq!(n.pinned_count(), 3);
        assert_eq!(n.fetched(), Some((180, FetchedSource::ContentStore)));
        assert_eq!(
            n.state,
            NodeState::Pinned {
                method: PinMethod::ContainerdLabel,
                confirmed: false,
                took: at(5) - at(0)
            }
        );
        assert!(
            n.images()
                .all(|(_, i)| i.state == ImageState::Pinned { confirmed: false })
        );
        assert!(r.is_finished());
        assert_eq!(
            n.images().map(|(r, _)| r).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn a_pull_without_byte_progress_is_stalled() {
        let t0 = Instant::now();
        let mut r = Rollout::default();
        r.apply(Event::NodeStarted {
            node: s("n1"),
            images: vec![s("a"), s("b")],
            at: t0,
        });
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("a"),
            attempt: 1,
            at: t0,
        });
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("b"),
            attempt: 1,
            at: t0,
        });
        let later = t0 + Duration::from_secs(30);
        r.apply(Event::PullProgress {
            node: s("n1"),
            image: s("b"),
            done: 10,
            total: 100,
            at: later,
        });
        // The same figure again is not progress.
        r.apply(Event::PullProgress {
            node: s("n1"),
            image: s("b"),
            done: 10,
            total: 100,
            at: later + Duration::from_secs(40),
        });
        let n = &r.nodes()["n1"];
        let minute = Duration::from_secs(60);
        assert_eq!(n.stalled(t0 + Duration::from_secs(59), minute).count(), 0);
        assert_eq!(n.stalled(t0 + minute, minute).collect::<Vec<_>>(), ["a"]);
        assert_eq!(
            n.stalled(later + minute, minute).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[test]
    fn refused_and_stopped_nodes_skip_what_is_left() {
        let t0 = Instant::now();
        let mut r = Rollout::default();
        r.apply(Event::NodeRefused {
            node: s("small"),
            reason: s("plan verdict no-space"),
        });
        r.apply(Event::NodeStarted {
            node: s("n2"),
            images: vec![s("a"), s("b")],
            at: t0,
        });
        r.apply(Event::PullStarted {
            node: s("n2"),
            image: s("a"),
            attempt: 1,
            at: t0,
        });
        r.apply(Event::PullFailed {
            node: s("n2"),
            image: s("a"),
            reason: s("no space left on device"),
            at: t0,
        });
        r.apply(Event::NodeStopped {
            node: s("n2"),
            reason: s("out of space"),
            at: t0,
        });
        assert_eq!(
            r.nodes()["small"].state,
            NodeState::Refused {
                reason: s("plan verdict no-space")
            }
        );
        assert_eq!(
            r.nodes()["n2"].image("b").unwrap().state,
            ImageState::Skipped
        );
        assert!(r.is_finished());

        // An operator retry on the stopped node resumes it.
        let later = t0 + Duration::from_secs(9);
        r.apply(Event::PullStarted {
            node: s("n2"),
            image: s("a"),
            attempt: 1,
            at: later,
        });
        assert_eq!(r.nodes()["n2"].state, NodeState::Pulling { since: later });
        assert!(!r.is_finished());
    }

    #[test]
    fn an_expected_node_keeps_the_rollout_open_until_heard_from() {
        let mut r = Rollout::expecting(&[s("n1"), s("n2")]);
        assert!(!r.is_finished());
        r.apply(Event::NodeRefused {
            node: s("n1"),
            reason: s("no-space"),
        });
        assert!(!r.is_finished(), "n2 has not reported yet");
        r.apply(Event::NodeRefused {
            node: s("n2"),
            reason: s("unreachable"),
        });
        assert!(r.is_finished());
    }

    /// A large rollout holds a million of these: 2,000 nodes × 500 images in about 50 MB.
    #[test]
    fn an_image_costs_48_bytes() {
        assert_eq!(std::mem::size_of::<ImageState>(), 24);
        assert_eq!(std::mem::size_of::<ImageRollout>(), 48);
    }

    #[test]
    fn references_are_stored_once_per_rollout_and_lists_copied_only_when_a_node_differs() {
        let t0 = Instant::now();
        let mut r = Rollout::default();
        for node in ["n1", "n2"] {
            r.apply(Event::NodeStarted {
                node: s(node),
                images: vec![s("a"), s("b")],
                at: t0,
            });
        }
        r.apply(Event::NodeStarted {
            node: s("n3"),
            images: vec![s("b"), s("c")],
            at: t0,
        });
        assert_eq!(reference(&r, "n1", "a"), reference(&r, "n2", "a"));
        assert_eq!(reference(&r, "n1", "b"), reference(&r, "n3", "b"));

        // An image n1 never announced is n1's alone.
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("z"),
            attempt: 1,
            at: t0,
        });
        let names = |node: &str| r.nodes()[node].images().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(names("n1"), ["a", "b", "z"]);
        assert_eq!(names("n2"), ["a", "b"]);
        assert_eq!(reference(&r, "n1", "a"), reference(&r, "n2", "a"));
    }

    /// The figures kept current per event equal a recount, whatever the order events come in.
    #[test]
    fn kept_figures_equal_a_recount_after_any_events() {
        let t0 = Instant::now();
        let (nodes, images) = (["n1", "n2", "n3"], ["a", "b", "c", "d"]);
        let mut seed: u64 = 7;
        let mut next = |below: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % below
        };
        let mut r = Rollout::expecting(&[s("n1")]);
        for step in 0..5000u64 {
            let (node, image) = (s(nodes[next(3)]), s(images[next(4)]));
            let at = t0 + Duration::from_secs(step);
            r.apply(match next(12) {
                0 => Event::NodeStarted {
                    node,
                    images: images[..1 + next(4)].iter().map(|i| s(i)).collect(),
                    at,
                },
                1 => Event::ImagePresent { node, image },
                2 | 3 => Event::PullStarted {
                    node,
                    image,
                    attempt: 1,
                    at,
                },
                4 | 5 => Event::PullProgress {
                    node,
                    image,
                    done: next(100) as u64,
                    total: 100,
                    at,
                },
                6 => Event::PullRetry {
                    node,
                    image,
                    attempt: 1,
                    reason: s("reset"),
                    backoff: Duration::from_secs(1),
                    at,
                },
                7 => Event::PullDone { node, image, at },
                8 => Event::PullFailed {
                    node,
                    image,
                    reason: s("gone"),
                    at,
                },
                9 => Event::PullCancelled { node, image, at },
                10 => Event::NodeStopped {
                    node,
                    reason: s("full"),
                    at,
                },
                _ => Event::Pinned {
                    node,
                    method: PinMethod::CrioDropIn,
                    confirmed: true,
                    at,
                },
            });
            for n in r.nodes().values() {
                let sum = |bytes: fn(&ImageRollout) -> u64| {
                    n.images().map(|(_, i)| bytes(i)).sum::<u64>()
                };
                assert_eq!(n.done_bytes(), sum(|i| i.done_bytes));
                assert_eq!(n.total_bytes(), sum(|i| i.total_bytes));
                assert_eq!(
                    n.failed(),
                    n.count(|s| matches!(s, ImageState::Failed { .. }))
                );
                let mut running: Vec<&str> = n
                    .images()
                    .filter(|(_, i)| matches!(i.state, ImageState::Pulling { .. }))
                    .map(|(name, _)| name)
                    .collect();
                running.sort();
                let every_running = n.stalled(at, Duration::ZERO).collect::<Vec<_>>();
                assert_eq!(every_running, running, "step {step}");
            }
            let open = r
                .nodes()
                .values()
                .any(|n| matches!(n.state, NodeState::Waiting | NodeState::Pulling { .. }));
            assert_eq!(r.is_finished(), !open, "step {step}");
        }
    }
}

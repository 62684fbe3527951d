//! Rollout state: node × image, fed by the engine's events. Pure: time comes in with the events and the
//! queries, never from a clock here, so every transition is unit-testable.
//!
//! The engine (src/engine.rs) sends [`Event`]s; the TUI and the headless commands fold them into one
//! [`Rollout`] with [`Rollout::apply`] and read states, bytes, throughput and ETA from it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How a node enforces pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMethod {
    /// `pinned_images` in a CRI-O drop-in, then a reload.
    CrioDropIn,
    /// The image label `io.cri-containerd.pinned=pinned` through containerd's images service.
    ContainerdLabel,
}

/// What the engine reports. `at` is when it happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The node will not be started (plan verdict no-space without --force, unreachable...).
    NodeRefused { node: String, reason: String },
    /// Pulls are about to start on the node, for these images in this order.
    NodeStarted {
        node: String,
        images: Vec<String>,
        at: Instant,
    },
    /// Already on the node: nothing to pull.
    ImagePresent { node: String, image: String },
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
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImageState {
    Queued,
    Present,
    Pulling {
        attempt: u32,
        since: Instant,
    },
    /// Waiting to retry after a failed attempt.
    Retrying {
        attempt: u32,
        reason: String,
        until: Instant,
    },
    Pulled {
        took: Duration,
    },
    Pinned {
        confirmed: bool,
    },
    Failed {
        reason: String,
    },
    Cancelled,
    /// Never started: the node stopped or was refused first.
    Skipped,
}

impl ImageState {
    /// A state that will not change without an operator (retry) or a new rollout.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            ImageState::Present
                | ImageState::Pinned { .. }
                | ImageState::Failed { .. }
                | ImageState::Cancelled
                | ImageState::Skipped
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ImageRollout {
    pub state: ImageState,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// When bytes last moved (or the pull started): the basis of stall detection.
    pub last_progress: Option<Instant>,
    /// Every retry's reason, oldest first.
    pub retries: Vec<String>,
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
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRollout {
    pub state: NodeState,
    /// In the order the engine pulls them.
    pub images: BTreeMap<String, ImageRollout>,
    pub order: Vec<String>,
    // Kept current by every image event, so that per-frame queries over thousands of nodes do not walk
    // every image: sums of the images' done and total bytes, and the pulls now running.
    done: u64,
    total: u64,
    /// Running pulls and when their bytes last moved.
    pulling: BTreeMap<String, Option<Instant>>,
}

impl NodeRollout {
    fn new(state: NodeState) -> Self {
        NodeRollout {
            state,
            images: BTreeMap::new(),
            order: Vec::new(),
            done: 0,
            total: 0,
            pulling: BTreeMap::new(),
        }
    }

    /// Bytes fetched so far on this node, finished pulls included.
    pub fn done_bytes(&self) -> u64 {
        self.done
    }

    /// Bytes this node's pulls are known to need so far (grows as pulls reveal their totals).
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Changes one image (recording it if the node never announced it), keeping the node's byte sums and
    /// running pulls current.
    fn update_image(&mut self, image: &str, change: impl FnOnce(&mut ImageRollout)) {
        if !self.images.contains_key(image) {
            self.order.push(image.to_string());
            self.images.insert(image.to_string(), queued());
        }
        let i = self.images.get_mut(image).expect("inserted above");
        let (done, total) = (i.done_bytes, i.total_bytes);
        change(i);
        self.done = self.done - done + i.done_bytes;
        self.total = self.total - total + i.total_bytes;
        if matches!(i.state, ImageState::Pulling { .. }) {
            match self.pulling.get_mut(image) {
                Some(last) => *last = i.last_progress,
                None => {
                    self.pulling.insert(image.to_string(), i.last_progress);
                }
            }
        } else {
            self.pulling.remove(image);
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

    /// Pulls whose bytes have not moved for `stall_after`. Only running pulls are looked at.
    pub fn stalled(&self, now: Instant, stall_after: Duration) -> impl Iterator<Item = &str> {
        self.pulling.iter().filter_map(move |(image, last)| {
            last.is_some_and(|t| now.saturating_duration_since(t) >= stall_after)
                .then_some(image.as_str())
        })
    }

    pub fn count(&self, pred: impl Fn(&ImageState) -> bool) -> usize {
        self.images.values().filter(|i| pred(&i.state)).count()
    }
}

/// Every node's rollout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rollout {
    pub nodes: BTreeMap<String, NodeRollout>,
}

impl Rollout {
    /// A rollout about to start on `nodes`: each waits until the engine reports on it, so the rollout is
    /// not finished while any has yet to be heard from.
    pub fn expecting(nodes: &[String]) -> Rollout {
        Rollout {
            nodes: nodes
                .iter()
                .map(|n| (n.clone(), NodeRollout::new(NodeState::Waiting)))
                .collect(),
        }
    }

    /// Folds one event in. Events for images the node never announced are recorded as they come.
    pub fn apply(&mut self, event: Event) {
        match event {
            Event::NodeRefused { node, reason } => {
                self.nodes
                    .insert(node, NodeRollout::new(NodeState::Refused { reason }));
            }
            Event::NodeStarted { node, images, at } => {
                let mut rollout = NodeRollout::new(NodeState::Pulling { since: at });
                for image in &images {
                    rollout.images.insert(image.clone(), queued());
                }
                rollout.order = images;
                self.nodes.insert(node, rollout);
            }
            Event::ImagePresent { node, image } => {
                self.image(&node, &image, |i| i.state = ImageState::Present)
            }
            Event::PullStarted {
                node,
                image,
                attempt,
                at,
            } => {
                // A retry on a stopped node (space freed, operator asked) resumes it.
                let n = self.node(&node);
                if matches!(n.state, NodeState::Stopped { .. } | NodeState::Waiting) {
                    n.state = NodeState::Pulling { since: at };
                }
                self.image(&node, &image, |i| {
                    i.state = ImageState::Pulling { attempt, since: at };
                    i.last_progress = Some(at);
                });
            }
            Event::PullProgress {
                node,
                image,
                done,
                total,
                at,
            } => {
                self.image(&node, &image, |i| {
                    if done != i.done_bytes || i.last_progress.is_none() {
                        i.last_progress = Some(at);
                    }
                    i.done_bytes = done;
                    i.total_bytes = total.max(done);
                });
            }
            Event::PullRetry {
                node,
                image,
                attempt,
                reason,
                backoff,
                at,
            } => {
                self.image(&node, &image, |i| {
                    i.retries.push(reason.clone());
                    i.state = ImageState::Retrying {
                        attempt,
                        reason,
                        until: at + backoff,
                    };
                });
            }
            Event::PullDone { node, image, at } => self.image(&node, &image, |i| {
                let took = match i.state {
                    ImageState::Pulling { since, .. } => at.saturating_duration_since(since),
                    _ => Duration::ZERO,
                };
                i.state = ImageState::Pulled { took };
                i.total_bytes = i.total_bytes.max(i.done_bytes);
            }),
            Event::PullFailed {
                node,
                image,
                reason,
                ..
            } => self.image(&node, &image, |i| i.state = ImageState::Failed { reason }),
            Event::PullCancelled { node, image, .. } => {
                self.image(&node, &image, |i| i.state = ImageState::Cancelled)
            }
            Event::NodeStopped { node, reason, .. } => {
                let n = self.node(&node);
                n.state = NodeState::Stopped { reason };
                for i in n
                    .images
                    .values_mut()
                    .filter(|i| matches!(i.state, ImageState::Queued))
                {
                    i.state = ImageState::Skipped;
                }
            }
            Event::Pinned {
                node,
                method,
                confirmed,
                at,
            } => {
                let n = self.node(&node);
                let took = match n.state {
                    NodeState::Pulling { since } => at.saturating_duration_since(since),
                    _ => Duration::ZERO,
                };
                n.state = NodeState::Pinned {
                    method,
                    confirmed,
                    took,
                };
                for i in n
                    .images
                    .values_mut()
                    .filter(|i| matches!(i.state, ImageState::Pulled { .. } | ImageState::Present))
                {
                    i.state = ImageState::Pinned { confirmed };
                }
            }
            Event::PinFailed { node, reason, .. } => {
                self.node(&node).state = NodeState::PinFailed { reason }
            }
        }
    }

    fn node(&mut self, node: &str) -> &mut NodeRollout {
        self.nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeRollout::new(NodeState::Waiting))
    }

    fn image(&mut self, node: &str, image: &str, change: impl FnOnce(&mut ImageRollout)) {
        self.node(node).update_image(image, change);
    }

    /// Bytes done and known total over every node.
    pub fn bytes(&self) -> (u64, u64) {
        self.nodes.values().fold((0, 0), |(d, t), n| {
            (d + n.done_bytes(), t + n.total_bytes())
        })
    }

    /// Whether nothing more will happen without an operator: every node refused, stopped, pinned or failed.
    pub fn is_finished(&self) -> bool {
        !self.nodes.is_empty()
            && self
                .nodes
                .values()
                .all(|n| !matches!(n.state, NodeState::Waiting | NodeState::Pulling { .. }))
    }
}

fn queued() -> ImageRollout {
    ImageRollout {
        state: ImageState::Queued,
        done_bytes: 0,
        total_bytes: 0,
        last_progress: None,
        retries: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> String {
        text.to_string()
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
        let n = &r.nodes["n1"];
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
            r.nodes["n1"].images["a"].state,
            ImageState::Pulled {
                took: Duration::from_secs(2)
            }
        );
        assert_eq!(
            r.nodes["n1"].done_bytes(),
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
        assert_eq!(r.nodes["n1"].images["b"].retries, ["connection reset"]);
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
        r.apply(Event::Pinned {
            node: s("n1"),
            method: PinMethod::ContainerdLabel,
            confirmed: false,
            at: at(5),
        });
        let n = &r.nodes["n1"];
        assert_eq!(
            n.state,
            NodeState::Pinned {
                method: PinMethod::ContainerdLabel,
                confirmed: false,
                took: at(5) - at(0)
            }
        );
        assert!(
            n.images
                .values()
                .all(|i| i.state == ImageState::Pinned { confirmed: false })
        );
        assert!(r.is_finished());
        assert_eq!(n.order, ["a", "b", "c"]);
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
        let n = &r.nodes["n1"];
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
            r.nodes["small"].state,
            NodeState::Refused {
                reason: s("plan verdict no-space")
            }
        );
        assert_eq!(r.nodes["n2"].images["b"].state, ImageState::Skipped);
        assert!(r.is_finished());

        // An operator retry on the stopped node resumes it.
        let later = t0 + Duration::from_secs(9);
        r.apply(Event::PullStarted {
            node: s("n2"),
            image: s("a"),
            attempt: 1,
            at: later,
        });
        assert_eq!(r.nodes["n2"].state, NodeState::Pulling { since: later });
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
}

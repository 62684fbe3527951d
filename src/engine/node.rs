//! One node's rollout: refused when its plan says no-space (unless forced) or it cannot be reached; images
//! already present are skipped (those present only lazily said so, as the plan found them, or pulled whole
//! where the node pulls whole: [`super::route`]; on CRI-O, one there only under its tags is pulled by its
//! reference, which adds the name pinned_images is matched against); the rest are pulled `parallel` at a time from a queue the
//! operator can cancel from and retry into, with byte progress where the runtime shows it (containerd); "no
//! space left on device" stops the remaining pulls; pins are written last, once every image is there. What
//! the runtime fetched is measured where it can be (containerd's content store before and after).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

use super::job::{Control, NodeJob};
use super::pin::Pinning;
use super::pull::{PullFailure, PullOn, pull};
use super::route::{Route, route};
use super::shared::Shared;
use crate::backend::cri::{CriClient, CriError, DEFAULT_TIMEOUT};
use crate::backend::crio_counter;
use crate::backend::held::content_store;
use crate::backend::pins::{PinTarget, resolve};
use crate::backend::progress::{self, Tracker};
use crate::model::crio_progress::{CounterShares, MetricsAt};
use crate::model::plan::{NodePlan, Verdict};
use crate::model::rollout::{Event, FetchedSource};
use crate::model::runtime::{Runtime, RuntimeKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Queued,
    Running,
    /// Present before, or pulled and confirmed.
    Ok,
    Failed,
    Cancelled,
}

pub(super) async fn run_node(
    job: NodeJob,
    shared: Arc<Shared>,
    mut control: UnboundedReceiver<Control>,
) {
    let name = job.node.name.clone();
    let refuse = |reason: String| {
        shared.emit(Event::NodeRefused {
            node: name.clone(),
            reason,
        })
    };
    if job.plan.verdict == Verdict::NoSpace && !shared.config.force {
        return refuse(format!(
            "plan verdict no-space: {} ({})",
            job.plan.reasons.join("; "),
            shared.config.no_space_hint
        ));
    }
    let connected = async {
        let client = CriClient::connect(&job.node.endpoint, DEFAULT_TIMEOUT).await?;
        let version = client.version().await?;
        Ok::<_, CriError>((client, version))
    };
    let (client, version) = match connected.await {
        Ok(c) => c,
        Err(e) => return refuse(e.to_string()),
    };
    let order: Vec<String> = job
        .plan
        .images
        .iter()
        .map(|i| i.reference.to_string())
        .collect();
    let statuses = client.image_records(&order, true).await;
    let runtime = Runtime::identify(&version.runtime_name, &version.runtime_version);
    let route = Arc::new(route(&client, runtime.as_ref().map(|r| r.kind), &job, &shared).await);
    let progress = runtime
        .as_ref()
        .is_some_and(|r| r.kind == RuntimeKind::Containerd);
    // What the content store holds before the pulls: the fetched bytes are measured against it, and progress
    // must not count a blob the node holds for an image outside the set, or a pull's total would exceed
    // the plan's.
    let store_before = match progress {
        true => content_store(&client).await.ok(),
        false => None,
    };
    let (counter, bytes_note) = match &runtime {
        Some(r) if r.kind == RuntimeKind::Crio => {
            crio_counter(&client, &version.runtime_name, job.pin.clone()).await
        }
        _ => (None, None),
    };
    let mut node = NodeRun {
        counter,
        planned: job
            .plan
            .images
            .iter()
            .map(|i| (i.reference.to_string(), i.fetch_bytes))
            .collect(),
        route,
        recorded: HashSet::new(),
        name: name.clone(),
        client,
        progress,
        runtime,
        runtime_name: version.runtime_name,
        shared: Arc::clone(&shared),
        status: HashMap::new(),
        queue: VecDeque::new(),
        tracker: Tracker::new(store_before.iter().flat_map(|s| s.keys().cloned())),
        totals: HashMap::new(),
        sent: HashMap::new(),
        bytes: HashMap::new(),
    };
    let mut present = Vec::new();
    let crio = node
        .runtime
        .as_ref()
        .is_some_and(|r| r.kind == RuntimeKind::Crio);
    for (image, status) in order.iter().zip(statuses) {
        match status {
            // CRI-O matches pinned_images against the names it stored: an image it has only under its tags
            // (a pod pulled it by tag) cannot be pinned by the set's digest reference. A pull by that
            // reference adds the name; every blob is there, so nothing is downloaded.
            Ok(Some(record)) if crio && !record.pinned && !record.repo_tags.is_empty() => {
                tracing::info!(
                    "{name}: {image} is there as {}: pulled by its digest to add that name",
                    record.repo_tags.join(", ")
                );
                node.queue.push_back(image.clone());
            }
            Ok(Some(_)) => present.push(image),
            Ok(None) => node.queue.push_back(image.clone()),
            Err(e) => return refuse(e.to_string()),
        }
    }
    shared.emit(Event::NodeStarted {
        node: name.clone(),
        images: order.clone(),
        at: Instant::now(),
    });
    if let Some((counted, note)) = bytes_note {
        shared.emit(Event::NodeBytes {
            node: name.clone(),
            counted,
            note,
        });
    }
    for image in present {
        let lazy = job
            .plan
            .images
            .iter()
            .find(|i| *i.reference == **image)
            .and_then(|i| i.lazy.as_deref());
        if lazy.is_some() && node.route.whole() {
            // Pre-loading needs every byte on the node: pulled whole, its record kept.
            node.recorded.insert(image.clone());
            node.queue.push_back(image.clone());
            continue;
        }
        node.status.insert(image.clone(), Status::Ok);
        if let Some(facts) = shared.images.get(image) {
            node.tracker.add_present(facts);
        }
        shared.emit(match lazy {
            // Accepted lazily (--allow-lazy), or a runtime pinboard cannot pull whole on: left as it is.
            Some(lazy) => Event::ImageLazy {
                node: name.clone(),
                image: image.clone(),
                remote: lazy.remote_layers.len(),
                layers: lazy.layers,
            },
            None => Event::ImagePresent {
                node: name.clone(),
                image: image.clone(),
            },
        });
    }
    for image in &node.queue {
        node.status.insert(image.clone(), Status::Queued);
    }
    let to_pull: Vec<String> = node.queue.iter().cloned().collect();
    let pulled_all = node.pull_all(&mut control).await;
    node.report_fetched(store_before, &to_pull, &job.plan).await;
    if pulled_all {
        let holds = order
            .into_iter()
            .map(|image| {
                let sets = job.holders.get(&image).cloned().unwrap_or_default();
                (image, sets)
            })
            .collect();
        node.pin(job.pin, holds).await;
    }
}

/// How a CRI-O node's pull bytes are read, and what to say of it once ([`Event::NodeBytes`]): its pull-bytes
/// counter when its configuration has it serve one and count as pulls go (see
/// [`crate::model::crio_progress`]), read once before any pull starts; else why there are no bytes.
async fn crio_counter(
    client: &CriClient,
    runtime_name: &str,
    pin: PinTarget,
) -> (Option<(MetricsAt, CounterShares)>, Option<(bool, String)>) {
    let Ok(PinTarget::CrioDropIn { config_dir, .. }) = resolve(pin, runtime_name, client) else {
        return (None, None);
    };
    let unknown = |e: String| {
        (
            None,
            Some((false, format!("CRI-O's pull bytes are unknown: {e}"))),
        )
    };
    let read = tokio::task::spawn_blocking(move || crio_counter::read_progress(&config_dir)).await;
    let settings = match read.map_err(|e| e.to_string()) {
        Ok(Ok(settings)) => settings,
        Ok(Err(e)) => return unknown(e.to_string()),
        Err(e) => return unknown(e),
    };
    if let Some(why) = settings.why_no_bytes() {
        return (None, Some((false, why)));
    }
    let at = settings
        .metrics
        .expect("counts bytes: its metrics are served");
    match crio_counter::pull_bytes(&at).await {
        Ok(start) => {
            let note = format!(
                "bytes from CRI-O's counters, every {:?} and at each blob's end (the node's total exact, \
                 each pull's share an estimate); CRI-O cancels a pull that moves no byte for {:?}",
                settings.pull_progress_timeout / 10,
                settings.pull_progress_timeout
            );
            (
                Some((at, CounterShares::starting_at(start))),
                Some((true, note)),
            )
        }
        Err(e) => unknown(e.to_string()),
    }
}

/// One node's rollout state.
struct NodeRun {
    /// A CRI-O node's pull-bytes counter and each pull's share of it.
    counter: Option<(MetricsAt, CounterShares)>,
    /// What the plan says each image fetches on this node.
    planned: HashMap<String, u64>,
    name: String,
    client: CriClient,
    /// How its pulls go.
    route: Arc<Route>,
    /// Images it holds a record of already (present only lazily, pulled whole).
    recorded: HashSet<String>,
    /// As CRI Version names it: [`crate::backend::pins::resolve`] picks how the node pins from it, and it
    /// names a runtime pinboard does not know.
    runtime_name: String,
    /// None for a runtime pinboard does not know: nothing is assumed about what it reports.
    runtime: Option<Runtime>,
    /// Whether byte progress can be polled (containerd).
    progress: bool,
    shared: Arc<Shared>,
    status: HashMap<String, Status>,
    queue: VecDeque<String>,
    tracker: Tracker,
    /// Bytes to fetch per tracked pull.
    totals: HashMap<String, u64>,
    /// The last progress figure sent per image, to send only changes.
    sent: HashMap<String, u64>,
    /// Each running tracked pull's bytes (done, total), watched by the pull for stalls.
    bytes: HashMap<String, watch::Sender<(u64, u64)>>,
}

/// Where a node's pulling stands.
#[derive(Default)]
struct Flow {
    /// Out of space: start nothing more until an operator retries.
    stopped: bool,
    /// NodeStopped was sent for the current stop.
    stop_reported: bool,
    cancelled_all: bool,
    control_open: bool,
}

/// The pulls running on a node.
#[derive(Default)]
struct Running {
    tasks: JoinSet<Result<(), PullFailure>>,
    images: HashMap<tokio::task::Id, String>,
    aborts: HashMap<String, AbortHandle>,
    /// Aborted to be started again (a retry of a running pull).
    requeue: Vec<String>,
}

impl NodeRun {
    fn emit(&self, event: Event) {
        self.shared.emit(event);
    }

    /// Says what the runtime fetched for the images of `to_pull`: the blobs containerd's content store
    /// gained since `store_before` (when it could be listed both times), CRI-O's pull-bytes counter's
    /// growth, else what the plan counts for the images that were pulled.
    async fn report_fetched(
        &mut self,
        store_before: Option<HashMap<String, u64>>,
        to_pull: &[String],
        plan: &NodePlan,
    ) {
        let store_after = match store_before {
            Some(_) => content_store(&self.client).await.ok(),
            None => None,
        };
        let counted = match &mut self.counter {
            Some((at, shares)) => crio_counter::pull_bytes(at).await.ok().map(|counter| {
                shares.update(counter);
                shares.fetched()
            }),
            None => None,
        };
        let (bytes, source) = match (counted, store_before, store_after) {
            (Some(counted), _, _) => (counted, FetchedSource::RuntimeCounters),
            (None, Some(before), Some(after)) => (
                after
                    .iter()
                    .filter(|(digest, _)| !before.contains_key(*digest))
                    .map(|(_, size)| size)
                    .sum(),
                FetchedSource::ContentStore,
            ),
            _ => (
                plan.images
                    .iter()
                    .filter(|i| to_pull.iter().any(|r| **r == *i.reference))
                    .filter(|i| self.status.get(&*i.reference) == Some(&Status::Ok))
                    .map(|i| i.fetch_bytes)
                    .sum(),
                FetchedSource::Plan,
            ),
        };
        self.emit(Event::Fetched {
            node: self.name.clone(),
            bytes,
            source,
        });
    }

    /// Pulls until every image is pulled (true: pin now) or the node settles with failures and no retry
    /// can come (false).
    async fn pull_all(&mut self, control: &mut UnboundedReceiver<Control>) -> bool {
        let parallel = self.shared.config.parallel.max(1);
        let mut running = Running::default();
        let mut flow = Flow {
            control_open: true,
            ..Flow::default()
        };
        let mut tick = tokio::time::interval(self.shared.config.progress_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            while !flow.stopped && running.aborts.len() < parallel {
                let Some(image) = self.queue.pop_front() else {
                    break;
                };
                self.spawn_pull(&mut running, image);
            }
            if running.aborts.is_empty() {
                if self.status.values().all(|s| *s == Status::Ok) {
                    return true;
                }
                if !flow.stop_reported {
                    flow.stop_reported = true;
                    self.stop(self.unpinned_reason(flow.cancelled_all));
                }
                if flow.cancelled_all || !flow.control_open {
                    return false;
                }
            }
            tokio::select! {
                Some(joined) = running.tasks.join_next_with_id() => {
                    self.joined(&mut running, &mut flow, joined);
                }
                message = control.recv(), if flow.control_open => {
                    self.control(&mut running, &mut flow, message);
                }
                _ = tick.tick(), if self.polls() => {
                    self.poll_progress().await;
                }
            }
        }
    }

    fn unpinned_reason(&self, cancelled_all: bool) -> String {
        if cancelled_all {
            return "cancelled: nothing pinned".into();
        }
        let bad = self.status.values().filter(|s| **s != Status::Ok).count();
        format!(
            "not pinned: {bad} of {} image(s) failed or were cancelled; \
             pins are written only after every pull succeeded",
            self.status.len()
        )
    }

    fn stop(&self, reason: String) {
        self.emit(Event::NodeStopped {
            node: self.name.clone(),
            reason,
            at: Instant::now(),
        });
    }

    /// A pull task ended: pulled, failed or aborted.
    fn joined(
        &mut self,
        running: &mut Running,
        flow: &mut Flow,
        joined: Result<(tokio::task::Id, Result<(), PullFailure>), tokio::task::JoinError>,
    ) {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, Some(outcome)),
            Err(e) if e.is_cancelled() => (e.id(), None),
            Err(e) => {
                let reason = format!("internal error: {e}");
                (
                    e.id(),
                    Some(Err(PullFailure {
                        reason,
                        no_space: false,
                    })),
                )
            }
        };
        let image = running.images.remove(&id).expect("every task is named");
        running.aborts.remove(&image);
        self.tracker.untrack(&image);
        if let Some((_, shares)) = &mut self.counter {
            shares.ended(&image, matches!(outcome, Some(Ok(()))));
        }
        self.bytes.remove(&image);
        match outcome {
            Some(Ok(())) => self.pulled(&image),
            Some(Err(PullFailure { reason, no_space })) => {
                self.status.insert(image.clone(), Status::Failed);
                self.emit(Event::PullFailed {
                    node: self.name.clone(),
                    image,
                    reason: reason.clone(),
                    at: Instant::now(),
                });
                if no_space && !flow.stopped {
                    (flow.stopped, flow.stop_reported) = (true, true);
                    self.stop(format!(
                        "node {}: the image filesystem is full (no space left on device); \
                         its remaining pulls are stopped: {reason}",
                        self.name
                    ));
                }
            }
            None => {
                if let Some(i) = running.requeue.iter().position(|r| *r == image) {
                    running.requeue.swap_remove(i);
                    self.cancelled(image.clone());
                    self.status.insert(image.clone(), Status::Queued);
                    self.queue.push_front(image);
                } else {
                    self.cancelled(image);
                }
            }
        }
    }

    fn control(&mut self, running: &mut Running, flow: &mut Flow, message: Option<Control>) {
        match message {
            None => flow.control_open = false,
            Some(Control::CancelAll) => {
                flow.cancelled_all = true;
                running.aborts.values().for_each(AbortHandle::abort);
                running.requeue.clear();
                for image in std::mem::take(&mut self.queue) {
                    self.cancelled(image);
                }
            }
            Some(Control::Cancel { image, .. }) => {
                if let Some(abort) = running.aborts.get(&image) {
                    abort.abort();
                } else if let Some(i) = self.queue.iter().position(|q| *q == image) {
                    self.queue.remove(i);
                    self.cancelled(image);
                }
            }
            Some(Control::Retry { image, .. }) => {
                let retryable = matches!(
                    self.status.get(&image),
                    Some(Status::Failed | Status::Cancelled)
                );
                if let Some(abort) = running.aborts.get(&image) {
                    abort.abort();
                    running.requeue.push(image);
                } else if retryable && !flow.cancelled_all {
                    self.status.insert(image.clone(), Status::Queued);
                    self.queue.push_back(image);
                    // An operator retrying after the node stopped (e.g. after freeing space) resumes it.
                    (flow.stopped, flow.stop_reported) = (false, false);
                }
            }
        }
    }

    fn cancelled(&mut self, image: String) {
        self.status.insert(image.clone(), Status::Cancelled);
        self.emit(Event::PullCancelled {
            node: self.name.clone(),
            image,
            at: Instant::now(),
        });
    }

    fn spawn_pull(&mut self, running: &mut Running, image: String) {
        self.status.insert(image.clone(), Status::Running);
        let total = match (&mut self.counter, self.shared.images.get(&image)) {
            (Some((_, shares)), _) => {
                let total = self.planned.get(&image).copied().unwrap_or(0);
                shares.track(&image, total);
                Some(total)
            }
            (None, Some(facts)) if self.progress => Some(self.tracker.track(&image, facts)),
            _ => None,
        };
        let mut bytes = None;
        if let Some(total) = total {
            self.totals.insert(image.clone(), total);
            self.sent.remove(&image);
            let (tx, rx) = watch::channel((0, total));
            self.bytes.insert(image.clone(), tx);
            bytes = Some(rx);
        }
        let on = PullOn {
            client: self.client.clone(),
            node: self.name.clone(),
            runtime: self.runtime.as_ref().map(|r| r.kind),
            route: Arc::clone(&self.route),
            recorded: self.recorded.contains(&image),
        };
        let handle = running
            .tasks
            .spawn(pull(on, image.clone(), bytes, Arc::clone(&self.shared)));
        running.images.insert(handle.id(), image.clone());
        running.aborts.insert(image, handle);
    }

    /// A confirmed pull: its last progress figure is its total, and its blobs are on the node now.
    fn pulled(&mut self, image: &str) {
        let at = Instant::now();
        if let Some(&total) = self.totals.get(image).filter(|t| **t > 0) {
            self.emit(Event::PullProgress {
                node: self.name.clone(),
                image: image.into(),
                done: total,
                total,
                at,
            });
        }
        if let Some(facts) = self.shared.images.get(image) {
            self.tracker.add_present(facts);
        }
        self.status.insert(image.into(), Status::Ok);
        self.emit(Event::PullDone {
            node: self.name.clone(),
            image: image.into(),
            at,
        });
    }

    /// Whether pulls are running whose bytes can be read now: containerd's ingests, CRI-O's counter.
    fn polls(&self) -> bool {
        match &self.counter {
            Some(_) => !self.bytes.is_empty(),
            None => self.progress && !self.tracker.is_empty(),
        }
    }

    async fn poll_progress(&mut self) {
        let seen: Vec<(String, u64, u64)> = match &mut self.counter {
            Some((at, shares)) => match crio_counter::pull_bytes(at).await {
                Ok(counter) => shares
                    .update(counter)
                    .into_iter()
                    .map(|(image, s)| (image, s.done, s.total))
                    .collect(),
                // Progress is a nicety: a failed poll is tried again at the next tick.
                Err(e) => return tracing::debug!(node = self.name, error = %e, "CRI-O's counter"),
            },
            None => {
                let listed = tokio::time::timeout(
                    DEFAULT_TIMEOUT,
                    progress::list_ingests(self.client.channel()),
                )
                .await;
                let ingests = match listed {
                    Ok(Ok(ingests)) => ingests,
                    Ok(Err(e)) => {
                        return tracing::debug!(node = self.name, error = %e, "ListStatuses failed");
                    }
                    Err(_) => return tracing::debug!(node = self.name, "ListStatuses timed out"),
                };
                self.tracker
                    .update(&ingests)
                    .into_iter()
                    .map(|(image, b)| (image, b.done, b.total))
                    .collect()
            }
        };
        let at = Instant::now();
        for (image, done, total) in seen {
            if self.sent.insert(image.clone(), done) != Some(done) {
                if let Some(watched) = self.bytes.get(&image) {
                    watched.send_replace((done, total));
                }
                self.shared.emit(Event::PullProgress {
                    node: self.name.clone(),
                    image,
                    done,
                    total,
                    at,
                });
            }
        }
    }

    /// Writes and verifies the pins for every image of the plan (all present now), each held by its sets.
    async fn pin(&self, target: PinTarget, holds: BTreeMap<String, BTreeSet<String>>) {
        let pinning = Pinning {
            client: &self.client,
            runtime_name: &self.runtime_name,
            runtime: self.runtime.as_ref(),
        };
        let outcome = pinning.pin(target, holds).await;
        let at = Instant::now();
        let node = self.name.clone();
        self.emit(match outcome {
            Ok((method, confirmed)) => Event::Pinned {
                node,
                method,
                confirmed,
                at,
            },
            Err(reason) => Event::PinFailed {
                node,
                reason: reason.to_string(),
                at,
            },
        });
    }
}

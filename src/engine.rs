//! The rollout engine: pre-load a plan's images on every node, then pin them, reporting each step as a
//! [`model::rollout::Event`](crate::model::rollout::Event) for the TUI and the headless commands to fold.
//!
//! Per node, as the OpenShift daemon does but faster and watchable: nodes run independently; a node whose
//! plan says no-space is refused unless forced; images already present are skipped; pulls run `parallel`
//! at a time through CRI PullImage with the image's registry credential, retried with exponential backoff
//! (never a fixed sleep after a pull) unless the error is permanent, and each is confirmed with ImageStatus.
//! A pull whose bytes stop moving for `pull_progress_timeout` is cancelled and retried like a failure.
//! "No space left on device" stops the node's remaining pulls. Pins are written only after every pull of
//! the node succeeded, so that image GC can still reclaim space if something fails, then verified
//! through the runtime where it reports pins (CRI `pinned`, [`crate::model::runtime`]): a CRI-O that does
//! not pin what its drop-in now lists ends the node `pin-failed`, with the cause and the fix
//! ([`crate::model::crio::explain_unpinned`]), e.g. a reload known not to apply pins (`--crio-reload
//! restart` then).
//! Operators can cancel and retry single pulls while it runs ([`Control`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle, JoinSet};

use crate::backend::credentials::{Credential, Credentials, Found};
use crate::backend::cri::{CriClient, CriError, DEFAULT_TIMEOUT};
use crate::backend::node::DirectNode;
use crate::backend::pins::{self, PinTarget, Reload, connect_resolved, resolve};
use crate::backend::progress::{self, Tracker};
use crate::model::crio::{ReloadPins, Unpinned, explain_unpinned};
use crate::model::holders::{Holder, Holders, PinChange, Release};
use crate::model::image::ImageFacts;
use crate::model::plan::{NodePlan, Verdict};
use crate::model::reference::ImageRef;
use crate::model::rollout::{Event, PinMethod, Rollout};
use crate::model::runtime::{PinReports, Runtime};
use crate::model::units::clock;

/// How long the runtime gets to show written pins as pinned (CRI-O applies a reload asynchronously), and
/// how often it is asked meanwhile.
const CONFIRM_WITHIN: Duration = Duration::from_secs(5);
const CONFIRM_EVERY: Duration = Duration::from_millis(250);

/// How the engine runs. [`Default`] is the OpenShift daemon's schedule, minus its sleep after each pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Pulls at once per node.
    pub parallel: usize,
    /// Tries per image, the first included.
    pub attempts: u32,
    /// Wait before the first retry, doubled for each further one up to `backoff_max`.
    pub backoff_start: Duration,
    pub backoff_max: Duration,
    /// Deadline of one PullImage call.
    pub pull_timeout: Duration,
    /// A pull whose bytes have not moved for this long, short of its total, is cancelled and counts as a
    /// failed attempt (where byte progress is seen: containerd). Zero: never.
    pub pull_progress_timeout: Duration,
    /// How often byte progress is polled on containerd nodes.
    pub progress_interval: Duration,
    /// Start nodes whose plan verdict is no-space.
    pub force: bool,
    /// Pull and write nothing: every node is refused.
    pub readonly: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            parallel: 5,
            attempts: 5,
            backoff_start: Duration::from_secs(1),
            backoff_max: Duration::from_secs(10),
            pull_timeout: Duration::from_secs(30 * 60),
            // containerd 1.7's image_pull_progress_timeout.
            pull_progress_timeout: Duration::from_secs(5 * 60),
            progress_interval: Duration::from_millis(500),
            force: false,
            readonly: false,
        }
    }
}

impl EngineConfig {
    /// The wait after failed attempt `attempt` (1-based): 1, 2, 4, 8, 10, 10... seconds by default.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_start
            .checked_mul(factor)
            .map_or(self.backoff_max, |b| b.min(self.backoff_max))
    }
}

/// One node to roll out: where it is, its plan from the survey (verdict and images, in order), how to
/// pin, and which sets hold each image's pin ([`crate::model::holders::holders_of`]).
#[derive(Clone, Debug)]
pub struct NodeJob {
    pub node: DirectNode,
    pub plan: NodePlan,
    pub pin: PinTarget,
    pub holders: Arc<BTreeMap<String, BTreeSet<String>>>,
}

/// What an operator can do while the engine runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Pull the image again on that node: after a failure or cancel, or now if it is running (stalled).
    Retry { node: String, image: String },
    /// Abort that pull (or drop it from the queue).
    Cancel { node: String, image: String },
    /// Abort every pull on every node; nothing is pinned afterwards.
    CancelAll,
}

impl Control {
    /// The node it is for; None: every node.
    fn node(&self) -> Option<&str> {
        match self {
            Control::Retry { node, .. } | Control::Cancel { node, .. } => Some(node),
            Control::CancelAll => None,
        }
    }
}

/// A running rollout. Events end (the receiver yields None) when every node is done; keep `control` open
/// to be able to retry failed pulls after a node settles, drop it to let nodes with failures finish.
pub struct Engine {
    pub events: UnboundedReceiver<Event>,
    pub control: UnboundedSender<Control>,
    task: JoinHandle<()>,
}

/// Starts rolling out `jobs` on the current tokio runtime. `images` has each reference's facts (blobs and
/// sizes, for byte progress); an image without facts is pulled without progress.
pub fn start(
    jobs: Vec<NodeJob>,
    images: Arc<HashMap<String, ImageFacts>>,
    credentials: Arc<Credentials>,
    config: EngineConfig,
) -> Engine {
    let (events, events_rx) = mpsc::unbounded_channel();
    let (control, control_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        images,
        credentials,
        config,
        events,
    });
    Engine {
        events: events_rx,
        control,
        task: tokio::spawn(supervise(jobs, shared, control_rx)),
    }
}

/// Runs the engine to its end without an operator (the headless `apply`), folding every event.
pub async fn run_to_end(engine: Engine) -> Rollout {
    let Engine {
        mut events,
        control,
        task,
    } = engine;
    // No one will retry: nodes with failures finish instead of waiting.
    drop(control);
    let mut rollout = Rollout::default();
    while let Some(event) = events.recv().await {
        rollout.apply(event);
    }
    let _ = task.await;
    rollout
}

struct Shared {
    images: Arc<HashMap<String, ImageFacts>>,
    credentials: Arc<Credentials>,
    config: EngineConfig,
    events: UnboundedSender<Event>,
}

impl Shared {
    fn emit(&self, event: Event) {
        // The receiver gone means no one is watching; the rollout itself carries on.
        let _ = self.events.send(event);
    }
}

/// Starts every node and routes operator controls to them until all are done.
async fn supervise(
    jobs: Vec<NodeJob>,
    shared: Arc<Shared>,
    mut control: UnboundedReceiver<Control>,
) {
    if shared.config.readonly {
        for job in jobs {
            shared.emit(Event::NodeRefused {
                node: job.node.name,
                reason: "read-only mode: nothing is pulled or pinned (started with --readonly)"
                    .into(),
            });
        }
        return;
    }
    let mut nodes = JoinSet::new();
    let mut names = HashMap::new();
    let mut routes = HashMap::new();
    for job in jobs {
        let (tx, rx) = mpsc::unbounded_channel();
        let name = job.node.name.clone();
        routes.insert(name.clone(), tx);
        let handle = nodes.spawn(run_node(job, Arc::clone(&shared), rx));
        names.insert(handle.id(), name);
    }
    let mut open = true;
    loop {
        tokio::select! {
            joined = nodes.join_next_with_id() => match joined {
                None => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let node = names.get(&e.id()).cloned().unwrap_or_default();
                    tracing::error!(node, error = %e, "node task failed");
                    let reason = format!("internal error: {e}");
                    shared.emit(Event::NodeStopped { node, reason, at: Instant::now() });
                }
            },
            message = control.recv(), if open => match message {
                // Nodes waiting for a retry now finish.
                None => {
                    open = false;
                    routes.clear();
                }
                Some(m) => route(&routes, &m),
            },
        }
    }
}

fn route(routes: &HashMap<String, UnboundedSender<Control>>, message: &Control) {
    for (node, tx) in routes {
        if message.node().is_none_or(|n| n == node) {
            // A node already done has dropped its receiver: nothing left to control there.
            let _ = tx.send(message.clone());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Queued,
    Running,
    /// Present before, or pulled and confirmed.
    Ok,
    Failed,
    Cancelled,
}

/// Why a pull gave up.
struct Failure {
    reason: String,
    no_space: bool,
}

async fn run_node(job: NodeJob, shared: Arc<Shared>, mut control: UnboundedReceiver<Control>) {
    let name = job.node.name.clone();
    let refuse = |reason: String| {
        shared.emit(Event::NodeRefused {
            node: name.clone(),
            reason,
        })
    };
    if job.plan.verdict == Verdict::NoSpace && !shared.config.force {
        return refuse(format!(
            "plan verdict no-space: {} (force to pull anyway)",
            job.plan.reasons.join("; ")
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
        .map(|i| i.reference.clone())
        .collect();
    let statuses = client.image_records(&order, true).await;
    let mut node = NodeRun {
        name: name.clone(),
        client,
        progress: version.runtime_name == "containerd",
        runtime: Runtime::identify(&version.runtime_name, &version.runtime_version),
        runtime_name: version.runtime_name,
        shared: Arc::clone(&shared),
        status: HashMap::new(),
        queue: VecDeque::new(),
        tracker: Tracker::new([]),
        totals: HashMap::new(),
        sent: HashMap::new(),
        bytes: HashMap::new(),
    };
    let mut present = Vec::new();
    for (image, status) in order.iter().zip(statuses) {
        match status {
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
    for image in present {
        node.status.insert(image.clone(), Status::Ok);
        if let Some(facts) = shared.images.get(image) {
            node.tracker.add_present(facts);
        }
        shared.emit(Event::ImagePresent {
            node: name.clone(),
            image: image.clone(),
        });
    }
    for image in &node.queue {
        node.status.insert(image.clone(), Status::Queued);
    }
    if node.pull_all(&mut control).await {
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

/// One node's rollout state.
struct NodeRun {
    name: String,
    client: CriClient,
    /// As CRI Version names it, to decide how the node pins.
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
    tasks: JoinSet<Result<(), Failure>>,
    images: HashMap<tokio::task::Id, String>,
    aborts: HashMap<String, AbortHandle>,
    /// Aborted to be started again (a retry of a running pull).
    requeue: Vec<String>,
}

impl NodeRun {
    fn emit(&self, event: Event) {
        self.shared.emit(event);
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
                _ = tick.tick(), if self.progress && !self.tracker.is_empty() => {
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
        joined: Result<(tokio::task::Id, Result<(), Failure>), tokio::task::JoinError>,
    ) {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, Some(outcome)),
            Err(e) if e.is_cancelled() => (e.id(), None),
            Err(e) => {
                let reason = format!("internal error: {e}");
                (
                    e.id(),
                    Some(Err(Failure {
                        reason,
                        no_space: false,
                    })),
                )
            }
        };
        let image = running.images.remove(&id).expect("every task is named");
        running.aborts.remove(&image);
        self.tracker.untrack(&image);
        self.bytes.remove(&image);
        match outcome {
            Some(Ok(())) => self.pulled(&image),
            Some(Err(Failure { reason, no_space })) => {
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
        let mut bytes = None;
        if self.progress
            && let Some(facts) = self.shared.images.get(&image)
        {
            let total = self.tracker.track(&image, facts);
            self.totals.insert(image.clone(), total);
            self.sent.remove(&image);
            let (tx, rx) = watch::channel((0, total));
            self.bytes.insert(image.clone(), tx);
            bytes = Some(rx);
        }
        let handle = running.tasks.spawn(pull(
            self.client.clone(),
            self.name.clone(),
            self.runtime_name.clone(),
            image.clone(),
            bytes,
            Arc::clone(&self.shared),
        ));
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

    async fn poll_progress(&mut self) {
        let listed = tokio::time::timeout(
            DEFAULT_TIMEOUT,
            progress::list_ingests(self.client.channel()),
        )
        .await;
        let ingests = match listed {
            Ok(Ok(ingests)) => ingests,
            // Progress is a nicety: a failed poll is tried again at the next tick.
            Ok(Err(e)) => {
                return tracing::debug!(node = self.name, error = %e, "ListStatuses failed");
            }
            Err(_) => return tracing::debug!(node = self.name, "ListStatuses timed out"),
        };
        let at = Instant::now();
        for (image, bytes) in self.tracker.update(&ingests) {
            if self.sent.insert(image.clone(), bytes.done) != Some(bytes.done) {
                if let Some(watched) = self.bytes.get(&image) {
                    watched.send_replace((bytes.done, bytes.total));
                }
                self.shared.emit(Event::PullProgress {
                    node: self.name.clone(),
                    image,
                    done: bytes.done,
                    total: bytes.total,
                    at,
                });
            }
        }
    }

    /// Writes and verifies the pins for every image of the plan (all present now), each held by its sets.
    async fn pin(&self, target: PinTarget, holds: BTreeMap<String, BTreeSet<String>>) {
        let outcome = match resolve(target, &self.runtime_name, &self.client) {
            Ok(PinTarget::CrioDropIn { config_dir, reload }) => self
                .drop_in(config_dir, reload, holds)
                .await
                .map(|confirmed| (PinMethod::CrioDropIn, confirmed)),
            Ok(_) => pins::hold_containerd(&self.client, &holds)
                .await
                .map(|held| (PinMethod::ContainerdLabel, held.confirmed))
                .map_err(|e| format!("labelling: {e}")),
            Err(e) => Err(e),
        };
        let at = Instant::now();
        let node = self.name.clone();
        self.emit(match outcome {
            Ok((method, confirmed)) => Event::Pinned {
                node,
                method,
                confirmed,
                at,
            },
            Err(reason) => Event::PinFailed { node, reason, at },
        });
    }

    /// Holds the images in the drop-in for their sets, reloads CRI-O, and asks the runtime whether they are
    /// pinned now: true when it confirms, false when it cannot say; an error naming the cause and the fix
    /// when it reports them not pinned.
    async fn drop_in(
        &self,
        dir: PathBuf,
        reload: Reload,
        holds: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<bool, String> {
        let images: Vec<String> = holds.keys().cloned().collect();
        let images = images.as_slice();
        let config_dir = dir.clone();
        let changed = tokio::task::spawn_blocking(move || {
            // Added to what holds them already: applying one set must not unpin another.
            let changed = pins::hold_crio_pins(&config_dir, &holds)?;
            let back = pins::read_drop_in(&config_dir)?;
            let missing: Vec<String> = holds
                .into_iter()
                .filter(|(image, sets)| {
                    !back.iter().any(|e| {
                        e.pattern == *image
                            && sets
                                .iter()
                                .all(|s| e.holders.contains(&Holder::Set(s.clone())))
                    })
                })
                .map(|(image, _)| image)
                .collect();
            Ok::<_, pins::PinError>((changed, missing))
        })
        .await
        .map_err(|e| format!("writing the CRI-O drop-in: {e}"))?;
        let (changed, missing) = changed.map_err(|e| e.to_string())?;
        if !missing.is_empty() {
            return Err(format!(
                "the CRI-O drop-in does not list {} for its sets after writing it",
                missing.join(", ")
            ));
        }
        let reports = self.reports();
        // Also when the file is as wanted but CRI-O does not pin it yet: a reload that did not take
        // before, or the restart asked for now.
        if changed || (reports.any() && !self.not_pinned(images).await.is_empty()) {
            let how = reload.clone();
            tokio::task::spawn_blocking(move || pins::reload_crio(&how))
                .await
                .map_err(|e| format!("reloading CRI-O: {e}"))?
                .map_err(|e| e.to_string())?;
        }
        if !reports.any() {
            return Ok(false);
        }
        let unpinned = self.confirm(images).await;
        if unpinned.is_empty() {
            return Ok(true);
        }
        Err(self.why_not_pinned(dir, &unpinned).await)
    }

    /// Which CRI calls carry this runtime's word on pins.
    fn reports(&self) -> PinReports {
        self.runtime
            .as_ref()
            .map(Runtime::reports_pinned)
            .unwrap_or_default()
    }

    /// The images the runtime does not report pinned, each with the names it knows it by (one it could not
    /// be asked about counts as not pinned, with none).
    async fn not_pinned(&self, images: &[String]) -> Vec<(String, Vec<String>)> {
        let records = self
            .client
            .image_records(images, self.reports().list_images)
            .await;
        images
            .iter()
            .zip(records)
            .filter_map(|(image, record)| match record {
                Ok(Some(i)) if i.pinned => None,
                Ok(Some(i)) => Some((image.clone(), [i.repo_tags, i.repo_digests].concat())),
                _ => Some((image.clone(), Vec::new())),
            })
            .collect()
    }

    /// What is still not pinned once the runtime had time to apply a reload (asynchronous in CRI-O) or to
    /// come back from a restart.
    async fn confirm(&self, images: &[String]) -> Vec<(String, Vec<String>)> {
        let deadline = Instant::now() + CONFIRM_WITHIN;
        loop {
            let unpinned = self.not_pinned(images).await;
            if unpinned.is_empty() || Instant::now() >= deadline {
                return unpinned;
            }
            tokio::time::sleep(CONFIRM_EVERY).await;
        }
    }

    /// Why CRI-O does not pin `unpinned` after the drop-in in `dir` listed them and it was reloaded: its
    /// files and version explain it as `check` does; what they do not explain is listed.
    async fn why_not_pinned(&self, dir: PathBuf, unpinned: &[(String, Vec<String>)]) -> String {
        let runtime = self
            .runtime
            .as_ref()
            .map_or_else(|| self.runtime_name.clone(), Runtime::to_string);
        let version = self.runtime.as_ref().and_then(Runtime::crio_version);
        let config = match version {
            Some(_) => tokio::task::spawn_blocking(move || pins::read_crio_config(&dir))
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        let images = unpinned
            .iter()
            .map(|(reference, names)| Unpinned { reference, names });
        let (mut reasons, rest) = match &config {
            Some(config) => explain_unpinned(&runtime, version, config, images),
            None => (Vec::new(), images.map(|i| i.reference).collect()),
        };
        if !rest.is_empty() {
            reasons.push(format!(
                "{runtime} does not report {} image(s) pinned after writing the drop-in and reloading: {}",
                rest.len(),
                rest.join(", ")
            ));
        }
        reasons.join("; ")
    }
}

/// What unpinning did on one node: each pin it released a holder of or was asked about, and, on a CRI-O
/// whose reload ignores removals, that the pins stay until it restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeUnpinned {
    pub changes: Vec<PinChange>,
    pub note: Option<String>,
}

/// Unpins on one node what `release` releases: CRI-O's drop-in entries lose those holders and an entry
/// goes with its last one (rewritten only if it changes, then CRI-O is reloaded; no entry left removes the
/// key, and the file when nothing else is in it), containerd's records lose those holder labels and the
/// pin label with the last one. An administrator's entries stay; images are never deleted.
pub async fn unpin(
    node: &DirectNode,
    target: PinTarget,
    release: &Release,
) -> Result<NodeUnpinned, String> {
    let (client, pin) = connect_resolved(node, target, DEFAULT_TIMEOUT).await?;
    match pin {
        PinTarget::CrioDropIn { config_dir, reload } => {
            // A reload that ignores removals leaves them pinned until CRI-O restarts: say so.
            let version = client.version().await.map_err(|e| e.to_string())?;
            let kept_until_restart =
                Runtime::identify(&version.runtime_name, &version.runtime_version)
                    .and_then(|r| r.crio_version())
                    .and_then(|v| ReloadPins::of(v).removal_note())
                    .filter(|_| reload != Reload::Restart);
            let release = release.clone();
            let changes = tokio::task::spawn_blocking(move || {
                let (changed, changes) = pins::release_crio_pins(&config_dir, &release)?;
                if changed {
                    pins::reload_crio(&reload)?;
                }
                Ok::<_, pins::PinError>(changes)
            })
            .await
            .map_err(|e| format!("rewriting the CRI-O drop-in: {e}"))?
            .map_err(|e| e.to_string())?;
            let removed = changes.iter().any(PinChange::removed);
            Ok(NodeUnpinned {
                changes,
                note: kept_until_restart.filter(|_| removed).map(str::to_string),
            })
        }
        _ => Ok(NodeUnpinned {
            changes: pins::release_containerd(&client, release)
                .await
                .map_err(|e| format!("unlabelling: {e}"))?,
            note: None,
        }),
    }
}

/// The sets that hold some pin on one node, as its record says (drop-in marks, holder labels).
pub async fn sets_holding(
    node: &DirectNode,
    target: PinTarget,
) -> Result<BTreeSet<String>, String> {
    let (client, pin) = connect_resolved(node, target, DEFAULT_TIMEOUT).await?;
    let holders: Vec<Holders> = match pin {
        PinTarget::CrioDropIn { config_dir, .. } => {
            tokio::task::spawn_blocking(move || pins::read_drop_in(&config_dir))
                .await
                .map_err(|e| format!("reading the CRI-O drop-in: {e}"))?
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|e| e.holders)
                .collect()
        }
        _ => pins::containerd_images(&client)
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .map(pins::ContainerdImage::holders)
            .collect(),
    };
    Ok(holders
        .into_iter()
        .flatten()
        .filter_map(|h| match h {
            Holder::Set(name) => Some(name),
            _ => None,
        })
        .collect())
}

/// Pulls one image with retries; every success is confirmed with ImageStatus. The image's registry
/// credential goes with every attempt; a refused one says which credential was sent and what the runtime
/// makes of it. An attempt whose `bytes` stop moving for the progress timeout is cancelled and fails.
async fn pull(
    client: CriClient,
    node: String,
    runtime: String,
    image: String,
    mut bytes: Option<watch::Receiver<(u64, u64)>>,
    shared: Arc<Shared>,
) -> Result<(), Failure> {
    let credentials = Arc::clone(&shared.credentials);
    let reference = image.clone();
    // A credential helper may run: off the async threads.
    let found = tokio::task::spawn_blocking(move || find_credential(&credentials, &reference))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|reason| Failure {
            reason,
            no_space: false,
        })?;
    let auth = found.as_ref().and_then(|f| f.credential.to_cri_auth());
    let config = &shared.config;
    let mut attempt = 1;
    loop {
        shared.emit(Event::PullStarted {
            node: node.clone(),
            image: image.clone(),
            attempt,
            at: Instant::now(),
        });
        let pulling = client.pull_image(&image, auth.clone(), config.pull_timeout);
        let limit = config.pull_progress_timeout;
        let pulled = match bytes.as_mut().filter(|_| !limit.is_zero()) {
            Some(bytes) => tokio::select! {
                pulled = pulling => pulled.map_err(|e| e.to_string()),
                () = stalled(bytes, limit) => Err(format!(
                    "no bytes arrived for {} while short of the image's size; the pull was cancelled \
                     (--pull-progress-timeout)",
                    clock(limit)
                )),
            },
            None => pulling.await.map_err(|e| e.to_string()),
        };
        let reason = match pulled {
            Ok(_) => match client.image_status(&image).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {
                    "the pull reported success but ImageStatus does not show the image".to_string()
                }
                Err(e) => format!("confirming the pull: {e}"),
            },
            Err(reason) => reason,
        };
        let kind = classify(&reason);
        if kind != Kind::Transient || attempt >= config.attempts {
            let reason = if kind == Kind::Transient && attempt > 1 {
                format!("{reason} (gave up after {attempt} attempts)")
            } else if refused_access(&reason) {
                format!("{reason}; {}", sent_credential(&runtime, found.as_ref()))
            } else {
                reason
            };
            return Err(Failure {
                reason,
                no_space: kind == Kind::NoSpace,
            });
        }
        let backoff = config.backoff(attempt);
        tracing::info!(
            node,
            image,
            attempt,
            reason,
            ?backoff,
            "pull failed; retrying"
        );
        shared.emit(Event::PullRetry {
            node: node.clone(),
            image: image.clone(),
            attempt,
            reason,
            backoff,
            at: Instant::now(),
        });
        tokio::time::sleep(backoff).await;
        attempt += 1;
    }
}

/// Returns once `bytes` (done, total) has not moved for `limit` while done is short of total: a download
/// that stalled. Bytes all there (the runtime unpacking) never count.
async fn stalled(bytes: &mut watch::Receiver<(u64, u64)>, limit: Duration) {
    bytes.mark_unchanged();
    loop {
        match tokio::time::timeout(limit, bytes.changed()).await {
            Ok(Ok(())) => {}
            // The node no longer polls this pull: nothing to judge by.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => {
                let (done, total) = *bytes.borrow();
                if done < total {
                    return;
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Transient,
    /// Retrying cannot help: a missing image, a refused credential, content that does not match its
    /// digest (the registry's copy is corrupt: asking again downloads the same bytes again).
    Permanent,
    NoSpace,
}

fn classify(reason: &str) -> Kind {
    let lower = reason.to_lowercase();
    if lower.contains("no space left on device") {
        Kind::NoSpace
    } else if [
        "not found",
        "manifest unknown",
        "unauthorized",
        "denied",
        "forbidden",
        "invalid reference",
        // containerd, CRI-O (containers/image), and pinboard's blob cache.
        "unexpected commit digest",
        "digest did not match",
        "digest mismatch",
    ]
    .iter()
    .any(|p| lower.contains(p))
    {
        Kind::Permanent
    } else {
        Kind::Transient
    }
}

/// The credential for the image's registry and repository (None: anonymous).
fn find_credential(credentials: &Credentials, image: &str) -> Result<Option<Found>, String> {
    let reference = ImageRef::parse(image)?;
    credentials
        .lookup(&reference.registry, &reference.repository)
        .map_err(|e| e.to_string())
}

fn refused_access(reason: &str) -> bool {
    let lower = reason.to_lowercase();
    ["unauthorized", "denied", "forbidden"]
        .iter()
        .any(|p| lower.contains(p))
}

/// For a refused pull: which credential went to the node, and what its runtime does with that kind.
fn sent_credential(runtime: &str, found: Option<&Found>) -> String {
    let Some(found) = found.filter(|f| f.credential != Credential::Anonymous) else {
        return "pinboard found no credentials for it in the auth files and pulled anonymously; \
                pass --authfile or log in with podman login"
            .into();
    };
    let sent = format!(
        "pinboard sent the {} from {}",
        found.credential, found.source
    );
    let ignored = match (&found.credential, runtime) {
        (Credential::IdentityToken(_), "cri-o") => {
            Some("CRI-O takes only a user name and password")
        }
        (Credential::RegistryToken(_), _) => Some("runtimes do not use registry tokens yet"),
        _ => None,
    };
    match ignored {
        Some(why) => format!(
            "{sent}, but {why} from CRI: put a user name and password for the registry in the auth file, \
             or in the node's own (/var/lib/kubelet/config.json)"
        ),
        None => format!("{sent}; the registry refused it: log in again or check its access"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rollout::NodeState;

    #[tokio::test(start_paused = true)]
    async fn a_pull_is_stalled_once_its_bytes_stop_short_of_its_total_for_the_limit() {
        let limit = Duration::from_secs(300);
        let (tx, mut rx) = watch::channel((0, 100));
        let started = tokio::time::Instant::now();
        let feeding = tokio::spawn(async move {
            for done in [10, 20, 30] {
                tokio::time::sleep(Duration::from_secs(200)).await;
                tx.send_replace((done, 100));
            }
            tx
        });
        stalled(&mut rx, limit).await;
        // Moved at 200, 400 and 600 s, then nothing for the limit.
        assert_eq!(started.elapsed(), Duration::from_secs(900));
        let tx = feeding.await.unwrap();

        // Every byte there (the runtime unpacking): never stalled.
        tx.send_replace((100, 100));
        let waited = tokio::time::timeout(Duration::from_secs(3600), stalled(&mut rx, limit)).await;
        assert!(waited.is_err(), "a complete download is not stalled");
    }

    #[test]
    fn backoff_doubles_from_one_second_to_ten() {
        let config = EngineConfig::default();
        let schedule: Vec<u64> = (1..=6).map(|a| config.backoff(a).as_secs()).collect();
        assert_eq!(schedule, [1, 2, 4, 8, 10, 10]);
        assert_eq!(config.backoff(200), Duration::from_secs(10));
    }

    #[test]
    fn errors_are_classified_for_retries() {
        let cri = |cause: &str| format!("CRI endpoint unix:///s: PullImage: {cause} (Unknown)");
        assert_eq!(
            classify(&cri(
                "failed to pull and unpack image: failed to copy: write /x/ingest/data: no space left on device"
            )),
            Kind::NoSpace
        );
        assert_eq!(
            classify(&cri(
                "failed to resolve reference \"r@sha256:1\": r@sha256:1: not found"
            )),
            Kind::Permanent
        );
        assert_eq!(
            classify(&cri("pulling from host r: 401 Unauthorized")),
            Kind::Permanent
        );
        assert_eq!(
            classify(&cri(
                "failed commit on ref \"layer-sha256:0f\": unexpected commit digest sha256:fa, expected sha256:0f: failed precondition"
            )),
            Kind::Permanent
        );
        assert_eq!(
            classify(&cri(
                "writing blob: Digest did not match, expected sha256:0f, got sha256:fa"
            )),
            Kind::Permanent
        );
        assert_eq!(
            classify(&cri("read tcp: connection reset by peer")),
            Kind::Transient
        );
        assert_eq!(
            classify("CRI endpoint unix:///s: PullImage: no answer within 5s"),
            Kind::Transient
        );
    }

    #[test]
    fn a_refused_pull_says_which_credential_went_and_what_the_runtime_makes_of_it() {
        let credentials = Credentials::from_text(
            "/auth.json",
            r#"{"auths": {"quay.io": {"auth": "dTpw"}, "ghcr.io": {"identitytoken": "tok"},
                          "reg.example.com": {"registrytoken": "rt"}}}"#,
        )
        .unwrap();
        let note = |runtime: &str, image: &str| {
            let found = find_credential(&credentials, image).unwrap();
            sent_credential(runtime, found.as_ref())
        };
        assert_eq!(
            note("containerd", "quay.io/org/app@sha256:1"),
            "pinboard sent the user \"u\" from entry \"quay.io\" of /auth.json; the registry refused it: \
             log in again or check its access"
        );
        assert!(
            note("containerd", "ghcr.io/org/app:1")
                .ends_with("the registry refused it: log in again or check its access")
        );
        assert!(
            note("cri-o", "ghcr.io/org/app:1")
                .contains("identity token from entry \"ghcr.io\" of /auth.json, but CRI-O takes only a user name and password")
        );
        assert!(
            note("containerd", "reg.example.com/app:1")
                .contains("runtimes do not use registry tokens yet")
        );
        assert!(
            note("containerd", "other.example.com/app:1")
                .starts_with("pinboard found no credentials")
        );
        assert!(refused_access("PullImage: ... 401 Unauthorized") && !refused_access("not found"));
    }

    fn job(name: &str, endpoint: &str, verdict: &str) -> NodeJob {
        let plan = serde_json::from_value(serde_json::json!({
            "node": name, "runtime": null, "capacityBytes": null, "usedBytes": null, "availableBytes": null,
            "fetchBytes": 0, "estimatedDiskBytes": 0, "estimateBasis": "nothing", "availableAfterBytes": null,
            "verdict": verdict, "reasons": ["needs 1 GiB more"], "images": []
        }))
        .unwrap();
        let endpoint = endpoint.parse().unwrap();
        NodeJob {
            node: DirectNode {
                name: name.into(),
                endpoint,
            },
            plan,
            pin: PinTarget::Detect,
            holders: Arc::default(),
        }
    }

    async fn refusals(jobs: Vec<NodeJob>, config: EngineConfig) -> Vec<(String, String)> {
        let rollout = run_to_end(start(
            jobs,
            Arc::default(),
            Arc::new(Credentials::none()),
            config,
        ))
        .await;
        rollout
            .nodes()
            .iter()
            .map(|(node, n)| match &n.state {
                NodeState::Refused { reason } => (node.clone(), reason.clone()),
                other => panic!("{node}: {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn nodes_are_refused_when_readonly_full_or_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let socket = format!("{}/none.sock", dir.path().display());
        let jobs = || {
            vec![
                job("full", &socket, "no-space"),
                job("gone", &socket, "unknown"),
            ]
        };
        let readonly = EngineConfig {
            readonly: true,
            ..EngineConfig::default()
        };
        for (_, reason) in refusals(jobs(), readonly).await {
            assert!(reason.starts_with("read-only mode"), "{reason}");
        }
        let refused = refusals(jobs(), EngineConfig::default()).await;
        assert_eq!(
            refused[0].1,
            "plan verdict no-space: needs 1 GiB more (force to pull anyway)"
        );
        assert!(
            refused[1].1.contains("connect") && refused[1].1.contains("none.sock"),
            "{}",
            refused[1].1
        );
        let forced = refusals(
            jobs(),
            EngineConfig {
                force: true,
                ..EngineConfig::default()
            },
        )
        .await;
        assert!(
            forced.iter().all(|(_, r)| r.contains("connect")),
            "{forced:?}"
        );
    }
}

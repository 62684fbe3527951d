//! `pinboard agent`: the node side on any Kubernetes cluster, one pod per node (a DaemonSet), or a process
//! started as its pod would be. It does on its node what direct mode does, through the same code: the
//! survey and planner, the engine's bounded, retried, stall-cancelled pulls, pins written last and
//! verified through the runtime ([`crate::fleet::direct::DirectFleet`] on this one node), and
//! [`crate::engine::unpin`] to release what a deleted or edited set held, and only what no other set holds.
//!
//! - It follows every [`PinSet`] and its own Node and report (watches, never polls), and carries out each
//!   set that selects its node, one at a time; an edited set's rollout is cancelled and started again on
//!   the new content, and the images it no longer lists lose its hold once the new content is pinned.
//! - It reports into its [`PinboardNode`] ([`crate::model::pinboard_api`]): the node's facts ([`facts`])
//!   and, per set, where each image is ([`crate::model::node_report`]). Writes are bounded: a report is
//!   written when it changed, at most every [`write_interval`]; the heartbeat is a small Lease renewed
//!   every `--heartbeat-every` (30 s).
//! - Restart-safe and idempotent: a restarted agent finds present images present (nothing is pulled
//!   twice) and pins unchanged, so it carries on where it stopped.
//! - One agent, holding the Lease `pinboard-aggregator`, also sums up each set's nodes into its status
//!   ([`aggregate`]), so `kubectl get pinsets` shows them.
//! - One agent started with `--cache-port`, holding the Lease `pinboard-cache`, serves the in-cluster
//!   cache ([`cache`]); every agent points its node at it while a fan-out set rolls out ([`fan_out`]).

mod aggregate;
mod blobs;
mod cache;
mod facts;
mod fan_out;
pub mod manifests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::backend::blobs::Relay;
use crate::backend::credentials::{AuthFiles, Credentials};
use crate::backend::kube::{ConnectOptions, connect};
use crate::backend::lazy::{Apply, set_lazy};
use crate::backend::pinboard_api::PinboardApi;
use crate::backend::readiness::observe;
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::backend::wiring::Wired;
use crate::engine::{self, Control, EngineConfig};
use crate::error::Failure;
use crate::fanout::{LOOPBACK, Update};
use crate::fleet::direct::{DirectConfig, DirectFleet};
use crate::fleet::{Fleet, FleetEvent, RolloutControl};
use crate::model::agents_view::AgentsUpdate;
use crate::model::holders::ReleaseScope;
use crate::model::image::Platform;
use crate::model::node_report;
use crate::model::pinboard_api::{
    CacheReport, DEFAULT_NAMESPACE, HEARTBEAT_PERIODS_VALID, NodeImages, NodeReport, NodeSetPhase,
    PinSet, SetFanOut, SetReport,
};
use crate::model::readiness::LazyImages;
use crate::model::rollout::Rollout;
use crate::model::set::from_flags;
use crate::options::{LimitArgs, RegistryArgs, RolloutArgs, TargetArgs, registry_options};

/// A failed set is tried again after this long (or as soon as it changes).
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);
/// The node's facts are read again this often when nothing happens (images come and go on their own).
const FACTS_EVERY: Duration = Duration::from_secs(300);

/// `pinboard agent`'s arguments.
#[derive(Args, Debug)]
pub struct AgentArgs {
    /// The node this agent runs on: its Node's name (the DaemonSet passes the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME", help_heading = "Agent")]
    pub node: Option<String>,
    /// The agents' namespace: their heartbeat Leases and the sets' pull Secrets.
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE, help_heading = "Agent")]
    pub namespace: String,
    /// The node's registry config directory (containerd's config_path) when its runtime does not say.
    #[arg(long, value_name = "DIR", help_heading = "Agent")]
    pub registry_config_dir: Option<PathBuf>,
    /// The node's own registry credentials (docker config JSON, e.g. the kubelet's
    /// /var/lib/kubelet/config.json, mounted read-only), used after a set's pull Secrets.
    #[arg(long, value_name = "FILE", help_heading = "Agent")]
    pub node_credentials: Option<PathBuf>,
    /// How often the agent renews its heartbeat Lease; the Lease stands for four of these, after which
    /// the node counts as not ready.
    #[arg(long, value_name = "DURATION", value_parser = crate::model::units::parse_duration,
          default_value = "30s", help_heading = "Agent")]
    pub heartbeat_every: Duration,
    /// Makes this agent eligible for the in-cluster cache's role: if it holds it, it serves the fan-out
    /// sets' blobs on its node's IP at this port. None: it never takes the role.
    #[arg(long, value_name = "PORT", help_heading = "Agent")]
    pub cache_port: Option<u16>,
    /// Where the in-cluster cache keeps its blobs (a hostPath in the DaemonSet).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/pinboard/cache",
        help_heading = "Agent"
    )]
    pub cache_dir: PathBuf,
    #[command(flatten)]
    pub targets: TargetArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub rollout: RolloutArgs,
}

/// How often a node writes its report while something moves, for a set that lands on `nodes` nodes: every
/// node writes at most every 5 s, and all of them together at most 100 times a second, so the API server
/// takes 100 writes a second from 5,000 nodes pre-loading at once (every 50 s each), as it takes their
/// kubelets' heartbeats.
pub fn write_interval(nodes: i64) -> Duration {
    Duration::from_secs(5).max(Duration::from_millis(
        u64::try_from(nodes).unwrap_or(0) * 10,
    ))
}

/// Runs the agent until it is stopped.
pub async fn run(args: AgentArgs) -> Result<(), Failure> {
    let node = args.node.clone().ok_or_else(|| {
        Failure::bad_input(
            "pinboard agent runs on a node: pass --node NAME (or set NODE_NAME, as its DaemonSet does), \
             or `pinboard agent manifests`",
        )
    })?;
    let connect_options = ConnectOptions {
        kubeconfig: args.targets.kubeconfig.clone(),
        context: args.targets.context.clone(),
    };
    let client = connect(&connect_options).await?;
    let api = PinboardApi::discover(client, &args.namespace).await?;
    let mut target = args
        .targets
        .resolve()?
        .into_iter()
        .next()
        .ok_or_else(|| Failure::bad_input("no CRI endpoint: pass --cri ENDPOINT"))?;
    target.node.name = node.clone();
    if target.wiring.registry_config_dir.is_none() {
        target.wiring.registry_config_dir = args.registry_config_dir.clone();
    }
    let node_credentials = match &args.node_credentials {
        Some(file) => Credentials::load(&AuthFiles::from_env(Some(file.clone())))
            .map_err(|e| Failure::bad_input(e.to_string()))?,
        None => Credentials::default(),
    };
    let node_credentials = Arc::new(node_credentials);
    let registry = registry_options(&args.registry)?;
    let platform = args.targets.platform()?;
    let cache = args.cache_port.map(|port| {
        let setup = cache::CacheSetup {
            port,
            dir: args.cache_dir.clone(),
            registry: registry.clone(),
            node_credentials: Arc::clone(&node_credentials),
            platform: platform.clone(),
        };
        cache::CacheRole::new(api.clone(), &node, setup)
    });
    // Files a killed agent left on its node point at a cache that may be gone: put them back first.
    for line in crate::fanout::clean_stale_files(
        std::slice::from_ref(&target),
        args.targets.timeout(),
        true,
    )
    .await
    {
        tracing::info!("{line}");
    }
    let (events, received) = unbounded_channel();
    let mut agent = Agent {
        registry,
        node_credentials,
        limits: args.limits.limits(),
        engine: EngineConfig {
            no_space_hint: "free space on the node, or lower its agent's --min-free",
            ..args.rollout.engine_config()
        },
        timeout: args.targets.timeout(),
        platform,
        heartbeat_every: args.heartbeat_every.max(Duration::from_secs(1)),
        node: None,
        labels: None,
        lazy_wish: None,
        sets: BTreeMap::new(),
        sets_listed: false,
        reports: BTreeMap::new(),
        facts: NodeReport::default(),
        running: None,
        failed: BTreeMap::new(),
        waiting_for_cache: None,
        relay: None,
        cache,
        cache_report: None,
        written: None,
        written_images: None,
        last_write: None,
        blobs: blobs::Publisher::default(),
        events,
        api,
        target,
    };
    tracing::info!(node, "pinboard agent starting");
    agent.serve(received).await
}

/// The rollout of one set under way.
struct Running {
    set: String,
    generation: i64,
    /// The set's images before this content, which lose its hold once the new content is pinned.
    dropped: Vec<String>,
    control: Option<RolloutControl>,
    rollout: Rollout,
    /// A fan-out set: the node's files pointing at the cache, put back when it ends.
    wired: Option<Wired>,
    fan_out: Option<SetFanOut>,
    /// The relay's count of pulls sent to the source when this rollout started.
    sent_to_source_before: u64,
}

impl Running {
    /// What the report says of how this rollout pulls, with what `relay` sent to the source meanwhile.
    fn fan_out_report(&self, relay: Option<&Relay>) -> Option<SetFanOut> {
        fan_out::reported(self.fan_out.as_ref(), relay, self.sent_to_source_before)
    }
}

struct Agent {
    api: PinboardApi,
    target: NodeTarget,
    registry: crate::backend::registry::RegistryOptions,
    node_credentials: Arc<Credentials>,
    limits: crate::model::plan::Limits,
    engine: EngineConfig,
    timeout: Duration,
    platform: Platform,
    heartbeat_every: Duration,
    /// The Node object (its uid owns the report); None until it is seen.
    node: Option<Node>,
    labels: Option<BTreeMap<String, String>>,
    /// What an administrator asked of lazy pulling (`spec.lazyPulling`).
    lazy_wish: Option<bool>,
    sets: BTreeMap<String, PinSet>,
    /// The sets' watch has listed: before, no set is not "no set selects the node", and acting on it would
    /// release every pin (an agent restarting, its Node seen before the sets).
    sets_listed: bool,
    /// Per set that selects the node.
    reports: BTreeMap<String, SetReport>,
    /// The node's facts, without the sets.
    facts: NodeReport,
    running: Option<Running>,
    /// Sets that failed, at which generation and when: tried again after [`RETRY_FAILED_AFTER`].
    failed: BTreeMap<String, (i64, Instant)>,
    /// A fan-out set waiting for the cache to serve its generation, since when.
    waiting_for_cache: Option<(String, i64, Instant)>,
    /// The node's relay to the cache, started for the first fan-out set (or why it could not be).
    relay: Option<Result<Relay, String>>,
    /// The in-cluster cache's role, for an agent started with `--cache-port`.
    cache: Option<cache::CacheRole>,
    /// The cache's figures as of the last heartbeat (reported at that pace, not at every byte).
    cache_report: Option<CacheReport>,
    /// The report and its detail as last written (the report as sent: without its image lists).
    written: Option<serde_json::Value>,
    written_images: Option<NodeImages>,
    last_write: Option<Instant>,
    /// What the runtime holds, published for the plans.
    blobs: blobs::Publisher,
    events: UnboundedSender<FleetEvent>,
}

impl Agent {
    async fn serve(&mut self, mut events: UnboundedReceiver<FleetEvent>) -> Result<(), Failure> {
        let mut watch = self.api.watch_node(&self.target.node.name);
        let mut heartbeat = tokio::time::interval(self.heartbeat_every);
        let valid_for = self.heartbeat_every * HEARTBEAT_PERIODS_VALID;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut facts_read: Option<Instant> = None;
        let mut aggregator = aggregate::Aggregator::new(self.api.clone(), &self.target.node.name);
        loop {
            tokio::select! {
                update = watch.updates.recv() => match update {
                    Some(update) => {
                        let sets_changed = matches!(update, AgentsUpdate::Sets(_));
                        if self.take(update).await {
                            // An administrator's lazy-pull wish is carried out now, not at the next read.
                            facts_read = None;
                        }
                        if sets_changed {
                            // The nodes wait for the cache to serve a new set: not until the next heartbeat.
                            self.turn_cache().await;
                        }
                    }
                    None => return Err(Failure::unreachable(vec!["the watches ended".into()])),
                },
                Some(event) = events.recv() => self.fold(event).await,
                _ = heartbeat.tick() => {
                    if let Err(e) = self.api.renew(&self.target.node.name, valid_for).await {
                        tracing::warn!("cannot renew the heartbeat: {e}");
                    }
                    aggregator.turn().await;
                    self.turn_cache().await;
                }
                _ = tick.tick() => {
                    if facts_read.is_none_or(|at| at.elapsed() >= FACTS_EVERY) && self.node.is_some() {
                        self.read_facts().await;
                        facts_read = Some(Instant::now());
                    }
                    self.reconcile().await;
                    self.write().await;
                }
            }
        }
    }

    /// Takes or keeps the cache's role, when eligible, and notes its figures.
    async fn turn_cache(&mut self) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        cache.turn(node_ip(self.node.as_ref()), &self.sets).await;
        self.cache_report = cache.report();
    }

    /// Takes in a change the watches saw; true when it changed the administrator's lazy-pull wish.
    async fn take(&mut self, update: AgentsUpdate) -> bool {
        match update {
            AgentsUpdate::Sets(sets) => {
                self.sets_listed = true;
                self.sets = sets
                    .into_iter()
                    .map(|s| (s.name().to_string(), s))
                    .collect();
            }
            AgentsUpdate::Nodes(nodes) => {
                self.labels = nodes.into_iter().next().map(|n| n.labels);
                if self.node.is_none() {
                    match self.api.node(&self.target.node.name).await {
                        Ok(node) => self.node = node,
                        Err(e) => tracing::warn!("cannot read the Node: {e}"),
                    }
                }
            }
            AgentsUpdate::Reports(reports) => {
                if reports.is_empty() {
                    // Its report was deleted (its detail with it, as both go with the Node): the next
                    // write makes them again, whole.
                    self.written = None;
                    self.written_images = None;
                }
                let wish = reports.into_iter().next().and_then(|r| r.spec.lazy_pulling);
                return std::mem::replace(&mut self.lazy_wish, wish) != wish;
            }
            AgentsUpdate::Heartbeats(_) | AgentsUpdate::Images(_) => {}
            AgentsUpdate::Connection(kind, state) => tracing::debug!("watch of {kind}: {state}"),
        }
        false
    }

    /// The sets that select this node, by name.
    fn desired(&self) -> BTreeMap<&str, &PinSet> {
        let Some(labels) = &self.labels else {
            return BTreeMap::new();
        };
        self.sets
            .values()
            .filter(|s| s.selects(labels))
            .map(|s| (s.name(), s))
            .collect()
    }

    /// Starts what is to be done next: a running rollout whose set changed or left is cancelled; a set no
    /// longer selecting the node is released; the next set not pinned at its generation is rolled out.
    async fn reconcile(&mut self) {
        if self.node.is_none() || !self.sets_listed {
            return;
        }
        let desired: BTreeMap<String, (i64, Vec<String>)> = self
            .desired()
            .into_iter()
            .map(|(name, set)| {
                (
                    name.to_string(),
                    (set.generation(), set.images().map(str::to_string).collect()),
                )
            })
            .collect();
        if let Some(running) = &mut self.running {
            let current = desired.get(&running.set).map(|(g, _)| *g);
            if current != Some(running.generation)
                && let Some(control) = running.control.take()
            {
                let _ = control.send(Control::CancelAll);
            }
            return;
        }
        self.reports.retain(|name, _| desired.contains_key(name));
        let held = facts::holding_sets(&self.facts);
        if let Some(gone) = held.iter().find(|set| !desired.contains_key(*set)) {
            self.release(&ReleaseScope::of_sets(&[gone.as_str()], &[], false), gone)
                .await;
            return;
        }
        let next = desired.iter().find(|(name, (generation, _))| {
            let done = self.reports.get(*name).is_some_and(|r| {
                r.observed_generation == *generation && r.state == NodeSetPhase::Pinned
            });
            let backing_off = self
                .failed
                .get(*name)
                .is_some_and(|(g, at)| g == generation && at.elapsed() < RETRY_FAILED_AFTER);
            !done && !backing_off
        });
        if let Some((name, (generation, images))) = next {
            self.start(name, *generation, images).await;
        }
    }

    /// Rolls out `images` of set `name` at `generation` on this node; a fan-out set through the cache
    /// once it serves that generation.
    async fn start(&mut self, name: &str, generation: i64, images: &[String]) {
        let (wired, fan_out) = match self.sets[name].spec.fan_out {
            false => (None, None),
            true => {
                let since = match &self.waiting_for_cache {
                    Some((set, g, since)) if set == name && *g == generation => *since,
                    _ => Instant::now(),
                };
                let key = (name, generation);
                if self.relay.is_none() {
                    self.relay = Some(fan_out::start_relay(&self.api).await);
                }
                let relay = self.relay.as_ref().expect("just started").as_ref();
                let relay = relay.map_err(String::as_str);
                match fan_out::prepare(
                    &self.api,
                    relay,
                    &self.target,
                    key,
                    images,
                    since,
                    self.timeout,
                )
                .await
                {
                    fan_out::Through::Wait => {
                        self.waiting_for_cache = Some((name.to_string(), generation, since));
                        return;
                    }
                    fan_out::Through::Cache(wired, through) => (Some(wired), Some(through)),
                    fan_out::Through::Source(through) => (None, Some(through)),
                }
            }
        };
        self.waiting_for_cache = None;
        let mut image_set = from_flags(name, images);
        image_set.pull_secrets = self.sets[name].to_image_set().pull_secrets;
        let credentials =
            pull_credentials(&self.api, &self.node_credentials, &image_set.pull_secrets).await;
        let registry = match Registry::with_credentials(self.registry.clone(), credentials) {
            Ok(registry) => registry,
            Err(e) => {
                if let Some(wired) = wired {
                    fan_out::unwire(name, wired).await;
                }
                return self.fail(name, generation, images, e.to_string());
            }
        };
        let fleet = DirectFleet::new(DirectConfig {
            targets: vec![self.target.clone()],
            registry,
            platform: self.platform.clone(),
            limits: self.limits,
            timeout: self.timeout,
            engine: self.engine.clone(),
            cache_dir: None,
            cache_options: Default::default(),
            fan_out_listen: LOOPBACK,
            release_unowned: false,
            lazy_images: LazyImages::NotReady,
        });
        let dropped = self
            .facts
            .images
            .iter()
            .filter(|i| i.held_by.iter().any(|h| h == name))
            .flat_map(|i| i.names.first().cloned())
            .filter(|image| !images.contains(image))
            .collect();
        tracing::info!(set = name, generation, "rolling out");
        let mut queued = node_report::queued(name, generation, images);
        queued.fan_out = fan_out.clone();
        self.reports.insert(name.to_string(), queued);
        let control = fleet.roll_out(
            image_set,
            vec![self.target.node.name.clone()],
            false,
            false,
            self.events.clone(),
        );
        self.running = Some(Running {
            set: name.to_string(),
            generation,
            dropped,
            control,
            rollout: Rollout::expecting(std::slice::from_ref(&self.target.node.name)),
            wired,
            fan_out,
            sent_to_source_before: relay_of(&self.relay).map_or(0, |r| r.sent_to_source().0),
        });
    }

    /// Marks a set failed at `generation`, saying why.
    fn fail(&mut self, name: &str, generation: i64, images: &[String], why: String) {
        let mut report = node_report::queued(name, generation, images);
        report.state = NodeSetPhase::Failed;
        report.conditions = node_report::failed_conditions(&why);
        self.reports.insert(name.to_string(), report);
        self.failed
            .insert(name.to_string(), (generation, Instant::now()));
    }

    /// Folds in what the running rollout tells.
    async fn fold(&mut self, event: FleetEvent) {
        let Some(running) = &mut self.running else {
            return;
        };
        let node = &self.target.node.name;
        match event {
            FleetEvent::Rollout(Update::Event(event)) => {
                running.rollout.apply(event);
                if let Some(progress) = running.rollout.nodes().get(node) {
                    let mut report =
                        node_report::rolling(&running.set, running.generation, progress);
                    report.fan_out = running.fan_out_report(relay_of(&self.relay));
                    self.reports.insert(running.set.clone(), report);
                }
            }
            FleetEvent::RolloutFinished(result) => {
                let running = self.running.take().expect("running");
                self.finish(running, result.err()).await;
            }
            FleetEvent::Notice(text) => tracing::info!(set = running.set, "{text}"),
            _ => {}
        }
    }

    /// Ends a rollout: asks the runtime what is pinned, releases what the set no longer lists, and reads
    /// the node again.
    async fn finish(&mut self, mut running: Running, failure: Option<Failure>) {
        if let Some(wired) = running.wired.take() {
            fan_out::unwire(&running.set, wired).await;
        }
        let images: Vec<String> = self
            .sets
            .get(&running.set)
            .map_or_else(Vec::new, |s| s.images().map(str::to_string).collect());
        let report = match (failure, running.rollout.nodes().get(&self.target.node.name)) {
            (Some(failure), _) => {
                self.fail(
                    &running.set,
                    running.generation,
                    &images,
                    failure.to_string(),
                );
                None
            }
            (None, Some(progress)) => {
                let report = node_report::rolling(&running.set, running.generation, progress);
                let observed = observe(&self.target, &images, self.timeout).await;
                let mut verified = node_report::verified(report, &observed);
                verified.fan_out = running.fan_out_report(relay_of(&self.relay));
                Some(verified)
            }
            (None, None) => None,
        };
        if let Some(report) = report {
            match report.state {
                NodeSetPhase::Pinned => {
                    self.failed.remove(&running.set);
                    if !running.dropped.is_empty() {
                        let release = ReleaseScope::of_images(&running.set, &running.dropped);
                        self.release(&release, &running.set).await;
                    }
                }
                NodeSetPhase::Failed => {
                    self.failed
                        .insert(running.set.clone(), (running.generation, Instant::now()));
                }
                _ => {}
            }
            self.reports.insert(running.set.clone(), report);
        }
        self.read_facts().await;
    }

    /// Releases what `release` says on this node, then reads it again.
    async fn release(&mut self, release: &ReleaseScope, set: &str) {
        match engine::unpin(&self.target.node, self.target.pin.clone(), release).await {
            Ok(_) => tracing::info!(set, "released"),
            Err(e) => tracing::warn!(set, "cannot release: {e}"),
        }
        self.read_facts().await;
    }

    /// Reads the node's facts again, and carries out an administrator's lazy-pull wish.
    async fn read_facts(&mut self) {
        let mut refused = None;
        if let Some(wish) = self.lazy_wish {
            // As direct mode's `L` does: the node's runtime decides what is written; no restart unasked.
            let target = &self.target;
            let changed = set_lazy(
                &target.node.endpoint,
                &target.lazy,
                Some(wish),
                Apply::WRITE,
                self.timeout,
            )
            .await;
            match changed {
                Ok(outcome) if outcome.changed => tracing::info!("{}", outcome.summary()),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("lazy pulling not changed: {e}");
                    refused = Some(format!("lazy pulling not changed: {e}"));
                }
            }
        }
        self.facts = facts::read(&self.target, self.api.client(), self.timeout).await;
        self.blobs.read(&self.target, self.timeout).await;
        // The wish's failure is what an administrator asking for it needs to see, in the report.
        if refused.is_some() {
            self.facts.lazy_pulling_error = refused;
        }
    }

    /// Writes the report when it changed, at most every [`write_interval`] for the sets' sizes.
    async fn write(&mut self) {
        let Some(node) = &self.node else {
            return;
        };
        self.blobs.publish(&self.api, node).await;
        let mut report = self.facts.clone();
        report.sets = self.reports.values().cloned().collect();
        report.cache = self.cache_report.clone();
        report.limits = Some(crate::model::plan::AgentLimits::of(&self.limits));
        let sent = serde_json::to_value(&report).unwrap_or_default();
        let detail = report.image_detail();
        let report_due = self.written.as_ref() != Some(&sent);
        let detail_due = self.written_images.as_ref() != Some(&detail);
        if !report_due && !detail_due {
            return;
        }
        let nodes = self
            .sets
            .values()
            .filter_map(|s| s.status.as_ref().map(|st| st.nodes))
            .max()
            .unwrap_or(0);
        let settled = self.running.is_none();
        if !settled
            && self
                .last_write
                .is_some_and(|at| at.elapsed() < write_interval(nodes))
        {
            return;
        }
        self.last_write = Some(Instant::now());
        // The detail first: a reader that sees the report's new phase finds the images it rests on.
        if detail_due {
            let first = self.written_images.is_none();
            match self.api.write_images(node, &detail, first).await {
                Ok(()) => self.written_images = Some(detail),
                Err(e) => {
                    tracing::warn!("cannot write the report's images: {e}");
                    // Perhaps the object is gone: the next write makes it again.
                    self.written_images = None;
                    return;
                }
            }
        }
        if report_due {
            let first = self.written.is_none();
            match self.api.write_report(node, &report, first).await {
                Ok(()) => self.written = Some(sent),
                Err(e) => {
                    tracing::warn!("cannot write the report: {e}");
                    self.written = None;
                }
            }
        }
    }
}

/// The credentials a set's images are pulled with: its pull Secrets (`secrets`), then the node's own.
async fn pull_credentials<'a>(
    api: &PinboardApi,
    node_credentials: &Credentials,
    secrets: impl IntoIterator<Item = &'a String>,
) -> Credentials {
    let mut credentials = node_credentials.clone();
    let secrets: Vec<&String> = secrets.into_iter().collect();
    for secret in secrets.into_iter().rev() {
        match api.pull_secret(secret).await {
            Ok(Some(text)) => match Credentials::from_text(format!("secret {secret}"), &text) {
                Ok(found) => credentials = found.then(credentials),
                Err(e) => tracing::warn!("pull secret {secret}: {e}"),
            },
            Ok(None) => tracing::warn!("pull secret {secret} is not there"),
            Err(e) => tracing::warn!("cannot read pull secret {secret}: {e}"),
        }
    }
    credentials
}

/// The node's relay, once started.
fn relay_of(relay: &Option<Result<Relay, String>>) -> Option<&Relay> {
    relay.as_ref()?.as_ref().ok()
}

/// The node's InternalIP, where the in-cluster cache serves when this agent holds its role.
fn node_ip(node: Option<&Node>) -> Option<std::net::IpAddr> {
    node?
        .status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()
}

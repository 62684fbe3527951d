//! `pinboard agent`: the node side on any Kubernetes cluster, one pod per node (a DaemonSet), or a process
//! started as its pod would be. It does on its node what direct mode does, through the same code: the
//! survey and planner, the engine's bounded, retried, stall-cancelled pulls, pins written last and
//! verified through the runtime ([`crate::fleet::direct::DirectFleet`] on this one node), and
//! [`crate::engine::unpin`] to release what a deleted or edited set held, and only what no other set holds.
//!
//! - It follows every [`PinSet`] and its own Node and report (watches, never polls), and carries out each
//!   set that selects its node, one at a time; an edited set's rollout is cancelled and started again on
//!   the new content, and the images it no longer lists lose its hold once the new content is pinned.
//! - It keeps checking its node against every set it pinned (every `--verify-every`, 30 s, and at once
//!   when containerd announces an image change), and puts back what was lost: see [`state`].
//! - What to do is decided in [`state`], pure; this module is the thin shell that carries it out.
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
mod losses;
pub mod manifests;
mod metrics;
mod report_writer;
mod state;
mod tally;

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::backend::blobs::{Peers, Relay, ServingCap};
use crate::backend::credentials::{AuthFiles, Credentials};
use crate::backend::events::{self, Recorder};
use crate::backend::http_server::Server;
use crate::backend::image_events::image_changes;
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
use crate::model::agent_events::{Kind as EventKind, Note};
use crate::model::agents_view::AgentsUpdate;
use crate::model::holders::ReleaseScope;
use crate::model::image::Platform;
use crate::model::pinboard_api::{
    CacheReport, DEFAULT_NAMESPACE, HEARTBEAT_PERIODS_VALID, NODE_KIND, SET_KIND, SetFanOut,
};
use crate::model::readiness::LazyImages;
use crate::model::set::from_flags;
use crate::options::{LimitArgs, RegistryArgs, RolloutArgs, TargetArgs, registry_options};
use metrics::IoStats;
use report_writer::{Due, ReportWriter};
use state::{Action, AgentState, GATE_TAINT, Input, Start, Timing};

/// How long the node's Events wait for its PinboardNode's uid (the report's first write, its watch): after
/// that they are written without it, rather than lost.
const UID_WAIT: Duration = Duration::from_secs(30);

/// `pinboard agent`'s arguments.
#[derive(Args, Debug)]
pub struct AgentArgs {
    /// The node this agent runs on: its Node's name (the DaemonSet passes the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME", help_heading = "Agent")]
    pub node: Option<String>,
    /// The agents' namespace: their heartbeat Leases and the sets' pull Secrets.
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE, help_heading = "Agent")]
    pub namespace: String,
    /// The node's registry config directory (containerd's config_path) as the agent reaches it (its
    /// hostPath mount); without it, what containerd reports or its config files set.
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
    /// How often the agent checks its node against every set it pinned, and puts back an image or pin
    /// that was lost (on containerd also at once, when it announces an image change).
    #[arg(long, value_name = "DURATION", value_parser = crate::model::units::parse_duration,
          default_value = "30s", help_heading = "Agent")]
    pub verify_every: Duration,
    /// Makes this agent eligible for the in-cluster cache's role: if it holds it, it serves the fan-out
    /// sets' blobs on its node's IP at this port. None: it never takes the role.
    #[arg(long, value_name = "PORT", help_heading = "Agent")]
    pub cache_port: Option<u16>,
    /// The node gate: the agent removes the taint pinboard.dev/preloading:NoSchedule from its Node once
    /// every set that selects the node is pinned there (a node registered with it takes no pod before).
    /// It never adds the taint.
    #[arg(long, help_heading = "Agent")]
    pub gate: bool,
    /// With --gate: remove the taint after this long even though some set is not pinned (its pods will
    /// then pull over the registry link); 0 keeps it until an administrator removes it.
    #[arg(long, value_name = "DURATION", value_parser = crate::model::units::parse_duration,
          default_value = "30m", help_heading = "Agent")]
    pub gate_deadline: Duration,
    /// Serves Prometheus' text format at `http://0.0.0.0:PORT/metrics` (the node's IP: the agents use the
    /// host's network). None: no metrics.
    #[arg(long, value_name = "PORT", help_heading = "Agent")]
    pub metrics_port: Option<u16>,
    /// A budget for the registry link, e.g. 6MiB/s or 50Mbit/s: what the in-cluster cache takes from the
    /// registries, all downloads together, stays under it however many nodes pull. Default: no budget.
    #[arg(long, value_name = "RATE", value_parser = crate::model::units::parse_rate,
          help_heading = "Agent")]
    pub link_rate: Option<u64>,
    /// A cap on what this node sends to the other nodes, all together, e.g. 100MiB/s, so its NIC keeps room
    /// for its own traffic: as the in-cluster cache's holder, and with --peer-port. Default: no cap.
    #[arg(long, value_name = "RATE", value_parser = crate::model::units::parse_rate,
          help_heading = "Agent")]
    pub serve_rate: Option<u64>,
    /// Makes nodes serve each other a fan-out set's blobs: this node serves the pieces it took, on its
    /// node's IP at this port, to the other nodes' agents (with the cache's token only), and takes each
    /// blob from the nodes the cache's tracker names. None: it takes every blob from the cache's holder.
    #[arg(long, value_name = "PORT", help_heading = "Agent")]
    pub peer_port: Option<u16>,
    /// Where the node keeps the blobs it takes from and serves to other nodes (a hostPath in the DaemonSet);
    /// cleared when the agent starts.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/pinboard/peers",
        help_heading = "Agent"
    )]
    pub peer_dir: PathBuf,
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
    // One cap for all the node sends: as the cache's holder and to other nodes.
    let serving_cap = args.serve_rate.map(ServingCap::new);
    let cache = args.cache_port.map(|port| {
        let setup = cache::CacheSetup {
            port,
            dir: args.cache_dir.clone(),
            registry: registry.clone(),
            node_credentials: Arc::clone(&node_credentials),
            platform: platform.clone(),
            link_rate: args.link_rate,
            serving_cap: serving_cap.clone(),
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
    let metrics = match args.metrics_port {
        Some(port) => {
            let page = Arc::new(Mutex::new(String::new()));
            let listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            let server = metrics::serve(listen, Arc::clone(&page))
                .await
                .map_err(|e| {
                    Failure::bad_input(format!(
                        "cannot serve metrics on {listen}: {e}; choose another --metrics-port"
                    ))
                })?;
            tracing::info!(%listen, "serving metrics at /metrics");
            Some((page, server))
        }
        None => None,
    };
    let (events, received) = unbounded_channel();
    let timing = Timing {
        verify_every: args.verify_every.max(Duration::from_secs(1)),
        gate: args
            .gate
            .then_some((!args.gate_deadline.is_zero()).then_some(args.gate_deadline)),
        ..Timing::default()
    };
    let mut agent = Agent {
        state: AgentState::new(&node, timing),
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
        running: None,
        relay: fan_out::RelaySlot::new(args.peer_port.map(|port| fan_out::PeerWish {
            port,
            dir: args.peer_dir.clone(),
            serving_cap,
        })),
        cache,
        cache_report: None,
        writer: ReportWriter::default(),
        io: IoStats::default(),
        metrics,
        recorder: Recorder::new(api.client().clone(), &node),
        report_uid: None,
        held_notes: Vec::new(),
        held_since: None,
        events,
        api,
        target,
    };
    tracing::info!(node, "pinboard agent starting");
    agent.serve(received).await
}

/// What the shell holds of the rollout under way: how to cancel it, and a fan-out set's files and relay
/// count.
struct RunningIo {
    control: Option<RolloutControl>,
    /// A fan-out set: the node's files pointing at the cache, put back when it ends.
    wired: Option<Wired>,
    fan_out: Option<SetFanOut>,
    /// The relay's count of pulls sent to the source, and of bytes passed on, when this rollout started.
    sent_to_source_before: u64,
    passed_before: u64,
}

impl RunningIo {
    /// What the report says of how this rollout pulls, with what `relay` sent to the source meanwhile.
    fn fan_out_report(&self, relay: Option<&Relay>) -> Option<SetFanOut> {
        fan_out::reported(self.fan_out.as_ref(), relay, self.sent_to_source_before)
    }
}

/// The shell: carries out what [`AgentState`] decides, and tells it what came of it.
struct Agent {
    state: AgentState,
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
    running: Option<RunningIo>,
    /// The node's relay to the cache, and its peer side.
    relay: fan_out::RelaySlot,
    /// The in-cluster cache's role, for an agent started with `--cache-port`.
    cache: Option<cache::CacheRole>,
    /// The cache's figures as of the last heartbeat (reported at that pace, not at every byte).
    cache_report: Option<CacheReport>,
    /// What it last wrote of its node.
    writer: ReportWriter,
    /// What the shell counts of its writes and heartbeats, for the metrics.
    io: IoStats,
    /// The node's Kubernetes Events, and its PinboardNode's uid they name.
    recorder: Recorder,
    report_uid: Option<String>,
    /// Events about the node recorded before its PinboardNode's uid was known, and since when: written
    /// once it is, as `kubectl describe` shows only Events naming the uid.
    held_notes: Vec<Note>,
    held_since: Option<Instant>,
    /// The metrics page as last made, and the listener serving it (`--metrics-port`).
    metrics: Option<(Arc<Mutex<String>>, Server)>,
    events: UnboundedSender<FleetEvent>,
}

impl Agent {
    async fn serve(&mut self, mut events: UnboundedReceiver<FleetEvent>) -> Result<(), Failure> {
        let mut watch = self.api.watch_node(&self.target.node.name);
        let mut heartbeat = tokio::time::interval(self.heartbeat_every);
        let valid_for = self.heartbeat_every * HEARTBEAT_PERIODS_VALID;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut aggregator = aggregate::Aggregator::new(self.api.clone(), &self.target.node.name);
        let mut image_changes = image_changes(self.target.node.endpoint.clone(), self.timeout);
        let mut runtime_silent = false;
        loop {
            tokio::select! {
                update = watch.updates.recv() => match update {
                    Some(update) => {
                        let sets_changed = matches!(update, AgentsUpdate::Sets(_));
                        let node_unknown = self.node.is_none();
                        self.take(update).await;
                        // The nodes wait for the cache to serve a new set, and the relays hold their pulls for
                        // a restarted holder only so long: not until the next heartbeat. A holder needs its
                        // Node's address first, so the role is taken as soon as it has read it.
                        if sets_changed || (node_unknown && self.node.is_some()) {
                            self.turn_cache().await;
                        }
                    }
                    None => return Err(Failure::unreachable(vec!["the watches ended".into()])),
                },
                Some(event) = events.recv() => self.fold(event).await,
                change = image_changes.recv(), if !runtime_silent => match change {
                    Some(()) => self.handle(Input::RuntimeChanged).await,
                    None => {
                        runtime_silent = true;
                        self.handle(Input::RuntimeSilent).await;
                    }
                },
                _ = heartbeat.tick() => {
                    let renewed = self.api.renew(&self.target.node.name, valid_for).await;
                    if let Err(e) = &renewed {
                        tracing::warn!("cannot renew the heartbeat: {e}");
                    }
                    self.io.renewal(renewed.is_ok());
                    aggregator.turn().await;
                    self.turn_cache().await;
                }
                _ = tick.tick() => {
                    self.handle(Input::Tick).await;
                    self.write().await;
                    self.make_metrics_page();
                    if self.held_since.is_some_and(|since| since.elapsed() >= UID_WAIT) {
                        tracing::warn!(
                            "the node's PinboardNode has no uid after {UID_WAIT:?} (its report not written?): \
                             its Events are recorded without it, and `kubectl describe` will not show them"
                        );
                        self.write_held_notes().await;
                    }
                    if let Err(e) = self.recorder.flush().await {
                        tracing::warn!("cannot write an Event's series: {e}");
                    }
                }
            }
        }
    }

    /// Makes the metrics page anew, when the agent serves one.
    fn make_metrics_page(&self) {
        let Some((page, _)) = &self.metrics else {
            return;
        };
        let peers = self.relay.get().and_then(Relay::peers).map(Peers::report);
        let shown = metrics::Shown {
            node: &self.target.node.name,
            io: &self.io,
            min_free_bytes: self.limits.min_free_bytes,
            cache: self.cache_report.as_ref(),
            relay: self
                .relay
                .get()
                .map(|r| (r.holding(), r.sent_to_source().0)),
            peers: peers.as_ref(),
        };
        *page.lock().expect("metrics page") = metrics::page(&self.state, &shown, Instant::now());
    }

    /// Takes or keeps the cache's role, when eligible, and notes its figures. Not before the sets' watch
    /// has listed: a holder that knew of no set would answer the nodes' pulls 404, and their runtimes would
    /// go to the source for whole blobs.
    async fn turn_cache(&mut self) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        if !self.state.sets_listed() {
            return;
        }
        cache
            .turn(node_ip(self.node.as_ref()), self.state.sets())
            .await;
        let was_serving = self.cache_report.is_some();
        self.cache_report = cache.report(self.state.sets());
        if let Some(report) = self.cache_report.as_ref().filter(|_| !was_serving) {
            let note = Note::normal(
                "CacheServing",
                "ServeCache",
                format!(
                    "this node's agent took the in-cluster cache's role: it serves the fan-out sets at {}",
                    report.address
                ),
            );
            self.record(&note).await;
        }
    }

    /// Takes in a change the watches saw.
    async fn take(&mut self, update: AgentsUpdate) {
        match update {
            AgentsUpdate::Sets(sets) => self.handle(Input::Sets(sets)).await,
            AgentsUpdate::Nodes(nodes) => {
                let Some(node) = nodes.into_iter().next() else {
                    return;
                };
                let gated = node.taints.iter().any(|t| t.key == GATE_TAINT);
                self.handle(Input::Node {
                    labels: node.labels,
                    gated,
                })
                .await;
                if self.node.is_none() {
                    match self.api.node(&self.target.node.name).await {
                        Ok(Some(node)) => {
                            self.node = Some(node);
                            self.handle(Input::NodeKnown).await;
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!("cannot read the Node: {e}"),
                    }
                }
            }
            AgentsUpdate::Reports(reports) => {
                self.report_uid = reports.first().and_then(|r| r.metadata.uid.clone());
                if self.report_uid.is_some() {
                    self.write_held_notes().await;
                }
                if reports.is_empty() {
                    self.writer.forget_report();
                }
                let wish = reports.into_iter().next().and_then(|r| r.spec.lazy_pulling);
                self.handle(Input::LazyWish(wish)).await;
            }
            AgentsUpdate::Heartbeats(_) | AgentsUpdate::Images(_) => {}
            // Only the commands' and the aggregator's watches carry them.
            AgentsUpdate::DaemonSets(_) => {}
            AgentsUpdate::Connection(kind, state) => tracing::debug!("watch of {kind}: {state}"),
        }
    }

    /// Tells the state `input`, and carries out what it decides, until nothing more follows.
    async fn handle(&mut self, input: Input) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            for action in self.state.update(input, Instant::now()) {
                inputs.extend(self.act(action).await);
            }
        }
    }

    /// Carries out one decision; what came of it, when the state must hear it.
    async fn act(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::RollOut(start) => Some(self.start(start).await),
            Action::Cancel => {
                if let Some(control) = self.running.as_mut().and_then(|r| r.control.take()) {
                    let _ = control.send(Control::CancelAll);
                }
                None
            }
            Action::Release { scope, set } => {
                self.release(&scope, &set).await;
                Some(Input::Facts(Box::new(self.read_facts().await)))
            }
            Action::ReadFacts => Some(Input::Facts(Box::new(self.read_facts().await))),
            Action::Record(note) => {
                self.record(&note).await;
                None
            }
            Action::LiftGate => {
                // The report first: whoever sees the taint gone finds the sets pinned there.
                self.write().await;
                if let Err(e) = self
                    .api
                    .remove_taint(&self.target.node.name, GATE_TAINT)
                    .await
                {
                    tracing::warn!("cannot lift the gate ({GATE_TAINT}) from the node: {e}");
                }
                None
            }
            Action::Verify(images) => Some(Input::Verified(
                observe(&self.target, &images, self.timeout).await,
            )),
        }
    }

    /// Rolls out `start`'s images on this node; a fan-out set through the cache once it serves that
    /// generation.
    async fn start(&mut self, start: Start) -> Input {
        let Start {
            set: name,
            generation,
            images,
            fan_out,
            waiting_since,
            restore,
        } = start;
        let Some(set) = self.state.sets().get(&name).cloned() else {
            return Input::NotStarted(format!("set {name:?} is gone"));
        };
        let (wired, fan_out) = match fan_out {
            false => (None, None),
            true => {
                let since = waiting_since.unwrap_or_else(Instant::now);
                let ip = node_ip(self.node.as_ref());
                let relay = self
                    .relay
                    .start(&self.api, &self.target.node.name, ip)
                    .await;
                let key = (name.as_str(), generation);
                match fan_out::prepare(
                    &self.api,
                    relay,
                    &self.target,
                    key,
                    &images,
                    since,
                    self.timeout,
                )
                .await
                {
                    fan_out::Through::Wait => return Input::WaitingForCache(since),
                    fan_out::Through::Cache(wired, through) => (Some(wired), Some(through)),
                    fan_out::Through::Source(through) => (None, Some(through)),
                }
            }
        };
        let mut image_set = from_flags(&name, &images);
        image_set.pull_secrets = set.to_image_set().pull_secrets;
        let credentials =
            pull_credentials(&self.api, &self.node_credentials, &image_set.pull_secrets).await;
        let registry = match Registry::with_credentials(self.registry.clone(), credentials) {
            Ok(registry) => registry,
            Err(e) => {
                if let Some(wired) = wired {
                    fan_out::unwire(&name, wired).await;
                }
                return Input::NotStarted(e.to_string());
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
        tracing::info!(set = name, generation, restore, "rolling out");
        let control = fleet.roll_out(
            image_set,
            vec![self.target.node.name.clone()],
            false,
            false,
            self.events.clone(),
        );
        self.running = Some(RunningIo {
            control,
            wired,
            fan_out: fan_out.clone(),
            sent_to_source_before: self.relay.get().map_or(0, |r| r.sent_to_source().0),
            passed_before: self.relay.get().map_or(0, Relay::passed_bytes),
        });
        Input::Started { fan_out }
    }

    /// Folds in what the running rollout tells.
    async fn fold(&mut self, event: FleetEvent) {
        let fan_out = self
            .running
            .as_ref()
            .and_then(|r| r.fan_out_report(self.relay.get()));
        match event {
            FleetEvent::Rollout(Update::Event(event)) => {
                // Settled with failures, the engine waits for an image's retry from its control (the
                // TUI's); the agent retries a failed set itself, after a while, so the rollout ends here.
                if matches!(event, crate::model::rollout::Event::NodeStopped { .. })
                    && let Some(running) = self.running.as_mut()
                {
                    running.control.take();
                }
                self.handle(Input::Rollout(event, fan_out)).await
            }
            FleetEvent::Surveyed(survey) => {
                if let Some(node) = survey.nodes.first() {
                    let no_space = node.verdict == crate::model::plan::Verdict::NoSpace;
                    self.handle(Input::Planned {
                        bytes: node.fetch_bytes,
                        no_space,
                    })
                    .await;
                }
            }
            FleetEvent::RolloutFinished(result) => self.finish(result.err(), fan_out).await,
            FleetEvent::Notice(text) => tracing::info!("{text}"),
            _ => {}
        }
    }

    /// Ends a rollout: puts a fan-out set's files back, asks the runtime about the set's images, and tells
    /// the state.
    async fn finish(&mut self, failure: Option<Failure>, fan_out: Option<SetFanOut>) {
        let Some(mut running) = self.running.take() else {
            return;
        };
        let Some(set) = self.state.running().map(|r| r.set.clone()) else {
            return;
        };
        if let Some(wired) = running.wired.take() {
            fan_out::unwire(&set, wired).await;
        }
        // Every pull through the relay: what it passed on is what the runtime fetched.
        let relayed = self
            .relay
            .get()
            .filter(|relay| {
                running.fan_out.as_ref().is_some_and(|f| f.cache.is_some())
                    && relay.sent_to_source().0 == running.sent_to_source_before
            })
            .map(|relay| relay.passed_bytes() - running.passed_before);
        let observed = match (&failure, self.state.running()) {
            (None, Some(rolled)) => {
                let images = rolled.images.clone();
                Some(observe(&self.target, &images, self.timeout).await)
            }
            _ => None,
        };
        self.handle(Input::Ended {
            failure: failure.map(|f| f.to_string()),
            observed,
            fan_out,
            relayed,
        })
        .await;
    }

    /// Records `note` as a Kubernetes Event about this node's PinboardNode (related to its set's PinSet),
    /// and logs it. Before the PinboardNode's uid is known, the Event waits for it (at most [`UID_WAIT`]).
    async fn record(&mut self, note: &Note) {
        match note.kind {
            EventKind::Normal => tracing::info!(reason = note.reason, "{}", note.message),
            EventKind::Warning => tracing::warn!(reason = note.reason, "{}", note.message),
        }
        if self.report_uid.is_none() && self.held_since.is_none_or(|s| s.elapsed() < UID_WAIT) {
            self.held_since.get_or_insert_with(Instant::now);
            self.held_notes.push(note.clone());
            return;
        }
        self.write_event(note).await;
    }

    /// Writes the Events held for the PinboardNode's uid.
    async fn write_held_notes(&mut self) {
        self.held_since = None;
        for note in std::mem::take(&mut self.held_notes) {
            self.write_event(&note).await;
        }
    }

    async fn write_event(&mut self, note: &Note) {
        let node = &self.target.node.name;
        let regarding = events::reference(NODE_KIND, node, self.report_uid.as_deref());
        let related = note.set.as_ref().map(|name| {
            let uid = self
                .state
                .sets()
                .get(name)
                .and_then(|s| s.metadata.uid.clone());
            events::reference(SET_KIND, name, uid.as_deref())
        });
        if let Err(e) = self
            .recorder
            .record(note, &regarding, related.as_ref())
            .await
        {
            tracing::warn!("cannot record an Event ({}): {e}", note.reason);
        }
    }

    /// Releases what `release` says on this node.
    async fn release(&mut self, release: &ReleaseScope, set: &str) {
        match engine::unpin(&self.target.node, self.target.pin.clone(), release).await {
            Ok(_) => tracing::info!(set, "released"),
            Err(e) => tracing::warn!(set, "cannot release: {e}"),
        }
    }

    /// Reads the node's facts again, and carries out an administrator's lazy-pull wish.
    async fn read_facts(&mut self) -> crate::model::pinboard_api::NodeReport {
        let mut refused = None;
        if let Some(wish) = self.state.lazy_wish() {
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
        let mut facts = facts::read(&self.target, self.api.client(), self.timeout).await;
        self.writer.blobs.read(&self.target, self.timeout).await;
        // The wish's failure is what an administrator asking for it needs to see, in the report.
        if refused.is_some() {
            facts.lazy_pulling_error = refused;
        }
        facts.lazy_pulling_wish = self.state.lazy_wish();
        facts
    }

    /// Writes the report when it changed: at once when it is news, else at most every
    /// [`write_interval`] for the sets' sizes.
    async fn write(&mut self) {
        let Some(node) = &self.node else {
            return;
        };
        // The cache's figures as of this write, not of its last turn: a command waiting for them after a
        // rollout gets them within a write.
        if let Some(cache) = self.cache.as_mut().filter(|_| self.cache_report.is_some()) {
            self.cache_report = cache.report(self.state.sets());
        }
        let mut report = self.state.facts().clone();
        report.sets = self.state.answered_reports();
        report.cache = self.cache_report.clone();
        report.peers = self.relay.get().and_then(Relay::peers).map(Peers::report);
        report.limits = Some(crate::model::plan::AgentLimits::of(&self.limits));
        let due = Due {
            report,
            phases: self.state.phases(),
            settled: self.state.running().is_none(),
            interval: write_interval(self.state.widest_set()),
        };
        self.writer.write(&self.api, node, due, &mut self.io).await;
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

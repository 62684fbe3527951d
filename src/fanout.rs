//! A rollout as the TUI's `a` and headless `apply` run it, optionally fanned out: pinboard serves the
//! images from its blob cache on a registry endpoint, points every node's runtime at it, runs the engine,
//! then puts the nodes' files back and stops serving. Each blob then crosses the registry link once, into
//! the cache, however many nodes pull it.
//!
//! - The endpoint ([`Endpoint`]) serves only the digests of the images being applied, on loopback for nodes
//!   on local sockets or on `--fan-out-listen`.
//! - Each node is wired through [`crate::backend::wiring`] (containerd hosts.toml, CRI-O registries.conf.d).
//!   A node that cannot be (containerd without `config_path`, a remote node, another pinboard fanning out
//!   to it) pulls directly, with a notice saying why: fan-out never stops a rollout.
//! - A runtime whose mirror fails goes on to the source registry, so a rollout only gets faster.
//! - [`clean_stale`] is what every command that touches nodes calls first: files left by a pinboard that
//!   was killed mid-rollout are put back.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinError;

use crate::backend::blobs::{BlobCache, Endpoint, EndpointStats};
use crate::backend::cri::{CriClient, CriEndpoint, CriError};
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::backend::wiring::{self, Wired, Wiring, WiringError};
use crate::engine::{self, Control, EngineConfig, NodeJob};
use crate::error::Failure;
use crate::model::image::ImageFacts;
use crate::model::plan::Verdict;
use crate::model::rollout::{Event, FanOutNodes};
use crate::model::served::{ServedDigests, Source};
use crate::model::wiring::Marker;

/// How often the link bytes are sampled for the Rollout summary.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// Where the endpoint listens unless `--fan-out-listen` says otherwise: loopback, any free port.
pub const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Why fan-out cannot start: its endpoint cannot listen. Nothing was written on the nodes then.
#[derive(Debug, thiserror::Error)]
#[error("fan-out cannot listen on {listen}: {error}; pass another --fan-out-listen")]
pub struct FanOutError {
    pub listen: SocketAddr,
    pub error: io::Error,
}

impl From<FanOutError> for Failure {
    fn from(error: FanOutError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// Why one node pulls directly, or fan-out's files on it are not all put back.
#[derive(Debug, thiserror::Error)]
pub enum NodeWiringError {
    #[error(
        "fan-out serves on {endpoint}, which {node} cannot reach; pass --fan-out-listen with an address of \
         this machine that it can"
    )]
    Unreachable {
        endpoint: SocketAddr,
        node: CriEndpoint,
    },
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(transparent)]
    Wiring(#[from] WiringError),
    #[error("{0}")]
    Task(#[from] JoinError),
}

/// What fan-out needs: the blob cache (opened by the caller, who keeps it between rollouts) and where to
/// listen.
#[derive(Clone)]
pub struct FanOutSetup {
    pub cache: Arc<BlobCache>,
    pub listen: SocketAddr,
}

/// What a running rollout reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// First, when the nodes are fanned out to: those that could not be, and pull directly (and, on agents,
    /// as it changes, those some of whose pulls went to the source).
    FanOut(FanOutNodes),
    Event(Event),
    /// Fan-out: bytes the cache has taken from the registries since the rollout started.
    LinkBytes(u64),
}

/// A rollout under way.
pub struct Run {
    events: UnboundedReceiver<Event>,
    /// None when no operator will retry or cancel (headless).
    control: Option<UnboundedSender<Control>>,
    fan_out: Option<FanOut>,
    /// [`Update::FanOut`], until [`Run::next`] has given it.
    announce: Option<Update>,
    sample: tokio::time::Interval,
    sampled: Option<u64>,
}

/// Fan-out while it serves: the endpoint and what was written on the nodes.
struct FanOut {
    endpoint: Endpoint,
    cache: Arc<BlobCache>,
    /// The cache's link bytes when the rollout started.
    link_before: u64,
    wired: Vec<(String, Wired)>,
}

impl FanOut {
    fn link_bytes(&self) -> u64 {
        self.cache.link_bytes() - self.link_before
    }
}

/// What fan-out did, once the rollout ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FanOutReport {
    /// Bytes pinboard took from the registries for this rollout (blobs and manifests the cache lacked);
    /// nodes that pulled directly took theirs on top.
    pub link_bytes: u64,
    /// Bytes the endpoint served to the nodes.
    pub served_bytes: u64,
    /// `--link-rate`: the budget the cache kept on the registry link, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_rate: Option<u64>,
}

impl Run {
    /// Starts rolling out `jobs` (those of `targets`, in the same order); with `fan_out`, first serves the
    /// images of `facts` and wires every node that will pull to them (not those the engine refuses:
    /// unreachable, or no space without `force`). With `operator`, [`Run::control`] retries and cancels
    /// (the TUI); without, nodes with failures finish instead of waiting for a retry (headless). Lines in
    /// the second value say which nodes pull directly and why. Err only when the endpoint cannot listen:
    /// nothing was written then.
    #[expect(
        clippy::too_many_arguments,
        reason = "the one entry point of both the TUI and the CLI"
    )]
    pub async fn start(
        targets: &[NodeTarget],
        jobs: Vec<NodeJob>,
        facts: HashMap<String, ImageFacts>,
        registry: Arc<Registry>,
        config: EngineConfig,
        fan_out: Option<FanOutSetup>,
        operator: bool,
        timeout: Duration,
    ) -> Result<(Run, Vec<String>), FanOutError> {
        let mut notices = Vec::new();
        let fan_out = match fan_out.filter(|_| !config.readonly) {
            Some(setup) => {
                let pulling: Vec<NodeTarget> = targets
                    .iter()
                    .zip(jobs.iter().map(|job| &job.plan))
                    .filter(|(_, plan)| {
                        plan.runtime.is_some() && (config.force || plan.verdict != Verdict::NoSpace)
                    })
                    .map(|(target, _)| target.clone())
                    .collect();
                let (fan_out, lines) = FanOut::start(setup, &pulling, &facts, timeout).await?;
                notices.extend(lines);
                // No node to serve: the rollout is a direct one.
                match fan_out.wired.is_empty() {
                    true => {
                        fan_out.finish().await;
                        None
                    }
                    false => Some(fan_out),
                }
            }
            None => None,
        };
        let announce = fan_out.as_ref().map(|fan_out| {
            let wired = |name: &String| fan_out.wired.iter().any(|(node, _)| node == name);
            let direct = targets.iter().map(|t| t.node.name.clone());
            Update::FanOut(FanOutNodes {
                direct: direct.filter(|name| !wired(name)).collect(),
                partly: Vec::new(),
                link_rate: fan_out.cache.link_rate(),
            })
        });
        let engine = engine::start(jobs, Arc::new(facts), registry, config);
        let mut sample = tokio::time::interval(SAMPLE_EVERY);
        sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let run = Run {
            events: engine.events,
            control: operator.then_some(engine.control),
            fan_out,
            announce,
            sample,
            sampled: None,
        };
        Ok((run, notices))
    }

    /// Passes an operator's control to the engine; false when it is gone.
    pub fn control(&self, control: Control) -> bool {
        self.control
            .as_ref()
            .is_some_and(|c| c.send(control).is_ok())
    }

    /// With fan-out, [`Update::FanOut`] first; then the next event, or a new figure of link bytes (at most
    /// every half second, only when it changed); None once every node is done.
    pub async fn next(&mut self) -> Option<Update> {
        if let Some(announce) = self.announce.take() {
            return Some(announce);
        }
        loop {
            tokio::select! {
                event = self.events.recv() => return event.map(Update::Event),
                _ = self.sample.tick(), if self.fan_out.is_some() => {
                    let bytes = self.fan_out.as_ref().map(FanOut::link_bytes);
                    if bytes != self.sampled {
                        self.sampled = bytes;
                        return bytes.map(Update::LinkBytes);
                    }
                }
            }
        }
    }

    /// Ends the rollout: the nodes' files are put back and the endpoint stops. What fan-out did, and lines
    /// for anything that could not be put back.
    pub async fn finish(self) -> (Option<FanOutReport>, Vec<String>) {
        drop(self.control);
        match self.fan_out {
            Some(fan_out) => {
                let (report, problems) = fan_out.finish().await;
                (Some(report), problems)
            }
            None => (None, Vec::new()),
        }
    }
}

impl FanOut {
    async fn start(
        setup: FanOutSetup,
        targets: &[NodeTarget],
        facts: &HashMap<String, ImageFacts>,
        timeout: Duration,
    ) -> Result<(FanOut, Vec<String>), FanOutError> {
        let allowed = ServedDigests::from_facts(facts.iter().map(|(r, f)| (r.as_str(), f)));
        let link_before = setup.cache.link_bytes();
        let endpoint = Endpoint::start(setup.listen, Arc::clone(&setup.cache), allowed, None)
            .await
            .map_err(|error| FanOutError {
                listen: setup.listen,
                error,
            })?;
        let marker = wiring::marker(&endpoint.url());
        let mut sources: Vec<Source> = facts.keys().filter_map(|r| Source::of(r).ok()).collect();
        sources.sort();
        sources.dedup();
        let loopback = endpoint.addr().ip().is_loopback();
        let wirings = futures::future::join_all(targets.iter().map(|target| async {
            let name = target.node.name.clone();
            if loopback && !target.node.endpoint.is_local() {
                return (
                    name,
                    Err(NodeWiringError::Unreachable {
                        endpoint: endpoint.addr(),
                        node: target.node.endpoint.clone(),
                    }),
                );
            }
            let wired = wire_node(target, sources.clone(), marker.clone(), timeout).await;
            (name, wired)
        }))
        .await;
        let mut wired = Vec::new();
        let mut notices = Vec::new();
        for (node, result) in wirings {
            match result {
                Ok(files) => {
                    tracing::info!(node, files = ?files.files(), "fan-out: wired");
                    wired.push((node, files));
                }
                Err(why) => notices.push(format!("{node}: pulls directly, without fan-out: {why}")),
            }
        }
        Ok((
            FanOut {
                endpoint,
                cache: setup.cache,
                link_before,
                wired,
            },
            notices,
        ))
    }

    async fn finish(self) -> (FanOutReport, Vec<String>) {
        let unwired =
            futures::future::join_all(self.wired.into_iter().map(|(node, wired)| async move {
                unwire_node(wired)
                    .await
                    .err()
                    .map(|e| format!("{node}: fan-out's files not all put back: {e}"))
            }))
            .await;
        // Nodes no longer point at the endpoint: it can stop.
        let stats: EndpointStats = self.endpoint.stop().await;
        let report = FanOutReport {
            link_bytes: self.cache.link_bytes() - self.link_before,
            served_bytes: stats.served_bytes,
            link_rate: self.cache.link_rate(),
        };
        (report, unwired.into_iter().flatten().collect())
    }
}

/// Points `target`'s runtime at the endpoint `marker` names for `sources` (sending `token` when given: the
/// in-cluster cache), after putting back what a pinboard that is gone left there.
pub async fn wire_node(
    target: &NodeTarget,
    sources: Vec<Source>,
    marker: Marker,
    timeout: Duration,
) -> Result<Wired, NodeWiringError> {
    let wiring = located(target, timeout).await?;
    blocking(move || {
        wiring::clean_stale(&wiring, false)?;
        wiring::wire(&wiring, &sources, &marker)
    })
    .await
}

/// Puts back what [`wire_node`] wrote.
pub async fn unwire_node(wired: Wired) -> Result<(), NodeWiringError> {
    blocking(move || wiring::unwire(&wired)).await
}

/// How `target` is wired, asked over its socket.
async fn located(target: &NodeTarget, timeout: Duration) -> Result<Wiring, NodeWiringError> {
    let client = CriClient::connect(&target.node.endpoint, timeout).await?;
    let containerd_config = &target.lazy.containerd_config;
    Ok(wiring::locate(&target.wiring, containerd_config, &target.pin, &client).await?)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, WiringError> + Send + 'static,
) -> Result<T, NodeWiringError> {
    Ok(tokio::task::spawn_blocking(work).await??)
}

/// Puts back what a pinboard that was killed mid-rollout left on `targets`: every command that touches
/// nodes calls this first. One line per file restored or node that could not be cleaned; nodes that
/// cannot be reached or wired are skipped (there is nothing of fan-out's there to find).
pub async fn clean_stale(targets: &[NodeTarget], timeout: Duration) -> Vec<String> {
    clean_stale_files(targets, timeout, false).await
}

/// [`clean_stale`]; with `agent_start`, every marked file is put back ([`wiring::clean_stale`]).
pub async fn clean_stale_files(
    targets: &[NodeTarget],
    timeout: Duration,
    agent_start: bool,
) -> Vec<String> {
    let cleaned = futures::future::join_all(targets.iter().map(|target| async move {
        let Ok(wiring) = located(target, timeout).await else {
            return Vec::new();
        };
        let node = target.node.name.clone();
        match blocking(move || wiring::clean_stale(&wiring, agent_start)).await {
            Ok(lines) => lines.into_iter().map(|l| format!("{node}: {l}")).collect(),
            Err(e) => vec![format!("{node}: stale fan-out files not put back: {e}")],
        }
    }))
    .await;
    cleaned.into_iter().flatten().collect()
}

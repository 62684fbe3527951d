//! A node's side of a fan-out set (`spec.fanOut`): while its rollout runs, the node's runtime is pointed
//! at the agent's relay on the node's loopback ([`Relay`]), which passes the pulls on to the in-cluster
//! cache ([`super::cache`]) with its token and waits out the cache's restarts up to [`HOLD_FOR_CACHE`];
//! the source is kept after it (containerd's `server`, CRI-O's location), so neither a dead cache nor a
//! dead agent stops a pull. The files are put back byte for byte when the rollout ends, and at the agent's
//! start if a killed agent left them. The set's report says which way the node pulled. With `--peer-port`
//! the relay takes each blob from the other nodes the cache's tracker names, and serves them what it took
//! ([`crate::backend::blobs::peers`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::blobs::{Locate, PeerSetup, Peers, Relay, ServingCap, Upstream};
use crate::backend::pinboard_api::PinboardApi;
use crate::backend::target::NodeTarget;
use crate::backend::wiring::{Wired, marker};
use crate::fanout::{unwire_node, wire_node};
use crate::model::pinboard_api::SetFanOut;
use crate::model::served::Source;

/// How long a node waits for the cache to serve a set's new generation before pulling from the source.
pub const WAIT_FOR_CACHE: Duration = Duration::from_secs(60);
/// How long a pull waits for an absent cache (its holder restarting, the role moving) before the runtime
/// is sent to the source: a killed agent's pod is started again within this.
pub const HOLD_FOR_CACHE: Duration = Duration::from_secs(30);

/// How the node serves other nodes, from the agent's flags (`--peer-port`, `--peer-dir`, `--serve-rate`).
#[derive(Clone, Debug)]
pub struct PeerWish {
    pub port: u16,
    pub dir: PathBuf,
    pub serving_cap: Option<ServingCap>,
}

/// The node's relay to the cache, started for the first fan-out set (or why it could not be), with its
/// peer side when the agent serves other nodes.
pub struct RelaySlot {
    peers: Option<PeerWish>,
    started: Option<Result<Relay, String>>,
}

impl RelaySlot {
    pub fn new(peers: Option<PeerWish>) -> RelaySlot {
        RelaySlot {
            peers,
            started: None,
        }
    }

    /// The relay, once started.
    pub fn get(&self) -> Option<&Relay> {
        self.started.as_ref()?.as_ref().ok()
    }

    /// The relay, started on the node's loopback if it is not yet, following the cache's Lease; its peer
    /// side serves on `node_ip` (without it, or when it cannot listen, the node takes every blob from the
    /// cache's holder).
    pub async fn start(
        &mut self,
        api: &PinboardApi,
        node: &str,
        node_ip: Option<IpAddr>,
    ) -> Result<&Relay, &str> {
        if self.started.is_none() {
            let locate = locate(api);
            let peers = match (&self.peers, node_ip) {
                (Some(wish), Some(ip)) => {
                    let setup = PeerSetup {
                        listen: SocketAddr::new(ip, wish.port),
                        dir: wish.dir.clone(),
                        node: node.to_string(),
                        serving_cap: wish.serving_cap.clone(),
                    };
                    match Peers::start(setup, Arc::clone(&locate)).await {
                        Ok(peers) => Some(peers),
                        Err(e) => {
                            tracing::warn!("not serving the other nodes: {e}");
                            None
                        }
                    }
                }
                (Some(_), None) => {
                    tracing::warn!("not serving the other nodes: the Node has no InternalIP yet");
                    None
                }
                (None, _) => None,
            };
            let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
            let relay = Relay::start(listen, locate, HOLD_FOR_CACHE, peers).await;
            self.started = Some(relay.map_err(|e| e.to_string()));
        }
        match self.started.as_ref().expect("just started") {
            Ok(relay) => Ok(relay),
            Err(e) => Err(e),
        }
    }
}

/// Finds the cache as its Lease says now.
fn locate(api: &PinboardApi) -> Locate {
    let api = api.clone();
    Arc::new(move || {
        let api = api.clone();
        Box::pin(async move { upstream(&api).await })
    })
}

/// The cache as its Lease and token Secret say now.
async fn upstream(api: &PinboardApi) -> Option<Upstream> {
    let address = api.cache_lease().await.ok()??.address;
    let token = api.cache_token(false).await.ok()??;
    Some(Upstream { address, token })
}

/// How the node pulls a fan-out set.
pub enum Through {
    /// Its runtime points at the cache until [`unwire`].
    Cache(Wired, SetFanOut),
    Source(SetFanOut),
    /// The cache does not serve this generation yet: ask again.
    Wait,
}

/// Points the node at the cache through `relay` for set `name` at `generation` (its `images`), when the
/// cache serves that generation; waits for it up to [`WAIT_FOR_CACHE`] from `since`, then pulls from the
/// source.
pub async fn prepare(
    api: &PinboardApi,
    relay: Result<&Relay, &str>,
    target: &NodeTarget,
    (name, generation): (&str, i64),
    images: &[String],
    since: Instant,
    timeout: Duration,
) -> Through {
    let source = |reason: String| {
        tracing::info!(
            set = name,
            "pulling from the source, not the cache: {reason}"
        );
        Through::Source(SetFanOut {
            cache: None,
            source_reason: Some(reason),
        })
    };
    let cache = match api.cache_lease().await {
        Ok(Some(cache)) => cache,
        Ok(None) => {
            return source(
                "no agent serves the in-cluster cache (none started with --cache-port, or its \
                 heartbeat lapsed)"
                    .into(),
            );
        }
        Err(e) => return source(format!("cannot read the cache's Lease: {e}")),
    };
    if cache.sets.get(name) != Some(&generation) {
        if since.elapsed() < WAIT_FOR_CACHE {
            return Through::Wait;
        }
        return source(format!(
            "the cache at {} did not serve generation {generation} within {}s",
            cache.address,
            WAIT_FOR_CACHE.as_secs()
        ));
    }
    let token = match api.cache_token(false).await {
        Ok(Some(token)) => token,
        Ok(None) => return source("the cache's token Secret is missing".into()),
        Err(e) => return source(format!("cannot read the cache's token: {e}")),
    };
    let relay = match relay {
        Ok(relay) => relay,
        Err(e) => return source(format!("the agent cannot relay to the cache: {e}")),
    };
    relay
        .follow(Upstream {
            address: cache.address.clone(),
            token,
        })
        .await;
    let mut sources: Vec<Source> = images.iter().filter_map(|i| Source::of(i).ok()).collect();
    sources.sort();
    sources.dedup();
    let marker = marker(&relay.url());
    match wire_node(target, sources, marker, timeout).await {
        Ok(wired) => {
            tracing::info!(set = name, cache = cache.address, files = ?wired.files(), "pulling through the cache");
            let through = SetFanOut {
                cache: Some(cache.address),
                source_reason: None,
            };
            Through::Cache(wired, through)
        }
        Err(e) => source(format!("the node cannot be pointed at the cache: {e}")),
    }
}

/// What the node's report says of how a rollout pulls: as `prepared`, and how many of its pulls `relay`
/// has sent to the source since it started (when it counted `sent_before`), the cache being away, and why.
pub fn reported(
    prepared: Option<&SetFanOut>,
    relay: Option<&Relay>,
    sent_before: u64,
) -> Option<SetFanOut> {
    let mut reported = prepared?.clone();
    if let Some((sent, Some(reason))) = relay.map(Relay::sent_to_source)
        && sent > sent_before
    {
        reported.source_reason = Some(format!(
            "{} pulls went to the source: {reason}",
            sent - sent_before
        ));
    }
    Some(reported)
}

/// Puts the node's files back.
pub async fn unwire(set: &str, wired: Wired) {
    if let Err(e) = unwire_node(wired).await {
        tracing::warn!(set, "fan-out's files not all put back: {e}");
    }
}

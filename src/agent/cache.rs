//! The in-cluster cache: a role one agent takes through the Lease `pinboard-cache`, as the aggregator's
//! ([`super::aggregate`]). Only agents started with `--cache-port` take it. Its holder serves the blob
//! cache's registry endpoint (the same as `pinboard mirror`) on its node's IP at that port, for the digests
//! of the fan-out sets only (`spec.fanOut`), fetched with those sets' pull credentials, and only to requests
//! carrying the cache's token ([`crate::model::cache_token`]). It publishes its address and the sets'
//! generations it serves in the Lease, so a node pulls through it only once it serves the set; when its
//! heartbeat lapses another eligible agent takes the role and the nodes follow the Lease.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::blobs::{BlobCache, CacheOptions, Endpoint, ServingCap, Tracker};
use crate::backend::credentials::Credentials;
use crate::backend::pinboard_api::{CacheLease, PinboardApi};
use crate::backend::registry::{Registry, RegistryOptions};
use crate::model::image::Platform;
use crate::model::pinboard_api::{CacheReport, PinSet};
use crate::model::served::ServedDigests;
use crate::model::set::ImageSet;
use crate::survey::served_digests;

/// Where the cache listens and keeps its blobs, from the agent's flags.
pub struct CacheSetup {
    pub port: u16,
    pub dir: PathBuf,
    pub registry: RegistryOptions,
    pub node_credentials: Arc<Credentials>,
    pub platform: Platform,
    /// `--link-rate`: the budget of the registry link, bytes per second.
    pub link_rate: Option<u64>,
    /// `--serve-rate`: the node's serving cap, shared with its peer side.
    pub serving_cap: Option<ServingCap>,
}

pub struct CacheRole {
    api: PinboardApi,
    holder: String,
    setup: CacheSetup,
    /// While this agent holds the role.
    serving: Option<Serving>,
}

struct Serving {
    endpoint: Endpoint,
    cache: Arc<BlobCache>,
    published: CacheLease,
    /// The figures kept in the cache directory when it started serving: its counts go on from them.
    carried: Figures,
    /// The figures as last kept there.
    kept: Option<String>,
}

/// Where the holder keeps its figures in its cache directory, so that a restart does not reset them.
const FIGURES_FILE: &str = "figures.json";

/// The cache's counts kept across its agent's restarts.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Figures {
    link_bytes: u64,
    served_bytes: u64,
}

impl CacheRole {
    pub fn new(api: PinboardApi, holder: &str, setup: CacheSetup) -> CacheRole {
        CacheRole {
            api,
            holder: holder.to_string(),
            setup,
            serving: None,
        }
    }

    /// Takes or keeps the role, on the node's IP `node_ip`; while held, serves the fan-out sets of `sets`
    /// (recomputed when they changed) and publishes them.
    pub async fn turn(&mut self, node_ip: Option<IpAddr>, sets: &BTreeMap<String, PinSet>) {
        let Some(ip) = node_ip else {
            return;
        };
        let address = format!("http://{}", SocketAddr::new(ip, self.setup.port));
        let published = match &self.serving {
            Some(serving) => serving.published.clone(),
            None => CacheLease {
                address,
                sets: BTreeMap::new(),
            },
        };
        match self.api.lead_cache(&self.holder, &published).await {
            Ok(true) => {}
            Ok(false) => {
                if self.serving.take().is_some() {
                    tracing::info!("another agent holds the cache's role now: stopped serving");
                }
                return;
            }
            Err(e) => return tracing::warn!("cannot take the cache's Lease: {e}"),
        }
        self.expect_agents().await;
        let wanted: BTreeMap<String, i64> = fan_out_sets(sets)
            .map(|s| (s.name().to_string(), s.generation()))
            .collect();
        if self.serving.as_ref().map(|s| &s.published.sets) == Some(&wanted) {
            return;
        }
        // The digests first, then listen: a node never meets a cache that does not serve its set yet (a
        // 404 would send it to the source).
        let Some((registry, allowed)) = self.resolve(sets).await else {
            // Not published: the nodes wait for it, then pull from the source.
            return;
        };
        let blobs = allowed.blobs().len();
        match &mut self.serving {
            Some(serving) => {
                serving.cache.use_registry(registry);
                serving.endpoint.serve(allowed);
            }
            None => match self.start(ip, registry, allowed).await {
                Ok(serving) => {
                    self.serving = Some(serving);
                    // Its tracker is new: tell it how many nodes to expect before any asks.
                    self.expect_agents().await;
                }
                Err(e) => return tracing::warn!("cannot serve the in-cluster cache: {e}"),
            },
        }
        tracing::info!(
            sets = wanted.len(),
            blobs,
            "the in-cluster cache serves the fan-out sets"
        );
        let Some(serving) = &mut self.serving else {
            return;
        };
        serving.published.sets = wanted;
        if let Err(e) = self.api.lead_cache(&self.holder, &serving.published).await {
            tracing::warn!("cannot publish the cache's sets: {e}");
        }
    }

    /// Tells the tracker how many nodes have a live agent: a batch of nodes asking for a blob closes once
    /// that many asked (or at its window).
    async fn expect_agents(&self) {
        let Some(tracker) = self.serving.as_ref().and_then(|s| s.endpoint.tracker()) else {
            return;
        };
        match self.api.heartbeats().await {
            Ok(heartbeats) => {
                let now = std::time::SystemTime::now();
                tracker.expect(heartbeats.values().filter(|h| !h.stale(now)).count());
            }
            Err(e) => tracing::debug!("cannot count the agents for the tracker: {e}"),
        }
    }

    /// The fan-out sets' digests, and a registry client with their pull credentials; None (said in the
    /// log) when they cannot be resolved.
    async fn resolve(
        &self,
        sets: &BTreeMap<String, PinSet>,
    ) -> Option<(Arc<Registry>, ServedDigests)> {
        let image_sets: Vec<ImageSet> = fan_out_sets(sets).map(PinSet::to_image_set).collect();
        let credentials = super::pull_credentials(
            &self.api,
            &self.setup.node_credentials,
            image_sets.iter().flat_map(|s| &s.pull_secrets),
        )
        .await;
        let registry = match Registry::with_credentials(self.setup.registry.clone(), credentials) {
            Ok(registry) => Arc::new(registry),
            Err(e) => {
                tracing::warn!("the cache's registry client: {e}");
                return None;
            }
        };
        match served_digests(&image_sets, &registry, &self.setup.platform).await {
            Ok((_, allowed)) => Some((registry, allowed)),
            Err(e) => {
                let failure = crate::error::Failure::from(e);
                tracing::warn!(
                    "the cache cannot resolve the fan-out sets: {}",
                    failure.lines.join("; ")
                );
                None
            }
        }
    }

    /// Opens the blob cache, fetching with `registry`, and serves `allowed` on `ip`.
    async fn start(
        &self,
        ip: IpAddr,
        registry: Arc<Registry>,
        allowed: ServedDigests,
    ) -> Result<Serving, String> {
        let token = self
            .api
            .cache_token(true)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the cache's token Secret holds no token")?;
        let options = CacheOptions {
            link_rate: self.setup.link_rate,
            ..CacheOptions::default()
        };
        let cache =
            BlobCache::open(&self.setup.dir, options, registry).map_err(|e| e.to_string())?;
        let listen = SocketAddr::new(ip, self.setup.port);
        let endpoint = Endpoint::start(listen, Arc::clone(&cache), allowed, Some(token))
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        endpoint.cap_serving(self.setup.serving_cap.clone());
        tracing::info!(address = endpoint.url(), "serving the in-cluster cache");
        let kept = std::fs::read_to_string(self.setup.dir.join(FIGURES_FILE)).ok();
        let carried = kept
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        Ok(Serving {
            carried,
            kept,
            published: CacheLease {
                address: endpoint.url(),
                sets: BTreeMap::new(),
            },
            endpoint,
            cache,
        })
    }

    /// The cache's figures as of now while this agent holds the role, read after the checks asked of the
    /// fan-out sets of `sets`; kept in the cache directory when they changed.
    pub fn report(&mut self, sets: &BTreeMap<String, PinSet>) -> Option<CacheReport> {
        let serving = self.serving.as_mut()?;
        let stats = serving.endpoint.stats();
        let figures = Figures {
            link_bytes: serving.carried.link_bytes + stats.link_bytes,
            served_bytes: serving.carried.served_bytes + stats.served_bytes,
        };
        let text = serde_json::to_string(&figures).unwrap_or_default();
        let path = self.setup.dir.join(FIGURES_FILE);
        match crate::backend::files::write_if_changed(&path, serving.kept.as_deref(), Some(&text)) {
            Ok(_) => serving.kept = Some(text),
            Err(e) => tracing::debug!("cannot keep the cache's figures: {e}"),
        }
        let tracker = serving.endpoint.tracker();
        let swarm = tracker.map(Tracker::stats).unwrap_or_default();
        Some(CacheReport {
            address: serving.published.address.clone(),
            link_bytes: figures.link_bytes,
            served_bytes: figures.served_bytes,
            requests: stats.requests,
            refused: stats.refused,
            link_rate: serving.cache.link_rate(),
            serve_rate: serving.endpoint.serving_cap(),
            swarm_nodes: swarm.nodes,
            swarm_blobs: swarm.blobs,
            dropped_peers: tracker.map(Tracker::dropped).unwrap_or_default(),
            answered: fan_out_sets(sets)
                .filter_map(|s| s.check_request().map(str::to_string))
                .collect(),
        })
    }
}

fn fan_out_sets(sets: &BTreeMap<String, PinSet>) -> impl Iterator<Item = &PinSet> {
    sets.values().filter(|s| s.spec.fan_out)
}

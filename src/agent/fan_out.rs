//! A node's side of a fan-out set (`spec.fanOut`): while its rollout runs, the node's containerd is pointed
//! at the in-cluster cache ([`super::cache`]) first, `server` kept after it, sending the cache's token, so
//! a dead cache never stops a pull (containerd goes on to the source); the files are put back byte for byte
//! when the rollout ends, and at the agent's start if a killed agent left them. The set's report says
//! which way the node pulled.

use std::time::{Duration, Instant};

use crate::backend::pinboard_api::PinboardApi;
use crate::backend::target::NodeTarget;
use crate::backend::wiring::{Wired, marker};
use crate::fanout::{unwire_node, wire_node};
use crate::model::pinboard_api::SetFanOut;
use crate::model::served::Source;

/// How long a node waits for the cache to serve a set's new generation before pulling from the source.
pub const WAIT_FOR_CACHE: Duration = Duration::from_secs(60);

/// How the node pulls a fan-out set.
pub enum Through {
    /// Its runtime points at the cache until [`unwire`].
    Cache(Wired, SetFanOut),
    Source(SetFanOut),
    /// The cache does not serve this generation yet: ask again.
    Wait,
}

/// Points the node at the cache for set `name` at `generation` (its `images`), when the cache serves
/// that generation; waits for it up to [`WAIT_FOR_CACHE`] from `since`, then pulls from the source.
pub async fn prepare(
    api: &PinboardApi,
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
    let mut sources: Vec<Source> = images.iter().filter_map(|i| Source::of(i).ok()).collect();
    sources.sort();
    sources.dedup();
    let marker = marker(&cache.address);
    match wire_node(target, sources, marker, Some(token), timeout).await {
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

/// Puts the node's files back.
pub async fn unwire(set: &str, wired: Wired) {
    if let Err(e) = unwire_node(wired).await {
        tracing::warn!(set, "fan-out's files not all put back: {e}");
    }
}

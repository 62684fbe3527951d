//! A node's requests to the holder's tracker ([`crate::model::peers::wire`]), with the cache's token.

use std::time::Duration;

use http::StatusCode;

use crate::backend::blobs::upstream::Upstream;
use crate::backend::cri::error_chain;
use crate::model::cache_token::CACHE_TOKEN_HEADER;
use crate::model::peers::wire::{Answer, SWARM_PREFIX};

/// How long a request to the tracker may take (a join is answered at once: placed or told to wait).
const TRACKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the tracker gave no answer.
#[derive(Debug)]
pub enum Unanswered {
    /// It does not know the node in this blob's swarm (the holder restarted or moved): join again.
    NotPlaced,
    /// It cannot be reached, or refused, with why.
    Failed(String),
}

/// The node's parents for the blob the runtime asked for at `target` (`/v2/<name>/blobs/<digest>?ns=…`).
pub async fn join(
    client: &reqwest::Client,
    upstream: &Upstream,
    target: &str,
    node: &str,
    address: &str,
) -> Result<Answer, Unanswered> {
    let request = client
        .get(format!("{}{SWARM_PREFIX}{target}", upstream.address))
        .query(&[("node", node), ("address", address)]);
    send(request, upstream).await
}

/// Another parent for `stripe` of `digest`, the node having lost `from` (a node's name or `holder`),
/// corrupt with why or gone.
pub async fn lost(
    client: &reqwest::Client,
    upstream: &Upstream,
    (digest, node, stripe): (&str, &str, usize),
    from: &str,
    corrupt: Option<&str>,
) -> Result<Answer, Unanswered> {
    let stripe = stripe.to_string();
    let why = if corrupt.is_some() { "corrupt" } else { "gone" };
    let request = client
        .post(format!("{}{SWARM_PREFIX}/lost", upstream.address))
        .query(&[
            ("digest", digest),
            ("node", node),
            ("stripe", &stripe),
            ("from", from),
            ("why", why),
            ("reason", corrupt.unwrap_or_default()),
        ]);
    send(request, upstream).await
}

/// The node holds the whole of `digest`.
pub async fn done(client: &reqwest::Client, upstream: &Upstream, digest: &str, node: &str) {
    let request = client
        .post(format!("{}{SWARM_PREFIX}/done", upstream.address))
        .query(&[("digest", digest), ("node", node)]);
    if let Err(Unanswered::Failed(why)) = send(request, upstream).await {
        tracing::debug!(digest, "the tracker did not hear the blob is held: {why}");
    }
}

async fn send(request: reqwest::RequestBuilder, upstream: &Upstream) -> Result<Answer, Unanswered> {
    let response = request
        .header(CACHE_TOKEN_HEADER, upstream.token.expose())
        .timeout(TRACKER_TIMEOUT)
        .send()
        .await
        .map_err(|e| {
            Unanswered::Failed(format!(
                "the tracker at {} cannot be reached: {}",
                upstream.address,
                error_chain(&e.without_url())
            ))
        })?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| {
        Unanswered::Failed(format!(
            "the tracker's answer broke off: {}",
            error_chain(&e.without_url())
        ))
    })?;
    match status {
        StatusCode::OK => serde_json::from_slice(&body).map_err(|e| {
            Unanswered::Failed(format!("the tracker's answer is not understood: {e}"))
        }),
        StatusCode::CONFLICT => Err(Unanswered::NotPlaced),
        _ => Err(Unanswered::Failed(format!(
            "the tracker answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ))),
    }
}

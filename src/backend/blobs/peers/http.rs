//! The peer side's requests over HTTP, with the cache's token: to the holder's tracker
//! ([`crate::model::peers::wire`]) and to other nodes for their pieces and cuts ([`super::serve`]).

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use http::StatusCode;
use http::header::RANGE;

use super::serve::PIECE_STATE_HEADER;
use super::transport::{Ask, Missed, Transport, Unanswered};
use crate::backend::blobs::upstream::Upstream;
use crate::backend::cri::error_chain;
use crate::model::cache_token::CACHE_TOKEN_HEADER;
use crate::model::peers::wire::{Answer, CUTS_PREFIX, Cut, PIECES_PREFIX, ParentAt, SWARM_PREFIX};

/// How long a request to the tracker may take (a join is answered at once: placed or told to wait).
const TRACKER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one piece (or a cut) may take from its parent before the parent counts as stalled (gone).
const PIECE_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests over the cluster's network.
pub struct Http {
    pub client: reqwest::Client,
}

impl Transport for Http {
    fn join<'a>(
        &'a self,
        ask: Ask<'a>,
        target: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
        let request = self
            .client
            .get(format!("{}{SWARM_PREFIX}{target}", ask.upstream.address))
            .query(&[("node", ask.node), ("address", address)]);
        send(request, ask.upstream).boxed()
    }

    fn lost<'a>(
        &'a self,
        ask: Ask<'a>,
        (digest, stripe): (&'a str, usize),
        from: &'a str,
        corrupt: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>> {
        let stripe = stripe.to_string();
        let why = if corrupt.is_some() { "corrupt" } else { "gone" };
        let request = self
            .client
            .post(format!("{}{SWARM_PREFIX}/lost", ask.upstream.address))
            .query(&[
                ("digest", digest),
                ("node", ask.node),
                ("stripe", &stripe),
                ("from", from),
                ("why", why),
                ("reason", corrupt.unwrap_or_default()),
            ]);
        send(request, ask.upstream).boxed()
    }

    fn done<'a>(&'a self, ask: Ask<'a>, digest: &'a str) -> BoxFuture<'a, ()> {
        let request = self
            .client
            .post(format!("{}{SWARM_PREFIX}/done", ask.upstream.address))
            .query(&[("digest", digest), ("node", ask.node)]);
        async move {
            if let Err(Unanswered::Failed(why)) = send(request, ask.upstream).await {
                tracing::debug!(digest, "the tracker did not hear the blob is held: {why}");
            }
        }
        .boxed()
    }

    fn piece<'a>(
        &'a self,
        upstream: &'a Upstream,
        parent: &'a ParentAt,
        (target, digest): (&'a str, &'a str),
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, Missed>> {
        let url = match parent {
            ParentAt::Holder => format!("{}{target}", upstream.address),
            ParentAt::Peer { address, .. } => format!("{address}{PIECES_PREFIX}{digest}"),
        };
        let request = self
            .client
            .get(url)
            .header(RANGE, format!("bytes={}-{}", range.start, range.end - 1));
        from_parent(request, upstream, parent).boxed()
    }

    fn cut<'a>(
        &'a self,
        upstream: &'a Upstream,
        parent: &'a ParentAt,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Cut, Missed>> {
        async move {
            let ParentAt::Peer { address, .. } = parent else {
                return Err(Missed::Gone(
                    "the holder sends its cut in its answer".into(),
                ));
            };
            let request = self.client.get(format!("{address}{CUTS_PREFIX}{digest}"));
            let body = from_parent(request, upstream, parent).await?;
            serde_json::from_slice(&body).map_err(|e| {
                Missed::Gone(format!("{}'s cut is not understood: {e}", parent.name()))
            })
        }
        .boxed()
    }
}

/// A piece or a cut from `parent`: its bytes, `not-yet`, or why the parent counts as gone.
async fn from_parent(
    request: reqwest::RequestBuilder,
    upstream: &Upstream,
    parent: &ParentAt,
) -> Result<Bytes, Missed> {
    let gone = |what: &str, e: reqwest::Error| {
        Missed::Gone(format!(
            "{} {what}: {}",
            parent.name(),
            error_chain(&e.without_url())
        ))
    };
    let response = request
        .header(CACHE_TOKEN_HEADER, upstream.token.expose())
        .timeout(PIECE_TIMEOUT)
        .send()
        .await
        .map_err(|e| gone("cannot be reached", e))?;
    match response.status() {
        StatusCode::PARTIAL_CONTENT | StatusCode::OK => response
            .bytes()
            .await
            .map_err(|e| gone("broke the piece off", e)),
        StatusCode::SERVICE_UNAVAILABLE if response.headers().contains_key(PIECE_STATE_HEADER) => {
            Err(Missed::NotYet)
        }
        status => Err(Missed::Gone(format!("{} answered {status}", parent.name()))),
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

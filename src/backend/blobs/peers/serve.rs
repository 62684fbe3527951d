//! A node serving the pieces it holds to other nodes: `GET /pinboard/v1/pieces/<digest>` with `Range` of
//! exactly one piece and the cache's token, and the cut it takes a blob by (`GET /pinboard/v1/cuts/
//! <digest>`, checked by the asking node against the digest the tracker named). A piece not verified yet
//! is waited for a moment (the node's own parent may be sending it), then answered 503 `not-yet`, so the
//! child asks again rather than counting this node gone; so is a blob it does not take yet (the tracker
//! may have placed it a moment before it starts). No token: 401. The same answers go to an in-process
//! caller ([`piece`], [`cut`]) in the simulation at scale.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

use super::state::PeersState;
use super::taking::NotHeld;
use crate::backend::distribution::parse_range;
use crate::model::cache_token::CACHE_TOKEN_HEADER;
use crate::model::peers::wire::{CUTS_PREFIX, Cut, PIECES_PREFIX};

/// The header a 503 carries when the piece is only not verified yet.
pub const PIECE_STATE_HEADER: &str = "pinboard-piece";
/// How long a request for a piece not yet verified waits for it.
const WAIT_FOR_PIECE: Duration = Duration::from_secs(5);

pub async fn handle(state: Arc<PeersState>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let admitted = {
        let token = state.token.read().unwrap_or_else(|e| e.into_inner());
        let presented = request.headers().get(CACHE_TOKEN_HEADER);
        token
            .as_ref()
            .zip(presented)
            .is_some_and(|(token, presented)| token.admits(presented.as_bytes()))
    };
    if !admitted {
        return refuse(
            &state,
            StatusCode::UNAUTHORIZED,
            "this node serves only pinboard's agents' nodes",
        );
    }
    let path = request.uri().path();
    let served = match request.method() {
        &Method::GET => {
            if let Some(digest) = path.strip_prefix(PIECES_PREFIX) {
                let asked = request.headers().get(RANGE).and_then(|v| v.to_str().ok());
                piece(&state, digest, |size| {
                    parse_range(asked, size).ok().flatten()
                })
                .await
                .map(|(bytes, (range, size))| {
                    Response::builder()
                        .status(StatusCode::PARTIAL_CONTENT)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .header(CONTENT_LENGTH, bytes.len())
                        .header(
                            CONTENT_RANGE,
                            format!("bytes {}-{}/{size}", range.start, range.end - 1),
                        )
                        .body(Full::new(bytes))
                        .expect("a valid response")
                })
            } else if let Some(digest) = path.strip_prefix(CUTS_PREFIX) {
                cut(&state, digest).await.map(|cut| {
                    Response::builder()
                        .header(CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(
                            serde_json::to_vec(&cut).expect("a cut serializes"),
                        )))
                        .expect("a valid response")
                })
            } else {
                Err(Refusal::NotAsked("not a request for a piece or a cut"))
            }
        }
        _ => Err(Refusal::NotAsked("not a request for a piece or a cut")),
    };
    served.unwrap_or_else(|refusal| match refusal {
        Refusal::NotYet => not_yet(),
        Refusal::Gone(why) => plain(StatusCode::GONE, &why),
        Refusal::NotAsked(why) => refuse(&state, StatusCode::NOT_FOUND, why),
        Refusal::NotAPiece => refuse(
            &state,
            StatusCode::RANGE_NOT_SATISFIABLE,
            "ask for one piece, by its range",
        ),
    })
}

/// Why a piece or a cut is not sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not held (or not taken) yet: ask again.
    NotYet,
    /// This node will not have it: its taking failed.
    Gone(String),
    /// The range asked is not one piece.
    NotAPiece,
    /// Not a request this node answers.
    NotAsked(&'static str),
}

/// The piece of `digest` whose range `asked` names (given the blob's size), once verified, under the
/// node's serving cap, with its range and the blob's size. A blob not taken yet (the tracker may have
/// placed this node a moment before it starts) or a piece not verified yet is waited for a moment.
pub async fn piece(
    state: &PeersState,
    digest: &str,
    asked: impl FnOnce(u64) -> Option<Range<u64>>,
) -> Result<(Bytes, (Range<u64>, u64)), Refusal> {
    let taking = state
        .taking_within(digest, WAIT_FOR_PIECE)
        .await
        .ok_or(Refusal::NotYet)?;
    let geometry = taking.cut.geometry();
    let piece = asked(geometry.size).and_then(|range| {
        let piece = u32::try_from(range.start / geometry.piece_size).unwrap_or(u32::MAX);
        (geometry.range(piece) == range).then_some(piece)
    });
    let Some(piece) = piece else {
        return Err(Refusal::NotAPiece);
    };
    match taking.piece(piece, WAIT_FOR_PIECE).await {
        Ok(bytes) => {
            state.may_send(bytes.len() as u64).await;
            state
                .served
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok((bytes, (geometry.range(piece), geometry.size)))
        }
        Err(NotHeld::NotYet) => Err(Refusal::NotYet),
        Err(NotHeld::Failed(why)) => Err(Refusal::Gone(why)),
    }
}

/// The cut of `digest` this node takes by, once it takes it.
pub async fn cut(state: &PeersState, digest: &str) -> Result<Cut, Refusal> {
    let taking = state
        .taking_within(digest, WAIT_FOR_PIECE)
        .await
        .ok_or(Refusal::NotYet)?;
    Ok(taking.cut.clone())
}

fn not_yet() -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .header(PIECE_STATE_HEADER, "not-yet")
        .body(Full::new(Bytes::from_static(b"not held yet: ask again\n")))
        .expect("a valid response")
}

fn refuse(state: &PeersState, status: StatusCode, why: &str) -> Response<Full<Bytes>> {
    state.refused.fetch_add(1, Ordering::Relaxed);
    plain(status, why)
}

fn plain(status: StatusCode, why: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "text/plain")
        .body(Full::new(Bytes::from(format!("{why}\n"))))
        .expect("a valid response")
}

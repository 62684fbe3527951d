//! A node serving the pieces it holds to other nodes: `GET /pinboard/v1/pieces/<digest>` with `Range` of
//! exactly one piece and the cache's token. A piece not verified yet is waited for a moment (the node's
//! own parent may be sending it), then answered 503 `not-yet`, so the child asks again rather than
//! counting this node gone; so is a blob it does not take yet (the tracker may have placed it a moment
//! before it starts). No token: 401.

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
use crate::model::peers::wire::PIECES_PREFIX;

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
    let digest = request.uri().path().strip_prefix(PIECES_PREFIX);
    let taking = match (request.method(), digest) {
        (&Method::GET, Some(digest)) => state.taking_within(digest, WAIT_FOR_PIECE).await,
        _ => return refuse(&state, StatusCode::NOT_FOUND, "not a request for a piece"),
    };
    // Placed by the tracker but not started yet (its runtime has not asked for the blob): ask again.
    let Some(taking) = taking else {
        return not_yet();
    };
    let geometry = taking.cut.geometry();
    let range = request.headers().get(RANGE).and_then(|v| v.to_str().ok());
    let piece = match parse_range(range, geometry.size) {
        Ok(Some(range)) => {
            let piece = u32::try_from(range.start / geometry.piece_size).unwrap_or(u32::MAX);
            (geometry.range(piece) == range).then_some(piece)
        }
        _ => None,
    };
    let Some(piece) = piece else {
        return refuse(
            &state,
            StatusCode::RANGE_NOT_SATISFIABLE,
            "ask for one piece, by its range",
        );
    };
    match taking.piece(piece, WAIT_FOR_PIECE).await {
        Ok(bytes) => {
            state.may_send(bytes.len() as u64).await;
            state
                .served
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let range = geometry.range(piece);
            Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header(CONTENT_TYPE, "application/octet-stream")
                .header(CONTENT_LENGTH, bytes.len())
                .header(
                    CONTENT_RANGE,
                    format!("bytes {}-{}/{}", range.start, range.end - 1, geometry.size),
                )
                .body(Full::new(bytes))
                .expect("a valid response")
        }
        Err(NotHeld::NotYet) => not_yet(),
        Err(NotHeld::Failed(why)) => plain(StatusCode::GONE, &why),
    }
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

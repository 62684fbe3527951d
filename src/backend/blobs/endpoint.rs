//! A read-only registry endpoint over the blob cache: the pull side of the OCI distribution API, for the
//! digests of the sets only.
//!
//! - `GET /v2/`: 200, so clients know a registry is there.
//! - `HEAD|GET /v2/<name>/manifests/<digest>`: from the cache (fetched and stored on first use), with the
//!   manifest's own media type.
//! - `HEAD|GET /v2/<name>/blobs/<digest>`: from the cache, streamed as the bytes land, with `Range`.
//!
//! Which source: containerd asks a mirror with `?ns=<registry host>` and the repository as `<name>`;
//! containers-image (CRI-O, podman) and OpenShift's ImageDigestMirrorSet use a mirror location with a path,
//! so `<name>` is `<registry host>/<repository>`. Both are accepted. A repository, digest or tag the sets do
//! not name gets 404: the endpoint is never an open proxy to private images, and a runtime that gets a 404
//! goes on to its next host (containerd's `server`, CRI-O's source). Everything else is 405.
//!
//! Started with a [`CacheToken`] (the in-cluster cache), it answers 401 to any request without it in the
//! [`CACHE_TOKEN_HEADER`] header, `/v2/` included. The digests served can be replaced while it runs
//! ([`Endpoint::serve`]), when the sets it serves change. A serving cap ([`Endpoint::cap_serving`]) keeps
//! the blob bytes it sends, to all clients together, under a rate, so its node's NIC keeps room.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use futures::StreamExt as _;
use http::header::{
    ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, HeaderValue, RANGE,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;

use crate::backend::blobs::cache::{BlobCache, BlobError};
use crate::backend::blobs::serving_cap::ServingCap;
use crate::backend::blobs::tracker::{Join, Lost, Reply, Tracker};
use crate::backend::distribution::parse_range;
use crate::backend::http_server::{Server, empty_body, full_body};
use crate::model::cache_token::{CACHE_TOKEN_HEADER, CacheToken};
use crate::model::peers::wire::SWARM_PREFIX;
use crate::model::served::{Content, ServedDigests, Source};

type Body = UnsyncBoxBody<Bytes, BlobError>;

const DIGEST_HEADER: &str = "docker-content-digest";
const API_VERSION_HEADER: &str = "docker-distribution-api-version";

/// What the endpoint did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStats {
    /// Bytes the cache took from the source registries ([`BlobCache::link_bytes`]).
    pub link_bytes: u64,
    /// Body bytes sent to clients (manifests and blobs).
    pub served_bytes: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests refused: 401 without the cache's token, 404 because the sets do not name what they asked
    /// for, 405 for anything but a pull (HEAD or GET), 416 for a range outside the blob.
    pub refused: u64,
}

/// A running endpoint. Stop it with [`Endpoint::stop`]; dropping it stops it too.
pub struct Endpoint {
    server: Server,
    shared: Arc<Shared>,
}

struct Shared {
    cache: Arc<BlobCache>,
    allowed: RwLock<Arc<ServedDigests>>,
    /// The in-cluster cache's token: requests without it get 401.
    token: Option<CacheToken>,
    served_bytes: AtomicU64,
    requests: AtomicU64,
    refused: AtomicU64,
    /// The serving cap every blob stream books its bytes against.
    serving_cap: Mutex<Option<ServingCap>>,
    /// With a token (the in-cluster cache): the tracker of the nodes serving each other.
    tracker: Option<Tracker>,
}

impl Shared {
    /// Under a serving cap, waits until `bytes` more fit in it.
    async fn may_send(&self, bytes: u64) {
        let cap = self
            .serving_cap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(cap) = cap {
            cap.wait_to_send(bytes).await;
        }
    }
}

impl Endpoint {
    /// Listens on `listen` (port 0: any free port) and serves `allowed` from `cache` until stopped; with
    /// `token`, only to requests that carry it.
    pub async fn start(
        listen: SocketAddr,
        cache: Arc<BlobCache>,
        allowed: ServedDigests,
        token: Option<CacheToken>,
    ) -> std::io::Result<Endpoint> {
        let shared = Arc::new(Shared {
            cache,
            allowed: RwLock::new(Arc::new(allowed)),
            served_bytes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            serving_cap: Mutex::new(None),
            tracker: token.is_some().then(Tracker::default),
            token,
        });
        let serving = Arc::clone(&shared);
        let server = Server::start(listen, move |request| {
            let shared = Arc::clone(&serving);
            async move { handle(&shared, request).await }
        })
        .await?;
        Ok(Endpoint { server, shared })
    }

    /// The address it listens on (with the port chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://ADDR`: what a node's mirror configuration names.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Serves `allowed` from now on, instead of what it served; the tracker forgets the blobs it no
    /// longer serves.
    pub fn serve(&self, allowed: ServedDigests) {
        if let Some(tracker) = &self.shared.tracker {
            let blobs: std::collections::HashSet<&str> = allowed
                .blobs()
                .into_iter()
                .map(|(_, digest, _)| digest)
                .collect();
            tracker.retain(|digest| blobs.contains(digest));
        }
        *self.shared.allowed.write().expect("served digests") = Arc::new(allowed);
    }

    /// Sends blob bytes, all clients together, under `cap` from now on (None: as fast as they go); the
    /// node's other senders may share it.
    pub fn cap_serving(&self, cap: Option<ServingCap>) {
        *self
            .shared
            .serving_cap
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = cap;
    }

    /// The serving cap, bytes per second.
    pub fn serving_cap(&self) -> Option<u64> {
        let cap = self.shared.serving_cap.lock();
        cap.unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(ServingCap::rate)
    }

    pub fn stats(&self) -> EndpointStats {
        Endpoint::figures(&self.shared)
    }

    /// The tracker of the nodes serving each other (an endpoint started with a token has one).
    pub fn tracker(&self) -> Option<&Tracker> {
        self.shared.tracker.as_ref()
    }

    fn figures(shared: &Shared) -> EndpointStats {
        EndpointStats {
            link_bytes: shared.cache.link_bytes(),
            served_bytes: shared.served_bytes.load(Ordering::Relaxed),
            requests: shared.requests.load(Ordering::Relaxed),
            refused: shared.refused.load(Ordering::Relaxed),
        }
    }

    /// Stops listening and closes every connection; returns the final figures. Downloads under way in the
    /// cache go on (their partial files stay for next time).
    pub async fn stop(self) -> EndpointStats {
        let Endpoint { server, shared } = self;
        server.stop().await;
        Endpoint::figures(&shared)
    }
}

async fn handle(shared: &Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let method = request.method().clone();
    let path = percent_decode(request.uri().path());
    let ns = request.uri().query().and_then(|q| query_param(q, "ns"));
    tracing::debug!(%method, path, ns, "blob endpoint request");
    let head = method == Method::HEAD;
    if let Some(token) = &shared.token {
        let presented = request.headers().get(CACHE_TOKEN_HEADER);
        if !presented.is_some_and(|value| token.admits(value.as_bytes())) {
            return refuse(
                shared,
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "this cache serves only pinboard's agents' nodes".into(),
            );
        }
    }
    if let (Some(tracker), Some(rest)) = (&shared.tracker, path.strip_prefix(SWARM_PREFIX)) {
        let query = request.uri().query().unwrap_or_default().to_string();
        return swarm(shared, tracker, &method, rest, ns.as_deref(), &query).await;
    }
    if method != Method::GET && !head {
        return refuse(
            shared,
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this mirror is read-only: it serves pulls by digest".into(),
        );
    }
    if path == "/v2/" || path == "/v2" {
        return response(StatusCode::OK)
            .header(CONTENT_TYPE, "application/json")
            .body(full(head, Bytes::from_static(b"{}")))
            .expect("a valid response");
    }
    let Some((name, kind, reference)) = split_path(&path) else {
        return refuse(
            shared,
            StatusCode::NOT_FOUND,
            "NAME_UNKNOWN",
            format!("{path} is not a pull of a manifest or blob"),
        );
    };
    let allowed = Arc::clone(&shared.allowed.read().expect("served digests"));
    let Some(source) = allowed.source_of(ns.as_deref(), name) else {
        let named = ns.map_or_else(|| name.to_string(), |ns| format!("{ns}/{name}"));
        return refuse(
            shared,
            StatusCode::NOT_FOUND,
            "NAME_UNKNOWN",
            format!("{named} is not a repository of the sets this mirror serves"),
        );
    };
    match (kind, allowed.get(&source, reference)) {
        (Kind::Manifest, Some(Content::Manifest { .. })) => {
            manifest(shared, &source, reference, head).await
        }
        (Kind::Blob, Some(Content::Blob { size })) => {
            let range = request.headers().get(RANGE).and_then(|v| v.to_str().ok());
            blob(shared, &source, reference, size, range, head).await
        }
        (Kind::Manifest, _) => refuse(
            shared,
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
            format!(
                "{reference} is not a manifest of the sets this mirror serves in {source} (tags are never served)"
            ),
        ),
        (Kind::Blob, _) => refuse(
            shared,
            StatusCode::NOT_FOUND,
            "BLOB_UNKNOWN",
            format!("{reference} is not a blob of the sets this mirror serves in {source}"),
        ),
    }
}

/// The tracker's part of the endpoint: `GET <SWARM_PREFIX>/v2/<name>/blobs/<digest>` (join),
/// `POST <SWARM_PREFIX>/lost` and `POST <SWARM_PREFIX>/done` ([`crate::model::peers::wire`]).
async fn swarm(
    shared: &Shared,
    tracker: &Tracker,
    method: &Method,
    rest: &str,
    ns: Option<&str>,
    query: &str,
) -> Response<Body> {
    let param = |name| query_param(query, name).unwrap_or_default();
    let reply: Reply = match (method, rest) {
        (&Method::POST, "/lost") => {
            let corrupt = (param("why") == "corrupt").then(|| param("reason"));
            tracker.lost(&Lost {
                digest: &param("digest"),
                node: &param("node"),
                stripe: param("stripe").parse().unwrap_or(usize::MAX),
                from: &param("from"),
                corrupt: corrupt.as_deref(),
            })
        }
        (&Method::POST, "/done") => {
            tracker.done(&param("digest"), &param("node"));
            Ok(Default::default())
        }
        (&Method::GET, rest) => {
            let allowed = Arc::clone(&shared.allowed.read().expect("served digests"));
            let blob = split_path(rest).and_then(|(name, kind, digest)| {
                let source = allowed.source_of(ns, name)?;
                match (kind, allowed.get(&source, digest)) {
                    (Kind::Blob, Some(Content::Blob { size })) => Some((source, digest, size)),
                    _ => None,
                }
            });
            match blob {
                Some((source, digest, size)) => {
                    let (node, address) = (param("node"), param("address"));
                    let join = Join {
                        source: &source,
                        digest,
                        size,
                        node: &node,
                        address: &address,
                    };
                    tracker.join_when_cut(&shared.cache, &join).await
                }
                None => Err((
                    StatusCode::NOT_FOUND,
                    format!("{rest} is not a blob of the sets this cache serves"),
                )),
            }
        }
        _ => Err((
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} {SWARM_PREFIX}{rest} is not a request of the tracker"),
        )),
    };
    let (status, body) = match reply {
        Ok(answer) => (
            StatusCode::OK,
            serde_json::to_string(&answer).expect("an answer serializes"),
        ),
        Err((status, why)) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            (status, serde_json::json!({ "error": why }).to_string())
        }
    };
    response(status)
        .header(CONTENT_TYPE, "application/json")
        .body(full_body(Bytes::from(body)))
        .expect("a valid response")
}

async fn manifest(shared: &Shared, source: &Source, digest: &str, head: bool) -> Response<Body> {
    let manifest = match shared.cache.manifest(source, digest).await {
        Ok(manifest) => manifest,
        Err(e) => return upstream_failed(&e, "MANIFEST_UNKNOWN"),
    };
    if !head {
        shared
            .served_bytes
            .fetch_add(manifest.body.len() as u64, Ordering::Relaxed);
    }
    let content_type = HeaderValue::from_str(&manifest.media_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    response(StatusCode::OK)
        .header(CONTENT_TYPE, content_type)
        .header(DIGEST_HEADER, digest)
        .header(CONTENT_LENGTH, manifest.body.len())
        .body(full(head, manifest.body))
        .expect("a valid response")
}

async fn blob(
    shared: &Arc<Shared>,
    source: &Source,
    digest: &str,
    size: u64,
    range: Option<&str>,
    head: bool,
) -> Response<Body> {
    let wanted = match parse_range(range, size) {
        Ok(wanted) => wanted,
        Err(()) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            return response(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(CONTENT_RANGE, format!("bytes */{size}"))
                .body(empty_body())
                .expect("a valid response");
        }
    };
    let (status, bytes) = match &wanted {
        Some(range) => (StatusCode::PARTIAL_CONTENT, range.clone()),
        None => (StatusCode::OK, 0..size),
    };
    let mut builder = response(status)
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(DIGEST_HEADER, digest)
        .header(ACCEPT_RANGES, "bytes")
        .header(CONTENT_LENGTH, bytes.end - bytes.start);
    if wanted.is_some() {
        builder = builder.header(
            CONTENT_RANGE,
            format!(
                "bytes {}-{}/{size}",
                bytes.start,
                bytes.end.saturating_sub(1)
            ),
        );
    }
    if head {
        return builder.body(empty_body()).expect("a valid response");
    }
    let reader = match shared.cache.blob(source, digest, size) {
        Ok(reader) => reader,
        Err(e) => return upstream_failed(&e, "BLOB_UNKNOWN"),
    };
    let mut stream = reader.stream(bytes);
    // Headers wait for the first byte: a blob that cannot be had gets an error status, not a cut body.
    let first = match stream.next().await {
        Some(Err(e)) => return upstream_failed(&e, "BLOB_UNKNOWN"),
        first => first,
    };
    let shared = Arc::clone(shared);
    let body = futures::stream::iter(first)
        .chain(stream)
        .then(move |chunk| {
            let shared = Arc::clone(&shared);
            async move {
                let chunk = chunk?;
                shared.may_send(chunk.len() as u64).await;
                shared
                    .served_bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                Ok(Frame::data(chunk))
            }
        });
    builder
        .body(StreamBody::new(body).boxed_unsync())
        .expect("a valid response")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Manifest,
    Blob,
}

/// `/v2/<name>/(manifests|blobs)/<reference>` → (name, kind, reference).
fn split_path(path: &str) -> Option<(&str, Kind, &str)> {
    let rest = path.strip_prefix("/v2/")?;
    let (rest, reference) = rest.rsplit_once('/')?;
    let (name, kind) = rest.rsplit_once('/')?;
    let kind = match kind {
        "manifests" => Kind::Manifest,
        "blobs" => Kind::Blob,
        _ => return None,
    };
    (!name.is_empty() && !reference.is_empty()).then_some((name, kind, reference))
}

/// The value of `name` in a query string, form-decoded (`+` is a space).
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| percent_decode(&value.replace('+', " ")))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn response(status: StatusCode) -> http::response::Builder {
    Response::builder()
        .status(status)
        .header(API_VERSION_HEADER, "registry/2.0")
}

fn full(head: bool, bytes: Bytes) -> Body {
    if head { empty_body() } else { full_body(bytes) }
}

/// An error in the distribution API's envelope.
fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"errors": [{"code": code, "message": message, "detail": null}]});
    response(status)
        .header(CONTENT_TYPE, "application/json")
        .body(full(false, Bytes::from(body.to_string())))
        .expect("a valid response")
}

/// A request the endpoint does not serve, counted ([`EndpointStats::refused`]).
fn refuse(shared: &Shared, status: StatusCode, code: &str, message: String) -> Response<Body> {
    shared.refused.fetch_add(1, Ordering::Relaxed);
    tracing::info!(message, "blob endpoint refused a request");
    error(status, code, &message)
}

/// What a client sees when the cache could not get something the sets do name: 404 when the source
/// registry does not have it, else 502 with the cause.
fn upstream_failed(failure: &BlobError, not_found_code: &str) -> Response<Body> {
    tracing::warn!(error = %failure, "blob endpoint could not serve a request");
    let message = failure.to_string();
    match failure {
        BlobError::Registry(e) if e.kind() == "not-found" => {
            error(StatusCode::NOT_FOUND, not_found_code, &message)
        }
        _ => error(StatusCode::BAD_GATEWAY, "UNKNOWN", &message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_name_kind_and_reference() {
        let digest = "sha256:0123";
        assert_eq!(
            split_path(&format!("/v2/team/app/blobs/{digest}")),
            Some(("team/app", Kind::Blob, digest))
        );
        assert_eq!(
            split_path(&format!("/v2/127.0.0.1:5000/app/manifests/{digest}")),
            Some(("127.0.0.1:5000/app", Kind::Manifest, digest))
        );
        assert_eq!(split_path("/v2/app/blobs/uploads/"), None);
        assert_eq!(split_path("/v2/app/tags/list"), None);
        assert_eq!(split_path("/v2/manifests/sha256:0"), None);
        assert_eq!(split_path("/v1/app/blobs/sha256:0"), None);
    }

    #[test]
    fn containerds_ns_parameter_is_decoded() {
        assert_eq!(
            query_param("ns=127.0.0.1%3A5000", "ns").as_deref(),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            query_param("a=b&ns=quay.io", "ns").as_deref(),
            Some("quay.io")
        );
        assert_eq!(query_param("nsx=quay.io", "ns"), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(
            query_param("reason=piece+0+hashed%2B", "reason").as_deref(),
            Some("piece 0 hashed+")
        );
    }
}

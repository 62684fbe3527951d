//! A node's relay to the in-cluster cache: the registry mirror its runtime is pointed at, on the node's
//! loopback, served by the node's agent. It passes every pull on to the cache with the cache's token (so
//! the token is never written into the node's files, and CRI-O, whose registries.conf cannot send a header,
//! pulls through the cache too), and rides out the cache's absence:
//!
//! - while the cache cannot be reached (its holder restarting, the role moving to another agent), a request
//!   waits for it up to the hold given, following the cache's address as it moves; after that it gets 503
//!   and the runtime goes on to its next host, the source, and so does every request after it at once,
//!   until the cache answers again (a cache gone for good costs one hold, not one per blob);
//! - a blob whose stream breaks is resumed from the byte it stopped at with `Range`, so the runtime sees
//!   one slow download rather than a failure that would send it, and its whole blob, to the source.
//!
//! A dead agent means a dead relay: the runtime's connection is refused and it pulls from the source.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use http::header::{
    ACCEPT, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, HeaderMap, HeaderValue, RANGE,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::Mutex;

use crate::backend::blobs::cluster_client::cluster_client;
use crate::backend::blobs::peers::Peers;
use crate::backend::blobs::upstream::{Locate, Upstream};
use crate::backend::cri::error_chain;
use crate::backend::distribution::{content_range, parse_range};
use crate::backend::http_server::{Server, empty_body, full_body};
use crate::model::cache_token::CACHE_TOKEN_HEADER;

/// How often a request waiting for the cache tries it again.
const RETRY_EVERY: Duration = Duration::from_millis(500);
/// The cache's address is asked again (see [`Locate`]) at most this often.
const LOCATE_EVERY: Duration = Duration::from_secs(1);

/// Response headers passed on to the runtime.
const PASSED_ON: [&str; 7] = [
    "content-type",
    "content-length",
    "content-range",
    "accept-ranges",
    "docker-content-digest",
    "docker-distribution-api-version",
    "www-authenticate",
];

type Body = UnsyncBoxBody<Bytes, RelayError>;

/// A blob that could not be passed on whole.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RelayError(String);

/// A running relay; dropping it stops it.
pub struct Relay {
    server: Server,
    shared: Arc<Shared>,
}

struct Shared {
    client: reqwest::Client,
    locate: Locate,
    hold: Duration,
    upstream: Mutex<Located>,
    /// A request waited the whole hold in vain, and the cache has not answered since.
    gave_up: AtomicBool,
    sent_to_source: AtomicU64,
    /// Bytes passed on to the runtime: what it fetched through the relay.
    passed: AtomicU64,
    /// Requests waiting for the cache to answer again.
    holding: AtomicU64,
    /// Why the last request was sent to the source.
    last_reason: std::sync::Mutex<Option<String>>,
    /// With `--peer-port`: blobs are taken from the other nodes the tracker names.
    peers: Option<Peers>,
}

#[derive(Default)]
struct Located {
    current: Option<Upstream>,
    /// The current address failed: ask [`Locate`] again.
    lost: bool,
    asked: Option<Instant>,
}

impl Relay {
    /// Listens on `listen` and passes requests on to the cache `locate` finds, waiting up to `hold` for it;
    /// with `peers`, takes blobs from the other nodes as the cache's tracker says.
    pub async fn start(
        listen: SocketAddr,
        locate: Locate,
        hold: Duration,
        peers: Option<Peers>,
    ) -> Result<Relay, RelayError> {
        let client = cluster_client()
            .map_err(|e| RelayError(format!("cannot build the relay's HTTP client: {e}")))?;
        let shared = Arc::new(Shared {
            client,
            locate,
            hold,
            upstream: Mutex::default(),
            gave_up: AtomicBool::new(false),
            sent_to_source: AtomicU64::new(0),
            passed: AtomicU64::new(0),
            holding: AtomicU64::new(0),
            last_reason: std::sync::Mutex::new(None),
            peers,
        });
        let serving = Arc::clone(&shared);
        let server = Server::start(listen, move |request| handle(Arc::clone(&serving), request))
            .await
            .map_err(|e| RelayError(format!("cannot listen on {listen}: {e}")))?;
        tracing::info!(
            address = server.url(),
            "relaying the node's pulls to the in-cluster cache"
        );
        Ok(Relay { server, shared })
    }

    /// `http://ADDR`: what the node's mirror configuration names.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// How many requests were sent on to the source (the cache away, or not serving what was asked), and
    /// why the last was.
    pub fn sent_to_source(&self) -> (u64, Option<String>) {
        let reason = self.shared.last_reason.lock().expect("reason").clone();
        (self.shared.sent_to_source.load(Ordering::Relaxed), reason)
    }

    /// The runtime's requests the relay holds now, waiting for the cache to answer again.
    pub fn holding(&self) -> u64 {
        self.shared.holding.load(Ordering::Relaxed)
    }

    /// Bytes the relay passed on to the runtime so far (manifests and blobs).
    pub fn passed_bytes(&self) -> u64 {
        self.shared.passed.load(Ordering::Relaxed)
    }

    /// The node's peer side, when it serves other nodes.
    pub fn peers(&self) -> Option<&Peers> {
        self.shared.peers.as_ref()
    }

    /// Passes requests on to `upstream` from now on (until it fails and another is found).
    pub async fn follow(&self, upstream: Upstream) {
        let mut located = self.shared.upstream.lock().await;
        *located = Located {
            current: Some(upstream),
            lost: false,
            asked: Some(Instant::now()),
        };
    }
}

impl Shared {
    /// Counts a request the runtime is sent to the source with, and why.
    fn to_source(&self, why: String) {
        self.sent_to_source.fetch_add(1, Ordering::Relaxed);
        *self.last_reason.lock().expect("reason") = Some(why);
    }

    /// The cache to ask: the one last found, unless it failed; then found again (at most every
    /// [`LOCATE_EVERY`]).
    async fn upstream(&self) -> Option<Upstream> {
        let mut located = self.upstream.lock().await;
        let stale = located.current.is_none() || located.lost;
        if stale && located.asked.is_none_or(|at| at.elapsed() >= LOCATE_EVERY) {
            located.current = (self.locate)().await;
            located.lost = false;
            located.asked = Some(Instant::now());
        }
        located.current.clone()
    }

    async fn lost(&self, upstream: &Upstream) {
        let mut located = self.upstream.lock().await;
        if located.current.as_ref() == Some(upstream) {
            located.lost = true;
        }
    }

    /// Sends the request to the cache, waiting up to the hold for one that answers (not at all once a
    /// request waited in vain); why not, after it.
    async fn open(
        &self,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
    ) -> Result<reqwest::Response, String> {
        let hold = match self.gave_up.load(Ordering::Relaxed) {
            true => Duration::ZERO,
            false => self.hold,
        };
        let deadline = Instant::now() + hold;
        let mut held: Option<Held> = None;
        loop {
            let why = match self.upstream().await {
                Some(upstream) => match self
                    .client
                    .request(method.clone(), format!("{}{target}", upstream.address))
                    .headers(headers.clone())
                    .header(CACHE_TOKEN_HEADER, upstream.token.expose())
                    .send()
                    .await
                {
                    Ok(response) => {
                        self.gave_up.store(false, Ordering::Relaxed);
                        return Ok(response);
                    }
                    Err(e) => {
                        self.lost(&upstream).await;
                        format!(
                            "the in-cluster cache at {} cannot be reached: {}",
                            upstream.address,
                            error_chain(&e.without_url())
                        )
                    }
                },
                None => "no agent serves the in-cluster cache".to_string(),
            };
            if Instant::now() >= deadline {
                if !hold.is_zero() {
                    tracing::warn!(
                        target,
                        "sending the runtime to the source, after waiting {}s for the cache, until it is \
                         back: {why}",
                        hold.as_secs()
                    );
                }
                self.gave_up.store(true, Ordering::Relaxed);
                self.to_source(format!("{why} (waited {}s for it)", hold.as_secs()));
                return Err(why);
            }
            held.get_or_insert_with(|| Held::new(&self.holding));
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }
}

/// A request counted as held while it waits for the cache.
struct Held<'a>(&'a AtomicU64);

impl<'a> Held<'a> {
    fn new(holding: &'a AtomicU64) -> Held<'a> {
        holding.fetch_add(1, Ordering::Relaxed);
        Held(holding)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    if method != Method::GET && method != Method::HEAD {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "this mirror serves pulls only",
        );
    }
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut headers = HeaderMap::new();
    for name in [ACCEPT, RANGE] {
        for value in request.headers().get_all(&name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if method == Method::GET
        && target.contains("/blobs/")
        && let Some(response) = from_peers(&shared, &target, &headers).await
    {
        return response;
    }
    let upstream = match shared.open(&method, &target, &headers).await {
        Ok(response) => response,
        Err(why) => return plain(StatusCode::SERVICE_UNAVAILABLE, &why),
    };
    // A runtime answered 404 by its mirror goes to the next host, the source: said, and counted.
    if upstream.status() == StatusCode::NOT_FOUND && !target.ends_with("/v2/") {
        shared.to_source(format!(
            "the in-cluster cache answered 404 for {target}: it does not serve it"
        ));
    }
    let mut response = Response::builder().status(upstream.status());
    for name in PASSED_ON {
        for value in upstream.headers().get_all(name) {
            response = response.header(name, value.clone());
        }
    }
    if method == Method::HEAD {
        return response.body(empty_body()).expect("a valid response");
    }
    let span = served_span(upstream.status(), upstream.headers());
    let body = match span.filter(|_| target.contains("/blobs/")) {
        Some(span) => {
            headers.remove(RANGE);
            resumable(Passing {
                shared,
                target,
                headers,
                next: span.start,
                end: span.end,
                stream: upstream.bytes_stream().boxed(),
                resumed_at: None,
            })
        }
        None => upstream
            .bytes_stream()
            .map(move |chunk| {
                let chunk = chunk.map_err(|e| RelayError(e.to_string()))?;
                shared
                    .passed
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                Ok(Frame::data(chunk))
            })
            .boxed(),
    };
    response
        .body(StreamBody::new(body).boxed_unsync())
        .expect("a valid response")
}

/// The blob at `target` as the node takes it from the other nodes, its verified prefix passed on as it
/// grows; None (the request goes to the cache as before) without peers or a placement in the swarm.
async fn from_peers(
    shared: &Arc<Shared>,
    target: &str,
    headers: &HeaderMap,
) -> Option<Response<Body>> {
    let peers = shared.peers.as_ref()?;
    let upstream = shared.upstream().await?;
    let taking = peers.take(&upstream, target).await?;
    let size = taking.cut.size;
    let asked = headers.get(RANGE).and_then(|v| v.to_str().ok());
    let mut response = Response::builder()
        .header(CONTENT_TYPE, "application/octet-stream")
        .header("docker-content-digest", taking.digest.as_str())
        .header("accept-ranges", "bytes");
    let span = match parse_range(asked, size) {
        Ok(Some(span)) => {
            let range = format!("bytes {}-{}/{size}", span.start, span.end - 1);
            response = response
                .status(StatusCode::PARTIAL_CONTENT)
                .header(CONTENT_RANGE, range);
            span
        }
        Ok(None) => 0..size,
        Err(()) => {
            let refused = Response::builder()
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(CONTENT_RANGE, format!("bytes */{size}"))
                .body(empty_body());
            return Some(refused.expect("a valid response"));
        }
    };
    let mut rest_headers = headers.clone();
    rest_headers.remove(RANGE);
    let from_peers = FromPeers::Peers {
        peers: taking.prefix_stream(span.clone()),
        rest: Passing {
            shared: Arc::clone(shared),
            target: target.to_string(),
            headers: rest_headers,
            next: span.start,
            end: span.end,
            stream: futures::stream::empty().boxed(),
            resumed_at: None,
        },
    };
    let response = response
        .header(CONTENT_LENGTH, span.end - span.start)
        .body(StreamBody::new(from_peers.stream()).boxed_unsync());
    Some(response.expect("a valid response"))
}

/// A blob passed on from what the node takes from the other nodes; should that fail (no parent within
/// the stripes' patience), the rest comes from the cache's holder as without peers, so the runtime sees
/// one download, not a failure that would send it to the source.
enum FromPeers {
    Peers {
        peers: BoxStream<'static, Result<Bytes, String>>,
        /// What is left, `next..end`, for the holder should the peers fail.
        rest: Passing,
    },
    Holder(BoxStream<'static, Result<Frame<Bytes>, RelayError>>),
}

impl FromPeers {
    fn stream(self) -> BoxStream<'static, Result<Frame<Bytes>, RelayError>> {
        futures::stream::unfold(Some(self), |from| async move {
            let mut from = from?;
            loop {
                match from {
                    FromPeers::Holder(mut holder) => {
                        let item = holder.next().await?;
                        return Some((item, Some(FromPeers::Holder(holder))));
                    }
                    FromPeers::Peers {
                        mut peers,
                        mut rest,
                    } => match peers.next().await {
                        Some(Ok(chunk)) => {
                            rest.next += chunk.len() as u64;
                            let passed = &rest.shared.passed;
                            passed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            let from = FromPeers::Peers { peers, rest };
                            return Some((Ok(Frame::data(chunk)), Some(from)));
                        }
                        None => return None,
                        Some(Err(why)) => {
                            tracing::warn!(
                                target = rest.target,
                                at = rest.next,
                                "taking the rest of the blob from the cache's holder: {why}"
                            );
                            if let Err(e) = rest.resume(&why).await {
                                return Some((Err(e), None));
                            }
                            from = FromPeers::Holder(resumable(rest));
                        }
                    },
                }
            }
        })
        .boxed()
    }
}

/// A blob on its way to the runtime: bytes `next..end` are still to come from `stream`.
struct Passing {
    shared: Arc<Shared>,
    target: String,
    /// What the runtime sent, without its `Range`.
    headers: HeaderMap,
    next: u64,
    end: u64,
    stream: BoxStream<'static, reqwest::Result<Bytes>>,
    /// Where the last resume started: a stream that breaks again before any byte is not resumed again.
    resumed_at: Option<u64>,
}

impl Passing {
    /// Asks the cache for the rest, `next..end`, after the stream broke for `why`.
    async fn resume(&mut self, why: &str) -> Result<(), RelayError> {
        if self.resumed_at == Some(self.next) {
            return Err(RelayError(format!(
                "the in-cluster cache broke the blob again at byte {} without sending any of it: {why}",
                self.next
            )));
        }
        self.resumed_at = Some(self.next);
        tracing::info!(
            target = self.target,
            at = self.next,
            "resuming a blob through the in-cluster cache: {why}"
        );
        let mut headers = self.headers.clone();
        let range = format!("bytes={}-{}", self.next, self.end - 1);
        headers.insert(RANGE, HeaderValue::from_str(&range).expect("ASCII"));
        let response = self
            .shared
            .open(&Method::GET, &self.target, &headers)
            .await
            .map_err(RelayError)?;
        let span = served_span(response.status(), response.headers());
        if response.status() != StatusCode::PARTIAL_CONTENT
            || span.as_ref().map(|s| s.start) != Some(self.next)
        {
            return Err(RelayError(format!(
                "the in-cluster cache answered {} to the rest of a blob from byte {}",
                response.status(),
                self.next
            )));
        }
        self.stream = response.bytes_stream().boxed();
        Ok(())
    }
}

/// The bytes of `passing`, resumed as often as its stream breaks while the cache comes back within the
/// hold; an error (the runtime's download fails and it moves on) when it does not.
fn resumable(passing: Passing) -> BoxStream<'static, Result<Frame<Bytes>, RelayError>> {
    futures::stream::unfold(Some(passing), |passing| async move {
        let mut passing = passing?;
        loop {
            let why = match passing.stream.next().await {
                Some(Ok(chunk)) => {
                    passing.next += chunk.len() as u64;
                    let passed = &passing.shared.passed;
                    passed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    return Some((Ok(Frame::data(chunk)), Some(passing)));
                }
                None if passing.next >= passing.end => return None,
                None => "the cache's answer ended early".to_string(),
                Some(Err(e)) => error_chain(&e.without_url()),
            };
            if let Err(e) = passing.resume(&why).await {
                return Some((Err(e), None));
            }
        }
    })
    .boxed()
}

/// The bytes of the blob a 200 (with its length) or 206 (with its `Content-Range`) answer carries.
fn served_span(status: StatusCode, headers: &HeaderMap) -> Option<Range<u64>> {
    match status {
        StatusCode::OK => Some(0..headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?),
        StatusCode::PARTIAL_CONTENT => content_range(headers),
        _ => None,
    }
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "text/plain")
        .body(full_body(Bytes::from(format!("{message}\n"))))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::AtomicUsize;

    use http::header::HeaderName;

    use crate::model::cache_token::CacheToken;

    use super::*;

    const TOKEN: &str = "t0ken";
    const BLOB: usize = 256 * 1024;
    const CUT_AT: usize = 64 * 1024;

    fn blob() -> Bytes {
        (0..BLOB)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into()
    }

    /// A body of `bytes`, then broken after a pause (so that the headers and bytes have left, as a killed
    /// holder's have).
    fn broken_after(bytes: Bytes) -> Body {
        let cut = futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(RelayError("killed".into()))
        });
        let body = futures::stream::iter([Ok(Frame::data(bytes))]).chain(cut);
        StreamBody::new(body).boxed_unsync()
    }

    /// Where `cache` is, with [`TOKEN`].
    fn upstream_of(cache: &Server) -> Upstream {
        Upstream {
            address: cache.url(),
            token: CacheToken::new(TOKEN).unwrap(),
        }
    }

    /// A cache that wants [`TOKEN`] and breaks every whole-blob answer after [`CUT_AT`] bytes, as a
    /// killed holder does; it answers ranges whole, or, `ranges_break`, breaks them before their first
    /// byte. With how many requests it had.
    async fn breaking_cache(ranges_break: bool) -> (Server, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        let server = Server::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            move |request: Request<Incoming>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    let blob = blob();
                    if request
                        .headers()
                        .get(CACHE_TOKEN_HEADER)
                        .map(|v| v.as_bytes())
                        != Some(TOKEN.as_bytes())
                    {
                        return plain(StatusCode::UNAUTHORIZED, "no token");
                    }
                    let range = request
                        .headers()
                        .get(RANGE)
                        .map(|v| v.to_str().unwrap().to_string());
                    let Some(range) = range else {
                        return Response::builder()
                            .header(CONTENT_LENGTH, BLOB)
                            .body(broken_after(blob.slice(..CUT_AT)))
                            .unwrap();
                    };
                    let (first, last) = range
                        .strip_prefix("bytes=")
                        .unwrap()
                        .split_once('-')
                        .unwrap();
                    let (first, last): (usize, usize) =
                        (first.parse().unwrap(), last.parse().unwrap());
                    let body = match ranges_break {
                        true => broken_after(Bytes::new()),
                        false => full_body(blob.slice(first..=last)),
                    };
                    Response::builder()
                        .status(StatusCode::PARTIAL_CONTENT)
                        .header(CONTENT_RANGE, format!("bytes {first}-{last}/{BLOB}"))
                        .header(CONTENT_LENGTH, last + 1 - first)
                        .body(body)
                        .unwrap()
                }
            },
        )
        .await
        .unwrap();
        (server, requests)
    }

    /// A relay whose [`Locate`] finds nothing the first `absent` times it is asked, then `upstream`.
    async fn relay(upstream: Option<Upstream>, absent: usize, hold: Duration) -> Relay {
        crate::install_crypto_provider();
        let asked = Arc::new(AtomicUsize::new(0));
        let locate: Locate = Arc::new(move || {
            let upstream = upstream
                .clone()
                .filter(|_| asked.fetch_add(1, Ordering::SeqCst) >= absent);
            Box::pin(async move { upstream })
        });
        Relay::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            locate,
            hold,
            None,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_blob_cut_mid_stream_reaches_the_runtime_whole_and_the_cache_is_waited_for() {
        let (cache, requests) = breaking_cache(false).await;
        let relay = relay(Some(upstream_of(&cache)), 1, Duration::from_secs(10)).await;
        let url = format!("{}/v2/app/blobs/sha256:00?ns=registry.example", relay.url());
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.content_length(), Some(BLOB as u64));
        let body = response.bytes().await.unwrap();
        assert!(
            body == blob(),
            "the bytes passed on are the blob's, in order"
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "the whole blob, then its rest"
        );
    }

    #[tokio::test]
    async fn a_blob_the_cache_breaks_again_before_any_byte_fails_instead_of_looping() {
        let (cache, requests) = breaking_cache(true).await;
        let relay = relay(Some(upstream_of(&cache)), 0, Duration::from_secs(10)).await;
        let response = reqwest::get(format!("{}/v2/app/blobs/sha256:00", relay.url()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = tokio::time::timeout(Duration::from_secs(10), response.bytes()).await;
        assert!(
            body.expect("the relay gives up, not loops").is_err(),
            "the runtime sees the blob fail, and goes on to the source"
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "the whole blob, then one resume"
        );
    }

    #[tokio::test]
    async fn a_cache_that_stays_away_sends_the_runtime_on_after_the_hold() {
        let relay = relay(None, 0, Duration::from_secs(1)).await;
        let started = Instant::now();
        let response = reqwest::get(format!("{}/v2/app/blobs/sha256:00", relay.url()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() >= Duration::from_secs(1));
        let said = response.text().await.unwrap();
        assert!(
            said.contains("no agent serves the in-cluster cache"),
            "{said}"
        );
    }

    #[tokio::test]
    async fn a_blob_the_peers_fail_to_give_is_finished_from_the_holder() {
        use crate::backend::blobs::peers::Taking;
        use crate::model::peers::Cut;
        use crate::model::peers::wire::piece_hash;

        let (cache, requests) = breaking_cache(false).await;
        let relay = relay(Some(upstream_of(&cache)), 0, Duration::from_secs(10)).await;
        let blob = blob();
        let piece = 64 * 1024;
        let cut = Cut {
            size: BLOB as u64,
            piece_size: piece as u64,
            stripes: 4,
            hashes: blob.chunks(piece).map(piece_hash).collect(),
        };
        let dir = tempfile::tempdir().unwrap();
        let taking = Arc::new(Taking::create(&dir.path().join("b"), "sha256:00", cut).unwrap());
        taking.put(0, blob.slice(..piece)).await.unwrap();
        let from_peers = FromPeers::Peers {
            peers: taking.prefix_stream(0..BLOB as u64),
            rest: Passing {
                shared: Arc::clone(&relay.shared),
                target: "/v2/app/blobs/sha256:00".into(),
                headers: HeaderMap::new(),
                next: 0,
                end: BLOB as u64,
                stream: futures::stream::empty().boxed(),
                resumed_at: None,
            },
        };
        // The peers give the first piece, then fail.
        taking.fail("no parent for stripe 1 within 30s".into());
        let frames: Vec<Bytes> = from_peers
            .stream()
            .map(|frame| frame.unwrap().into_data().unwrap())
            .collect()
            .await;
        assert!(frames.concat() == blob, "the whole blob, in order");
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "one request to the holder: the rest, from the first piece's end"
        );
        assert_eq!(relay.passed_bytes(), BLOB as u64);
    }

    #[test]
    fn the_span_of_an_answer_is_its_length_or_its_content_range() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            map
        };
        let length = headers(&[("content-length", "1000")]);
        assert_eq!(served_span(StatusCode::OK, &length), Some(0..1000));
        let partial = headers(&[("content-range", "bytes 200-999/1000")]);
        assert_eq!(
            served_span(StatusCode::PARTIAL_CONTENT, &partial),
            Some(200..1000)
        );
        assert_eq!(served_span(StatusCode::NOT_FOUND, &length), None);
        assert_eq!(served_span(StatusCode::OK, &HeaderMap::new()), None);
    }
}

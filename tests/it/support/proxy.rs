//! A loopback TCP proxy in front of the registry that slows traffic down and breaks it, for tests of
//! progress, timeouts, scheduling and recovery. It runs on its own thread with its own tokio runtime, so it
//! works the same under sync tests and `#[tokio::test]`.
//!
//! Faults are read from [`Faults`] for every chunk forwarded, so a change applies to connections already
//! open. Besides a delay per request and a bandwidth cap, it can reset a connection (TCP RST) after N
//! response bytes, stall one (stop sending, keep it open) after N bytes, answer requests itself with an
//! error status and `Retry-After`, trickle responses in small pieces, and drop `Range` headers so the
//! registry answers 200 with the whole blob. It records every request head it sees, as the client sent it.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Request lines start with one of these; a client->server chunk that does is a new HTTP request.
const METHODS: [&[u8]; 7] = [
    b"GET ",
    b"HEAD ",
    b"POST ",
    b"PUT ",
    b"PATCH ",
    b"DELETE ",
    b"OPTIONS ",
];
const BUFFER: usize = 64 * 1024;
/// How far the bandwidth limiter may fall behind its schedule and still catch up: sleeps overshoot (the
/// timer has ~1 ms granularity), and without paying that back one connection gets a fraction of the cap.
const CATCH_UP: Duration = Duration::from_millis(50);

/// What the proxy currently does to traffic.
#[derive(Clone, Debug, Default)]
struct Faults {
    /// Held before forwarding each new HTTP request.
    delay: Duration,
    /// Shared cap on server->client bytes per second over all connections.
    bandwidth: Option<u64>,
    /// Connections reset once they have sent this many response bytes.
    reset: Option<Cut>,
    /// Connections that stop sending (and stay open) once they have sent this many response bytes.
    stall: Option<Cut>,
    /// Requests the proxy answers itself.
    errors: Option<ErrorReply>,
    /// Responses sent in pieces of at most this many bytes, each after the pause.
    trickle: Option<(usize, Duration)>,
    /// `Range` headers removed from requests.
    ignore_range: bool,
}

/// A connection-level fault: after how many response bytes, and for how many more connections (`None`:
/// every connection until cleared).
#[derive(Clone, Copy, Debug)]
struct Cut {
    after: u64,
    connections: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct ErrorReply {
    status: u16,
    retry_after: Option<u64>,
    requests: u64,
    /// Only requests whose first line contains this are answered (None: every request).
    only: Option<&'static str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutKind {
    Reset,
    Stall,
}

/// Where a proxied connection stands, shared by its two directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Open,
    /// The client closed its side (or it broke): a stalled response may stop waiting.
    ClientGone,
    /// The proxy ended the connection (a reset, or an error it answered itself): both directions stop.
    Cut,
}

/// Controls and counters of a running proxy. Cheap to clone; all clones control the same proxy.
#[derive(Clone)]
pub struct ProxyControl {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    faults: Mutex<Faults>,
    /// When the bandwidth limit next has capacity: a schedule shared by all connections, never more than
    /// [`CATCH_UP`] ahead of itself.
    next_send: Mutex<Option<Instant>>,
    requests: AtomicU64,
    bytes_down: AtomicU64,
    heads: Mutex<Vec<String>>,
}

impl ProxyControl {
    /// Holds each new HTTP request back for `delay` before forwarding it (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        self.update(|f| f.delay = delay);
    }

    /// Limits registry->client bytes per second, shared over all connections (`None`: unlimited).
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        assert_ne!(
            bytes_per_second,
            Some(0),
            "a bandwidth of 0 would stall forever"
        );
        self.update(|f| f.bandwidth = bytes_per_second);
    }

    /// Resets connections (TCP RST) once they have sent `after_bytes` response bytes, headers included:
    /// the next `connections` that get that far, or every one (`None`) until cleared.
    pub fn reset_after(&self, after_bytes: u64, connections: Option<u64>) {
        self.update(|f| {
            f.reset = Some(Cut {
                after: after_bytes,
                connections,
            })
        });
    }

    /// Stops forwarding responses on connections once they have sent `after_bytes` bytes, keeping them
    /// open until the client gives up: the next `connections` that get that far, or every one (`None`).
    pub fn stall_after(&self, after_bytes: u64, connections: Option<u64>) {
        self.update(|f| {
            f.stall = Some(Cut {
                after: after_bytes,
                connections,
            })
        });
    }

    /// Answers the next `requests` requests itself with `status` (and `Retry-After: <seconds>` when
    /// given) and closes their connections; the registry never sees them.
    pub fn fail_requests(&self, status: u16, requests: u64, retry_after: Option<u64>) {
        self.fail_matching(None, status, requests, retry_after);
    }

    /// [`ProxyControl::fail_requests`] for requests whose request line contains `path` only (e.g.
    /// `/blobs/`): others pass.
    pub fn fail_requests_for(
        &self,
        path: &'static str,
        status: u16,
        requests: u64,
        retry_after: Option<u64>,
    ) {
        self.fail_matching(Some(path), status, requests, retry_after);
    }

    fn fail_matching(
        &self,
        only: Option<&'static str>,
        status: u16,
        requests: u64,
        retry_after: Option<u64>,
    ) {
        self.update(|f| {
            f.errors = Some(ErrorReply {
                status,
                retry_after,
                requests,
                only,
            })
        });
    }

    /// Sends responses in pieces of at most `piece` bytes, each after `pause` (`None`: off).
    pub fn set_trickle(&self, trickle: Option<(usize, Duration)>) {
        assert!(
            trickle.is_none_or(|(piece, _)| piece > 0),
            "pieces of 0 bytes"
        );
        self.update(|f| f.trickle = trickle);
    }

    /// Removes `Range` headers from requests, so the registry answers 200 with the whole blob.
    pub fn set_ignore_range(&self, on: bool) {
        self.update(|f| f.ignore_range = on);
    }

    /// Back to forwarding everything as it comes.
    pub fn clear_faults(&self) {
        self.update(|f| *f = Faults::default());
    }

    /// The head (request line and headers) of every request seen so far, as the client sent it.
    pub fn request_heads(&self) -> Vec<String> {
        self.shared.heads.lock().expect("heads").clone()
    }

    /// How many of the error replies asked for with [`ProxyControl::fail_requests`] are still to be given.
    pub fn pending_errors(&self) -> u64 {
        self.faults().errors.map_or(0, |e| e.requests)
    }

    /// HTTP requests seen so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Bytes forwarded registry->client so far.
    pub fn bytes_down(&self) -> u64 {
        self.shared.bytes_down.load(Ordering::Relaxed)
    }

    fn update(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.shared.faults.lock().expect("faults"));
    }

    fn faults(&self) -> Faults {
        self.shared.faults.lock().expect("faults").clone()
    }

    /// The cut a connection that has sent `sent` bytes meets in its next `n` bytes, if a fault (with
    /// connections left to cut) says so, and how many of those bytes go out before it.
    fn claim_cut(&self, sent: u64, n: usize) -> Option<(CutKind, usize)> {
        let mut guard = self.shared.faults.lock().expect("faults");
        let faults = &mut *guard;
        for (kind, cut) in [
            (CutKind::Reset, &mut faults.reset),
            (CutKind::Stall, &mut faults.stall),
        ] {
            let Some(fault) = cut.as_mut() else { continue };
            if sent + n as u64 <= fault.after || fault.connections == Some(0) {
                continue;
            }
            if let Some(left) = fault.connections.as_mut() {
                *left -= 1;
            }
            let keep = usize::try_from(fault.after.saturating_sub(sent)).unwrap_or(n);
            return Some((kind, keep.min(n)));
        }
        None
    }

    /// The error the proxy answers the request with this first line with, if it should.
    fn claim_error(&self, request_line: &str) -> Option<ErrorReply> {
        let mut faults = self.shared.faults.lock().expect("faults");
        let reply = faults
            .errors
            .as_mut()
            .filter(|e| e.requests > 0 && e.only.is_none_or(|only| request_line.contains(only)))?;
        reply.requests -= 1;
        Some(*reply)
    }

    /// Waits until `bytes` more may be sent under `limit` bytes/s.
    async fn throttle(&self, bytes: usize, limit: u64) {
        let cost = Duration::from_secs_f64(bytes as f64 / limit as f64);
        let until = {
            let mut next = self.shared.next_send.lock().expect("limiter");
            let now = Instant::now();
            let earliest = now.checked_sub(CATCH_UP).unwrap_or(now);
            let start = next.map_or(now, |n| n.max(earliest));
            *next = Some(start + cost);
            start + cost
        };
        tokio::time::sleep_until(until).await;
    }
}

/// A running proxy; dropping it stops its thread and closes all its connections.
pub(crate) struct Proxy {
    host: String,
    control: ProxyControl,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free port of `ip` (loopback, or a cluster lab's host-side address) and forwards every
    /// connection to `upstream`.
    pub(crate) fn start(ip: IpAddr, upstream: SocketAddr) -> Result<Proxy> {
        let listener = std::net::TcpListener::bind((ip, 0))?;
        listener.set_nonblocking(true)?;
        let host = listener.local_addr()?.to_string();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let control = ProxyControl {
            shared: Arc::default(),
        };
        let (stop, stopped) = oneshot::channel();
        let serving = control.clone();
        let thread = std::thread::Builder::new()
            .name("lab-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener =
                        TcpListener::from_std(listener).expect("registering the listener");
                    tokio::select! {
                        () = accept_loop(listener, upstream, serving) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here cancels the connection tasks.
            })?;
        Ok(Proxy {
            host,
            control,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `IP:PORT`
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn control(&self) -> &ProxyControl {
        &self.control
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, control: ProxyControl) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let control = control.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let client_write = tokio::sync::Mutex::new(Some(client_write));
            let (link, _) = watch::channel(Link::Open);
            tokio::join!(
                requests(client_read, server_write, &client_write, &control, &link),
                responses(server_read, &client_write, &control, &link),
            );
        });
    }
}

/// Client to registry: counts and records requests, applies the delay, answers the faulted ones itself,
/// drops `Range` headers when asked; until the client closes or the proxy cuts the connection.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    client: &tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    control: &ProxyControl,
    link: &watch::Sender<Link>,
) {
    let mut cut = link.subscribe();
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.wait_for(|l| *l == Link::Cut) => return,
        };
        let mut data = buffer[..n].to_vec();
        if METHODS.iter().any(|method| data.starts_with(method)) {
            control.shared.requests.fetch_add(1, Ordering::Relaxed);
            let head_end = data
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(data.len(), |i| i + 4);
            control
                .shared
                .heads
                .lock()
                .expect("heads")
                .push(String::from_utf8_lossy(&data[..head_end]).into_owned());
            let faults = control.faults();
            if !faults.delay.is_zero() {
                tokio::time::sleep(faults.delay).await;
            }
            let line = String::from_utf8_lossy(&data[..head_end]);
            let first = line.lines().next().unwrap_or_default();
            if let Some(reply) = control.claim_error(first) {
                answer_with_error(client, reply).await;
                link.send_replace(Link::Cut);
                return;
            }
            if faults.ignore_range {
                data = without_range(&data, head_end);
            }
        }
        if to.write_all(&data).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    link.send_if_modified(|l| {
        let open = *l == Link::Open;
        if open {
            *l = Link::ClientGone;
        }
        open
    });
}

/// Registry to client: applies bandwidth, trickle, resets and stalls, and counts the bytes.
async fn responses(
    mut from: OwnedReadHalf,
    client: &tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    control: &ProxyControl,
    link: &watch::Sender<Link>,
) {
    let mut state = link.subscribe();
    let mut buffer = vec![0u8; BUFFER];
    let mut sent: u64 = 0;
    loop {
        let faults = control.faults();
        // Under a bandwidth limit, read at most ~1/20 s worth at a time so the pace stays smooth.
        let chunk = faults.bandwidth.map_or(BUFFER, |limit| {
            usize::try_from(limit / 20)
                .unwrap_or(BUFFER)
                .clamp(512, BUFFER)
        });
        let n = tokio::select! {
            read = from.read(&mut buffer[..chunk]) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = state.wait_for(|l| *l == Link::Cut) => return,
        };
        let cut = control.claim_cut(sent, n);
        let data = &buffer[..cut.map_or(n, |(_, keep)| keep)];
        if send(client, data, &faults, control).await.is_err() {
            break;
        }
        sent += data.len() as u64;
        match cut {
            None => {}
            Some((CutKind::Reset, _)) => {
                if let Some(half) = client.lock().await.take() {
                    // The bytes before the cut reach the client first: a reset discards what is still queued.
                    drained(half.as_ref()).await;
                    // Linger 0 makes the close a reset; forget() keeps the write half from sending a FIN
                    // first. The socket closes when the request direction, told below, drops its half.
                    let _ = half.as_ref().set_zero_linger();
                    half.forget();
                }
                link.send_replace(Link::Cut);
                return;
            }
            Some((CutKind::Stall, _)) => {
                let _ = state.wait_for(|l| *l != Link::Open).await;
                link.send_replace(Link::Cut);
                return;
            }
        }
    }
    if let Some(half) = client.lock().await.as_mut() {
        let _ = half.shutdown().await;
    }
}

/// Waits (up to a few seconds) until the peer has acknowledged everything written to `stream`.
async fn drained(stream: &TcpStream) {
    use std::os::fd::AsRawFd as _;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int, the bytes not yet acknowledged, into `queued`.
        let failed = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } != 0;
        if failed || queued == 0 || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Writes response bytes to the client, in trickled pieces and under the bandwidth cap if set.
async fn send(
    client: &tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    data: &[u8],
    faults: &Faults,
    control: &ProxyControl,
) -> std::io::Result<()> {
    let piece = faults.trickle.map_or(data.len().max(1), |(piece, _)| piece);
    for part in data.chunks(piece) {
        if let Some((_, pause)) = faults.trickle {
            tokio::time::sleep(pause).await;
        }
        if let Some(limit) = faults.bandwidth {
            control.throttle(part.len(), limit).await;
        }
        // Counted before the write: once written, the client may finish before we count.
        control
            .shared
            .bytes_down
            .fetch_add(part.len() as u64, Ordering::Relaxed);
        let mut guard = client.lock().await;
        let Some(half) = guard.as_mut() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        half.write_all(part).await?;
    }
    Ok(())
}

/// Answers a request with `reply`'s status, an error envelope and `Connection: close`, then closes.
async fn answer_with_error(client: &tokio::sync::Mutex<Option<OwnedWriteHalf>>, reply: ErrorReply) {
    let body = format!(
        "{{\"errors\":[{{\"code\":\"UNAVAILABLE\",\"message\":\"lab proxy fault: HTTP {}\"}}]}}",
        reply.status
    );
    let retry_after = reply
        .retry_after
        .map_or_else(String::new, |s| format!("Retry-After: {s}\r\n"));
    let response = format!(
        "HTTP/1.1 {} Lab Fault\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry_after}\
         Connection: close\r\n\r\n{body}",
        reply.status,
        body.len()
    );
    if let Some(mut half) = client.lock().await.take() {
        let _ = half.write_all(response.as_bytes()).await;
        let _ = half.shutdown().await;
    }
}

/// `data` (a request starting with its head of `head_end` bytes) without its `Range` header.
fn without_range(data: &[u8], head_end: usize) -> Vec<u8> {
    let head = String::from_utf8_lossy(&data[..head_end]);
    let kept: String = head
        .split_inclusive("\r\n")
        .filter(|line| !line.to_ascii_lowercase().starts_with("range:"))
        .collect();
    let mut out = kept.into_bytes();
    out.extend_from_slice(&data[head_end..]);
    out
}

//! A loopback TCP proxy in front of the registry that can slow traffic down, for tests of progress,
//! timeouts and scheduling. It runs on its own thread with its own tokio runtime, so it works the same under
//! sync tests and `#[tokio::test]`.
//!
//! Faults are read from [`Faults`] for every chunk forwarded, so a change applies to connections already
//! open; new kinds of fault (a reset after N bytes, a stall) are new fields there plus a check in `forward`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
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
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// Held before forwarding each new HTTP request.
    delay: Duration,
    /// Shared cap on server->client bytes per second over all connections.
    bandwidth: Option<u64>,
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
}

impl ProxyControl {
    /// Holds each new HTTP request back for `delay` before forwarding it (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.faults.lock().expect("faults").delay = delay;
    }

    /// Limits registry->client bytes per second, shared over all connections (`None`: unlimited).
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        assert_ne!(
            bytes_per_second,
            Some(0),
            "a bandwidth of 0 would stall forever"
        );
        self.shared.faults.lock().expect("faults").bandwidth = bytes_per_second;
    }

    /// HTTP requests seen so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Bytes forwarded registry->client so far.
    pub fn bytes_down(&self) -> u64 {
        self.shared.bytes_down.load(Ordering::Relaxed)
    }

    fn faults(&self) -> Faults {
        *self.shared.faults.lock().expect("faults")
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
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub(crate) fn start(upstream: SocketAddr) -> Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
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

    /// `127.0.0.1:PORT`
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
            tokio::join!(
                forward(client_read, server_write, &control, Direction::Up),
                forward(server_read, client_write, &control, Direction::Down),
            );
        });
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to registry: requests.
    Up,
    /// Registry to client: responses.
    Down,
}

/// Copies one direction of a connection, applying the current [`Faults`] to each chunk, until EOF or an
/// error; then shuts the write side down so the peer sees the end too.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    control: &ProxyControl,
    direction: Direction,
) {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let faults = control.faults();
        // Under a bandwidth limit, read at most ~1/20 s worth at a time so the pace stays smooth.
        let chunk = match (direction, faults.bandwidth) {
            (Direction::Down, Some(limit)) => usize::try_from(limit / 20)
                .unwrap_or(BUFFER)
                .clamp(512, BUFFER),
            _ => BUFFER,
        };
        let n = match from.read(&mut buffer[..chunk]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = &buffer[..n];
        match direction {
            Direction::Up => {
                if METHODS.iter().any(|method| data.starts_with(method)) {
                    control.shared.requests.fetch_add(1, Ordering::Relaxed);
                    if !faults.delay.is_zero() {
                        tokio::time::sleep(faults.delay).await;
                    }
                }
            }
            Direction::Down => {
                if let Some(limit) = faults.bandwidth {
                    control.throttle(n, limit).await;
                }
                // Counted before the write: once written, the client may finish before we count.
                control
                    .shared
                    .bytes_down
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        if to.write_all(data).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

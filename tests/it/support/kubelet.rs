//! A stand-in kubelet, as the lab cannot run a real one: an HTTPS server on 127.0.0.1 that answers
//! `GET /stats/summary` with a stats/v1alpha1 `Summary` shaped as a kubelet writes it (trimmed to the node's
//! fields) and `GET /configz` with its running configuration as the kubelet serves it
//! (`{"kubeletconfig": KubeletConfiguration}`, trimmed), so the API server's node proxy
//! (`/api/v1/nodes/NAME/proxy/stats/summary`, `.../configz`) reaches it. A Node
//! points at it with `status.addresses` and `status.daemonEndpoints.kubeletEndpoint.Port`
//! ([`super::cluster::Writer::kubelet`]). The API server does not verify a kubelet's serving certificate
//! unless told to, so a self-signed one (openssl) does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::Result;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::pki::self_signed;

/// The image filesystem the stand-in reports, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct ImageFs {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
}

pub struct FakeKubelet {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the stand-in's `/configz` says (the rest of a kubelet's configuration is left at its defaults).
#[derive(Clone, Copy, Debug)]
pub struct KubeletConfig {
    pub node_status_max_images: i64,
    pub image_gc_high_threshold_percent: u8,
    pub image_gc_low_threshold_percent: u8,
}

impl Default for KubeletConfig {
    /// The kubelet's defaults.
    fn default() -> Self {
        KubeletConfig {
            node_status_max_images: 50,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
        }
    }
}

impl FakeKubelet {
    /// Serves node `node`'s summary with the image filesystem `image_fs` says at each request, and
    /// `config` at `/configz`; its key and certificate go in `dir`.
    pub fn configured(
        dir: &Path,
        node: &str,
        image_fs: impl Fn() -> ImageFs + Send + 'static,
        config: KubeletConfig,
    ) -> Result<FakeKubelet> {
        std::fs::create_dir_all(dir)?;
        let (key, cert) = (dir.join("kubelet.key"), dir.join("kubelet.crt"));
        self_signed(&key, &cert, "/CN=127.0.0.1")?;
        let certs = CertificateDer::pem_file_iter(&cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(&key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let tls = Arc::new(tls);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let node = node.to_owned();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok(stream) = stream {
                    // One bad client (a probe, a reset) must not stop the server.
                    let _ = answer(&tls, stream, |path| match path {
                        "/stats/summary" => Some(summary(&node, image_fs())),
                        "/configz" => Some(configz(&config)),
                        _ => None,
                    });
                }
            }
        });
        Ok(FakeKubelet {
            port,
            stop,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The kubelet's `/stats/summary` for `node`: the fields a kubelet writes for the node, pods left empty.
fn summary(node: &str, fs: ImageFs) -> String {
    serde_json::json!({
        "node": {
            "nodeName": node,
            "startTime": "2026-11-21T08:00:00Z",
            "fs": {"time": "2026-11-21T10:00:00Z", "availableBytes": fs.available,
                   "capacityBytes": fs.capacity, "usedBytes": fs.used},
            "runtime": {"imageFs": {"time": "2026-11-21T10:00:00Z", "availableBytes": fs.available,
                                    "capacityBytes": fs.capacity, "usedBytes": fs.used,
                                    "inodesFree": 1_000_000, "inodes": 2_000_000, "inodesUsed": 1_000_000}},
        },
        "pods": [],
    })
    .to_string()
}

/// The kubelet's `/configz`: its running configuration under `kubeletconfig`, as the kubelet serves it
/// (trimmed to a few fields besides those pinboard reads).
fn configz(config: &KubeletConfig) -> String {
    serde_json::json!({"kubeletconfig": {
        "enableServer": true,
        "syncFrequency": "1m0s",
        "imageMinimumGCAge": "2m0s",
        "imageGCHighThresholdPercent": config.image_gc_high_threshold_percent,
        "imageGCLowThresholdPercent": config.image_gc_low_threshold_percent,
        "nodeStatusMaxImages": config.node_status_max_images,
        "maxPods": 250,
    }})
    .to_string()
}

/// Reads one request over TLS and answers `GET path` with `body(path)`, or 404 when that is None.
fn answer(
    tls: &Arc<rustls::ServerConfig>,
    tcp: TcpStream,
    body: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let connection = rustls::ServerConnection::new(tls.clone())?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let path = line
        .strip_prefix("GET ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("");
    let response = match body(path) {
        Some(body) => format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        None => {
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
        }
    };
    tls.write_all(response.as_bytes())?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.flush()?;
    let _ = tls.sock.shutdown(Shutdown::Write);
    Ok(())
}

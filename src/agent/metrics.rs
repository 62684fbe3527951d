//! The agent's `/metrics` (`--metrics-port`), in Prometheus' text format: per set its images by state, its
//! phase, bytes its runtime fetched, its pulls' retries, stalls and durations, losses put back and when it
//! was last found whole; the node's image filesystem and the floor the agent pulls by; its report writes
//! and heartbeat; and, on the cache's holder and each relay, what they moved. Every series has the label
//! `node` and at most `set`, `state`, `phase`, `found`, `object` or `result` besides: never one per image,
//! so 5,000 nodes stay within what a Prometheus takes. The page is made once a second by the shell
//! ([`page`]) and served as it was last made ([`serve`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::state::AgentState;
use crate::backend::http_server::{Server, full_body};
use crate::model::pinboard_api::{CacheReport, Found, ImagePhase, NodeSetPhase, PeerReport};
use crate::model::prometheus::{Exposition, Kind};

/// What the shell counts of its own I/O.
#[derive(Clone, Debug, Default)]
pub struct IoStats {
    /// Report writes by object (`report`, `images`) and whether they succeeded.
    pub writes: BTreeMap<(&'static str, bool), u64>,
    /// Heartbeat renewals, by whether they succeeded, and when one last did.
    pub renewals: BTreeMap<bool, u64>,
    pub renewed: Option<SystemTime>,
}

impl IoStats {
    pub fn wrote(&mut self, object: &'static str, ok: bool) {
        *self.writes.entry((object, ok)).or_default() += 1;
    }

    pub fn renewal(&mut self, ok: bool) {
        *self.renewals.entry(ok).or_default() += 1;
        if ok {
            self.renewed = Some(SystemTime::now());
        }
    }
}

/// What the metrics page shows besides the agent's state.
pub struct Shown<'a> {
    pub node: &'a str,
    pub io: &'a IoStats,
    /// The floor the agent pulls by (`--min-free`).
    pub min_free_bytes: u64,
    /// The in-cluster cache's figures, while this agent serves it.
    pub cache: Option<&'a CacheReport>,
    /// The node's relay: requests it holds now, and pulls it sent to the source.
    pub relay: Option<(u64, u64)>,
    /// What the node took from and served to other nodes (`--peer-port`).
    pub peers: Option<&'a PeerReport>,
}

const IMAGE_STATES: [(ImagePhase, &str); 6] = [
    (ImagePhase::Queued, "queued"),
    (ImagePhase::Pulling, "pulling"),
    (ImagePhase::Pulled, "pulled"),
    (ImagePhase::Pinned, "pinned"),
    (ImagePhase::Failed, "failed"),
    (ImagePhase::Lost, "lost"),
];

const PHASES: [(NodeSetPhase, &str); 5] = [
    (NodeSetPhase::Queued, "queued"),
    (NodeSetPhase::Pulling, "pulling"),
    (NodeSetPhase::Pinned, "pinned"),
    (NodeSetPhase::Failed, "failed"),
    (NodeSetPhase::Restoring, "restoring"),
];

/// The metrics page of `state` and `shown` at `now`.
pub fn page(state: &AgentState, shown: &Shown, now: Instant) -> String {
    let node = shown.node;
    let at = |then: Instant| {
        let wall = SystemTime::now() - now.saturating_duration_since(then);
        unix_seconds(wall)
    };
    let mut page = Exposition::default();
    page.family(
        "pinboard_agent_info",
        Kind::Gauge,
        "The agent on the node, with its version.",
    );
    page.sample(
        "pinboard_agent_info",
        &[("node", node), ("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    page.family(
        "pinboard_set_images",
        Kind::Gauge,
        "Images of a set on the node, by state.",
    );
    for report in state.reports() {
        for (phase, word) in IMAGE_STATES {
            let count = report.images.iter().filter(|i| i.state == phase).count();
            let labels = [
                ("node", node),
                ("set", report.name.as_str()),
                ("state", word),
            ];
            page.sample("pinboard_set_images", &labels, count as f64);
        }
    }
    page.family(
        "pinboard_set_phase",
        Kind::Gauge,
        "1 for the phase a set is in on the node, 0 for the others.",
    );
    for report in state.reports() {
        for (phase, word) in PHASES {
            let labels = [
                ("node", node),
                ("set", report.name.as_str()),
                ("phase", word),
            ];
            let value = f64::from(u8::from(report.state == phase));
            page.sample("pinboard_set_phase", &labels, value);
        }
    }
    page.family(
        "pinboard_set_pinned",
        Kind::Gauge,
        "1 while the set is pinned on the node, 0 in any other phase: one series whatever the phase does.",
    );
    for report in state.reports() {
        let labels = [("node", node), ("set", report.name.as_str())];
        let pinned = f64::from(u8::from(report.state == NodeSetPhase::Pinned));
        page.sample("pinboard_set_pinned", &labels, pinned);
    }
    let tallies = state.tallies();
    page.family(
        "pinboard_set_last_verified_timestamp_seconds",
        Kind::Gauge,
        "When the runtime last said every image of the set is there and pinned (Unix seconds).",
    );
    for (set, tally) in tallies {
        if let Some(verified) = tally.verified {
            let labels = [("node", node), ("set", set.as_str())];
            page.sample(
                "pinboard_set_last_verified_timestamp_seconds",
                &labels,
                at(verified),
            );
        }
    }
    let per_set = |page: &mut Exposition,
                   name: &str,
                   help: &str,
                   value: &dyn Fn(&super::tally::SetTally) -> u64| {
        page.family(name, Kind::Counter, help);
        for (set, tally) in tallies {
            page.sample(
                name,
                &[("node", node), ("set", set.as_str())],
                value(tally) as f64,
            );
        }
    };
    per_set(
        &mut page,
        "pinboard_pulled_bytes_total",
        "Bytes the node's runtime fetched for a set, counted as its pulls report them.",
        &|t| t.pulled_bytes,
    );
    per_set(
        &mut page,
        "pinboard_pull_retries_total",
        "Pull attempts of a set's images that failed and were tried again.",
        &|t| t.retries,
    );
    per_set(
        &mut page,
        "pinboard_pull_stalls_total",
        "Pulls of a set's images cancelled for making no progress (--pull-progress-timeout).",
        &|t| t.stalls,
    );
    per_set(
        &mut page,
        "pinboard_restores_total",
        "Losses of a set put back: one per time its images or pins were found lost, however many.",
        &|t| t.restores,
    );
    page.family(
        "pinboard_restored_images_total",
        Kind::Counter,
        "Images of a set found lost after they were pinned and put back, by what was found.",
    );
    for (set, tally) in tallies {
        for found in Found::ALL {
            let count = tally.restored_images.get(&found).copied().unwrap_or(0);
            let labels = [
                ("node", node),
                ("set", set.as_str()),
                ("found", found.label()),
            ];
            page.sample("pinboard_restored_images_total", &labels, count as f64);
        }
    }
    page.family(
        "pinboard_pull_duration_seconds",
        Kind::Histogram,
        "How long pulls of a set's images took, retries included.",
    );
    for (set, tally) in tallies {
        let labels = [("node", node), ("set", set.as_str())];
        page.histogram(
            "pinboard_pull_duration_seconds",
            &labels,
            &tally.pull_seconds,
        );
    }
    let facts = state.facts();
    if let Some(fs) = &facts.image_filesystem {
        page.family(
            "pinboard_image_filesystem_available_bytes",
            Kind::Gauge,
            "Free bytes on the node's image filesystem.",
        );
        page.sample(
            "pinboard_image_filesystem_available_bytes",
            &[("node", node)],
            fs.available_bytes as f64,
        );
        page.family(
            "pinboard_image_filesystem_capacity_bytes",
            Kind::Gauge,
            "Size of the node's image filesystem.",
        );
        page.sample(
            "pinboard_image_filesystem_capacity_bytes",
            &[("node", node)],
            fs.capacity_bytes as f64,
        );
    }
    page.family(
        "pinboard_min_free_bytes",
        Kind::Gauge,
        "The free space the agent leaves on the image filesystem (--min-free): it pulls nothing below it.",
    );
    page.sample(
        "pinboard_min_free_bytes",
        &[("node", node)],
        shown.min_free_bytes as f64,
    );
    page.family(
        "pinboard_report_writes_total",
        Kind::Counter,
        "Writes of the node's report (report) and its image lists (images), by result.",
    );
    for object in ["report", "images"] {
        for (ok, result) in [(true, "ok"), (false, "error")] {
            let count = shown.io.writes.get(&(object, ok)).copied().unwrap_or(0);
            let labels = [("node", node), ("object", object), ("result", result)];
            page.sample("pinboard_report_writes_total", &labels, count as f64);
        }
    }
    page.family(
        "pinboard_heartbeat_renewals_total",
        Kind::Counter,
        "Renewals of the agent's heartbeat Lease, by result.",
    );
    for (ok, result) in [(true, "ok"), (false, "error")] {
        let count = shown.io.renewals.get(&ok).copied().unwrap_or(0);
        let labels = [("node", node), ("result", result)];
        page.sample("pinboard_heartbeat_renewals_total", &labels, count as f64);
    }
    if let Some(renewed) = shown.io.renewed {
        page.family(
            "pinboard_heartbeat_last_success_timestamp_seconds",
            Kind::Gauge,
            "When the agent last renewed its heartbeat Lease (Unix seconds).",
        );
        page.sample(
            "pinboard_heartbeat_last_success_timestamp_seconds",
            &[("node", node)],
            unix_seconds(renewed),
        );
    }
    cache_and_relay(&mut page, shown);
    page.finish()
}

/// The in-cluster cache's figures on its holder, and the node's relay's.
fn cache_and_relay(page: &mut Exposition, shown: &Shown) {
    let node = [("node", shown.node)];
    page.family(
        "pinboard_cache_holder",
        Kind::Gauge,
        "1 while this node's agent serves the in-cluster cache.",
    );
    page.sample(
        "pinboard_cache_holder",
        &node,
        f64::from(u8::from(shown.cache.is_some())),
    );
    if let Some(cache) = shown.cache {
        let counters: [(&str, &str, u64); 4] = [
            (
                "pinboard_cache_registry_bytes_total",
                "Bytes the in-cluster cache took from the registries since this agent started serving it.",
                cache.link_bytes,
            ),
            (
                "pinboard_cache_served_bytes_total",
                "Bytes the in-cluster cache served to the nodes.",
                cache.served_bytes,
            ),
            (
                "pinboard_cache_requests_total",
                "Requests the in-cluster cache answered.",
                cache.requests,
            ),
            (
                "pinboard_cache_refused_requests_total",
                "Requests the in-cluster cache refused: without its token, or for a digest no fan-out set names.",
                cache.refused,
            ),
        ];
        node_counters(page, &node, &counters);
    }
    if let Some(cache) = shown.cache {
        page.family(
            "pinboard_cache_dropped_peers",
            Kind::Gauge,
            "Nodes the cache's tracker dropped as parents for serving a corrupt piece (named in its report).",
        );
        page.sample(
            "pinboard_cache_dropped_peers",
            &node,
            cache.dropped_peers.len() as f64,
        );
    }
    if let Some(peers) = shown.peers {
        let counters = [
            (
                "pinboard_peer_served_bytes_total",
                "Verified bytes this node served to other nodes.",
                peers.served_bytes,
            ),
            (
                "pinboard_peer_refused_pieces_total",
                "Pieces this node refused because their hash was not the holder's.",
                peers.refused_pieces,
            ),
        ];
        node_counters(page, &node, &counters);
        let taken = "pinboard_peer_taken_bytes_total";
        page.family(
            taken,
            Kind::Counter,
            "Verified bytes this node took, by where from: other nodes, or the cache's holder.",
        );
        for (from, bytes) in [
            ("peers", peers.from_peers_bytes),
            ("holder", peers.from_holder_bytes),
        ] {
            page.sample(taken, &[("node", shown.node), ("from", from)], bytes as f64);
        }
    }
    if let Some((holding, sent)) = shown.relay {
        page.family(
            "pinboard_relay_held_requests",
            Kind::Gauge,
            "The runtime's requests the node's relay holds while the in-cluster cache does not answer.",
        );
        page.sample("pinboard_relay_held_requests", &node, holding as f64);
        page.family(
            "pinboard_relay_sent_to_source_total",
            Kind::Counter,
            "Pulls the node's relay sent to the source because the in-cluster cache stayed away.",
        );
        page.sample("pinboard_relay_sent_to_source_total", &node, sent as f64);
    }
}

/// Counters of one node, each `(name, help, value)`, labelled `node`.
fn node_counters(page: &mut Exposition, node: &[(&str, &str)], counters: &[(&str, &str, u64)]) {
    for &(name, help, value) in counters {
        page.family(name, Kind::Counter, help);
        page.sample(name, node, value as f64);
    }
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Serves `page` (as the shell last made it) at `/metrics` on `listen`.
pub async fn serve(listen: SocketAddr, page: Arc<Mutex<String>>) -> std::io::Result<Server> {
    Server::start(
        listen,
        move |request: http::Request<hyper::body::Incoming>| {
            let page = Arc::clone(&page);
            async move {
                if request.uri().path() != "/metrics" {
                    return Response::builder()
                        .status(StatusCode::NOT_FOUND)
                        .body(full_body::<Infallible>(Bytes::from_static(
                            b"metrics are at /metrics\n",
                        )))
                        .expect("a valid response");
                }
                let text = page.lock().expect("metrics page").clone();
                Response::builder()
                    .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                    .body(full_body(Bytes::from(text)))
                    .expect("a valid response")
            }
        },
    )
    .await
}

//! The outside world: CRI and containerd sockets, registries, their credentials and certificates, the blob
//! cache and the registry endpoint over it, and the files fan-out writes on nodes to point them at that
//! endpoint.

pub mod agent_pods;
pub mod blobs;
pub mod certs;
pub mod credentials;
pub mod cri;
pub mod crio_counter;
pub mod distribution;
pub mod events;
pub mod files;
pub mod held;
pub mod http_server;
pub mod image_events;
pub mod kube;
pub mod kube_watch;
pub mod kubelet;
pub mod lazy;
pub mod node;
pub mod openshift;
pub mod payload_layer;
pub mod pinboard_api;
pub mod pins;
pub mod progress;
pub mod proto;
pub mod readiness;
pub mod registries_conf;
pub mod registry;
pub mod remote_layers;
pub mod stargz;
pub mod target;
pub mod tls_probe;
pub mod toml_doc;
pub mod whole;
pub mod wiring;

/// At most `max` characters of `text`, with `...` when cut: remote error bodies can be long.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

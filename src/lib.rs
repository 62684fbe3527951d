//! pinboard: pin and pre-load container images on cluster nodes, and watch those rollouts.
//!
//! - [`model`]: pure domain logic, no I/O: image references and PinnedImageSet rules, image facts,
//!   disk-impact planning.
//! - [`backend`]: the outside world: CRI and containerd sockets, registries, their credentials and
//!   certificates.
//! - [`survey`]: nodes and registry asked at once, every node planned: the path behind every figure.
//! - [`engine`]: the rollout engine: bounded, retried pulls per node, then pins; reports rollout events.
//! - [`fanout`]: a rollout, optionally fanned out: the blob cache's endpoint serving the nodes, each node's
//!   runtime pointed at it for the rollout and put back afterwards.
//! - [`targets`]: direct-mode nodes from `--cri`, `--nodes FILE` or crictl's default endpoint.
//! - [`release`]: an OpenShift release payload read (without downloading it) and made PinnedImageSets.
//! - [`options`]: the argument list every command and the TUI share, turned into checked sets, targets and
//!   a registry client.
//! - [`ui`]: how statuses look (glyph, word, theme color); the terminal UI.
//! - [`cluster`]: an OpenShift cluster's machine-config objects: discovery, watches, PinnedImageSet
//!   apply and delete, node space from the kubelet (cluster mode).
//! - [`cli`]: the command line: the TUI by default, headless commands.

pub mod backend;
pub mod cli;
pub mod cluster;
pub mod engine;
pub mod error;
pub mod fanout;
pub mod fleet;
pub mod model;
pub mod options;
pub mod release;
pub mod survey;
pub mod targets;
pub mod ui;

/// Installs rustls' ring provider as the process default. kube and the registry client (reqwest) each
/// enable rustls; without one explicit provider, the first TLS connection panics. Call first thing in
/// `main` and in tests.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

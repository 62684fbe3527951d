//! pinboard: pin and pre-load container images on cluster nodes, and watch those rollouts.
//!
//! Arrows point down only: [`cli`] → [`ui`] / [`agent`] → [`fleet`] → [`engine`] / [`survey`] /
//! [`fanout`] → [`backend`] → [`model`]. [`options`] turns the command line into a fleet; [`error`] is the
//! one error every command ends with.
//!
//! - [`model`]: pure domain logic, no I/O: image references and PinnedImageSet rules, image facts,
//!   disk-impact planning, readiness, rollouts, OpenShift's machine-config objects.
//! - [`backend`]: the outside world: CRI and containerd sockets, registries with their credentials and
//!   certificates, node files, OpenShift's API.
//! - [`survey`]: nodes and registry asked at once, every node planned: the path behind every figure.
//! - [`engine`]: the rollout engine: bounded, retried pulls per node, then pins; reports rollout events.
//! - [`fanout`]: a rollout, optionally fanned out: the blob cache's endpoint serving the nodes, each node's
//!   runtime pointed at it for the rollout and put back afterwards.
//! - [`targets`]: direct nodes from `--cri`, `--nodes FILE` or crictl's default endpoint.
//! - [`agent`]: `pinboard agent`, one per node of a Kubernetes cluster: carries out the sets that select its
//!   node with the direct fleet, reports in its node's `PinboardNode`, and may hold the in-cluster cache.
//! - [`fleet`]: the nodes pinboard works on, however it reaches them, behind one set of operations.
//! - [`options`]: the argument list every command and the TUI share, and the fleet it names.
//! - [`ui`]: how statuses look (glyph, word, theme color); the terminal UI.
//! - [`cli`]: the command line: the TUI by default, headless commands.
//!
//! # Glossary
//!
//! - **node**: a machine whose container runtime (containerd or CRI-O) holds images.
//! - **fleet**: the nodes a session works on and the way they are reached: direct (pinboard talks to each
//!   node's CRI socket itself), a cluster's machine-config daemons (OpenShift), or pinboard's agents (any
//!   Kubernetes cluster).
//! - **set**: a named list of images by digest to pre-load and pin (a PinnedImageSet); its **entries** are
//!   the references.
//! - **pin**: what keeps an image from the kubelet's garbage collection: CRI-O's `pinned_images` or
//!   containerd's `io.cri-containerd.pinned` label.
//! - **holder**: who holds a pin on a node: a set, an administrator's own entry, or no one known
//!   (unowned). A pin goes with its last holder.
//! - **survey** and **plan**: asking the nodes and registries, then what pre-loading costs each node.
//! - **rollout**: pulling a set's images onto nodes, then pinning them.
//! - **readiness**: whether every image of the sets is present and pinned on every node (`check`).
//! - **mirror**: a registry that answers for another: the rules of registries.conf and
//!   ImageDigestMirrorSets, and the registry `pinboard mirror` serves.
//! - **endpoint**: the read-only registry pinboard's blob cache serves, for fan-out and `pinboard mirror`;
//!   it serves only the **served digests** of the sets it is given.
//! - **fan-out**: each blob fetched over the registry link once, into the blob cache, and served to every
//!   node from there.
//! - **wiring**: pointing a node's runtime at the endpoint for a rollout (containerd hosts.toml, a CRI-O
//!   registries.conf.d drop-in), and putting its files back afterwards.
//! - **lazy pulling**: a runtime that fetches an image's layers when they are first read (stargz store).
//!   An image whose layers are still in the registry is **lazily present**: not pre-loaded.
//! - **agent**: pinboard on a node of a Kubernetes cluster (a DaemonSet's pod); it pulls and pins the
//!   **PinSets** (pinboard's own set object) that select its node and reports in the node's
//!   **PinboardNode**.
//! - **cache** (in-cluster): the endpoint one agent serves to every node for the fan-out sets, a role held
//!   through a Lease and taken over by another agent when its holder goes.
//! - **relay**: each agent's loopback listener its node's runtime pulls through: it passes pulls to the
//!   cache with the cache's token, holds them while the cache moves, and resumes a broken blob.

pub mod agent;
pub mod backend;
pub mod cli;
pub mod engine;
pub mod error;
pub mod fanout;
pub mod fleet;
pub mod model;
pub mod options;
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

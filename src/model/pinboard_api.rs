//! pinboard's own API (`pinboard.dev/v1alpha1`), for any Kubernetes cluster: what the agents on the nodes
//! and the commands that drive them write and read. Pure: the types, what they mean, and the judgement of
//! a node's report; the API server is reached by [`crate::backend::pinboard_api`].
//!
//! - [`PinSet`] (cluster-scoped): the images to pre-load and pin (`spec.pinnedImages: [{name}]`, as a
//!   PinnedImageSet), on the nodes its `spec.nodeSelector` selects (none: every node with an agent), pulled
//!   with the credentials of `spec.pullSecrets` (Secrets in the agents' namespace) and the node's own.
//! - [`PinboardNode`] (cluster-scoped, named after its Node, owned by it): what the node's agent reports,
//!   small enough for every screen to watch on thousands of nodes — its runtime, image filesystem, how
//!   many images and pins, lazy pulling, kubelet thresholds — and, per set that selects the node, its
//!   phase, bytes and conditions. Its `spec.lazyPulling` is what an administrator asks of the node's lazy
//!   pulling.
//! - [`PinboardNodeImages`] (the same name and owner): the report's detail — every image the runtime
//!   holds, its pin and holders, and per set where each image is — read by `check`, the Config and
//!   Rollout screens; not by the Nodes screen, nor by a plan but for a node whose agent publishes no
//!   `PinboardNodeBlobs` ([`super::node_blobs`]: what its runtime holds, which plans read instead).
//! - The agent's heartbeat is a `coordination.k8s.io` Lease per node (`pinboard-agent-NODE`), renewed
//!   often and written small, as the kubelet's own heartbeat is: the report is written only when something
//!   changes.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use serde::{Deserialize, Serialize};

use super::labels::Selector;
use super::lazy::{LazyPulling, RemoteLayers};
use super::machine_config::KubeletSettings;
use super::plan::{AgentLimits, NodeFacts};
use super::rollout::FetchedSource;
use super::set::{ImageSet, from_flags};

pub use super::pinboard_kinds::{
    API_VERSION, GROUP, IMAGES_KIND, IMAGES_PLURAL, NODE_KIND, NODE_PLURAL, SET_KIND, SET_PLURAL,
    VERSION,
};
/// The namespace the manifests install the agents in.
pub const DEFAULT_NAMESPACE: &str = "pinboard-system";
/// The field manager of what the agents write.
pub const AGENT_MANAGER: &str = "pinboard-agent";
/// An agent's Lease is valid for this many of its renewal periods (as the kubelet's node Lease is): one
/// not renewed for that long is stale, and its node not ready.
pub const HEARTBEAT_PERIODS_VALID: u32 = 4;
/// How long a default agent's heartbeat (renewed every 30 s) stands, and how long the aggregator's
/// Lease lasts.
pub const STALE_AFTER: Duration = Duration::from_secs(30 * HEARTBEAT_PERIODS_VALID as u64);
/// The agent's Lease of a node.
pub fn lease_name(node: &str) -> String {
    format!("pinboard-agent-{node}")
}

/// The Lease whose holder is the in-cluster cache (agents started with `--cache-port`).
pub const CACHE_LEASE: &str = "pinboard-cache";
/// The cache's Lease annotation: where it serves, `http://NODE-IP:PORT`.
pub const CACHE_ADDRESS_ANNOTATION: &str = "pinboard.dev/cache-address";
/// The cache's Lease annotation: the fan-out sets it serves now, `NAME=GENERATION` comma-separated, so that
/// a node pulls through it only once it serves the set's digests.
pub const CACHE_SETS_ANNOTATION: &str = "pinboard.dev/cache-sets";
/// The Secret in the agents' namespace holding the cache's token (key [`CACHE_TOKEN_KEY`]).
pub const CACHE_TOKEN_SECRET: &str = "pinboard-cache-token";
pub const CACHE_TOKEN_KEY: &str = "token";

/// A command's request that the agents of a set's nodes ask their runtimes now (`pinboard check`): an
/// annotation of the PinSet, a token each agent answers in its report ([`CheckAnswer`]).
pub const CHECK_REQUEST_ANNOTATION: &str = "pinboard.dev/check-request";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";

/// A set of images to pre-load and pin on the nodes it selects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinSet {
    pub metadata: ObjectMeta,
    pub spec: PinSetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PinSetStatus>,
}

/// What pinboard reads of an object's metadata.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    /// Events name the object by it, as `kubectl describe` finds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinSetSpec {
    pub pinned_images: Vec<PinnedImage>,
    /// The nodes the set lands on; none: every node with an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Secrets (`kubernetes.io/dockerconfigjson`) in the agents' namespace whose credentials pull the images,
    /// before the node's own (the kubelet's `config.json`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<SecretRef>,
    /// Pull through the in-cluster cache, so each blob crosses the registry link once for all nodes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fan_out: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedImage {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRef {
    pub name: String,
}

/// What the agents say of a set over every node it lands on (written by the agent that holds the
/// aggregator's Lease).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinSetStatus {
    #[serde(default)]
    pub observed_generation: i64,
    /// Nodes the set lands on, and how many are ready, pulling and failed.
    #[serde(default)]
    pub nodes: i64,
    #[serde(default)]
    pub ready: i64,
    #[serde(default)]
    pub pulling: i64,
    #[serde(default)]
    pub failed: i64,
    /// Nodes putting back an image or pin of the set that was lost after it was pinned.
    #[serde(default)]
    pub restoring: i64,
}

impl PinSet {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or(0)
    }

    pub fn images(&self) -> impl Iterator<Item = &str> {
        self.spec.pinned_images.iter().map(|i| i.name.as_str())
    }

    /// The check a command asked of the set's nodes last ([`CHECK_REQUEST_ANNOTATION`]).
    pub fn check_request(&self) -> Option<&str> {
        self.metadata
            .annotations
            .get(CHECK_REQUEST_ANNOTATION)
            .map(String::as_str)
    }

    /// Whether the set lands on a node labelled `labels`: no selector selects every node.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        let every = LabelSelector::default();
        super::labels::selector_matches(
            Some(self.spec.node_selector.as_ref().unwrap_or(&every)),
            labels,
        )
    }
}

/// One node as its agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinboardNode {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeReport>,
}

/// What an administrator asks of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Lazy pulling on or off; none: as the node is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling: Option<bool>,
}

/// What a node's agent says of it. Its image lists (`images`, each set's `images`) are the detail, written
/// to the node's [`PinboardNodeImages`] and filled in from it by readers that watch both
/// ([`NodeReport::with_images`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// pinboard's version on the node.
    #[serde(default)]
    pub agent_version: String,
    /// `containerd`, `cri-o`, with its version; none when the runtime did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeReport>,
    /// Why the runtime could not be asked, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_filesystem: Option<FilesystemReport>,
    /// Every image the runtime holds (detail: in [`PinboardNodeImages`]).
    #[serde(skip)]
    pub images: Vec<ImageReport>,
    /// How many images the runtime holds, and how many of them are pinned.
    #[serde(default)]
    pub image_count: usize,
    #[serde(default)]
    pub pinned_count: usize,
    /// How the node pins: `containerd-label` or `crio-drop-in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_method: Option<String>,
    /// Lazy pulling as the agent judges it on its node, as `pinboard lazy status` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling: Option<LazyPulling>,
    /// Why lazy pulling could not be read, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling_error: Option<String>,
    /// The administrator's wish (`spec.lazyPulling`) this report answers: set once the agent has carried
    /// it out or failed to, so that an error read before the wish is not taken for its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling_wish: Option<bool>,
    /// Where the runtime reads its registry hosts (containerd's `config_path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_config_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletThresholds>,
    /// What the agent pulls by: its own floor, and its image GC threshold when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AgentLimits>,
    /// Each set that selects the node.
    #[serde(default)]
    pub sets: Vec<SetReport>,
    /// The in-cluster cache's figures, when this node's agent holds the cache's role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheReport>,
    /// What the node's agent took from and served to other nodes, once it took part in a swarm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<PeerReport>,
}

/// A node's part in its fan-out sets' swarms (`--peer-port`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerReport {
    /// `http://NODE-IP:PORT`: where it serves its pieces to other nodes.
    pub address: String,
    /// Verified bytes it served to other nodes.
    pub served_bytes: u64,
    /// Verified bytes it took from other nodes, and from the cache's holder.
    pub from_peers_bytes: u64,
    pub from_holder_bytes: u64,
    /// Pieces it refused because their hash was not the holder's.
    pub refused_pieces: u64,
    /// Requests refused: without the cache's token, or for a blob it does not take.
    pub refused: u64,
}

/// A node the tracker dropped as a parent for serving a corrupt piece.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedPeer {
    pub node: String,
    pub digest: String,
    pub reason: String,
}

/// The in-cluster cache as its holder reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheReport {
    /// `http://NODE-IP:PORT`
    pub address: String,
    /// Bytes it took from the source registries, over its node's agent's restarts (kept in its cache
    /// directory).
    pub link_bytes: u64,
    /// Bytes it served to the nodes.
    pub served_bytes: u64,
    pub requests: u64,
    /// Requests refused: without the token, or for a digest no fan-out set names.
    pub refused: u64,
    /// `--link-rate`: the budget it keeps on the registry link, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_rate: Option<u64>,
    /// `--serve-rate`: the most it sends to the nodes, all together, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_rate: Option<u64>,
    /// Nodes that asked its tracker for parents (they serve each other), and blobs they swarm over.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swarm_nodes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swarm_blobs: u64,
    /// Peers dropped for serving corrupt pieces, named with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_peers: Vec<DroppedPeer>,
    /// The checks asked of the fan-out sets ([`CHECK_REQUEST_ANNOTATION`]) when these figures were read: a
    /// command that asked prints the figures once they answer its question, so they cover its rollout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeReport {
    pub name: String,
    pub version: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemReport {
    pub mountpoint: String,
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    /// `availableBytes` as a person reads it (`44.83 MiB`): what `kubectl get pinboardnodes` shows.
    #[serde(default)]
    pub available: String,
}

/// One image the runtime holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReport {
    /// Its repo digests and tags.
    pub names: Vec<String>,
    pub size_bytes: u64,
    #[serde(default)]
    pub pinned: bool,
    /// Who holds its pin: set names, `admin`, `unowned`; empty when it is not pinned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<String>,
    /// Present only lazily: its layers still in the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy: Option<RemoteLayers>,
}

/// The node's kubelet image GC thresholds, as the agent read them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletThresholds {
    pub image_gc_high_threshold_percent: u8,
    pub image_gc_low_threshold_percent: u8,
    /// Where they come from: the kubelet's configuration, or its defaults.
    pub source: String,
}

/// One set on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetReport {
    pub name: String,
    /// The set's generation these images are of.
    pub observed_generation: i64,
    pub state: NodeSetPhase,
    /// Bytes fetched so far for the set, out of what its missing images need.
    #[serde(default)]
    pub done_bytes: u64,
    #[serde(default)]
    pub total_bytes: u64,
    /// Where each image is (detail: in [`PinboardNodeImages`]).
    #[serde(skip)]
    pub images: Vec<SetImageReport>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// A fan-out set: whether the node's pulls went through the in-cluster cache, or to the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<SetFanOut>,
    /// What the agent's last rollout of the set moved on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<SetOutcome>,
    /// Images or pins of the set that were lost on the node after it pinned them, and put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restores: Option<Restores>,
    /// The last check a command asked of the set, answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<CheckAnswer>,
}

/// A node's answer to a check ([`CHECK_REQUEST_ANNOTATION`]): the agent asked its runtime after it saw the
/// request, at `at`, and its report's phase and images are as of then.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckAnswer {
    pub request: String,
    pub at: Time,
}

/// What one rollout of a set did on its node, as `apply` prints it per node (summed over the sets on
/// agents).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetOutcome {
    pub images: usize,
    /// Images there before (whole, or only lazily: not pre-loaded), pulled by the rollout, and pinned at
    /// its end.
    pub present: usize,
    pub lazy: usize,
    pub pulled: usize,
    pub pinned: usize,
    /// What the node's runtime fetched, measured where it can be, and how it is known: `content-store` (the
    /// blobs containerd's store gained, by their sizes), `relay` (what the node's relay passed on from the
    /// in-cluster cache), `plan` (the plan's figure for the images pulled: the runtime reports no bytes),
    /// or null when the node was never started.
    pub fetched_bytes: u64,
    pub fetched_source: Option<FetchedSource>,
    /// What the plan said the node would fetch.
    #[serde(default)]
    pub planned_bytes: u64,
}

/// The losses an agent found of a set it had pinned, and what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restores {
    /// Losses put back since the agent started.
    pub count: u32,
    /// Losses found in the last hour: more than one means something on the node fights the pins.
    pub recent: u32,
    /// The last loss: when it was found, what was found, and of which images (the first few).
    pub last: LostImages,
}

/// Images of a set found lost on a node at one check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostImages {
    pub found_at: Option<Time>,
    /// How many images were lost, and the first few of them with what was found.
    pub count: usize,
    pub images: Vec<LostImage>,
}

/// One image of a set found lost on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostImage {
    pub name: String,
    pub found: Found,
}

/// What the runtime holds of a lost image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Found {
    /// The runtime no longer has it (image GC, `crictl rmi`, disk pressure).
    Absent,
    /// The runtime has it, but not pinned (its pin label or drop-in entry was removed).
    Unpinned,
    /// Only lazily: some of its layers are back in the registry only.
    Lazy,
}

impl Found {
    pub const ALL: [Found; 3] = [Found::Absent, Found::Unpinned, Found::Lazy];

    /// As the report and the metrics' labels name it.
    pub fn label(self) -> &'static str {
        match self {
            Found::Absent => "absent",
            Found::Unpinned => "unpinned",
            Found::Lazy => "lazy",
        }
    }

    /// How a reason says it.
    pub fn words(self) -> &'static str {
        match self {
            Found::Absent => "absent",
            Found::Unpinned => "present but not pinned",
            Found::Lazy => "present only lazily",
        }
    }
}

/// How a node pulled a fan-out set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetFanOut {
    /// The cache its runtime was pointed at first (`server` kept after it); none: it pulled from the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Why it pulled from the source, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_reason: Option<String>,
}

/// The detail of one node's report, as its agent writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinboardNodeImages {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeImages>,
}

/// Every image a node's runtime holds, and per set where each of its images is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeImages {
    #[serde(default)]
    pub images: Vec<ImageReport>,
    #[serde(default)]
    pub sets: Vec<SetImages>,
}

impl NodeImages {
    /// Whether the runtime holds the image `reference` names (the agent's list is complete).
    pub fn holds(&self, reference: &str) -> bool {
        self.images
            .iter()
            .any(|i| i.names.iter().any(|n| n == reference))
    }
}

/// One set's images on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetImages {
    pub name: String,
    pub observed_generation: i64,
    pub images: Vec<SetImageReport>,
}

/// Where a node is with a set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeSetPhase {
    /// The agent has not started on it.
    #[default]
    Queued,
    Pulling,
    /// Every image is there and pinned, as the runtime says where it can.
    Pinned,
    /// Some image failed, or the node has no room: the reason is in the Degraded condition.
    Failed,
    /// It was pinned, and then an image or pin was lost: the agent puts it back (the lost images are
    /// `lost`, each with what was found).
    Restoring,
}

/// One image of a set on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetImageReport {
    pub name: String,
    pub state: ImagePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub done_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_bytes: u64,
    /// What `pinned` rests on: `runtime` (its CRI `pinned`) or `record` (the node's pin record, where the
    /// runtime cannot report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImagePhase {
    #[default]
    Queued,
    Pulling,
    Pulled,
    Pinned,
    Failed,
    /// Pinned once, and found lost since: `reason` says what was found.
    Lost,
}

impl PinSet {
    /// The set as the commands and the agents work with it: its images, node selector, pull Secrets and
    /// fan-out.
    pub fn to_image_set(&self) -> ImageSet {
        let images: Vec<String> = self.images().map(str::to_owned).collect();
        let mut set = from_flags(self.name(), &images);
        set.labels = self.metadata.labels.clone();
        set.node_selector = self.spec.node_selector.clone().map(Selector);
        set.pull_secrets = self
            .spec
            .pull_secrets
            .iter()
            .map(|s| s.name.clone())
            .collect();
        set.fan_out = self.spec.fan_out;
        set
    }
}

/// The agent's "reported by the kubelet's configuration" source word; anything else is its defaults.
pub const KUBELET_CONFIG_SOURCE: &str = "kubelet-config";

impl NodeReport {
    /// The report's detail: what its [`PinboardNodeImages`] holds.
    pub fn image_detail(&self) -> NodeImages {
        NodeImages {
            images: self.images.clone(),
            sets: self
                .sets
                .iter()
                .map(|s| SetImages {
                    name: s.name.clone(),
                    observed_generation: s.observed_generation,
                    images: s.images.clone(),
                })
                .collect(),
        }
    }

    /// The report with its `detail` filled in: the node's images, and each set's images where the detail
    /// is of the same generation (written a moment apart, they may not be).
    pub fn with_images(&self, detail: &NodeImages) -> NodeReport {
        let mut report = self.clone();
        report.images = detail.images.clone();
        for set in &mut report.sets {
            set.images = detail
                .sets
                .iter()
                .find(|d| d.name == set.name && d.observed_generation == set.observed_generation)
                .map(|d| d.images.clone())
                .unwrap_or_default();
        }
        report
    }

    /// The sets holding some pin on the node, by its images' holders.
    pub fn holding_sets(&self) -> Vec<String> {
        let mut sets: Vec<String> = self
            .images
            .iter()
            .flat_map(|i| i.held_by.iter())
            .filter(|h| *h != "admin" && *h != "unowned")
            .cloned()
            .collect();
        sets.sort();
        sets.dedup();
        sets
    }

    /// Whether the runtime holds the image `reference` names (the report's list is complete).
    pub fn holds(&self, reference: &str) -> bool {
        self.images
            .iter()
            .any(|i| i.names.iter().any(|n| n == reference))
    }

    /// What the planner needs of node `name`: its runtime, its image filesystem's space and its kubelet's
    /// image GC thresholds, as its agent measured them.
    pub fn facts(&self, name: &str) -> NodeFacts {
        let fs = self.image_filesystem.as_ref();
        NodeFacts {
            name: name.to_owned(),
            runtime: self
                .runtime
                .as_ref()
                .map(|r| format!("{} {}", r.name, r.version)),
            capacity_bytes: fs.map(|f| f.capacity_bytes),
            used_bytes: fs.map(|f| f.used_bytes),
            available_bytes: fs.map(|f| f.available_bytes),
            space_unknown_reason: fs.is_none().then(|| {
                "its agent could not measure the image filesystem (is it mounted?)".to_owned()
            }),
            unreachable: self.runtime_error.clone(),
            kubelet: self.kubelet.as_ref().map(|k| KubeletSettings {
                // The agent's image list is complete: no kubelet list cap applies.
                node_status_max_images: -1,
                image_gc_high_threshold_percent: k.image_gc_high_threshold_percent,
                image_gc_low_threshold_percent: k.image_gc_low_threshold_percent,
                assumed: (k.source != KUBELET_CONFIG_SOURCE).then(|| k.source.clone()),
            }),
            agent_limits: self.limits,
            ..NodeFacts::default()
        }
    }
}

/// An agent's last heartbeat: when it renewed its Lease, and for how long that stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub renewed: SystemTime,
    pub valid_for: Duration,
}

impl Heartbeat {
    /// Whether it has lapsed at `now`.
    pub fn stale(&self, now: SystemTime) -> bool {
        now.duration_since(self.renewed).unwrap_or_default() > self.valid_for
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd refuses objects over 1.5 MiB (its default `--max-request-bytes`).
    const ETCD_LIMIT: usize = 1536 * 1024;

    #[test]
    fn a_node_with_500_images_and_3_sets_of_200_reports_in_a_small_fraction_of_etcds_limit() {
        let reference =
            |i: usize| format!("registry.example.com/some-team/component-{i:04}@sha256:{i:064x}");
        let images = (0..500)
            .map(|i| ImageReport {
                names: vec![
                    reference(i),
                    format!("registry.example.com/some-team/component-{i:04}:v4.19.{i}"),
                ],
                size_bytes: 123_456_789,
                pinned: i < 300,
                held_by: if i < 300 {
                    vec!["release-4-19".into(), "monitoring".into()]
                } else {
                    Vec::new()
                },
                lazy: None,
            })
            .collect();
        let sets = (0..3)
            .map(|s| SetReport {
                name: format!("set-{s}"),
                observed_generation: 7,
                state: NodeSetPhase::Pulling,
                done_bytes: 1 << 30,
                total_bytes: 1 << 34,
                images: (0..200)
                    .map(|i| SetImageReport {
                        name: reference(s * 100 + i),
                        state: ImagePhase::Pulling,
                        reason: Some("retrying: connection reset by peer".into()),
                        done_bytes: 12_345_678,
                        total_bytes: 123_456_789,
                        evidence: Some("runtime".into()),
                    })
                    .collect(),
                conditions: crate::model::node_report::failed_conditions("one image failed"),
                fan_out: None,
                outcome: None,
                restores: None,
                checked: None,
            })
            .collect();
        let metadata = ObjectMeta {
            name: "worker-0001".into(),
            ..ObjectMeta::default()
        };
        let report = NodeReport {
            images,
            image_count: 500,
            pinned_count: 300,
            sets,
            ..NodeReport::default()
        };
        let detail = PinboardNodeImages {
            metadata: metadata.clone(),
            status: Some(report.image_detail()),
        };
        let node = PinboardNode {
            metadata,
            spec: NodeSpec::default(),
            status: Some(report.clone()),
        };
        let (summary, detail) = (
            serde_json::to_vec(&node).unwrap(),
            serde_json::to_vec(&detail).unwrap(),
        );
        println!(
            "report of 500 images and 3 sets of 200: {} bytes of JSON, its detail {} bytes",
            summary.len(),
            detail.len()
        );
        assert!(detail.len() < ETCD_LIMIT / 4, "{} bytes", detail.len());
        // What every screen watches stays small: no image list in it.
        assert!(summary.len() < 4096, "{} bytes", summary.len());
        // Read back and filled in from its detail, it is the report the agent wrote.
        let read: PinboardNode = serde_json::from_slice(&summary).unwrap();
        let read_detail: PinboardNodeImages = serde_json::from_slice(&detail).unwrap();
        let whole = read
            .status
            .unwrap()
            .with_images(read_detail.status.as_ref().unwrap());
        assert_eq!(whole.images, report.images);
        let set_images =
            |r: &NodeReport| r.sets.iter().map(|s| s.images.clone()).collect::<Vec<_>>();
        assert_eq!(set_images(&whole), set_images(&report));
        assert_eq!((whole.image_count, whole.pinned_count), (500, 300));
    }

    #[test]
    fn a_detail_of_another_generation_leaves_that_sets_images_out() {
        let set = |generation| SetReport {
            name: "release".into(),
            observed_generation: generation,
            images: vec![SetImageReport {
                name: "r@sha256:1".into(),
                ..SetImageReport::default()
            }],
            ..SetReport::default()
        };
        let written = NodeReport {
            sets: vec![set(2)],
            ..NodeReport::default()
        };
        let older = NodeReport {
            sets: vec![set(1)],
            ..NodeReport::default()
        }
        .image_detail();
        assert!(written.with_images(&older).sets[0].images.is_empty());
        assert_eq!(written.with_images(&written.image_detail()), written);
    }
}

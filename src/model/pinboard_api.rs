//! pinboard's own API (`pinboard.dev/v1alpha1`), for any Kubernetes cluster: what the agents on the nodes
//! and the commands that drive them write and read. Pure: the types, what they mean, and the judgement of
//! a node's report; the API server is reached by [`crate::backend::pinboard_api`].
//!
//! - [`PinSet`] (cluster-scoped): the images to pre-load and pin (`spec.pinnedImages: [{name}]`, as a
//!   PinnedImageSet), on the nodes its `spec.nodeSelector` selects (none: every node with an agent), pulled
//!   with the credentials of `spec.pullSecrets` (Secrets in the agents' namespace) and the node's own.
//! - [`PinboardNode`] (cluster-scoped, named after its Node, owned by it): what the node's agent reports —
//!   its runtime, image filesystem, images, pins and their holders, lazy pulling, kubelet thresholds — and,
//!   per set that selects the node, where each image is, with conditions. Its `spec.lazyPulling` is what an
//!   administrator asks of the node's lazy pulling.
//! - The agent's heartbeat is a `coordination.k8s.io` Lease per node (`pinboard-agent-NODE`), renewed
//!   often and written small, as the kubelet's own heartbeat is: the report is written only when something
//!   changes.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "pinboard.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "pinboard.dev/v1alpha1";
pub const SET_KIND: &str = "PinSet";
pub const SET_PLURAL: &str = "pinsets";
pub const NODE_KIND: &str = "PinboardNode";
pub const NODE_PLURAL: &str = "pinboardnodes";
/// The namespace the manifests install the agents in.
pub const DEFAULT_NAMESPACE: &str = "pinboard-system";
/// The field manager of what the agents write.
pub const AGENT_MANAGER: &str = "pinboard-agent";
/// An agent whose Lease was not renewed for this long is stale: its node is not ready.
pub const STALE_AFTER: Duration = Duration::from_secs(120);
/// How often an agent renews its Lease.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(30);
/// The agent's Lease of a node.
pub fn lease_name(node: &str) -> String {
    format!("pinboard-agent-{node}")
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
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

/// What a node's agent says of it.
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
    /// Every image the runtime holds.
    #[serde(default)]
    pub images: Vec<ImageReport>,
    /// How the node pins: `containerd-label` or `crio-drop-in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling: Option<LazyReport>,
    /// Where the runtime reads its registry hosts (containerd's `config_path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_config_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletReport>,
    /// Each set that selects the node.
    #[serde(default)]
    pub sets: Vec<SetReport>,
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
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LazyReport {
    /// `on`, `off`, or why it is neither.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The node's kubelet image GC thresholds, as the agent read them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletReport {
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
    pub images: Vec<ImageState>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
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
}

/// One image of a set on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageState {
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
}

/// Whether an agent's heartbeat is older than [`STALE_AFTER`] at `now`; None: no heartbeat at all.
pub fn stale(renewed: Option<SystemTime>, now: SystemTime) -> Option<bool> {
    renewed.map(|at| now.duration_since(at).unwrap_or_default() > STALE_AFTER)
}

//! Disk-impact planning: what pre-loading a set of images costs each node, and whether it fits.
//!
//! This is the one function behind every figure `pinboard plan` prints and the TUI shows. It is pure: the
//! backends gather [`NodeFacts`] and [`ImageFacts`], and [`plan_node`] turns them into a [`NodePlan`].
//!
//! - `fetchBytes`: unique compressed bytes (layers and configs) the node's runtime will really fetch: not a
//!   blob it holds already, whichever image brought it (containerd's content store; CRI-O's layers, by
//!   uncompressed digest), nor one of an image of the sets already present; a blob shared by several
//!   missing images is counted once, for the first image in set order that needs it (so per-image figures
//!   add up to the node's). Where the runtime cannot say what it holds, `fetchBasis` is `upper-bound`. An
//!   image present only lazily ([`RemoteLayers`]) still needs its remote layers from the registry: they
//!   count here, and for the disk too on containerd, where pre-loading pulls it whole
//!   ([`super::whole`]); CRI-O's stays lazy.
//! - `estimatedDiskBytes`: for those same layers, the uncompressed size where an annotation gives it, else
//!   twice the compressed size (the OpenShift daemon's rule); configs count as stored. `estimateBasis` says
//!   which rule was used.
//! - `verdict`: against the space left afterwards: `no-space` below the free-space floor (`--min-free`, the
//!   daemon's 16 GiB), `tight` above the kubelet's image GC high threshold (GC would start removing unpinned
//!   images), `fits` otherwise, `unknown` when a figure it needs is unknown. pinboard never guesses one.
//!   The threshold is `--gc-high-percent` when given, else the node's kubelet's own (cluster mode, read from
//!   its configuration), else the kubelet's default; `gcHighSource` says which. On pinboard's agents each
//!   node's agent pulls by its own floor and threshold ([`AgentLimits`]): those decide, and the command
//!   line's are a what-if (`minFreeSource`, `gcHighSource`: `what-if`) or, for `apply`, left aside.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::digest_prefix::DigestPrefixes;
use super::image::{ImageFacts, Layer, LazyFormat};
use super::lazy::RemoteLayers;
use super::machine_config::KubeletSettings;
use super::pacing::time_at;
use super::runtime::RuntimeKind;
use super::units::{human, human_signed};

/// What is known about a node before planning. `None` means unknown, never zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub name: String,
    /// `containerd 1.6.20`; None when the node could not be reached.
    pub runtime: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    /// Why free space is unknown, when it is (e.g. a tcp endpoint: no local filesystem to measure).
    pub space_unknown_reason: Option<String>,
    /// Set when the node could not be reached: the whole plan for it is unknown.
    pub unreachable: Option<String>,
    /// Where the space figures come from, when not from the node's own image filesystem.
    pub space_source: Option<SpaceSource>,
    /// Cluster mode: what the node's kubelet configuration says (or that its defaults are assumed).
    pub kubelet: Option<KubeletSettings>,
    /// What the node's runtime holds already, whichever image brought it.
    #[serde(skip)]
    pub held: HeldBlobs,
    /// By reference, the images of the sets present only lazily there.
    #[serde(skip)]
    pub lazy: HashMap<String, RemoteLayers>,
    /// On pinboard's agents: what the node's agent pulls by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_limits: Option<AgentLimits>,
}

/// What a node's runtime holds already: the blobs a pull skips.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HeldBlobs {
    /// The runtime could not be asked: only the sets' present images count, and the figures are an upper
    /// bound.
    #[default]
    Unknown,
    /// Every blob of its content store, by digest (containerd skips any of them).
    Digests(HashSet<String>),
    /// Its layers by uncompressed digest, and its images' configs by digest (CRI-O reuses any of them).
    Layers {
        diff_ids: HashSet<String>,
        configs: HashSet<String>,
    },
    /// As its agent publishes them: the prefixes of every blob of its content store, or (`by_diff_id`,
    /// CRI-O) of its layers' uncompressed digests and its images' configs' digests.
    Prefixes {
        by_diff_id: bool,
        prefixes: DigestPrefixes,
    },
}

impl HeldBlobs {
    /// Whether the runtime holds `blob`; None when it cannot be told (unknown holdings, or a layer whose
    /// uncompressed digest was not read).
    fn holds(&self, blob: &Lacking) -> Option<bool> {
        match (self, blob) {
            (HeldBlobs::Unknown, _) => None,
            (HeldBlobs::Digests(digests), blob) => Some(digests.contains(blob.digest())),
            (HeldBlobs::Layers { configs, .. }, Lacking::Config { digest, .. }) => {
                Some(configs.contains(*digest))
            }
            (
                HeldBlobs::Layers { diff_ids, .. },
                Lacking::Layer(layer) | Lacking::Remote(layer),
            ) => layer.diff_id.as_ref().map(|id| diff_ids.contains(id)),
            (
                HeldBlobs::Prefixes {
                    by_diff_id: true,
                    prefixes,
                },
                Lacking::Layer(layer) | Lacking::Remote(layer),
            ) => layer.diff_id.as_ref().and_then(|id| prefixes.contains(id)),
            (HeldBlobs::Prefixes { prefixes, .. }, blob) => prefixes.contains(blob.digest()),
        }
    }

    /// Whether CRI-O's layers are known, so the images' uncompressed digests are worth reading.
    pub fn by_diff_id(&self) -> bool {
        matches!(
            self,
            HeldBlobs::Layers { .. }
                | HeldBlobs::Prefixes {
                    by_diff_id: true,
                    ..
                }
        )
    }
}

/// How exact `fetchBytes` is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchBasis {
    /// Every blob was checked against what the runtime holds.
    #[default]
    Exact,
    /// The runtime could not say what it holds: blobs it may hold are counted too.
    UpperBound,
}

/// Where a node's space figures come from in cluster mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpaceSource {
    /// The kubelet's summary (`node.runtime.imageFs`) through the API server's node proxy.
    KubeletSummary,
    /// The Node's `ephemeral-storage` capacity and allocatable: what the OpenShift daemon checks, not the
    /// image filesystem's free space.
    AllocatableEphemeralStorage,
}

impl SpaceSource {
    /// How tables label the figures.
    pub fn label(self) -> &'static str {
        match self {
            SpaceSource::KubeletSummary => "kubelet summary",
            SpaceSource::AllocatableEphemeralStorage => "allocatable ephemeral-storage",
        }
    }
}

/// Whether an image is on a node: known present, known absent, or unknown (e.g. a truncated image list).
pub type Presence = Option<bool>;

/// One image of the plan, as resolved for this node's platform.
#[derive(Clone, Debug)]
pub struct PlannedImage<'a> {
    /// Shared with every node's plan of it: one copy of the reference for 5,000 nodes.
    pub reference: Arc<str>,
    pub facts: &'a ImageFacts,
    pub present: Presence,
    /// Its layers still in the registry, when it is present only lazily.
    pub lazy: Option<&'a RemoteLayers>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Kubelet image GC high threshold, percent of the image filesystem (default 85).
    pub gc_high_percent: u8,
    /// Whether `gc_high_percent` was given (`--gc-high-percent`): it then wins over what a node's kubelet
    /// says.
    pub gc_high_given: bool,
    /// Free bytes that must remain after pre-loading (default 16 GiB, as the OpenShift daemon).
    pub min_free_bytes: u64,
    /// Whether `min_free_bytes` was given (`--min-free`), not the default.
    pub min_free_given: bool,
    /// What a given flag is on a node whose agent says what it pulls by: a what-if in place of the
    /// agent's own (`plan`, the TUI's Plan), or nothing (`apply`'s refusal: the agents decide).
    pub flags_over_agents: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            gc_high_percent: 85,
            gc_high_given: false,
            min_free_bytes: 16 << 30,
            min_free_given: false,
            flags_over_agents: true,
        }
    }
}

/// What a node's agent pulls by (its `--min-free`, and its `--gc-high-percent` when given), as it reports
/// it: what its own plan refuses a set by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentLimits {
    pub min_free_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_high_percent: Option<u8>,
}

impl AgentLimits {
    /// What an agent started with `limits` pulls by.
    pub fn of(limits: &Limits) -> AgentLimits {
        AgentLimits {
            min_free_bytes: limits.min_free_bytes,
            gc_high_percent: limits.gc_high_given.then_some(limits.gc_high_percent),
        }
    }
}

/// Where a node's free-space floor comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FloorSource {
    /// `--min-free`.
    Flag,
    /// Its default, 16 GiB: not given.
    #[default]
    Default,
    /// The node's agent's own (`pinboard agent --min-free`): what it refuses a set by.
    Agent,
    /// `--min-free` on a node whose agent pulls by its own: what the plan would be, not what the agent does.
    WhatIf,
}

impl FloorSource {
    /// How messages name it, for one node or many.
    pub fn label(self) -> &'static str {
        match self {
            FloorSource::Flag | FloorSource::Default => "--min-free",
            FloorSource::Agent => "the agents' own --min-free",
            FloorSource::WhatIf => "--min-free, a what-if: the agents pull by their own",
        }
    }

    /// One or two words, for narrow places.
    pub fn short(self) -> &'static str {
        match self {
            FloorSource::Flag | FloorSource::Default => "--min-free",
            FloorSource::Agent => "its agent's",
            FloorSource::WhatIf => "--min-free, what-if",
        }
    }
}

/// Where a node's image GC high threshold comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GcSource {
    /// `--gc-high-percent`.
    Flag,
    /// The node's kubelet configuration (`imageGCHighThresholdPercent` from `/configz`).
    KubeletConfig,
    /// The kubelet's default (85%): neither given nor read.
    Default,
    /// The node's agent's own `--gc-high-percent`.
    Agent,
    /// `--gc-high-percent` on a node whose agent judges by its own or its kubelet's: a what-if.
    WhatIf,
}

impl GcSource {
    /// How messages name it.
    pub fn label(self) -> &'static str {
        match self {
            GcSource::Flag => "--gc-high-percent",
            GcSource::KubeletConfig => "the kubelet's imageGCHighThresholdPercent",
            GcSource::Default => "the kubelet's default; --gc-high-percent sets another",
            GcSource::Agent => "its agent's --gc-high-percent",
            GcSource::WhatIf => "--gc-high-percent, a what-if: its agent judges by its own",
        }
    }

    /// One word, for narrow places.
    pub fn short(self) -> &'static str {
        match self {
            GcSource::Flag => "flag",
            GcSource::KubeletConfig => "kubelet",
            GcSource::Default => "default",
            GcSource::Agent => "agent",
            GcSource::WhatIf => "what-if",
        }
    }
}

impl Limits {
    /// The image GC high threshold for `node`, and where it comes from.
    pub fn gc_high_for(&self, node: &NodeFacts) -> (u8, GcSource) {
        let read = node.kubelet.as_ref().filter(|k| k.assumed.is_none());
        let agent = node.agent_limits.as_ref();
        match (agent, read) {
            (Some(_), _) if self.gc_high_given && self.flags_over_agents => {
                (self.gc_high_percent, GcSource::WhatIf)
            }
            (None, _) if self.gc_high_given => (self.gc_high_percent, GcSource::Flag),
            (
                Some(AgentLimits {
                    gc_high_percent: Some(percent),
                    ..
                }),
                _,
            ) => (*percent, GcSource::Agent),
            (_, Some(kubelet)) => (
                kubelet.image_gc_high_threshold_percent,
                GcSource::KubeletConfig,
            ),
            (_, None) => (Limits::default().gc_high_percent, GcSource::Default),
        }
    }

    /// The free-space floor for `node`, and where it comes from.
    pub fn min_free_for(&self, node: &NodeFacts) -> (u64, FloorSource) {
        match (&node.agent_limits, self.min_free_given) {
            (Some(_), true) if self.flags_over_agents => (self.min_free_bytes, FloorSource::WhatIf),
            (Some(agent), _) => (agent.min_free_bytes, FloorSource::Agent),
            (None, true) => (self.min_free_bytes, FloorSource::Flag),
            (None, false) => (self.min_free_bytes, FloorSource::Default),
        }
    }

    /// These limits for `apply`'s refusal on agents: each agent's own decide, the flags only where an agent
    /// does not say.
    pub fn agents_decide(self) -> Limits {
        Limits {
            flags_over_agents: false,
            ..self
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Fits,
    Tight,
    NoSpace,
    Unknown,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fits => "fits",
            Verdict::Tight => "tight",
            Verdict::NoSpace => "no-space",
            Verdict::Unknown => "unknown",
        }
    }
}

/// How `estimatedDiskBytes` was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EstimateBasis {
    /// Every layer to fetch states its uncompressed size.
    Uncompressed,
    /// No layer does: twice the compressed size.
    #[serde(rename = "2x-compressed")]
    TwiceCompressed,
    /// Some do, some do not.
    Mixed,
    /// Nothing to fetch.
    Nothing,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImagePlan {
    #[serde(rename = "ref")]
    pub reference: Arc<str>,
    pub present: Presence,
    pub fetch_bytes: u64,
    pub estimated_disk_bytes: u64,
    pub lazy_format: LazyFormat,
    /// Present only lazily: its layers still in the registry, whose bytes `fetchBytes` counts. Boxed: a
    /// plan holds one of these per node and image, nearly all of them none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy: Option<Box<RemoteLayers>>,
    /// The mirror that answered for the image (registries.conf, ImageDigestMirrorSet); absent: the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    pub node: String,
    pub runtime: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    /// Cluster mode: where capacity and available come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_source: Option<SpaceSource>,
    pub fetch_bytes: u64,
    /// Whether `fetch_bytes` (and the disk estimate) left out exactly what the runtime holds.
    #[serde(default)]
    pub fetch_basis: FetchBasis,
    pub estimated_disk_bytes: u64,
    pub estimate_basis: EstimateBasis,
    pub available_after_bytes: Option<i64>,
    /// The image GC high threshold the verdict used, percent, and where it comes from.
    #[serde(default = "default_gc_high")]
    pub gc_high_percent: u8,
    #[serde(default = "default_gc_source")]
    pub gc_high_source: GcSource,
    /// The free-space floor the verdict used, and where it comes from.
    #[serde(default = "default_min_free")]
    pub min_free_bytes: u64,
    #[serde(default)]
    pub min_free_source: FloorSource,
    /// On agents: the floor the node's agent pulls by, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_min_free_bytes: Option<u64>,
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    pub images: Vec<ImagePlan>,
}

fn default_gc_high() -> u8 {
    Limits::default().gc_high_percent
}

fn default_gc_source() -> GcSource {
    GcSource::Default
}

fn default_min_free() -> u64 {
    Limits::default().min_free_bytes
}

/// Plans one node. `images` is the union of every set that targets the node, each reference once.
pub fn plan_node(node: &NodeFacts, images: &[PlannedImage<'_>], limits: &Limits) -> NodePlan {
    plan_lacking(node, images, lacking(images, &node.held), limits)
}

/// [`plan_node`], counting what the node lacks towards the link's bytes too (found once for both).
pub fn plan_node_counted<'a>(
    node: &NodeFacts,
    images: &[PlannedImage<'a>],
    limits: &Limits,
    link: &mut LinkCount<'a>,
) -> NodePlan {
    let found = lacking(images, &node.held);
    link.count(&found.0, images);
    plan_lacking(node, images, found, limits)
}

/// [`plan_node`], with what the node lacks found.
fn plan_lacking<'a>(
    node: &NodeFacts,
    images: &[PlannedImage<'a>],
    (lacking, fetch_basis): (Vec<Vec<Lacking<'a>>>, FetchBasis),
    limits: &Limits,
) -> NodePlan {
    let (mut with_size, mut without_size) = (0usize, 0usize);
    let unknown_presence = images.iter().filter(|i| i.present.is_none()).count();
    // containerd nodes pull a lazily present image whole ([`super::whole`]); elsewhere it stays lazy.
    let pulls_whole = node
        .runtime
        .as_deref()
        .and_then(|r| r.split_whitespace().next())
        .and_then(RuntimeKind::of_cri_name)
        == Some(RuntimeKind::Containerd);
    let image_plans: Vec<ImagePlan> = images
        .iter()
        .zip(lacking)
        .map(|(image, blobs)| {
            let (mut fetch, mut disk) = (0u64, 0u64);
            for blob in blobs {
                fetch += blob.size();
                disk += match blob {
                    // Configs are stored as they are.
                    Lacking::Config { size, .. } => size,
                    // Only the link is needed where the image stays lazy.
                    Lacking::Remote(_) if !pulls_whole => 0,
                    Lacking::Layer(layer) | Lacking::Remote(layer) => {
                        match layer.uncompressed_size() {
                            Some(size) => {
                                with_size += 1;
                                size
                            }
                            None => {
                                without_size += 1;
                                layer.size.saturating_mul(2)
                            }
                        }
                    }
                };
            }
            ImagePlan {
                reference: Arc::clone(&image.reference),
                present: image.present,
                fetch_bytes: fetch,
                estimated_disk_bytes: disk,
                lazy_format: image.facts.lazy_format(),
                lazy: image.lazy.cloned().map(Box::new),
                mirror: image.facts.mirror.clone(),
            }
        })
        .collect();
    let fetch_bytes = image_plans.iter().map(|i| i.fetch_bytes).sum();
    let estimated_disk_bytes: u64 = image_plans.iter().map(|i| i.estimated_disk_bytes).sum();
    let estimate_basis = match (with_size, without_size) {
        (0, 0) => EstimateBasis::Nothing,
        (_, 0) => EstimateBasis::Uncompressed,
        (0, _) => EstimateBasis::TwiceCompressed,
        _ => EstimateBasis::Mixed,
    };
    let mut reasons = Vec::new();
    if unknown_presence > 0 {
        reasons.push(format!(
            "{unknown_presence} image(s) may already be on the node (unknown): counted as absent"
        ));
    }
    let available_after_bytes = node
        .available_bytes
        .map(|a| a as i64 - estimated_disk_bytes as i64);
    let (gc_high_percent, gc_high_source) = limits.gc_high_for(node);
    let (min_free_bytes, min_free_source) = limits.min_free_for(node);
    let agent_min_free_bytes = node.agent_limits.map(|a| a.min_free_bytes);
    if let Some(why) = node.kubelet.as_ref().and_then(|k| k.assumed.as_deref()) {
        reasons.push(format!(
            "the kubelet's configuration could not be read ({why}): its defaults are assumed \
             (image GC at {gc_high_percent}%, nodeStatusMaxImages 50)"
        ));
    }
    let verdict = if let Some(why) = &node.unreachable {
        reasons.push(format!("unreachable: {why}"));
        Verdict::Unknown
    } else {
        match (node.capacity_bytes, available_after_bytes) {
            (Some(capacity), Some(after)) if capacity > 0 => judge(
                capacity,
                after,
                (
                    min_free_bytes,
                    floor_words(min_free_source, agent_min_free_bytes),
                ),
                (gc_high_percent, gc_high_source),
                &mut reasons,
            ),
            _ => {
                let why = node
                    .space_unknown_reason
                    .as_deref()
                    .unwrap_or("the runtime did not report it");
                reasons.push(format!("free space unknown: {why}"));
                Verdict::Unknown
            }
        }
    };
    NodePlan {
        node: node.name.clone(),
        runtime: node.runtime.clone(),
        capacity_bytes: node.capacity_bytes,
        used_bytes: node.used_bytes,
        available_bytes: node.available_bytes,
        space_source: node.space_source,
        fetch_bytes,
        fetch_basis,
        estimated_disk_bytes,
        estimate_basis,
        available_after_bytes,
        gc_high_percent,
        gc_high_source,
        min_free_bytes,
        min_free_source,
        agent_min_free_bytes,
        verdict,
        reasons,
        images: image_plans,
    }
}

/// How a no-space reason names the floor it used.
fn floor_words(source: FloorSource, agent_min_free: Option<u64>) -> String {
    match (source, agent_min_free) {
        (FloorSource::Agent, _) => "its agent's --min-free".into(),
        (FloorSource::WhatIf, Some(own)) => {
            format!("--min-free, a what-if: its agent pulls by {}", human(own))
        }
        _ => "--min-free".into(),
    }
}

fn judge(
    capacity: u64,
    after: i64,
    (min_free_bytes, floor): (u64, String),
    (gc_high_percent, gc_high_source): (u8, GcSource),
    reasons: &mut Vec<String>,
) -> Verdict {
    if after < min_free_bytes as i64 {
        reasons.push(if after < 0 {
            format!(
                "needs {} more than the image filesystem has free",
                human(after.unsigned_abs())
            )
        } else {
            format!(
                "would leave {} free, below the {} floor ({floor})",
                human_signed(after),
                human(min_free_bytes)
            )
        });
        return Verdict::NoSpace;
    }
    let used_after = capacity.saturating_sub(after as u64) as f64;
    let percent = used_after * 100.0 / capacity as f64;
    if percent > f64::from(gc_high_percent) {
        reasons.push(format!(
            "would fill the image filesystem to {percent:.0}%, above the image GC high threshold of \
             {gc_high_percent}% ({}): the kubelet would start removing unpinned images",
            gc_high_source.label()
        ));
        return Verdict::Tight;
    }
    Verdict::Fits
}

fn blob_digests(facts: &ImageFacts) -> impl Iterator<Item = &str> {
    std::iter::once(facts.config_digest.as_str())
        .chain(facts.layers.iter().map(|l| l.digest.as_str()))
}

/// A blob a node lacks: a config or a layer, or a layer of a lazily present image still in the registry.
#[derive(Clone, Copy, Debug)]
enum Lacking<'a> {
    Config { digest: &'a str, size: u64 },
    Layer(&'a Layer),
    Remote(&'a Layer),
}

impl<'a> Lacking<'a> {
    fn digest(&self) -> &'a str {
        match self {
            Lacking::Config { digest, .. } => digest,
            Lacking::Layer(layer) | Lacking::Remote(layer) => &layer.digest,
        }
    }

    fn size(&self) -> u64 {
        match self {
            Lacking::Config { size, .. } => *size,
            Lacking::Layer(layer) | Lacking::Remote(layer) => layer.size,
        }
    }
}

/// The layers of a lazily present image still in the registry, as its facts describe them.
fn remote_layers<'a>(image: &PlannedImage<'a>) -> impl Iterator<Item = &'a Layer> {
    let layers = &image.facts.layers;
    image
        .lazy
        .into_iter()
        .flat_map(|lazy| lazy.remote_layers.iter())
        .filter_map(|&at| layers.get(at))
}

/// Per image, in order, the blobs the node lacks that no earlier image brings: the blobs of an image
/// already present are on the node, but for the remote layers of one present only lazily; so is every blob
/// the runtime `held`, and a blob shared by several missing images counts for the first. Also whether every
/// blob could be checked against `held`.
fn lacking<'a>(
    images: &[PlannedImage<'a>],
    held: &HeldBlobs,
) -> (Vec<Vec<Lacking<'a>>>, FetchBasis) {
    let mut counted: foldhash::HashSet<&str> = images
        .iter()
        .filter(|i| i.present == Some(true))
        .flat_map(|i| {
            let remote: HashSet<&str> = remote_layers(i).map(|l| l.digest.as_str()).collect();
            blob_digests(i.facts).filter(move |d| !remote.contains(d))
        })
        .collect();
    let mut basis = FetchBasis::Exact;
    let lacking = images
        .iter()
        .map(|image| {
            if image.present == Some(true) {
                // Still read from the registry, whatever the content store holds.
                return remote_layers(image)
                    .map(Lacking::Remote)
                    .filter(|blob| counted.insert(blob.digest()))
                    .collect();
            }
            let facts = image.facts;
            let config = Lacking::Config {
                digest: &facts.config_digest,
                size: facts.config_size,
            };
            std::iter::once(config)
                .chain(facts.layers.iter().map(Lacking::Layer))
                .filter(|blob| match held.holds(blob) {
                    Some(true) => false,
                    Some(false) => true,
                    None => {
                        basis = FetchBasis::UpperBound;
                        true
                    }
                })
                .filter(|blob| counted.insert(blob.digest()))
                .collect()
        })
        .collect();
    (lacking, basis)
}

/// What pre-loading the images costs the registry link, with and without fan-out: `plan -o json`'s
/// `linkBytes`. Manifests count as blobs do; indexes are not counted (their size is not in the facts, and
/// they are a few KB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkBytes {
    /// With fan-out: every blob and manifest some node lacks, once, unless the blob cache holds it.
    pub fan_out: u64,
    /// Without: every node fetches what it lacks itself, so the sum over the nodes.
    pub direct: u64,
    /// `--link-rate`: the budget the blob cache keeps on the link, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Under that budget, the seconds `fan_out` takes over the link at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out_seconds: Option<u64>,
}

impl LinkBytes {
    /// These bytes under a budget of `rate` bytes per second (none: as they are).
    pub fn at_rate(self, rate: Option<u64>) -> LinkBytes {
        LinkBytes {
            rate,
            fan_out_seconds: rate
                .map(|rate| time_at(self.fan_out, rate).as_secs_f64().ceil() as u64),
            ..self
        }
    }
}

/// [`LinkBytes`], counted node by node as each is planned (so that no node's planned images outlive its
/// plan): with what each node holds, every blob it lacks and the manifests of its missing images.
#[derive(Debug, Default)]
pub struct LinkCount<'a> {
    direct: u64,
    once: foldhash::HashMap<&'a str, u64>,
}

impl<'a> LinkCount<'a> {
    /// Counts a node planned with `images` (as [`plan_node`] takes them), lacking `lacking` of them.
    fn count(&mut self, lacking: &[Vec<Lacking<'a>>], images: &[PlannedImage<'a>]) {
        let blobs = lacking.iter().flatten();
        let manifests = images
            .iter()
            .filter(|i| i.present != Some(true))
            .map(|i| (i.facts.manifest_digest.as_str(), i.facts.manifest_size));
        for (digest, size) in blobs.map(|b| (b.digest(), b.size())).chain(manifests) {
            self.direct += size;
            self.once.insert(digest, size);
        }
    }

    /// What the link carries for the nodes counted; `cached` says whether the blob cache holds a digest.
    pub fn total(self, cached: impl Fn(&str) -> bool) -> LinkBytes {
        let fan_out = self
            .once
            .into_iter()
            .filter(|(digest, _)| !cached(digest))
            .map(|(_, size)| size)
            .sum();
        LinkBytes {
            fan_out,
            direct: self.direct,
            rate: None,
            fan_out_seconds: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::image::{ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE, Layer};

    const MI: u64 = 1 << 20;

    /// [`LinkCount`] of `nodes`.
    fn link_bytes<'a>(
        nodes: impl IntoIterator<Item = (&'a HeldBlobs, &'a [PlannedImage<'a>])>,
        cached: impl Fn(&str) -> bool,
    ) -> LinkBytes {
        let mut count = LinkCount::default();
        for (held, images) in nodes {
            count.count(&lacking(images, held).0, images);
        }
        count.total(cached)
    }

    fn layer(digest: &str, size: u64, uncompressed: Option<u64>) -> Layer {
        let mut annotations = BTreeMap::new();
        if let Some(u) = uncompressed {
            annotations.insert(
                ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE.to_string(),
                u.to_string(),
            );
        }
        Layer {
            digest: digest.into(),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            size,
            annotations,
            diff_id: None,
        }
    }

    fn image(config: &str, layers: Vec<Layer>) -> ImageFacts {
        ImageFacts {
            manifest_digest: format!("m-{config}"),
            manifest_size: 500,
            index_digest: None,
            platform: None,
            config_digest: config.into(),
            config_size: 1000,
            layers,
            annotations: BTreeMap::new(),
            mirror: None,
        }
    }

    fn node(capacity: u64, available: u64) -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            runtime: Some("containerd 1.6.20".into()),
            capacity_bytes: Some(capacity),
            used_bytes: Some(capacity - available),
            available_bytes: Some(available),
            ..NodeFacts::default()
        }
    }

    fn limits(min_free: u64) -> Limits {
        Limits {
            min_free_bytes: min_free,
            ..Limits::default()
        }
    }

    #[test]
    fn a_lazily_present_images_remote_layers_are_still_to_fetch_and_to_write() {
        let shared = layer("shared", 8 * MI, None);
        let lazy = image(
            "cl",
            vec![
                layer("l0", MI, None),
                shared.clone(),
                layer("l2", 4 * MI, None),
            ],
        );
        let missing = image("cm", vec![shared, layer("m1", 2 * MI, None)]);
        let remote = RemoteLayers::of(&[false, true, true]).unwrap();
        let images = [
            PlannedImage {
                reference: "lazy".into(),
                facts: &lazy,
                present: Some(true),
                lazy: Some(&remote),
            },
            PlannedImage {
                reference: "missing".into(),
                facts: &missing,
                present: Some(false),
                lazy: None,
            },
        ];
        let held = HeldBlobs::Digests(["cl".to_string(), "l0".to_string()].into());
        let node = NodeFacts {
            held: held.clone(),
            ..node(100 * MI, 90 * MI)
        };
        let plan = plan_node(&node, &images, &limits(MI));
        assert_eq!(plan.images[0].fetch_bytes, 12 * MI, "its two remote layers");
        assert_eq!(
            plan.images[0].estimated_disk_bytes,
            24 * MI,
            "pulled whole: onto the disk, twice compressed without an uncompressed size"
        );
        assert_eq!(plan.images[0].lazy.as_deref(), Some(&remote));
        assert_eq!(plan.images[0].present, Some(true));
        // The layer both share is fetched once, for the first image that needs it.
        assert_eq!(plan.images[1].fetch_bytes, 2 * MI + 1000);
        assert_eq!(plan.fetch_bytes, 14 * MI + 1000);
        assert_eq!(plan.estimated_disk_bytes, 28 * MI + 1000);
        let crio = NodeFacts {
            runtime: Some("cri-o 1.31.0".into()),
            ..node.clone()
        };
        assert_eq!(
            plan_node(&crio, &images, &limits(MI)).images[0].estimated_disk_bytes,
            0,
            "CRI-O's stays lazy: only the link"
        );
        let json = serde_json::to_value(&plan.images[0]).unwrap();
        assert_eq!(json["lazy"]["remoteLayers"], serde_json::json!([1, 2]));
        assert!(
            serde_json::to_value(&plan.images[1])
                .unwrap()
                .get("lazy")
                .is_none()
        );
        let link = link_bytes([(&held, &images[..])], |_| false);
        assert_eq!(
            link.direct,
            14 * MI + 1000 + 500,
            "with the missing image's manifest"
        );
    }

    #[test]
    fn what_the_runtime_holds_is_not_fetched_whichever_image_brought_it() {
        let mut base = layer("base", 10 * MI, None);
        base.diff_id = Some("diff-base".into());
        let mut own = layer("own", 2 * MI, None);
        own.diff_id = Some("diff-own".into());
        let y = image("cy", vec![base, own]);
        let images = [PlannedImage {
            reference: "y".into(),
            facts: &y,
            present: Some(false),
            lazy: None,
        }];
        let with = |held| NodeFacts {
            held,
            ..node(100 * MI, 90 * MI)
        };
        let plan = |held| plan_node(&with(held), &images, &limits(MI));

        // containerd: its content store holds the base (another image brought it).
        let store = plan(HeldBlobs::Digests(["base".to_string()].into()));
        assert_eq!(
            store.fetch_bytes,
            2 * MI + 1000,
            "the own layer and the config"
        );
        assert_eq!(store.fetch_basis, FetchBasis::Exact);
        assert_eq!(store.estimated_disk_bytes, 4 * MI + 1000);

        // CRI-O: it holds the base's layer by uncompressed digest, and no config of Y.
        let layers = plan(HeldBlobs::Layers {
            diff_ids: ["diff-base".to_string()].into(),
            configs: ["c-other".to_string()].into(),
        });
        assert_eq!(layers.fetch_bytes, 2 * MI + 1000);
        assert_eq!(layers.fetch_basis, FetchBasis::Exact);

        // Unknown holdings count everything, and say it is an upper bound.
        let unknown = plan(HeldBlobs::Unknown);
        assert_eq!(unknown.fetch_bytes, 12 * MI + 1000);
        assert_eq!(unknown.fetch_basis, FetchBasis::UpperBound);
        let json = serde_json::to_value(&unknown).unwrap();
        assert_eq!(json["fetchBasis"], "upper-bound");

        // A layer whose uncompressed digest was not read cannot be matched on CRI-O.
        let mut unread = y.clone();
        unread.layers[0].diff_id = None;
        let images = [PlannedImage {
            reference: "y".into(),
            facts: &unread,
            present: Some(false),
            lazy: None,
        }];
        let held = HeldBlobs::Layers {
            diff_ids: ["diff-base".to_string()].into(),
            configs: Default::default(),
        };
        let partly = plan_node(&with(held), &images, &limits(MI));
        assert_eq!(partly.fetch_bytes, 12 * MI + 1000);
        assert_eq!(partly.fetch_basis, FetchBasis::UpperBound);
    }

    #[test]
    fn shared_layers_count_once_and_present_images_contribute_nothing() {
        let base = layer("base", 10 * MI, None);
        let a = image("ca", vec![base.clone(), layer("a1", 4 * MI, None)]);
        let b = image("cb", vec![base.clone(), layer("b1", 2 * MI, None)]);
        let c = image("cc", vec![layer("c1", MI, None)]);
        let images = [
            PlannedImage {
                reference: "a".into(),
                facts: &a,
                present: Some(false),
                lazy: None,
            },
            PlannedImage {
                reference: "b".into(),
                facts: &b,
                present: Some(false),
                lazy: None,
            },
            PlannedImage {
                reference: "c".into(),
                facts: &c,
                present: Some(true),
                lazy: None,
            },
        ];
        let plan = plan_node(&node(1000 * MI, 900 * MI), &images, &limits(MI));
        assert_eq!(plan.images[0].fetch_bytes, 14 * MI + 1000);
        assert_eq!(
            plan.images[1].fetch_bytes,
            2 * MI + 1000,
            "base layer counted once, for the first image"
        );
        assert_eq!(plan.images[2].fetch_bytes, 0);
        assert_eq!(plan.fetch_bytes, 16 * MI + 2000);
        assert_eq!(plan.estimated_disk_bytes, 32 * MI + 2000);
        assert_eq!(plan.estimate_basis, EstimateBasis::TwiceCompressed);
        assert_eq!(plan.verdict, Verdict::Fits);
        assert_eq!(
            plan.available_after_bytes,
            Some((900 * MI - 32 * MI - 2000) as i64)
        );
    }

    #[test]
    fn layers_of_present_images_are_already_on_the_node() {
        let base = layer("base", 10 * MI, None);
        let present = image("cp", vec![base.clone()]);
        let missing = image("cm", vec![base, layer("m1", MI, Some(3 * MI))]);
        let images = [
            PlannedImage {
                reference: "missing".into(),
                facts: &missing,
                present: Some(false),
                lazy: None,
            },
            PlannedImage {
                reference: "present".into(),
                facts: &present,
                present: Some(true),
                lazy: None,
            },
        ];
        let plan = plan_node(&node(1000 * MI, 900 * MI), &images, &limits(MI));
        assert_eq!(plan.fetch_bytes, MI + 1000);
        assert_eq!(
            plan.estimated_disk_bytes,
            3 * MI + 1000,
            "annotated uncompressed size wins over 2x"
        );
        assert_eq!(plan.estimate_basis, EstimateBasis::Uncompressed);
    }

    /// Agents started with `--min-free 1Mi`, a plan run without `--min-free`: the agents' floor decides.
    #[test]
    fn an_agents_own_floor_decides_and_a_given_flag_is_a_what_if() {
        let big = image("c", vec![layer("l", 10 * MI, None)]); // 20 MiB + 1000 B on disk
        let images = [PlannedImage {
            reference: "big".into(),
            facts: &big,
            present: Some(false),
            lazy: None,
        }];
        let on_agent = NodeFacts {
            agent_limits: Some(AgentLimits {
                min_free_bytes: MI,
                gc_high_percent: Some(95),
            }),
            ..node(100 * MI, 30 * MI)
        };
        let given = Limits {
            min_free_bytes: 16 << 30,
            min_free_given: true,
            gc_high_percent: 50,
            gc_high_given: true,
            ..Limits::default()
        };

        let own = plan_node(&on_agent, &images, &Limits::default());
        assert_eq!(own.verdict, Verdict::Fits, "{:?}", own.reasons);
        assert_eq!(
            (own.min_free_bytes, own.min_free_source),
            (MI, FloorSource::Agent)
        );
        assert_eq!(
            (own.gc_high_percent, own.gc_high_source),
            (95, GcSource::Agent)
        );
        assert_eq!(own.agent_min_free_bytes, Some(MI));

        let what_if = plan_node(&on_agent, &images, &given);
        assert_eq!(what_if.verdict, Verdict::NoSpace);
        assert_eq!(
            (what_if.min_free_bytes, what_if.min_free_source),
            (16 << 30, FloorSource::WhatIf)
        );
        assert_eq!(what_if.gc_high_source, GcSource::WhatIf);
        assert!(
            what_if.reasons[0].ends_with(
                "below the 16 GiB floor (--min-free, a what-if: its agent pulls by 1 MiB)"
            ),
            "{:?}",
            what_if.reasons
        );
        let json = serde_json::to_value(&what_if).unwrap();
        assert_eq!(json["minFreeSource"], "what-if");
        assert_eq!(json["agentMinFreeBytes"], MI);

        // apply's refusal: the agents decide, whatever was given.
        let decided = plan_node(&on_agent, &images, &given.agents_decide());
        assert_eq!(decided.verdict, Verdict::Fits);
        assert_eq!(decided.min_free_source, FloorSource::Agent);
        assert_eq!(decided.gc_high_source, GcSource::Agent);

        // A node whose agent does not say (an older agent), or direct mode: the flag, or its default.
        let unsaid = node(100 * MI, 30 * MI);
        let flagged = plan_node(&unsaid, &images, &given.agents_decide());
        assert_eq!(flagged.min_free_source, FloorSource::Flag);
        assert_eq!(flagged.gc_high_source, GcSource::Flag);
        let default = plan_node(&unsaid, &images, &Limits::default());
        assert_eq!(
            (default.min_free_bytes, default.min_free_source),
            (16 << 30, FloorSource::Default)
        );
        assert_eq!(default.verdict, Verdict::NoSpace);
    }

    #[test]
    fn verdicts_follow_the_floor_and_the_gc_threshold() {
        let big = image("c", vec![layer("l", 50 * MI, None)]); // 100 MiB + 1000 B on disk
        let images = [PlannedImage {
            reference: "big".into(),
            facts: &big,
            present: Some(false),
            lazy: None,
        }];
        let plan = |capacity, available, min_free| {
            plan_node(&node(capacity, available), &images, &limits(min_free))
        };

        assert_eq!(plan(1000 * MI, 900 * MI, 16 * MI).verdict, Verdict::Fits);

        let tight = plan(1000 * MI, 200 * MI, 16 * MI);
        assert_eq!(tight.verdict, Verdict::Tight);
        assert!(
            tight.reasons[0].contains("to 90%, above the image GC high threshold of 85%"),
            "{:?}",
            tight.reasons
        );

        let floor = plan(1000 * MI, 110 * MI, 16 * MI);
        assert_eq!(floor.verdict, Verdict::NoSpace);
        assert!(
            floor.reasons[0].contains("below the 16 MiB floor (--min-free)"),
            "{:?}",
            floor.reasons
        );

        let short = plan(1000 * MI, 60 * MI, 16 * MI);
        assert_eq!(short.verdict, Verdict::NoSpace);
        assert_eq!(
            short.available_after_bytes,
            Some(60 * MI as i64 - 100 * MI as i64 - 1000)
        );
        assert!(
            short.reasons[0].starts_with("needs 40.00 MiB more"),
            "{:?}",
            short.reasons
        );
    }

    #[test]
    fn unknown_figures_give_unknown_never_a_guess() {
        let img = image("c", vec![layer("l", MI, None)]);
        let images = [PlannedImage {
            reference: "i".into(),
            facts: &img,
            present: None,
            lazy: None,
        }];
        let remote = NodeFacts {
            name: "remote".into(),
            runtime: Some("cri-o 1.31".into()),
            space_unknown_reason: Some("tcp endpoint: no local filesystem to measure".into()),
            ..NodeFacts::default()
        };
        let plan = plan_node(&remote, &images, &Limits::default());
        assert_eq!(plan.verdict, Verdict::Unknown);
        assert_eq!(plan.available_after_bytes, None);
        assert_eq!(
            plan.fetch_bytes,
            MI + 1000,
            "unknown presence is counted as absent"
        );
        assert!(
            plan.reasons.iter().any(|r| r.contains("tcp endpoint")),
            "{:?}",
            plan.reasons
        );
        assert!(
            plan.reasons
                .iter()
                .any(|r| r.contains("1 image(s) may already be on the node"))
        );

        let down = NodeFacts {
            name: "down".into(),
            unreachable: Some("connection refused".into()),
            ..node(MI, MI)
        };
        let plan = plan_node(&down, &images, &Limits::default());
        assert_eq!(plan.verdict, Verdict::Unknown);
        assert!(
            plan.reasons
                .contains(&"unreachable: connection refused".to_string())
        );
    }

    #[test]
    fn link_bytes_count_each_lacking_blob_once_with_fan_out_and_per_node_without() {
        const MANIFEST: u64 = 500;
        let base = layer("base", 10 * MI, None);
        let a = image("ca", vec![base.clone(), layer("a1", 4 * MI, None)]);
        let b = image("cb", vec![base, layer("b1", 2 * MI, None)]);
        let planned = |a_present, b_present| {
            [
                PlannedImage {
                    reference: "a".into(),
                    facts: &a,
                    present: Some(a_present),
                    lazy: None,
                },
                PlannedImage {
                    reference: "b".into(),
                    facts: &b,
                    present: Some(b_present),
                    lazy: None,
                },
            ]
        };
        // n1 lacks both, n2 has a (so the base too) and lacks b, n3 has both.
        let (n1, n2, n3) = (
            planned(false, false),
            planned(true, false),
            planned(true, true),
        );
        let unknown = HeldBlobs::Unknown;
        let nodes = [
            (&unknown, &n1[..]),
            (&unknown, &n2[..]),
            (&unknown, &n3[..]),
        ];
        let n1_bytes = 16 * MI + 2000 + 2 * MANIFEST;
        let n2_bytes = 2 * MI + 1000 + MANIFEST;
        let nothing_cached = link_bytes(nodes, |_| false);
        let budgeted = nothing_cached.at_rate(Some(MI));
        assert_eq!(
            (budgeted.rate, budgeted.fan_out_seconds),
            (Some(MI), Some(nothing_cached.fan_out.div_ceil(MI)))
        );
        assert_eq!(nothing_cached.at_rate(None), nothing_cached);
        assert_eq!(nothing_cached.direct, n1_bytes + n2_bytes);
        assert_eq!(
            nothing_cached.fan_out, n1_bytes,
            "what n2 lacks, n1 lacks too: fetched once for both"
        );
        let base_cached = link_bytes(nodes, |digest| digest == "base" || digest == "m-ca");
        assert_eq!(base_cached.fan_out, n1_bytes - 10 * MI - MANIFEST);
        assert_eq!(
            base_cached.direct, nothing_cached.direct,
            "nodes do not share the cache"
        );
        assert_eq!(
            link_bytes([(&unknown, &n3[..])], |_| false),
            LinkBytes::default()
        );
        let json = serde_json::to_value(nothing_cached).unwrap();
        assert_eq!(json["fanOut"], n1_bytes);
        assert_eq!(json["direct"], n1_bytes + n2_bytes);
    }

    #[test]
    fn json_uses_the_documented_field_names() {
        let img = image("c", vec![layer("l", MI, None)]);
        let images = [PlannedImage {
            reference: "r".into(),
            facts: &img,
            present: Some(false),
            lazy: None,
        }];
        let json = serde_json::to_value(plan_node(&node(100 * MI, 90 * MI), &images, &limits(MI)))
            .unwrap();
        for key in [
            "node",
            "runtime",
            "capacityBytes",
            "availableBytes",
            "fetchBytes",
            "estimatedDiskBytes",
            "availableAfterBytes",
            "verdict",
            "reasons",
            "images",
        ] {
            assert!(json.get(key).is_some(), "missing {key} in {json}");
        }
        assert_eq!(json["verdict"], "fits");
        assert_eq!(json["images"][0]["ref"], "r");
        assert_eq!(json["images"][0]["present"], false);
        assert_eq!(json["images"][0]["lazyFormat"], "none");
        assert_eq!(json["estimateBasis"], "2x-compressed");
    }
}

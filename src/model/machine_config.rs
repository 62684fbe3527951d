//! The cluster view: what pinboard reads from an OpenShift cluster's machine-config objects, and what it
//! makes of it. Pure: the watchers in [`crate::backend::openshift`] feed [`ClusterUpdate`]s into a [`ClusterView`].
//!
//! The typed views deserialize the whole object (`metadata`, `spec`, `status`) as JSON and keep only the
//! fields pinboard needs; every field may be missing, so an older or newer cluster never fails to parse.
//! Both the `v1` shapes and the legacy `v1alpha1` ones (plain-string image lists, `lastFailedGenerationErrors`,
//! `lastPinnedImageSetError`) are read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use serde::{Deserialize, Serialize};

use super::labels::selector_matches;
use super::set::{ImageSet, from_flags};
use super::units::parse_bytes;

/// The label that targets a pool: `machineconfiguration.openshift.io/role: <pool>`.
pub const ROLE_LABEL: &str = "machineconfiguration.openshift.io/role";
/// `status.poolSynchronizersStatus[].poolSynchronizerType` of the PinnedImageSet rollout.
pub const PINNED_IMAGE_SETS_SYNCHRONIZER: &str = "PinnedImageSets";
pub const PROGRESSING: &str = "PinnedImageSetsProgressing";
pub const DEGRADED: &str = "PinnedImageSetsDegraded";
/// How the machine-config daemon's error starts when a 5-minute sync window ended before every pull did; it
/// carries on pulling (OCPBUGS-57177).
pub const REQUEUE_TIMEOUT: &str = "requeue: prefetching images incomplete after timeout";
/// The kubelet's defaults for what pinboard reads of its configuration, used when `/configz` does not
/// answer: `nodeStatusMaxImages`, `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`.
pub const KUBELET_DEFAULT_MAX_IMAGES: i64 = 50;
pub const KUBELET_DEFAULT_GC_HIGH: u8 = 85;
pub const KUBELET_DEFAULT_GC_LOW: u8 = 80;

/// `metadata`: the fields pinboard reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Meta {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub generation: Option<i64>,
}

/// A PinnedImageSet (`v1`, or `v1alpha1` with either entry shape).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct PinnedImageSet {
    pub metadata: Meta,
    pub spec: PinnedImageSetSpec,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PinnedImageSetSpec {
    pub pinned_images: Vec<PinnedImageRef>,
}

/// One entry: `{name: <ref>}`, or a plain string on early `v1alpha1` clusters.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PinnedImageRef {
    Named { name: String },
    Plain(String),
}

impl PinnedImageSet {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// The references, in order, whichever shape the cluster stores.
    pub fn images(&self) -> impl Iterator<Item = &str> {
        self.spec.pinned_images.iter().map(|entry| match entry {
            PinnedImageRef::Named { name } | PinnedImageRef::Plain(name) => name.as_str(),
        })
    }

    /// `metadata.generation`: what nodes report as `desiredGeneration` once they have seen this version.
    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or(0)
    }

    /// The set as the composer and the planner hold sets.
    pub fn to_image_set(&self) -> ImageSet {
        let images: Vec<String> = self.images().map(str::to_owned).collect();
        let mut set = from_flags(self.name(), &images);
        set.labels = self.metadata.labels.clone();
        set
    }
}

/// A MachineConfigPool.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct MachineConfigPool {
    pub metadata: Meta,
    pub spec: PoolSpec,
    pub status: PoolStatus,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PoolSpec {
    /// Which MachineConfigs, and PinnedImageSets, the pool picks up. Absent selects nothing.
    pub machine_config_selector: Option<LabelSelector>,
    /// Which nodes are in the pool.
    pub node_selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PoolStatus {
    pub machine_count: Option<i64>,
    pub pool_synchronizers_status: Vec<PoolSynchronizer>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PoolSynchronizer {
    pub pool_synchronizer_type: String,
    pub machine_count: i64,
    pub updated_machine_count: i64,
    pub ready_machine_count: i64,
    pub available_machine_count: i64,
    pub unavailable_machine_count: i64,
}

impl MachineConfigPool {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}

/// A MachineConfigNode: one per node, written by that node's machine-config daemon.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct MachineConfigNode {
    pub metadata: Meta,
    pub spec: McnSpec,
    pub status: Option<McnStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct McnSpec {
    pub node: NameRef,
    pub pool: NameRef,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct NameRef {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct McnStatus {
    pub pinned_image_sets: Vec<McnSetStatus>,
    pub conditions: Vec<Condition>,
}

/// `status.pinnedImageSets[]`: one set as this node sees it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct McnSetStatus {
    pub name: String,
    pub desired_generation: Option<i64>,
    pub current_generation: Option<i64>,
    pub last_failed_generation: Option<i64>,
    pub last_failed_generation_error: Option<String>,
    /// Legacy (`v1alpha1`).
    pub last_failed_generation_errors: Vec<String>,
    /// Legacy (`v1alpha1`).
    pub last_pinned_image_set_error: Option<String>,
}

impl McnSetStatus {
    /// The failure text, from whichever field this cluster writes.
    pub fn error(&self) -> Option<String> {
        let legacy = (!self.last_failed_generation_errors.is_empty())
            .then(|| self.last_failed_generation_errors.join("; "));
        [
            self.last_failed_generation_error.clone(),
            legacy,
            self.last_pinned_image_set_error.clone(),
        ]
        .into_iter()
        .flatten()
        .find(|text| !text.is_empty())
    }
}

/// A `metav1.Condition`, every field optional.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub last_transition_time: Option<Time>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }

    pub fn since(&self) -> Option<SystemTime> {
        self.last_transition_time
            .as_ref()
            .map(|time| SystemTime::from(time.0))
    }
}

impl MachineConfigNode {
    /// The node's name (`spec.node.name`, else the MCN's own name, which is the node's).
    pub fn node_name(&self) -> &str {
        if self.spec.node.name.is_empty() {
            &self.metadata.name
        } else {
            &self.spec.node.name
        }
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    pub fn set_status(&self, set_name: &str) -> Option<&McnSetStatus> {
        self.status
            .as_ref()?
            .pinned_image_sets
            .iter()
            .find(|s| s.name == set_name)
    }
}

/// A ContainerRuntimeConfig: where lazy pulling (additional layer stores) is configured per pool.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct ContainerRuntimeConfig {
    pub metadata: Meta,
    pub spec: CrcSpec,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct CrcSpec {
    pub machine_config_pool_selector: Option<LabelSelector>,
    pub container_runtime_config: CrcRuntime,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct CrcRuntime {
    pub additional_layer_stores: Vec<LayerStore>,
    /// The seed design's field, read where a cluster has it.
    pub lazy_image_pull: Option<LazyImagePull>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct LazyImagePull {
    pub mode: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct LayerStore {
    pub path: String,
}

/// The label OpenShift puts on every pool, naming it: what a pool-specific config selects.
pub fn pool_label(pool: &str) -> String {
    format!("pools.operator.machineconfiguration.openshift.io/{pool}")
}

/// The ContainerRuntimeConfig pinboard writes to turn lazy pulling on for a pool.
pub fn lazy_config_name(pool: &str) -> String {
    format!("pinboard-lazy-{pool}")
}

impl ContainerRuntimeConfig {
    /// Whether this config turns lazy pulling on: an additional layer store, or `lazyImagePull.mode:
    /// Enabled`.
    pub fn lazy(&self) -> bool {
        let runtime = &self.spec.container_runtime_config;
        let mode = runtime
            .lazy_image_pull
            .as_ref()
            .and_then(|l| l.mode.as_deref());
        !runtime.additional_layer_stores.is_empty()
            || mode.is_some_and(|m| m.eq_ignore_ascii_case("enabled"))
    }

    /// The pools whose labels this config's `machineConfigPoolSelector` matches.
    pub fn pools<'a>(&self, pools: &'a [MachineConfigPool]) -> Vec<&'a str> {
        pools
            .iter()
            .filter(|pool| {
                selector_matches(
                    self.spec.machine_config_pool_selector.as_ref(),
                    &pool.metadata.labels,
                )
            })
            .map(MachineConfigPool::name)
            .collect()
    }
}

/// What pinboard reads from a Node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `status.nodeInfo.containerRuntimeVersion`: `cri-o://1.33.2`.
    pub runtime: Option<String>,
    /// The `Ready` condition; `None` when the kubelet has not reported it.
    pub ready: Option<bool>,
    pub disk_pressure: Option<bool>,
    /// `status.allocatable["ephemeral-storage"]` in bytes: what the daemon checks space against.
    pub allocatable_ephemeral: Option<u64>,
    /// `status.capacity["ephemeral-storage"]` in bytes.
    pub capacity_ephemeral: Option<u64>,
    /// Every name of every image in `status.images`.
    pub images: BTreeSet<String>,
    /// How many entries `status.images` has (the kubelet stops at its `nodeStatusMaxImages`).
    pub image_entries: usize,
    /// `status.nodeInfo.kubeletVersion`: `v1.29.4+a1b2c3d`.
    pub kubelet_version: Option<String>,
    /// `spec.taints`: which DaemonSets' pods the node takes.
    pub taints: Vec<NodeTaint>,
}

/// One of a Node's taints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTaint {
    pub key: String,
    /// Empty when the taint has none.
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl From<&Node> for ClusterNode {
    fn from(node: &Node) -> ClusterNode {
        let status = node.status.as_ref();
        let condition = |type_: &str| {
            status?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| c.status == "True")
        };
        let images = status.and_then(|s| s.images.as_ref());
        ClusterNode {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            runtime: status
                .and_then(|s| s.node_info.as_ref())
                .map(|info| info.container_runtime_version.clone())
                .filter(|version| !version.is_empty()),
            kubelet_version: status
                .and_then(|s| s.node_info.as_ref())
                .map(|info| info.kubelet_version.clone())
                .filter(|version| !version.is_empty()),
            ready: condition("Ready"),
            disk_pressure: condition("DiskPressure"),
            allocatable_ephemeral: status
                .and_then(|s| s.allocatable.as_ref()?.get("ephemeral-storage"))
                .and_then(|q| parse_bytes(&q.0).ok()),
            capacity_ephemeral: status
                .and_then(|s| s.capacity.as_ref()?.get("ephemeral-storage"))
                .and_then(|q| parse_bytes(&q.0).ok()),
            images: images
                .into_iter()
                .flatten()
                .flat_map(|image| image.names.iter().flatten().cloned())
                .collect(),
            image_entries: images.map_or(0, Vec::len),
            taints: node
                .spec
                .iter()
                .flat_map(|spec| spec.taints.iter().flatten())
                .map(|taint| NodeTaint {
                    key: taint.key.clone(),
                    value: taint.value.clone().unwrap_or_default(),
                    effect: taint.effect.clone(),
                })
                .collect(),
        }
    }
}

/// Whether a node holds an image, as far as `Node.status.images` can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Present,
    /// Not listed, and the list is complete.
    Absent,
    /// Not listed, but the list is empty or full: the kubelet may have left it out.
    Unknown,
}

/// What pinboard reads of a kubelet's running configuration (`/api/v1/nodes/NAME/proxy/configz`), or the
/// kubelet's defaults when it cannot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSettings {
    /// How many images `Node.status.images` lists at most: -1 no limit, 0 none.
    pub node_status_max_images: i64,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: u8,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: u8,
    /// Why these are the defaults rather than the kubelet's own figures; None when read from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assumed: Option<String>,
}

impl KubeletSettings {
    /// The kubelet's defaults, assumed because of `why`.
    pub fn assumed(why: impl Into<String>) -> KubeletSettings {
        KubeletSettings {
            node_status_max_images: KUBELET_DEFAULT_MAX_IMAGES,
            image_gc_high_threshold_percent: KUBELET_DEFAULT_GC_HIGH,
            image_gc_low_threshold_percent: KUBELET_DEFAULT_GC_LOW,
            assumed: Some(why.into()),
        }
    }

    /// `at most 50`, `no limit`, `none`, for messages.
    pub fn max_images_words(&self) -> String {
        match self.node_status_max_images {
            n if n < 0 => "no limit".into(),
            0 => "none: nodeStatusMaxImages is 0".into(),
            n => format!("at most {n}"),
        }
    }
}

/// A node's image filesystem as its kubelet's summary reports it (`node.runtime.imageFs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ImageFsSpace {
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
}

/// How much `Node.status.images` can prove about an image it does not name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageList {
    /// No entries (the kubelet lists none, or has not reported yet): proves nothing.
    Empty,
    /// As many entries as the kubelet lists at most: it may have left images out.
    Full,
    /// Shorter than the kubelet's limit (or it has none): it names every image the node holds.
    Complete,
}

impl ClusterNode {
    /// The node's image list judged against its kubelet's `nodeStatusMaxImages` (-1: no limit).
    pub fn image_list(&self, max_images: i64) -> ImageList {
        let entries = i64::try_from(self.image_entries).unwrap_or(i64::MAX);
        if entries == 0 {
            ImageList::Empty
        } else if max_images < 0 || entries < max_images {
            ImageList::Complete
        } else {
            ImageList::Full
        }
    }

    pub fn presence(&self, reference: &str, max_images: i64) -> Presence {
        if self.images.contains(reference) {
            Presence::Present
        } else if self.image_list(max_images) == ImageList::Complete {
            Presence::Absent
        } else {
            Presence::Unknown
        }
    }

    /// Whether this node's kubelet keeps pinned images out of image GC: Kubernetes 1.29, and the backports
    /// (k8s #119986) to 1.28.2, 1.27.6, 1.26.9 and 1.25.14. None when the version is unknown or unreadable.
    pub fn kubelet_honours_pins(&self) -> Option<bool> {
        let version = self.kubelet_version.as_deref()?;
        let mut numbers = version
            .trim_start_matches('v')
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().ok());
        let (major, minor, patch) = (numbers.next()??, numbers.next()??, numbers.next()??);
        let first_patch = match (major, minor) {
            (1, 29..) | (2.., _) => return Some(true),
            (1, 28) => 2,
            (1, 27) => 6,
            (1, 26) => 9,
            (1, 25) => 14,
            _ => return Some(false),
        };
        Some(patch >= first_patch)
    }

    /// The warning for a kubelet whose image GC ignores pins; None when it honours them or is unknown.
    pub fn pins_ignored_warning(&self) -> Option<String> {
        (self.kubelet_honours_pins() == Some(false)).then(|| {
            format!(
                "kubelet {} predates pinned-image support in image GC (Kubernetes 1.29; 1.28.2, 1.27.6, \
                 1.26.9, 1.25.14): pins are written, but its image GC ignores them; upgrade the node",
                self.kubelet_version.as_deref().unwrap_or("?")
            )
        })
    }

    /// Where this node is with generation `generation` of set `set_name`, as its MachineConfigNode (if any)
    /// in `view` reports at `now`.
    pub fn set_state(
        &self,
        view: &ClusterView,
        set_name: &str,
        generation: i64,
        now: SystemTime,
    ) -> SetProgress {
        view.machine_config_node(&self.name)
            .map_or(SetProgress::Unknown, |mcn| {
                node_set_state(mcn, set_name, generation, now)
            })
    }
}

/// The pools whose `machineConfigSelector` picks up a set with these labels.
pub fn pools_for_set(
    set_labels: &BTreeMap<String, String>,
    pools: &[MachineConfigPool],
) -> Vec<String> {
    pools
        .iter()
        .filter(|pool| selector_matches(pool.spec.machine_config_selector.as_ref(), set_labels))
        .map(|pool| pool.name().to_owned())
        .collect()
}

/// The warning to show before applying a set that would land in no pool, or in several; `None` when it
/// lands in exactly one.
pub fn pool_warning(set_name: &str, pools: &[String]) -> Option<String> {
    match pools {
        [] => Some(format!(
            "set {set_name:?} matches no MachineConfigPool: nothing will be pulled anywhere; \
             label it {ROLE_LABEL}: <pool> (e.g. worker)"
        )),
        [_] => None,
        several => Some(format!(
            "set {set_name:?} matches {} pools ({}): it will be pulled on the nodes of each; \
             keep one {ROLE_LABEL} label if that is not what you want",
            several.len(),
            several.join(", ")
        )),
    }
}

/// `(updatedMachineCount, machineCount)` of the pool's PinnedImageSets synchronizer, if it reports one.
pub fn pool_rollup(pool: &MachineConfigPool) -> Option<(i64, i64)> {
    pool.status
        .pool_synchronizers_status
        .iter()
        .find(|s| s.pool_synchronizer_type == PINNED_IMAGE_SETS_SYNCHRONIZER)
        .map(|s| (s.updated_machine_count, s.machine_count))
}

/// Where one node is with one version of one set. `elapsed` is how long the node has been in that state
/// (from the condition's `lastTransitionTime`), when the daemon says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetProgress {
    Done,
    Progressing {
        elapsed: Option<Duration>,
    },
    /// The node has not seen this generation of the set yet.
    Waiting,
    Failed {
        generation: i64,
        error: String,
    },
    /// Degraded with the daemon's requeue timeout: it is still pulling.
    SlowButWorking {
        elapsed: Option<Duration>,
        message: String,
    },
    /// The node is in a targeted pool but has no MachineConfigNode: nothing reports on it.
    Unknown,
}

/// Where the node behind `mcn` is with generation `set_generation` of set `set_name`, at `now`.
pub fn node_set_state(
    mcn: &MachineConfigNode,
    set_name: &str,
    set_generation: i64,
    now: SystemTime,
) -> SetProgress {
    let Some(entry) = mcn.set_status(set_name) else {
        return SetProgress::Waiting;
    };
    let desired = entry.desired_generation.unwrap_or(0);
    if desired == 0 || desired < set_generation {
        return SetProgress::Waiting;
    }
    let elapsed = |condition: &Condition| {
        condition
            .since()
            .map(|since| now.duration_since(since).unwrap_or_default())
    };
    let progressing = mcn.condition(PROGRESSING).filter(|c| c.is_true());
    let degraded = mcn.condition(DEGRADED).filter(|c| c.is_true());
    // A failure of this generation counts while the node is Degraded; once it is not, the error is history.
    let failed_now = entry.last_failed_generation == Some(desired) && degraded.is_some();
    if entry.current_generation == Some(desired) && progressing.is_none() && !failed_now {
        return SetProgress::Done;
    }
    let degraded_message = degraded.and_then(|c| c.message.clone());
    let error = failed_now
        .then(|| entry.error().or(degraded_message.clone()))
        .flatten();
    // The requeue timeout may be told in the set's entry or only in the Degraded condition.
    let requeue = [error.as_deref(), degraded_message.as_deref()]
        .into_iter()
        .flatten()
        .find(|text| text.contains(REQUEUE_TIMEOUT));
    if let Some(message) = requeue {
        return SetProgress::SlowButWorking {
            elapsed: degraded.or(progressing).and_then(elapsed),
            message: message.to_owned(),
        };
    }
    if let Some(error) = error {
        return SetProgress::Failed {
            generation: desired,
            error,
        };
    }
    SetProgress::Progressing {
        elapsed: progressing.and_then(elapsed),
    }
}

/// The kinds pinboard watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    MachineConfigPool,
    MachineConfigNode,
    PinnedImageSet,
    ContainerRuntimeConfig,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Node,
        Kind::MachineConfigPool,
        Kind::MachineConfigNode,
        Kind::PinnedImageSet,
        Kind::ContainerRuntimeConfig,
    ];
}

/// The state of one watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    /// Listing for the first time.
    Connecting,
    /// Listed, and watching.
    Synced,
    /// The watch failed at `since` and has not recovered yet; `error` is the last failure.
    Reconnecting { since: SystemTime, error: String },
}

/// One change from the watchers: a kind's complete current list, or a watch's new connection state.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterUpdate {
    Nodes(Vec<ClusterNode>),
    Pools(Vec<MachineConfigPool>),
    MachineConfigNodes(Vec<MachineConfigNode>),
    Sets(Vec<PinnedImageSet>),
    RuntimeConfigs(Vec<ContainerRuntimeConfig>),
    Connection(Kind, Connection),
}

/// Everything pinboard knows about the cluster, kept current by applying [`ClusterUpdate`]s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// By name; replaced only through [`ClusterView::apply`], which keeps the index current.
    nodes: Vec<ClusterNode>,
    node_index: HashMap<String, usize>,
    pub pools: Vec<MachineConfigPool>,
    machine_config_nodes: Vec<MachineConfigNode>,
    /// Node name -> its MachineConfigNode's place in `machine_config_nodes`.
    mcn_index: HashMap<String, usize>,
    pub sets: Vec<PinnedImageSet>,
    pub runtime_configs: Vec<ContainerRuntimeConfig>,
    /// Per watched kind; a kind not here has not reported yet.
    pub connections: BTreeMap<Kind, Connection>,
}

impl ClusterView {
    pub fn apply(&mut self, update: ClusterUpdate) {
        match update {
            ClusterUpdate::Nodes(list) => {
                self.node_index = index(&list, |n| &n.name);
                self.nodes = list;
            }
            ClusterUpdate::Pools(list) => self.pools = list,
            ClusterUpdate::MachineConfigNodes(list) => {
                self.mcn_index = index(&list, MachineConfigNode::node_name);
                self.machine_config_nodes = list;
            }
            ClusterUpdate::Sets(list) => self.sets = list,
            ClusterUpdate::RuntimeConfigs(list) => self.runtime_configs = list,
            ClusterUpdate::Connection(kind, state) => {
                self.connections.insert(kind, state);
            }
        }
    }

    pub fn set(&self, name: &str) -> Option<&PinnedImageSet> {
        self.sets.iter().find(|s| s.name() == name)
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    pub fn machine_config_nodes(&self) -> &[MachineConfigNode] {
        &self.machine_config_nodes
    }

    pub fn node(&self, name: &str) -> Option<&ClusterNode> {
        self.node_index.get(name).map(|&i| &self.nodes[i])
    }

    /// Per pool, whether some ContainerRuntimeConfig selecting it turns lazy pulling on.
    pub fn lazy_pools(&self) -> BTreeMap<String, bool> {
        let mut pools: BTreeMap<String, bool> = self
            .pools
            .iter()
            .map(|p| (p.name().to_owned(), false))
            .collect();
        for config in self.runtime_configs.iter().filter(|c| c.lazy()) {
            for pool in config.pools(&self.pools) {
                pools.insert(pool.to_owned(), true);
            }
        }
        pools
    }

    /// The node's pool: its MachineConfigNode's `spec.pool`, else the first pool whose nodeSelector
    /// matches it.
    pub fn pool_of(&self, node: &str) -> Option<&str> {
        if let Some(mcn) = self.machine_config_node(node) {
            return Some(mcn.spec.pool.name.as_str()).filter(|p| !p.is_empty());
        }
        let labels = &self.node(node)?.labels;
        self.pools
            .iter()
            .find(|p| selector_matches(p.spec.node_selector.as_ref(), labels))
            .map(MachineConfigPool::name)
    }

    /// The MachineConfigNode of node `name`.
    pub fn machine_config_node(&self, name: &str) -> Option<&MachineConfigNode> {
        self.mcn_index
            .get(name)
            .map(|&i| &self.machine_config_nodes[i])
    }

    /// Every watch synced.
    pub fn synced(&self) -> bool {
        Kind::ALL
            .iter()
            .all(|kind| self.connections.get(kind) == Some(&Connection::Synced))
    }

    /// The connection as the status line tells it: the first watch still connecting or reconnecting (the
    /// one that has been failing longest), else synced.
    pub fn connection(&self) -> Connection {
        let reconnecting = self
            .connections
            .values()
            .filter(|c| matches!(c, Connection::Reconnecting { .. }))
            .min_by_key(|c| match c {
                Connection::Reconnecting { since, .. } => *since,
                _ => SystemTime::UNIX_EPOCH,
            });
        match reconnecting {
            Some(state) => state.clone(),
            None if self.synced() => Connection::Synced,
            None => Connection::Connecting,
        }
    }

    /// Per node of every pool the set lands in, where that node is with the set's current generation, by
    /// node name. Empty when the set is unknown. See [`ClusterView::rollout_of`].
    pub fn rollout(&self, set_name: &str, now: SystemTime) -> Vec<(String, SetProgress)> {
        let Some(set) = self.set(set_name) else {
            return Vec::new();
        };
        self.rollout_of(set_name, &set.metadata.labels, set.generation(), now)
    }

    /// Per node of every pool a set named `set_name` with `labels` lands in, where that node is with
    /// generation `generation` of it, by node name. A node is in the pool its MachineConfigNode's
    /// `spec.pool` names (its primary pool); a node without one is in every pool whose `nodeSelector`
    /// matches it, and [`SetProgress::Unknown`].
    pub fn rollout_of(
        &self,
        set_name: &str,
        labels: &BTreeMap<String, String>,
        generation: i64,
        now: SystemTime,
    ) -> Vec<(String, SetProgress)> {
        self.members(labels)
            .into_iter()
            .map(|(node, mcn)| {
                let state = mcn.map_or(SetProgress::Unknown, |mcn| {
                    node_set_state(mcn, set_name, generation, now)
                });
                (node.to_owned(), state)
            })
            .collect()
    }

    /// The nodes a set with `labels` lands on, by name (see [`ClusterView::rollout_of`]).
    pub fn nodes_of(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.members(labels)
            .into_iter()
            .map(|(node, _)| node.to_owned())
            .collect()
    }

    /// The nodes of every pool a set with `labels` lands in, by name, each with its MachineConfigNode.
    fn members(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Vec<(&str, Option<&MachineConfigNode>)> {
        let pools = pools_for_set(labels, &self.pools);
        let reported = self
            .machine_config_nodes
            .iter()
            .filter(|mcn| pools.contains(&mcn.spec.pool.name))
            .map(|mcn| (mcn.node_name(), Some(mcn)));
        let in_pool = |node: &ClusterNode| {
            self.pools.iter().any(|pool| {
                pools.iter().any(|name| name == pool.name())
                    && selector_matches(pool.spec.node_selector.as_ref(), &node.labels)
            })
        };
        let silent = self
            .nodes
            .iter()
            .filter(|node| !self.mcn_index.contains_key(&node.name) && in_pool(node))
            .map(|node| (node.name.as_str(), None));
        let mut rows: Vec<_> = reported.chain(silent).collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        rows
    }
}

/// Each item's place in `list`, by `key` (the first, should a key repeat).
fn index<T>(list: &[T], key: impl Fn(&T) -> &str) -> HashMap<String, usize> {
    let mut index = HashMap::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        index.entry(key(item).to_owned()).or_insert(i);
    }
    index
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Connection::Connecting => f.write_str("connecting"),
            Connection::Synced => f.write_str("synced"),
            Connection::Reconnecting { since, error } => {
                let since = k8s_openapi::jiff::Timestamp::try_from(*since)
                    .map_or_else(|_| "?".to_owned(), |t| t.strftime("%H:%M:%S").to_string());
                write!(f, "reconnecting since {since} UTC: {error}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn pool(name: &str, selector: serde_json::Value) -> MachineConfigPool {
        from(json!({"metadata": {"name": name}, "spec": {"machineConfigSelector": selector}}))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const T0: &str = "2026-01-01T10:00:00Z";

    fn at(seconds: u64) -> SystemTime {
        let t0: k8s_openapi::jiff::Timestamp = T0.parse().unwrap();
        SystemTime::from(t0) + Duration::from_secs(seconds)
    }

    fn mcn(sets: serde_json::Value, conditions: serde_json::Value) -> MachineConfigNode {
        from(json!({
            "metadata": {"name": "n1"},
            "spec": {"node": {"name": "n1"}, "pool": {"name": "worker"}},
            "status": {"pinnedImageSets": sets, "conditions": conditions},
        }))
    }

    fn conditions(progressing: bool, degraded: Option<&str>) -> serde_json::Value {
        let status = |b: bool| if b { "True" } else { "False" };
        json!([
            {"type": PROGRESSING, "status": status(progressing), "reason": "ImagePrefetch",
             "message": "node is prefetching images: n1", "lastTransitionTime": T0},
            {"type": DEGRADED, "status": status(degraded.is_some()), "reason": "PrefetchFailed",
             "message": degraded.unwrap_or(""), "lastTransitionTime": T0},
        ])
    }

    #[test]
    fn set_entries_in_every_shape() {
        let v1: PinnedImageSet = from(json!({
            "metadata": {"name": "s", "generation": 3, "labels": {ROLE_LABEL: "worker"}},
            "spec": {"pinnedImages": [{"name": "quay.io/a@sha256:1"}]},
        }));
        assert_eq!(v1.images().collect::<Vec<_>>(), ["quay.io/a@sha256:1"]);
        assert_eq!(v1.generation(), 3);
        let alpha: PinnedImageSet = from(json!({
            "metadata": {"name": "s"}, "spec": {"pinnedImages": ["quay.io/a@sha256:1"]},
        }));
        assert_eq!(alpha.images().collect::<Vec<_>>(), ["quay.io/a@sha256:1"]);
        let bare: PinnedImageSet = from(json!({"metadata": {"name": "s"}}));
        assert_eq!(bare.images().count(), 0);
        assert_eq!(bare.generation(), 0);
    }

    #[test]
    fn label_selectors_evaluate_like_kubernetes() {
        let l = labels(&[(ROLE_LABEL, "worker"), ("tier", "a")]);
        let sel = |v: serde_json::Value| -> LabelSelector { from(v) };
        assert!(!selector_matches(None, &l), "absent selects nothing");
        assert!(
            selector_matches(Some(&sel(json!({}))), &l),
            "empty selects all"
        );
        assert!(selector_matches(
            Some(&sel(json!({"matchLabels": {ROLE_LABEL: "worker"}}))),
            &l
        ));
        assert!(!selector_matches(
            Some(&sel(json!({"matchLabels": {ROLE_LABEL: "master"}}))),
            &l
        ));
        let expr = |op: &str, values: &[&str]| {
            sel(
                json!({"matchExpressions": [{"key": ROLE_LABEL, "operator": op, "values": values}]}),
            )
        };
        assert!(selector_matches(
            Some(&expr("In", &["master", "worker"])),
            &l
        ));
        assert!(!selector_matches(Some(&expr("In", &["master"])), &l));
        assert!(selector_matches(Some(&expr("NotIn", &["master"])), &l));
        assert!(!selector_matches(Some(&expr("NotIn", &["worker"])), &l));
        assert!(selector_matches(
            Some(&expr("NotIn", &["x"])),
            &BTreeMap::new()
        ));
        assert!(selector_matches(Some(&expr("Exists", &[])), &l));
        assert!(!selector_matches(Some(&expr("DoesNotExist", &[])), &l));
        assert!(selector_matches(
            Some(&expr("DoesNotExist", &[])),
            &BTreeMap::new()
        ));
        assert!(!selector_matches(Some(&expr("Gt", &["1"])), &l));
    }

    #[test]
    fn sets_land_in_the_pools_that_select_them() {
        let pools = [
            pool("worker", json!({"matchLabels": {ROLE_LABEL: "worker"}})),
            pool("master", json!({"matchLabels": {ROLE_LABEL: "master"}})),
            pool(
                "infra",
                json!({"matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": ["worker", "infra"]}]}),
            ),
        ];
        assert_eq!(
            pools_for_set(&labels(&[(ROLE_LABEL, "master")]), &pools),
            ["master"]
        );
        let worker = pools_for_set(&labels(&[(ROLE_LABEL, "worker")]), &pools);
        assert_eq!(worker, ["worker", "infra"]);
        let none = pools_for_set(&BTreeMap::new(), &pools);
        assert!(none.is_empty());
        assert!(
            pool_warning("s", &none)
                .unwrap()
                .contains("matches no MachineConfigPool")
        );
        assert!(
            pool_warning("s", &worker)
                .unwrap()
                .contains("2 pools (worker, infra)")
        );
        assert_eq!(pool_warning("s", &["master".to_owned()]), None);
    }

    #[test]
    fn runtime_configs_name_their_pools_and_layer_stores() {
        let mut worker = pool("worker", json!({}));
        worker.metadata.labels = labels(&[("custom-crio", "lazy")]);
        let pools = [worker, pool("master", json!({}))];
        let crc: ContainerRuntimeConfig = from(json!({"metadata": {"name": "lazy"}, "spec": {
            "machineConfigPoolSelector": {"matchLabels": {"custom-crio": "lazy"}},
            "containerRuntimeConfig": {"additionalLayerStores": [{"path": "/var/lib/stargz-store/store:ref"}]},
        }}));
        assert_eq!(crc.pools(&pools), ["worker"]);
        assert_eq!(
            crc.spec.container_runtime_config.additional_layer_stores[0].path,
            "/var/lib/stargz-store/store:ref"
        );
    }

    #[test]
    fn pool_rollup_reads_the_pinned_image_sets_synchronizer() {
        let mut p = pool("worker", json!({}));
        assert_eq!(pool_rollup(&p), None);
        p = from(
            json!({"metadata": {"name": "worker"}, "status": {"poolSynchronizersStatus": [
                {"poolSynchronizerType": "PinnedImageSets", "machineCount": 3, "updatedMachineCount": 2},
            ]}}),
        );
        assert_eq!(pool_rollup(&p), Some((2, 3)));
    }

    #[test]
    fn node_states() {
        let entry = |desired: i64, current: Option<i64>, failed: Option<(i64, &str)>| {
            json!([{"name": "s", "desiredGeneration": desired, "currentGeneration": current,
                    "lastFailedGeneration": failed.map(|f| f.0),
                    "lastFailedGenerationError": failed.map(|f| f.1)}])
        };
        let state = |m: &MachineConfigNode| node_set_state(m, "s", 2, at(90));
        let no_status: MachineConfigNode = from(json!({"metadata": {"name": "n1"}}));
        assert_eq!(state(&no_status), SetProgress::Waiting);
        assert_eq!(
            state(&mcn(json!([]), conditions(false, None))),
            SetProgress::Waiting
        );
        assert_eq!(
            state(&mcn(entry(1, Some(1), None), conditions(false, None))),
            SetProgress::Waiting
        );
        assert_eq!(
            state(&mcn(entry(2, Some(1), None), conditions(true, None))),
            SetProgress::Progressing {
                elapsed: Some(Duration::from_secs(90))
            }
        );
        assert_eq!(
            state(&mcn(entry(2, Some(2), None), conditions(false, None))),
            SetProgress::Done
        );
        assert_eq!(
            state(&mcn(
                entry(2, None, Some((2, "exit status 125: no space"))),
                conditions(false, Some("One or more"))
            )),
            SetProgress::Failed {
                generation: 2,
                error: "exit status 125: no space".into()
            }
        );
        let requeue = format!("{REQUEUE_TIMEOUT}: 3 of 9 left");
        assert_eq!(
            state(&mcn(
                entry(2, Some(1), Some((2, &requeue))),
                conditions(true, Some("One or more"))
            )),
            SetProgress::SlowButWorking {
                elapsed: Some(Duration::from_secs(90)),
                message: requeue.clone()
            }
        );
        // Told only in the Degraded condition.
        assert!(matches!(
            state(&mcn(
                entry(2, Some(1), None),
                conditions(false, Some(&requeue))
            )),
            SetProgress::SlowButWorking { .. }
        ));
        // An old failure, no longer degraded, then success.
        assert_eq!(
            state(&mcn(
                entry(2, Some(2), Some((2, "boom"))),
                conditions(false, None)
            )),
            SetProgress::Done
        );
    }

    #[test]
    fn legacy_errors_are_read() {
        let m: MachineConfigNode = from(json!({"metadata": {"name": "n1"}, "status": {
            "pinnedImageSets": [{"name": "s", "desiredGeneration": 1, "lastFailedGeneration": 1,
                                 "lastFailedGenerationErrors": ["a", "b"]}],
            "conditions": conditions(false, Some("One or more")),
        }}));
        assert_eq!(
            node_set_state(&m, "s", 1, at(0)),
            SetProgress::Failed {
                generation: 1,
                error: "a; b".into()
            }
        );
        let e: McnSetStatus = from(json!({"name": "s", "lastPinnedImageSetError": "c"}));
        assert_eq!(e.error().as_deref(), Some("c"));
    }

    #[test]
    fn nodes_and_presence() {
        let mut images: Vec<_> = (0..KUBELET_DEFAULT_MAX_IMAGES)
            .map(|i| json!({"names": [format!("quay.io/x/i{i}@sha256:{i}")], "sizeBytes": 1}))
            .collect();
        let node = |images: &[serde_json::Value]| -> ClusterNode {
            let node: Node = from(json!({
                "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}],
                    "allocatable": {"ephemeral-storage": "100Gi"},
                    "images": images,
                },
            }));
            ClusterNode::from(&node)
        };
        let full = node(&images);
        assert_eq!(full.ready, Some(true));
        assert_eq!(full.disk_pressure, Some(false));
        assert_eq!(full.allocatable_ephemeral, Some(100 << 30));
        let other = "quay.io/x/other@sha256:0";
        assert_eq!(
            full.presence("quay.io/x/i3@sha256:3", 50),
            Presence::Present
        );
        assert_eq!(full.image_list(50), ImageList::Full);
        assert_eq!(full.presence(other, 50), Presence::Unknown);
        // A kubelet allowed more, or without a limit, listed everything it has.
        assert_eq!(full.presence(other, 200), Presence::Absent);
        assert_eq!(full.presence(other, -1), Presence::Absent);
        images.pop();
        assert_eq!(node(&images).presence(other, 50), Presence::Absent);
        let bare = ClusterNode::from(&Node::default());
        assert_eq!((bare.ready, bare.image_entries), (None, 0));
        // An empty list proves nothing, whatever the limit.
        assert_eq!(bare.image_list(50), ImageList::Empty);
        assert_eq!(bare.presence(other, -1), Presence::Unknown);
    }

    #[test]
    fn kubelets_from_1_29_and_the_backports_keep_pinned_images_from_gc() {
        let honours = |version: &str| {
            ClusterNode {
                kubelet_version: Some(version.into()),
                ..ClusterNode::default()
            }
            .kubelet_honours_pins()
        };
        for yes in [
            "v1.29.0",
            "v1.33.2+a1b2c3d",
            "v1.28.2",
            "v1.27.6",
            "v1.26.9",
            "v1.25.14",
        ] {
            assert_eq!(honours(yes), Some(true), "{yes}");
        }
        for no in [
            "v1.28.1", "v1.27.5", "v1.26.8", "v1.25.13", "v1.24.17", "v1.20.2",
        ] {
            assert_eq!(honours(no), Some(false), "{no}");
        }
        assert_eq!(honours("unknown"), None);
        assert_eq!(ClusterNode::default().kubelet_honours_pins(), None);
    }

    #[test]
    fn view_applies_updates_and_rolls_out() {
        let mut view = ClusterView::default();
        assert_eq!(view.connection(), Connection::Connecting);
        for kind in Kind::ALL {
            view.apply(ClusterUpdate::Connection(kind, Connection::Synced));
        }
        assert_eq!(view.connection(), Connection::Synced);
        let broken = Connection::Reconnecting {
            since: at(5),
            error: "refused".into(),
        };
        view.apply(ClusterUpdate::Connection(Kind::Node, broken.clone()));
        assert_eq!(view.connection(), broken);
        assert_eq!(
            broken.to_string(),
            "reconnecting since 10:00:05 UTC: refused"
        );

        let worker: MachineConfigPool = from(json!({"metadata": {"name": "worker"}, "spec": {
            "machineConfigSelector": {"matchLabels": {ROLE_LABEL: "worker"}},
            "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
        }}));
        view.apply(ClusterUpdate::Pools(vec![worker]));
        let node = |name: &str, role: &str| ClusterNode {
            name: name.into(),
            labels: labels(&[(&format!("node-role.kubernetes.io/{role}"), "")]),
            ..ClusterNode::default()
        };
        view.apply(ClusterUpdate::Nodes(vec![
            node("n1", "worker"),
            node("n5", "worker"),
            node("n6", "master"),
        ]));
        view.apply(ClusterUpdate::Sets(vec![from(json!({
            "metadata": {"name": "s", "generation": 1, "labels": {ROLE_LABEL: "worker"}},
        }))]));
        let mut other = mcn(json!([]), json!([]));
        other.spec.pool.name = "master".into();
        other.spec.node.name = "n9".into();
        view.apply(ClusterUpdate::MachineConfigNodes(vec![
            mcn(
                json!([{"name": "s", "desiredGeneration": 1, "currentGeneration": 1}]),
                json!([]),
            ),
            other,
        ]));
        assert_eq!(
            view.rollout("s", at(0)),
            [
                ("n1".to_owned(), SetProgress::Done),
                ("n5".to_owned(), SetProgress::Unknown)
            ]
        );
        assert!(view.rollout("missing", at(0)).is_empty());
    }
}

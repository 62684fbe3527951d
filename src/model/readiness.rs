//! Readiness: is every image of a set on every target node, and pinned as the node enforces it? The one
//! function behind `pinboard check`, `status`, the end of headless `apply`, and the wait loop: what a node
//! was observed to hold ([`NodeObserved`]) goes in, per node and per image facts with reasons come out
//! ([`NodeReadiness`]), and [`Readiness::of`] gives the overall verdict. Pure: no I/O.
//!
//! Direct mode: where the runtime reports pins (CRI `pinned`: CRI-O, containerd from 1.6.22 / 1.7.3, see
//! [`super::runtime`]), its word decides; the node's pin record (the CRI-O files' effective
//! `pinned_images`, [`super::crio`]) then only explains a disagreement. Where it cannot report, the record
//! decides: the effective CRI-O config, or the containerd pin label. Unknown stays unknown and is never
//! ready.
//!
//! Cluster mode ([`assess_cluster`]): the machine-config daemon's report is the proof that a node pulled and
//! pinned a set. A node is ready for a set when its MachineConfigNode reports the set's current generation
//! as both desired and current, no Degraded condition stands for it, and the Node is Ready.
//! `Node.status.images` can only contradict that: when the kubelet's list is complete (shorter than its
//! `nodeStatusMaxImages`, read from the kubelet's `/configz`, or that is -1) and lacks an image of the set,
//! the node is not ready. An empty list, or a full one silent about an image, proves nothing either way.
//! Each image says what decided it ([`Evidence`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterView, ImageList, KubeletSettings, NodeSetState, NodeView, Presence};
use super::crio::{CrioConfig, Unpinned, explain_unpinned};
use super::holders::{HeldBy, Holders};
use super::plan::{NodePlan, Verdict};
use super::rollout::PinMethod;
use super::set::ImageSet;
use super::units::{clock, human};

/// What was observed on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObserved {
    pub node: String,
    /// `containerd 1.6.20`.
    pub runtime: Option<String>,
    /// Why the node could not be reached; nothing else is known then.
    pub unreachable: Option<String>,
    /// Why the runtime says it is not ready (CRI Status), when it does.
    pub not_ready: Option<String>,
    pub pin_method: Option<PinMethod>,
    /// CRI-O nodes: what its files pin, to judge from or to explain a disagreement with the runtime.
    pub crio: Option<CrioObserved>,
    /// Why some image could not be observed (ImageStatus failed, the pin record could not be read).
    pub error: Option<String>,
    /// In set order.
    pub images: Vec<ImageObserved>,
}

/// A CRI-O node's configuration as pinboard read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrioObserved {
    /// `CRI-O 1.29.2`.
    pub runtime: String,
    pub version: Option<super::runtime::Version>,
    pub config: CrioConfig,
}

/// One image on one node. None: could not be asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageObserved {
    pub reference: String,
    /// The runtime has it (ListImages or ImageStatus).
    pub present: Option<bool>,
    /// The runtime's `pinned`: only set where the runtime reports pins, and only for a present image.
    pub reported_pinned: Option<bool>,
    /// The node's pin record: the effective CRI-O `pinned_images` matches it, or the containerd pin label
    /// is set.
    pub recorded_pinned: Option<bool>,
    /// Every name the runtime knows it by (repo tags and digests); empty when it is missing.
    pub names: Vec<String>,
    /// A pull of the (missing) image the runtime is running now, where it tells (containerd).
    pub pulling: Option<PullSeen>,
    /// Who holds its pin, by the node's record (drop-in marks, holder labels); None: could not be read.
    pub holders: Option<Holders>,
}

/// A pull in flight, as the runtime's content ingests show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullSeen {
    /// Since the first of its blobs started.
    pub running_seconds: Option<u64>,
    /// Since any of its blobs last got bytes.
    pub idle_seconds: Option<u64>,
    /// Blobs being written.
    pub blobs: usize,
    /// Written so far of the blobs being written, out of their sizes.
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// A pull without bytes for this long is said to look stuck (the TUI's default `--stall-after`).
const STUCK_AFTER_SECONDS: u64 = 60;

/// What decided whether a node's images are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PinnedBy {
    /// The runtime's own word (CRI `pinned`).
    Runtime,
    /// pinboard's record: the effective CRI-O config or the containerd label (the runtime cannot report).
    Record,
}

/// Why an image is not ready on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageReason {
    Missing,
    /// Missing, and the runtime is pulling it now.
    Pulling,
    NotPinned,
    /// The node or its pin record could not be asked.
    Unknown,
}

impl ImageReason {
    /// How tables and messages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageReason::Missing => "missing",
            ImageReason::Pulling => "pulling",
            ImageReason::NotPinned => "present but not pinned",
            ImageReason::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReadiness {
    #[serde(rename = "ref")]
    pub reference: String,
    pub present: Option<bool>,
    pub pinned: Option<bool>,
    /// None when the image is present and pinned.
    pub reason: Option<ImageReason>,
    /// The pull in flight, when the reason is `pulling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulling: Option<PullSeen>,
    /// What the judgement rests on.
    #[serde(default)]
    pub evidence: Evidence,
    /// Direct mode: who holds its pin, by the node's record (sets, an administrator, unowned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<HeldBy>,
}

/// What an image's judgement rests on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// The runtime, asked over its CRI socket.
    Runtime,
    /// The kubelet's `Node.status.images`, when it names the image or is complete without it.
    KubeletList,
    /// The machine-config daemon's report on the node's MachineConfigNode.
    Daemon,
    /// Nothing could be asked, or nothing that was asked can tell.
    #[default]
    None,
}

impl Evidence {
    /// How tables and the TUI say it.
    pub fn words(self) -> &'static str {
        match self {
            Evidence::Runtime => "the runtime's word",
            Evidence::KubeletList => "the kubelet's image list",
            Evidence::Daemon => "daemon's report",
            Evidence::None => "nothing to go by",
        }
    }
}

/// One node's readiness, as `status` and `check` print it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReadiness {
    pub node: String,
    pub runtime: Option<String>,
    pub reachable: bool,
    /// `crio-drop-in` or `containerd-label`, as a nodes file names them; None when unknown.
    pub pin_method: Option<String>,
    /// What decided `pinned`; None when nothing could (unreachable, or no image present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<PinnedBy>,
    pub ready: bool,
    /// Why the node is not ready, one sentence each, with what to do.
    pub reasons: Vec<String>,
    pub images: Vec<ImageReadiness>,
    /// Cluster mode: each set that lands on the node, as its MachineConfigNode reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sets: Vec<SetOnNode>,
    /// Cluster mode: what the node's kubelet lists and how it is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletReport>,
    /// What is worth knowing but does not make the node not ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Cluster mode: the node's kubelet as far as readiness is concerned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletReport {
    #[serde(flatten)]
    pub settings: KubeletSettings,
    /// Entries in `Node.status.images`.
    pub image_entries: usize,
    /// Whether that list names every image the node holds.
    pub image_list_complete: bool,
    /// How many of this node's images of the sets it names.
    pub images_listed: usize,
}

/// Cluster mode: one set on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetOnNode {
    pub name: String,
    /// The set's generation the node must reach; None when the set is not on the cluster.
    pub generation: Option<i64>,
    /// From the node's MachineConfigNode `status.pinnedImageSets[]` entry.
    pub desired_generation: Option<i64>,
    pub current_generation: Option<i64>,
    pub last_failed_generation: Option<i64>,
    /// `done`, `pulling`, `slow`, `waiting`, `failed`, `unknown` ([`NodeSetState::word`]), or `absent`
    /// when the set is not on the cluster.
    pub state: String,
    pub error: Option<String>,
    /// How long the node has been pulling (from the condition's lastTransitionTime).
    pub elapsed_seconds: Option<u64>,
}

/// Cluster mode: a set to check, and the generation nodes must reach at least (e.g. the one `apply` just
/// wrote while the watch may still show an older one). The set's labels decide its pools when it is not on
/// the cluster; otherwise the cluster's labels count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedSet {
    pub set: ImageSet,
    pub min_generation: i64,
}

impl WantedSet {
    /// The labels that decide the set's pools: the cluster's, when the set is there, else its own.
    pub fn labels<'a>(&'a self, view: &'a ClusterView) -> &'a BTreeMap<String, String> {
        view.set(&self.set.name)
            .map_or(&self.set.labels, |s| &s.metadata.labels)
    }
}

/// The verdict over every node, as `check` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    pub ready: bool,
    pub ready_nodes: usize,
    pub nodes: Vec<NodeReadiness>,
}

/// The per-node data without a verdict, as `status` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodesStatus {
    pub nodes: Vec<NodeReadiness>,
}

/// The name a nodes file uses for a pin method.
pub fn pin_method_name(method: PinMethod) -> &'static str {
    match method {
        PinMethod::CrioDropIn => "crio-drop-in",
        PinMethod::ContainerdLabel => "containerd-label",
    }
}

/// Whether an image is pinned: the runtime's word where it reports pins (the observation leaves it unset
/// where it cannot), else the node's pin record; otherwise unknown.
fn pinned(image: &ImageObserved) -> Option<bool> {
    image.reported_pinned.or(image.recorded_pinned)
}

fn image_readiness(image: &ImageObserved) -> ImageReadiness {
    let pinned = pinned(image);
    let pulling = image
        .pulling
        .clone()
        .filter(|_| image.present == Some(false));
    let reason = match (image.present, pinned) {
        (None, _) => Some(ImageReason::Unknown),
        (Some(false), _) if pulling.is_some() => Some(ImageReason::Pulling),
        (Some(false), _) => Some(ImageReason::Missing),
        (Some(true), Some(false)) => Some(ImageReason::NotPinned),
        (Some(true), None) => Some(ImageReason::Unknown),
        (Some(true), Some(true)) => None,
    };
    ImageReadiness {
        reference: image.reference.clone(),
        present: image.present,
        pinned,
        reason,
        pulling,
        evidence: match image.present {
            Some(_) => Evidence::Runtime,
            None => Evidence::None,
        },
        held_by: image.holders.as_ref().map(HeldBy::from),
    }
}

/// `for 2m10s, 40.00 MiB of 120.00 MiB in 3 blobs, no bytes for 95s: looks stuck`.
fn pull_words(pull: &PullSeen) -> String {
    let mut words = Vec::new();
    if let Some(running) = pull.running_seconds {
        words.push(format!("for {}", clock(Duration::from_secs(running))));
    }
    words.push(format!(
        "{} of {} in {} blob{}",
        human(pull.done_bytes),
        human(pull.total_bytes),
        pull.blobs,
        if pull.blobs == 1 { "" } else { "s" }
    ));
    match pull.idle_seconds {
        Some(idle) if idle >= STUCK_AFTER_SECONDS => words.push(format!(
            "no bytes for {}: looks stuck, check the node's link to the registry",
            clock(Duration::from_secs(idle))
        )),
        Some(idle) => words.push(format!("last bytes {}s ago", idle)),
        None => {}
    }
    words.join(", ")
}

/// The references of the images not ready for `reason`.
fn with_reason(images: &[ImageReadiness], reason: ImageReason) -> Vec<&str> {
    images
        .iter()
        .filter(|i| i.reason == Some(reason))
        .map(|i| i.reference.as_str())
        .collect()
}

/// How many references a reason names before it says how many more there are (JSON has them all).
const NAMED_IN_A_REASON: usize = 5;

/// `a, b, c` or, for a long list, its first few and `and 104 more`.
fn some_of<S: AsRef<str>>(references: &[S]) -> String {
    let named: Vec<&str> = references
        .iter()
        .take(NAMED_IN_A_REASON)
        .map(AsRef::as_ref)
        .collect();
    match references.len().saturating_sub(NAMED_IN_A_REASON) {
        0 => named.join(", "),
        more => format!("{} and {more} more", named.join(", ")),
    }
}

/// `1 image` / `3 images`.
fn count_images(n: usize) -> String {
    format!("{n} image{}", if n == 1 { "" } else { "s" })
}

/// What decided the pins of a node's present images.
fn pinned_by(images: &[ImageObserved]) -> Option<PinnedBy> {
    let present = images.iter().filter(|i| i.present == Some(true));
    present
        .map(|i| match (i.reported_pinned, i.recorded_pinned) {
            (Some(_), _) => Some(PinnedBy::Runtime),
            (None, Some(_)) => Some(PinnedBy::Record),
            (None, None) => None,
        })
        .find(Option::is_some)
        .flatten()
}

/// One node's readiness from what was observed there. `plan`, when given, is the node's plan for the same
/// images: a `no-space` verdict says why missing images cannot be pre-loaded.
pub fn assess(observed: &NodeObserved, plan: Option<&NodePlan>) -> NodeReadiness {
    let images: Vec<ImageReadiness> = observed.images.iter().map(image_readiness).collect();
    let mut reasons = Vec::new();
    if let Some(error) = &observed.unreachable {
        reasons.push(format!(
            "unreachable: {error}; check that the runtime is running and the endpoint is right"
        ));
    } else {
        if let Some(why) = &observed.not_ready {
            reasons.push(format!(
                "node not ready: the runtime reports {why}; pulls fail until it recovers"
            ));
        }
        let with = |reason| with_reason(&images, reason);
        let missing = with(ImageReason::Missing);
        if !missing.is_empty() {
            reasons.push(format!(
                "{} missing: {}; `pinboard apply` pre-loads and pins them",
                count_images(missing.len()),
                some_of(&missing)
            ));
        }
        let pulling: Vec<String> = images
            .iter()
            .filter_map(|i| {
                Some(format!(
                    "{} ({})",
                    i.reference,
                    pull_words(i.pulling.as_ref()?)
                ))
            })
            .collect();
        if !pulling.is_empty() {
            reasons.push(format!(
                "{} pulling now: {}",
                count_images(pulling.len()),
                some_of(&pulling)
            ));
        }
        if let Some(plan) = plan.filter(|p| p.verdict == Verdict::NoSpace && !missing.is_empty()) {
            reasons.push(format!(
                "no space (plan verdict no-space): {}; free space on the image filesystem or apply with --force",
                plan.reasons.join("; ")
            ));
        }
        let unpinned = with(ImageReason::NotPinned);
        // CRI-O: images its files list but it does not pin are explained by file, cause and fix.
        let unpinned = match &observed.crio {
            Some(crio) if !unpinned.is_empty() => {
                let images = observed
                    .images
                    .iter()
                    .filter(|i| unpinned.contains(&i.reference.as_str()))
                    .map(|i| Unpinned {
                        reference: &i.reference,
                        names: &i.names,
                    });
                let (explained, rest) =
                    explain_unpinned(&crio.runtime, crio.version, &crio.config, images);
                reasons.extend(explained);
                rest
            }
            _ => unpinned,
        };
        if !unpinned.is_empty() {
            reasons.push(format!(
                "{} present but not pinned: {}; `pinboard apply` pins them",
                count_images(unpinned.len()),
                some_of(&unpinned)
            ));
        }
        let unknown = with(ImageReason::Unknown);
        if !unknown.is_empty() {
            let why = observed
                .error
                .as_deref()
                .unwrap_or("the runtime did not answer ImageStatus");
            reasons.push(format!(
                "{} unknown: {}: {why}",
                count_images(unknown.len()),
                some_of(&unknown)
            ));
        }
    }
    NodeReadiness {
        node: observed.node.clone(),
        runtime: observed.runtime.clone(),
        reachable: observed.unreachable.is_none(),
        pin_method: observed.pin_method.map(|m| pin_method_name(m).to_string()),
        pinned_by: pinned_by(&observed.images),
        ready: reasons.is_empty(),
        reasons,
        images,
        sets: Vec::new(),
        kubelet: None,
        warnings: Vec::new(),
    }
}

/// Cluster mode: every node of every pool a wanted set lands in, judged from the watched view at `now`.
/// `kubelets` holds what each node's kubelet configuration says (read from `/configz`); a node missing from
/// it is judged with the kubelet's defaults. Nodes by name; each node's images are the union of its sets'
/// images, in set order.
pub fn assess_cluster(
    view: &ClusterView,
    wanted: &[WantedSet],
    kubelets: &HashMap<String, KubeletSettings>,
    now: SystemTime,
) -> Vec<NodeReadiness> {
    let sets: Vec<SetOnCluster> = wanted.iter().map(|w| SetOnCluster::new(view, w)).collect();
    let mut per_node: BTreeMap<String, Vec<(&SetOnCluster, NodeSetState)>> = BTreeMap::new();
    for set in &sets {
        let name = &set.wanted.set.name;
        let labels = set.wanted.labels(view);
        let generation = set.generation.unwrap_or(set.wanted.min_generation);
        for (node, state) in view.rollout_of(name, labels, generation, now) {
            per_node.entry(node).or_default().push((set, state));
        }
    }
    let not_asked = KubeletSettings::assumed("its kubelet was not asked");
    per_node
        .into_iter()
        .map(|(node, sets)| {
            let kubelet = kubelets.get(&node).unwrap_or(&not_asked);
            assess_node(view, &node, &sets, kubelet)
        })
        .collect()
}

/// Cluster mode, for one node (the TUI's selected row): [`assess_cluster`] of the wanted sets that land on
/// it; None when none does.
pub fn assess_cluster_node(
    view: &ClusterView,
    wanted: &[WantedSet],
    kubelets: &HashMap<String, KubeletSettings>,
    node: &str,
    now: SystemTime,
) -> Option<NodeReadiness> {
    let node_view = view.node(node)?;
    let sets: Vec<SetOnCluster> = wanted
        .iter()
        .filter(|w| view.nodes_of(w.labels(view)).iter().any(|n| n == node))
        .map(|w| SetOnCluster::new(view, w))
        .collect();
    if sets.is_empty() {
        return None;
    }
    let states: Vec<(&SetOnCluster, NodeSetState)> = sets
        .iter()
        .map(|set| {
            let generation = set.generation.unwrap_or(set.wanted.min_generation);
            let state = node_view.set_state(view, &set.wanted.set.name, generation, now);
            (set, state)
        })
        .collect();
    let not_asked = KubeletSettings::assumed("its kubelet was not asked");
    let kubelet = kubelets.get(node).unwrap_or(&not_asked);
    Some(assess_node(view, node, &states, kubelet))
}

/// What is judged the same way on every node a wanted set lands on: worked out once per set.
struct SetOnCluster<'a> {
    wanted: &'a WantedSet,
    /// The generation nodes must reach; None when the set is not on the cluster.
    generation: Option<i64>,
    /// The images of the set as the cluster has it.
    listed: HashSet<&'a str>,
    /// Why the cluster's set is not the wanted one: it is missing, or lacks some of its images.
    not_as_wanted: Option<String>,
    /// Whether some node's daemon has reported on the set: a node of its pools that has not was added
    /// after it was applied.
    reported_somewhere: bool,
}

impl<'a> SetOnCluster<'a> {
    fn new(view: &'a ClusterView, wanted: &'a WantedSet) -> SetOnCluster<'a> {
        let name = &wanted.set.name;
        let on_cluster = view.set(name);
        let listed: HashSet<&str> = on_cluster.into_iter().flat_map(|s| s.images()).collect();
        let unlisted: Vec<&str> = wanted
            .set
            .references()
            .filter(|r| !listed.contains(r))
            .collect();
        let not_as_wanted = match on_cluster {
            None => Some(format!(
                "set {name:?} is not on the cluster: `pinboard apply --set FILE` creates it"
            )),
            Some(_) if !unlisted.is_empty() => Some(format!(
                "set {name:?} on the cluster does not list {}: {}; `pinboard apply --set FILE` updates it",
                count_images(unlisted.len()),
                some_of(&unlisted)
            )),
            Some(_) => None,
        };
        let reported_somewhere = view.machine_config_nodes().iter().any(|mcn| {
            mcn.set_status(name)
                .is_some_and(|e| e.desired_generation.unwrap_or(0) > 0)
        });
        SetOnCluster {
            wanted,
            generation: on_cluster.map(|s| s.generation().max(wanted.min_generation)),
            listed,
            not_as_wanted,
            reported_somewhere,
        }
    }
}

/// One image on one node in cluster mode: a set done with it (the daemon's report) makes it present and
/// pinned unless the kubelet's complete list lacks it; otherwise the kubelet's list says what it can.
fn cluster_image(reference: &str, done: bool, presence: Option<Presence>) -> ImageReadiness {
    let (present, pinned, evidence) = match (done, presence) {
        (true, Some(Presence::Absent)) => (Some(false), Some(true), Evidence::KubeletList),
        (true, _) => (Some(true), Some(true), Evidence::Daemon),
        (false, Some(Presence::Present)) => (Some(true), Some(false), Evidence::KubeletList),
        (false, Some(Presence::Absent)) => (Some(false), Some(false), Evidence::KubeletList),
        (false, Some(Presence::Unknown) | None) => (None, Some(false), Evidence::None),
    };
    let mut image = image_readiness(&ImageObserved {
        reference: reference.to_owned(),
        present,
        recorded_pinned: pinned,
        ..ImageObserved::default()
    });
    image.evidence = evidence;
    image
}

fn assess_node(
    view: &ClusterView,
    node: &str,
    sets: &[(&SetOnCluster, NodeSetState)],
    kubelet: &KubeletSettings,
) -> NodeReadiness {
    let node_view = view.node(node);
    let mcn = view.machine_config_node(node);
    let max_images = kubelet.node_status_max_images;
    let mut reasons = Vec::new();
    match node_view.map(|n| n.ready) {
        None => reasons.push(format!(
            "no Node object {node:?}: its MachineConfigNode names a node the cluster does not have"
        )),
        Some(Some(false)) => reasons.push(
            "node not ready: the kubelet reports Ready=False, so nothing is pulled or pinned there"
                .into(),
        ),
        Some(_) => {}
    }
    let mut on_node = Vec::new();
    let mut images: Vec<ImageReadiness> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut lacking_done: Vec<String> = Vec::new();
    for (on_cluster, state) in sets {
        let (wanted, generation) = (on_cluster.wanted, on_cluster.generation);
        let entry = mcn.and_then(|m| m.set_status(&wanted.set.name));
        if let Some(generation) = generation {
            let joined = on_cluster.reported_somewhere
                && entry.is_none()
                && matches!(state, NodeSetState::Waiting | NodeSetState::Unknown);
            reasons.extend(match joined {
                true => Some(format!(
                    "set {:?}: joined pool {} after the set was applied; its machine-config daemon has \
                     not reported on this node yet",
                    wanted.set.name,
                    view.pool_of(node).unwrap_or("?")
                )),
                false => {
                    let desired = entry.and_then(|e| e.desired_generation);
                    set_state_reason(&wanted.set.name, generation, desired, state)
                }
            });
        }
        reasons.extend(on_cluster.not_as_wanted.clone());
        for reference in wanted.set.references() {
            let done = *state == NodeSetState::Done && on_cluster.listed.contains(reference);
            let presence = node_view.map(|n| n.presence(reference, max_images));
            let image = cluster_image(reference, done, presence);
            if done && image.present == Some(false) && !lacking_done.iter().any(|r| r == reference)
            {
                lacking_done.push(reference.to_owned());
            }
            match position.get(reference) {
                // An image in several sets is pinned when any of them is done with it.
                Some(&i) if done => images[i] = image,
                Some(_) => {}
                None => {
                    position.insert(reference.to_owned(), images.len());
                    images.push(image);
                }
            }
        }
        let elapsed = match state {
            NodeSetState::Progressing { elapsed }
            | NodeSetState::SlowButWorking { elapsed, .. } => elapsed.map(|d| d.as_secs()),
            _ => None,
        };
        on_node.push(SetOnNode {
            name: wanted.set.name.clone(),
            generation,
            desired_generation: entry.and_then(|e| e.desired_generation),
            current_generation: entry.and_then(|e| e.current_generation),
            last_failed_generation: entry.and_then(|e| e.last_failed_generation),
            state: if generation.is_some() {
                state.word()
            } else {
                "absent"
            }
            .into(),
            error: match state {
                NodeSetState::Failed { error, .. } => Some(error.clone()),
                NodeSetState::SlowButWorking { message, .. } => Some(message.clone()),
                _ => None,
            },
            elapsed_seconds: elapsed,
        });
    }
    let report = node_view.map(|n| kubelet_report(n, kubelet, &images));
    let list_words = report.as_ref().map_or_else(String::new, |r| {
        format!("{} of {}", r.image_entries, r.settings.max_images_words())
    });
    if !lacking_done.is_empty() {
        reasons.push(format!(
            "the kubelet's complete image list ({list_words}) lacks {}: {}; the machine-config daemon \
             reported the set done, so the image was removed since (image GC, or `crictl rmi`), and the \
             daemon pulls it again only for a new generation of the set",
            count_images(lacking_done.len()),
            some_of(&lacking_done)
        ));
    }
    let missing: Vec<&str> = with_reason(&images, ImageReason::Missing)
        .into_iter()
        .filter(|r| !lacking_done.iter().any(|l| l == r))
        .collect();
    if !missing.is_empty() {
        reasons.push(format!(
            "the kubelet's complete image list ({list_words}) lacks {}: {}",
            count_images(missing.len()),
            some_of(&missing)
        ));
    }
    NodeReadiness {
        node: node.to_owned(),
        runtime: node_view.and_then(|n| n.runtime.clone()),
        reachable: true,
        pin_method: Some(MACHINE_CONFIG_PINS.into()),
        pinned_by: None,
        ready: reasons.is_empty(),
        reasons,
        images,
        sets: on_node,
        warnings: node_view.map_or_else(Vec::new, |n| kubelet_warnings(n, kubelet)),
        kubelet: report,
    }
}

fn kubelet_report(
    node: &NodeView,
    settings: &KubeletSettings,
    images: &[ImageReadiness],
) -> KubeletReport {
    KubeletReport {
        settings: settings.clone(),
        image_entries: node.image_entries,
        image_list_complete: node.image_list(settings.node_status_max_images)
            == ImageList::Complete,
        images_listed: images
            .iter()
            .filter(|i| node.images.contains(&i.reference))
            .count(),
    }
}

/// What a cluster node's kubelet makes worth knowing: its configuration could not be read, or it is too
/// old to keep pinned images from image GC.
fn kubelet_warnings(node: &NodeView, settings: &KubeletSettings) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(why) = &settings.assumed {
        warnings.push(format!(
            "the kubelet's configuration could not be read ({why}): assumed its defaults \
             (nodeStatusMaxImages {}, image GC thresholds {}% / {}%)",
            settings.node_status_max_images,
            settings.image_gc_high_threshold_percent,
            settings.image_gc_low_threshold_percent
        ));
    }
    warnings.extend(node.pins_ignored_warning());
    warnings
}

/// How cluster-mode nodes pin: the machine-config daemon writes CRI-O's drop-in from PinnedImageSets.
pub const MACHINE_CONFIG_PINS: &str = "pinned-image-set";

/// Why a node is not done with generation `generation` of set `name`; None when it is.
fn set_state_reason(
    name: &str,
    generation: i64,
    desired: Option<i64>,
    state: &NodeSetState,
) -> Option<String> {
    let took = |elapsed: &Option<std::time::Duration>| {
        elapsed.map_or_else(String::new, |d| format!(" for {}", clock(d)))
    };
    Some(match state {
        NodeSetState::Done => return None,
        NodeSetState::Waiting => format!(
            "set {name:?}: the node has not seen generation {generation} yet ({}); the machine-config \
             daemon picks it up next",
            desired.map_or(
                "its MachineConfigNode has no entry for the set".into(),
                |d| { format!("its MachineConfigNode wants generation {d}") }
            )
        ),
        NodeSetState::Progressing { elapsed } => {
            format!(
                "set {name:?} generation {generation}: pulling{}",
                took(elapsed)
            )
        }
        NodeSetState::SlowButWorking { elapsed, message } => format!(
            "set {name:?} generation {generation}: still pulling{} (the daemon's sync window ended and it \
             carries on: {message})",
            took(elapsed)
        ),
        NodeSetState::Failed { generation, error } => {
            format!("set {name:?} generation {generation} failed: {error}")
        }
        NodeSetState::Unknown => format!(
            "set {name:?}: no MachineConfigNode reports on this node, so nothing shows the set there; \
             check that the machine-config daemon runs on it"
        ),
    })
}

impl NodeReadiness {
    /// A few words for a progress line or a table cell: `ready`, `unreachable`, `3 images missing, 1 not
    /// pinned`, `ocp-4.19 pulling 3m05s, 2 images missing`.
    pub fn summary(&self) -> String {
        if !self.reachable {
            return "unreachable".into();
        }
        let count = |reason| {
            self.images
                .iter()
                .filter(|i| i.reason == Some(reason))
                .count()
        };
        let sets = self.sets.iter().filter(|s| s.state != "done").map(|s| {
            let elapsed = s.elapsed_seconds.map_or_else(String::new, |e| {
                format!(" {}", clock(Duration::from_secs(e)))
            });
            format!("{} {}{elapsed}", s.name, s.state)
        });
        let parts: Vec<String> = sets
            .chain(
                [
                    (ImageReason::Missing, "missing"),
                    (ImageReason::Pulling, "pulling"),
                    (ImageReason::NotPinned, "not pinned"),
                    (ImageReason::Unknown, "unknown"),
                ]
                .into_iter()
                .filter_map(|(reason, word)| match count(reason) {
                    0 => None,
                    n => Some(format!("{} {word}", count_images(n))),
                }),
            )
            .collect();
        if parts.is_empty() {
            if self.ready { "ready" } else { "not ready" }.into()
        } else {
            parts.join(", ")
        }
    }
}

impl NodeReadiness {
    /// What the judgement rests on, in words, for tables and the TUI: `daemon's report; the kubelet lists
    /// 50 of 190 images`, `the runtime's word`. None when nothing could be asked.
    pub fn evidence_words(&self) -> Option<String> {
        let has = |evidence| self.images.iter().any(|i| i.evidence == evidence);
        let strongest = [Evidence::Runtime, Evidence::Daemon, Evidence::KubeletList]
            .into_iter()
            .find(|e| has(*e))?;
        Some(match &self.kubelet {
            Some(kubelet) if strongest != Evidence::Runtime => format!(
                "{}; the kubelet lists {} of {} images",
                strongest.words(),
                kubelet.images_listed,
                self.images.len()
            ),
            _ => strongest.words().to_owned(),
        })
    }

    /// `check --verify-cri`: this cluster node's judgement confirmed by its runtime's (`runtime`, judged by
    /// [`assess`] for the same images): ready only when both are, and the images are the runtime's.
    pub fn confirmed_by(mut self, runtime: NodeReadiness) -> NodeReadiness {
        self.ready &= runtime.ready;
        self.reasons.extend(
            runtime
                .reasons
                .into_iter()
                .map(|r| format!("its runtime says: {r}")),
        );
        self.images = runtime.images;
        self.pinned_by = runtime.pinned_by;
        self.runtime = runtime.runtime.or(self.runtime);
        self
    }
}

impl Readiness {
    /// Ready when there is at least one node and every node is ready.
    pub fn of(nodes: Vec<NodeReadiness>) -> Readiness {
        let ready_nodes = nodes.iter().filter(|n| n.ready).count();
        Readiness {
            ready: !nodes.is_empty() && ready_nodes == nodes.len(),
            ready_nodes,
            nodes,
        }
    }

    /// `2/3 nodes ready; n2: 3 images missing; n3: unreachable`.
    pub fn progress_line(&self) -> String {
        let mut line = format!("{}/{} nodes ready", self.ready_nodes, self.nodes.len());
        for node in self.nodes.iter().filter(|n| !n.ready) {
            line.push_str(&format!("; {}: {}", node.node, node.summary()));
        }
        line
    }

    /// One line per reason of every node not ready, naming the node: what `check` says on stderr.
    pub fn reason_lines(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flat_map(|n| n.reasons.iter().map(move |r| format!("{}: {r}", n.node)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(
        reference: &str,
        present: Option<bool>,
        reported: Option<bool>,
        recorded: Option<bool>,
    ) -> ImageObserved {
        ImageObserved {
            reference: reference.into(),
            present,
            reported_pinned: reported,
            recorded_pinned: recorded,
            names: Vec::new(),
            pulling: None,
            holders: None,
        }
    }

    fn node(images: Vec<ImageObserved>) -> NodeObserved {
        NodeObserved {
            node: "n1".into(),
            runtime: Some("containerd 1.6.20".into()),
            pin_method: Some(PinMethod::ContainerdLabel),
            images,
            ..NodeObserved::default()
        }
    }

    #[test]
    fn the_runtimes_word_wins_and_the_record_decides_only_where_it_cannot_report() {
        let n = assess(
            &node(vec![
                image("a", Some(true), Some(true), Some(false)),
                image("b", Some(true), None, Some(true)),
            ]),
            None,
        );
        assert!(n.ready, "{n:?}");
        assert!(n.reasons.is_empty());
        assert_eq!(n.summary(), "ready");
        assert_eq!(n.pin_method.as_deref(), Some("containerd-label"));
        assert_eq!(n.pinned_by, Some(PinnedBy::Runtime));
        assert!(
            n.images
                .iter()
                .all(|i| i.pinned == Some(true) && i.reason.is_none())
        );
        // The record says pinned, the runtime says no: not pinned.
        let n = assess(
            &node(vec![image("a", Some(true), Some(false), Some(true))]),
            None,
        );
        assert_eq!(n.images[0].reason, Some(ImageReason::NotPinned));
        assert!(!n.ready);
        let by_record = assess(&node(vec![image("a", Some(true), None, Some(true))]), None);
        assert_eq!(by_record.pinned_by, Some(PinnedBy::Record));
        assert!(by_record.ready);
    }

    /// A CRI-O node whose files set `pinned_images` as given.
    fn crio_node(
        version: &str,
        files: &[(&str, &str)],
        images: Vec<ImageObserved>,
    ) -> NodeObserved {
        let config = CrioConfig::read(files.iter().map(|(file, patterns)| {
            (
                file.to_string(),
                format!("[crio.image]\npinned_images = [{patterns}]\n"),
            )
        }))
        .unwrap();
        NodeObserved {
            node: "n2".into(),
            runtime: Some(format!("cri-o {version}")),
            pin_method: Some(PinMethod::CrioDropIn),
            crio: Some(CrioObserved {
                runtime: format!("CRI-O {version}"),
                version: super::super::runtime::Version::parse(version),
                config,
            }),
            images,
            ..NodeObserved::default()
        }
    }

    #[test]
    fn crio_says_why_it_does_not_pin_what_its_files_list() {
        let listed = |r: &str| {
            let mut i = image(r, Some(true), Some(false), Some(true));
            i.names = vec![r.to_string()];
            i
        };
        let quoted = r#""q.io/a@sha256:1", "q.io/b@sha256:2", "q.io/c@sha256:3""#;
        let mut unlisted = image("q.io/d@sha256:4", Some(true), Some(false), Some(false));
        unlisted.names = vec!["q.io/d@sha256:4".into()];
        let n = assess(
            &crio_node(
                "1.29.2",
                &[("50-pinned-images", quoted)],
                vec![
                    listed("q.io/a@sha256:1"),
                    listed("q.io/b@sha256:2"),
                    listed("q.io/c@sha256:3"),
                    unlisted,
                ],
            ),
            None,
        );
        let lines = Readiness::of(vec![n]).reason_lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "n2: 3 images listed in 50-pinned-images are not pinned by CRI-O 1.29.2: its reload did \
                 not apply pinned_images (cri-o #7954, fixed in 1.29.4); restart CRI-O"
            ),
            "{lines:?}"
        );
        assert_eq!(
            lines[1],
            "n2: 1 image present but not pinned: q.io/d@sha256:4; `pinboard apply` pins them"
        );

        // A later file replaces the list: named, with the fix.
        let mut replaced = image("q.io/a@sha256:1", Some(true), Some(false), Some(false));
        replaced.names = vec!["q.io/a@sha256:1".into()];
        let n = assess(
            &crio_node(
                "1.31.0",
                &[
                    ("10-site.conf", r#""q.io/*""#),
                    ("99-override.conf", r#""other.io/*""#),
                ],
                vec![replaced],
            ),
            None,
        );
        assert_eq!(
            n.reasons,
            [
                "1 image listed in 10-site.conf is not pinned by CRI-O 1.31.0: 99-override.conf replaces \
              pinned_images; add them to 99-override.conf or remove pinned_images from it"
            ]
        );
    }

    #[test]
    fn missing_unpinned_and_unknown_images_each_say_why() {
        let mut observed = node(vec![
            image("a", Some(false), None, Some(false)),
            image("b", Some(true), Some(false), Some(false)),
            image("c", Some(true), None, None),
            image("d", None, None, None),
        ]);
        observed.error = Some("containerd images service: Get c: boom".into());
        let n = assess(&observed, None);
        assert!(!n.ready);
        let reasons: Vec<_> = n.images.iter().map(|i| i.reason).collect();
        assert_eq!(
            reasons,
            [
                Some(ImageReason::Missing),
                Some(ImageReason::NotPinned),
                Some(ImageReason::Unknown),
                Some(ImageReason::Unknown)
            ]
        );
        assert_eq!(n.reasons.len(), 3, "{:?}", n.reasons);
        assert!(
            n.reasons[0].starts_with("1 image missing: a;"),
            "{}",
            n.reasons[0]
        );
        assert!(n.reasons[1].starts_with("1 image present but not pinned: b;"));
        assert!(n.reasons[2].contains("2 images unknown: c, d: containerd images service"));
        assert_eq!(
            n.summary(),
            "1 image missing, 1 image not pinned, 2 images unknown"
        );
    }

    #[test]
    fn a_missing_image_being_pulled_says_for_how_long_and_whether_it_looks_stuck() {
        let pull = |idle| PullSeen {
            running_seconds: Some(130),
            idle_seconds: Some(idle),
            blobs: 2,
            done_bytes: 40 << 20,
            total_bytes: 120 << 20,
        };
        let mut missing = image("a", Some(false), None, Some(false));
        missing.pulling = Some(pull(3));
        let n = assess(&node(vec![missing.clone()]), None);
        assert_eq!(n.images[0].reason, Some(ImageReason::Pulling));
        assert_eq!(
            n.reasons,
            ["1 image pulling now: a (for 2m10s, 40 MiB of 120 MiB in 2 blobs, last bytes 3s ago)"]
        );
        assert_eq!(n.summary(), "1 image pulling");
        missing.pulling = Some(pull(95));
        let stuck = assess(&node(vec![missing]), None);
        assert!(
            stuck.reasons[0].ends_with(
                "no bytes for 1m35s: looks stuck, check the node's link to the registry)"
            ),
            "{}",
            stuck.reasons[0]
        );
        let json = serde_json::to_value(&stuck.images[0]).unwrap();
        assert_eq!(json["reason"], "pulling");
        assert_eq!(json["pulling"]["idleSeconds"], 95);
        // A pull seen for an image that is there after all is not one.
        let mut there = image("a", Some(true), Some(true), None);
        there.pulling = Some(pull(1));
        assert!(assess(&node(vec![there]), None).ready);
    }

    #[test]
    fn a_runtime_that_is_not_ready_is_a_reason_even_with_every_image_there() {
        let mut observed = node(vec![image("a", Some(true), Some(true), None)]);
        observed.not_ready = Some("RuntimeReady=false (Overlay: storage broken)".into());
        let n = assess(&observed, None);
        assert!(!n.ready);
        assert_eq!(
            n.reasons,
            [
                "node not ready: the runtime reports RuntimeReady=false (Overlay: storage broken); pulls fail \
              until it recovers"
            ]
        );
    }

    #[test]
    fn no_space_is_a_reason_only_when_something_is_missing() {
        let plan: NodePlan = serde_json::from_value(serde_json::json!({
            "node": "n1", "runtime": null, "capacityBytes": null, "usedBytes": null, "availableBytes": null,
            "fetchBytes": 0, "estimatedDiskBytes": 0, "estimateBasis": "nothing", "availableAfterBytes": null,
            "verdict": "no-space", "reasons": ["needs 1 GiB more"], "images": []
        }))
        .unwrap();
        let missing = assess(
            &node(vec![image("a", Some(false), None, Some(false))]),
            Some(&plan),
        );
        assert!(
            missing.reasons[1].starts_with("no space (plan verdict no-space): needs 1 GiB more")
        );
        let there = assess(
            &node(vec![image("a", Some(true), None, Some(true))]),
            Some(&plan),
        );
        assert!(there.ready);
    }

    #[test]
    fn unreachable_nodes_are_not_ready_and_the_verdict_needs_every_node() {
        let gone = NodeObserved {
            node: "n9".into(),
            unreachable: Some("connect unix:///x.sock: no such file".into()),
            images: vec![image("a", None, None, None)],
            ..NodeObserved::default()
        };
        let ok = assess(&node(vec![image("a", Some(true), Some(true), None)]), None);
        let all = Readiness::of(vec![ok.clone(), assess(&gone, None)]);
        assert!(!all.ready);
        assert_eq!(all.ready_nodes, 1);
        assert_eq!(all.progress_line(), "1/2 nodes ready; n9: unreachable");
        assert_eq!(all.reason_lines().len(), 1);
        assert!(all.reason_lines()[0].starts_with("n9: unreachable: connect unix:///x.sock"));
        assert!(Readiness::of(vec![ok]).ready);
        assert!(!Readiness::of(Vec::new()).ready, "no node is not ready");
    }

    #[test]
    fn json_uses_the_documented_names_and_reads_back() {
        let n = assess(
            &node(vec![image("a", Some(true), Some(false), Some(false))]),
            None,
        );
        let json = serde_json::to_value(&n).unwrap();
        assert_eq!(json["images"][0]["ref"], "a");
        assert_eq!(json["images"][0]["reason"], "not-pinned");
        assert_eq!(json["pinMethod"], "containerd-label");
        assert_eq!(json["pinnedBy"], "runtime");
        let back: NodeReadiness = serde_json::from_value(json).unwrap();
        assert_eq!(back, n);
    }

    mod cluster {
        use std::collections::BTreeMap;
        use std::time::SystemTime;

        use serde_json::{Value, json};

        use super::super::*;
        use crate::model::cluster::{ClusterUpdate, DEGRADED, PROGRESSING, ROLE_LABEL};

        const A: &str = "quay.io/x/a@sha256:aa";
        const B: &str = "quay.io/x/b@sha256:bb";

        fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
            serde_json::from_value(value).unwrap()
        }

        /// Node `name`, Ready as given, listing `images` (padded to `entries` entries).
        fn node(
            name: &str,
            ready: bool,
            images: &[&str],
            entries: usize,
        ) -> k8s_openapi::api::core::v1::Node {
            let mut list: Vec<Value> = images.iter().map(|i| json!({"names": [i]})).collect();
            list.extend(
                (list.len()..entries)
                    .map(|n| json!({"names": [format!("quay.io/other/{n}@sha256:0")]})),
            );
            from(json!({
                "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
                "status": {
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                    "nodeInfo": {"containerRuntimeVersion": "cri-o://1.33.2", "architecture": "", "bootID": "",
                                 "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                                 "operatingSystem": "", "osImage": "", "systemUUID": ""},
                    "images": list,
                },
            }))
        }

        fn mcn(name: &str, desired: i64, current: i64, degraded: Option<&str>) -> Value {
            json!({
                "metadata": {"name": name},
                "spec": {"node": {"name": name}, "pool": {"name": "worker"}},
                "status": {
                    "pinnedImageSets": [{"name": "s", "desiredGeneration": desired, "currentGeneration": current,
                                         "lastFailedGeneration": degraded.map(|_| desired),
                                         "lastFailedGenerationError": degraded}],
                    "conditions": [
                        {"type": PROGRESSING, "status": if desired != current && degraded.is_none() { "True" } else { "False" }},
                        {"type": DEGRADED, "status": if degraded.is_some() { "True" } else { "False" }},
                    ],
                },
            })
        }

        fn view(
            set_generation: i64,
            nodes: Vec<k8s_openapi::api::core::v1::Node>,
            mcns: Vec<Value>,
        ) -> ClusterView {
            let mut view = ClusterView::default();
            view.apply(ClusterUpdate::Pools(vec![from(
                json!({"metadata": {"name": "worker"}, "spec": {
                    "machineConfigSelector": {"matchLabels": {ROLE_LABEL: "worker"}},
                    "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
                }}),
            )]));
            view.apply(ClusterUpdate::Sets(vec![from(json!({
                "metadata": {"name": "s", "generation": set_generation, "labels": {ROLE_LABEL: "worker"}},
                "spec": {"pinnedImages": [{"name": A}, {"name": B}]},
            }))]));
            view.apply(ClusterUpdate::Nodes(nodes.iter().map(Into::into).collect()));
            view.apply(ClusterUpdate::MachineConfigNodes(
                mcns.into_iter().map(from).collect(),
            ));
            view
        }

        fn wanted(min_generation: i64) -> WantedSet {
            WantedSet {
                set: crate::model::set::from_flags("s", &[A.into(), B.into()]),
                min_generation,
            }
        }

        fn judge(view: &ClusterView, min_generation: i64) -> Readiness {
            Readiness::of(assess_cluster(
                view,
                &[wanted(min_generation)],
                &HashMap::new(),
                SystemTime::now(),
            ))
        }

        /// Judged with each node's kubelet allowing `max_images` entries in its image list.
        fn judge_with(view: &ClusterView, max_images: i64) -> Readiness {
            let kubelets = view
                .nodes()
                .iter()
                .map(|n| {
                    let mut settings = KubeletSettings::assumed("");
                    settings.node_status_max_images = max_images;
                    settings.assumed = None;
                    (n.name.clone(), settings)
                })
                .collect();
            Readiness::of(assess_cluster(
                view,
                &[wanted(0)],
                &kubelets,
                SystemTime::now(),
            ))
        }

        #[test]
        fn done_and_listed_everywhere_is_ready() {
            let v = view(
                2,
                vec![node("n1", true, &[A, B], 2), node("n2", true, &[A, B], 50)],
                vec![mcn("n1", 2, 2, None), mcn("n2", 2, 2, None)],
            );
            let r = judge(&v, 0);
            assert!(r.ready, "{:#?}", r.nodes);
            assert_eq!(r.nodes[0].runtime.as_deref(), Some("cri-o://1.33.2"));
            assert_eq!(r.nodes[0].pin_method.as_deref(), Some(MACHINE_CONFIG_PINS));
            let set = &r.nodes[0].sets[0];
            assert_eq!(
                (set.generation, set.current_generation, set.state.as_str()),
                (Some(2), Some(2), "done")
            );
        }

        #[test]
        fn every_case_a_pipeline_must_not_pass_says_why() {
            let v = view(
                3,
                vec![
                    node("n1", true, &[A, B], 2),
                    node("n2", true, &[A], 50),
                    node("n3", true, &[A, B], 2),
                    node("n4", false, &[A, B], 2),
                    node("n5", true, &[A], 2),
                ],
                vec![
                    mcn("n1", 2, 2, None),
                    mcn("n2", 3, 3, None),
                    mcn(
                        "n3",
                        3,
                        2,
                        Some("failed to pull quay.io/x/b: no space left on device"),
                    ),
                    mcn("n4", 3, 3, None),
                    mcn("n5", 3, 3, None),
                ],
            );
            let r = judge(&v, 0);
            assert!(!r.ready);
            assert_eq!(r.ready_nodes, 1, "n2: done, its full list proves nothing");
            let reasons = |n: usize| r.nodes[n].reasons.join(" | ");
            assert!(
                reasons(0).contains(
                    "has not seen generation 3 yet (its MachineConfigNode wants generation 2)"
                ),
                "{}",
                reasons(0)
            );
            assert!(r.nodes[1].ready, "{}", reasons(1));
            assert_eq!(r.nodes[1].images[1].evidence, Evidence::Daemon);
            assert_eq!(
                r.nodes[1].evidence_words().as_deref(),
                Some("daemon's report; the kubelet lists 1 of 2 images")
            );
            assert!(
                reasons(2).contains(
                    "set \"s\" generation 3 failed: failed to pull quay.io/x/b: no space left"
                ),
                "{}",
                reasons(2)
            );
            assert_eq!(r.nodes[2].sets[0].state, "failed");
            assert!(reasons(3).starts_with("node not ready"), "{}", reasons(3));
            assert!(
                reasons(4).starts_with(
                    "the kubelet's complete image list (2 of at most 50) lacks 1 image: quay.io/x/b@sha256:bb; \
                     the machine-config daemon reported the set done"
                ),
                "{}",
                reasons(4)
            );
            assert_eq!(r.nodes[4].images[1].evidence, Evidence::KubeletList);
            assert_eq!(r.nodes[4].summary(), "1 image missing");
            assert_eq!(r.nodes[0].summary(), "s waiting, 2 images not pinned");
        }

        #[test]
        fn an_empty_or_full_image_list_proves_nothing_and_a_complete_one_can_contradict() {
            let v = view(
                2,
                vec![node("n1", true, &[], 0), node("n2", true, &[A], 50)],
                vec![mcn("n1", 2, 2, None), mcn("n2", 2, 2, None)],
            );
            let r = judge(&v, 0);
            assert!(r.ready, "{:#?}", r.nodes);
            assert!(
                r.nodes[0]
                    .images
                    .iter()
                    .all(|i| i.evidence == Evidence::Daemon)
            );
            // A kubelet allowed 200 entries: n2's 50 are everything it has, and B is not among them.
            let r = judge_with(&v, 200);
            assert!(r.nodes[0].ready, "an empty list still proves nothing");
            assert!(!r.nodes[1].ready);
            assert!(
                r.nodes[1].reasons[0].starts_with(
                    "the kubelet's complete image list (50 of at most 200) lacks 1 image"
                ),
                "{:?}",
                r.nodes[1].reasons
            );
            assert!(judge_with(&v, -1).nodes[1].reasons[0].contains("(50 of no limit)"));
            let json = serde_json::to_value(&r.nodes[1]).unwrap();
            assert_eq!(json["kubelet"]["nodeStatusMaxImages"], 200);
            assert_eq!(json["kubelet"]["imageListComplete"], true);
            assert_eq!(json["images"][1]["evidence"], "kubelet-list");
            assert_eq!(json["images"][0]["evidence"], "daemon");
        }

        #[test]
        fn a_node_that_joined_after_the_set_was_applied_is_named() {
            let mut v = view(
                2,
                vec![node("n1", true, &[A, B], 2), node("w4", true, &[], 0)],
                vec![mcn("n1", 2, 2, None)],
            );
            let r = judge(&v, 0);
            assert!(!r.ready);
            let w4 = &r.nodes[1];
            assert_eq!(w4.node, "w4");
            assert_eq!(
                w4.reasons,
                [
                    "set \"s\": joined pool worker after the set was applied; its machine-config daemon \
                  has not reported on this node yet"
                ]
            );
            // Its MachineConfigNode appears, without an entry for the set yet: still named.
            let mut empty = mcn("w4", 2, 2, None);
            empty["status"]["pinnedImageSets"] = json!([]);
            v.apply(ClusterUpdate::MachineConfigNodes(vec![
                from(mcn("n1", 2, 2, None)),
                from(empty),
            ]));
            assert!(judge(&v, 0).nodes[1].reasons[0].contains("joined pool worker"));
            v.apply(ClusterUpdate::MachineConfigNodes(vec![
                from(mcn("n1", 2, 2, None)),
                from(mcn("w4", 2, 2, None)),
            ]));
            assert!(judge(&v, 0).ready);
        }

        #[test]
        fn old_kubelets_and_unread_configs_are_warnings_not_failures() {
            let mut old = node("n1", true, &[A, B], 2);
            old.status
                .as_mut()
                .unwrap()
                .node_info
                .as_mut()
                .unwrap()
                .kubelet_version = "v1.24.17".into();
            let v = view(2, vec![old], vec![mcn("n1", 2, 2, None)]);
            let r = judge(&v, 0);
            assert!(r.ready, "{:?}", r.nodes[0].reasons);
            let warnings = r.nodes[0].warnings.join(" | ");
            assert!(
                warnings.contains("kubelet v1.24.17 predates pinned-image support"),
                "{warnings}"
            );
            assert!(
                warnings.contains(
                    "could not be read (its kubelet was not asked): assumed its defaults"
                ),
                "{warnings}"
            );
            assert!(judge_with(&v, 50).nodes[0].warnings.len() == 1);
        }

        #[test]
        fn a_generation_just_applied_is_waited_for_even_before_the_watch_shows_it() {
            let v = view(
                2,
                vec![node("n1", true, &[A, B], 2)],
                vec![mcn("n1", 2, 2, None)],
            );
            assert!(judge(&v, 2).ready);
            let r = judge(&v, 3);
            assert!(!r.ready);
            assert_eq!(r.nodes[0].sets[0].generation, Some(3));
        }

        #[test]
        fn slow_pulls_are_not_failures_and_absent_sets_are_named() {
            let timeout = format!("{}: 3 of 9 left", crate::model::cluster::REQUEUE_TIMEOUT);
            let v = view(
                2,
                vec![node("n1", true, &[A], 2)],
                vec![mcn("n1", 2, 1, Some(&timeout))],
            );
            let r = judge(&v, 0);
            assert_eq!(r.nodes[0].sets[0].state, "slow");
            assert!(
                r.nodes[0].reasons[0].contains("still pulling"),
                "{:?}",
                r.nodes[0].reasons
            );
            let mut other = wanted(0);
            other.set.name = "t".into();
            other.set.labels = BTreeMap::from([(ROLE_LABEL.into(), "worker".into())]);
            let r = Readiness::of(assess_cluster(
                &v,
                &[other],
                &HashMap::new(),
                SystemTime::now(),
            ));
            assert_eq!(r.nodes[0].sets[0].state, "absent");
            assert!(
                r.nodes[0].reasons[0].contains("\"t\" is not on the cluster"),
                "{:?}",
                r.nodes[0].reasons
            );
        }

        #[test]
        fn cluster_json_reads_back() {
            let v = view(
                2,
                vec![node("n1", true, &[A, B], 2)],
                vec![mcn("n1", 2, 1, None)],
            );
            let status = NodesStatus {
                nodes: judge(&v, 0).nodes,
            };
            let json = serde_json::to_value(&status).unwrap();
            assert_eq!(json["nodes"][0]["sets"][0]["desiredGeneration"], 2);
            assert_eq!(json["nodes"][0]["sets"][0]["state"], "pulling");
            let back: NodesStatus = serde_json::from_value(json).unwrap();
            assert_eq!(back, status);
        }
    }
}

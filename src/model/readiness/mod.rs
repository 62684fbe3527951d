//! Readiness: is every image of a set on every target node, and pinned as the node enforces it? The one
//! function behind `pinboard check`, `status`, the end of headless `apply`, and the wait loop: what a node
//! was observed to hold ([`ObservedNode`]) goes in, per node and per image facts with reasons come out
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

mod agents;
mod daemons;
mod direct;

pub use agents::{AskedCheck, assess_agents, missing_agents, unanswered};
pub use daemons::{MACHINE_CONFIG_PINS, assess_cluster, assess_cluster_node};
pub use direct::{assess, assess_with, unreachable_reason};

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::crio::CrioConfig;
use super::holders::{HeldBy, Holders};
use super::lazy::{LazyPulling, RemoteLayers};
use super::machine_config::{ClusterView, KubeletSettings, SetProgress};
use super::pinboard_api::CacheReport;
use super::reference::{count_images, some_of};
use super::rollout::PinMethod;
use super::set::ImageSet;
use super::units::clock;

/// What was observed on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedNode {
    pub node: String,
    /// `containerd 1.6.20`.
    pub runtime: Option<String>,
    /// None for a runtime pinboard does not pin on, or an unreachable node.
    pub runtime_kind: Option<super::runtime::RuntimeKind>,
    /// Why the node could not be reached; nothing else is known then.
    pub unreachable: Option<String>,
    /// Why the runtime says it is not ready (CRI Status), when it does.
    pub not_ready: Option<String>,
    pub pin_method: Option<PinMethod>,
    /// CRI-O nodes: what its files pin, to judge from or to explain a disagreement with the runtime.
    pub crio: Option<CrioObserved>,
    /// Why some image could not be observed (ImageStatus failed, the pin record could not be read).
    pub error: Option<String>,
    /// Lazy pulling on the node, as its runtime has it; None where it could not be read.
    pub lazy_pulling: Option<LazyPulling>,
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
    /// The file of its configuration CRI-O cannot load, and why: its reloads fail, its pins stay as they
    /// were ([`super::crio::broken_config`]). `config` is empty then.
    pub broken: Option<String>,
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
    /// Its repo tags alone: CRI-O pins by the names it stored, which its tags surely are.
    pub tags: Vec<String>,
    /// A pull of the (missing) image the runtime is running now, where it tells (containerd).
    pub pulling: Option<PullSeen>,
    /// Who holds its pin, by the node's record (drop-in marks, holder labels); None: could not be read.
    pub holders: Option<Holders>,
    /// Its layers still in the registry, when it is present only lazily.
    pub lazy: Option<RemoteLayers>,
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
pub(super) const STUCK_AFTER_SECONDS: u64 = 60;

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
    /// Present only lazily: some of its layers are still in the registry, fetched on first read.
    Lazy,
    /// The node or its pin record could not be asked.
    Unknown,
}

/// Whether an image present only lazily counts as there (`--allow-lazy`: for sets whose purpose is a fast
/// start rather than independence from the registry link).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LazyImages {
    #[default]
    NotReady,
    Accepted,
}

impl ImageReason {
    /// How tables and messages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageReason::Missing => "missing",
            ImageReason::Pulling => "pulling",
            ImageReason::NotPinned => "present but not pinned",
            ImageReason::Lazy => "lazily present",
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
    /// Present only lazily: its layers still in the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy: Option<RemoteLayers>,
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
    /// Direct mode: lazy pulling on the node, as its runtime has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_pulling: Option<LazyPulling>,
    /// On agents: the in-cluster cache's figures, on the node whose agent holds its role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheReport>,
    /// On agents, for a node whose agent does not report: where it stands in a few words (`no agent yet`,
    /// `agent stale`, with its pod's state when known: `no agent yet (pod ImagePullBackOff)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
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
    pub state: SetState,
    pub error: Option<String>,
    /// How long the node has been pulling (from the condition's lastTransitionTime).
    pub elapsed_seconds: Option<u64>,
}

/// Where a node is with a set, in one word (`done`, `pulling`, …), as tables and JSON say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetState {
    Done,
    Pulling,
    /// Still pulling after the daemon's sync window ended: not a failure.
    Slow,
    /// The node has not seen this generation of the set yet.
    Waiting,
    Failed,
    /// It was done, then an image or pin was lost: the node's agent puts it back.
    Restoring,
    /// Nothing reports on the node.
    Unknown,
    /// The set is not on the cluster.
    Absent,
}

impl SetState {
    pub fn word(self) -> &'static str {
        match self {
            SetState::Done => "done",
            SetState::Pulling => "pulling",
            SetState::Slow => "slow",
            SetState::Waiting => "waiting",
            SetState::Failed => "failed",
            SetState::Restoring => "restoring",
            SetState::Unknown => "unknown",
            SetState::Absent => "absent",
        }
    }
}

impl From<&SetProgress> for SetState {
    fn from(state: &SetProgress) -> SetState {
        match state {
            SetProgress::Done => SetState::Done,
            SetProgress::Progressing { .. } => SetState::Pulling,
            SetProgress::Waiting => SetState::Waiting,
            SetProgress::Failed { .. } => SetState::Failed,
            SetProgress::SlowButWorking { .. } => SetState::Slow,
            SetProgress::Unknown => SetState::Unknown,
        }
    }
}

/// Cluster mode: a set to check, and the generation nodes must reach at least (e.g. the one `apply` just
/// wrote while the watch may still show an older one). The set's labels decide its pools when it is not on
/// the cluster; otherwise the cluster's labels count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedSet {
    pub set: ImageSet,
    pub min_generation: i64,
}

/// The names of sets asked for that the cluster does not hold, and the names it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownSets {
    pub unknown: Vec<String>,
    pub there: Vec<String>,
}

/// Why the cluster's copy of a wanted set is not the wanted one: it is not there (`listed` None), or it does
/// not list some of the wanted images (`listed`: the images it lists).
fn not_as_wanted<'a>(
    wanted: &WantedSet,
    listed: Option<impl Iterator<Item = &'a str>>,
) -> Option<String> {
    let name = &wanted.set.name;
    let Some(listed) = listed else {
        return Some(format!(
            "set {name:?} is not on the cluster: `pinboard apply --set FILE` creates it"
        ));
    };
    let listed: std::collections::HashSet<&str> = listed.collect();
    let unlisted: Vec<&str> = wanted
        .set
        .references()
        .filter(|r| !listed.contains(r))
        .collect();
    (!unlisted.is_empty()).then(|| {
        format!(
            "set {name:?} on the cluster does not list {}: {}; `pinboard apply --set FILE` updates it",
            count_images(unlisted.len()),
            some_of(&unlisted)
        )
    })
}

/// The sets to check: `files` as read, and those `names` names on the cluster, which `on_cluster` finds
/// and `there` lists.
pub fn wanted_sets(
    files: Vec<ImageSet>,
    names: Vec<String>,
    on_cluster: impl Fn(&str) -> Option<ImageSet>,
    there: impl FnOnce() -> Vec<String>,
) -> Result<Vec<WantedSet>, UnknownSets> {
    let mut unknown = Vec::new();
    let mut sets = files;
    for name in names {
        match on_cluster(&name) {
            Some(set) => sets.push(set),
            None => unknown.push(name),
        }
    }
    if !unknown.is_empty() {
        return Err(UnknownSets {
            unknown,
            there: there(),
        });
    }
    Ok(sets
        .into_iter()
        .map(|set| WantedSet {
            set,
            min_generation: 0,
        })
        .collect())
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
    /// On agents: the nodes the sets select that were not judged, grouped by why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// What is worth knowing about the judgement as a whole (e.g. by which rule its nodes were chosen).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The per-node data without a verdict, as `status` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodesStatus {
    pub nodes: Vec<NodeReadiness>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl From<Readiness> for NodesStatus {
    fn from(readiness: Readiness) -> NodesStatus {
        NodesStatus {
            nodes: readiness.nodes,
            left_out: readiness.left_out,
            warnings: readiness.warnings,
        }
    }
}

/// Nodes the sets select that were left out for one reason: how many, and the first few by name (a small
/// document on 5,000 nodes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftOut {
    pub reason: String,
    pub count: usize,
    /// The first [`LeftOut::NAMED`] of them, by name.
    pub nodes: Vec<String>,
}

impl LeftOut {
    /// How many of a reason's nodes are named.
    pub const NAMED: usize = 5;

    /// `nodes` (name and why) grouped by why, the largest group first.
    pub fn grouped<'a>(nodes: impl IntoIterator<Item = (&'a str, String)>) -> Vec<LeftOut> {
        let mut by_reason: BTreeMap<String, LeftOut> = BTreeMap::new();
        for (node, reason) in nodes {
            let group = by_reason.entry(reason.clone()).or_insert_with(|| LeftOut {
                reason,
                count: 0,
                nodes: Vec::new(),
            });
            group.count += 1;
            group.nodes.push(node.to_owned());
        }
        let mut groups: Vec<LeftOut> = by_reason.into_values().collect();
        for group in &mut groups {
            group.nodes.sort();
            group.nodes.truncate(Self::NAMED);
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.count));
        groups
    }

    /// `2 nodes left out: REASON: n5, n6`.
    pub fn line(&self) -> String {
        let more = match self.count.saturating_sub(self.nodes.len()) {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        format!(
            "{} left out: {}: {}{more}",
            count_nodes(self.count),
            self.reason,
            self.nodes.join(", ")
        )
    }
}

/// `1 node` / `3 nodes`.
pub fn count_nodes(n: usize) -> String {
    match n {
        1 => "1 node".into(),
        n => format!("{n} nodes"),
    }
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
/// Why `images` present only lazily (their snapshotter serving them) are not pre-loaded, and how to make
/// them whole on a node running `runtime`; None when none is.
pub(super) fn lazily_present(images: &[ImageReadiness], runtime: Option<&str>) -> Option<String> {
    let lazily = lazy_images(images, false);
    let unpinned = images
        .iter()
        .filter(|i| i.reason == Some(ImageReason::Lazy) && i.pinned == Some(false))
        .count();
    let pins = match unpinned {
        0 => String::new(),
        n if n == lazily.len() => ", and not pinned".into(),
        n => format!(", {n} of them not pinned"),
    };
    (!lazily.is_empty()).then(|| {
        format!(
            "{} present only lazily{pins}, the registry link still needed for their layers: {}; {}",
            count_images(lazily.len()),
            some_of(&lazily),
            super::lazy::make_local(runtime)
        )
    })
}

/// Why `images` whose snapshotter does not serve them cannot even start a container, and the fix; None
/// when none is.
pub(super) fn unserved(images: &[ImageReadiness]) -> Option<String> {
    let unserved = lazy_images(images, true);
    let why = images
        .iter()
        .find_map(|i| i.lazy.as_ref()?.unserved.as_deref())?;
    Some(format!(
        "{} unreadable, its snapshotter not serving: {}: {why}; {}",
        count_images(unserved.len()),
        some_of(&unserved),
        super::lazy::unserved_fix()
    ))
}

/// `REF (3 of 3 layers remote, 6 % fetched)` for each lazily present image of `images`, served or not.
fn lazy_images(images: &[ImageReadiness], unserved: bool) -> Vec<String> {
    images
        .iter()
        .filter(|i| i.reason == Some(ImageReason::Lazy))
        .filter_map(|i| {
            let lazy = i
                .lazy
                .as_ref()
                .filter(|l| l.unserved.is_some() == unserved)?;
            Some(format!("{} ({})", i.reference, lazy.count()))
        })
        .collect()
}

/// The references of the images not ready for `reason`.
pub(super) fn with_reason(images: &[ImageReadiness], reason: ImageReason) -> Vec<&str> {
    images
        .iter()
        .filter(|i| i.reason == Some(reason))
        .map(|i| i.reference.as_str())
        .collect()
}

/// What decided the pins of a node's present images.
impl NodeReadiness {
    /// A few words for a progress line or a table cell: `ready`, `unreachable` (on agents, where the agent
    /// stands: `no agent yet`), `3 images missing, 1 not pinned`, `ocp-4.19 pulling 3m05s, 2 images missing`.
    pub fn summary(&self) -> String {
        if !self.reachable {
            return self.agent.clone().unwrap_or_else(|| "unreachable".into());
        }
        let count = |reason| {
            self.images
                .iter()
                .filter(|i| i.reason == Some(reason))
                .count()
        };
        let sets = self
            .sets
            .iter()
            .filter(|s| s.state != SetState::Done)
            .map(|s| {
                let elapsed = s.elapsed_seconds.map_or_else(String::new, |e| {
                    format!(" {}", clock(Duration::from_secs(e)))
                });
                format!("{} {}{elapsed}", s.name, s.state.word())
            });
        let parts: Vec<String> = sets
            .chain(
                [
                    (ImageReason::Missing, "missing"),
                    (ImageReason::Pulling, "pulling"),
                    (ImageReason::NotPinned, "not pinned"),
                    (ImageReason::Lazy, "lazily present"),
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
            left_out: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// `2/3 nodes ready; n2: 3 images missing; n3: unreachable` (`2/3 nodes ready (1 left out); …` when the
    /// sets select nodes that are not judged).
    pub fn progress_line(&self) -> String {
        let mut line = format!("{}/{} nodes ready", self.ready_nodes, self.nodes.len());
        let left_out: usize = self.left_out.iter().map(|l| l.count).sum();
        if left_out > 0 {
            line.push_str(&format!(" ({left_out} left out)"));
        }
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

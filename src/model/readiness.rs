//! Readiness: is every image of a set on every target node, and pinned as the node enforces it? The one
//! function behind `pinboard check`, `status`, the end of headless `apply`, and the wait loop: what a node
//! was observed to hold ([`NodeObserved`]) goes in, per node and per image facts with reasons come out
//! ([`NodeReadiness`]), and [`Readiness::of`] gives the overall verdict. Pure: no I/O.
//!
//! An image counts as pinned when the runtime reports it pinned (CRI `pinned`) or when the node's own pin
//! record says so: the CRI-O drop-in lists it, or its containerd record carries the pin label (containerd
//! 1.6 does not report `pinned` through CRI). Unknown stays unknown and is never ready.

use serde::{Deserialize, Serialize};

use super::plan::{NodePlan, Verdict};
use super::rollout::PinMethod;

/// What was observed on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObserved {
    pub node: String,
    /// `containerd 1.6.20`.
    pub runtime: Option<String>,
    /// Why the node could not be reached; nothing else is known then.
    pub unreachable: Option<String>,
    pub pin_method: Option<PinMethod>,
    /// Why some image could not be observed (ImageStatus failed, the pin record could not be read).
    pub error: Option<String>,
    /// In set order.
    pub images: Vec<ImageObserved>,
}

/// One image on one node. None: could not be asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageObserved {
    pub reference: String,
    /// CRI ImageStatus found it.
    pub present: Option<bool>,
    /// CRI ImageStatus's `pinned` (only known for a present image).
    pub reported_pinned: Option<bool>,
    /// The node's pin record: listed in the CRI-O drop-in, or the containerd pin label set.
    pub recorded_pinned: Option<bool>,
}

/// Why an image is not ready on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageReason {
    Missing,
    NotPinned,
    /// The node or its pin record could not be asked.
    Unknown,
}

impl ImageReason {
    /// How tables and messages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageReason::Missing => "missing",
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
    pub ready: bool,
    /// Why the node is not ready, one sentence each, with what to do.
    pub reasons: Vec<String>,
    pub images: Vec<ImageReadiness>,
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

/// Whether an image is pinned: the runtime saying so, or the node's pin record, is enough; a record that
/// says no is a no unless the runtime says yes; otherwise unknown.
fn pinned(image: &ImageObserved) -> Option<bool> {
    match (image.reported_pinned, image.recorded_pinned) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (_, Some(false)) => Some(false),
        (_, None) => None,
    }
}

fn image_readiness(image: &ImageObserved) -> ImageReadiness {
    let pinned = pinned(image);
    let reason = match (image.present, pinned) {
        (None, _) => Some(ImageReason::Unknown),
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
    }
}

/// `1 image` / `3 images`.
fn count_images(n: usize) -> String {
    format!("{n} image{}", if n == 1 { "" } else { "s" })
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
        let with = |reason: ImageReason| -> Vec<&str> {
            images
                .iter()
                .filter(|i| i.reason == Some(reason))
                .map(|i| i.reference.as_str())
                .collect()
        };
        let missing = with(ImageReason::Missing);
        if !missing.is_empty() {
            reasons.push(format!(
                "{} missing: {}; `pinboard apply` pre-loads and pins them",
                count_images(missing.len()),
                missing.join(", ")
            ));
        }
        if let Some(plan) = plan.filter(|p| p.verdict == Verdict::NoSpace && !missing.is_empty()) {
            reasons.push(format!(
                "no space (plan verdict no-space): {}; free space on the image filesystem or apply with --force",
                plan.reasons.join("; ")
            ));
        }
        let unpinned = with(ImageReason::NotPinned);
        if !unpinned.is_empty() {
            reasons.push(format!(
                "{} present but not pinned: {}; `pinboard apply` pins them",
                count_images(unpinned.len()),
                unpinned.join(", ")
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
                unknown.join(", ")
            ));
        }
    }
    NodeReadiness {
        node: observed.node.clone(),
        runtime: observed.runtime.clone(),
        reachable: observed.unreachable.is_none(),
        pin_method: observed.pin_method.map(|m| pin_method_name(m).to_string()),
        ready: reasons.is_empty(),
        reasons,
        images,
    }
}

impl NodeReadiness {
    /// A few words for a progress line or a table cell: `ready`, `unreachable`, `3 images missing, 1 not
    /// pinned`.
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
        let parts: Vec<String> = [
            (ImageReason::Missing, "missing"),
            (ImageReason::NotPinned, "not pinned"),
            (ImageReason::Unknown, "unknown"),
        ]
        .into_iter()
        .filter_map(|(reason, word)| match count(reason) {
            0 => None,
            n => Some(format!("{} {word}", count_images(n))),
        })
        .collect();
        if parts.is_empty() {
            if self.ready { "ready" } else { "not ready" }.into()
        } else {
            parts.join(", ")
        }
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
    fn present_and_pinned_by_runtime_or_record_is_ready() {
        let n = assess(
            &node(vec![
                image("a", Some(true), Some(false), Some(true)),
                image("b", Some(true), Some(true), None),
            ]),
            None,
        );
        assert!(n.ready, "{n:?}");
        assert!(n.reasons.is_empty());
        assert_eq!(n.summary(), "ready");
        assert_eq!(n.pin_method.as_deref(), Some("containerd-label"));
        assert!(
            n.images
                .iter()
                .all(|i| i.pinned == Some(true) && i.reason.is_none())
        );
    }

    #[test]
    fn missing_unpinned_and_unknown_images_each_say_why() {
        let mut observed = node(vec![
            image("a", Some(false), None, Some(false)),
            image("b", Some(true), Some(false), Some(false)),
            image("c", Some(true), Some(false), None),
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
        let back: NodeReadiness = serde_json::from_value(json).unwrap();
        assert_eq!(back, n);
    }
}

//! Readiness of a node reached over its CRI socket: where the runtime reports pins (CRI `pinned`), its word
//! decides; the node's pin record (the CRI-O files' effective `pinned_images`, the containerd label) then
//! only explains a disagreement, and decides only where the runtime cannot report. Unknown stays unknown.
//! An image present only lazily is not ready unless lazily present images are accepted ([`LazyImages`]):
//! the link is still needed for it.

use std::time::Duration;

use super::{
    CrioObserved, Evidence, ImageObserved, ImageReadiness, ImageReason, LazyImages, NodeReadiness,
    ObservedNode, PinnedBy, PullSeen, STUCK_AFTER_SECONDS, lazily_present, pin_method_name,
    unserved, with_reason,
};
use crate::model::crio::{NotPinned, broken_config, explain_unpinned};
use crate::model::holders::HeldBy;
use crate::model::plan::{NodePlan, Verdict};
use crate::model::reference::{count_images, some_of};
use crate::model::units::{clock, human};

fn pinned(image: &ImageObserved) -> Option<bool> {
    image.reported_pinned.or(image.recorded_pinned)
}

pub(super) fn image_readiness(image: &ImageObserved) -> ImageReadiness {
    let pinned = pinned(image);
    let pulling = image
        .pulling
        .clone()
        .filter(|_| image.present == Some(false));
    let lazy = image.lazy.clone().filter(|_| image.present == Some(true));
    let reason = match (image.present, pinned) {
        (None, _) => Some(ImageReason::Unknown),
        (Some(false), _) if pulling.is_some() => Some(ImageReason::Pulling),
        (Some(false), _) => Some(ImageReason::Missing),
        // Lazily present first, pinned or not: what is still only in the registry is what matters most.
        (Some(true), _) if lazy.is_some() => Some(ImageReason::Lazy),
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
        lazy,
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

/// Why a node that did not answer is not ready, as every command says it after the node's name
/// (`n2: unreachable: CRI endpoint …: connect: …; check …`).
pub fn unreachable_reason(error: &str) -> String {
    format!("unreachable: {error}; check that the runtime is running and the endpoint is right")
}

/// One node's readiness from what was observed there, an image present only lazily not ready.
pub fn assess(observed: &ObservedNode, plan: Option<&NodePlan>) -> NodeReadiness {
    assess_with(observed, plan, LazyImages::NotReady)
}

/// One node's readiness from what was observed there. `plan`, when given, is the node's plan for the same
/// images: a `no-space` verdict says why missing images cannot be pre-loaded. `lazy` says whether an image
/// present only lazily is ready.
pub fn assess_with(
    observed: &ObservedNode,
    plan: Option<&NodePlan>,
    lazy: LazyImages,
) -> NodeReadiness {
    let mut images: Vec<ImageReadiness> = observed.images.iter().map(image_readiness).collect();
    if lazy == LazyImages::Accepted {
        // Only those a container can start from: an unserved one is not there at all.
        for image in images.iter_mut().filter(|i| {
            i.reason == Some(ImageReason::Lazy)
                && i.lazy.as_ref().is_some_and(|l| l.unserved.is_none())
        }) {
            image.reason = match image.pinned {
                Some(false) => Some(ImageReason::NotPinned),
                _ => None,
            };
        }
    }
    let mut reasons = Vec::new();
    if let Some(error) = &observed.unreachable {
        reasons.push(unreachable_reason(error));
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
            Some(CrioObserved {
                runtime,
                broken: Some(broken),
                ..
            }) if !unpinned.is_empty() => {
                reasons.push(format!(
                    "{} not pinned: {}",
                    count_images(unpinned.len()),
                    broken_config(runtime, broken)
                ));
                Vec::new()
            }
            Some(crio) if !unpinned.is_empty() => {
                let images = observed
                    .images
                    .iter()
                    .filter(|i| unpinned.contains(&i.reference.as_str()))
                    .map(|i| NotPinned {
                        reference: &i.reference,
                        tags: &i.tags,
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
        reasons.extend(
            lazily_present(&images, observed.runtime.as_deref()).map(|reason| {
                format!("{reason}, or pass --allow-lazy when a fast start is all the set is for")
            }),
        );
        reasons.extend(unserved(&images));
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
        lazy_pulling: observed.lazy_pulling.clone(),
        cache: None,
        agent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Readiness;
    use super::*;
    use crate::model::crio::CrioConfig;
    use crate::model::lazy::RemoteLayers;
    use crate::model::rollout::PinMethod;

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
            tags: Vec::new(),
            pulling: None,
            holders: None,
            lazy: None,
        }
    }

    fn node(images: Vec<ImageObserved>) -> ObservedNode {
        ObservedNode {
            node: "n1".into(),
            runtime: Some("containerd 1.6.20".into()),
            pin_method: Some(PinMethod::ContainerdLabel),
            images,
            ..ObservedNode::default()
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
    ) -> ObservedNode {
        let config = CrioConfig::read(files.iter().map(|(file, patterns)| {
            (
                file.to_string(),
                format!("[crio.image]\npinned_images = [{patterns}]\n"),
            )
        }))
        .unwrap();
        ObservedNode {
            node: "n2".into(),
            runtime: Some(format!("cri-o {version}")),
            pin_method: Some(PinMethod::CrioDropIn),
            crio: Some(CrioObserved {
                runtime: format!("CRI-O {version}"),
                version: crate::model::runtime::Version::parse(version),
                config,
                broken: None,
            }),
            images,
            ..ObservedNode::default()
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
    fn a_lazily_present_image_not_pinned_is_named_lazy_first_and_never_ready_unpinned() {
        // A kubelet's lazy pull of an image of the set: present, not pinned, its 3 layers remote.
        let mut lazy = image("q.io/a@sha256:1", Some(true), Some(false), None);
        lazy.lazy = RemoteLayers::of(&[true; 3]);
        let observed = node(vec![lazy]);
        let n = assess(&observed, None);
        assert_eq!(n.images[0].reason, Some(ImageReason::Lazy));
        assert_eq!(
            serde_json::to_value(&n.images[0]).unwrap()["reason"],
            "lazy"
        );
        assert_eq!(n.reasons.len(), 1, "{:?}", n.reasons);
        assert!(
            n.reasons[0]
                .starts_with("1 image present only lazily, and not pinned, the registry link"),
            "{:?}",
            n.reasons
        );
        let accepted = assess_with(&observed, None, LazyImages::Accepted);
        assert!(
            !accepted.ready,
            "a fast start is accepted, an unpinned image is not"
        );
        assert_eq!(accepted.images[0].reason, Some(ImageReason::NotPinned));
    }

    #[test]
    fn a_lazily_present_image_is_not_ready_unless_accepted() {
        let mut lazy = image("q.io/a@sha256:1", Some(true), Some(true), None);
        lazy.lazy = RemoteLayers::of(&[true; 3]);
        let observed = node(vec![lazy, image("b", Some(true), Some(true), None)]);
        let n = assess(&observed, None);
        assert!(!n.ready);
        assert_eq!(n.images[0].reason, Some(ImageReason::Lazy));
        assert_eq!(n.images[1].reason, None);
        assert_eq!(
            n.reasons,
            [
                "1 image present only lazily, the registry link still needed for their layers: q.io/a@sha256:1 \
                 (3 of 3 layers remote); `pinboard apply` makes them whole: it fetches their layers into \
                 containerd's content store and unpacks them there, or pass --allow-lazy when a fast start is \
                 all the set is for"
            ]
        );
        assert_eq!(n.summary(), "1 image lazily present");
        let json = serde_json::to_value(&n.images[0]).unwrap();
        assert_eq!(json["reason"], "lazy");
        assert_eq!(json["lazy"]["layers"], 3);

        let accepted = assess_with(&observed, None, LazyImages::Accepted);
        assert!(accepted.ready, "{:?}", accepted.reasons);
        assert_eq!(accepted.images[0].reason, None);
        assert!(accepted.images[0].lazy.is_some(), "still said");
    }

    #[test]
    fn a_lazily_present_image_its_snapshotter_does_not_serve_is_never_ready() {
        let mut lazy = image("q.io/a@sha256:1", Some(true), Some(true), None);
        lazy.lazy = RemoteLayers::of(&[true, false]).map(|l| RemoteLayers {
            unserved: Some("the snapshotter stargz does not answer: connection refused".into()),
            ..l
        });
        let observed = node(vec![lazy]);
        for accepted in [LazyImages::NotReady, LazyImages::Accepted] {
            let n = assess_with(&observed, None, accepted);
            assert!(!n.ready);
            assert_eq!(n.reasons.len(), 1, "{:?}", n.reasons);
            assert!(
                n.reasons[0].starts_with(
                    "1 image unreadable, its snapshotter not serving: q.io/a@sha256:1 (1 of 2 layers \
                     remote, not served): the snapshotter stargz does not answer: connection refused; no \
                     container can start from them until the snapshotter serves again: start it;"
                ),
                "{}",
                n.reasons[0]
            );
        }
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
        let gone = ObservedNode {
            node: "n9".into(),
            unreachable: Some("connect unix:///x.sock: no such file".into()),
            images: vec![image("a", None, None, None)],
            ..ObservedNode::default()
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
}

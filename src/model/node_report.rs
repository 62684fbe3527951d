//! What an agent says of one set on its node ([`SetReport`]), made of what its rollout did (the engine's
//! [`Rollout`]) and what the runtime then said ([`ObservedNode`]), and, once pinned, what its later checks
//! found lost ([`lost`], [`restoring`]): pure, so the same facts always make the same report, and a report
//! written again only when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::pinboard_api::{
    DEGRADED, Found, ImagePhase, LostImage, LostImages, NodeSetPhase, PROGRESSING, SetImageReport,
    SetOutcome, SetReport,
};
use super::readiness::{ImageReason, ObservedNode, PinnedBy, assess};
use super::reference::{count_images, some_of};
use super::rollout::{self, NodeRollout, NodeState};

/// How many lost images a report names; the count says how many there were.
const LOST_NAMED: usize = 5;

/// A set the agent has not started on at `generation`: every image queued.
pub fn queued(name: &str, generation: i64, images: &[String]) -> SetReport {
    SetReport {
        name: name.to_string(),
        observed_generation: generation,
        state: NodeSetPhase::Queued,
        done_bytes: 0,
        total_bytes: 0,
        images: images
            .iter()
            .map(|image| SetImageReport {
                name: image.clone(),
                ..SetImageReport::default()
            })
            .collect(),
        conditions: Vec::new(),
        fan_out: None,
        outcome: None,
        restores: None,
        checked: None,
    }
}

/// A set while its rollout runs: each image where the engine has it.
pub fn rolling(name: &str, generation: i64, node: &NodeRollout) -> SetReport {
    let images: Vec<SetImageReport> = node
        .images()
        .map(|(image, rollout)| {
            let (state, reason) = match &rollout.state {
                rollout::ImageState::Queued
                | rollout::ImageState::Retrying { .. }
                | rollout::ImageState::Skipped => (ImagePhase::Queued, None),
                rollout::ImageState::Pulling { .. } => (ImagePhase::Pulling, None),
                rollout::ImageState::Present | rollout::ImageState::Pulled { .. } => {
                    (ImagePhase::Pulled, None)
                }
                rollout::ImageState::Lazy { .. } => {
                    (ImagePhase::Pulled, rollout.state.lazy_words())
                }
                rollout::ImageState::Pinned { .. } => (ImagePhase::Pinned, None),
                rollout::ImageState::Failed { reason } => {
                    (ImagePhase::Failed, Some(reason.to_string()))
                }
                rollout::ImageState::Lost { found } => (ImagePhase::Lost, Some(found.to_string())),
                rollout::ImageState::Cancelled => (
                    ImagePhase::Queued,
                    Some("cancelled: the set changed".into()),
                ),
            };
            SetImageReport {
                name: image.to_string(),
                state,
                reason: reason.or_else(|| rollout.retries().last().cloned()),
                done_bytes: rollout.done_bytes,
                total_bytes: rollout.total_bytes,
                evidence: None,
            }
        })
        .collect();
    let failed = match &node.state {
        NodeState::Refused { reason } => Some(reason.clone()),
        NodeState::Stopped { reason } | NodeState::PinFailed { reason } => {
            Some(with_failed_image(reason, node))
        }
        _ => failed_image(node),
    };
    let state = match (&node.state, &failed) {
        (_, Some(_)) => NodeSetPhase::Failed,
        (NodeState::Pinned { .. }, None) => NodeSetPhase::Pinned,
        _ => NodeSetPhase::Pulling,
    };
    SetReport {
        name: name.to_string(),
        observed_generation: generation,
        state,
        done_bytes: node.done_bytes(),
        total_bytes: node.total_bytes(),
        images,
        conditions: conditions(state, failed.as_deref()),
        fan_out: None,
        outcome: Some(outcome(node)),
        restores: None,
        checked: None,
    }
}

/// The first image that failed on `node`, with its reason: `IMAGE: why`.
fn failed_image(node: &NodeRollout) -> Option<String> {
    node.images()
        .find_map(|(image, rollout)| match &rollout.state {
            rollout::ImageState::Failed { reason } => Some(format!("{image}: {reason}")),
            _ => None,
        })
}

/// `why` a rollout failed on `node`, led by its first failed image's own reason, which says more than a
/// count of failures (`IMAGE: the snapshotter stargz does not answer; not pinned: 1 of 1 image(s) failed`).
pub fn with_failed_image(why: &str, node: &NodeRollout) -> String {
    match failed_image(node) {
        Some(image) if !why.contains(&image) => format!("{image}; {why}"),
        _ => why.to_string(),
    }
}

/// What the rollout did on its node so far: its counts and the bytes the engine measured (the plan's
/// figure left to the caller).
pub fn outcome(node: &NodeRollout) -> SetOutcome {
    let fetched = node.fetched();
    SetOutcome {
        images: node.images().len(),
        present: node.present_count(),
        lazy: node.lazy_count(),
        pulled: node.pulled_count(),
        pinned: node.pinned_count(),
        fetched_bytes: fetched.map_or(0, |(bytes, _)| bytes),
        fetched_source: fetched.map(|(_, source)| source),
        planned_bytes: 0,
    }
}

/// A set once the runtime was asked again after its rollout: pinned only where the runtime (or, where it
/// cannot report, the node's pin record) says so, each image with what that rests on.
pub fn verified(mut report: SetReport, observed: &ObservedNode) -> SetReport {
    let judged = assess(observed, None);
    let evidence = match judged.pinned_by {
        Some(PinnedBy::Runtime) => "runtime",
        _ => "record",
    };
    for image in &mut report.images {
        let Some(seen) = judged.images.iter().find(|i| i.reference == image.name) else {
            continue;
        };
        match seen.reason {
            None => {
                image.state = ImagePhase::Pinned;
                image.evidence = Some(evidence.to_string());
            }
            Some(ImageReason::NotPinned) if image.state != ImagePhase::Failed => {
                image.state = ImagePhase::Pulled;
            }
            Some(_) => {}
        }
    }
    if report.state == NodeSetPhase::Pinned && !judged.ready {
        report.state = NodeSetPhase::Failed;
        let why = judged.reasons.join("; ");
        report.conditions = conditions(report.state, Some(&why));
    }
    report
}

/// The images of a set pinned on the node that a later check of the runtime (`observed`, of the set's
/// images) finds lost: absent, present but not pinned, or present only lazily. An image the check could
/// not ask about is not lost: nothing is known of it.
pub fn lost(report: &SetReport, observed: &ObservedNode) -> Vec<LostImage> {
    if observed.unreachable.is_some() {
        return Vec::new();
    }
    let judged = assess(observed, None);
    report
        .images
        .iter()
        .filter_map(|image| {
            let seen = judged.images.iter().find(|i| i.reference == image.name)?;
            let found = match seen.reason? {
                ImageReason::Missing | ImageReason::Pulling => Found::Absent,
                ImageReason::NotPinned => Found::Unpinned,
                ImageReason::Lazy => Found::Lazy,
                ImageReason::Unknown => return None,
            };
            Some(LostImage {
                name: image.name.clone(),
                found,
            })
        })
        .collect()
}

/// The evidence a loss rests on: what the runtime listed, or, for a pin on a runtime that cannot report
/// pins, the node's pin record.
pub fn lost_evidence(found: Found, observed: &ObservedNode) -> &'static str {
    match (found, assess(observed, None).pinned_by) {
        (Found::Unpinned, Some(PinnedBy::Record)) => "record",
        _ => "runtime",
    }
}

/// `lost` as a report names it: the count, the first few images and what was found of each.
pub fn lost_images(lost: &[(LostImage, &'static str)], found_at: Time) -> LostImages {
    LostImages {
        found_at: Some(found_at),
        count: lost.len(),
        images: lost
            .iter()
            .take(LOST_NAMED)
            .map(|(image, _)| image.clone())
            .collect(),
    }
}

/// A pinned set found with `lost` images (each with its evidence): the set is restoring, those images
/// `lost` with what was found; `backing_off`, when the loss recurs, says how often and when the agent
/// puts it back (Degraded).
pub fn restoring(
    mut report: SetReport,
    lost: &[(LostImage, &'static str)],
    backing_off: Option<&str>,
) -> SetReport {
    for image in &mut report.images {
        if let Some((loss, evidence)) = lost.iter().find(|(l, _)| l.name == image.name) {
            image.state = ImagePhase::Lost;
            image.reason = Some(loss.found.words().to_string());
            image.evidence = Some((*evidence).to_string());
            image.done_bytes = 0;
            image.total_bytes = 0;
        }
    }
    report.state = NodeSetPhase::Restoring;
    report.conditions = restoring_conditions(lost, backing_off);
    report
}

/// Progressing while the agent puts lost images back; Degraded when the loss recurs.
fn restoring_conditions(
    lost: &[(LostImage, &'static str)],
    backing_off: Option<&str>,
) -> Vec<Condition> {
    let names: Vec<String> = lost
        .iter()
        .map(|(l, _)| format!("{} ({})", l.name, l.found.words()))
        .collect();
    let what = format!("{} lost: {}", count_images(lost.len()), some_of(&names));
    let mut conditions = vec![condition(
        PROGRESSING,
        true,
        "Restoring",
        format!("the agent puts back {what}"),
    )];
    conditions.push(match backing_off {
        Some(why) => condition(DEGRADED, true, "LostRepeatedly", format!("{what}; {why}")),
        None => condition(DEGRADED, false, "AsExpected", String::new()),
    });
    conditions
}

/// The conditions of a set that failed before its rollout could start (its credentials, say).
pub fn failed_conditions(why: &str) -> Vec<Condition> {
    conditions(NodeSetPhase::Failed, Some(why))
}

/// One condition, as Kubernetes' conventions have it.
fn condition(kind: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: kind.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }
}

/// Why `observed`, the runtime's word at a rollout's end, cannot confirm it: the runtime did not answer,
/// or could not say of some image. None when it answered for every image.
pub fn unanswered(observed: &ObservedNode) -> Option<String> {
    if let Some(why) = &observed.unreachable {
        return Some(why.clone());
    }
    let judged = assess(observed, None);
    judged
        .images
        .iter()
        .any(|i| i.reason == Some(ImageReason::Unknown))
        .then(|| judged.reasons.join("; "))
}

/// A set whose rollout ended without the runtime's word on it (`why`): progressing, not degraded; the
/// agent asks again.
pub fn confirming_conditions(why: &str) -> Vec<Condition> {
    vec![
        condition(
            PROGRESSING,
            true,
            "Confirming",
            format!(
                "the rollout ended, and the runtime did not answer when asked about the set's images \
                 ({why}): the agent asks again"
            ),
        ),
        condition(DEGRADED, false, "AsExpected", String::new()),
    ]
}

/// Progressing and Degraded, as Kubernetes' conventions have them.
fn conditions(state: NodeSetPhase, failed: Option<&str>) -> Vec<Condition> {
    let pulling = state == NodeSetPhase::Pulling;
    vec![
        condition(
            PROGRESSING,
            pulling,
            if pulling { "Pulling" } else { "AsExpected" },
            if pulling {
                "the agent is pulling the set's images".into()
            } else {
                String::new()
            },
        ),
        match failed {
            Some(why) => condition(DEGRADED, true, "PullFailed", why.to_string()),
            None => condition(DEGRADED, false, "AsExpected", String::new()),
        },
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::model::readiness::ImageObserved;
    use crate::model::rollout::{Event, PinMethod, Rollout};

    fn s(text: &str) -> String {
        text.to_string()
    }

    #[test]
    fn a_set_that_failed_leads_with_its_first_failed_images_own_reason() {
        let at = Instant::now();
        let mut r = Rollout::default();
        r.apply(Event::NodeStarted {
            node: s("n1"),
            images: vec![s("a"), s("b")],
            at,
        });
        r.apply(Event::PullFailed {
            node: s("n1"),
            image: s("b"),
            reason: s("the snapshotter stargz does not answer"),
            at,
        });
        let summary = "not pinned: 1 of 2 image(s) failed or were cancelled";
        r.apply(Event::NodeStopped {
            node: s("n1"),
            reason: s(summary),
            at,
        });
        let failed = rolling("web", 1, &r.nodes()["n1"]);
        assert_eq!(failed.state, NodeSetPhase::Failed);
        let why = format!("b: the snapshotter stargz does not answer; {summary}");
        assert_eq!(failed.conditions[1].message, why);
        assert_eq!(with_failed_image(summary, &r.nodes()["n1"]), why);
        assert_eq!(with_failed_image(&why, &r.nodes()["n1"]), why, "said once");
    }

    #[test]
    fn a_rollout_reads_as_the_report_says_it_and_the_runtime_has_the_last_word() {
        let at = Instant::now();
        let mut r = Rollout::default();
        r.apply(Event::NodeStarted {
            node: s("n1"),
            images: vec![s("a"), s("b")],
            at,
        });
        r.apply(Event::ImagePresent {
            node: s("n1"),
            image: s("a"),
        });
        r.apply(Event::PullStarted {
            node: s("n1"),
            image: s("b"),
            attempt: 1,
            at,
        });
        let pulling = rolling("web", 3, &r.nodes()["n1"]);
        assert_eq!(pulling.state, NodeSetPhase::Pulling);
        assert_eq!(pulling.observed_generation, 3);
        assert_eq!(
            pulling.images.iter().map(|i| i.state).collect::<Vec<_>>(),
            [ImagePhase::Pulled, ImagePhase::Pulling]
        );
        assert_eq!(pulling.conditions[0].status, "True", "Progressing");

        r.apply(Event::PullDone {
            node: s("n1"),
            image: s("b"),
            at,
        });
        r.apply(Event::Pinned {
            node: s("n1"),
            method: PinMethod::ContainerdLabel,
            confirmed: true,
            at,
        });
        let pinned = rolling("web", 3, &r.nodes()["n1"]);
        assert_eq!(pinned.state, NodeSetPhase::Pinned);

        // The runtime then says b is not pinned after all: the set is not pinned, and says why.
        let image = |reference: &str, pinned: bool| ImageObserved {
            reference: s(reference),
            present: Some(true),
            reported_pinned: Some(pinned),
            ..ImageObserved::default()
        };
        let observed = ObservedNode {
            node: s("n1"),
            runtime: Some(s("containerd 1.7.24")),
            images: vec![image("a", true), image("b", false)],
            ..ObservedNode::default()
        };
        let report = verified(pinned, &observed);
        assert_eq!(report.images[0].evidence.as_deref(), Some("runtime"));
        assert_eq!(report.images[1].state, ImagePhase::Pulled);
        assert_eq!(report.state, NodeSetPhase::Failed);
        let degraded = &report.conditions[1];
        assert_eq!(
            (degraded.type_.as_str(), degraded.status.as_str()),
            (DEGRADED, "True")
        );
        assert!(
            degraded.message.contains("not pinned"),
            "{}",
            degraded.message
        );
    }
}

//! The engine's events an agent's report stands for: on agents the engine runs on each node and only its
//! reports reach pinboard, so the Rollout screen folds the events one report's change of a set implies,
//! in the order the engine would have sent them. Pure: the same two reports always give the same events.

use std::time::{Duration, Instant};

use super::pinboard_api::{ImagePhase, NodeSetPhase, SetImageReport, SetReport};
use super::rollout::{Event, PinMethod};

/// The events that take node `node` from `before` (None: not started) to `after` for one set; `method` is
/// how the node pins.
pub fn events_between(
    node: &str,
    before: Option<&SetReport>,
    after: &SetReport,
    method: PinMethod,
    at: Instant,
) -> Vec<Event> {
    let node = node.to_owned();
    let restarted = before.is_none_or(|b| b.observed_generation != after.observed_generation);
    let before = before.filter(|_| !restarted);
    let mut events = Vec::new();
    if restarted {
        events.push(Event::NodeStarted {
            node: node.clone(),
            images: after.images.iter().map(|i| i.name.clone()).collect(),
            at,
        });
    }
    for image in &after.images {
        let was = before.and_then(|b| b.images.iter().find(|i| i.name == image.name));
        events.extend(image_events(&node, was, image, at));
    }
    let was_state = before.map(|b| b.state);
    match after.state {
        NodeSetPhase::Pinned if was_state != Some(NodeSetPhase::Pinned) => {
            events.push(Event::Pinned {
                node,
                method,
                confirmed: after
                    .images
                    .iter()
                    .all(|i| i.evidence.as_deref() == Some("runtime")),
                at,
            })
        }
        // A failed image says so itself; a node that failed as a whole (no room) stops.
        NodeSetPhase::Failed
            if was_state != Some(NodeSetPhase::Failed)
                && !after.images.iter().any(|i| i.state == ImagePhase::Failed) =>
        {
            let reason = after
                .conditions
                .iter()
                .find(|c| c.type_ == super::pinboard_api::DEGRADED)
                .map_or_else(|| "failed".to_owned(), |c| c.message.clone());
            events.push(Event::NodeStopped { node, reason, at });
        }
        _ => {}
    }
    events
}

/// One image's events from `was` (None: queued) to `now`.
fn image_events(
    node: &str,
    was: Option<&SetImageReport>,
    now: &SetImageReport,
    at: Instant,
) -> Vec<Event> {
    let (node, image) = (node.to_owned(), now.name.clone());
    // What was lost is put back as a queued image is pulled: from nothing.
    let was_phase = match was.map_or(ImagePhase::Queued, |w| w.state) {
        ImagePhase::Lost if now.state != ImagePhase::Lost => ImagePhase::Queued,
        phase => phase,
    };
    let started = |attempt| Event::PullStarted {
        node: node.clone(),
        image: image.clone(),
        attempt,
        at,
    };
    let progress = || Event::PullProgress {
        node: node.clone(),
        image: image.clone(),
        done: now.done_bytes,
        total: now.total_bytes,
        at,
    };
    let mut events = Vec::new();
    match (was_phase, now.state) {
        (ImagePhase::Queued, ImagePhase::Pulling) => events.extend([started(1), progress()]),
        (ImagePhase::Pulling, ImagePhase::Pulling) => {
            if let Some(reason) = now
                .reason
                .as_ref()
                .filter(|r| was.and_then(|w| w.reason.as_ref()) != Some(*r))
            {
                events.push(Event::PullRetry {
                    node: node.clone(),
                    image: image.clone(),
                    attempt: 1,
                    reason: reason.clone(),
                    backoff: Duration::ZERO,
                    at,
                });
                events.push(started(2));
            }
            if was.is_none_or(|w| w.done_bytes != now.done_bytes) {
                events.push(progress());
            }
        }
        // Pulled or pinned without a pull seen: it was there already, unless it has bytes to show.
        (ImagePhase::Queued, ImagePhase::Pulled | ImagePhase::Pinned) if now.total_bytes == 0 => {
            events.push(Event::ImagePresent { node, image })
        }
        (ImagePhase::Queued, ImagePhase::Pulled | ImagePhase::Pinned) => {
            events.extend([started(1), progress(), Event::PullDone { node, image, at }])
        }
        (ImagePhase::Pulling, ImagePhase::Pulled | ImagePhase::Pinned) => {
            events.extend([progress(), Event::PullDone { node, image, at }])
        }
        (was, ImagePhase::Lost) if was != ImagePhase::Lost => events.push(Event::ImageLost {
            node,
            image,
            found: now.reason.clone().unwrap_or_else(|| "lost".into()),
            at,
        }),
        (was, ImagePhase::Failed) if was != ImagePhase::Failed => events.push(Event::PullFailed {
            node,
            image,
            reason: now.reason.clone().unwrap_or_else(|| "failed".into()),
            at,
        }),
        _ => {}
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rollout::{ImageState as Shown, Rollout};

    fn image(name: &str, state: ImagePhase, done: u64, total: u64) -> SetImageReport {
        SetImageReport {
            name: name.into(),
            state,
            done_bytes: done,
            total_bytes: total,
            ..SetImageReport::default()
        }
    }

    fn report(state: NodeSetPhase, images: Vec<SetImageReport>) -> SetReport {
        SetReport {
            name: "web".into(),
            observed_generation: 1,
            state,
            images,
            ..SetReport::default()
        }
    }

    #[test]
    fn the_rollout_screen_folds_a_nodes_reports_into_the_bytes_and_states_the_engine_had() {
        let at = Instant::now();
        let reports = [
            report(
                NodeSetPhase::Queued,
                vec![
                    image("a", ImagePhase::Queued, 0, 0),
                    image("b", ImagePhase::Queued, 0, 0),
                ],
            ),
            report(
                NodeSetPhase::Pulling,
                vec![
                    image("a", ImagePhase::Pulled, 0, 0),
                    image("b", ImagePhase::Pulling, 10, 100),
                ],
            ),
            report(
                NodeSetPhase::Pulling,
                vec![
                    image("a", ImagePhase::Pulled, 0, 0),
                    image("b", ImagePhase::Pulling, 60, 100),
                ],
            ),
        ];
        let mut rollout = Rollout::default();
        let mut before: Option<&SetReport> = None;
        for after in &reports {
            for event in events_between("n1", before, after, PinMethod::ContainerdLabel, at) {
                rollout.apply(event);
            }
            before = Some(after);
        }
        let node = &rollout.nodes()["n1"];
        let states: Vec<(&str, &Shown, u64)> = node
            .images()
            .map(|(name, i)| (name, &i.state, i.done_bytes))
            .collect();
        assert_eq!(states[0].1, &Shown::Present, "a was there: nothing pulled");
        assert!(matches!(states[1].1, Shown::Pulling { .. }), "{states:?}");
        assert_eq!(states[1].2, 60, "b's bytes as its agent last said");

        // The agent pins; the runtime confirmed every image.
        let mut done = report(
            NodeSetPhase::Pinned,
            vec![
                image("a", ImagePhase::Pinned, 0, 0),
                image("b", ImagePhase::Pinned, 100, 100),
            ],
        );
        for i in &mut done.images {
            i.evidence = Some("runtime".into());
        }
        for event in events_between("n1", before, &done, PinMethod::ContainerdLabel, at) {
            rollout.apply(event);
        }
        assert!(
            matches!(
                rollout.nodes()["n1"].state,
                crate::model::rollout::NodeState::Pinned { .. }
            ),
            "{:?}",
            rollout.nodes()["n1"].state
        );
        // The same report again says nothing new.
        assert!(
            events_between("n1", Some(&done), &done, PinMethod::ContainerdLabel, at).is_empty()
        );
    }

    #[test]
    fn a_failed_image_and_a_node_without_room_read_as_the_engine_says_them() {
        let at = Instant::now();
        let mut failed = report(
            NodeSetPhase::Failed,
            vec![image("a", ImagePhase::Failed, 0, 0)],
        );
        failed.images[0].reason = Some("manifest unknown".into());
        let events = events_between("n1", None, &failed, PinMethod::ContainerdLabel, at);
        assert!(
            events.iter().any(
                |e| matches!(e, Event::PullFailed { reason, .. } if reason == "manifest unknown")
            ),
            "{events:?}"
        );
        let mut full = report(
            NodeSetPhase::Failed,
            vec![image("a", ImagePhase::Queued, 0, 0)],
        );
        full.conditions = crate::model::node_report::failed_conditions("no space: 1 GiB free");
        let events = events_between("n1", None, &full, PinMethod::ContainerdLabel, at);
        assert!(
            events.iter().any(
                |e| matches!(e, Event::NodeStopped { reason, .. } if reason.contains("no space"))
            ),
            "{events:?}"
        );
    }

    #[test]
    fn a_lost_image_shows_as_lost_on_a_restoring_node_and_pinned_again_once_put_back() {
        let at = Instant::now();
        let pinned = |state| {
            let mut r = report(
                state,
                vec![
                    image("a", ImagePhase::Pinned, 0, 0),
                    image("b", ImagePhase::Pinned, 0, 0),
                ],
            );
            r.images
                .iter_mut()
                .for_each(|i| i.evidence = Some("runtime".into()));
            r
        };
        let first = pinned(NodeSetPhase::Pinned);
        let mut lost = pinned(NodeSetPhase::Restoring);
        lost.images[1].state = ImagePhase::Lost;
        lost.images[1].reason = Some("absent".into());
        let mut pulling = lost.clone();
        pulling.images[1] = image("b", ImagePhase::Pulling, 40, 100);
        let back = pinned(NodeSetPhase::Pinned);

        let mut rollout = Rollout::default();
        let mut before: Option<&SetReport> = None;
        let mut fold = |after: &SetReport, before: &mut Option<&SetReport>| {
            for event in events_between("n1", *before, after, PinMethod::ContainerdLabel, at) {
                rollout.apply(event);
            }
            rollout.nodes()["n1"].clone()
        };
        fold(&first, &mut before);
        before = Some(&first);
        let node = fold(&lost, &mut before);
        assert!(matches!(
            node.state,
            crate::model::rollout::NodeState::Restoring { .. }
        ));
        let b = node.image("b").unwrap();
        assert_eq!(
            b.state,
            Shown::Lost {
                found: "absent".into()
            }
        );
        assert!(matches!(
            node.image("a").unwrap().state,
            Shown::Pinned { .. }
        ));
        before = Some(&lost);
        let node = fold(&pulling, &mut before);
        assert!(matches!(
            node.image("b").unwrap().state,
            Shown::Pulling { .. }
        ));
        before = Some(&pulling);
        let node = fold(&back, &mut before);
        assert!(matches!(
            node.state,
            crate::model::rollout::NodeState::Pinned { .. }
        ));
        assert!(matches!(
            node.image("b").unwrap().state,
            Shown::Pinned { confirmed: true }
        ));
    }
}

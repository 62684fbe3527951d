//! The agent's decisions, case by case, without a cluster or a clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;
use crate::model::holders::Sets;
use crate::model::labels::parse_selector;
use crate::model::pinboard_api::{
    DEGRADED, Found, ImagePhase, ImageReport, NodeSetPhase, ObjectMeta, PinSetSpec, PinnedImage,
};
use crate::model::readiness::ImageObserved;
use crate::model::rollout::PinMethod;

const NODE: &str = "n1";

fn set(name: &str, generation: i64, images: &[&str]) -> PinSet {
    PinSet {
        metadata: ObjectMeta {
            name: name.into(),
            generation: Some(generation),
            ..ObjectMeta::default()
        },
        spec: PinSetSpec {
            pinned_images: images
                .iter()
                .map(|i| PinnedImage { name: (*i).into() })
                .collect(),
            ..PinSetSpec::default()
        },
        status: None,
    }
}

fn selecting(mut set: PinSet, key: &str, value: &str) -> PinSet {
    set.spec.node_selector = Some(parse_selector(&format!("{key}={value}")).expect("a selector"));
    set
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// Its Node as the watch has it, not gated.
fn node(pairs: &[(&str, &str)]) -> Input {
    Input::Node {
        labels: labels(pairs),
        gated: false,
    }
}

/// Facts of a node holding `held`: (image, the sets holding its pin).
fn facts(held: &[(&str, &[&str])]) -> Box<NodeReport> {
    Box::new(NodeReport {
        images: held
            .iter()
            .map(|(image, sets)| ImageReport {
                names: vec![(*image).to_string()],
                pinned: !sets.is_empty(),
                held_by: sets.iter().map(|s| (*s).to_string()).collect(),
                ..ImageReport::default()
            })
            .collect(),
        ..NodeReport::default()
    })
}

/// The runtime's word on `images`: (image, present, pinned).
fn observed(images: &[(&str, bool, bool)]) -> ObservedNode {
    ObservedNode {
        node: NODE.into(),
        runtime: Some("containerd 1.7.24".into()),
        images: images
            .iter()
            .map(|(image, present, pinned)| ImageObserved {
                reference: (*image).into(),
                present: Some(*present),
                reported_pinned: present.then_some(*pinned),
                ..ImageObserved::default()
            })
            .collect(),
        ..ObservedNode::default()
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// An agent that has seen its Node, its labels, its facts and `sets`.
fn agent(sets: Vec<PinSet>, now: Instant) -> (AgentState, Vec<Action>) {
    let mut state = AgentState::new(NODE, Timing::default());
    assert!(state.update(Input::NodeKnown, now).is_empty());
    assert!(state.update(node(&[("role", "web")]), now).is_empty());
    assert!(state.update(Input::Facts(facts(&[])), now).is_empty());
    let actions = state.update(Input::Sets(sets), now);
    (state, actions)
}

fn started(actions: &[Action]) -> Option<&Start> {
    actions.iter().find_map(|a| match a {
        Action::RollOut(start) => Some(start),
        _ => None,
    })
}

/// Carries the rollout `actions` started through to its end, the runtime saying every image is there and
/// pinned.
fn pin_through(state: &mut AgentState, actions: &[Action], now: Instant) -> Vec<Action> {
    let start = started(actions).expect("a rollout").clone();
    assert!(
        state
            .update(Input::Started { fan_out: None }, now)
            .is_empty()
    );
    let events = [
        Event::NodeStarted {
            node: NODE.into(),
            images: start.images.clone(),
            at: now,
        },
        Event::Pinned {
            node: NODE.into(),
            method: PinMethod::ContainerdLabel,
            confirmed: true,
            at: now,
        },
    ];
    for image in &start.images {
        state.update(
            Input::Rollout(
                Event::ImagePresent {
                    node: NODE.into(),
                    image: image.clone(),
                },
                None,
            ),
            now,
        );
    }
    for event in events {
        state.update(Input::Rollout(event, None), now);
    }
    let everything: Vec<(&str, bool, bool)> = start
        .images
        .iter()
        .map(|i| (i.as_str(), true, true))
        .collect();
    state.update(
        Input::Ended {
            failure: None,
            observed: Some(observed(&everything)),
            fan_out: None,
            relayed: None,
        },
        now,
    )
}

/// The Events `actions` record: (reason, message).
fn recorded(actions: &[Action]) -> Vec<(&'static str, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record(note) => Some((note.reason, note.message.clone())),
            _ => None,
        })
        .collect()
}

fn report<'a>(state: &'a AgentState, name: &str) -> &'a SetReport {
    state
        .reports()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no report of {name}"))
}

fn verify_due(state: &mut AgentState, now: Instant) -> Vec<String> {
    state
        .update(Input::Tick, now)
        .into_iter()
        .find_map(|a| match a {
            Action::Verify(images) => Some(images),
            _ => None,
        })
        .expect("a check of the runtime")
}

#[test]
fn before_the_sets_are_listed_nothing_is_released_or_rolled_out() {
    let now = Instant::now();
    let mut state = AgentState::new(NODE, Timing::default());
    state.update(Input::NodeKnown, now);
    state.update(node(&[("role", "web")]), now);
    // A restarted agent: its node holds pins of set "web", and the sets' watch has said nothing yet.
    let actions = state.update(Input::Facts(facts(&[("a@sha256:1", &["web"])])), now);
    assert!(actions.is_empty(), "{actions:?}");
    let ticked = state.update(Input::Tick, now + secs(1));
    assert!(
        ticked
            .iter()
            .all(|a| !matches!(a, Action::Release { .. } | Action::RollOut(_))),
        "{ticked:?}"
    );
    // Once listed, with "web" still there, it is rolled out (its pins kept), not released.
    let actions = state.update(
        Input::Sets(vec![set("web", 1, &["a@sha256:1"])]),
        now + secs(2),
    );
    assert_eq!(started(&actions).map(|s| s.set.as_str()), Some("web"));
    assert!(!actions.iter().any(|a| matches!(a, Action::Release { .. })));
}

#[test]
fn a_set_is_rolled_out_pinned_and_then_checked_against_the_runtime() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1", "b@sha256:2"])], now);
    let start = started(&actions).expect("rolled out");
    assert_eq!((start.generation, start.restore), (1, false));
    let after = pin_through(&mut state, &actions, now);
    assert!(after.contains(&Action::ReadFacts), "{after:?}");
    assert_eq!(report(&state, "web").state, NodeSetPhase::Pinned);
    assert_eq!(recorded(&after)[0].0, "Pinned");
    // Nothing to do until the check falls due; then both images are asked about.
    let images = verify_due(&mut state, now + secs(31));
    assert_eq!(images, ["a@sha256:1", "b@sha256:2"]);
}

#[test]
fn a_lost_image_makes_the_set_restoring_at_once_and_it_is_put_back() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1", "b@sha256:2"])], now);
    pin_through(&mut state, &actions, now);
    let at = now + secs(31);
    verify_due(&mut state, at);
    // `ctr images rm b`: the runtime no longer lists it.
    let actions = state.update(
        Input::Verified(observed(&[
            ("a@sha256:1", true, true),
            ("b@sha256:2", false, false),
        ])),
        at,
    );
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Restoring);
    let b = web.images.iter().find(|i| i.name == "b@sha256:2").unwrap();
    assert_eq!(b.state, ImagePhase::Lost);
    assert_eq!(b.reason.as_deref(), Some("absent"));
    assert_eq!(b.evidence.as_deref(), Some("runtime"));
    let a = web.images.iter().find(|i| i.name == "a@sha256:1").unwrap();
    assert_eq!(a.state, ImagePhase::Pinned, "what is still there stays so");
    let progressing = &web.conditions[0];
    assert!(
        progressing.message.contains("b@sha256:2 (absent)"),
        "{progressing:?}"
    );
    // The first loss is put back at once.
    let start = started(&actions).expect("a restore");
    assert!(start.restore);
    assert_eq!(start.set, "web");
    let told = recorded(&actions);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, "ImageLost");
    assert!(told[0].1.contains("b@sha256:2 (absent)"), "{told:?}");

    let after = pin_through(&mut state, &actions, at + secs(5));
    assert!(after.contains(&Action::ReadFacts));
    assert_eq!(recorded(&after)[0].0, "Restored");
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Pinned);
    let restores = web.restores.as_ref().expect("the restore is counted");
    assert_eq!((restores.count, restores.recent), (1, 1));
    assert_eq!(restores.last.images[0].name, "b@sha256:2");
    assert_eq!(restores.last.images[0].found, Found::Absent);
    let degraded = web.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(degraded.status, "False", "one loss is not a fight");
}

/// Set web of image a pinned, then the runtime's word on a at the next check: the state, what it decided
/// and when.
fn web_pinned_then_found(a: (&str, bool, bool)) -> (AgentState, Vec<Action>, Instant) {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    pin_through(&mut state, &actions, now);
    let at = now + secs(31);
    verify_due(&mut state, at);
    let actions = state.update(Input::Verified(observed(&[a])), at);
    (state, actions, at)
}

#[test]
fn a_lost_pin_is_named_as_such_and_pinned_again() {
    // The pin label was removed: the image is there, not pinned.
    let (state, actions, _) = web_pinned_then_found(("a@sha256:1", true, false));
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Restoring);
    assert_eq!(web.images[0].state, ImagePhase::Lost);
    assert_eq!(
        web.images[0].reason.as_deref(),
        Some("present but not pinned")
    );
    assert!(started(&actions).is_some_and(|s| s.restore));
}

#[test]
fn a_loss_that_recurs_waits_longer_each_time_and_says_so_in_degraded() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    pin_through(&mut state, &actions, now);
    let gone = || Input::Verified(observed(&[("a@sha256:1", false, false)]));

    let first = now + secs(31);
    verify_due(&mut state, first);
    let actions = state.update(gone(), first);
    pin_through(&mut state, &actions, first + secs(1));

    // Lost again a minute later: restoring at once in the report, but put back only after a wait.
    let second = first + secs(62);
    verify_due(&mut state, second);
    let actions = state.update(gone(), second);
    assert!(started(&actions).is_none(), "no hot loop: {actions:?}");
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Restoring);
    let degraded = web.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "LostRepeatedly")
    );
    assert!(
        degraded.message.contains("lost 2 times in the last hour"),
        "{degraded:?}"
    );
    assert!(degraded.message.contains("a@sha256:1"), "{degraded:?}");
    let waiting = state.update(Input::Tick, second + secs(10));
    assert!(started(&waiting).is_none(), "{waiting:?}");
    let actions = state.update(Input::Tick, second + secs(30));
    assert!(started(&actions).is_some_and(|s| s.restore), "{actions:?}");
    pin_through(&mut state, &actions, second + secs(31));
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Pinned);
    assert_eq!(
        web.restores.as_ref().map(|r| (r.count, r.recent)),
        Some((2, 2))
    );
    let degraded = web.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(
        degraded.status, "True",
        "pinned again, but something fights the pins"
    );
}

#[test]
fn a_set_changed_mid_rollout_is_cancelled_and_rolled_out_at_its_new_generation() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    assert!(started(&actions).is_some());
    state.update(Input::Started { fan_out: None }, now);
    let actions = state.update(
        Input::Sets(vec![set("web", 2, &["b@sha256:2"])]),
        now + secs(1),
    );
    assert_eq!(actions, [Action::Cancel]);
    // Asked once: the next tick does not cancel again.
    let ticked = state.update(Input::Tick, now + secs(2));
    assert!(!ticked.contains(&Action::Cancel), "{ticked:?}");
    let actions = state.update(
        Input::Ended {
            failure: Some("cancelled".into()),
            observed: None,
            fan_out: None,
            relayed: None,
        },
        now + secs(3),
    );
    assert!(
        recorded(&actions).is_empty(),
        "a cancel is no failure: {actions:?}"
    );
    let start = started(&actions).expect("the new generation, at once");
    assert_eq!(
        (start.generation, start.images.as_slice()),
        (2, &["b@sha256:2".to_string()][..])
    );
}

#[test]
fn a_set_that_stops_selecting_the_node_is_cancelled_then_released() {
    let now = Instant::now();
    let web = selecting(set("web", 1, &["a@sha256:1"]), "role", "web");
    let (mut state, actions) = agent(vec![web], now);
    assert!(started(&actions).is_some());
    state.update(Input::Started { fan_out: None }, now);
    // The node is relabelled: the set no longer selects it.
    let actions = state.update(node(&[("role", "db")]), now + secs(1));
    assert_eq!(actions, [Action::Cancel]);
    let actions = state.update(
        Input::Ended {
            failure: Some("cancelled".into()),
            observed: None,
            fan_out: None,
            relayed: None,
        },
        now + secs(2),
    );
    assert!(started(&actions).is_none());
    assert_eq!(
        state.reports().count(),
        0,
        "no report of a set that does not select it"
    );
    // Its pins (held by "web", as the facts say) are released.
    let actions = state.update(
        Input::Facts(facts(&[("a@sha256:1", &["web"])])),
        now + secs(3),
    );
    let release = actions
        .iter()
        .find_map(|a| match a {
            Action::Release { scope, set } => Some((scope, set)),
            _ => None,
        })
        .expect("a release");
    assert_eq!(release.1, "web");
    assert_eq!(release.0.sets, Sets::Named(["web".to_string()].into()));
    // A release that did not take is not tried every second.
    let again = state.update(
        Input::Facts(facts(&[("a@sha256:1", &["web"])])),
        now + secs(4),
    );
    assert!(
        !again.iter().any(|a| matches!(a, Action::Release { .. })),
        "{again:?}"
    );
}

#[test]
fn images_a_new_generation_drops_lose_the_sets_hold_once_it_is_pinned() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1", "b@sha256:2"])], now);
    pin_through(&mut state, &actions, now);
    state.update(
        Input::Facts(facts(&[("a@sha256:1", &["web"]), ("b@sha256:2", &["web"])])),
        now,
    );
    let actions = state.update(
        Input::Sets(vec![set("web", 2, &["a@sha256:1"])]),
        now + secs(1),
    );
    assert_eq!(started(&actions).map(|s| s.generation), Some(2));
    let after = pin_through(&mut state, &actions, now + secs(2));
    let release = after
        .iter()
        .find_map(|a| match a {
            Action::Release { scope, .. } => Some(scope),
            _ => None,
        })
        .expect("b loses web's hold");
    assert_eq!(release.only, Some(["b@sha256:2".to_string()].into()));
}

#[test]
fn a_failed_set_is_tried_again_after_a_while_not_every_second() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    assert!(started(&actions).is_some());
    let actions = state.update(Input::NotStarted("no credentials".into()), now);
    assert!(started(&actions).is_none(), "{actions:?}");
    assert_eq!(
        recorded(&actions),
        [(
            "PullFailed",
            "set web could not start: no credentials".to_string()
        )]
    );
    assert_eq!(report(&state, "web").state, NodeSetPhase::Failed);
    assert!(started(&state.update(Input::Tick, now + secs(30))).is_none());
    assert!(started(&state.update(Input::Tick, now + secs(61))).is_some());
}

#[test]
fn a_fan_out_set_waiting_for_the_cache_is_asked_again_with_when_it_started_waiting() {
    let now = Instant::now();
    let mut web = set("web", 1, &["a@sha256:1"]);
    web.spec.fan_out = true;
    let (mut state, actions) = agent(vec![web], now);
    let start = started(&actions).expect("rolled out");
    assert!(start.fan_out && start.waiting_since.is_none());
    state.update(Input::WaitingForCache(now), now);
    let actions = state.update(Input::Tick, now + secs(1));
    assert_eq!(started(&actions).and_then(|s| s.waiting_since), Some(now));
}

#[test]
fn a_change_the_runtime_announces_is_checked_within_a_second() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    pin_through(&mut state, &actions, now);
    verify_due(&mut state, now + secs(1));
    // Checked just now: the next is 30 s away, unless the runtime says an image changed.
    assert!(
        !state
            .update(Input::Tick, now + secs(2))
            .iter()
            .any(|a| matches!(a, Action::Verify(_)))
    );
    state.update(Input::RuntimeChanged, now + secs(3));
    verify_due(&mut state, now + secs(4));
}

#[test]
fn a_report_that_changed_is_written_at_once_when_it_is_news_else_once_an_interval() {
    let now = Instant::now();
    let interval = secs(5);
    assert!(write_due(true, Some(now), interval, now));
    assert!(!write_due(false, Some(now), interval, now + secs(4)));
    assert!(write_due(false, Some(now), interval, now + secs(5)));
    assert!(write_due(false, None, interval, now));
}

/// An agent with the gate on (`deadline`), on a node registered with the gate's taint.
fn gated_agent(deadline: Option<Duration>, now: Instant) -> AgentState {
    let timing = Timing {
        gate: Some(deadline),
        ..Timing::default()
    };
    let mut state = AgentState::new(NODE, timing);
    state.update(Input::NodeKnown, now);
    state.update(
        Input::Node {
            labels: labels(&[("role", "web")]),
            gated: true,
        },
        now,
    );
    state.update(Input::Facts(facts(&[])), now);
    state
}

fn lifts(actions: &[Action]) -> bool {
    actions.contains(&Action::LiftGate)
}

#[test]
fn the_gate_lifts_once_every_set_selecting_the_node_is_pinned_and_not_before_the_sets_are_listed() {
    let now = Instant::now();
    let mut state = gated_agent(Some(secs(1800)), now);
    assert!(
        !lifts(&state.update(Input::Tick, now)),
        "the sets are not listed yet"
    );
    let actions = state.update(Input::Sets(vec![set("web", 1, &["a@sha256:1"])]), now);
    assert!(!lifts(&actions));
    state.update(Input::Started { fan_out: None }, now);
    assert!(
        !lifts(&state.update(Input::Tick, now + secs(1))),
        "still pulling"
    );
    let start = Start {
        set: "web".into(),
        generation: 1,
        images: vec!["a@sha256:1".into()],
        fan_out: false,
        waiting_since: None,
        restore: false,
    };
    pin_through(&mut state, &[Action::RollOut(start)], now + secs(2));
    let actions = state.update(Input::Tick, now + secs(3));
    assert!(lifts(&actions), "{actions:?}");
    assert_eq!(recorded(&actions)[0].0, "GateLifted");
    // Asked once; asked again only if the taint stays a while (its removal failed).
    assert!(!lifts(&state.update(Input::Tick, now + secs(4))));
    assert!(lifts(&state.update(Input::Tick, now + secs(64))));
    // Lifted: the watch sees the Node without the taint; nothing more to do.
    state.update(node(&[("role", "web")]), now + secs(65));
    assert!(!lifts(&state.update(Input::Tick, now + secs(200))));
}

#[test]
fn a_node_no_set_selects_is_let_through_and_a_set_failing_for_good_holds_it_until_the_deadline() {
    let now = Instant::now();
    let mut state = gated_agent(Some(secs(1800)), now);
    let db = selecting(set("db", 1, &["d@sha256:1"]), "role", "db");
    state.update(Input::Sets(vec![db]), now);
    let actions = state.update(Input::Tick, now + secs(1));
    assert!(lifts(&actions));
    assert!(
        recorded(&actions)[0].1.contains("no set selects the node"),
        "{actions:?}"
    );

    let mut state = gated_agent(Some(secs(1800)), now);
    state.update(Input::Sets(vec![set("web", 1, &["a@sha256:1"])]), now);
    state.update(Input::NotStarted("manifest unknown".into()), now);
    assert!(!lifts(&state.update(Input::Tick, now + secs(1799))));
    let actions = state.update(Input::Tick, now + secs(1800));
    assert!(lifts(&actions));
    let (reason, message) = &recorded(&actions)[0];
    assert_eq!(*reason, "GateDeadline");
    assert!(
        message.contains("--gate-deadline") && message.contains("web"),
        "{message}"
    );

    // Without a deadline, only an administrator lets it through.
    let mut state = gated_agent(None, now);
    state.update(Input::Sets(vec![set("web", 1, &["a@sha256:1"])]), now);
    state.update(Input::NotStarted("manifest unknown".into()), now);
    assert!(!lifts(&state.update(Input::Tick, now + secs(86_400))));
}

#[test]
fn without_the_gate_the_agent_never_touches_the_nodes_taints() {
    let now = Instant::now();
    let mut state = AgentState::new(NODE, Timing::default());
    state.update(Input::NodeKnown, now);
    state.update(
        Input::Node {
            labels: labels(&[]),
            gated: true,
        },
        now,
    );
    state.update(Input::Facts(facts(&[])), now);
    state.update(Input::Sets(Vec::new()), now);
    assert!(!lifts(&state.update(Input::Tick, now + secs(1))));
}

/// Carries the rollout `actions` started through to an end where the runtime could not say of its images.
fn end_unanswered(state: &mut AgentState, actions: &[Action], now: Instant) -> Vec<Action> {
    let start = started(actions).expect("a rollout").clone();
    state.update(Input::Started { fan_out: None }, now);
    let mut events = vec![Event::NodeStarted {
        node: NODE.into(),
        images: start.images.clone(),
        at: now,
    }];
    events.extend(start.images.iter().map(|image| Event::ImagePresent {
        node: NODE.into(),
        image: image.clone(),
    }));
    events.push(Event::Pinned {
        node: NODE.into(),
        method: PinMethod::ContainerdLabel,
        confirmed: true,
        at: now,
    });
    for event in events {
        state.update(Input::Rollout(event, None), now);
    }
    let unanswered = ObservedNode {
        node: NODE.into(),
        runtime: Some("containerd 1.7.24".into()),
        error: Some("ImageStatus: deadline exceeded".into()),
        images: start
            .images
            .iter()
            .map(|image| ImageObserved {
                reference: image.clone(),
                ..ImageObserved::default()
            })
            .collect(),
        ..ObservedNode::default()
    };
    state.update(
        Input::Ended {
            failure: None,
            observed: Some(unanswered),
            fan_out: None,
            relayed: None,
        },
        now,
    )
}

#[test]
fn a_rollout_whose_end_the_runtime_does_not_confirm_is_neither_pinned_nor_failed_until_it_answers()
{
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    let after = end_unanswered(&mut state, &actions, now);
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Pulling, "{web:?}");
    assert_eq!(web.conditions[0].reason, "Confirming");
    assert!(
        web.conditions[0]
            .message
            .contains("ImageStatus: deadline exceeded"),
        "{:?}",
        web.conditions
    );
    assert!(recorded(&after).is_empty(), "no failure to tell: {after:?}");
    assert!(started(&after).is_none(), "not at once: {after:?}");
    assert!(
        started(&state.update(Input::Tick, now + secs(1))).is_none(),
        "nor within a second"
    );
    // Rolled out again (what is present is not pulled again); this time the runtime answers.
    let again = state.update(Input::Tick, now + secs(2));
    let after = pin_through(&mut state, &again, now + secs(3));
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Pinned);
    assert_eq!(web.images[0].evidence.as_deref(), Some("runtime"));
    assert_eq!(recorded(&after)[0].0, "Pinned");
}

#[test]
fn a_runtime_that_never_answers_at_the_end_fails_the_set_with_its_silence_as_the_reason() {
    let now = Instant::now();
    let (mut state, mut actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    let mut at = now;
    // Asked again after 2, 4 and 8 s: three silences leave the set pulling, the fourth fails it.
    for wait in [2, 4, 8] {
        end_unanswered(&mut state, &actions, at);
        assert_eq!(report(&state, "web").state, NodeSetPhase::Pulling);
        assert!(started(&state.update(Input::Tick, at + secs(wait - 1))).is_none());
        at += secs(wait);
        actions = state.update(Input::Tick, at);
        assert!(started(&actions).is_some(), "after {wait} s");
    }
    let after = end_unanswered(&mut state, &actions, at);
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Failed);
    assert!(
        web.conditions[1]
            .message
            .contains("ImageStatus: deadline exceeded"),
        "{:?}",
        web.conditions
    );
    assert_eq!(recorded(&after)[0].0, "PullFailed");
}

#[test]
fn a_sets_bytes_count_from_zero_before_its_rollout_and_rise_while_it_pulls() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    assert_eq!(
        state.tallies().get("web").map(|t| t.pulled_bytes),
        Some(0),
        "exposed from 0 before the first byte"
    );
    let start = started(&actions).expect("a rollout").clone();
    state.update(Input::Started { fan_out: None }, now);
    let progress = |done| {
        Input::Rollout(
            Event::PullProgress {
                node: NODE.into(),
                image: start.images[0].clone(),
                done,
                total: 1000,
                at: now,
            },
            None,
        )
    };
    state.update(progress(400), now);
    assert_eq!(state.tallies()["web"].pulled_bytes, 400, "while it pulls");
    state.update(progress(1000), now);
    assert_eq!(state.tallies()["web"].pulled_bytes, 1000);
}

fn reads_facts(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::ReadFacts))
}

#[test]
fn a_runtime_change_is_read_for_the_plans_within_seconds_and_a_burst_is_one_read() {
    let now = Instant::now();
    let (mut state, _) = agent(Vec::new(), now);
    // A pod's pull: containerd announces its image, then more events of the same pull.
    let changed = now + secs(20);
    state.update(Input::RuntimeChanged, changed);
    state.update(Input::RuntimeChanged, changed + secs(1));
    assert!(!reads_facts(&state.update(Input::Tick, changed + secs(1))));
    assert!(reads_facts(&state.update(Input::Tick, changed + secs(2))));
    state.update(
        Input::Facts(facts(&[("a@sha256:1", &[])])),
        changed + secs(2),
    );
    assert!(!reads_facts(&state.update(Input::Tick, changed + secs(3))));
    // Another change right after: read once the gap since the last read is over, not at once.
    state.update(Input::RuntimeChanged, changed + secs(3));
    assert!(!reads_facts(&state.update(Input::Tick, changed + secs(11))));
    assert!(reads_facts(&state.update(Input::Tick, changed + secs(12))));
}

#[test]
fn a_runtime_without_events_is_read_as_often_as_it_is_checked() {
    let now = Instant::now();
    let (mut state, _) = agent(Vec::new(), now);
    state.update(Input::Tick, now);
    state.update(Input::Facts(facts(&[])), now);
    assert!(!reads_facts(&state.update(Input::Tick, now + secs(31))));
    state.update(Input::RuntimeSilent, now + secs(31));
    assert!(reads_facts(&state.update(Input::Tick, now + secs(32))));
}

fn asking(mut set: PinSet, request: &str) -> PinSet {
    set.metadata.annotations.insert(
        crate::model::pinboard_api::CHECK_REQUEST_ANNOTATION.into(),
        request.into(),
    );
    set
}

fn answer(state: &AgentState, name: &str) -> Option<String> {
    let reports = state.answered_reports();
    let report = reports.iter().find(|r| r.name == name)?;
    report.checked.as_ref().map(|a| a.request.clone())
}

#[test]
fn a_check_asked_is_answered_once_the_runtime_was_asked_after_it_and_only_then() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    pin_through(&mut state, &actions, now);
    let at = now + secs(2);
    state.update(
        Input::Sets(vec![asking(set("web", 1, &["a@sha256:1"]), "r1")]),
        at,
    );
    assert_eq!(
        answer(&state, "web"),
        None,
        "not before the runtime is asked"
    );
    // Asked at the next tick, not at the next 30-second check.
    let images = verify_due(&mut state, at + secs(1));
    assert_eq!(images, ["a@sha256:1"]);
    // A runtime that does not answer answers no check.
    let mut silent = observed(&[]);
    silent.unreachable = Some("connection refused".into());
    state.update(Input::Verified(silent), at + secs(1));
    assert_eq!(answer(&state, "web"), None);
    verify_due(&mut state, at + secs(31));
    state.update(
        Input::Verified(observed(&[("a@sha256:1", true, true)])),
        at + secs(31),
    );
    assert_eq!(answer(&state, "web").as_deref(), Some("r1"));
    let phases = state.phases();
    assert_eq!(phases[0].3.as_deref(), Some("r1"), "an answer is news");
    // The same request seen again is not asked again.
    state.update(
        Input::Sets(vec![asking(set("web", 1, &["a@sha256:1"]), "r1")]),
        at + secs(32),
    );
    let again = state.update(Input::Tick, at + secs(33));
    assert!(
        !again.iter().any(|a| matches!(a, Action::Verify(_))),
        "{again:?}"
    );
}

#[test]
fn a_restore_that_failed_with_the_registry_away_is_still_a_restore_when_tried_again() {
    let (mut state, actions, at) = web_pinned_then_found(("a@sha256:1", false, false));
    assert!(started(&actions).expect("a restore").restore);
    state.update(Input::Started { fan_out: None }, at);
    state.update(
        Input::Ended {
            failure: Some("503 Service Unavailable".into()),
            observed: None,
            fan_out: None,
            relayed: None,
        },
        at + secs(1),
    );
    assert_eq!(report(&state, "web").state, NodeSetPhase::Failed);
    let again = state.update(Input::Tick, at + secs(62));
    let start = started(&again).expect("tried again");
    assert!(start.restore, "the loss is still being put back");
    pin_through(&mut state, &again, at + secs(63));
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Pinned);
    assert_eq!(web.restores.as_ref().map(|r| r.count), Some(1), "{web:?}");
    assert_eq!(state.tallies()["web"].restores, 1);
}

#[test]
fn a_failed_set_tried_again_keeps_its_reason_in_view_until_the_new_attempt_says_more() {
    let now = Instant::now();
    let (mut state, actions) = agent(vec![set("web", 1, &["a@sha256:1"])], now);
    assert!(started(&actions).is_some());
    state.update(Input::Started { fan_out: None }, now);
    let failure = "no room on the image filesystem".to_string();
    state.update(
        Input::Ended {
            failure: Some(failure.clone()),
            observed: None,
            fan_out: None,
            relayed: None,
        },
        now,
    );
    let again = state.update(Input::Tick, now + secs(61));
    assert!(started(&again).is_some(), "tried again after a minute");
    state.update(Input::Started { fan_out: None }, now + secs(61));
    let web = report(&state, "web");
    assert_eq!(web.state, NodeSetPhase::Failed, "not queued: {web:?}");
    assert!(web.conditions.iter().any(|c| c.message.contains(&failure)));
}

//! What the keys of the Sets, Plan and Rollout screens set off: a survey, the confirmation before an
//! apply or unpin, the commands that follow it, fan-out on or off, and retrying or cancelling one image.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Failure;
use crate::model::plan::Verdict;
use crate::model::readiness::Readiness;
use crate::model::rollout::{ImageState, NodeState, Rollout};
use crate::model::units::human;
use crate::ui::keymap::Action;
use crate::ui::msg::Cmd;
use crate::ui::state::{Confirm, Mode, NO_CACHE, Pane, Screen, State};

pub(super) fn survey(state: &mut State) -> Vec<Cmd> {
    if state.sets.is_empty() {
        state.say("no sets to survey: add images on the Sets screen (2)");
        return Vec::new();
    }
    if let Some(bad) = state.sets.iter().find(|s| !s.problems().is_empty()) {
        let text = format!(
            "set {} breaks {} rule(s): fix it before surveying",
            bad.set.name,
            bad.problems().len()
        );
        state.say(text);
        return Vec::new();
    }
    let nodes: BTreeSet<&String> = state.sets.iter().flat_map(|s| &s.targets).collect();
    let cmd = Cmd::Survey {
        sets: state.sets.iter().map(|s| s.set.clone()).collect(),
        nodes: nodes.into_iter().cloned().collect(),
    };
    state.surveying = true;
    state.say("surveying nodes and registry…");
    vec![cmd]
}

/// Asks y/n before applying (or unpinning) the selected set on its target nodes.
pub(super) fn confirm(state: &mut State, unpin: bool) {
    let verb = if unpin { "unpin" } else { "apply" };
    if !state.writable(verb) {
        return;
    }
    let Some(draft) = state.selected_set() else {
        state.say(format!("no set to {verb}: add one on the Sets screen (2)"));
        return;
    };
    let (name, problems) = (draft.set.name.clone(), draft.problems().len());
    // Unpinning a broken set is fine: its valid entries may be pinned.
    if problems > 0 && !unpin {
        state.say(format!(
            "set {name} breaks {problems} rule(s): fix it before applying"
        ));
        return;
    }
    if draft.targets.is_empty() {
        let what = if state.targets_pools() {
            "a pool"
        } else {
            "some"
        };
        state.say(format!(
            "set {name} targets no node: choose {what} on the Sets screen (Space)"
        ));
        return;
    }
    let nodes: Vec<String> = draft.targets.iter().cloned().collect();
    let no_space = state
        .survey
        .iter()
        .flat_map(|s| &s.nodes)
        .filter(|n| !unpin && n.verdict == Verdict::NoSpace)
        .filter(|n| draft.targets.contains(&n.node))
        .map(|n| n.node.clone())
        .collect();
    state.mode = Mode::Confirm(Confirm {
        set: name,
        nodes,
        no_space,
        skips_no_space: state.fleet.puller.skips_no_space(),
        unpin,
        fan_out: state.fan_out && state.fans_out() && !unpin,
    });
}

/// `f`: fan-out on or off for the next apply, saying what it changes on the link and, on agents, whether
/// the in-cluster cache serves.
pub(super) fn toggle_fan_out(state: &mut State) {
    if !state.fans_out() {
        state.say(
            "fan-out is for direct mode and pinboard's agents: on OpenShift the machine-config daemons pull; \
             serve them with `pinboard mirror` and an ImageDigestMirrorSet",
        );
        return;
    }
    state.fan_out = !state.fan_out;
    if !state.fan_out {
        state.say("fan-out off: every node pulls from the registry itself");
        return;
    }
    let through = match (state.steers_pulls(), state.cluster_cache()) {
        (true, _) => "nodes pull through pinboard's blob cache".to_string(),
        (false, Some((holder, address))) => format!(
            "the set gets spec.fanOut: its nodes pull through the in-cluster cache at {address} (held by \
             {holder})"
        ),
        (false, None) => format!(
            "the set gets spec.fanOut, but {NO_CACHE}: install the agents with `pinboard agent \
             manifests --cache`; until one serves, each node pulls from the registry after waiting 60 s"
        ),
    };
    state.say(match state.survey.as_ref().map(|s| s.link_bytes) {
        Some(link) => format!(
            "fan-out on: {} over the registry link instead of {}; {through}",
            human(link.fan_out),
            human(link.direct)
        ),
        None => format!("fan-out on: {through}"),
    });
}

pub(super) fn unpin(state: &mut State, confirm: Confirm) -> Vec<Cmd> {
    let Some(draft) = state.sets.iter().find(|s| s.set.name == confirm.set) else {
        return Vec::new();
    };
    let cmd = Cmd::Unpin {
        set: draft.set.clone(),
        nodes: confirm.nodes,
    };
    state.say(format!(
        "unpinning set {} (images stay on the nodes)",
        confirm.set
    ));
    vec![cmd]
}

pub(super) fn apply(state: &mut State, confirm: Confirm, force: bool) -> Vec<Cmd> {
    let Some(draft) = state.sets.iter().find(|s| s.set.name == confirm.set) else {
        return Vec::new();
    };
    let set = draft.set.clone();
    state.set_rollout(Rollout::expecting(&confirm.nodes));
    state.rolled_out = Some(confirm.set.clone());
    let cmd = Cmd::Apply {
        set,
        nodes: confirm.nodes,
        force,
        fan_out: confirm.fan_out,
    };
    state.say(format!("applying set {}", confirm.set));
    state.goto(Screen::Rollout);
    vec![cmd]
}

/// `v`: the rolled-out set judged as `pinboard check` judges it. Only the agents are asked: pinboard's own
/// rollout asks the runtimes as it goes, and the daemons' generations say what they say.
pub(super) fn check_now(state: &mut State) -> Vec<Cmd> {
    if !state.on_agents() {
        state.say("v asks pinboard's agents; here the Rollout already shows the nodes as of now");
        return Vec::new();
    }
    let Some(set) = state.rolled_out.clone() else {
        state.say("no rollout yet: apply a set first");
        return Vec::new();
    };
    state.say(format!(
        "checking set {set}: each node's agent asks its runtime now (up to 15 s)…"
    ));
    vec![Cmd::Check { set }]
}

/// What a check of `set` found, said once in the status line: ready, or its first reason.
pub(super) fn checked(state: &mut State, set: &str, result: Result<Readiness, Failure>) {
    let said = match result {
        Ok(readiness) if readiness.ready => format!(
            "check of set {set}: ready on {} node(s), as of now (each agent asked its runtime)",
            readiness.nodes.len()
        ),
        Ok(readiness) => {
            let reasons = readiness.reason_lines();
            let more = match reasons.len() {
                0 | 1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            format!(
                "check of set {set}: not ready: {}{more}",
                reasons.first().map_or("no node", String::as_str)
            )
        }
        Err(failure) => format!("check of set {set} failed: {}", failure.lines.join("; ")),
    };
    state.say(said);
}

pub(super) fn retry_or_cancel(state: &mut State, action: Action) -> Vec<Cmd> {
    let what = if action == Action::Retry {
        "retry"
    } else {
        "cancel"
    };
    if !state.writable(what) {
        return Vec::new();
    }
    if !state.steers_pulls() {
        state.say(
            "in cluster mode the machine-config daemons pull: there is no pull to retry or cancel from here",
        );
        return Vec::new();
    }
    let Some((node_name, node)) = state.selected_rollout_node() else {
        state.say("no rollout yet");
        return Vec::new();
    };
    let Some(image) = state.selected(Pane::RolloutImages) else {
        return Vec::new();
    };
    let stalled = node
        .stalled(state.now, state.stall_after)
        .any(|s| s == image);
    let Some(rollout) = node.image(image) else {
        return Vec::new();
    };
    let allowed = match (&rollout.state, action) {
        (ImageState::Failed { .. } | ImageState::Cancelled, Action::Retry) => true,
        (ImageState::Pulling { .. }, Action::Retry) => stalled,
        (
            ImageState::Queued | ImageState::Pulling { .. } | ImageState::Retrying { .. },
            Action::Cancel,
        ) => true,
        _ => false,
    };
    let (node, image) = (node_name.to_string(), image.to_string());
    if !allowed {
        state.say(format!(
            "nothing to {what}: {image} on {node} is not in a state for it"
        ));
        return Vec::new();
    }
    vec![if action == Action::Retry {
        Cmd::Retry { node, image }
    } else {
        Cmd::Cancel { node, image }
    }]
}

/// `rollout finished: 2 pinned, 1 refused` — every node counted by how it ended.
pub(super) fn finished_message(rollout: &Rollout) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for node in rollout.nodes().values() {
        let word = match node.state {
            NodeState::Pinned { .. } => "pinned",
            NodeState::Refused { .. } => "refused",
            NodeState::Stopped { .. } => "stopped (r retries)",
            NodeState::PinFailed { .. } => "pin failed",
            NodeState::Restoring { .. } => "restoring",
            NodeState::Waiting | NodeState::Pulling { .. } => "running",
        };
        *counts.entry(word).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(word, n)| format!("{n} {word}"))
        .collect();
    format!("rollout finished: {}", parts.join(", "))
}

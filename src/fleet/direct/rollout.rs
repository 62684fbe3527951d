//! Rollouts on direct nodes, headless and in the TUI: a fresh survey, then [`crate::fanout::Run`] (the
//! engine, fanned out if asked) with the plans; and unpinning through [`crate::engine::unpin`], which
//! releases only the holds of the sets named.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::Direct;
use super::check::Checker;
use super::views::by_outcome;
use crate::backend::target::NodeTarget;
use crate::engine::{self, Control, EngineConfig};
use crate::error::{Exit, Failure};
use crate::fanout::{FanOutSetup, Run, Update};
use crate::fleet::{
    Applied, ApplyOptions, ApplyProgress, Events, FleetEvent, NodeUnpinned, NodesUnpinned, Rolled,
    RolloutControl, SetSources, SetUsed, UnpinOptions, Unpinned,
};
use crate::model::holders::{ReleaseScope, Sets, UnpinReport};
use crate::model::reference::short_reference;
use crate::model::rollout::Rollout;
use crate::model::set::ImageSet;
use crate::survey::{Survey, union_of};

/// A fresh survey of `targets` for `sets`, then the rollout started (fanned out with `fan_out`); lines in
/// the second value say which nodes pull directly and why.
async fn start(
    fleet: &Direct,
    targets: &[NodeTarget],
    sets: &[ImageSet],
    config: EngineConfig,
    fan_out: Option<FanOutSetup>,
    operator: bool,
) -> Result<(Survey, Run, Vec<String>), Failure> {
    let planned = fleet.survey_targets(targets, sets).await?;
    let jobs = crate::targets::jobs(targets, planned.nodes.clone(), sets);
    let (run, notices) = Run::start(
        targets,
        jobs,
        planned.facts.clone(),
        Arc::clone(&fleet.registry),
        config,
        fan_out,
        operator,
        fleet.timeout,
    )
    .await?;
    Ok((planned, run, notices))
}

/// Fan-out's cache and address, when asked for.
fn fan_out_setup(fleet: &Direct, fan_out: bool) -> Result<Option<FanOutSetup>, Failure> {
    fan_out
        .then(|| {
            Ok(FanOutSetup {
                cache: fleet.fan_out_cache()?,
                listen: fleet.fan_out_listen,
            })
        })
        .transpose()
}

/// Headless `apply`: every node pulls and pins; `progress` is told of every update; then the readiness
/// check. Interrupted, the nodes' files are put back and the command fails.
pub(super) async fn apply(
    fleet: &Direct,
    sources: &SetSources,
    options: ApplyOptions,
    progress: &mut dyn ApplyProgress,
    interrupt: BoxFuture<'_, &'static str>,
) -> Result<Applied, Failure> {
    let checker = Checker::new(fleet, sources).await?;
    // The cache first: one that cannot be used is bad input, known before anything is pulled.
    let fan_out = fan_out_setup(fleet, options.fan_out)?;
    let config = EngineConfig {
        force: options.force,
        ..fleet.engine.clone()
    };
    let names: Vec<String> = fleet.targets.iter().map(|t| t.node.name.clone()).collect();
    // No operator retries headless: nodes with failures finish instead of waiting.
    let (planned, mut run, notices) =
        start(fleet, &fleet.targets, &checker.sets, config, fan_out, false).await?;
    for notice in notices {
        eprintln!("warning: {notice}");
    }
    let mut rollout = Rollout::expecting(&names);
    let mut interrupt = interrupt;
    let interrupted = loop {
        let update = tokio::select! {
            update = run.next() => update,
            signal = &mut interrupt => break Some(signal),
        };
        let Some(update) = update else {
            break None;
        };
        match &update {
            Update::FanOut(nodes) => rollout.set_fan_out(nodes.clone()),
            Update::LinkBytes(bytes) => rollout.record_link_bytes(*bytes),
            Update::Event(event) => rollout.apply(event.clone()),
        }
        progress.update(&update, &rollout);
    };
    progress.finish(&rollout);
    let (fan_out, problems) = run.finish().await;
    for problem in problems {
        eprintln!("warning: {problem}");
    }
    let readiness = match interrupted {
        Some(_) => None,
        None => Some(checker.readiness().await?),
    };
    Ok(Applied::Rolled(Box::new(Rolled {
        sets: checker.sets.iter().map(SetUsed::of).collect(),
        rollout,
        planned: planned
            .nodes
            .iter()
            .map(|n| (n.node.clone(), n.fetch_bytes))
            .collect(),
        fan_out,
        readiness,
        interrupted,
    })))
}

/// Headless `unpin`: the named sets' holds released on every node (or every set's, with `all_sets`).
pub(super) async fn unpin(
    fleet: &Direct,
    sources: &SetSources,
    options: UnpinOptions,
) -> Result<Unpinned, Failure> {
    let (files, names) = crate::fleet::sets::take_names(sources)?;
    let all_sets = options.all_sets;
    let required = !all_sets && names.is_empty();
    let sets =
        crate::fleet::sets::noted(&files, required, &fleet.registry, &fleet.platform).await?;
    let mut used: Vec<SetUsed> = sets.iter().map(SetUsed::of).collect();
    used.extend(names.iter().map(|name| SetUsed::named(name)));
    let release = ReleaseScope {
        only: None,
        sets: match all_sets {
            true => Sets::All,
            false => Sets::Named(used.iter().map(|s| s.name.clone()).collect()),
        },
        images: union_of(&sets).into_iter().collect(),
        release_unowned: options.release_unowned,
    };
    unknown_names(&fleet.targets, &names).await?;
    fleet.clean_stale().await;
    let nodes = futures::future::join_all(fleet.targets.iter().map(|t| async {
        let node = t.node.name.clone();
        match engine::unpin(&t.node, t.pin.clone(), &release).await {
            Ok(done) => NodeUnpinned {
                node,
                ok: true,
                reachable: true,
                report: UnpinReport::of(&done.changes),
                message: done.note,
            },
            Err(e) => NodeUnpinned {
                node,
                ok: false,
                reachable: !e.unreachable(),
                report: UnpinReport::default(),
                message: Some(e.to_string()),
            },
        }
    }))
    .await;
    Ok(Unpinned::Nodes(NodesUnpinned {
        sets: used,
        all_sets,
        nodes,
    }))
}

/// Refuses, before anything changes, the `--set NAME`s that name no file and that no node holds a pin for
/// (a typo, not a set). Said only when every node answered: an unreachable one might hold them.
async fn unknown_names(targets: &[NodeTarget], names: &[String]) -> Result<(), Failure> {
    if names.is_empty() {
        return Ok(());
    }
    let held = futures::future::join_all(
        targets
            .iter()
            .map(|t| engine::sets_holding(&t.node, t.pin.clone())),
    )
    .await;
    let Ok(held) = held.into_iter().collect::<Result<Vec<_>, _>>() else {
        return Ok(());
    };
    let unknown: Vec<String> = names
        .iter()
        .filter(|name| !held.iter().any(|sets| sets.contains(*name)))
        .map(|name| {
            format!(
                "{name}: no such file, and no node holds a pin for a set of that name; \
                 `pinboard status -o json` shows each pin's heldBy"
            )
        })
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Failure {
            exit: Exit::BadInput,
            lines: unknown,
        })
    }
}

/// The TUI's `a`: surveys the set on its nodes (fresh figures), then runs the rollout (fanned out if
/// asked), telling `events` everything; the operator's retries and cancels go to what it returns. None
/// when a rollout already runs or fan-out cannot start.
pub(super) fn start_in_tui(
    fleet: &Arc<Direct>,
    set: ImageSet,
    nodes: Vec<String>,
    force: bool,
    fan_out: bool,
    events: Events,
) -> Option<RolloutControl> {
    let fan_out = match fan_out_setup(fleet, fan_out) {
        Ok(fan_out) => fan_out,
        Err(e) => {
            let _ = events.send(FleetEvent::RolloutFinished(Err(e)));
            return None;
        }
    };
    let targets = fleet.chosen(&nodes);
    let config = EngineConfig {
        force,
        ..fleet.engine.clone()
    };
    let (control_tx, mut control_rx) = tokio::sync::mpsc::unbounded_channel();
    let sets = vec![set];
    let direct = Arc::clone(fleet);
    let task = tokio::spawn(async move {
        let started = start(&direct, &targets, &sets, config, fan_out, true).await;
        let mut run = match started {
            Ok((planned, run, notices)) => {
                let _ = events.send(FleetEvent::Surveyed(planned));
                for notice in notices {
                    let _ = events.send(FleetEvent::Notice(notice));
                }
                run
            }
            Err(e) => {
                let _ = events.send(FleetEvent::RolloutFinished(Err(e)));
                return;
            }
        };
        let mut operator = true;
        loop {
            tokio::select! {
                update = run.next() => match update {
                    Some(update) => { let _ = events.send(FleetEvent::Rollout(update)); }
                    None => break,
                },
                control = control_rx.recv(), if operator => match control {
                    Some(control) => { run.control(control); }
                    // The TUI is gone: stop pulling (then fan-out's files are put back).
                    None => {
                        operator = false;
                        run.control(Control::CancelAll);
                    }
                },
            }
        }
        let (report, problems) = run.finish().await;
        if let Some(report) = report {
            let _ = events.send(FleetEvent::Rollout(Update::LinkBytes(report.link_bytes)));
        }
        for problem in problems {
            let _ = events.send(FleetEvent::Notice(problem));
        }
        let _ = events.send(FleetEvent::RolloutFinished(Ok(())));
        direct.send_views(&sets, &events).await;
    });
    let mut rollouts = fleet.rollouts.lock().expect("rollouts lock");
    rollouts.retain(|r| !r.is_finished());
    rollouts.push(task);
    Some(control_tx)
}

/// The TUI's `U`: `set`'s holds released on `nodes` (with its images' unowned pins under
/// `--release-unowned`); one notice grouping the nodes by outcome, then the nodes and config views again.
pub(super) fn release_in_tui(
    fleet: &Arc<Direct>,
    set: ImageSet,
    nodes: Vec<String>,
    events: Events,
) {
    let targets = fleet.chosen(&nodes);
    let images: Vec<&str> = set.references().collect();
    let release = ReleaseScope::of_sets(&[set.name.as_str()], &images, fleet.release_unowned);
    let direct = Arc::clone(fleet);
    tokio::spawn(async move {
        let outcomes = targets.iter().map(|t| async {
            let said = match engine::unpin(&t.node, t.pin.clone(), &release).await {
                Ok(done) => {
                    // Without the registry: the notice is one line.
                    let short =
                        |r: &str| short_reference(r.split_once('/').map_or(r, |(_, rest)| rest));
                    let report = UnpinReport::of(&done.changes);
                    let said = report.sentence(short);
                    match done.note {
                        Some(note) => Some(format!("{said} ({note})")),
                        None if report == UnpinReport::default() => None,
                        None => Some(said),
                    }
                }
                Err(e) => Some(format!("failed: {e}")),
            };
            (t.node.name.clone(), said)
        });
        let outcomes = futures::future::join_all(outcomes).await;
        let _ = events.send(FleetEvent::Notice(by_outcome(outcomes)));
        direct.send_views(&[set], &events).await;
    });
}

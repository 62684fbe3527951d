//! Headless `pinboard apply`: what the TUI's `a` does, on the fleet the arguments name
//! ([`crate::fleet::Fleet::apply`]). Where pinboard pulls, it shows progress on stderr (a bar redrawn in
//! place on a terminal, one line per event otherwise) and prints the rollout's outcome per node and under
//! which name each set holds its pins; then, on every fleet, the same readiness check as `pinboard check`,
//! whose verdict is its exit code.

use std::io::{IsTerminal, Write as _};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Interrupts;
use super::check::{readiness_text, verdict};
use super::output::{printed_then, render, short_reference, table};
use crate::error::{Exit, Failure};
use crate::fanout::{FanOutReport, Update};
use crate::fleet::{Applied, ApplyOptions, ApplyProgress, NodeOutcome, Rolled, SetUsed};
use crate::model::lazy::lazy_words;
use crate::model::node_report;
use crate::model::pinboard_api::SetOutcome;
use crate::model::readiness::Readiness;
use crate::model::rollout::{Event, FetchedSource, ImageState, NodeRollout, NodeState, Rollout};
use crate::model::units::{human, human_rate};
use crate::options::{APPLY_WAIT, Caller, CommonArgs, Output};
use crate::ui::status::{node_status, pin_method_label};

/// How often the progress bar is redrawn at most.
const REDRAW: Duration = Duration::from_millis(100);
const BAR_WIDTH: usize = 24;

/// What `apply -o json|yaml` prints: the rollout, what fan-out moved (null without it), then the check
/// after it (null when interrupted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    /// The sets applied: the name each image's pin is held under.
    pub sets: Vec<SetUsed>,
    pub rollout: Vec<NodeOutcome>,
    pub fan_out: Option<FanOutReport>,
    pub readiness: Option<Readiness>,
    /// A signal (SIGINT, SIGTERM) stopped the rollout before it ended.
    pub interrupted: bool,
}

pub async fn apply(args: CommonArgs) -> Result<String, Failure> {
    let fleet = args
        .fleet(Caller::Command {
            asks_runtimes: false,
        })
        .await?;
    let rollout = &args.rollout;
    let options = ApplyOptions {
        force: rollout.force,
        fan_out: rollout.fan_out,
        wait: rollout.timeout_or(APPLY_WAIT),
    };
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    // Caught from the rollout on, so that fan-out's files are put back before pinboard exits.
    let interrupt = async {
        match Interrupts::new() {
            Ok(mut signals) => signals.recv().await,
            Err(_) => std::future::pending().await,
        }
    };
    let applied = fleet
        .apply(
            &args.input.sources(),
            options,
            &mut progress,
            Box::pin(interrupt),
        )
        .await?;
    match applied {
        Applied::Rolled(rolled) => rolled_report(*rolled, args.output()),
        Applied::Reported(reported) => {
            let report = ApplyReport {
                sets: reported.sets,
                rollout: reported.outcomes,
                fan_out: reported.fan_out,
                readiness: Some(reported.readiness),
                interrupted: false,
            };
            printed_report(report, None, args.output())
        }
        Applied::Written(readiness) => {
            let text = render(&readiness, args.output(), || readiness_text(&readiness))?;
            verdict(text, &readiness)
        }
    }
}

/// What `apply` prints of a rollout pinboard ran, and its verdict: the readiness check's, or exit 1 when a
/// signal interrupted it.
fn rolled_report(rolled: Rolled, output: Output) -> Result<String, Failure> {
    let report = ApplyReport {
        sets: rolled.sets,
        rollout: rolled
            .rollout
            .nodes()
            .iter()
            .map(|(name, node)| outcome(name, node, rolled.planned.get(name).copied()))
            .collect(),
        fan_out: rolled.fan_out,
        readiness: rolled.readiness,
        interrupted: rolled.interrupted.is_some(),
    };
    printed_report(report, rolled.interrupted, output)
}

/// `report` as printed, and its verdict: the readiness check's, or exit 1 when `interrupted` by a signal.
fn printed_report(
    report: ApplyReport,
    interrupted: Option<&'static str>,
    output: Output,
) -> Result<String, Failure> {
    let text = render(&report, output, || {
        let readiness = report
            .readiness
            .as_ref()
            .map_or_else(String::new, |r| "\n".to_string() + &readiness_text(r));
        report
            .sets
            .iter()
            .map(|s| set_line(s, true))
            .collect::<String>()
            + "\n"
            + &rollout_table(&report.rollout)
            + &fan_out_line(report.fan_out.as_ref())
            + &readiness
    })?;
    match (interrupted, &report.readiness) {
        (None, Some(readiness)) => verdict(text, readiness),
        (signal, _) => Err(printed_then(
            &text,
            Failure {
                exit: Exit::NotReady,
                lines: vec![format!(
                    "interrupted by {}: the rollout stopped{}; `pinboard apply` again finishes it",
                    signal.unwrap_or("a signal"),
                    if report.fan_out.is_some() {
                        ", and fan-out's files on the nodes were put back"
                    } else {
                        ""
                    }
                )],
            },
        )),
    }
}

/// `fan-out: 967 MiB over the registry link (budget 6 MiB/s), 2.83 GiB served to the nodes`, or nothing
/// without fan-out.
fn fan_out_line(report: Option<&FanOutReport>) -> String {
    report.map_or_else(String::new, |r| {
        format!(
            "\nfan-out: {} over the registry link{}, {} served to the nodes\n",
            human(r.link_bytes),
            budget(r.link_rate),
            human(r.served_bytes)
        )
    })
}

/// ` (budget 6 MiB/s)`, or nothing without one.
fn budget(link_rate: Option<u64>) -> String {
    link_rate.map_or_else(String::new, |rate| {
        format!(" (budget {})", human_rate(rate))
    })
}

fn outcome(name: &str, node: &NodeRollout, planned: Option<u64>) -> NodeOutcome {
    let (confirmed, reason) = match &node.state {
        NodeState::Pinned { confirmed, .. } => (Some(*confirmed), None),
        NodeState::Refused { reason }
        | NodeState::Stopped { reason }
        | NodeState::PinFailed { reason } => (None, Some(reason.clone())),
        NodeState::Waiting | NodeState::Pulling { .. } | NodeState::Restoring { .. } => {
            (None, None)
        }
    };
    let failed = node
        .images()
        .filter_map(|(image, rollout)| match &rollout.state {
            ImageState::Failed { reason } => Some(format!("{image}: {reason}")),
            _ => None,
        })
        .collect();
    NodeOutcome {
        node: name.to_string(),
        state: node_status(&node.state, false)
            .word
            .trim_end_matches('*')
            .to_string(),
        confirmed,
        reason,
        figures: SetOutcome {
            planned_bytes: planned.unwrap_or_default(),
            ..node_report::outcome(node)
        },
        failed,
    }
}

fn rollout_table(outcomes: &[NodeOutcome]) -> String {
    let headers = [
        "NODE", "ROLLOUT", "IMAGES", "PRESENT", "PULLED", "PINNED", "PLANNED", "FETCHED", "REASON",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let state = match o.confirmed {
                Some(false) => format!("{} (not confirmed by the runtime)", o.state),
                _ => o.state.clone(),
            };
            let f = &o.figures;
            vec![
                o.node.clone(),
                state,
                f.images.to_string(),
                match f.lazy {
                    0 => f.present.to_string(),
                    lazy => format!("{} + {lazy} lazy", f.present),
                },
                f.pulled.to_string(),
                f.pinned.to_string(),
                human(f.planned_bytes),
                match f.fetched_source {
                    Some(FetchedSource::Plan) => format!("{} (plan)", human(f.fetched_bytes)),
                    Some(FetchedSource::RuntimeCounters) => {
                        format!("{} (counters)", human(f.fetched_bytes))
                    }
                    _ => human(f.fetched_bytes),
                },
                o.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = table(&headers, &rows, &|_, _, text| text.to_string());
    for o in outcomes.iter().filter(|o| !o.failed.is_empty()) {
        out.push_str(&format!("\n{} failed pulls:\n", o.node));
        for failure in &o.failed {
            out.push_str(&format!("  - {failure}\n"));
        }
    }
    out
}

/// One line for an event, for a log that is not a terminal; None for byte progress (too frequent).
fn event_line(event: &Event) -> Option<String> {
    let image = |i: &str| short_reference(i);
    Some(match event {
        Event::NodeRefused { node, reason } => format!("{node}: refused: {reason}"),
        Event::NodeStarted { node, images, .. } => {
            format!("{node}: started ({} images)", images.len())
        }
        Event::NodeBytes { node, note, .. } => format!("{node}: {note}"),
        Event::ImagePresent { node, image: i } => format!("{node}: {} already present", image(i)),
        Event::ImageLazy {
            node,
            image: i,
            remote,
            layers,
        } => format!(
            "{node}: {} {}: present only lazily, not pulled again",
            image(i),
            lazy_words(*remote, *layers)
        ),
        Event::PullStarted {
            node,
            image: i,
            attempt,
            ..
        } => match attempt {
            1 => format!("{node}: pulling {}", image(i)),
            n => format!("{node}: pulling {} (attempt {n})", image(i)),
        },
        Event::PullProgress { .. } => return None,
        Event::PullRetry {
            node,
            image: i,
            attempt,
            reason,
            backoff,
            ..
        } => format!(
            "{node}: {} attempt {attempt} failed, retrying in {}s: {reason}",
            image(i),
            backoff.as_secs()
        ),
        Event::PullDone { node, image: i, .. } => format!("{node}: pulled {}", image(i)),
        Event::PullFailed {
            node,
            image: i,
            reason,
            ..
        } => format!("{node}: {} failed: {reason}", image(i)),
        Event::PullCancelled { node, image: i, .. } => format!("{node}: {} cancelled", image(i)),
        Event::PullStalled { node, image: i, .. } => {
            format!(
                "{node}: {} stalled: no bytes for the progress timeout",
                image(i)
            )
        }
        Event::Fetched {
            node,
            bytes,
            source,
        } => format!(
            "{node}: fetched {}{}",
            human(*bytes),
            match source {
                FetchedSource::ContentStore => " (the runtime's content store)",
                FetchedSource::Plan => " (the plan's figure: the runtime reports no bytes)",
                FetchedSource::Relay =>
                    " (what the node's relay passed on from the in-cluster cache)",
                FetchedSource::RuntimeCounters => " (CRI-O's counters)",
            }
        ),
        Event::NodeStopped { node, reason, .. } => format!("{node}: stopped: {reason}"),
        Event::Pinned {
            node,
            method,
            confirmed,
            ..
        } => format!(
            "{node}: pinned ({}){}",
            pin_method_label(Some(*method)),
            if *confirmed {
                ""
            } else {
                ", not confirmed by the runtime"
            }
        ),
        Event::PinFailed { node, reason, .. } => format!("{node}: pinning failed: {reason}"),
        Event::ImageLost {
            node,
            image: i,
            found,
            ..
        } => format!("{node}: {} lost since it was pinned: {found}", image(i)),
    })
}

/// Progress on stderr: a bar redrawn in place on a terminal, otherwise one line per event.
struct Progress {
    terminal: bool,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(terminal: bool) -> Progress {
        Progress {
            terminal,
            drawn: None,
        }
    }

    fn show(&mut self, line: Option<String>, rollout: &Rollout) {
        let mut stderr = std::io::stderr().lock();
        if !self.terminal {
            if let Some(line) = line {
                // Under fan-out, what the link carried so far: the figure fan-out is about.
                match rollout.link_bytes() {
                    Some(link) => {
                        let _ = writeln!(stderr, "{line} (link so far: {})", human(link));
                    }
                    None => {
                        let _ = writeln!(stderr, "{line}");
                    }
                }
            }
            return;
        }
        if self.drawn.is_some_and(|at| at.elapsed() < REDRAW) {
            return;
        }
        self.drawn = Some(Instant::now());
        let _ = write!(stderr, "\r{}\x1b[K", bar(rollout));
        let _ = stderr.flush();
    }
}

impl ApplyProgress for Progress {
    fn update(&mut self, update: &Update, rollout: &Rollout) {
        if let Update::Event(event) = update {
            self.show(event_line(event), rollout);
        }
    }

    fn finish(&mut self, rollout: &Rollout) {
        if self.terminal {
            eprintln!("\r{}\x1b[K", bar(rollout));
        }
    }
}

/// `[#########---------------] 5/12 images, 1/3 nodes done, 12.5 MiB fetched`, and with fan-out
/// `…, 12.5 MiB to the nodes, 4.2 MiB over the link`.
fn bar(rollout: &Rollout) -> String {
    let nodes = rollout.nodes().values();
    let total: usize = nodes.clone().map(|n| n.images().len()).sum();
    let done: usize = nodes
        .clone()
        .map(|n| n.count(|s| s.is_final() || matches!(s, ImageState::Pulled { .. })))
        .sum();
    let nodes_done = nodes
        .clone()
        .filter(|n| !matches!(n.state, NodeState::Waiting | NodeState::Pulling { .. }))
        .count();
    let bytes: u64 = nodes.map(NodeRollout::done_bytes).sum();
    let filled = (done * BAR_WIDTH).checked_div(total).unwrap_or(0);
    let bytes = match rollout.link_bytes() {
        Some(link) => format!(
            "{} to the nodes, {} over the link{}",
            human(bytes),
            human(link),
            budget(rollout.link_rate())
        ),
        None => format!("{} fetched", human(bytes)),
    };
    format!(
        "[{}{}] {done}/{total} images, {nodes_done}/{} nodes done, {bytes}",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        rollout.nodes().len(),
    )
}

/// `set images-3fa2c1d4e5f6 (list.txt, named after its images)`; `applied` adds how to unpin it.
pub(super) fn set_line(set: &SetUsed, applied: bool) -> String {
    let Some(from) = &set.from else {
        return format!("set {} (by name: what the nodes record for it)\n", set.name);
    };
    let mut line = format!("set {} ({from}", set.name);
    if set.named_after_images {
        line.push_str(", named after its images");
        if applied {
            line.push_str(&format!(
                ": `pinboard unpin --set {}` releases its pins",
                set.name
            ));
        }
    }
    line + ")\n"
}

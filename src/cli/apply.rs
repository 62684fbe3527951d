//! Headless `pinboard apply` and `pinboard unpin`. `apply` does what the TUI's `a` does — a fresh survey,
//! then [`crate::engine`] with the plans — showing progress on stderr (a bar redrawn in place on a
//! terminal, one line per event otherwise), the rollout's outcome per node on stdout, and then the same
//! readiness check as `pinboard check`, whose verdict is its exit code. Both say under which name each
//! set holds its pins ([`SetUsed`]). `unpin` releases the named sets' holds (or every set's, with
//! `--all-sets`) through [`crate::engine::unpin`] on every node, and says which images lost their pin and
//! which stay pinned, for whom.

use std::io::{IsTerminal, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Interrupts;
use super::check::{Checker, readiness_table, verdict, verdict_line};
use super::output::{render, short_reference, table};
use crate::backend::blobs::BlobCache;
use crate::backend::target::NodeTarget;
use crate::engine;
use crate::error::{Exit, Failure};
use crate::fanout::{FanOutReport, FanOutSetup, LOOPBACK, Run, Update};
use crate::model::holders::{Release, Sets, UnpinReport};
use crate::model::readiness::Readiness;
use crate::model::rollout::{Event, ImageState, NodeRollout, NodeState, Rollout};
use crate::model::set::{ImageSet, Origin, content_name};
use crate::model::units::human;
use crate::options::{APPLY_WAIT, CommonArgs, command_sets, take_set_names};
use crate::survey::{Survey, survey, union_of};
use crate::ui::status::{node_status, pin_method_label};

/// How often the progress bar is redrawn at most.
const REDRAW: Duration = Duration::from_millis(100);
const BAR_WIDTH: usize = 24;

/// How the rollout ended on one node, as `apply` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub node: String,
    /// `pinned`, `refused`, `stopped`, `pin-failed`, as the TUI's Rollout screen says.
    pub state: String,
    /// Whether the runtime confirmed the pins (containerd 1.6 does not report them); None unless pinned.
    pub confirmed: Option<bool>,
    /// Why the node was refused, stopped or not pinned.
    pub reason: Option<String>,
    pub images: usize,
    pub present: usize,
    pub pulled: usize,
    pub fetched_bytes: u64,
    /// `REF: reason` of every pull that failed.
    pub failed: Vec<String>,
}

/// What `apply -o json|yaml` prints: the rollout, what fan-out moved (null without it), then the check
/// after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    /// The sets applied: the name each image's pin is held under.
    pub sets: Vec<SetUsed>,
    pub rollout: Vec<NodeOutcome>,
    pub fan_out: Option<FanOutReport>,
    pub readiness: Readiness,
}

pub async fn apply(args: CommonArgs) -> Result<String, Failure> {
    let common = &args;
    let rollout_args = &args.rollout;
    if let Some(options) = super::cluster::cluster_mode(&common.targets, false) {
        let limit = rollout_args.timeout_or(APPLY_WAIT);
        return super::cluster::apply(&options, common, rollout_args.force, limit).await;
    }
    let checker = Checker::new(common).await?;
    let targets = &checker.targets;
    // The cache first: one that cannot be used is bad input, known before anything is pulled.
    let fan_out = match rollout_args.fan_out {
        true => Some(FanOutSetup {
            cache: BlobCache::open(
                &common.cache.dir()?,
                common.cache.options(),
                Arc::clone(&checker.registry),
            )
            .map_err(|e| Failure::bad_input(format!("--fan-out: {e}")))?,
            listen: rollout_args.fan_out_listen.unwrap_or(LOOPBACK),
        }),
        false => None,
    };
    let nodes: Vec<_> = targets.iter().map(|t| t.node.clone()).collect();
    let Survey {
        nodes: plans,
        facts,
        ..
    } = survey(
        &nodes,
        &checker.sets,
        &checker.registry,
        &checker.platform,
        checker.limits,
        checker.timeout,
        checker.cache.as_deref(),
    )
    .await
    .map_err(Failure::from)?;
    let jobs = crate::targets::jobs(targets, plans, &checker.sets);
    let config = rollout_args.engine_config();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    // No operator retries headless: nodes with failures finish instead of waiting.
    let (mut run, notices) = Run::start(
        targets,
        jobs,
        facts,
        checker.registry.credentials(),
        config,
        fan_out,
        false,
        checker.timeout,
    )
    .await
    .map_err(Failure::bad_input)?;
    for notice in notices {
        eprintln!("warning: {notice}");
    }
    let mut rollout = Rollout::expecting(&names);
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    // Caught for the rollout, so that fan-out's files are put back before pinboard exits.
    let mut signals = Interrupts::new()?;
    let interrupted = loop {
        let update = tokio::select! {
            update = run.next() => update,
            signal = signals.recv() => break Some(signal),
        };
        match update {
            None => break None,
            Some(Update::FanOut { direct }) => rollout.set_fan_out(direct),
            Some(Update::LinkBytes(bytes)) => rollout.record_link_bytes(bytes),
            Some(Update::Event(event)) => {
                let line = event_line(&event);
                rollout.apply(event);
                progress.show(line, &rollout);
            }
        }
    };
    progress.finish(&rollout);
    let (fan_out, problems) = run.finish().await;
    for problem in problems {
        eprintln!("warning: {problem}");
    }
    if let Some(signal) = interrupted {
        return Err(Failure {
            exit: Exit::NotReady,
            lines: vec![format!(
                "interrupted by {signal}: the rollout stopped{}; `pinboard apply` again finishes it",
                if fan_out.is_some() {
                    ", and fan-out's files on the nodes were put back"
                } else {
                    ""
                }
            )],
        });
    }

    let report = ApplyReport {
        sets: checker.sets.iter().map(SetUsed::of).collect(),
        rollout: rollout
            .nodes()
            .iter()
            .map(|(name, node)| outcome(name, node))
            .collect(),
        fan_out,
        readiness: checker.readiness().await?,
    };
    let text = render(&report, common.output(), || {
        report.sets.iter().map(|s| s.line(true)).collect::<String>()
            + "\n"
            + &rollout_table(&report.rollout)
            + &fan_out_line(report.fan_out.as_ref())
            + "\n"
            + &readiness_table(&report.readiness.nodes)
            + &verdict_line(&report.readiness)
    })?;
    verdict(text, &report.readiness)
}

/// `fan-out: 967 MiB over the registry link, 2.83 GiB served to the nodes`, or nothing without fan-out.
fn fan_out_line(report: Option<&FanOutReport>) -> String {
    report.map_or_else(String::new, |r| {
        format!(
            "\nfan-out: {} over the registry link, {} served to the nodes\n",
            human(r.link_bytes),
            human(r.served_bytes)
        )
    })
}

fn outcome(name: &str, node: &NodeRollout) -> NodeOutcome {
    let (confirmed, reason) = match &node.state {
        NodeState::Pinned { confirmed, .. } => (Some(*confirmed), None),
        NodeState::Refused { reason }
        | NodeState::Stopped { reason }
        | NodeState::PinFailed { reason } => (None, Some(reason.clone())),
        NodeState::Waiting | NodeState::Pulling { .. } => (None, None),
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
        images: node.images().len(),
        // Pinning turns every image's state to pinned: present and pulled are told apart before that.
        present: node.count(|s| *s == ImageState::Present),
        pulled: node.count(|s| matches!(s, ImageState::Pulled { .. })),
        fetched_bytes: node.done_bytes(),
        failed,
    }
}

fn rollout_table(outcomes: &[NodeOutcome]) -> String {
    let headers = ["NODE", "ROLLOUT", "IMAGES", "FETCHED", "REASON"].map(String::from);
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let state = match o.confirmed {
                Some(false) => format!("{} (not confirmed by the runtime)", o.state),
                _ => o.state.clone(),
            };
            vec![
                o.node.clone(),
                state,
                o.images.to_string(),
                human(o.fetched_bytes),
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
        Event::ImagePresent { node, image: i } => format!("{node}: {} already present", image(i)),
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
                let _ = writeln!(stderr, "{line}");
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
            "{} to the nodes, {} over the link",
            human(bytes),
            human(link)
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

/// A set as a command used it: its name (what holds its pins on the nodes) and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetUsed {
    pub name: String,
    /// `a.yaml`, `list.txt`, `--image`, or None for a set `unpin` was given by name.
    pub from: Option<String>,
    /// The name was derived from the set's images (a list file or `--image` flags have none).
    pub named_after_images: bool,
}

impl SetUsed {
    fn of(set: &ImageSet) -> SetUsed {
        SetUsed {
            name: set.name.clone(),
            from: Some(match &set.origin {
                Origin::File { path, .. } => path.clone(),
                Origin::Flag { .. } => "--image".into(),
                Origin::Release { version, image, .. } => format!("release {version}, {image}"),
            }),
            named_after_images: set.name == content_name(set.references()),
        }
    }

    fn named(name: &str) -> SetUsed {
        SetUsed {
            name: name.to_string(),
            from: None,
            named_after_images: false,
        }
    }

    /// `set images-3fa2c1d4e5f6 (list.txt, named after its images)`; `applied` adds how to unpin it.
    fn line(&self, applied: bool) -> String {
        let Some(from) = &self.from else {
            return format!(
                "set {} (by name: what the nodes record for it)\n",
                self.name
            );
        };
        let mut line = format!("set {} ({from}", self.name);
        if self.named_after_images {
            line.push_str(", named after its images");
            if applied {
                line.push_str(&format!(
                    ": `pinboard unpin --set {}` releases its pins",
                    self.name
                ));
            }
        }
        line + ")\n"
    }
}

/// What unpinning did on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unpinned {
    pub node: String,
    pub ok: bool,
    #[serde(flatten)]
    pub report: UnpinReport,
    /// What else to know (a CRI-O that keeps removed pins until it restarts), or why it failed.
    pub message: Option<String>,
}

/// What `unpin -o json|yaml` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnpinOutput {
    /// The sets whose holds were released (empty with `--all-sets` alone).
    pub sets: Vec<SetUsed>,
    pub all_sets: bool,
    pub nodes: Vec<Unpinned>,
}

pub async fn unpin(mut args: CommonArgs) -> Result<String, Failure> {
    if let Some(options) = super::cluster::cluster_mode(&args.targets, false) {
        if args.unpin.all_sets || args.unpin.release_unowned {
            eprintln!(
                "warning: --all-sets and --release-unowned are for direct mode; in cluster mode the \
                 machine-config daemons keep the pins of the sets left on the cluster"
            );
        }
        return super::cluster::unpin(&options, &args).await;
    }
    let names = take_set_names(&mut args.input)?;
    let all_sets = args.unpin.all_sets;
    let targets = args.targets.resolve()?;
    let (sets, _) = command_sets(&args, !all_sets && names.is_empty()).await?;
    let mut used: Vec<SetUsed> = sets.iter().map(SetUsed::of).collect();
    used.extend(names.iter().map(|name| SetUsed::named(name)));
    let release = Release {
        sets: match all_sets {
            true => Sets::All,
            false => Sets::Named(used.iter().map(|s| s.name.clone()).collect()),
        },
        images: union_of(&sets).into_iter().collect(),
        release_unowned: args.unpin.release_unowned,
    };
    unknown_names(&targets, &names).await?;
    super::clean_stale(&targets, args.targets.timeout()).await;
    let nodes = futures::future::join_all(targets.iter().map(|t| async {
        let node = t.node.name.clone();
        match engine::unpin(&t.node, t.pin.clone(), &release).await {
            Ok(done) => Unpinned {
                node,
                ok: true,
                report: UnpinReport::of(&done.changes),
                message: done.note,
            },
            Err(e) => Unpinned {
                node,
                ok: false,
                report: UnpinReport::default(),
                message: Some(e),
            },
        }
    }))
    .await;
    let output = UnpinOutput {
        sets: used,
        all_sets,
        nodes,
    };
    let text = render(&output, args.output(), || unpin_table(&output))?;
    let failed: Vec<String> = output
        .nodes
        .iter()
        .filter(|u| !u.ok)
        .map(|u| {
            format!(
                "{}: not unpinned: {}; fix it and run unpin again",
                u.node,
                u.message.as_deref().unwrap_or_default()
            )
        })
        .collect();
    if failed.is_empty() {
        return Ok(text);
    }
    let _ = std::io::stdout().write_all(text.as_bytes());
    Err(Failure {
        exit: if failed.len() == output.nodes.len() {
            Exit::Unreachable
        } else {
            Exit::NotReady
        },
        lines: failed,
    })
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

/// The sets, then a row per pin concerned on each node (unpinned, or kept and for whom), then what else
/// each node has to say.
fn unpin_table(output: &UnpinOutput) -> String {
    let mut out: String = output.sets.iter().map(|s| s.line(false)).collect();
    if output.all_sets {
        out.push_str("every set's hold (--all-sets)\n");
    }
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for node in &output.nodes {
        for image in &node.report.unpinned {
            rows.push(vec![
                node.node.clone(),
                short_reference(image),
                "unpinned".into(),
                "-".into(),
            ]);
        }
        for kept in &node.report.kept {
            rows.push(vec![
                node.node.clone(),
                short_reference(&kept.reference),
                "stays pinned".into(),
                kept.held_by.short(),
            ]);
        }
        match (&node.message, node.ok) {
            (Some(error), false) => notes.push(format!("{}: ✗ not unpinned: {error}", node.node)),
            (Some(note), true) => notes.push(format!("{}: {note}", node.node)),
            (None, true) if rows.iter().all(|r| r[0] != node.node) => {
                notes.push(format!("{}: nothing held by these sets", node.node))
            }
            _ => {}
        }
    }
    if !rows.is_empty() {
        out.push('\n');
        let headers = ["NODE", "IMAGE", "PIN", "HELD BY"].map(String::from);
        out.push_str(&table(&headers, &rows, &|_, _, text| text.to_string()));
    }
    if !notes.is_empty() {
        out.push('\n');
        out.extend(notes.into_iter().map(|n| n + "\n"));
    }
    out
}

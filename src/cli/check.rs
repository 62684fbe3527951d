//! `pinboard check` and `pinboard status`: per node and per image, present and pinned as the node enforces
//! it, and why not. Both observe through [`crate::backend::readiness`] and judge through
//! [`crate::model::readiness::assess`]; `check` adds the verdict (exit 0 ready, 1 not ready, 3 nothing
//! reachable) and can wait for it, `status` prints the same per-node data and exits 0. Headless `apply`
//! ends with the same check.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::output::{image_matrix, render, table};
use crate::backend::readiness::{observe, observe_pulls};
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::error::{Exit, Failure};
use crate::model::holders::HeldBy;
use crate::model::image::Platform;
use crate::model::plan::Limits;
use crate::model::readiness::{
    ImageReadiness, ImageReason, NodeObserved, NodeReadiness, NodesStatus, Readiness, assess,
};
use crate::model::set::ImageSet;
use crate::options::{CHECK_WAIT, CommonArgs, command_sets};
use crate::survey::{survey, union_of};

/// How often `check --wait` observes the nodes again.
const WAIT_INTERVAL: Duration = Duration::from_secs(2);

/// Everything a readiness check needs, read and checked from the command line before any node is asked.
pub(super) struct Checker {
    pub(super) targets: Vec<NodeTarget>,
    pub(super) sets: Vec<ImageSet>,
    references: Vec<String>,
    pub(super) registry: Arc<Registry>,
    pub(super) platform: Platform,
    pub(super) limits: Limits,
    pub(super) timeout: Duration,
    /// The blob cache plans count as fetched already.
    pub(super) cache: Option<PathBuf>,
}

impl Checker {
    /// Reads and checks the arguments, then puts back what a killed pinboard's fan-out left on the nodes.
    pub(super) async fn new(args: &CommonArgs) -> Result<Checker, Failure> {
        let targets = args.targets.resolve()?;
        let (sets, registry) = command_sets(args, true).await?;
        let checker = Checker {
            targets,
            references: union_of(&sets),
            sets,
            registry: Arc::new(registry),
            platform: args.targets.platform()?,
            limits: args.limits.limits(),
            timeout: args.targets.timeout(),
            cache: args.cache.dir().ok(),
        };
        super::clean_stale(&checker.targets, checker.timeout).await;
        Ok(checker)
    }

    async fn observe_all(&self, timeout: Duration) -> Vec<NodeObserved> {
        futures::future::join_all(
            self.targets
                .iter()
                .map(|t| observe(t, &self.references, timeout)),
        )
        .await
    }

    /// Each node judged from `observed`. Nodes that miss images are planned too, so that "no space" can be
    /// a reason, and asked for the pulls in flight; a registry that cannot answer only leaves those out.
    async fn judge(&self, observed: &[NodeObserved], timeout: Duration) -> Vec<NodeReadiness> {
        let mut observed = observed.to_vec();
        let missing: Vec<usize> = (0..observed.len())
            .filter(|&i| {
                observed[i].unreachable.is_none()
                    && observed[i]
                        .images
                        .iter()
                        .any(|img| img.present == Some(false))
            })
            .collect();
        let mut plans = vec![None; observed.len()];
        if !missing.is_empty() {
            let nodes: Vec<_> = missing
                .iter()
                .map(|&i| self.targets[i].node.clone())
                .collect();
            let surveyed = survey(
                &nodes,
                &self.sets,
                &self.registry,
                &self.platform,
                self.limits,
                timeout,
                self.cache.as_deref(),
            )
            .await;
            match surveyed {
                Ok(s) => {
                    for &i in &missing {
                        observe_pulls(&self.targets[i], &mut observed[i], &s.facts, timeout).await;
                    }
                    for (i, plan) in missing.iter().zip(s.nodes) {
                        plans[*i] = Some(plan);
                    }
                }
                Err(e) => tracing::warn!(
                    "cannot plan the nodes missing images, so \"no space\" is not checked: {}",
                    Failure::from(e)
                ),
            }
        }
        observed
            .iter()
            .zip(&plans)
            .map(|(o, plan)| assess(o, plan.as_ref()))
            .collect()
    }

    /// Observes and judges every node once; exit 3 when none could be reached.
    pub(super) async fn readiness(&self) -> Result<Readiness, Failure> {
        let observed = self.observe_all(self.timeout).await;
        all_unreachable(&observed)?;
        Ok(Readiness::of(self.judge(&observed, self.timeout).await))
    }

    /// Observes until every node is ready or `limit` has passed, printing one line on stderr per change;
    /// then judges the last observation.
    async fn wait(&self, limit: Duration) -> Result<Readiness, Failure> {
        let deadline = Instant::now() + limit;
        let call_timeout = self.timeout.min(limit);
        let mut last_line = String::new();
        loop {
            let observed = self.observe_all(call_timeout).await;
            let readiness = Readiness::of(observed.iter().map(|o| assess(o, None)).collect());
            let line = readiness.progress_line();
            if !readiness.ready && line != last_line {
                eprintln!("waiting: {line}");
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if readiness.ready || left.is_zero() {
                if !readiness.ready {
                    eprintln!("waiting: timed out after {limit:?}: {line}");
                }
                all_unreachable(&observed)?;
                return Ok(Readiness::of(self.judge(&observed, call_timeout).await));
            }
            last_line = line;
            tokio::time::sleep(WAIT_INTERVAL.min(left)).await;
        }
    }
}

/// Exit 3 when no node answered, each node's error on its own line.
fn all_unreachable(observed: &[NodeObserved]) -> Result<(), Failure> {
    if observed.iter().all(|o| o.unreachable.is_some()) {
        return Err(Failure::unreachable(
            observed
                .iter()
                .map(|o| {
                    let error = o.unreachable.as_deref().unwrap_or_default();
                    format!("{}: unreachable: {error}; check that the runtime is running and the endpoint is right", o.node)
                })
                .collect(),
        ));
    }
    Ok(())
}

pub async fn check(args: CommonArgs) -> Result<String, Failure> {
    let wait = args
        .rollout
        .wait
        .then(|| args.rollout.timeout_or(CHECK_WAIT));
    if let Some(options) = super::cluster::cluster_mode(&args.targets, args.rollout.verify_cri) {
        return super::cluster::check(&options, &args, wait).await;
    }
    let checker = Checker::new(&args).await?;
    let readiness = match wait {
        Some(limit) => checker.wait(limit).await?,
        None => checker.readiness().await?,
    };
    let text = render(&readiness, args.output(), || {
        readiness_table(&readiness.nodes) + &verdict_line(&readiness)
    })?;
    verdict(text, &readiness)
}

pub async fn status(args: CommonArgs) -> Result<String, Failure> {
    if let Some(options) = super::cluster::cluster_mode(&args.targets, false) {
        return super::cluster::status(&options, &args).await;
    }
    let checker = Checker::new(&args).await?;
    let status = NodesStatus {
        nodes: checker.readiness().await?.nodes,
    };
    render(&status, args.output(), || readiness_table(&status.nodes))
}

/// `text` for stdout when ready; otherwise `text` is written to stdout here and the reasons, one per line
/// and naming the node, end the command with exit 1.
pub(super) fn verdict(text: String, readiness: &Readiness) -> Result<String, Failure> {
    warn(&readiness.nodes);
    if readiness.ready {
        return Ok(text);
    }
    let mut stdout = std::io::stdout();
    // A closed pipe is not worth more than the exit code that follows.
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    Err(Failure {
        exit: Exit::NotReady,
        lines: readiness.reason_lines(),
    })
}

/// Each node's warnings on stderr, naming the node: worth knowing, but not why a node is not ready.
pub(super) fn warn(nodes: &[NodeReadiness]) {
    for node in nodes {
        for warning in &node.warnings {
            eprintln!("warning: {}: {warning}", node.node);
        }
    }
}

pub(super) fn verdict_line(readiness: &Readiness) -> String {
    let word = if readiness.ready {
        "✓ ready"
    } else {
        "✗ not ready"
    };
    format!(
        "\n{word}: {}/{} nodes ready\n",
        readiness.ready_nodes,
        readiness.nodes.len()
    )
}

/// One row per node, each node's reasons, then the image × node matrix.
pub(super) fn readiness_table(nodes: &[NodeReadiness]) -> String {
    let headers = ["NODE", "RUNTIME", "PINS", "PRESENT", "PINNED", "STATUS"].map(String::from);
    let count = |n: &NodeReadiness, f: fn(&ImageReadiness) -> bool| {
        if n.reachable {
            format!(
                "{}/{}",
                n.images.iter().filter(|i| f(i)).count(),
                n.images.len()
            )
        } else {
            "unknown".into()
        }
    };
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.node.clone(),
                n.runtime.clone().unwrap_or_else(|| "unreachable".into()),
                n.pin_method.clone().unwrap_or_else(|| "unknown".into()),
                count(n, |i| i.present == Some(true)),
                count(n, |i| i.present == Some(true) && i.pinned == Some(true)),
                format!(
                    "{} {}{}",
                    if n.ready { "✓" } else { "✗" },
                    n.summary(),
                    // Cluster nodes: what the judgement rests on (direct mode: always the runtime).
                    n.kubelet
                        .as_ref()
                        .and(n.evidence_words())
                        .map_or_else(String::new, |words| format!(" ({words})"))
                ),
            ]
        })
        .collect();
    let plain = |_: usize, _: usize, text: &str| text.to_string();
    let mut out = table(&headers, &rows, &plain);
    for node in nodes
        .iter()
        .filter(|n| !n.reasons.is_empty() || !n.warnings.is_empty())
    {
        out.push_str(&format!("\n{}:\n", node.node));
        for reason in &node.reasons {
            out.push_str(&format!("  - {reason}\n"));
        }
        for warning in &node.warnings {
            out.push_str(&format!("  ! {warning}\n"));
        }
    }
    let set_rows: Vec<Vec<String>> = nodes
        .iter()
        .flat_map(|n| n.sets.iter().map(move |s| (n, s)))
        .map(|(n, s)| {
            let generation = |g: Option<i64>| g.map_or_else(|| "-".into(), |g| g.to_string());
            vec![
                n.node.clone(),
                s.name.clone(),
                generation(s.generation),
                generation(s.desired_generation),
                generation(s.current_generation),
                generation(s.last_failed_generation),
                s.state.clone(),
            ]
        })
        .collect();
    if !set_rows.is_empty() {
        let headers = [
            "NODE",
            "SET",
            "GENERATION",
            "DESIRED",
            "CURRENT",
            "FAILED",
            "STATE",
        ];
        out.push('\n');
        out.push_str(&table(&headers.map(String::from), &set_rows, &plain));
    }
    let columns: Vec<(&str, &[ImageReadiness])> = nodes
        .iter()
        .map(|n| (n.node.as_str(), n.images.as_slice()))
        .collect();
    let matrix = image_matrix(&[], &columns, |i| &i.reference, |_| Vec::new(), image_cell);
    if !matrix.is_empty() {
        out.push('\n');
        out.push_str(&matrix);
    }
    out
}

fn image_cell(image: &ImageReadiness) -> String {
    let held = image
        .held_by
        .as_ref()
        .map(HeldBy::short)
        .filter(|h| h != "-");
    match image.reason {
        // Direct mode: for whom.
        None => match held {
            Some(held) => format!("✓ pinned ({held})"),
            None => "✓ pinned".into(),
        },
        Some(ImageReason::NotPinned) => "! not pinned".into(),
        Some(ImageReason::Missing) => "✗ missing".into(),
        Some(ImageReason::Pulling) => "↓ pulling".into(),
        Some(ImageReason::Unknown) => "? unknown".into(),
    }
}

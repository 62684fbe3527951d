//! `pinboard check` and `pinboard status`: per node and per image, present and pinned as the node enforces
//! it, and why not, as the fleet judges it ([`crate::fleet::Fleet::readiness`]); `check` adds the verdict
//! (exit 0 ready, 1 not ready, 3 nothing reachable) and can wait for it, `status` prints the same per-node
//! data and exits 0. Both count the nodes the sets select that were left out, and why (on agents). Headless
//! `apply` ends with the same check.

use super::output::{image_matrix, printed_then, render, table};
use crate::error::{Exit, Failure};
use crate::model::holders::HeldBy;
use crate::model::lazy::RemoteLayers;
use crate::model::readiness::{
    ImageReadiness, ImageReason, LeftOut, NodeReadiness, NodesStatus, Readiness,
};
use crate::model::units::{human, human_rate};
use crate::options::{CHECK_WAIT, Caller, CommonArgs};

pub async fn check(args: CommonArgs) -> Result<String, Failure> {
    let wait = args
        .rollout
        .wait
        .then(|| args.rollout.timeout_or(CHECK_WAIT));
    let fleet = args
        .fleet(Caller::Command {
            asks_runtimes: true,
        })
        .await?;
    let readiness = fleet.readiness(&args.input.sources(), wait).await?;
    let text = render(&readiness, args.output(), || readiness_text(&readiness))?;
    verdict(text, &readiness)
}

pub async fn status(args: CommonArgs) -> Result<String, Failure> {
    let fleet = args
        .fleet(Caller::Command {
            asks_runtimes: false,
        })
        .await?;
    let status = NodesStatus::from(fleet.readiness(&args.input.sources(), None).await?);
    warn(&status.nodes, &status.warnings);
    render(&status, args.output(), || {
        readiness_table(&status.nodes) + &left_out_lines(&status.left_out)
    })
}

/// `text` for stdout when ready; otherwise `text` is written to stdout here and the reasons, one per line
/// and naming the node, end the command with exit 1.
pub(super) fn verdict(text: String, readiness: &Readiness) -> Result<String, Failure> {
    warn(&readiness.nodes, &readiness.warnings);
    if readiness.ready {
        return Ok(text);
    }
    Err(printed_then(
        &text,
        Failure {
            exit: Exit::NotReady,
            lines: readiness.reason_lines(),
        },
    ))
}

/// The judgement's warnings, then each node's, naming the node, on stderr: worth knowing, but not why a
/// node is not ready.
fn warn(nodes: &[NodeReadiness], warnings: &[String]) {
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    for node in nodes {
        for warning in &node.warnings {
            eprintln!("warning: {}: {warning}", node.node);
        }
    }
}

/// The table, the nodes left out and the verdict: what `check` and `apply` print.
pub(super) fn readiness_text(readiness: &Readiness) -> String {
    readiness_table(&readiness.nodes)
        + &left_out_lines(&readiness.left_out)
        + &verdict_line(readiness)
}

/// `2 nodes left out: REASON: n5, n6`, a line per reason.
fn left_out_lines(left_out: &[LeftOut]) -> String {
    match left_out.is_empty() {
        true => String::new(),
        false => {
            left_out
                .iter()
                .map(|l| format!("\n{}", l.line()))
                .collect::<String>()
                + "\n"
        }
    }
}

fn verdict_line(readiness: &Readiness) -> String {
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
fn readiness_table(nodes: &[NodeReadiness]) -> String {
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
    for (node, cache) in nodes
        .iter()
        .filter_map(|n| Some((&n.node, n.cache.as_ref()?)))
    {
        out.push_str(&format!(
            "\n{node} holds the in-cluster cache ({}): {} from the registries{}, {} served to the nodes{}, \
             {} requests, {} refused\n",
            cache.address,
            human(cache.link_bytes),
            cache
                .link_rate
                .map_or_else(String::new, |rate| format!(" (budget {})", human_rate(rate))),
            human(cache.served_bytes),
            cache
                .serve_rate
                .map_or_else(String::new, |rate| format!(" (cap {})", human_rate(rate))),
            cache.requests,
            cache.refused
        ));
        if cache.swarm_nodes > 0 {
            out.push_str(&format!(
                "  {} nodes take its blobs from each other ({} blobs shared through its tracker)\n",
                cache.swarm_nodes, cache.swarm_blobs
            ));
        }
        for dropped in &cache.dropped_peers {
            out.push_str(&format!(
                "  ! {} no longer serves the other nodes: it sent a corrupt piece of {} ({})\n",
                dropped.node, dropped.digest, dropped.reason
            ));
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
                s.state.word().to_string(),
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
    let lazy = image.lazy.as_ref().map(RemoteLayers::words);
    match image.reason {
        // Direct mode: for whom; accepted though lazily present (--allow-lazy), that too.
        None => {
            let pinned = match held {
                Some(held) => format!("✓ pinned ({held})"),
                None => "✓ pinned".into(),
            };
            match lazy {
                Some(lazy) => format!("{pinned}, {lazy}"),
                None => pinned,
            }
        }
        Some(ImageReason::Lazy) => format!("~ {}", lazy.unwrap_or_else(|| "lazy".into())),
        Some(ImageReason::NotPinned) => "! not pinned".into(),
        Some(ImageReason::Missing) => "✗ missing".into(),
        Some(ImageReason::Pulling) => "↓ pulling".into(),
        Some(ImageReason::Unknown) => "? unknown".into(),
    }
}

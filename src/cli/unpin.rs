//! Headless `pinboard unpin`: the named sets' holds released on the fleet the arguments name
//! ([`crate::fleet::Fleet::unpin`]). Where pinboard releases them on each node, it says which images lost
//! their pin and which stay pinned, for whom; on a cluster, which sets were deleted.

use super::apply::set_line;
use super::output::{printed_then, render, short_reference, table};
use crate::error::{Exit, Failure};
use crate::fleet::{NodesUnpinned, SetDeleted, UnpinOptions, Unpinned};
use crate::model::readiness::unreachable_reason;
use crate::options::{Caller, CommonArgs};

pub async fn unpin(args: CommonArgs) -> Result<String, Failure> {
    let fleet = args
        .fleet(Caller::Command {
            asks_runtimes: false,
        })
        .await?;
    let options = UnpinOptions {
        all_sets: args.unpin.all_sets,
        release_unowned: args.unpin.release_unowned,
    };
    match fleet.unpin(&args.input.sources(), options).await? {
        Unpinned::Nodes(output) => nodes_unpinned(&output, &args),
        Unpinned::Sets(deleted) => render(&deleted, args.output(), || deleted_table(&deleted)),
    }
}

/// The per-node outcome; exit 1 when a node could not be unpinned (3 when none could).
fn nodes_unpinned(output: &NodesUnpinned, args: &CommonArgs) -> Result<String, Failure> {
    let text = render(output, args.output(), || unpin_table(output))?;
    let failed: Vec<String> = output
        .nodes
        .iter()
        .filter(|u| !u.ok)
        .map(|u| {
            let error = u.message.as_deref().unwrap_or_default();
            match u.reachable {
                true => format!(
                    "{}: not unpinned: {error}; fix it and run unpin again",
                    u.node
                ),
                false => format!("{}: {}", u.node, unreachable_reason(error)),
            }
        })
        .collect();
    if failed.is_empty() {
        return Ok(text);
    }
    Err(printed_then(
        &text,
        Failure {
            exit: if failed.len() == output.nodes.len() {
                Exit::Unreachable
            } else {
                Exit::NotReady
            },
            lines: failed,
        },
    ))
}

/// One row per set deleted on a cluster.
fn deleted_table(deleted: &[SetDeleted]) -> String {
    let headers = ["SET", "RESULT"].map(String::from);
    let body: Vec<Vec<String>> = deleted
        .iter()
        .map(|r| vec![r.set.clone(), r.message.clone()])
        .collect();
    table(&headers, &body, &|_, _, text| text.to_string())
}

/// The sets, then a row per pin concerned on each node (unpinned, or kept and for whom), then what else
/// each node has to say.
fn unpin_table(output: &NodesUnpinned) -> String {
    let mut out: String = output.sets.iter().map(|s| set_line(s, false)).collect();
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

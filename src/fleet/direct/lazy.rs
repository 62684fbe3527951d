//! `pinboard lazy` on direct nodes: each node's lazy pulling read, or turned on or off the way its runtime
//! does it ([`crate::backend::lazy::set_lazy`]), all nodes at once; what happened said per node.

use super::Direct;
use crate::backend::lazy::{Apply, LazyError, LazyOutcome, set_lazy};
use crate::backend::target::NodeTarget;
use crate::model::diff::DiffKind;
use crate::model::lazy::{AddLines, FileChangeKind, NodeLazy};

/// Every node's lazy pulling, after turning it on or off where `wanted` says so.
pub(super) async fn lazy(direct: &Direct, wanted: Option<bool>, apply: Apply) -> Vec<NodeLazy> {
    let nodes = direct.targets.iter().map(|target| async move {
        let (endpoint, config) = (&target.node.endpoint, &target.lazy);
        let outcome = set_lazy(endpoint, config, wanted, apply, direct.timeout).await;
        let mut said = node_lazy(target, wanted.is_some(), apply, outcome);
        // Refused: still say what the node has now.
        if said.reachable
            && said.error.is_some()
            && let Ok(now) = set_lazy(endpoint, config, None, apply, direct.timeout).await
        {
            said.runtime = Some(now.runtime);
            said.lazy_pulling = Some(now.now);
            said.file = Some(now.file.display().to_string());
        }
        said
    });
    futures::future::join_all(nodes).await
}

/// What `pinboard lazy` says of one node; `changing` when it was asked to turn lazy pulling on or off.
fn node_lazy(
    target: &NodeTarget,
    changing: bool,
    apply: Apply,
    outcome: Result<LazyOutcome, LazyError>,
) -> NodeLazy {
    let node = target.node.name.clone();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            let add = match &e {
                LazyError::NoImport { add, place, .. } => Some(AddLines {
                    lines: add.clone(),
                    place: place.clone(),
                }),
                _ => None,
            };
            return NodeLazy {
                node,
                reachable: !matches!(&e, LazyError::Cri(cri) if cri.unreachable),
                change: changing.then_some(FileChangeKind::NotWritten),
                error: Some(e.to_string()),
                add,
                ..NodeLazy::default()
            };
        }
    };
    let change = changing.then_some(match (outcome.changed, apply.write) {
        (false, _) => FileChangeKind::Unchanged,
        (true, true) => FileChangeKind::Written,
        (true, false) => FileChangeKind::WouldWrite,
    });
    NodeLazy {
        node,
        runtime: Some(outcome.runtime),
        reachable: true,
        lazy_pulling: Some(outcome.now),
        file: Some(outcome.file.display().to_string()),
        change,
        restarted: outcome.restarted.map(str::to_string),
        diff: outcome
            .diff
            .into_iter()
            .map(|(kind, line)| {
                let mark = match kind {
                    DiffKind::Added => "+ ",
                    DiffKind::Removed => "- ",
                    DiffKind::Same => "  ",
                };
                format!("{mark}{line}")
            })
            .collect(),
        error: None,
        add: None,
    }
}

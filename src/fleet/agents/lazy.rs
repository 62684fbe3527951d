//! `pinboard lazy` through pinboard's agents: the wish is written into each node's report
//! (`spec.lazyPulling`), its agent writes the runtime's file as direct mode would, and its report says
//! what is in force. Agents never restart a runtime: the report's detail names the restart to do.

use std::time::{Duration, SystemTime};

use super::session::Connected;
use crate::backend::lazy::Apply;
use crate::error::Failure;
use crate::model::lazy::{LazyPulling, LazyState, NodeLazy};
use crate::model::pinboard_api::NodeReport;

/// How long `lazy on|off` waits for the agents to report the wish carried out.
const FOLLOW_WITHIN: Duration = Duration::from_secs(60);

/// Each node with an agent, after asking its agent to turn lazy pulling on or off where `wanted` says so.
pub(super) async fn lazy(
    connected: &mut Connected,
    wanted: Option<bool>,
    apply: Apply,
) -> Result<Vec<NodeLazy>, Failure> {
    if apply.restart {
        return Err(Failure::bad_input(
            "--restart: pinboard's agents never restart a node's runtime; run `pinboard lazy on` without \
             it, then restart the runtime on the nodes the report names",
        ));
    }
    let now = SystemTime::now();
    let nodes: Vec<String> = connected
        .view
        .nodes_with_agent()
        .into_iter()
        .map(|n| n.name.clone())
        .collect();
    if let (Some(on), true) = (wanted, apply.write) {
        for node in &nodes {
            connected.api.set_lazy(node, on).await?;
        }
        connected
            .follow(FOLLOW_WITHIN, |view| {
                nodes
                    .iter()
                    .all(|n| view.report(n).is_some_and(|r| answered(r, on)))
            })
            .await;
    }
    Ok(nodes
        .iter()
        .map(|node| {
            let stale = connected.view.agent_untrusted(node, now);
            node_lazy(node, connected.view.report(node), stale.is_none(), wanted)
        })
        .collect())
}

/// Whether `report` answers the wish `on`: lazy pulling configured so, or the agent's error in carrying
/// out that very wish (an error it reported before it was asked is no answer).
fn answered(report: &NodeReport, on: bool) -> bool {
    follows(report, on)
        || (report.lazy_pulling_error.is_some() && report.lazy_pulling_wish == Some(on))
}

/// Whether `report` shows lazy pulling configured as `on` asks (in force or after a restart).
fn follows(report: &NodeReport, on: bool) -> bool {
    report.lazy_pulling.as_ref().is_some_and(|l| match on {
        true => l.configured(),
        false => matches!(l.state, LazyState::Off | LazyState::OffAfterRestart),
    })
}

/// One node's row: what its agent last reported, and why it is not as asked when it is not.
fn node_lazy(
    node: &str,
    report: Option<&NodeReport>,
    trusted: bool,
    wanted: Option<bool>,
) -> NodeLazy {
    let lazy_pulling: Option<LazyPulling> = report.and_then(|r| r.lazy_pulling.clone());
    let error = match (report, wanted) {
        (None, _) => Some("no agent reports this node".to_string()),
        (Some(_), _) if !trusted => {
            Some("its agent's heartbeat is stale: this is its last report".into())
        }
        (Some(r), _) if r.lazy_pulling_error.is_some() => r.lazy_pulling_error.clone(),
        (Some(r), Some(on)) if !follows(r, on) => Some(format!(
            "its agent has not reported lazy pulling {} within {FOLLOW_WITHIN:?}; see its log",
            if on { "on" } else { "off" }
        )),
        _ => None,
    };
    NodeLazy {
        node: node.to_owned(),
        runtime: report
            .and_then(|r| r.runtime.as_ref())
            .map(|r| format!("{} {}", r.name, r.version)),
        reachable: report.is_some() && trusted,
        lazy_pulling,
        file: None,
        change: None,
        restarted: None,
        diff: Vec::new(),
        error,
        add: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reported_before_the_wish_is_no_answer_to_it() {
        let unreadable = NodeReport {
            lazy_pulling_error: Some("no containerd config: pass --containerd-config".into()),
            ..NodeReport::default()
        };
        assert!(!answered(&unreadable, true), "an agent not yet asked");
        let refused = NodeReport {
            lazy_pulling_wish: Some(true),
            ..unreadable.clone()
        };
        assert!(answered(&refused, true), "its answer to on");
        assert!(!answered(&refused, false), "not to off");
        let on = NodeReport {
            lazy_pulling: Some(LazyPulling::new(LazyState::On, None, Some(true), None)),
            ..NodeReport::default()
        };
        assert!(answered(&on, true));
    }
}

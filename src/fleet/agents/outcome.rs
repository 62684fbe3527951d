//! What `apply` on agents prints per node: what each node's agent reported of the sets it was given, summed
//! over them — its state, its images present, pulled and pinned, the bytes it measured its runtime fetch
//! (its content store's gain, or its relay's bytes) beside what its own plan said — as direct mode's apply
//! prints what pinboard itself did. Pure.

use crate::fleet::NodeOutcome;
use crate::model::agents_view::AgentsView;
use crate::model::pinboard_api::{DEGRADED, NodeSetPhase, SetOutcome, SetReport};
use crate::model::readiness::Readiness;

/// A set `apply` wrote: its name, and whether this apply changed it (a new generation the agents rolled
/// out); an unchanged set's last rollout is older than this apply, so it moved nothing now.
pub struct Applied<'a> {
    pub name: &'a str,
    pub generation: i64,
    pub changed: bool,
}

/// One outcome per node `readiness` judged, from its agent's reports of `sets`.
pub fn node_outcomes(
    view: &AgentsView,
    readiness: &Readiness,
    sets: &[Applied],
) -> Vec<NodeOutcome> {
    readiness
        .nodes
        .iter()
        .map(|node| {
            let reports: Vec<(&Applied, Option<&SetReport>)> = sets
                .iter()
                .map(|set| {
                    let report = view.report(&node.node).and_then(|r| {
                        r.sets
                            .iter()
                            .find(|s| s.name == set.name && s.observed_generation >= set.generation)
                    });
                    (set, report)
                })
                .filter(|(set, _)| node.sets.iter().any(|s| s.name == set.name))
                .collect();
            outcome(&node.node, &reports)
        })
        .collect()
}

/// Node `name`'s outcome over its sets' reports (None: its agent has not reported the set's generation).
fn outcome(name: &str, reports: &[(&Applied, Option<&SetReport>)]) -> NodeOutcome {
    let phases: Vec<Option<NodeSetPhase>> =
        reports.iter().map(|(_, r)| r.map(|r| r.state)).collect();
    let state = if phases.contains(&Some(NodeSetPhase::Failed)) {
        "failed"
    } else if phases.contains(&Some(NodeSetPhase::Restoring)) {
        "restoring"
    } else if phases.iter().all(|p| *p == Some(NodeSetPhase::Pinned)) {
        "pinned"
    } else if phases.contains(&Some(NodeSetPhase::Pulling)) {
        "pulling"
    } else {
        "waiting"
    };
    let reasons: Vec<String> = reports
        .iter()
        .filter_map(|(set, report)| {
            let degraded = (*report)?
                .conditions
                .iter()
                .find(|c| c.type_ == DEGRADED && c.status == "True")?;
            Some(format!("{}: {}", set.name, degraded.message))
        })
        .collect();
    let mut outcome = NodeOutcome {
        node: name.to_owned(),
        state: state.to_owned(),
        confirmed: (state == "pinned").then(|| {
            reports.iter().all(|(_, r)| {
                r.is_some_and(|r| {
                    r.images.is_empty()
                        || r.images
                            .iter()
                            .all(|i| i.evidence.as_deref() == Some("runtime"))
                })
            })
        }),
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        figures: SetOutcome::default(),
        failed: Vec::new(),
    };
    for (set, report) in reports {
        let Some(report) = report else {
            continue;
        };
        outcome.failed.extend(
            report
                .images
                .iter()
                .filter(|i| i.state == crate::model::pinboard_api::ImagePhase::Failed)
                .map(|i| format!("{}: {}", i.name, i.reason.as_deref().unwrap_or("failed"))),
        );
        let Some(figures) = report.outcome.as_ref() else {
            continue;
        };
        let sum = &mut outcome.figures;
        sum.images += figures.images;
        sum.pinned += figures.pinned;
        if !set.changed {
            // Nothing moved for this apply: every image was there already.
            sum.present += figures.images;
            continue;
        }
        sum.present += figures.present;
        sum.lazy += figures.lazy;
        sum.pulled += figures.pulled;
        sum.fetched_bytes += figures.fetched_bytes;
        sum.planned_bytes += figures.planned_bytes;
        sum.fetched_source = sum.fetched_source.or(figures.fetched_source);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rollout::FetchedSource;

    fn report(name: &str, state: NodeSetPhase, fetched: u64) -> SetReport {
        SetReport {
            name: name.into(),
            observed_generation: 1,
            state,
            outcome: Some(SetOutcome {
                images: 3,
                present: 1,
                pulled: 2,
                pinned: 3,
                fetched_bytes: fetched,
                fetched_source: Some(FetchedSource::ContentStore),
                planned_bytes: fetched + 10,
                ..SetOutcome::default()
            }),
            ..SetReport::default()
        }
    }

    #[test]
    fn a_nodes_outcome_sums_its_sets_and_a_set_this_apply_left_unchanged_moved_nothing() {
        let web = Applied {
            name: "web",
            generation: 1,
            changed: true,
        };
        let db = Applied {
            name: "db",
            generation: 1,
            changed: false,
        };
        let (w, d) = (
            report("web", NodeSetPhase::Pinned, 1000),
            report("db", NodeSetPhase::Pinned, 5000),
        );
        let o = outcome("n1", &[(&web, Some(&w)), (&db, Some(&d))]);
        assert_eq!(o.state, "pinned");
        let f = &o.figures;
        assert_eq!((f.images, f.present, f.pulled, f.pinned), (6, 4, 2, 6));
        assert_eq!((f.fetched_bytes, f.planned_bytes), (1000, 1010));
        assert_eq!(f.fetched_source, Some(FetchedSource::ContentStore));

        let failed = report("db", NodeSetPhase::Failed, 0);
        let o = outcome("n1", &[(&web, Some(&w)), (&db, Some(&failed))]);
        assert_eq!(o.state, "failed");
        let o = outcome("n1", &[(&web, None)]);
        assert_eq!((o.state.as_str(), o.figures.fetched_bytes), ("waiting", 0));
    }
}

//! Readiness on direct nodes: each node observed through [`crate::backend::readiness`] and judged through
//! [`crate::model::readiness::assess_with`] (`--allow-lazy` decides whether lazily present images count); nodes that miss images are planned too, so that "no space" can be
//! a reason, and asked for the pulls in flight. `check --wait` observes again every 2 s.

use std::time::{Duration, Instant};

use super::Direct;
use crate::backend::readiness::{observe, observe_pulls};
use crate::error::Failure;
use crate::fleet::SetSources;
use crate::model::readiness::{
    NodeReadiness, ObservedNode, Readiness, assess_with, unreachable_reason,
};
use crate::model::set::ImageSet;
use crate::survey::union_of;

/// How often `check --wait` observes the nodes again.
const WAIT_INTERVAL: Duration = Duration::from_secs(2);

/// The sets of a readiness check, read and checked before any node is asked.
pub(super) struct Checker<'f> {
    fleet: &'f Direct,
    pub(super) sets: Vec<ImageSet>,
    references: Vec<String>,
}

impl<'f> Checker<'f> {
    /// Reads and checks the sets, then puts back what a killed pinboard's fan-out left on the nodes.
    pub(super) async fn new(
        fleet: &'f Direct,
        sources: &SetSources,
    ) -> Result<Checker<'f>, Failure> {
        let sets =
            crate::fleet::sets::noted(sources, true, &fleet.registry, &fleet.platform).await?;
        let checker = Checker {
            fleet,
            references: union_of(&sets),
            sets,
        };
        fleet.clean_stale().await;
        Ok(checker)
    }

    async fn observe_all(&self, timeout: Duration) -> Vec<ObservedNode> {
        futures::future::join_all(
            self.fleet
                .targets
                .iter()
                .map(|t| observe(t, &self.references, timeout)),
        )
        .await
    }

    /// Each node judged from `observed`. Nodes that miss images are planned too, so that "no space" can be
    /// a reason, and asked for the pulls in flight; a registry that cannot answer only leaves those out.
    async fn judge(&self, observed: &[ObservedNode], timeout: Duration) -> Vec<NodeReadiness> {
        let fleet = self.fleet;
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
                .map(|&i| fleet.targets[i].node.clone())
                .collect();
            let surveyed = crate::survey::survey(
                &nodes,
                &self.sets,
                &fleet.registry,
                &fleet.platform,
                fleet.limits,
                timeout,
                fleet.cache_dir.as_deref(),
            )
            .await;
            match surveyed {
                Ok(s) => {
                    for &i in &missing {
                        observe_pulls(&fleet.targets[i], &mut observed[i], &s.facts, timeout).await;
                    }
                    for (i, plan) in missing.iter().zip(s.nodes) {
                        plans[*i] = Some(plan);
                    }
                }
                Err(e) => {
                    for problem in Failure::from(e).lines {
                        tracing::warn!(
                            "cannot plan the nodes missing images, so \"no space\" is not checked: {problem}"
                        );
                    }
                }
            }
        }
        observed
            .iter()
            .zip(&plans)
            .map(|(o, plan)| assess_with(o, plan.as_ref(), fleet.lazy_images))
            .collect()
    }

    /// Observes and judges every node once; exit 3 when none could be reached.
    pub(super) async fn readiness(&self) -> Result<Readiness, Failure> {
        let timeout = self.fleet.timeout;
        let observed = self.observe_all(timeout).await;
        all_unreachable(&observed)?;
        Ok(Readiness::of(self.judge(&observed, timeout).await))
    }

    /// Observes until every node is ready or `limit` has passed, printing one line on stderr per change;
    /// then judges the last observation.
    pub(super) async fn wait(&self, limit: Duration) -> Result<Readiness, Failure> {
        let deadline = Instant::now() + limit;
        let call_timeout = self.fleet.timeout.min(limit);
        let mut last_line = String::new();
        loop {
            let observed = self.observe_all(call_timeout).await;
            let lazy = self.fleet.lazy_images;
            let readiness = Readiness::of(
                observed
                    .iter()
                    .map(|o| assess_with(o, None, lazy))
                    .collect(),
            );
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
fn all_unreachable(observed: &[ObservedNode]) -> Result<(), Failure> {
    if observed.iter().all(|o| o.unreachable.is_some()) {
        return Err(Failure::unreachable(
            observed
                .iter()
                .map(|o| {
                    let error = o.unreachable.as_deref().unwrap_or_default();
                    format!("{}: {}", o.node, unreachable_reason(error))
                })
                .collect(),
        ));
    }
    Ok(())
}

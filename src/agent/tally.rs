//! What an agent counts of each set on its node, for its metrics: bytes its runtime fetched, retries and
//! stalls of its pulls and how long they took, losses put back by what was found, and when the set was
//! last found whole. Pure: the state folds events and outcomes in; the metrics page reads it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::model::pinboard_api::Found;
use crate::model::prometheus::Histogram;
use crate::model::rollout::Event;

/// The upper bounds of the pull-duration buckets, in seconds.
pub const PULL_SECONDS: [f64; 9] = [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];

#[derive(Clone, Debug, PartialEq)]
pub struct SetTally {
    pub pulled_bytes: u64,
    pub retries: u64,
    pub stalls: u64,
    pub restores: BTreeMap<Found, u64>,
    pub pull_seconds: Histogram,
    /// When the runtime last said every image of the set is there and pinned.
    pub verified: Option<Instant>,
    /// Pulls running, since their first attempt.
    started: HashMap<String, Instant>,
    /// The loss being put back: how many images were found in each way.
    lost: BTreeMap<Found, u64>,
}

impl Default for SetTally {
    fn default() -> SetTally {
        SetTally {
            pulled_bytes: 0,
            retries: 0,
            stalls: 0,
            restores: BTreeMap::new(),
            pull_seconds: Histogram::new(&PULL_SECONDS),
            verified: None,
            started: HashMap::new(),
            lost: BTreeMap::new(),
        }
    }
}

impl SetTally {
    /// Counts what a rollout event of the set tells.
    pub fn fold(&mut self, event: &Event) {
        match event {
            Event::PullStarted { image, at, .. } => {
                self.started.entry(image.clone()).or_insert(*at);
            }
            Event::PullDone { image, at, .. } => {
                if let Some(started) = self.started.remove(image) {
                    let seconds = at.saturating_duration_since(started).as_secs_f64();
                    self.pull_seconds.observe(seconds);
                }
            }
            Event::PullRetry { .. } => self.retries += 1,
            Event::PullStalled { .. } => self.stalls += 1,
            Event::PullFailed { image, .. } | Event::PullCancelled { image, .. } => {
                self.started.remove(image);
            }
            _ => {}
        }
    }

    /// Notes a loss found: how its images were found, counted once it is put back.
    pub fn lost(&mut self, found: impl IntoIterator<Item = Found>) {
        self.lost.clear();
        for how in found {
            *self.lost.entry(how).or_default() += 1;
        }
    }

    /// The loss noted was put back.
    pub fn restored(&mut self) {
        for (how, count) in std::mem::take(&mut self.lost) {
            *self.restores.entry(how).or_default() += count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pulls_time_retries_and_stalls_are_counted_per_set() {
        let at = Instant::now();
        let mut tally = SetTally::default();
        let image = || "a@sha256:1".to_string();
        tally.fold(&Event::PullStarted {
            node: "n1".into(),
            image: image(),
            attempt: 1,
            at,
        });
        tally.fold(&Event::PullStalled {
            node: "n1".into(),
            image: image(),
            at,
        });
        tally.fold(&Event::PullRetry {
            node: "n1".into(),
            image: image(),
            attempt: 1,
            reason: "no bytes".into(),
            backoff: Duration::from_secs(1),
            at,
        });
        tally.fold(&Event::PullDone {
            node: "n1".into(),
            image: image(),
            at: at + Duration::from_secs(20),
        });
        assert_eq!((tally.retries, tally.stalls), (1, 1));
        assert_eq!(tally.pull_seconds, {
            let mut h = Histogram::new(&PULL_SECONDS);
            h.observe(20.0);
            h
        });
    }
}

//! What an agent counts of each set on its node, for its metrics: bytes its runtime fetched (as they
//! arrive), retries and stalls of its pulls and how long they took, losses put back and their images by
//! what was found, and when the set was last found whole. Pure: the state folds events and outcomes in; the
//! metrics page reads it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::model::pinboard_api::Found;
use crate::model::prometheus::Histogram;
use crate::model::rollout::Event;

/// The upper bounds of the pull-duration buckets, in seconds.
pub const PULL_SECONDS: [f64; 9] = [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];

#[derive(Clone, Debug, PartialEq)]
pub struct SetTally {
    /// Bytes fetched: counted as the pulls report them, topped up to the runtime's figure at a rollout's
    /// end. Never goes down.
    pub pulled_bytes: u64,
    pub retries: u64,
    pub stalls: u64,
    /// Losses put back: one per time images or pins of the set were found lost, however many (the unit of
    /// the agent's `LostRepeatedly`).
    pub restores: u64,
    /// Images put back, by what was found.
    pub restored_images: BTreeMap<Found, u64>,
    pub pull_seconds: Histogram,
    /// When the runtime last said every image of the set is there and pinned.
    pub verified: Option<Instant>,
    /// Pulls running, since their first attempt.
    started: HashMap<String, Instant>,
    /// The loss being put back: how many images were found in each way.
    lost: BTreeMap<Found, u64>,
    /// The running rollout's pulls: the most bytes each reported, and their sum.
    pulling: HashMap<String, u64>,
    rollout_bytes: u64,
}

impl Default for SetTally {
    fn default() -> SetTally {
        SetTally {
            pulled_bytes: 0,
            retries: 0,
            stalls: 0,
            restores: 0,
            restored_images: BTreeMap::new(),
            pull_seconds: Histogram::new(&PULL_SECONDS),
            verified: None,
            started: HashMap::new(),
            lost: BTreeMap::new(),
            pulling: HashMap::new(),
            rollout_bytes: 0,
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
            // Only growth beyond the most an image reported counts: an attempt that resumes or starts
            // over adds nothing twice.
            Event::PullProgress { image, done, .. } => {
                let most = self.pulling.entry(image.clone()).or_default();
                if *done > *most {
                    let grown = *done - *most;
                    *most = *done;
                    self.rollout_bytes += grown;
                    self.pulled_bytes += grown;
                }
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

    /// A rollout of the set starts: its pulls count from 0.
    pub fn rollout_started(&mut self) {
        self.rollout_bytes = 0;
        self.pulling.clear();
    }

    /// The rollout ended pinned, its runtime having fetched `fetched` bytes: what its pulls did not
    /// report is counted now.
    pub fn rollout_ended(&mut self, fetched: u64) {
        self.pulled_bytes += fetched.saturating_sub(self.rollout_bytes);
        self.rollout_bytes = fetched.max(self.rollout_bytes);
    }

    /// Notes a loss found: how its images were found, put back later.
    pub fn lost(&mut self, found: impl IntoIterator<Item = Found>) {
        self.lost.clear();
        for how in found {
            *self.lost.entry(how).or_default() += 1;
        }
    }

    /// The loss noted was put back.
    pub fn restored(&mut self) {
        if !self.lost.is_empty() {
            self.restores += 1;
        }
        for (how, count) in std::mem::take(&mut self.lost) {
            *self.restored_images.entry(how).or_default() += count;
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

    fn progress(image: &str, done: u64) -> Event {
        Event::PullProgress {
            node: "n1".into(),
            image: image.into(),
            done,
            total: 100,
            at: Instant::now(),
        }
    }

    #[test]
    fn bytes_count_as_they_arrive_and_the_runtimes_figure_tops_them_up() {
        let mut tally = SetTally::default();
        tally.fold(&progress("a", 30));
        tally.fold(&progress("b", 20));
        assert_eq!(tally.pulled_bytes, 50, "counted before the rollout ends");
        // A retry that starts over reports less, then more: only what goes beyond counts.
        tally.fold(&progress("a", 10));
        tally.fold(&progress("a", 40));
        assert_eq!(tally.pulled_bytes, 60);
        // The runtime fetched more than the pulls reported (a manifest, a config): counted at the end.
        tally.rollout_ended(70);
        assert_eq!(tally.pulled_bytes, 70);
        // A figure below what was counted takes nothing back; the next rollout counts from its own 0.
        tally.rollout_started();
        tally.fold(&progress("a", 5));
        tally.rollout_ended(3);
        assert_eq!(tally.pulled_bytes, 75);
    }

    #[test]
    fn a_loss_of_two_images_is_one_loss_and_two_images_put_back() {
        let mut tally = SetTally::default();
        tally.lost([Found::Absent, Found::Unpinned]);
        assert_eq!(tally.restores, 0, "not put back yet");
        tally.restored();
        assert_eq!(tally.restores, 1);
        let put_back: Vec<_> = tally.restored_images.into_iter().collect();
        assert_eq!(put_back, [(Found::Absent, 1), (Found::Unpinned, 1)]);
    }
}

//! How the engine runs: pulls at once, tries and backoff, timeouts, and what it may start at all.

use std::time::Duration;

use crate::model::readiness::LazyImages;

/// How the engine runs. [`Default`] is the OpenShift daemon's schedule, minus its sleep after each pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Pulls at once per node.
    pub parallel: usize,
    /// Tries per image, the first included.
    pub attempts: u32,
    /// Wait before the first retry, doubled for each further one up to `backoff_max`.
    pub backoff_start: Duration,
    pub backoff_max: Duration,
    /// Deadline of one PullImage call.
    pub pull_timeout: Duration,
    /// A pull whose bytes have not moved for this long, short of its total, is cancelled and counts as a
    /// failed attempt (where byte progress is seen: containerd). Zero: never.
    pub pull_progress_timeout: Duration,
    /// How often byte progress is polled on containerd nodes.
    pub progress_interval: Duration,
    /// Start nodes whose plan verdict is no-space.
    pub force: bool,
    /// What a no-space refusal tells its reader to do: force it where the reader can (`apply --force`,
    /// `F`); an agent's reader cannot.
    pub no_space_hint: &'static str,
    /// Pull and write nothing: every node is refused.
    pub readonly: bool,
    /// On a node whose CRI snapshotter pulls lazily: pull whole, every byte on the node, lazily present
    /// images included (NotReady, the default: pre-loading), or lazily through CRI (Accepted,
    /// `--allow-lazy`: sets for a fast start).
    pub lazy_images: LazyImages,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            parallel: 5,
            attempts: 5,
            backoff_start: Duration::from_secs(1),
            backoff_max: Duration::from_secs(10),
            pull_timeout: Duration::from_secs(30 * 60),
            // containerd 1.7's image_pull_progress_timeout.
            pull_progress_timeout: Duration::from_secs(5 * 60),
            progress_interval: Duration::from_millis(500),
            force: false,
            no_space_hint: "force to pull anyway",
            readonly: false,
            lazy_images: LazyImages::NotReady,
        }
    }
}

impl EngineConfig {
    /// The wait after failed attempt `attempt` (1-based): 1, 2, 4, 8, 10, 10... seconds by default.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_start
            .checked_mul(factor)
            .map_or(self.backoff_max, |b| b.min(self.backoff_max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_to_ten() {
        let config = EngineConfig::default();
        let schedule: Vec<u64> = (1..=6).map(|a| config.backoff(a).as_secs()).collect();
        assert_eq!(schedule, [1, 2, 4, 8, 10, 10]);
        assert_eq!(config.backoff(200), Duration::from_secs(10));
    }
}

//! What an agent remembers of the losses of one set on its node: when images or pins it had pinned were
//! found lost, how many it put back, and when it may put them back again. A loss is restored at once; a
//! loss that recurs within [`RECUR_WINDOW`] waits, twice as long each time up to [`MAX_BACKOFF`], so that
//! something on the node fighting the pins (image GC, `crictl rmi`, disk pressure) does not make the agent
//! pull in a hot loop. Pure: times come in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::model::pinboard_api::{LostImages, Restores};
use crate::model::units::clock;

/// Losses within this long of each other count as one that recurs.
pub const RECUR_WINDOW: Duration = Duration::from_secs(3600);
/// The wait before putting back a loss that recurs the first time; it doubles with every recurrence.
const FIRST_BACKOFF: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(15 * 60);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Losses {
    /// When losses were found, within the last [`RECUR_WINDOW`].
    found: VecDeque<Instant>,
    /// The loss being put back.
    pending: Option<LostImages>,
    /// Losses put back.
    restored: u32,
    last: Option<LostImages>,
    /// Not before this: the loss recurs.
    not_before: Option<Instant>,
}

impl Losses {
    /// Notes a loss found at `now`; returns, when it recurs, why and how long it waits.
    pub fn found(&mut self, lost: LostImages, now: Instant) -> Option<String> {
        self.forget_before(now);
        self.found.push_back(now);
        self.pending = Some(lost);
        let recurrences = self.found.len().saturating_sub(1);
        if recurrences == 0 {
            self.not_before = None;
            return None;
        }
        let exponent = u32::try_from(recurrences - 1).unwrap_or(u32::MAX).min(16);
        let wait = FIRST_BACKOFF.saturating_mul(1 << exponent).min(MAX_BACKOFF);
        self.not_before = Some(now + wait);
        Some(format!(
            "lost {} times in the last hour: something on the node removes it (kubelet image GC, \
             `crictl rmi`, disk pressure); the agent puts it back in {}",
            self.found.len(),
            clock(wait)
        ))
    }

    /// Whether a loss found is not put back yet.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether the agent may start putting the loss back at `now`.
    pub fn may_restore(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }

    /// The pending loss was put back: what the report says of the set's restores at `now`.
    pub fn restored(&mut self, now: Instant) -> Option<Restores> {
        if let Some(pending) = self.pending.take() {
            self.restored += 1;
            self.last = Some(pending);
        }
        self.not_before = None;
        self.report(now)
    }

    /// What the report says of the set's restores, once there was one.
    pub fn report(&self, now: Instant) -> Option<Restores> {
        let last = self.last.clone()?;
        Some(Restores {
            count: self.restored,
            recent: self.recent(now),
            last,
        })
    }

    /// Losses found in the last [`RECUR_WINDOW`] before `now`.
    pub fn recent(&self, now: Instant) -> u32 {
        let recent = self
            .found
            .iter()
            .filter(|at| now.duration_since(**at) < RECUR_WINDOW)
            .count();
        u32::try_from(recent).unwrap_or(u32::MAX)
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .found
            .front()
            .is_some_and(|at| now.duration_since(*at) >= RECUR_WINDOW)
        {
            self.found.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(count: usize) -> LostImages {
        LostImages {
            count,
            ..LostImages::default()
        }
    }

    #[test]
    fn a_first_loss_is_put_back_at_once_and_one_that_recurs_waits_twice_as_long_each_time() {
        let start = Instant::now();
        let mut losses = Losses::default();
        assert_eq!(losses.found(lost(1), start), None);
        assert!(losses.may_restore(start));
        let restored = losses.restored(start + Duration::from_secs(5)).unwrap();
        assert_eq!((restored.count, restored.recent), (1, 1));

        let again = start + Duration::from_secs(60);
        let why = losses
            .found(lost(1), again)
            .expect("a recurring loss waits");
        assert!(why.contains("lost 2 times in the last hour"), "{why}");
        assert!(!losses.may_restore(again + Duration::from_secs(29)));
        assert!(losses.may_restore(again + Duration::from_secs(30)));
        losses.restored(again + Duration::from_secs(31));

        let third = again + Duration::from_secs(120);
        losses.found(lost(2), third);
        assert!(!losses.may_restore(third + Duration::from_secs(59)));
        assert!(losses.may_restore(third + Duration::from_secs(60)));
        let report = losses.restored(third + Duration::from_secs(61)).unwrap();
        assert_eq!((report.count, report.recent, report.last.count), (3, 3, 2));
    }

    #[test]
    fn the_wait_is_capped_and_losses_an_hour_apart_do_not_recur() {
        let start = Instant::now();
        let mut losses = Losses::default();
        for i in 0..20 {
            losses.found(lost(1), start + Duration::from_secs(i));
        }
        assert!(!losses.may_restore(start + Duration::from_secs(19) + MAX_BACKOFF / 2));
        assert!(losses.may_restore(start + Duration::from_secs(19) + MAX_BACKOFF));

        let later = start + RECUR_WINDOW + Duration::from_secs(60);
        assert_eq!(
            losses.found(lost(1), later),
            None,
            "the old losses are forgotten"
        );
        assert!(losses.may_restore(later));
        assert_eq!(losses.recent(later), 1);
    }
}

//! Keeping a flow of bytes under a rate: the registry link's budget (`--link-rate`), which every download of
//! the blob cache books its bytes against, and a node's serving cap (`--serve-rate`), which every stream it
//! sends to other nodes books against. Bytes go once their booked instant has come, so over any stretch of
//! time the flow stays at the rate; a booking may lag `now` by [`SLACK`] at most, so the oversleeping of
//! timers is paid back, but a pause never lets a burst through.

use std::time::{Duration, Instant};

/// How far the schedule may fall behind `now` and still catch up: enough for a timer's oversleeping, and
/// little enough that a flow starting after a pause goes at most 2 % over its rate in its first second
/// (with a window in flight, [`window`], at most 8 %).
pub const SLACK: Duration = Duration::from_millis(20);

/// The schedule of one rate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pace {
    rate: u64,
    next: Option<Instant>,
}

impl Pace {
    /// A schedule of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> Pace {
        Pace {
            rate: rate.max(1),
            next: None,
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Books `bytes` at `now`: the instant they may go.
    pub fn book(&mut self, bytes: u64, now: Instant) -> Instant {
        let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        let earliest = now.checked_sub(SLACK).unwrap_or(now);
        let at = self.next.map_or(now, |next| next.max(earliest)) + cost;
        self.next = Some(at);
        at
    }
}

/// How much of a blob one request asks for under a budget of `rate`: a sixteenth of a second's worth
/// (64 KiB to 4 MiB), so that the window a request brings at the link's speed moves a second's bytes by
/// about 6 % at most, and requests stay few (16 a second).
pub fn window(rate: u64) -> u64 {
    (rate / 16).clamp(64 << 10, 4 << 20)
}

/// How long `bytes` take at `rate` bytes per second: what a budget implies for the bytes left.
pub fn time_at(bytes: u64, rate: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / rate.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    #[test]
    fn bookings_follow_the_rate_whoever_books() {
        let start = Instant::now();
        let mut pace = Pace::new(4 * MI);
        // Two flows booking 1 MiB each, at once: the second goes a quarter second after the first.
        assert_eq!(pace.book(MI, start), start + Duration::from_millis(250));
        assert_eq!(pace.book(MI, start), start + Duration::from_millis(500));
        // 40 MiB in 1 MiB bookings take 10 s whatever their order.
        let mut pace = Pace::new(4 * MI);
        let mut at = start;
        for _ in 0..40 {
            at = pace.book(MI, at);
        }
        assert_eq!(at, start + Duration::from_secs(10));
    }

    #[test]
    fn a_pause_lets_no_burst_through_but_oversleeping_is_paid_back() {
        let start = Instant::now();
        let mut pace = Pace::new(MI);
        pace.book(MI, start);
        // Booked again long after: it starts from now (less the slack), not from the old schedule.
        let later = start + Duration::from_secs(60);
        let first = pace.book(MI, later);
        assert_eq!(first, later - SLACK + Duration::from_secs(1));
        // Woken 10 ms after its instant: the next booking starts where the schedule was.
        let woke = first + Duration::from_millis(10);
        assert_eq!(pace.book(MI, woke), first + Duration::from_secs(1));
        assert_eq!(time_at(6 * MI, 2 * MI), Duration::from_secs(3));
    }

    #[test]
    fn a_window_is_a_sixteenth_of_a_second_within_its_bounds() {
        assert_eq!(window(4 * MI), 256 << 10);
        assert_eq!(
            window(100 << 10),
            64 << 10,
            "a slow link still asks for 64 KiB"
        );
        assert_eq!(window(1 << 30), 4 * MI, "a fast one no more than 4 MiB");
    }
}

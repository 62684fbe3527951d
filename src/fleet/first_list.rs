//! Waiting for a cluster's first complete list. A watch that fails once (an expired resource version, an
//! API server restarting) lists again by itself, so a command gives up only on a watch that keeps failing.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// How long a watch may keep failing before a command waiting for its first list gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// Until when to wait for the next update: `deadline`, or sooner when a watch has been failing since
/// `failing_since`; None when that watch has failed for too long and the command should give up.
pub(super) fn wait_until(failing_since: Option<SystemTime>, deadline: Instant) -> Option<Instant> {
    let Some(since) = failing_since else {
        return Some(deadline);
    };
    let failing_for = SystemTime::now().duration_since(since).unwrap_or_default();
    let left = GIVE_UP_AFTER
        .checked_sub(failing_for)
        .filter(|l| !l.is_zero())?;
    Some(deadline.min(Instant::now() + left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_failing_once_is_waited_for_and_one_failing_for_long_is_given_up() {
        let deadline = Instant::now() + Duration::from_secs(30);
        assert_eq!(wait_until(None, deadline), Some(deadline));
        let just_now = wait_until(Some(SystemTime::now()), deadline).expect("waited for");
        assert!(just_now <= Instant::now() + GIVE_UP_AFTER && just_now < deadline);
        let long_ago = SystemTime::now() - Duration::from_secs(6);
        assert_eq!(wait_until(Some(long_ago), deadline), None);
    }
}

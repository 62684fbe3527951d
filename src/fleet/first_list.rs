//! Waiting for a cluster's first complete list, for the headless commands of either kind of cluster. A watch
//! that fails once (an expired resource version, an API server restarting) lists again by itself, so a
//! command gives up only on a watch that keeps failing.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Failure;

/// How long the first complete view of the cluster may take.
const FIRST_SYNC: Duration = Duration::from_secs(30);
/// How long a watch may keep failing before a command waiting for its first list gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// A watch that is failing now.
pub(super) struct FailingWatch {
    /// What it watches: `the cluster`, `the cluster's PinSets`.
    pub what: String,
    pub since: SystemTime,
    pub error: String,
}

/// A cluster connected and watched, whose first complete list a command waits for.
pub(super) trait Watched {
    /// Whether everything watched has been listed once.
    fn listed(&self) -> bool;
    /// A watch failing now, if any.
    fn failing(&self) -> Option<FailingWatch>;
    /// Applies the next update (and any already waiting) to the view; false at `deadline`.
    async fn next_update(&mut self, deadline: Instant) -> bool;
}

/// Waits up to 30 s for the first complete list; exit 3 naming the watch that kept failing, with the
/// ClusterRole `role` the account needs, or saying that the API server was too slow.
pub(super) async fn wait_for_first_list(
    watched: &mut impl Watched,
    role: &str,
) -> Result<(), Failure> {
    let deadline = Instant::now() + FIRST_SYNC;
    while !watched.listed() {
        let failing = watched.failing();
        let Some(wake) = wait_until(failing.as_ref().map(|f| f.since), deadline) else {
            let FailingWatch { what, error, .. } =
                failing.expect("given up only on a failing watch");
            return Err(Failure::unreachable(vec![format!(
                "cannot watch {what}: {error}; check the API server and that your account has {role}"
            )]));
        };
        if !watched.next_update(wake).await && Instant::now() >= deadline {
            return Err(Failure::unreachable(vec![format!(
                "the cluster's objects were not listed within {FIRST_SYNC:?}; the API server is too slow or \
                 unreachable"
            )]));
        }
    }
    Ok(())
}

/// Receives the next update, and any already waiting, into `apply`; false at `deadline` or when the watch
/// has ended.
pub(super) async fn next_update<U>(
    updates: &mut mpsc::Receiver<U>,
    deadline: Instant,
    mut apply: impl FnMut(U),
) -> bool {
    match tokio::time::timeout_at(deadline, updates.recv()).await {
        Ok(Some(update)) => {
            apply(update);
            while let Ok(update) = updates.try_recv() {
                apply(update);
            }
            true
        }
        Ok(None) | Err(_) => false,
    }
}

/// Until when to wait for the next update: `deadline`, or sooner when a watch has been failing since
/// `failing_since`; None when that watch has failed for too long and the command should give up.
fn wait_until(failing_since: Option<SystemTime>, deadline: Instant) -> Option<Instant> {
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

    /// A cluster whose watch has been failing since the given time and sends nothing.
    struct Failing(SystemTime);

    impl Watched for Failing {
        fn listed(&self) -> bool {
            false
        }
        fn failing(&self) -> Option<FailingWatch> {
            Some(FailingWatch {
                what: "the cluster's PinSets".into(),
                since: self.0,
                error: "403 Forbidden".into(),
            })
        }
        async fn next_update(&mut self, deadline: Instant) -> bool {
            tokio::time::sleep_until(deadline).await;
            false
        }
    }

    #[tokio::test]
    async fn a_watch_that_keeps_failing_is_named_with_the_role_to_grant() {
        let since = SystemTime::now() - GIVE_UP_AFTER;
        let failure = wait_for_first_list(&mut Failing(since), "the ClusterRole r")
            .await
            .expect_err("given up");
        assert_eq!(failure.exit, crate::error::Exit::Unreachable);
        assert_eq!(
            failure.lines,
            [
                "cannot watch the cluster's PinSets: 403 Forbidden; check the API server and that your \
              account has the ClusterRole r"
            ]
        );
    }
}

//! One image pulled on one node, the way its [`Route`] says (CRI PullImage, lazily through the remote
//! snapshotter's socket, or whole): attempts with the image's registry credential and exponential backoff
//! between them (never a fixed sleep after a pull), each success confirmed with ImageStatus, and the stall
//! rule: an attempt whose bytes stop moving short of the image's size is cancelled and fails. Only a
//! [`CriErrorKind::Transient`] failure is tried again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::credentials::{find_credential, sent_credential};
use super::route::Route;
use super::shared::Shared;
use crate::backend::cri::{CriClient, CriError, CriErrorKind};
use crate::backend::whole::Register;
use crate::model::rollout::Event;
use crate::model::runtime::RuntimeKind;
use crate::model::units::clock;

/// Why a pull gave up.
pub(super) struct PullFailure {
    pub(super) reason: String,
    pub(super) no_space: bool,
}

/// Where an image is pulled: the node's CRI client, its runtime, the route its pulls take, and whether
/// the node has a record of the image already (one present only lazily, pulled whole).
pub(super) struct PullOn {
    pub(super) client: CriClient,
    pub(super) node: String,
    pub(super) runtime: Option<RuntimeKind>,
    pub(super) route: Arc<Route>,
    pub(super) recorded: bool,
}

/// Pulls one image with retries; every success is confirmed with ImageStatus. The image's registry
/// credential goes with every attempt; a refused one says which credential was sent and what the runtime
/// makes of it. An attempt whose `bytes` stop moving for the progress timeout is cancelled and fails.
pub(super) async fn pull(
    on: PullOn,
    image: String,
    mut bytes: Option<watch::Receiver<(u64, u64)>>,
    shared: Arc<Shared>,
) -> Result<(), PullFailure> {
    let PullOn {
        client,
        node,
        runtime,
        route,
        recorded,
    } = on;
    let credentials = Arc::clone(&shared.credentials);
    let reference = image.clone();
    // A credential helper may run: off the async threads.
    let found = tokio::task::spawn_blocking(move || find_credential(&credentials, &reference))
        .await
        .map_err(|e| e.to_string())
        .and_then(|found| found.map_err(|e| e.to_string()))
        .map_err(|reason| PullFailure {
            reason,
            no_space: false,
        })?;
    let auth = found.as_ref().and_then(|f| f.credential.to_cri_auth());
    let config = &shared.config;
    let mut attempt = 1;
    loop {
        shared.emit(Event::PullStarted {
            node: node.clone(),
            image: image.clone(),
            attempt,
            at: Instant::now(),
        });
        let failed = |e: CriError| (e.kind, e.to_string());
        let pulling = async {
            let Route::Whole(whole) = &*route else {
                let pulled = route.pull_cri(&client, &image, auth.clone(), config.pull_timeout);
                return pulled.await.map(drop).map_err(failed);
            };
            let Some(facts) = shared.images.get(&image) else {
                return Err((
                    CriErrorKind::NotFound,
                    "the registry did not describe it, so it cannot be pulled whole".to_string(),
                ));
            };
            let register = (!recorded).then(|| Register {
                auth: auth.clone(),
                timeout: config.pull_timeout,
            });
            match tokio::time::timeout(config.pull_timeout, whole.pull(&image, facts, register))
                .await
            {
                Ok(pulled) => pulled.map_err(|e| (e.kind(), format!("whole pull: {e}"))),
                Err(_) => Err((
                    CriErrorKind::Transient,
                    format!("whole pull: not done within {}", clock(config.pull_timeout)),
                )),
            }
        };
        let limit = config.pull_progress_timeout;
        let pulled = match bytes.as_mut().filter(|_| !limit.is_zero()) {
            Some(bytes) => tokio::select! {
                pulled = pulling => pulled,
                () = stalled(bytes, limit) => {
                    shared.emit(Event::PullStalled {
                        node: node.clone(),
                        image: image.clone(),
                        at: Instant::now(),
                    });
                    Err((CriErrorKind::Transient, format!(
                        "no bytes arrived for {} while short of the image's size; the pull was cancelled \
                         (--pull-progress-timeout)",
                        clock(limit)
                    )))
                }
            },
            None => pulling.await,
        };
        let (kind, reason) = match pulled {
            Ok(_) => match client.image_status(&image).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => (
                    CriErrorKind::Transient,
                    "the pull reported success but ImageStatus does not show the image".to_string(),
                ),
                Err(e) => (e.kind, format!("confirming the pull: {e}")),
            },
            Err(failed) => failed,
        };
        // Only a transient failure is tried again: a missing image, a refused credential or corrupt
        // content (the registry's copy: asking again downloads the same bytes) stay as they are.
        let transient = kind == CriErrorKind::Transient;
        if !transient || attempt >= config.attempts {
            let reason = if transient && attempt > 1 {
                format!("{reason} (gave up after {attempt} attempts)")
            } else if kind == CriErrorKind::Refused {
                format!("{reason}; {}", sent_credential(runtime, found.as_ref()))
            } else {
                reason
            };
            return Err(PullFailure {
                reason,
                no_space: kind == CriErrorKind::NoSpace,
            });
        }
        let backoff = config.backoff(attempt);
        tracing::info!(
            node,
            image,
            attempt,
            reason,
            ?backoff,
            "pull failed; retrying"
        );
        shared.emit(Event::PullRetry {
            node: node.clone(),
            image: image.clone(),
            attempt,
            reason,
            backoff,
            at: Instant::now(),
        });
        tokio::time::sleep(backoff).await;
        attempt += 1;
    }
}

/// Returns once `bytes` (done, total) has not moved for `limit` while done is short of total: a download
/// that stalled. Bytes all there (the runtime unpacking) never count.
async fn stalled(bytes: &mut watch::Receiver<(u64, u64)>, limit: Duration) {
    bytes.mark_unchanged();
    loop {
        match tokio::time::timeout(limit, bytes.changed()).await {
            Ok(Ok(())) => {}
            // The node no longer polls this pull: nothing to judge by.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => {
                let (done, total) = *bytes.borrow();
                if done < total {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pull_is_stalled_once_its_bytes_stop_short_of_its_total_for_the_limit() {
        let limit = Duration::from_secs(300);
        let (tx, mut rx) = watch::channel((0, 100));
        let started = tokio::time::Instant::now();
        let feeding = tokio::spawn(async move {
            for done in [10, 20, 30] {
                tokio::time::sleep(Duration::from_secs(200)).await;
                tx.send_replace((done, 100));
            }
            tx
        });
        stalled(&mut rx, limit).await;
        // Moved at 200, 400 and 600 s, then nothing for the limit.
        assert_eq!(started.elapsed(), Duration::from_secs(900));
        let tx = feeding.await.unwrap();

        // Every byte there (the runtime unpacking): never stalled.
        tx.send_replace((100, 100));
        let waited = tokio::time::timeout(Duration::from_secs(3600), stalled(&mut rx, limit)).await;
        assert!(waited.is_err(), "a complete download is not stalled");
    }
}

//! Taking one blob in from the parents the tracker named: a task per stripe asks its parent for the
//! stripe's next piece, checks it against the holder's hash and keeps it. A parent that cannot be
//! reached, breaks off or refuses is reported gone; one whose piece fails its hash is reported corrupt
//! (the tracker drops it and names it). Either way the stripe goes on from the piece it stopped at, with
//! the parent the tracker names next: a resume, not a restart. Once every stripe is held the tracker
//! hears that the node holds the blob, and serves it to others from then on.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::state::PeersState;
use super::taking::Taking;
use super::transport::{Ask, Missed, Unanswered};
use crate::backend::blobs::upstream::Upstream;
use crate::model::peers::wire::{Answer, ParentAt};

/// How long a parent may keep answering `not-yet` before it counts as stalled.
const NOT_YET_FOR: Duration = Duration::from_secs(60);
/// How long a stripe tries to get another parent (the tracker away: its holder restarting or moving)
/// before the blob fails on this node.
const REPLACE_FOR: Duration = Duration::from_secs(30);
const RETRY_EVERY: Duration = Duration::from_millis(500);
/// Corrupt pieces a stripe refuses before it gives up on the blob (every parent, the holder too, sending
/// bytes that fail the cut's hashes means the cut or the holder's copy is wrong).
const MAX_REFUSED: u32 = 8;

/// One blob being taken in: what every stripe task shares.
struct Intake {
    state: Arc<PeersState>,
    taking: Arc<Taking>,
    /// The runtime's request to the cache for this blob (`/v2/<name>/blobs/<digest>?ns=…`).
    target: String,
    upstream: Mutex<Upstream>,
}

/// Takes `taking` in from `parents` (one per stripe) on tasks of their own.
pub fn spawn(
    state: Arc<PeersState>,
    taking: Arc<Taking>,
    (upstream, target): (Upstream, String),
    parents: Vec<ParentAt>,
) {
    let intake = Arc::new(Intake {
        state,
        taking,
        target,
        upstream: Mutex::new(upstream),
    });
    tokio::spawn(async move {
        let started = Instant::now();
        tracing::info!(
            digest = intake.taking.digest,
            parents = ?parents.iter().map(ParentAt::name).collect::<Vec<_>>(),
            "taking a blob from the other nodes"
        );
        let stripes = parents.into_iter().enumerate().map(|(stripe, parent)| {
            let intake = Arc::clone(&intake);
            tokio::spawn(async move { intake.stripe(stripe, parent).await })
        });
        for stripe in futures::future::join_all(stripes).await {
            let outcome = stripe.unwrap_or_else(|e| Err(format!("a stripe's task ended: {e}")));
            if let Err(why) = outcome {
                tracing::warn!(
                    digest = intake.taking.digest,
                    "cannot take a blob from the other nodes: {why}"
                );
                intake.taking.fail(why);
                return;
            }
        }
        if intake.taking.complete() {
            tracing::info!(
                digest = intake.taking.digest,
                seconds = started.elapsed().as_secs_f64(),
                "took a blob from the other nodes"
            );
            let upstream = intake.upstream();
            let ask = Ask {
                upstream: &upstream,
                node: &intake.state.node,
            };
            intake
                .state
                .transport
                .done(ask, &intake.taking.digest)
                .await;
        }
    });
}

impl Intake {
    fn upstream(&self) -> Upstream {
        self.upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn stripe(&self, stripe: usize, mut parent: ParentAt) -> Result<(), String> {
        let mut not_yet_since: Option<Instant> = None;
        let mut refused = 0;
        while let Some(piece) = self.taking.wanted(stripe) {
            let why = match self.piece(&parent, piece).await {
                Ok(bytes) => match self.taking.cut.refuses(piece, &bytes) {
                    None => {
                        let counted = match parent {
                            ParentAt::Holder => &self.state.from_holder,
                            ParentAt::Peer { .. } => &self.state.from_peers,
                        };
                        counted.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                        self.taking.put(piece, bytes).await.map_err(|e| {
                            format!("cannot write {}: {e}", self.taking.path().display())
                        })?;
                        not_yet_since = None;
                        continue;
                    }
                    Some(why) => {
                        self.state.refused_pieces.fetch_add(1, Ordering::Relaxed);
                        refused += 1;
                        if refused >= MAX_REFUSED {
                            return Err(format!(
                                "{refused} corrupt pieces refused in stripe {stripe}, the last from {}: {why}",
                                parent.name()
                            ));
                        }
                        tracing::warn!(
                            digest = self.taking.digest,
                            peer = parent.name(),
                            "refused a corrupt piece: {why}"
                        );
                        parent = self.replace(stripe, &parent, Some(&why)).await?;
                        continue;
                    }
                },
                Err(Missed::NotYet) => {
                    let since = *not_yet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < NOT_YET_FOR {
                        continue;
                    }
                    format!(
                        "{} had no new piece for {}s",
                        parent.name(),
                        NOT_YET_FOR.as_secs()
                    )
                }
                Err(Missed::Gone(why)) => why,
            };
            tracing::info!(
                digest = self.taking.digest,
                stripe,
                peer = parent.name(),
                "resuming from another parent: {why}"
            );
            not_yet_since = None;
            parent = self.replace(stripe, &parent, None).await?;
        }
        Ok(())
    }

    /// `piece` from `parent`: the holder's blob endpoint or another node's pieces.
    async fn piece(&self, parent: &ParentAt, piece: u32) -> Result<bytes::Bytes, Missed> {
        let range = self.taking.cut.geometry().range(piece);
        let upstream = self.upstream();
        let blob = (self.target.as_str(), self.taking.digest.as_str());
        self.state
            .transport
            .piece(&upstream, parent, blob, range)
            .await
    }

    /// Another parent for `stripe`, `lost` being gone or (with why) corrupt: from the tracker, which may
    /// have to be found again, or joined again when it no longer knows the node.
    async fn replace(
        &self,
        stripe: usize,
        lost: &ParentAt,
        corrupt: Option<&str>,
    ) -> Result<ParentAt, String> {
        let deadline = Instant::now() + REPLACE_FOR;
        let state = &self.state;
        let digest = self.taking.digest.as_str();
        loop {
            let upstream = self.upstream();
            let ask = || Ask {
                upstream: &upstream,
                node: &state.node,
            };
            let lost_from = (digest, stripe);
            let why = match state
                .transport
                .lost(ask(), lost_from, lost.name(), corrupt)
                .await
            {
                Ok(Answer { mut parents, .. }) if parents.len() == 1 => {
                    return Ok(parents.remove(0));
                }
                Ok(_) => "the tracker named no parent".to_string(),
                Err(Unanswered::NotPlaced) => {
                    match state
                        .transport
                        .join(ask(), &self.target, state.address())
                        .await
                    {
                        Ok(Answer {
                            cut_digest: Some(cut),
                            mut parents,
                            ..
                        }) if cut == self.taking.cut.digest() && parents.len() > stripe => {
                            return Ok(parents.swap_remove(stripe));
                        }
                        Ok(Answer {
                            cut_digest: Some(_),
                            ..
                        }) => {
                            return Err("the tracker cut the blob otherwise than before".into());
                        }
                        Ok(_) => "the tracker's batch is gathering".to_string(),
                        Err(Unanswered::NotPlaced) => "the tracker does not place this node".into(),
                        Err(Unanswered::Failed(why)) => why,
                    }
                }
                Err(Unanswered::Failed(why)) => {
                    if let Some(found) = state.upstream(&upstream).await {
                        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = found;
                    }
                    why
                }
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "no parent for stripe {stripe} within {}s: {why}",
                    REPLACE_FOR.as_secs()
                ));
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }
}

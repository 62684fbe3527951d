//! Filling the cache: one download per digest, resumed after a drop, verified before it counts as
//! complete.
//!
//! One download per digest: the first reader starts it, on a task of its own (it goes on when readers leave,
//! so the next node finds the blob complete); every reader, first or later, streams from the partial file
//! as the bytes land, up to what is written. A dropped, reset or stalled connection (no byte for
//! [`super::CacheOptions::stall_after`]) is resumed from what is on disk; a registry that answers the range
//! with the whole blob (200) is restarted from byte 0, with a warning in the log; 429 and 503 are retried
//! after their `Retry-After` (else with a backoff). Retries are bounded by [`super::CacheOptions::retries`]
//! in a row without a byte of progress, so a connection that breaks every megabyte still completes.
//! Under a budget on the link (`--link-rate`) each request asks for one window of the blob when its turn
//! comes ([`crate::model::pacing::window`]), so the link keeps the budget second by second.
//!
//! Nothing unverified is ever served as complete: a reader holds back the last byte of its range until the
//! whole blob has been verified. A blob whose sha256 does not match is discarded and fetched once more, then
//! failed naming both digests; for a minute after that, asking for it again gets the same error at once,
//! so nodes that retry do not pull the corrupt bytes over the link again and again. Whenever a download starts over from byte 0 (a mismatch, or a 200), readers
//! that had already sent bytes of the earlier attempt end in an error, so the runtime discards what it got
//! and asks again.

use std::io::SeekFrom;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use super::{BlobCache, BlobError, CHUNK, Progress, State};
use crate::model::served::Source;

const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A `Retry-After` longer than this is cut to it: a node's pull should fail with the reason, not hang.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// How long a blob that failed verification twice is refused without asking the registry again.
const REFUSED_FOR: Duration = Duration::from_secs(60);

/// What a download fetches.
struct Job {
    source: Source,
    digest: String,
    hex: String,
    size: u64,
}

/// How one upstream attempt ended, when it did not deliver the whole body.
enum Attempt {
    /// Worth another attempt: a transport error, a stall, a 429/503/5xx (with its `Retry-After`).
    Retry {
        cause: String,
        wait: Option<Duration>,
    },
    /// Not worth another: not found, unauthorized, a disk error.
    Fatal(BlobError),
}

impl BlobCache {
    /// The progress of the download of `hex`, started now if none is under way. Creates the partial file
    /// before returning, so a reader can open it at once.
    pub(super) fn download(
        self: &Arc<Self>,
        state: &mut State,
        source: &Source,
        digest: &str,
        hex: &str,
        size: u64,
    ) -> Result<watch::Receiver<Progress>, BlobError> {
        if let Some(progress) = state.downloads.get(hex) {
            return Ok(progress.clone());
        }
        if let Some((error, when)) = state.refused.get(hex) {
            if when.elapsed() < REFUSED_FOR {
                return Err(error.clone());
            }
            state.refused.remove(hex);
        }
        let path = self.partial_path(hex);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| BlobError::io(&path, e))?;
        let (sender, receiver) = watch::channel(Progress {
            generation: 0,
            written: 0,
            outcome: None,
        });
        state.downloads.insert(hex.to_string(), receiver.clone());
        let job = Job {
            source: source.clone(),
            digest: digest.to_string(),
            hex: hex.to_string(),
            size,
        };
        tokio::spawn(Arc::clone(self).run_download(job, file, sender));
        Ok(receiver)
    }

    async fn run_download(
        self: Arc<Self>,
        job: Job,
        file: std::fs::File,
        progress: watch::Sender<Progress>,
    ) {
        let filled = self.fill(&job, file, &progress).await;
        let partial = self.partial_path(&job.hex);
        let outcome = {
            let mut state = self.lock();
            state.downloads.remove(&job.hex);
            match filled {
                // Renamed under the lock: a reader finds the blob either downloading or complete.
                Ok(()) => match std::fs::rename(&partial, self.complete_path(&job.hex)) {
                    Ok(()) => {
                        state.insert(&job.hex, job.size);
                        Ok(())
                    }
                    Err(e) => Err(BlobError::io(&partial, e)),
                },
                Err(error) => {
                    // Corrupt bytes go; sound ones stay for the next attempt to resume from.
                    if matches!(error, BlobError::DigestMismatch { .. }) {
                        let _ = std::fs::remove_file(&partial);
                        state
                            .refused
                            .insert(job.hex.clone(), (error.clone(), Instant::now()));
                    }
                    Err(error)
                }
            }
        };
        match &outcome {
            Ok(()) => tracing::debug!(digest = job.digest, size = job.size, "blob complete"),
            Err(error) => tracing::debug!(%error, "blob download failed"),
        }
        if outcome.is_ok() {
            // Before telling anyone: whoever waited for the blob sees the cache within its bound.
            self.evict();
        }
        progress.send_modify(|p| p.outcome = Some(outcome));
    }

    /// Fills the partial file until it holds the verified blob.
    async fn fill(
        &self,
        job: &Job,
        file: std::fs::File,
        progress: &watch::Sender<Progress>,
    ) -> Result<(), BlobError> {
        let path = self.partial_path(&job.hex);
        let mut partial = Partial {
            file: tokio::fs::File::from_std(file),
            path: path.clone(),
            hasher: Sha256::new(),
            have: 0,
        };
        partial.hash_existing().await?;
        if partial.have > job.size {
            partial.restart(progress).await?;
        } else if partial.have > 0 {
            tracing::info!(
                digest = job.digest,
                bytes = partial.have,
                "resuming a partial download left by an earlier run"
            );
        }
        let have = partial.have;
        progress.send_modify(|p| p.written = have);
        let mut mismatches = 0;
        let mut failures = 0;
        loop {
            if partial.have == job.size {
                let actual = format!("sha256:{:x}", partial.hasher.clone().finalize());
                if actual == job.digest {
                    partial
                        .file
                        .sync_all()
                        .await
                        .map_err(|e| BlobError::io(&path, e))?;
                    return Ok(());
                }
                mismatches += 1;
                if mismatches > 1 {
                    return Err(BlobError::DigestMismatch {
                        digest: job.digest.clone(),
                        repository: job.source.to_string(),
                        actual,
                    });
                }
                tracing::warn!(
                    digest = job.digest,
                    source = %job.source,
                    actual,
                    "blob failed verification: discarding it and fetching it once more"
                );
                partial.restart(progress).await?;
                continue;
            }
            let before = partial.have;
            let (cause, wait) = match self.attempt(job, &mut partial, progress).await {
                // The whole blob, or the window a budget asked for.
                Ok(end) if partial.have >= end => continue,
                Ok(_) => (
                    format!(
                        "the body ended after {} of {} bytes",
                        partial.have, job.size
                    ),
                    None,
                ),
                Err(Attempt::Fatal(error)) => return Err(error),
                Err(Attempt::Retry { cause, wait }) => (cause, wait),
            };
            if partial.have > before {
                failures = 0;
                tracing::info!(
                    digest = job.digest,
                    from = partial.have,
                    cause,
                    "resuming the blob"
                );
                continue;
            }
            failures += 1;
            if failures > self.options.retries {
                return Err(BlobError::GaveUp {
                    digest: job.digest.clone(),
                    repository: job.source.to_string(),
                    attempts: failures,
                    last: cause,
                });
            }
            let wait = wait.map_or_else(|| backoff(failures), |w| w.min(RETRY_AFTER_MAX));
            tracing::info!(
                digest = job.digest,
                cause,
                wait_ms = wait.as_millis() as u64,
                "blob request failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One upstream request from what the partial file holds, its body appended as it arrives: up to the
    /// blob's end, or under a budget up to the end of the window booked for it, which it returns.
    async fn attempt(
        &self,
        job: &Job,
        partial: &mut Partial,
        progress: &watch::Sender<Progress>,
    ) -> Result<u64, Attempt> {
        let stall = self.options.stall_after;
        let stalled = || Attempt::Retry {
            cause: format!("no byte for {}s", stall.as_secs_f32()),
            wait: None,
        };
        let window = self.book_window(job.size - partial.have).await;
        let end = window.map(|w| partial.have + w);
        let registry = self.registry();
        let request = registry.blob(&job.source, &job.digest, partial.have, end);
        let body = match tokio::time::timeout(stall, request).await {
            Err(_) => return Err(stalled()),
            Ok(Err(failure)) if failure.error.is_transient() => {
                return Err(Attempt::Retry {
                    cause: failure.error.to_string(),
                    wait: failure.retry_after,
                });
            }
            Ok(Err(failure)) => return Err(Attempt::Fatal(failure.error.into())),
            Ok(Ok(body)) => body,
        };
        if body.start != partial.have {
            tracing::warn!(
                digest = job.digest,
                source = %job.source,
                offset = partial.have,
                "the registry answered a range request with the whole blob (200, not 206): restarting it from byte 0"
            );
            partial.restart(progress).await.map_err(Attempt::Fatal)?;
        }
        // A registry that ignored the range (200) sends the whole blob.
        let end = end.filter(|_| body.ranged).unwrap_or(job.size);
        let mut prepaid = window.unwrap_or(0);
        let mut stream = body.stream;
        loop {
            let chunk = match tokio::time::timeout(stall, stream.next()).await {
                Err(_) => return Err(stalled()),
                Ok(None) => return Ok(end),
                Ok(Some(Err(broken))) => {
                    return Err(Attempt::Retry {
                        cause: broken.to_string(),
                        wait: None,
                    });
                }
                Ok(Some(Ok(chunk))) => chunk,
            };
            self.took_from_link(chunk.len() as u64, &mut prepaid).await;
            // More than the descriptor's size cannot be the blob: keep what fits, and let verification fail.
            let room = usize::try_from(job.size - partial.have).unwrap_or(usize::MAX);
            let fits = &chunk[..chunk.len().min(room)];
            partial.append(fits).await.map_err(Attempt::Fatal)?;
            let written = partial.have;
            progress.send_modify(|p| p.written = written);
            if fits.len() < chunk.len() {
                return Ok(end);
            }
        }
    }
}

/// A download's partial file, its hash so far and its length.
struct Partial {
    file: tokio::fs::File,
    path: PathBuf,
    hasher: Sha256,
    have: u64,
}

impl Partial {
    /// Hashes what an earlier run left, leaving the file positioned at its end.
    async fn hash_existing(&mut self) -> Result<(), BlobError> {
        let mut buffer = vec![0u8; CHUNK];
        loop {
            let n = self
                .file
                .read(&mut buffer)
                .await
                .map_err(|e| BlobError::io(&self.path, e))?;
            if n == 0 {
                return Ok(());
            }
            self.hasher.update(&buffer[..n]);
            self.have += n as u64;
        }
    }

    async fn append(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        let io = |e| BlobError::io(&self.path, e);
        self.file.write_all(bytes).await.map_err(io)?;
        // Readers read the file itself: the bytes must be there before they are told.
        self.file.flush().await.map_err(io)?;
        self.hasher.update(bytes);
        self.have += bytes.len() as u64;
        Ok(())
    }

    /// Empties the file and starts a new generation: bytes readers got so far are void.
    async fn restart(&mut self, progress: &watch::Sender<Progress>) -> Result<(), BlobError> {
        let io = |e| BlobError::io(&self.path, e);
        self.file.set_len(0).await.map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).await.map_err(io)?;
        self.hasher = Sha256::new();
        self.have = 0;
        progress.send_modify(|p| {
            p.written = 0;
            p.generation += 1;
        });
        Ok(())
    }
}

/// 0.5 s doubling to 10 s, by the number of failures in a row (1, 2, ...).
fn backoff(failures: u32) -> Duration {
    BACKOFF_START
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        assert_eq!(backoff(1000), BACKOFF_MAX);
    }
}

//! The blob cache: configs, layers and manifests kept on disk by digest, filled from their source registries
//! on demand, so that a blob crosses the registry link once however many nodes pull it.
//!
//! On disk (`--cache-dir`, default [`default_dir`]):
//! - `sha256/<hex>`: complete blobs and manifests, each renamed into place only after its sha256 matched;
//!   `sha256/<hex>.media-type` beside each manifest;
//! - `partial/<hex>`: downloads under way. They survive pinboard: the next download of the blob hashes what
//!   is there and asks the registry for the rest with `Range: bytes=N-`. One untouched for a week is
//!   removed when a cache opens;
//! - `lock`: held while a cache is open, so two pinboard processes never write the same partial file.
//!
//! One download per digest: the first reader starts it, on a task of its own (it goes on when readers leave,
//! so the next node finds the blob complete); every reader, first or later, streams from the partial file
//! as the bytes land, up to what is written. A dropped, reset or stalled connection (no byte for
//! [`CacheOptions::stall_after`]) is resumed from what is on disk; a registry that answers the range with
//! the whole blob (200) is restarted from byte 0, with a warning in the log; 429 and 503 are retried after
//! their `Retry-After` (else with a backoff). Retries are bounded by [`CacheOptions::retries`] in a row
//! without a byte of progress, so a connection that breaks every megabyte still completes.
//!
//! Nothing unverified is ever served as complete: a reader holds back the last byte of its range until the
//! whole blob has been verified. A blob whose sha256 does not match is discarded and fetched once more, then
//! failed naming both digests; for a minute after that, asking for it again gets the same error at once,
//! so nodes that retry do not pull the corrupt bytes over the link again and again. Whenever a download starts over from byte 0 (a mismatch, or a 200), readers
//! that had already sent bytes of the earlier attempt end in an error, so the runtime discards what it got
//! and asks again.
//!
//! `--cache-max` bounds the bytes of complete blobs: after each new blob, the least recently used ones that
//! no reader has open are removed. Last use is kept in each file's modification time, so the order survives
//! restarts. Downloads under way come on top of the bound.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::BoxStream;
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::backend::registry::{ManifestBytes, Registry, RegistryError};
use crate::model::mirror::Source;

/// `--cache-max` when not given: room for a couple of OpenShift releases.
pub const DEFAULT_MAX_BYTES: u64 = 50 << 30;
/// How long an upstream connection may go without a byte before it is dropped and resumed.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(30);
/// Retries in a row without a byte of progress before a download fails.
pub const DEFAULT_RETRIES: u32 = 8;

const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A `Retry-After` longer than this is cut to it: a node's pull should fail with the reason, not hang.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// How long a blob that failed verification twice is refused without asking the registry again.
const REFUSED_FOR: Duration = Duration::from_secs(60);
/// A partial download untouched for this long is removed when a cache opens.
const ABANDONED_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most a reader sends at once.
const CHUNK: usize = 256 * 1024;
const COMPLETE_DIR: &str = "sha256";
const PARTIAL_DIR: &str = "partial";
const MEDIA_TYPE_SUFFIX: &str = ".media-type";
const TEMP_SUFFIX: &str = ".tmp";

/// How the cache behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheOptions {
    /// `--cache-max`: bytes of complete blobs kept at most.
    pub max_bytes: u64,
    /// No byte for this long: the upstream connection is dropped and resumed.
    pub stall_after: Duration,
    /// Retries in a row without a byte of progress before a download fails (1 + `retries` attempts).
    pub retries: u32,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            max_bytes: DEFAULT_MAX_BYTES,
            stall_after: DEFAULT_STALL_AFTER,
            retries: DEFAULT_RETRIES,
        }
    }
}

/// `$XDG_CACHE_HOME/pinboard/blobs`, else `$HOME/.cache/pinboard/blobs`; `None` without either variable.
pub fn default_dir() -> Option<PathBuf> {
    dir_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

fn dir_from(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let base = match (xdg_cache_home.filter(|v| !v.is_empty()), home) {
        (Some(xdg), _) => PathBuf::from(xdg),
        (None, Some(home)) if !home.is_empty() => Path::new(&home).join(".cache"),
        _ => return None,
    };
    Some(base.join("pinboard").join("blobs"))
}

/// Whether the cache in `dir` holds `digest` complete, read from the disk without taking the cache's lock
/// (another pinboard may hold it): what plans count as cached. Files are renamed into `sha256/` only once
/// verified, so one there is complete.
pub fn holds(dir: &Path, digest: &str) -> bool {
    sha256_hex(digest).is_ok_and(|hex| dir.join(COMPLETE_DIR).join(hex).is_file())
}

/// Why a blob or manifest could not be had. One line each, naming the digest and the cause.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    #[error("{digest:?} is not a sha256 digest (sha256: and 64 lowercase hex digits)")]
    InvalidDigest { digest: String },
    #[error(
        "blob {digest} of {repository}: digest mismatch: the registry sent content with digest {actual}, twice; \
         refusing it (its copy is corrupt, or something on the way alters it)"
    )]
    DigestMismatch {
        digest: String,
        repository: String,
        actual: String,
    },
    #[error(
        "blob {digest}: the download these bytes came from started over (a digest mismatch, or a registry \
         that ignored the range); fetch it again"
    )]
    Discarded { digest: String },
    #[error(
        "blob {digest} of {repository}: gave up after {attempts} attempts in a row without progress; last: {last}"
    )]
    GaveUp {
        digest: String,
        repository: String,
        attempts: u32,
        last: String,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("blob cache {path}: {cause}")]
    Io { path: String, cause: String },
    #[error("blob {digest}: the download was stopped (pinboard is shutting down)")]
    Stopped { digest: String },
}

impl BlobError {
    fn io(path: &Path, error: impl fmt::Display) -> BlobError {
        BlobError::Io {
            path: path.display().to_string(),
            cause: error.to_string(),
        }
    }
}

/// The blob cache. Share it as `Arc<BlobCache>`; every method takes `&self` or `&Arc<Self>`.
pub struct BlobCache {
    dir: PathBuf,
    options: CacheOptions,
    registry: Arc<Registry>,
    state: Mutex<State>,
    link_bytes: AtomicU64,
    /// Held for the cache's lifetime.
    _lock: Flock<std::fs::File>,
}

impl fmt::Debug for BlobCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobCache")
            .field("dir", &self.dir)
            .field("options", &self.options)
            .field("link_bytes", &self.link_bytes())
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// Complete blobs and manifests by hex digest.
    complete: HashMap<String, Stored>,
    stored_bytes: u64,
    /// Ticks of use, for least-recently-used order.
    clock: u64,
    /// Open readers per hex digest: never evicted.
    in_use: HashMap<String, usize>,
    /// Downloads under way, by hex digest.
    downloads: HashMap<String, watch::Receiver<Progress>>,
    /// Blobs that failed verification twice, and when.
    refused: HashMap<String, (BlobError, Instant)>,
}

struct Stored {
    size: u64,
    last_used: u64,
}

impl State {
    fn touch(&mut self, hex: &str) {
        self.clock += 1;
        if let Some(stored) = self.complete.get_mut(hex) {
            stored.last_used = self.clock;
        }
    }

    fn insert(&mut self, hex: &str, size: u64) {
        self.clock += 1;
        let stored = Stored {
            size,
            last_used: self.clock,
        };
        if let Some(old) = self.complete.insert(hex.to_string(), stored) {
            self.stored_bytes -= old.size;
        }
        self.stored_bytes += size;
    }

    fn remove(&mut self, hex: &str) {
        if let Some(old) = self.complete.remove(hex) {
            self.stored_bytes -= old.size;
        }
    }
}

/// What readers of a download see.
#[derive(Clone, Debug)]
struct Progress {
    /// Bumped whenever the download starts over from byte 0: bytes of an earlier generation are void.
    generation: u32,
    /// Bytes in the partial file so far.
    written: u64,
    /// Set once: verified and complete, or failed.
    outcome: Option<Result<(), BlobError>>,
}

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
    /// Opens (creating it if needed) the cache in `dir`, takes its lock, indexes what is complete and trims
    /// it to `options.max_bytes`. Fails with the path and the cause when the directory cannot be used or
    /// another pinboard holds it.
    pub fn open(
        dir: &Path,
        options: CacheOptions,
        registry: Arc<Registry>,
    ) -> Result<Arc<BlobCache>, BlobError> {
        let unusable = |path: &Path, e: std::io::Error| {
            BlobError::io(path, format!("{e}; pass another --cache-dir"))
        };
        for sub in [COMPLETE_DIR, PARTIAL_DIR] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| unusable(&path, e))?;
        }
        let lock_path = dir.join("lock");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| unusable(&lock_path, e))?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            BlobError::io(
                dir,
                "another pinboard process is using this cache; stop it or pass another --cache-dir",
            )
        })?;
        remove_abandoned(&dir.join(PARTIAL_DIR), SystemTime::now());
        let state = index(&dir.join(COMPLETE_DIR))?;
        let cache = Arc::new(BlobCache {
            dir: dir.to_path_buf(),
            options,
            registry,
            state: Mutex::new(state),
            link_bytes: AtomicU64::new(0),
            _lock: lock,
        });
        cache.evict();
        Ok(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the blob or manifest is complete (verified) in the cache.
    pub fn has(&self, digest: &str) -> bool {
        sha256_hex(digest).is_ok_and(|hex| self.lock().complete.contains_key(hex))
    }

    /// Bytes taken from the source registries so far: blob bodies as they arrived (an attempt broken off
    /// counts what came) and the manifests the cache stored.
    pub fn link_bytes(&self) -> u64 {
        self.link_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of complete blobs and manifests on disk.
    pub fn stored_bytes(&self) -> u64 {
        self.lock().stored_bytes
    }

    /// A reader of blob `digest` (`size` bytes, as its descriptor says) of `source`: at once from disk when
    /// complete, else from the download under way, which this call starts if there is none. Must be called
    /// inside a tokio runtime (the download runs on a task of its own).
    pub fn blob(
        self: &Arc<Self>,
        source: &Source,
        digest: &str,
        size: u64,
    ) -> Result<Blob, BlobError> {
        let hex = sha256_hex(digest)?.to_string();
        let mut state = self.lock();
        let (file, progress) = match self.open_complete(&mut state, &hex)? {
            Some(file) => (file, None),
            None => {
                let progress = self.download(&mut state, source, digest, &hex, size)?;
                let path = self.partial_path(&hex);
                let file = std::fs::File::open(&path).map_err(|e| BlobError::io(&path, e))?;
                (file, Some(progress))
            }
        };
        *state.in_use.entry(hex.clone()).or_default() += 1;
        drop(state);
        Ok(Blob {
            digest: digest.to_string(),
            size,
            file: tokio::fs::File::from_std(file),
            progress,
            _in_use: InUse {
                cache: Arc::clone(self),
                hex,
            },
        })
    }

    /// Makes blob `digest` of `source` complete in the cache, downloading it if needed, and returns once it
    /// is verified (or failed).
    pub async fn fetch(
        self: &Arc<Self>,
        source: &Source,
        digest: &str,
        size: u64,
    ) -> Result<(), BlobError> {
        let hex = sha256_hex(digest)?.to_string();
        let mut progress = {
            let mut state = self.lock();
            if state.complete.contains_key(&hex) {
                state.touch(&hex);
                return Ok(());
            }
            self.download(&mut state, source, digest, &hex, size)?
        };
        let seen = progress
            .wait_for(|p| p.outcome.is_some())
            .await
            .map_err(|_| BlobError::Stopped {
                digest: digest.to_string(),
            })?;
        seen.outcome.clone().expect("waited for it")
    }

    /// Manifest `digest` of `source` with its media type: from disk, else from the registry (which may hold
    /// it from a survey), stored for next time.
    pub async fn manifest(
        &self,
        source: &Source,
        digest: &str,
    ) -> Result<ManifestBytes, BlobError> {
        let hex = sha256_hex(digest)?;
        if let Some(stored) = self.stored_manifest(hex)? {
            return Ok(stored);
        }
        let manifest = self.registry.manifest_bytes(source, digest).await?;
        let path = self.complete_path(hex);
        write_atomically(&media_type_path(&path), manifest.media_type.as_bytes())?;
        write_atomically(&path, &manifest.body)?;
        let mut state = self.lock();
        if !state.complete.contains_key(hex) {
            state.insert(hex, manifest.body.len() as u64);
            self.link_bytes
                .fetch_add(manifest.body.len() as u64, Ordering::Relaxed);
        }
        drop(state);
        self.evict();
        Ok(manifest)
    }

    fn stored_manifest(&self, hex: &str) -> Result<Option<ManifestBytes>, BlobError> {
        let path = self.complete_path(hex);
        let mut state = self.lock();
        if !state.complete.contains_key(hex) {
            return Ok(None);
        }
        let (body, media_type) = match (
            std::fs::read(&path),
            std::fs::read_to_string(media_type_path(&path)),
        ) {
            (Ok(body), Ok(media_type)) => (body, media_type),
            // Gone from under us, or a blob stored under a manifest's digest: fetch it again.
            _ => return Ok(None),
        };
        state.touch(hex);
        drop(state);
        mark_used(&path);
        Ok(Some(ManifestBytes {
            body: Bytes::from(body),
            media_type: media_type.trim().to_string(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("blob cache state")
    }

    fn complete_path(&self, hex: &str) -> PathBuf {
        self.dir.join(COMPLETE_DIR).join(hex)
    }

    fn partial_path(&self, hex: &str) -> PathBuf {
        self.dir.join(PARTIAL_DIR).join(hex)
    }

    /// The complete file of `hex`, opened and marked as used; `None` when it is not complete (or vanished).
    fn open_complete(
        &self,
        state: &mut State,
        hex: &str,
    ) -> Result<Option<std::fs::File>, BlobError> {
        if !state.complete.contains_key(hex) {
            return Ok(None);
        }
        let path = self.complete_path(hex);
        match std::fs::File::open(&path) {
            Ok(file) => {
                state.touch(hex);
                mark_used(&path);
                Ok(Some(file))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                state.remove(hex);
                Ok(None)
            }
            Err(e) => Err(BlobError::io(&path, e)),
        }
    }

    /// The progress of the download of `hex`, started now if none is under way. Creates the partial file
    /// before returning, so a reader can open it at once.
    fn download(
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
                Ok(()) if partial.have == job.size => continue,
                Ok(()) => (
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

    /// One upstream request from what the partial file holds, its body appended as it arrives.
    async fn attempt(
        &self,
        job: &Job,
        partial: &mut Partial,
        progress: &watch::Sender<Progress>,
    ) -> Result<(), Attempt> {
        let stall = self.options.stall_after;
        let stalled = || Attempt::Retry {
            cause: format!("no byte for {}s", stall.as_secs_f32()),
            wait: None,
        };
        let request = self.registry.blob(&job.source, &job.digest, partial.have);
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
        let mut stream = body.stream;
        loop {
            let chunk = match tokio::time::timeout(stall, stream.next()).await {
                Err(_) => return Err(stalled()),
                Ok(None) => return Ok(()),
                Ok(Some(Err(cause))) => return Err(Attempt::Retry { cause, wait: None }),
                Ok(Some(Ok(chunk))) => chunk,
            };
            self.link_bytes
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            // More than the descriptor's size cannot be the blob: keep what fits, and let verification fail.
            let room = usize::try_from(job.size - partial.have).unwrap_or(usize::MAX);
            let fits = &chunk[..chunk.len().min(room)];
            partial.append(fits).await.map_err(Attempt::Fatal)?;
            let written = partial.have;
            progress.send_modify(|p| p.written = written);
            if fits.len() < chunk.len() {
                return Ok(());
            }
        }
    }

    /// Removes least recently used complete blobs that no reader has open until the cache fits its bound.
    fn evict(&self) {
        let mut state = self.lock();
        while state.stored_bytes > self.options.max_bytes {
            let victim = state
                .complete
                .iter()
                .filter(|(hex, _)| !state.in_use.contains_key(*hex))
                .min_by_key(|(_, stored)| stored.last_used)
                .map(|(hex, _)| hex.clone());
            let Some(hex) = victim else { break };
            let path = self.complete_path(&hex);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot evict a cached blob");
                break;
            }
            let _ = std::fs::remove_file(media_type_path(&path));
            tracing::debug!(blob = hex, "evicted");
            state.remove(&hex);
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

/// An open reader of one blob. While it exists, the blob is not evicted.
pub struct Blob {
    digest: String,
    size: u64,
    file: tokio::fs::File,
    /// `None` when the blob was complete on disk when opened.
    progress: Option<watch::Receiver<Progress>>,
    /// Held for its `Drop`.
    _in_use: InUse,
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("complete_when_opened", &self.progress.is_none())
            .finish()
    }
}

impl Blob {
    /// Bytes `range` of the blob (clamped to its size), as they land. The last byte comes only once the
    /// whole blob is verified; a failed download, or one that started over after this reader sent bytes,
    /// ends the stream with the error.
    pub fn stream(self, range: Range<u64>) -> BoxStream<'static, Result<Bytes, BlobError>> {
        let end = range.end.min(self.size);
        let reader = Reader {
            pos: range.start.min(end),
            end,
            positioned: false,
            generation: None,
            done: false,
            blob: self,
        };
        futures::stream::unfold(reader, |mut reader| async move {
            let item = reader.next().await?;
            Some((item, reader))
        })
        .boxed()
    }
}

struct Reader {
    blob: Blob,
    pos: u64,
    end: u64,
    positioned: bool,
    /// The download generation of the first byte sent.
    generation: Option<u32>,
    done: bool,
}

impl Reader {
    async fn next(&mut self) -> Option<Result<Bytes, BlobError>> {
        if self.done || self.pos >= self.end {
            return None;
        }
        let result = self.read().await;
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }

    async fn read(&mut self) -> Result<Bytes, BlobError> {
        let digest = self.blob.digest.clone();
        let io = |e: std::io::Error| BlobError::Io {
            path: digest.clone(),
            cause: e.to_string(),
        };
        if !self.positioned {
            self.blob
                .file
                .seek(SeekFrom::Start(self.pos))
                .await
                .map_err(io)?;
            self.positioned = true;
        }
        loop {
            let mut generation = 0;
            let limit = match self.blob.progress.as_mut() {
                None => self.end,
                Some(progress) => {
                    let now = progress.borrow_and_update().clone();
                    generation = now.generation;
                    if let Some(Err(error)) = now.outcome {
                        return Err(error);
                    }
                    if self.generation.is_some_and(|g| g != now.generation) {
                        return Err(BlobError::Discarded {
                            digest: self.blob.digest.clone(),
                        });
                    }
                    if now.outcome.is_some() {
                        self.end
                    } else {
                        // The last byte waits for verification.
                        now.written.min(self.end - 1)
                    }
                }
            };
            if limit > self.pos {
                let want = usize::try_from(limit - self.pos).map_or(CHUNK, |n| n.min(CHUNK));
                let mut buffer = BytesMut::zeroed(want);
                let n = self.blob.file.read(&mut buffer).await.map_err(io)?;
                if n > 0 {
                    buffer.truncate(n);
                    self.pos += n as u64;
                    self.generation.get_or_insert(generation);
                    return Ok(buffer.freeze());
                }
                if self.blob.progress.is_none() {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the cached file ends before byte {}", self.end),
                    )));
                }
            }
            // Wait for more bytes (or for the bytes of a download that started over).
            let progress = self
                .blob
                .progress
                .as_mut()
                .expect("complete blobs never wait");
            if progress.changed().await.is_err() {
                return Err(BlobError::Stopped {
                    digest: self.blob.digest.clone(),
                });
            }
        }
    }
}

/// Counts an open reader of a blob; evicts what waited for it when it goes.
struct InUse {
    cache: Arc<BlobCache>,
    hex: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let over = {
            let mut state = self.cache.lock();
            if let Some(count) = state.in_use.get_mut(&self.hex) {
                *count -= 1;
                if *count == 0 {
                    state.in_use.remove(&self.hex);
                }
            }
            state.stored_bytes > self.cache.options.max_bytes
        };
        if over {
            self.cache.evict();
        }
    }
}

/// The hex part of `sha256:<64 lowercase hex>`: the cache's file name for the digest.
fn sha256_hex(digest: &str) -> Result<&str, BlobError> {
    digest
        .strip_prefix("sha256:")
        .filter(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .ok_or_else(|| BlobError::InvalidDigest {
            digest: digest.to_string(),
        })
}

/// The complete files in `dir`, least recently used first; leftovers of interrupted writes are removed.
fn index(dir: &Path) -> Result<State, BlobError> {
    let entries = std::fs::read_dir(dir).map_err(|e| BlobError::io(dir, e))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(TEMP_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        if sha256_hex(&format!("sha256:{name}")).is_err() {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        found.push((used, name, meta.len()));
    }
    found.sort();
    let mut state = State::default();
    for (_, hex, size) in found {
        state.insert(&hex, size);
    }
    Ok(state)
}

/// Removes partial downloads nobody has resumed for [`ABANDONED_AFTER`] (their blob left every set).
fn remove_abandoned(dir: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let written = entry.metadata().and_then(|m| m.modified());
        if written.is_ok_and(|w| now.duration_since(w).unwrap_or_default() > ABANDONED_AFTER) {
            tracing::debug!(path = %entry.path().display(), "removing an abandoned partial download");
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn media_type_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(MEDIA_TYPE_SUFFIX);
    PathBuf::from(name)
}

/// Records a use in the file's modification time, so least-recently-used order survives restarts.
fn mark_used(path: &Path) {
    let touched = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|file| file.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(path = %path.display(), error = %e, "cannot record the use of a cached file");
    }
}

/// Writes a small file whole: a temporary file of its own (two writers of the same manifest may race),
/// fsync, then rename into place.
fn write_atomically(path: &Path, content: &[u8]) -> Result<(), BlobError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(
        ".{}{TEMP_SUFFIX}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = PathBuf::from(temp);
    let written = (|| {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        BlobError::io(path, e)
    })
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
    fn only_sha256_digests_name_files() {
        let hex = "a".repeat(64);
        assert_eq!(sha256_hex(&format!("sha256:{hex}")).unwrap(), hex);
        for bad in [
            format!("sha256:{}", "A".repeat(64)),
            format!("sha512:{hex}"),
            "sha256:../../etc/passwd".to_string(),
            format!("sha256:{}", &hex[1..]),
            hex.clone(),
        ] {
            assert!(
                matches!(sha256_hex(&bad), Err(BlobError::InvalidDigest { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        assert_eq!(backoff(1000), BACKOFF_MAX);
    }

    #[test]
    fn the_default_dir_follows_xdg() {
        let os = |text: &str| Some(OsString::from(text));
        assert_eq!(
            dir_from(os("/var/cache/me"), os("/home/me")),
            Some(PathBuf::from("/var/cache/me/pinboard/blobs"))
        );
        assert_eq!(
            dir_from(os(""), os("/home/me")),
            Some(PathBuf::from("/home/me/.cache/pinboard/blobs"))
        );
        assert_eq!(dir_from(None, None), None);
        assert_eq!(dir_from(None, os("")), None);
    }

    #[test]
    fn partial_downloads_untouched_for_a_week_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (old, recent) = (dir.path().join("old"), dir.path().join("recent"));
        std::fs::write(&old, b"half").unwrap();
        std::fs::write(&recent, b"half").unwrap();
        let now = SystemTime::now();
        let file = std::fs::File::options().write(true).open(&old).unwrap();
        file.set_modified(now - ABANDONED_AFTER - Duration::from_secs(60))
            .unwrap();
        remove_abandoned(dir.path(), now);
        assert!(!old.exists() && recent.exists());
    }

    #[test]
    fn the_index_orders_by_last_use_and_drops_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let old = "1".repeat(64);
        let new = "2".repeat(64);
        std::fs::write(dir.path().join(&old), b"old!").unwrap();
        std::fs::write(dir.path().join(&new), b"new").unwrap();
        std::fs::write(dir.path().join(format!("{new}{MEDIA_TYPE_SUFFIX}")), b"x").unwrap();
        std::fs::write(dir.path().join(format!("{old}{TEMP_SUFFIX}")), b"half").unwrap();
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join(&old))
            .unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
            .unwrap();
        let state = index(dir.path()).unwrap();
        assert_eq!(state.stored_bytes, 7, "the media type file is not a blob");
        assert!(state.complete[&old].last_used < state.complete[&new].last_used);
        assert!(!dir.path().join(format!("{old}{TEMP_SUFFIX}")).exists());
    }
}

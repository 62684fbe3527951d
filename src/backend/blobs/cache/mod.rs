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
//! One download per digest, shared by every reader and resumed after a drop: `download`; readers stream
//! what lands, and nothing unverified is served as complete: `reader`.
//!
//! `--cache-max` bounds the bytes of complete blobs: after each new blob, the least recently used ones that
//! no reader has open are removed. Last use is kept in each file's modification time, so the order survives
//! restarts. Downloads under way come on top of the bound.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::watch;

use crate::backend::registry::{ManifestBytes, Registry, RegistryError};
use crate::model::pacing::{Pace, time_at, window};
use crate::model::served::Source;

mod download;
mod reader;

pub use reader::Blob;
use reader::InUse;

/// `--cache-max` when not given: room for a couple of OpenShift releases.
pub const DEFAULT_MAX_BYTES: u64 = 50 << 30;
/// How long an upstream connection may go without a byte before it is dropped and resumed.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(30);
/// Retries in a row without a byte of progress before a download fails.
pub const DEFAULT_RETRIES: u32 = 8;

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
    /// `--link-rate`: bytes per second all downloads together take from the registries at most.
    pub link_rate: Option<u64>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            max_bytes: DEFAULT_MAX_BYTES,
            stall_after: DEFAULT_STALL_AFTER,
            retries: DEFAULT_RETRIES,
            link_rate: None,
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
    /// Replaced when the credentials change ([`BlobCache::use_registry`]).
    registry: RwLock<Arc<Registry>>,
    state: Mutex<State>,
    link_bytes: AtomicU64,
    /// The budget of the registry link every download books its bytes against (`--link-rate`).
    link_pace: Option<Mutex<Pace>>,
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
            registry: RwLock::new(registry),
            state: Mutex::new(state),
            link_bytes: AtomicU64::new(0),
            link_pace: options.link_rate.map(|rate| Mutex::new(Pace::new(rate))),
            options,
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

    /// Fetches with `registry` from now on (the in-cluster cache, when its sets' credentials change);
    /// downloads under way keep the client they started with until their next attempt.
    pub fn use_registry(&self, registry: Arc<Registry>) {
        *self.registry.write().expect("the registry client") = registry;
    }

    fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry.read().expect("the registry client"))
    }

    /// Bytes taken from the source registries so far: blob bodies as they arrived (an attempt broken off
    /// counts what came) and the manifests the cache stored.
    pub fn link_bytes(&self) -> u64 {
        self.link_bytes.load(Ordering::Relaxed)
    }

    /// `--link-rate`: the budget of the registry link, bytes per second.
    pub fn link_rate(&self) -> Option<u64> {
        self.options.link_rate
    }

    /// Under a budget, books the window of the next request for a blob with `left` bytes to go and waits
    /// for its turn: the window's length, which the request asks for as a range. A request then brings at
    /// most one window at the link's speed, whatever the sockets' buffers would hold, so the link keeps to
    /// the budget in every second, not only on average.
    async fn book_window(&self, left: u64) -> Option<u64> {
        let pace = self.link_pace.as_ref()?;
        let (turn, window) = {
            let mut pace = pace.lock().unwrap_or_else(|e| e.into_inner());
            let window = window(pace.rate()).min(left);
            let done = pace.book(window, Instant::now());
            (done - time_at(window, pace.rate()), window)
        };
        tokio::time::sleep_until(turn.into()).await;
        Some(window)
    }

    /// Counts `bytes` taken over the registry link and, under a budget, books those no window booked
    /// beforehand (`prepaid`, used up as it covers them: a registry may send more than the range asked)
    /// and waits until they fit in it: the caller reads no more from the link meanwhile.
    async fn took_from_link(&self, bytes: u64, prepaid: &mut u64) {
        self.link_bytes.fetch_add(bytes, Ordering::Relaxed);
        let covered = bytes.min(*prepaid);
        *prepaid -= covered;
        let Some(pace) = self.link_pace.as_ref().filter(|_| bytes > covered) else {
            return;
        };
        let at = pace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .book(bytes - covered, Instant::now());
        tokio::time::sleep_until(at.into()).await;
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
        let manifest = self.registry().manifest_bytes(source, digest).await?;
        let path = self.complete_path(hex);
        write_atomically(&media_type_path(&path), manifest.media_type.as_bytes())?;
        write_atomically(&path, &manifest.body)?;
        let new = {
            let mut state = self.lock();
            let new = !state.complete.contains_key(hex);
            if new {
                state.insert(hex, manifest.body.len() as u64);
            }
            new
        };
        if new {
            self.took_from_link(manifest.body.len() as u64, &mut 0)
                .await;
        }
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

//! What registries say about images: manifests fetched for many references at once, resolved per node
//! platform, turned into [`ImageFacts`]; and blobs, for the blob cache.
//!
//! Sizes come from manifest descriptors only; no blob is downloaded, so a 500-image set costs a few hundred
//! small requests. The HTTP side is [`super::distribution`] (one client per registry, with the site's CAs
//! and client certificate from certs.d; the registry's `/v2/` asked once; one token per repository), a
//! semaphore bounds the requests in flight so a large set does not hammer the registry, every manifest is checked against the
//! digest it was asked for, and parsed manifests are cached by `registry/repository@digest`, so a digest
//! shared by several references or platforms is fetched once. (The repository is part of the key on purpose:
//! content is the same everywhere, but existence in one repository says nothing about another.) A registry
//! that cannot be reached is remembered for a few seconds, so the rest of a large set fails fast instead of
//! waiting out one timeout per image.
//!
//! - `manifest`: reading manifests and indexes, platform selection, image facts.
//! - `access`: a registry's client and a repository's access; registries known to be down.
//! - `blob`: blob downloads from a byte offset.
//! - `error`: [`RegistryError`], and how failed requests map to it.
//! - `reference`: references spelled as the distribution spec allows.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use sha2::Digest as _;
use tokio::sync::{OnceCell, Semaphore};

use crate::backend::certs::CertDirs;
use crate::backend::credentials::{AuthFiles, Credentials};
use crate::backend::distribution::{Distribution, HttpError};
use crate::model::image::{ImageFacts, Platform};
use crate::model::mirror_rules::{Candidate, MirrorRules};
use crate::model::reference::ImageRef;
use crate::model::served::Source;

mod access;
mod blob;
mod config;
mod error;
mod manifest;
mod reference;

use access::AuthState;
pub use blob::{BlobBody, BlobFailure, BrokenOff};
pub use error::RegistryError;
use error::{map_error, timeout_error, tried_everywhere};
pub use manifest::{
    ACCEPTED_MEDIA_TYPES, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST, ManifestBytes,
};
use manifest::{
    Fetched, MAX_MANIFEST_BYTES, Manifest, available_platforms, content_digest, image_facts,
    media_type, parse_manifest, select_entry,
};
use reference::{normalize_registry, parse_reference};

/// Tries of a manifest read that a registry answers 429 or 503, the first included.
const BUSY_ATTEMPTS: u32 = 4;
/// The wait before asking a busy registry again when it does not say (`Retry-After`), doubled each time.
const BUSY_BACKOFF: Duration = Duration::from_millis(500);
/// The longest `Retry-After` waited for; a registry asking for longer fails the read at once.
const BUSY_WAIT_MAX: Duration = Duration::from_secs(10);

/// How to talk to registries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryOptions {
    /// `--authfile`: the only auth file consulted when set (see [`crate::backend::credentials`]).
    pub authfile: Option<PathBuf>,
    /// `HOST[:PORT]` of registries reached over plain HTTP; every other registry is HTTPS only.
    pub insecure_registries: Vec<String>,
    /// `--certs-dir`: the only certs.d directory read when set (see [`crate::backend::certs`]).
    pub certs_dir: Option<PathBuf>,
    /// Requests in flight at most, over all references and platforms (default 64: a release's ~190
    /// manifests in three round trips).
    pub concurrency: usize,
    /// Per request: connect, read, and the whole exchange (default 30 s).
    pub timeout: Duration,
    /// Where references are fetched from: mirrors first, then the source unless it is blocked.
    pub mirrors: MirrorRules,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            authfile: None,
            insecure_registries: Vec::new(),
            certs_dir: None,
            concurrency: 64,
            timeout: Duration::from_secs(30),
            mirrors: MirrorRules::default(),
        }
    }
}

/// What the facts for one reference look like: one entry per requested platform, in the order asked.
pub type PlatformFacts = Vec<(Platform, ImageFacts)>;

/// A registry client for inspecting many images. Cheap to share behind `&`; all methods take `&self`.
pub struct Registry {
    distribution: Distribution,
    credentials: Arc<Credentials>,
    timeout: Duration,
    concurrency: usize,
    permits: Semaphore,
    manifests: Mutex<HashMap<String, Arc<OnceCell<Arc<Fetched>>>>>,
    auths: Mutex<HashMap<String, Arc<OnceCell<Arc<AuthState>>>>>,
    down: Mutex<HashMap<String, (RegistryError, Instant)>>,
    requests: AtomicU64,
    mirrors: MirrorRules,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("certs_dirs", &self.distribution.certs().dirs())
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .field("auth_files", &self.credentials.files())
            .field("manifest_requests", &self.manifest_requests())
            .finish()
    }
}

impl Registry {
    /// A client with credentials from `options.authfile` or the default auth files.
    pub fn new(options: RegistryOptions) -> Result<Registry, RegistryError> {
        let credentials = Credentials::load(&AuthFiles::from_env(options.authfile.clone()))?;
        Registry::with_credentials(options, credentials)
    }

    /// A client with these credentials (`options.authfile` is ignored).
    pub fn with_credentials(
        options: RegistryOptions,
        credentials: Credentials,
    ) -> Result<Registry, RegistryError> {
        crate::install_crypto_provider();
        let insecure: Vec<String> = options
            .insecure_registries
            .iter()
            .map(|r| normalize_registry(r))
            .collect();
        let timeout = if options.timeout.is_zero() {
            RegistryOptions::default().timeout
        } else {
            options.timeout
        };
        let concurrency = options.concurrency.max(1);
        Ok(Registry {
            distribution: Distribution::new(
                CertDirs::from_env(options.certs_dir),
                insecure,
                timeout,
            ),
            credentials: Arc::new(credentials),
            timeout,
            concurrency,
            permits: Semaphore::new(concurrency),
            manifests: Mutex::default(),
            auths: Mutex::default(),
            down: Mutex::default(),
            requests: AtomicU64::new(0),
            mirrors: options.mirrors,
        })
    }

    /// The credentials it reads, for whatever else must authenticate the same way (the runtimes' pulls).
    pub fn credentials(&self) -> Arc<Credentials> {
        Arc::clone(&self.credentials)
    }

    /// How many manifest requests went to registries so far (cache hits and token requests not counted).
    pub fn manifest_requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Inspects every reference, `concurrency` at a time. The result has one entry per reference, in the
    /// input order; each is that reference's [`Registry::inspect`] result.
    pub async fn inspect_all<S: AsRef<str>>(
        &self,
        references: &[S],
        platforms: &[Platform],
    ) -> Vec<Result<PlatformFacts, RegistryError>> {
        let mut results: Vec<Option<Result<PlatformFacts, RegistryError>>> =
            references.iter().map(|_| None).collect();
        // By index: a closure taking `&S` would make the future too lifetime-specific for tokio::spawn.
        let mut answers = stream::iter(0..references.len())
            .map(|i| async move { (i, self.inspect(references[i].as_ref(), platforms).await) })
            .buffer_unordered(self.concurrency);
        while let Some((i, result)) = answers.next().await {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.expect("every reference is answered once"))
            .collect()
    }

    /// The facts of one reference (`host/repo@sha256:...`, or a tag, which is then not cached) for each of
    /// `platforms` (empty means the host's), in that order.
    ///
    /// An index is resolved per platform ([`Platform::accepts`], an exact variant preferred) and its platform
    /// manifests are fetched; the facts then carry `index_digest` and the entry's `platform`. A plain
    /// manifest cannot be checked against a platform without downloading its config, so it is returned for
    /// every requested platform with `platform: None`. A platform the index lacks fails the whole reference
    /// with [`RegistryError::NoPlatform`]: the image cannot be pinned on those nodes.
    pub async fn inspect(
        &self,
        reference: &str,
        platforms: &[Platform],
    ) -> Result<PlatformFacts, RegistryError> {
        let started = Instant::now();
        let result = self.inspect_inner(reference, platforms).await;
        tracing::debug!(
            reference,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = result.is_ok(),
            "inspected"
        );
        result
    }

    async fn inspect_inner(
        &self,
        reference: &str,
        platforms: &[Platform],
    ) -> Result<PlatformFacts, RegistryError> {
        let wanted: Vec<Platform> = if platforms.is_empty() {
            vec![Platform::host()]
        } else {
            platforms.to_vec()
        };
        let parsed = parse_reference(reference)?;
        let top = self.manifest(&parsed, reference).await?;
        let entries = match &top.manifest {
            Manifest::Image { .. } => {
                let facts = image_facts(&top, None);
                return Ok(wanted.into_iter().map(|p| (p, facts.clone())).collect());
            }
            Manifest::Index { entries } => entries,
        };
        let mut chosen = Vec::with_capacity(wanted.len());
        for platform in wanted {
            let entry =
                select_entry(entries, &platform).ok_or_else(|| RegistryError::NoPlatform {
                    reference: reference.to_string(),
                    platform: platform.clone(),
                    available: available_platforms(entries),
                })?;
            chosen.push((platform, entry));
        }
        let fetches = chosen.into_iter().map(|(platform, entry)| {
            let top = &top;
            let parsed = &parsed;
            async move {
                let shown = entry
                    .platform
                    .as_ref()
                    .map_or_else(|| platform.to_string(), Platform::to_string);
                let label = format!("{reference} ({shown} manifest {})", entry.digest);
                let by_digest = ImageRef {
                    tag: None,
                    digest: Some(entry.digest.clone()),
                    ..parsed.clone()
                };
                let child = self.manifest(&by_digest, &label).await?;
                if child.size != entry.size {
                    return Err(RegistryError::Invalid {
                        reference: label,
                        cause: format!(
                            "the index says this manifest has {} bytes, but the registry sent {}",
                            entry.size, child.size
                        ),
                    });
                }
                if matches!(child.manifest, Manifest::Index { .. }) {
                    return Err(RegistryError::Invalid {
                        reference: label,
                        cause: "is another index; nested indexes are not supported".into(),
                    });
                }
                Ok((platform, image_facts(&child, Some((top, entry)))))
            }
        });
        futures::future::try_join_all(fetches).await
    }

    /// A manifest from the cache, or fetched once however many callers ask for it at the same time.
    async fn manifest(
        &self,
        reference: &ImageRef,
        label: &str,
    ) -> Result<Arc<Fetched>, RegistryError> {
        let Some(digest) = &reference.digest else {
            return self.fetch_mirrored(reference, label).await;
        };
        let key = format!("{}/{}@{digest}", reference.registry, reference.repository);
        let cell = self
            .manifests
            .lock()
            .expect("cache lock")
            .entry(key)
            .or_default()
            .clone();
        cell.get_or_try_init(|| self.fetch_mirrored(reference, label))
            .await
            .cloned()
    }

    /// The manifest of `reference` from the first place [`MirrorRules::candidates`] names that serves it
    /// (the content is checked against the digest wherever it comes from).
    async fn fetch_mirrored(
        &self,
        reference: &ImageRef,
        label: &str,
    ) -> Result<Arc<Fetched>, RegistryError> {
        let mut tried = Vec::new();
        for candidate in self.candidates(reference, label)? {
            let target = parse_reference(&candidate.reference)?;
            match self
                .fetch(&target, label, candidate.mirror.as_deref())
                .await
            {
                Ok(fetched) => return Ok(fetched),
                Err(error) => tried.push((candidate, error)),
            }
        }
        Err(tried_everywhere(label, &reference.registry, tried))
    }

    /// Where to fetch `reference`, in order; an error when its source is blocked and no mirror serves it.
    fn candidates(
        &self,
        reference: &ImageRef,
        label: &str,
    ) -> Result<Vec<Candidate>, RegistryError> {
        let text = reference.to_string();
        match self.mirrors.blocked(&text) {
            Some(why) => Err(RegistryError::Unreachable {
                reference: label.to_string(),
                registry: reference.registry.clone(),
                cause: why,
            }),
            None => Ok(self.mirrors.candidates(&text)),
        }
    }

    async fn fetch(
        &self,
        reference: &ImageRef,
        label: &str,
        mirror: Option<&str>,
    ) -> Result<Arc<Fetched>, RegistryError> {
        let registry = reference.registry.as_str();
        let host = self.host(registry, label).await?;
        let target = reference
            .digest
            .as_deref()
            .or(reference.tag.as_deref())
            .unwrap_or("latest");
        let path = format!("{}/manifests/{target}", reference.repository);
        let mut challenged = false;
        let mut busy = 0;
        let (auth, outcome, elapsed_ms) = loop {
            let auth = self.auth(&host, reference, label).await?;
            self.check_down(registry, label)?;
            let permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            self.requests.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let outcome = tokio::time::timeout(
                self.timeout,
                self.distribution.get(
                    &host,
                    &path,
                    &auth.access,
                    &ACCEPTED_MEDIA_TYPES.join(", "),
                    MAX_MANIFEST_BYTES,
                ),
            )
            .await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            // Refused anonymously, the registry said what it asks for: ask for access again, once.
            if matches!(outcome, Ok(Err(HttpError::Challenged))) && !challenged {
                challenged = true;
                self.forget_auth(reference);
                continue;
            }
            // Busy (429, 503): asked again a few times, after the wait it asks for if it is not too long.
            if let Ok(Err(HttpError::Busy {
                status,
                retry_after,
                ..
            })) = &outcome
            {
                busy += 1;
                let wait = retry_after.unwrap_or(BUSY_BACKOFF * 2u32.pow(busy - 1));
                if busy < BUSY_ATTEMPTS && wait <= BUSY_WAIT_MAX {
                    tracing::info!(
                        reference = label,
                        registry,
                        status,
                        wait_ms = wait.as_millis() as u64,
                        "registry busy; asking again"
                    );
                    drop(permit);
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
            break (auth, outcome, elapsed_ms);
        };
        let context = self.context(label, registry, &auth.described, Some(&host));
        let body = match outcome {
            Ok(Ok(body)) => body,
            // A credential was sent and is good, but not for this repository.
            Ok(Err(HttpError::InsufficientScope { .. })) if auth.source.is_some() => {
                let error = RegistryError::NotGranted {
                    reference: label.to_string(),
                    registry: registry.to_string(),
                    repository: reference.repository.clone(),
                    origin: auth.source.clone().unwrap_or_default(),
                };
                return Err(self.failed(error, elapsed_ms));
            }
            Ok(Err(e)) => return Err(self.failed(map_error(e, &context), elapsed_ms)),
            Err(_) => return Err(self.failed(timeout_error(&context), elapsed_ms)),
        };
        self.down.lock().expect("down lock").remove(registry);
        tracing::debug!(
            reference = label,
            registry,
            elapsed_ms,
            bytes = body.len(),
            "fetched manifest"
        );
        let digest = match &reference.digest {
            Some(expected) => {
                let actual =
                    content_digest(&body, expected).ok_or_else(|| RegistryError::Invalid {
                        reference: label.to_string(),
                        cause: format!("unsupported digest algorithm in {expected}"),
                    })?;
                if actual != *expected {
                    return Err(RegistryError::DigestMismatch {
                        reference: label.to_string(),
                        registry: registry.to_string(),
                        expected: expected.to_string(),
                        actual,
                    });
                }
                actual
            }
            None => format!("sha256:{:x}", sha2::Sha256::digest(&body)),
        };
        let manifest = parse_manifest(&body).map_err(|e| RegistryError::Invalid {
            reference: label.to_string(),
            cause: e.to_string(),
        })?;
        Ok(Arc::new(Fetched {
            digest,
            size: body.len() as u64,
            media_type: media_type(&body, &manifest),
            manifest,
            mirror: mirror.map(str::to_owned),
            body: Bytes::from(body),
        }))
    }

    /// A manifest or index of `source` by digest, exactly as the registry sent it (its digest verified), with
    /// its media type: from memory when a survey fetched it already, else fetched now.
    pub async fn manifest_bytes(
        &self,
        source: &Source,
        digest: &str,
    ) -> Result<ManifestBytes, RegistryError> {
        let label = format!("{source}@{digest}");
        let reference = parse_reference(&label)?;
        let fetched = self.manifest(&reference, &label).await?;
        Ok(ManifestBytes {
            body: fetched.body.clone(),
            media_type: fetched.media_type.clone(),
        })
    }
}

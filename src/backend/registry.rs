//! What registries say about images: manifests fetched for many references at once, resolved per node
//! platform, turned into [`ImageFacts`].
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
//! Blobs are fetched here too, for the blob cache ([`crate::backend::blobs`]): one GET per call, from a byte
//! offset, with the same client, credentials and certificates as manifests, and the answer's status line and
//! headers kept: whether a `Range` was honoured (206 and `Content-Range`) and how long `Retry-After` asks to
//! wait.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use serde::Deserialize;
use sha2::Digest as _;
use tokio::sync::{OnceCell, Semaphore};

use crate::backend::certs::{CertDirs, CertsError};
use crate::backend::credentials::{AuthFiles, Credential, Credentials, CredentialsError};
use crate::backend::distribution::{Access, Distribution, Host, HttpError, retry_after};
use crate::backend::truncate;
use crate::model::image::{ImageFacts, Layer, Platform};
use crate::model::mirror::Source;
use crate::model::mirror_rules::{Candidate, MirrorRules};
use crate::model::reference::ImageRef;

pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
const MEDIA_TYPE_DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
const MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// The `Accept` list of every manifest request.
pub const ACCEPTED_MEDIA_TYPES: [&str; 4] = [
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
];

/// The largest manifest accepted, as containerd limits them.
const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// How long an unreachable registry is answered from memory before it is tried again.
const DOWN_FOR: Duration = Duration::from_secs(10);
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

/// Why a reference could not be inspected. Each message names the reference and the cause, is one line,
/// and never contains credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("manifest {reference} does not exist in registry {registry}")]
    NotFound { reference: String, registry: String },
    #[error(
        "registry {registry} refused access to {reference} ({credentials}); log in with `podman login {registry}` \
         or `docker login {registry}`, or pass --authfile"
    )]
    Unauthorized {
        reference: String,
        registry: String,
        /// Which credentials were sent, never what they are: "no credentials found for it" or
        /// "with the credentials from entry "quay.io" of /root/.docker/config.json".
        credentials: String,
    },
    #[error("cannot reach registry {registry} for {reference}: {cause}")]
    Unreachable {
        reference: String,
        registry: String,
        cause: String,
    },
    #[error(
        "{reference} has no image for platform {platform}; its index offers {}",
        offered(available)
    )]
    NoPlatform {
        reference: String,
        platform: Platform,
        available: Vec<String>,
    },
    #[error(
        "content of {reference} does not match its digest: registry {registry} sent content with digest {actual}; \
         refusing it (a proxy or the registry altered it)"
    )]
    DigestMismatch {
        reference: String,
        registry: String,
        expected: String,
        actual: String,
    },
    #[error("{reference}: {cause}")]
    Invalid { reference: String, cause: String },
    #[error("registry {registry} did not answer within {}s for {reference}; retry, or raise the timeout", after.as_secs_f32())]
    Timeout {
        reference: String,
        registry: String,
        after: Duration,
    },
    #[error(
        "registry {registry} refused access to {reference}: the credentials from {origin} grant no pull \
         access to repository {repository} (insufficient_scope); have that account granted pull access to \
         {repository}, or put credentials that have it in an entry for {registry}/{repository}"
    )]
    NotGranted {
        reference: String,
        registry: String,
        repository: String,
        /// Where the credential came from (`entry "quay.io" of /root/.docker/config.json`), never what
        /// it is.
        origin: String,
    },
    #[error(
        "registry {registry} is rate-limiting requests for {reference}; retry later, or lower the concurrency"
    )]
    RateLimited { reference: String, registry: String },
    #[error("registry {registry} failed for {reference}: {cause}")]
    Server {
        reference: String,
        registry: String,
        cause: String,
    },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("registry certificates: {0}")]
    Certs(CertsError),
    #[error("cannot set up the registry client: {cause}")]
    Setup { cause: String },
}

fn offered(available: &[String]) -> String {
    if available.is_empty() {
        "no platform-specific images".into()
    } else {
        available.join(", ")
    }
}

impl RegistryError {
    /// A short, stable name of the class of error, for machine-readable output.
    pub fn kind(&self) -> &'static str {
        match self {
            RegistryError::NotFound { .. } => "not-found",
            RegistryError::Unauthorized { .. } | RegistryError::NotGranted { .. } => "unauthorized",
            RegistryError::Unreachable { .. } => "unreachable",
            RegistryError::NoPlatform { .. } => "no-platform",
            RegistryError::DigestMismatch { .. } => "digest-mismatch",
            RegistryError::Invalid { .. } => "invalid",
            RegistryError::Timeout { .. } => "timeout",
            RegistryError::RateLimited { .. } => "rate-limited",
            RegistryError::Server { .. } => "server",
            RegistryError::Credentials(_) => "credentials",
            RegistryError::Certs(_) => "certs",
            RegistryError::Setup { .. } => "setup",
        }
    }

    /// The reference (or, for a platform manifest, the reference and the platform) the error is about.
    pub fn reference(&self) -> Option<&str> {
        match self {
            RegistryError::NotFound { reference, .. }
            | RegistryError::Unauthorized { reference, .. }
            | RegistryError::NotGranted { reference, .. }
            | RegistryError::Unreachable { reference, .. }
            | RegistryError::NoPlatform { reference, .. }
            | RegistryError::DigestMismatch { reference, .. }
            | RegistryError::Invalid { reference, .. }
            | RegistryError::Timeout { reference, .. }
            | RegistryError::RateLimited { reference, .. }
            | RegistryError::Server { reference, .. } => Some(reference),
            RegistryError::Credentials(_)
            | RegistryError::Certs(_)
            | RegistryError::Setup { .. } => None,
        }
    }

    /// Whether retrying later may help (the registry was unreachable, slow, overloaded or failing).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RegistryError::Unreachable { .. }
                | RegistryError::Timeout { .. }
                | RegistryError::RateLimited { .. }
                | RegistryError::Server { .. }
        )
    }

    fn for_reference(mut self, label: &str) -> Self {
        match &mut self {
            RegistryError::NotFound { reference, .. }
            | RegistryError::Unauthorized { reference, .. }
            | RegistryError::NotGranted { reference, .. }
            | RegistryError::Unreachable { reference, .. }
            | RegistryError::NoPlatform { reference, .. }
            | RegistryError::DigestMismatch { reference, .. }
            | RegistryError::Invalid { reference, .. }
            | RegistryError::Timeout { reference, .. }
            | RegistryError::RateLimited { reference, .. }
            | RegistryError::Server { reference, .. } => *reference = label.to_string(),
            RegistryError::Credentials(_)
            | RegistryError::Certs(_)
            | RegistryError::Setup { .. } => {}
        }
        self
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

/// The access to one repository, and how to describe its credential in messages.
struct AuthState {
    access: Access,
    described: String,
    /// Where the credential came from; None when none was found.
    source: Option<String>,
}

/// A manifest as fetched and verified.
#[derive(Debug)]
struct Fetched {
    digest: String,
    size: u64,
    manifest: Manifest,
    /// The mirror that served it; None: the source.
    mirror: Option<String>,
    /// The bytes exactly as the registry sent them, and their media type: what a mirror serves.
    body: Bytes,
    media_type: String,
}

/// A manifest's bytes as its registry sent them (their digest verified), with its media type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestBytes {
    pub body: Bytes,
    pub media_type: String,
}

/// One blob response under way: its body from byte `start` of the blob.
pub struct BlobBody {
    /// Where the body starts in the blob: the offset asked for when the registry answered 206, 0 when it
    /// answered 200 (it ignored the `Range`, or none was sent).
    pub start: u64,
    /// The body as it arrives. An error means the transfer broke off (reset, closed early).
    pub stream: BoxStream<'static, Result<Bytes, String>>,
}

/// Why a blob request failed, and how long the registry asked to be left alone (`Retry-After` of a 429 or
/// 503).
#[derive(Clone, Debug)]
pub struct BlobFailure {
    pub error: RegistryError,
    pub retry_after: Option<Duration>,
}

/// A failure with no `Retry-After`: anything but the registry's 429 or 503.
impl From<RegistryError> for BlobFailure {
    fn from(error: RegistryError) -> BlobFailure {
        BlobFailure {
            error,
            retry_after: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Manifest {
    Image {
        config: Layer,
        layers: Vec<Layer>,
        annotations: BTreeMap<String, String>,
    },
    Index {
        entries: Vec<IndexEntry>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct IndexEntry {
    media_type: String,
    digest: String,
    size: u64,
    platform: Option<Platform>,
    annotations: BTreeMap<String, String>,
}

/// What an error message needs to know about the request that failed.
struct Context<'a> {
    label: &'a str,
    registry: &'a str,
    insecure: bool,
    credentials: &'a str,
    timeout: Duration,
    certs: &'a CertDirs,
    /// What certs.d gave the registry, once it was reached.
    host: Option<&'a Host>,
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
        let manifest = parse_manifest(&body).map_err(|cause| RegistryError::Invalid {
            reference: label.to_string(),
            cause,
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

    /// The registry's client, its `/v2/` asked once.
    async fn host(&self, registry: &str, label: &str) -> Result<Arc<Host>, RegistryError> {
        self.check_down(registry, label)?;
        let context = self.context(label, registry, "", None);
        let started = Instant::now();
        let outcome = {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            tokio::time::timeout(self.timeout, self.distribution.host(registry)).await
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(Ok(host)) => Ok(host),
            Ok(Err(e)) => Err(self.failed(map_error(e, &context), elapsed_ms)),
            Err(_) => Err(self.failed(timeout_error(&context), elapsed_ms)),
        }
    }

    /// The access to the reference's repository: its credential looked up and (if the registry wants
    /// tokens) exchanged once per repository, again when the token runs out.
    async fn auth(
        &self,
        host: &Host,
        reference: &ImageRef,
        label: &str,
    ) -> Result<Arc<AuthState>, RegistryError> {
        let registry = reference.registry.as_str();
        let key = format!("{registry}/{}", reference.repository);
        let cell = {
            let mut auths = self.auths.lock().expect("auth lock");
            let cell = auths.entry(key).or_default();
            if cell.get().is_some_and(|state| state.access.expired()) {
                *cell = Arc::default();
            }
            cell.clone()
        };
        cell.get_or_try_init(|| async {
            let credentials = Arc::clone(&self.credentials);
            let (lookup_registry, repository) =
                (registry.to_string(), reference.repository.clone());
            let found = tokio::task::spawn_blocking(move || {
                credentials.lookup(&lookup_registry, &repository)
            })
            .await
            .map_err(|e| RegistryError::Setup {
                cause: format!("credential lookup failed: {e}"),
            })??;
            let source = found.as_ref().map(|found| found.source.to_string());
            let (credential, described) = match found {
                Some(found) => (
                    found.credential,
                    format!("with the credentials from {}", found.source),
                ),
                None => (Credential::Anonymous, self.no_credentials()),
            };
            let context = self.context(label, registry, &described, Some(host));
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let started = Instant::now();
            let outcome = tokio::time::timeout(
                self.timeout,
                self.distribution
                    .access(host, &reference.repository, &credential),
            )
            .await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let access = match outcome {
                // The token itself is never logged.
                Ok(Ok(access)) => access,
                Ok(Err(e)) => return Err(self.failed(map_error(e, &context), elapsed_ms)),
                Err(_) => return Err(self.failed(timeout_error(&context), elapsed_ms)),
            };
            tracing::debug!(
                registry,
                repository = reference.repository,
                elapsed_ms,
                credential = %credential,
                authorized = access.authorized(),
                "repository access"
            );
            Ok(Arc::new(AuthState {
                access,
                described,
                source,
            }))
        })
        .await
        .cloned()
    }

    /// "no credentials found for it", and in which files none was.
    fn no_credentials(&self) -> String {
        let files = self.credentials.files();
        if files.is_empty() {
            "no credentials found for it: no auth file was found".into()
        } else {
            let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            format!("no credentials found for it in {}", files.join(", "))
        }
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

    /// One GET of blob `digest` from `source`, from byte `offset` (with `Range: bytes=<offset>-` when it is
    /// not 0), with the repository's credentials; a 401 to a token renews it once. The body is not verified
    /// here: the caller hashes the whole blob. A 206 whose `Content-Range` does not start at `offset` is
    /// refused, so bytes never land in the wrong place. No read timeout: the blob cache detects stalls.
    pub async fn blob(
        &self,
        source: &Source,
        digest: &str,
        offset: u64,
    ) -> Result<BlobBody, BlobFailure> {
        let label = format!("blob {digest} of {source}");
        let reference = parse_reference(&format!("{source}@{digest}"))?;
        let mut tried = Vec::new();
        let mut retry_after = None;
        for candidate in self.candidates(&reference, &label)? {
            let target = parse_reference(&candidate.reference)?;
            match self.blob_from(&target, &label, digest, offset).await {
                Ok(body) => return Ok(body),
                Err(failure) => {
                    retry_after = failure.retry_after;
                    tried.push((candidate, failure.error));
                }
            }
        }
        Err(BlobFailure {
            error: tried_everywhere(&label, &reference.registry, tried),
            retry_after,
        })
    }

    /// The blob `digest` from the place `reference` names (a mirror's location or the source).
    async fn blob_from(
        &self,
        reference: &ImageRef,
        label: &str,
        digest: &str,
        offset: u64,
    ) -> Result<BlobBody, BlobFailure> {
        let label = label.to_owned();
        let registry = reference.registry.as_str();
        let host = self.host(registry, &label).await?;
        let path = format!("{}/blobs/{digest}", reference.repository);
        let range = (offset > 0).then(|| format!("bytes={offset}-"));
        let mut renewed = false;
        let (response, auth) = loop {
            let auth = self.auth(&host, reference, &label).await?;
            let context = self.context(&label, registry, &auth.described, Some(&host));
            let response = match self
                .distribution
                .send(&host, &path, &auth.access, None, range.as_deref())
                .await
            {
                // Refused anonymously, the registry said what it asks for: ask for access again.
                Err(HttpError::Challenged) if !renewed => {
                    renewed = true;
                    self.forget_auth(reference);
                    continue;
                }
                other => other.map_err(|e| map_error(e, &context))?,
            };
            if response.status() != http::StatusCode::UNAUTHORIZED
                || renewed
                || !auth.access.authorized()
            {
                break (response, auth);
            }
            // Tokens expire (often after 5 minutes), and a long mirror session outlives them.
            renewed = true;
            self.forget_auth(reference);
        };
        let context = self.context(&label, registry, &auth.described, Some(&host));
        let status = response.status();
        match status {
            http::StatusCode::OK | http::StatusCode::PARTIAL_CONTENT => {
                let start = if status == http::StatusCode::OK {
                    0
                } else {
                    let start = content_range_start(response.headers());
                    if start != Some(offset) {
                        return Err(BlobFailure::from(RegistryError::Server {
                            reference: label.clone(),
                            registry: registry.to_string(),
                            cause: format!(
                                "it answered a request for bytes {offset}- with {:?}",
                                response.headers().get(http::header::CONTENT_RANGE)
                            ),
                        }));
                    }
                    offset
                };
                let (registry, insecure, certs) = (
                    registry.to_string(),
                    context.insecure,
                    self.distribution.certs().clone(),
                );
                let stream = response
                    .bytes_stream()
                    .map(move |chunk| {
                        chunk.map_err(|e| {
                            let context = Context {
                                label: &label,
                                registry: &registry,
                                insecure,
                                credentials: "",
                                timeout: Duration::ZERO,
                                certs: &certs,
                                host: Some(&host),
                            };
                            transport_cause(&e, &context)
                        })
                    })
                    .boxed();
                Ok(BlobBody { start, stream })
            }
            _ => {
                let retry_after = retry_after(response.headers(), std::time::SystemTime::now());
                let body = response.bytes().await.unwrap_or_default();
                Err(BlobFailure {
                    error: blob_error(status, &body, &context),
                    retry_after,
                })
            }
        }
    }

    /// Drops what authorizes the reference's repository, so the next request asks again.
    fn forget_auth(&self, reference: &ImageRef) {
        let key = format!("{}/{}", reference.registry, reference.repository);
        self.auths.lock().expect("auth lock").remove(&key);
    }

    fn context<'a>(
        &'a self,
        label: &'a str,
        registry: &'a str,
        credentials: &'a str,
        host: Option<&'a Host>,
    ) -> Context<'a> {
        Context {
            label,
            registry,
            insecure: self.distribution.is_insecure(registry),
            credentials,
            timeout: self.timeout,
            certs: self.distribution.certs(),
            host,
        }
    }

    /// Logs a failed request, and remembers a registry that could not be reached.
    fn failed(&self, error: RegistryError, elapsed_ms: u64) -> RegistryError {
        tracing::debug!(elapsed_ms, error = %error, "registry request failed");
        if let RegistryError::Unreachable { registry, .. }
        | RegistryError::Timeout { registry, .. } = &error
        {
            self.down
                .lock()
                .expect("down lock")
                .insert(registry.clone(), (error.clone(), Instant::now()));
        }
        error
    }

    fn check_down(&self, registry: &str, label: &str) -> Result<(), RegistryError> {
        let mut down = self.down.lock().expect("down lock");
        match down.get(registry) {
            Some((error, since)) if since.elapsed() < DOWN_FOR => {
                Err(error.clone().for_reference(label))
            }
            Some(_) => {
                down.remove(registry);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// The media type a manifest declares, else the OCI one of its kind (OCI allows leaving it out).
fn media_type(body: &[u8], manifest: &Manifest) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Declared {
        media_type: Option<String>,
    }
    let declared = serde_json::from_slice::<Declared>(body)
        .ok()
        .and_then(|d| d.media_type)
        .filter(|m| !m.is_empty());
    declared.unwrap_or_else(|| {
        match manifest {
            Manifest::Image { .. } => MEDIA_TYPE_OCI_MANIFEST,
            Manifest::Index { .. } => MEDIA_TYPE_OCI_INDEX,
        }
        .to_string()
    })
}

/// What an unsuccessful answer to a blob request means: as for manifests, except that a client error other
/// than 408 and 429 is final, since asking again the same way gets the same answer (416, 400, ...).
fn blob_error(status: http::StatusCode, body: &[u8], context: &Context<'_>) -> RegistryError {
    let answer = HttpError::Status {
        status: status.as_u16(),
        body: String::from_utf8_lossy(body).into_owned(),
    };
    match map_error(answer, context) {
        RegistryError::Server {
            reference, cause, ..
        } if status.is_client_error()
            && !matches!(
                status,
                http::StatusCode::REQUEST_TIMEOUT | http::StatusCode::TOO_MANY_REQUESTS
            ) =>
        {
            RegistryError::Invalid { reference, cause }
        }
        error => error,
    }
}

/// The first byte of a 206's `Content-Range: bytes START-END/TOTAL`.
fn content_range_start(headers: &http::HeaderMap) -> Option<u64> {
    let value = headers.get(http::header::CONTENT_RANGE)?.to_str().ok()?;
    let range = value.trim().strip_prefix("bytes ")?;
    range.split_once('-')?.0.trim().parse().ok()
}

/// `http://host:port/` or `host:port` as image references spell registries (Docker Hub is `docker.io`).
fn normalize_registry(text: &str) -> String {
    let text = text.trim();
    let text = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .unwrap_or(text);
    let host = text.split('/').next().unwrap_or(text);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        other => other.to_string(),
    }
}

/// A reference as the registry client takes it: parsed, and spelled as the distribution spec allows.
fn parse_reference(text: &str) -> Result<ImageRef, RegistryError> {
    ImageRef::parse(text)
        .and_then(|r| well_formed(&r).map(|()| r))
        .map_err(|e| RegistryError::Invalid {
            reference: text.to_string(),
            cause: format!("not a valid image reference ({e})"),
        })
}

/// Whether every part of the reference is spelled as the distribution spec allows, so nothing else is
/// sent to a registry: host, lower-case path components, tag and digest.
fn well_formed(reference: &ImageRef) -> Result<(), String> {
    let host_ok = !reference.registry.is_empty()
        && reference
            .registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if !host_ok {
        return Err(format!("bad registry host {:?}", reference.registry));
    }
    let component_ok = |c: &str| {
        c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    if !reference.repository.split('/').all(component_ok) {
        return Err(format!(
            "bad repository {:?}: lower-case letters, digits and . _ - only",
            reference.repository
        ));
    }
    if let Some(tag) = &reference.tag {
        let ok = tag.len() <= 128
            && tag
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(format!("bad tag {tag:?}"));
        }
    }
    match &reference.digest {
        Some(digest) if !valid_digest(digest) => Err(format!("bad digest {digest:?}")),
        _ => Ok(()),
    }
}

/// The digest of `body` with the algorithm of `like` (`sha256:...` or `sha512:...`).
fn content_digest(body: &[u8], like: &str) -> Option<String> {
    match like.split_once(':')?.0 {
        "sha256" => Some(format!("sha256:{:x}", sha2::Sha256::digest(body))),
        "sha512" => Some(format!("sha512:{:x}", sha2::Sha512::digest(body))),
        _ => None,
    }
}

/// Why no place served a reference: the one error when one place was tried; otherwise every place and its
/// answer (each mirror, then the source).
fn tried_everywhere(
    label: &str,
    registry: &str,
    mut tried: Vec<(Candidate, RegistryError)>,
) -> RegistryError {
    if tried.len() <= 1 {
        return tried.pop().map_or_else(
            || RegistryError::Unreachable {
                reference: label.to_string(),
                registry: registry.to_string(),
                cause: "no place to fetch it from".into(),
            },
            |(_, error)| error,
        );
    }
    let answers: Vec<String> = tried
        .iter()
        .map(|(candidate, error)| format!("{candidate}: {error}"))
        .collect();
    RegistryError::Unreachable {
        reference: label.to_string(),
        registry: registry.to_string(),
        cause: format!(
            "no mirror served it, nor the source ({})",
            answers.join("; ")
        ),
    }
}

fn image_facts(fetched: &Fetched, index: Option<(&Fetched, &IndexEntry)>) -> ImageFacts {
    let Manifest::Image {
        config,
        layers,
        annotations,
    } = &fetched.manifest
    else {
        unreachable!("image_facts is only called for image manifests")
    };
    // The index entry's annotations (SOCI puts its index digest there too), overridden by the manifest's.
    let mut all = index
        .map(|(_, entry)| entry.annotations.clone())
        .unwrap_or_default();
    all.extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    ImageFacts {
        manifest_digest: fetched.digest.clone(),
        manifest_size: fetched.size,
        index_digest: index.map(|(index, _)| index.digest.clone()),
        platform: index.and_then(|(_, entry)| entry.platform.clone()),
        config_digest: config.digest.clone(),
        config_size: config.size,
        layers: layers.clone(),
        annotations: all,
        mirror: fetched.mirror.clone(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    schema_version: Option<u32>,
    media_type: Option<String>,
    config: Option<RawDescriptor>,
    layers: Option<Vec<RawDescriptor>>,
    manifests: Option<Vec<RawDescriptor>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    annotations: Option<BTreeMap<String, String>>,
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

impl RawDescriptor {
    fn layer(self) -> Layer {
        Layer {
            digest: self.digest,
            media_type: self.media_type,
            size: self.size,
            annotations: self.annotations.unwrap_or_default(),
        }
    }
}

/// Reads an OCI manifest or index, or a Docker v2 manifest or manifest list. Errors say what is wrong.
fn parse_manifest(body: &[u8]) -> Result<Manifest, String> {
    let raw: RawManifest = serde_json::from_slice(body)
        .map_err(|e| format!("the registry sent a manifest that cannot be read ({e})"))?;
    let media_type = raw.media_type.as_deref().filter(|m| !m.is_empty());
    if raw.schema_version == Some(1)
        || matches!(
            media_type,
            Some(MEDIA_TYPE_DOCKER_SCHEMA1 | MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED)
        )
    {
        return Err(
            "is a Docker schema 1 manifest, which pinboard and current runtimes do not support; \
                    push the image again with a current tool"
                .into(),
        );
    }
    if let Some(version) = raw.schema_version.filter(|v| *v != 2) {
        return Err(format!(
            "has manifest schemaVersion {version}; only 2 is supported"
        ));
    }
    let is_index = match media_type {
        Some(MEDIA_TYPE_OCI_INDEX | MEDIA_TYPE_DOCKER_MANIFEST_LIST) => true,
        Some(MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST) => false,
        Some(other) => {
            return Err(format!(
                "has media type {other}, which is not an image manifest or index"
            ));
        }
        None if raw.manifests.is_some() => true,
        None if raw.config.is_some() => false,
        None => return Err("is neither an image manifest nor an image index".into()),
    };
    if is_index {
        let entries = raw
            .manifests
            .ok_or("is an index without a \"manifests\" list")?
            .into_iter()
            .map(|d| {
                if !valid_digest(&d.digest) {
                    return Err(format!(
                        "lists a manifest with an invalid digest {:?}",
                        d.digest
                    ));
                }
                Ok(IndexEntry {
                    platform: d.platform.map(|p| Platform {
                        os: p.os,
                        architecture: p.architecture,
                        variant: p.variant.filter(|v| !v.is_empty()),
                    }),
                    media_type: d.media_type,
                    digest: d.digest,
                    size: d.size,
                    annotations: d.annotations.unwrap_or_default(),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Manifest::Index { entries })
    } else {
        let config = raw
            .config
            .ok_or("is an image manifest without a config descriptor")?
            .layer();
        let layers = raw
            .layers
            .unwrap_or_default()
            .into_iter()
            .map(RawDescriptor::layer)
            .collect();
        Ok(Manifest::Image {
            config,
            layers,
            annotations: raw.annotations.unwrap_or_default(),
        })
    }
}

fn valid_digest(digest: &str) -> bool {
    let hex = |h: &str, len: usize| {
        h.len() == len && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    match digest.split_once(':') {
        Some(("sha256", h)) => hex(h, 64),
        Some(("sha512", h)) => hex(h, 128),
        _ => false,
    }
}

fn is_image_manifest_entry(entry: &IndexEntry) -> bool {
    matches!(
        entry.media_type.as_str(),
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST | ""
    )
}

/// The index entry serving `want`: an exact variant match first, else the first entry that
/// [`Platform::accepts`], in index order.
fn select_entry<'a>(entries: &'a [IndexEntry], want: &Platform) -> Option<&'a IndexEntry> {
    let candidates = || {
        entries.iter().filter(|e| {
            is_image_manifest_entry(e) && e.platform.as_ref().is_some_and(|p| want.accepts(p))
        })
    };
    candidates()
        .find(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| p.variant == want.variant)
        })
        .or_else(|| candidates().next())
}

/// The platforms an index offers, for messages; attestation entries (`unknown/unknown`) left out.
fn available_platforms(entries: &[IndexEntry]) -> Vec<String> {
    let mut seen = Vec::new();
    for platform in entries
        .iter()
        .filter(|e| is_image_manifest_entry(e))
        .filter_map(|e| e.platform.as_ref())
    {
        let text = platform.to_string();
        if platform.os != "unknown" && !seen.contains(&text) {
            seen.push(text);
        }
    }
    seen
}

fn timeout_error(context: &Context<'_>) -> RegistryError {
    RegistryError::Timeout {
        reference: context.label.to_string(),
        registry: context.registry.to_string(),
        after: context.timeout,
    }
}

/// A registry's error answer: `{"errors": [{"code", "message", "detail"}]}`.
#[derive(Deserialize)]
struct Envelope {
    errors: Vec<EnvelopeError>,
}

#[derive(Deserialize)]
struct EnvelopeError {
    code: String,
    #[serde(default)]
    message: String,
}

/// Turns a failed request into one of our classes, with a cause a person can act on.
fn map_error(error: HttpError, context: &Context<'_>) -> RegistryError {
    let reference = context.label.to_string();
    let registry = context.registry.to_string();
    let not_found = || RegistryError::NotFound {
        reference: reference.clone(),
        registry: registry.clone(),
    };
    let unauthorized = |detail: Option<String>| RegistryError::Unauthorized {
        reference: reference.clone(),
        registry: registry.clone(),
        credentials: match detail {
            Some(detail) => format!("{}; it said: {detail}", context.credentials),
            None => context.credentials.to_string(),
        },
    };
    let rate_limited = || RegistryError::RateLimited {
        reference: reference.clone(),
        registry: registry.clone(),
    };
    let server = |cause: String| RegistryError::Server {
        reference: reference.clone(),
        registry: registry.clone(),
        cause,
    };
    match error {
        // Busy however the body puts it: the status is named, and a 429 is rate limiting.
        HttpError::Busy { status: 429, .. } => rate_limited(),
        HttpError::Busy { status, body, .. } => {
            let said = serde_json::from_str::<Envelope>(&body)
                .ok()
                .and_then(|e| e.errors.into_iter().next())
                .map_or_else(
                    || truncate(body.trim(), 200),
                    |first| format!("{}: {}", first.code, truncate(&first.message, 200)),
                );
            server(format!("HTTP {status}: {said}"))
        }
        HttpError::Status { status, body } => {
            let first = serde_json::from_str::<Envelope>(&body)
                .ok()
                .and_then(|e| e.errors.into_iter().next());
            match (status, first) {
                (_, Some(first)) => match first.code.as_str() {
                    "MANIFEST_UNKNOWN"
                    | "NOT_FOUND"
                    | "NAME_UNKNOWN"
                    | "BLOB_UNKNOWN"
                    | "MANIFEST_BLOB_UNKNOWN" => not_found(),
                    "UNAUTHORIZED" | "DENIED" => unauthorized(None),
                    "TOOMANYREQUESTS" => rate_limited(),
                    "NAME_INVALID" => RegistryError::Invalid {
                        reference,
                        cause: "the registry says the repository name is invalid".into(),
                    },
                    code => server(format!("{code}: {}", truncate(&first.message, 200))),
                },
                (404, None) => not_found(),
                (401 | 403, None) => unauthorized(None),
                (429, None) => rate_limited(),
                (400, None) if body.contains("HTTP request to an HTTPS server") => {
                    RegistryError::Unreachable {
                        reference,
                        registry: registry.clone(),
                        cause: format!(
                            "it speaks HTTPS, but {registry} is listed as a plain-HTTP (insecure) registry; \
                             remove it from --insecure-registry"
                        ),
                    }
                }
                (status, None) => server(format!("HTTP {status}: {}", truncate(body.trim(), 200))),
            }
        }
        HttpError::Token { status, body } => {
            let said = Some(truncate(body.trim(), 200)).filter(|b| !b.is_empty());
            match status {
                401 | 403 => unauthorized(said),
                status => server(format!(
                    "its token service answered HTTP {status}{}",
                    said.map(|s| format!(": {s}")).unwrap_or_default()
                )),
            }
        }
        HttpError::NotAToken(_) => {
            server("its token service answered with something that is not a token".into())
        }
        HttpError::Transport(e) if e.is_timeout() => timeout_error(context),
        HttpError::Transport(e) => RegistryError::Unreachable {
            reference,
            cause: transport_cause(&e, context),
            registry,
        },
        HttpError::ClientCertificateRequired => RegistryError::Unreachable {
            reference,
            cause: tls_cause(
                &rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                context,
            ),
            registry,
        },
        HttpError::Certs(e) => RegistryError::Certs(e),
        HttpError::Setup(cause) => RegistryError::Setup { cause },
        // Retried once with access learned from it; refused again, it is a refusal.
        HttpError::Challenged => unauthorized(None),
        // Without credentials (an anonymous token): as any refusal.
        HttpError::InsufficientScope { status, body } => {
            map_error(HttpError::Status { status, body }, context)
        }
    }
}

/// The innermost useful cause of a transport failure, with the fix where one helps: a TLS failure says
/// where the registry's CA or client certificate goes.
fn transport_cause(error: &(dyn std::error::Error + 'static), context: &Context<'_>) -> String {
    let (registry, insecure) = (context.registry, context.insecure);
    let chain: Vec<_> = super::distribution::causes(error).collect();
    let innermost = chain.last().map(|e| e.to_string()).unwrap_or_default();
    if let Some(tls) = chain.iter().find_map(|e| e.downcast_ref::<rustls::Error>()) {
        return tls_cause(tls, context);
    }
    if let Some(io) = chain
        .iter()
        .find_map(|e| e.downcast_ref::<std::io::Error>())
    {
        match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                return format!("connection refused (is a registry listening on {registry}?)");
            }
            std::io::ErrorKind::ConnectionReset if !insecure => {
                return format!(
                    "connection reset ({innermost}); if it serves plain HTTP, pass --insecure-registry {registry}"
                );
            }
            _ => {}
        }
    }
    if chain.iter().any(|e| e.to_string().starts_with("dns error")) {
        let host = registry.rsplit_once(':').map_or(registry, |(host, _)| host);
        return format!("cannot resolve host {host} ({innermost})");
    }
    truncate(&innermost, 300)
}

/// What went wrong in a TLS handshake, and where the file that fixes it goes (containers-certs.d).
fn tls_cause(tls: &rustls::Error, context: &Context<'_>) -> String {
    use rustls::AlertDescription as Alert;
    use rustls::CertificateError as Cert;
    let registry = context.registry;
    let dir = |name: &str| match context.certs.registry_dir(registry) {
        Some(dir) => dir.join(name).display().to_string(),
        None => format!("CERTS_DIR/{registry}/{name}"),
    };
    let searched = context
        .certs
        .dirs()
        .iter()
        .map(|d| d.join(registry).display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let ca_files = context
        .host
        .map(|h| h.tls.ca_files.clone())
        .unwrap_or_default();
    let client = context.host.and_then(|h| h.tls.client.as_ref());
    match tls {
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }
            if !context.insecure =>
        {
            format!(
                "TLS handshake failed ({tls}); the registry seems to speak plain HTTP: if that is intended, \
                 pass --insecure-registry {registry}"
            )
        }
        rustls::Error::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => {
            let trusted = match ca_files.as_slice() {
                [] => "the system's CAs".to_string(),
                files => format!(
                    "the system's CAs and {}",
                    files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            format!(
                "TLS handshake failed ({tls}): its certificate is not signed by a CA this machine trusts ({trusted}); \
                 put the registry's CA certificate (PEM) in {} (pinboard reads *.crt from {searched}, as podman \
                 and CRI-O do), or pass --certs-dir DIR with the CA in DIR/{registry}/ca.crt",
                dir("ca.crt")
            )
        }
        rustls::Error::InvalidCertificate(
            Cert::NotValidForName | Cert::NotValidForNameContext { .. },
        ) => format!(
            "TLS handshake failed ({tls}): its certificate does not name {registry}; the registry needs a \
             certificate for the name clients use"
        ),
        rustls::Error::AlertReceived(
            Alert::CertificateRequired | Alert::BadCertificate | Alert::HandshakeFailure,
        ) if client.is_none() => format!(
            "TLS handshake failed ({tls}): the registry asks for a client certificate; put it and its key in \
             {} and {} (pinboard reads *.cert with *.key from {searched})",
            dir("client.cert"),
            dir("client.key")
        ),
        rustls::Error::AlertReceived(_) if client.is_some() => format!(
            "TLS handshake failed ({tls}): the registry refused the client certificate {}; check that the \
             registry trusts its CA and that it has not expired",
            client
                .map(|c| c.cert.display().to_string())
                .unwrap_or_default()
        ),
        _ => format!("TLS handshake failed ({tls})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::image::{ANNOTATION_ESTARGZ_TOC, LazyFormat};

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
    const D4: &str = "sha256:4444444444444444444444444444444444444444444444444444444444444444";

    fn platform(text: &str) -> Platform {
        Platform::parse(text).unwrap()
    }

    fn index(entries: &[(&str, &str, &str)]) -> Vec<IndexEntry> {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(media_type, digest, platform)| {
                let parts: Vec<&str> = platform.split('/').collect();
                let mut p = serde_json::json!({"os": parts[0], "architecture": parts[1]});
                if let Some(v) = parts.get(2) {
                    p["variant"] = serde_json::json!(v);
                }
                serde_json::json!({"mediaType": media_type, "digest": digest, "size": 500, "platform": p})
            })
            .collect();
        let body = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": manifests});
        match parse_manifest(body.to_string().as_bytes()).unwrap() {
            Manifest::Index { entries } => entries,
            other => panic!("not an index: {other:?}"),
        }
    }

    #[test]
    fn parses_an_oci_manifest_with_sizes_and_annotations() {
        let body = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": D1, "size": 1234},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D2, "size": 5_000_000_000u64},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D3, "size": 77,
                 "annotations": {ANNOTATION_ESTARGZ_TOC: D4}}
            ],
            "annotations": {"org.opencontainers.image.title": "web"}
        });
        let Manifest::Image {
            config,
            layers,
            annotations,
        } = parse_manifest(body.to_string().as_bytes()).unwrap()
        else {
            panic!("not an image manifest")
        };
        assert_eq!((config.digest.as_str(), config.size), (D1, 1234));
        assert_eq!(
            layers.iter().map(|l| l.size).collect::<Vec<_>>(),
            [5_000_000_000, 77]
        );
        assert_eq!(layers[1].annotations[ANNOTATION_ESTARGZ_TOC], D4);
        assert_eq!(annotations["org.opencontainers.image.title"], "web");
        let fetched = Fetched {
            digest: D4.into(),
            size: 300,
            manifest: Manifest::Image {
                config,
                layers,
                annotations,
            },
            body: Bytes::from(body.to_string()),
            media_type: MEDIA_TYPE_OCI_MANIFEST.into(),
            mirror: None,
        };
        let facts = image_facts(&fetched, None);
        assert_eq!(facts.lazy_format(), LazyFormat::Estargz);
        assert_eq!(facts.compressed_layer_bytes(), 5_000_000_077);
        assert_eq!((facts.index_digest, facts.platform), (None, None));
    }

    #[test]
    fn media_types_decide_the_kind_and_old_or_foreign_ones_are_refused() {
        let config = serde_json::json!({"mediaType": "application/vnd.docker.container.image.v1+json", "digest": D1, "size": 1});
        let docker = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST, "config": config, "layers": []});
        assert!(matches!(
            parse_manifest(docker.to_string().as_bytes()),
            Ok(Manifest::Image { .. })
        ));
        // OCI allows leaving mediaType out; the fields tell.
        let bare = serde_json::json!({"schemaVersion": 2, "config": config, "layers": []});
        assert!(matches!(
            parse_manifest(bare.to_string().as_bytes()),
            Ok(Manifest::Image { .. })
        ));
        let bare_index = serde_json::json!({"schemaVersion": 2, "manifests": []});
        assert!(matches!(
            parse_manifest(bare_index.to_string().as_bytes()),
            Ok(Manifest::Index { .. })
        ));
        let list = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST_LIST, "manifests": [
            {"mediaType": MEDIA_TYPE_DOCKER_MANIFEST, "digest": D2, "size": 10,
             "platform": {"os": "linux", "architecture": "arm", "variant": "v7", "features": ["x"]}}]});
        let Ok(Manifest::Index { entries }) = parse_manifest(list.to_string().as_bytes()) else {
            panic!()
        };
        assert_eq!(entries[0].platform, Some(platform("linux/arm/v7")));

        let schema1 = serde_json::json!({"schemaVersion": 1, "name": "x", "fsLayers": []});
        assert!(
            parse_manifest(schema1.to_string().as_bytes())
                .unwrap_err()
                .contains("schema 1")
        );
        let artifact = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.chart", "config": config});
        assert!(
            parse_manifest(artifact.to_string().as_bytes())
                .unwrap_err()
                .contains("application/vnd.cncf.helm.chart")
        );
        let negative = serde_json::json!({"schemaVersion": 2, "config": {"mediaType": "x", "digest": D1, "size": -1}});
        assert!(parse_manifest(negative.to_string().as_bytes()).is_err());
        let bad_entry = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": "sha256:../../x", "size": 1}]});
        assert!(
            parse_manifest(bad_entry.to_string().as_bytes())
                .unwrap_err()
                .contains("invalid digest")
        );
        assert!(
            parse_manifest(b"<html>")
                .unwrap_err()
                .contains("cannot be read")
        );
    }

    #[test]
    fn index_resolves_per_platform_preferring_exact_variants() {
        let entries = index(&[
            (MEDIA_TYPE_OCI_MANIFEST, D1, "linux/amd64"),
            (MEDIA_TYPE_OCI_MANIFEST, D2, "linux/arm64"),
            (MEDIA_TYPE_OCI_MANIFEST, D3, "linux/arm64/v8"),
            (MEDIA_TYPE_OCI_MANIFEST, D4, "unknown/unknown"),
        ]);
        let pick = |p: &str| select_entry(&entries, &platform(p)).map(|e| e.digest.as_str());
        assert_eq!(pick("linux/amd64"), Some(D1));
        assert_eq!(pick("linux/arm64/v8"), Some(D3));
        assert_eq!(pick("linux/arm64"), Some(D2));
        assert_eq!(pick("linux/s390x"), None);
        assert_eq!(pick("windows/amd64"), None);
        assert_eq!(
            available_platforms(&entries),
            ["linux/amd64", "linux/arm64", "linux/arm64/v8"]
        );
        // Entries that are not image manifests (nested indexes, artifacts) are not candidates.
        let nested = index(&[(MEDIA_TYPE_OCI_INDEX, D1, "linux/amd64")]);
        assert_eq!(select_entry(&nested, &platform("linux/amd64")), None);
    }

    #[test]
    fn digests_are_verified_with_the_reference_algorithm() {
        let body = b"{}";
        let sha256 = format!("sha256:{:x}", sha2::Sha256::digest(body));
        assert_eq!(content_digest(body, D1), Some(sha256.clone()));
        assert_eq!(
            sha256, "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "known sha256 of {{}}"
        );
        assert!(
            content_digest(body, "sha512:00")
                .unwrap()
                .starts_with("sha512:")
        );
        assert_eq!(content_digest(body, "md5:00"), None);
        assert!(valid_digest(D1) && !valid_digest("sha256:ABC") && !valid_digest("D1"));
    }

    #[test]
    fn insecure_registry_names_are_normalized_as_references_spell_them() {
        assert_eq!(
            normalize_registry("http://127.0.0.1:5000/"),
            "127.0.0.1:5000"
        );
        assert_eq!(normalize_registry(" registry.local "), "registry.local");
        assert_eq!(normalize_registry("index.docker.io"), "docker.io");
    }

    fn context(certs: &CertDirs) -> Context<'_> {
        Context {
            label: "127.0.0.1:5000/app/web@sha256:11",
            registry: "127.0.0.1:5000",
            insecure: false,
            credentials: "no credentials found for it",
            timeout: Duration::from_secs(30),
            certs,
            host: None,
        }
    }

    fn envelope(code: &str) -> HttpError {
        HttpError::Status {
            status: 400,
            body: serde_json::json!({"errors": [{"code": code, "message": "some message", "detail": null}]})
                .to_string(),
        }
    }

    #[test]
    fn registry_answers_map_to_classes_with_clear_messages() {
        let certs = CertDirs::only(vec!["/etc/containers/certs.d".into()]);
        let ctx = context(&certs);
        let e = map_error(envelope("MANIFEST_UNKNOWN"), &ctx);
        assert_eq!(e.kind(), "not-found");
        assert_eq!(
            e.to_string(),
            "manifest 127.0.0.1:5000/app/web@sha256:11 does not exist in registry 127.0.0.1:5000"
        );
        assert_eq!(
            map_error(envelope("NAME_UNKNOWN"), &ctx).kind(),
            "not-found"
        );
        let e = map_error(envelope("DENIED"), &ctx);
        assert_eq!(
            e.to_string(),
            "registry 127.0.0.1:5000 refused access to 127.0.0.1:5000/app/web@sha256:11 (no credentials found for it); \
             log in with `podman login 127.0.0.1:5000` or `docker login 127.0.0.1:5000`, or pass --authfile"
        );
        assert_eq!(
            map_error(envelope("UNAUTHORIZED"), &ctx).kind(),
            "unauthorized"
        );
        assert_eq!(
            map_error(envelope("TOOMANYREQUESTS"), &ctx).kind(),
            "rate-limited"
        );
        let e = map_error(envelope("ARTIFACT_LOCKED"), &ctx);
        assert_eq!(
            e.to_string(),
            "registry 127.0.0.1:5000 failed for 127.0.0.1:5000/app/web@sha256:11: ARTIFACT_LOCKED: some message"
        );

        let status = |status: u16, body: &str| HttpError::Status {
            status,
            body: body.into(),
        };
        assert_eq!(
            map_error(status(404, "404 page not found"), &ctx).kind(),
            "not-found"
        );
        assert_eq!(map_error(status(403, ""), &ctx).kind(), "unauthorized");
        assert_eq!(map_error(status(429, ""), &ctx).kind(), "rate-limited");
        let e = map_error(status(503, "upstream down\n"), &ctx);
        assert!(e.is_transient());
        assert!(e.to_string().ends_with("HTTP 503: upstream down"), "{e}");
        let busy = |status: u16, body: &str| HttpError::Busy {
            status,
            body: body.into(),
            retry_after: None,
        };
        let unavailable = r#"{"errors":[{"code":"UNAVAILABLE","message":"back soon"}]}"#;
        let e = map_error(busy(503, unavailable), &ctx);
        assert!(e.is_transient());
        assert!(
            e.to_string().ends_with("HTTP 503: UNAVAILABLE: back soon"),
            "{e}"
        );
        assert_eq!(
            map_error(busy(429, unavailable), &ctx).kind(),
            "rate-limited"
        );
        let e = map_error(
            status(400, "Client sent an HTTP request to an HTTPS server.\n"),
            &ctx,
        );
        assert_eq!(e.kind(), "unreachable");
        assert!(
            e.to_string().contains("remove it from --insecure-registry"),
            "{e}"
        );

        // The token service's refusal is the registry's refusal, with what it said.
        let e = map_error(
            HttpError::Token {
                status: 401,
                body: "{\"details\":\"incorrect username or password\"}".into(),
            },
            &ctx,
        );
        assert_eq!(e.kind(), "unauthorized");
        assert!(
            e.to_string()
                .contains("it said: {\"details\":\"incorrect username or password\"}"),
            "{e}"
        );
        let e = map_error(
            HttpError::Token {
                status: 500,
                body: String::new(),
            },
            &ctx,
        );
        assert!(
            e.is_transient()
                && e.to_string()
                    .ends_with("its token service answered HTTP 500"),
            "{e}"
        );
        let e = map_error(HttpError::NotAToken("eof".into()), &ctx);
        assert!(
            e.to_string()
                .ends_with("answered with something that is not a token"),
            "{e}"
        );
    }

    #[test]
    fn tls_failures_say_where_the_ca_or_client_certificate_goes() {
        let certs = CertDirs::only(vec!["/site/certs.d".into(), "/etc/docker/certs.d".into()]);
        let ctx = context(&certs);
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(
            tls_cause(&unknown, &ctx),
            "TLS handshake failed (invalid peer certificate: UnknownIssuer): its certificate is not signed by a \
             CA this machine trusts (the system's CAs); put the registry's CA certificate (PEM) in \
             /site/certs.d/127.0.0.1:5000/ca.crt (pinboard reads *.crt from /site/certs.d/127.0.0.1:5000, \
             /etc/docker/certs.d/127.0.0.1:5000, as podman and CRI-O do), or pass --certs-dir DIR with the CA \
             in DIR/127.0.0.1:5000/ca.crt"
        );
        let required = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert!(
            tls_cause(&required, &ctx).ends_with(
                "the registry asks for a client certificate; put it and its key in \
                 /site/certs.d/127.0.0.1:5000/client.cert and /site/certs.d/127.0.0.1:5000/client.key \
                 (pinboard reads *.cert with *.key from /site/certs.d/127.0.0.1:5000, \
                 /etc/docker/certs.d/127.0.0.1:5000)"
            ),
            "{}",
            tls_cause(&required, &ctx)
        );
        let name = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert!(tls_cause(&name, &ctx).contains("its certificate does not name 127.0.0.1:5000"));
        let plain = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        assert!(tls_cause(&plain, &ctx).ends_with("pass --insecure-registry 127.0.0.1:5000"));
    }

    #[test]
    fn other_messages_read_well() {
        let e = RegistryError::NoPlatform {
            reference: "quay.io/a/b@sha256:11".into(),
            platform: platform("linux/s390x"),
            available: vec!["linux/amd64".into(), "linux/arm64".into()],
        };
        assert_eq!(
            e.to_string(),
            "quay.io/a/b@sha256:11 has no image for platform linux/s390x; its index offers linux/amd64, linux/arm64"
        );
        let e = RegistryError::Timeout {
            reference: "r".into(),
            registry: "quay.io".into(),
            after: Duration::from_millis(2500),
        };
        assert_eq!(
            e.to_string(),
            "registry quay.io did not answer within 2.5s for r; retry, or raise the timeout"
        );
        let e = e.for_reference("other");
        assert_eq!(e.reference(), Some("other"));
    }

    #[test]
    fn manifests_without_a_media_type_get_the_oci_one_of_their_kind() {
        let bare_index = br#"{"schemaVersion": 2, "manifests": []}"#;
        let parsed = parse_manifest(bare_index).unwrap();
        assert_eq!(media_type(bare_index, &parsed), MEDIA_TYPE_OCI_INDEX);
        let docker =
            serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST,
            "config": {"mediaType": "x", "digest": D1, "size": 1}, "layers": []})
            .to_string();
        let parsed = parse_manifest(docker.as_bytes()).unwrap();
        assert_eq!(
            media_type(docker.as_bytes(), &parsed),
            MEDIA_TYPE_DOCKER_MANIFEST
        );
    }

    fn headers(pairs: &[(http::HeaderName, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (name.clone(), value.parse().unwrap()))
            .collect()
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let after = |value: &str| retry_after(&headers(&[(http::header::RETRY_AFTER, value)]), now);
        assert_eq!(after("7"), Some(Duration::from_secs(7)));
        assert_eq!(after(" 0 "), Some(Duration::ZERO));
        let in_ten = httpdate::fmt_http_date(now + Duration::from_secs(10));
        assert_eq!(after(&in_ten), Some(Duration::from_secs(10)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(10));
        assert_eq!(after(&past), Some(Duration::ZERO));
        assert_eq!(after("soon"), None);
        assert_eq!(retry_after(&http::HeaderMap::new(), now), None);
    }

    #[test]
    fn content_range_gives_where_a_partial_body_starts() {
        let start =
            |value: &str| content_range_start(&headers(&[(http::header::CONTENT_RANGE, value)]));
        assert_eq!(start("bytes 1048576-4194303/4194304"), Some(1_048_576));
        assert_eq!(start("bytes 0-0/1"), Some(0));
        assert_eq!(start("bytes */4194304"), None);
        assert_eq!(start("items 1-2/3"), None);
    }

    #[test]
    fn blob_statuses_map_like_manifest_statuses_and_other_client_errors_are_final() {
        let certs = CertDirs::only(Vec::new());
        let ctx = context(&certs);
        let error = |status: u16, body: &str| {
            blob_error(
                http::StatusCode::from_u16(status).unwrap(),
                body.as_bytes(),
                &ctx,
            )
        };
        assert_eq!(
            error(
                404,
                r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#
            )
            .kind(),
            "not-found"
        );
        assert_eq!(error(401, "").kind(), "unauthorized");
        assert_eq!(error(429, "slow down").kind(), "rate-limited");
        let unavailable = error(503, "maintenance");
        assert!(unavailable.is_transient());
        assert!(
            unavailable.to_string().ends_with("HTTP 503: maintenance"),
            "{unavailable}"
        );
        assert!(!error(416, "").is_transient(), "final");
        assert!(error(408, "").is_transient());
        let busy = r#"{"errors":[{"code":"SLOW_DOWN","message":"busy"}]}"#;
        assert!(error(429, busy).is_transient(), "whatever the body says");
    }
}

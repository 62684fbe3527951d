//! Registry credentials, read from the auth files administrators already have (podman's, docker's,
//! the kubelet's), so pinboard needs no login of its own.
//!
//! Files are searched the way containers-auth.json(5) describes: an explicit `--authfile` is the only file
//! consulted; otherwise `$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$XDG_CONFIG_HOME/containers/auth.json`, `$DOCKER_CONFIG/config.json` (or `~/.docker/config.json`) and
//! `/var/lib/kubelet/config.json`, and the first file with an entry for the registry wins. All use docker's
//! config format; keys are matched by host and, when they carry a path, by the longest path prefix of the
//! repository. `credHelpers` and `credsStore` run a `docker-credential-*` helper through the
//! `docker_credential` crate. An entry holds a user and password (`auth`, or `username` and `password`), an
//! `identitytoken` (an OAuth2 refresh token) or a `registrytoken` (a bearer token for the registry itself).
//! [`Credential::to_cri_auth`] is what a node is handed for a pull. Secrets never reach Debug, Display, logs
//! or errors.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::proto::cri::AuthConfig;
use super::truncate;

/// Docker Hub's canonical host, as image references spell it.
const DOCKER_HUB: &str = "docker.io";
/// The server address docker and its credential stores use for Docker Hub.
const DOCKER_HUB_SERVER: &str = "https://index.docker.io/v1/";
/// Where the kubelet reads pull secrets configured on the node.
pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.json";

/// How to authenticate to one registry. Debug and Display never show a secret.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credential {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    /// An identity token: an OAuth2 refresh token, as `docker login` stores for some registries (ACR, ECR,
    /// Artifactory), exchanged at the registry's token service for access tokens.
    IdentityToken(String),
    /// A registry token: a bearer token sent to the registry as it is.
    RegistryToken(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Anonymous => f.write_str("Anonymous"),
            Credential::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &format_args!("<redacted>"))
                .finish(),
            Credential::IdentityToken(_) => f
                .debug_tuple("IdentityToken")
                .field(&format_args!("<redacted>"))
                .finish(),
            Credential::RegistryToken(_) => f
                .debug_tuple("RegistryToken")
                .field(&format_args!("<redacted>"))
                .finish(),
        }
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Anonymous => f.write_str("anonymous"),
            Credential::Basic { username, .. } => write!(f, "user {username:?}"),
            Credential::IdentityToken(_) => f.write_str("identity token"),
            Credential::RegistryToken(_) => f.write_str("registry token"),
        }
    }
}

impl Credential {
    /// What a node's runtime is handed with CRI `PullImage` (None: anonymous). `server_address` stays
    /// empty: the credential is already the one for this image's registry and repository, and containerd
    /// (1.6 to 2.x) parses a set `server_address` as a URL and compares its host with the registry's, so a
    /// bare `host:port` fails to parse and a bare `host` never matches (it then pulls anonymously). CRI-O
    /// ignores the field. containerd uses user/password and the identity token (as an OAuth2 refresh
    /// token); CRI-O only user/password; neither uses `registry_token` yet, which is sent for runtimes
    /// that do.
    pub fn to_cri_auth(&self) -> Option<AuthConfig> {
        match self {
            Credential::Anonymous => None,
            Credential::Basic { username, password } => Some(AuthConfig {
                username: username.clone(),
                password: password.clone(),
                ..AuthConfig::default()
            }),
            Credential::IdentityToken(token) => Some(AuthConfig {
                identity_token: token.clone(),
                ..AuthConfig::default()
            }),
            Credential::RegistryToken(token) => Some(AuthConfig {
                registry_token: token.clone(),
                ..AuthConfig::default()
            }),
        }
    }
}

/// Where a credential came from, for messages ("the credentials from /root/.docker/config.json").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// An `auths` entry: the file and the entry's key as written there.
    File { path: PathBuf, key: String },
    /// A credential helper named by `credHelpers` or `credsStore` in `path`.
    Helper { helper: String, path: PathBuf },
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::File { path, key } => {
                write!(f, "entry {key:?} of {}", path.display())
            }
            CredentialSource::Helper { helper, path } => {
                write!(
                    f,
                    "credential helper docker-credential-{helper} (named in {})",
                    path.display()
                )
            }
        }
    }
}

/// A credential found for a registry, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub credential: Credential,
    pub source: CredentialSource,
}

/// What went wrong reading credentials. Each message names the file, the problem and the fix, and never
/// contains a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read auth file {}: {cause}; fix the path or its permissions", path.display())]
    Unreadable { path: PathBuf, cause: String },
    #[error("auth file {} is not valid JSON at line {line}: {cause}; fix or remove it, or pass --authfile", path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        cause: String,
    },
    #[error(
        "auth file {}: the entry {key:?} {problem}; log in again with podman login / docker login, or fix it by hand",
        path.display()
    )]
    BadEntry {
        path: PathBuf,
        key: String,
        problem: EntryProblem,
    },
    #[error(
        "credential helper docker-credential-{helper} (named in {}) failed for {server}: {cause}",
        path.display()
    )]
    Helper {
        helper: String,
        path: PathBuf,
        server: String,
        cause: String,
    },
}

/// What is wrong with an auth file's entry, said without quoting any of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryProblem {
    #[error("has an \"auth\" value that is not valid base64")]
    AuthNotBase64,
    #[error("has an \"auth\" value that is not UTF-8 text")]
    AuthNotUtf8,
    #[error("has an \"auth\" value that does not decode to user:password")]
    AuthNotUserPassword,
    #[error("has an \"auth\" value with an empty user name")]
    AuthEmptyUser,
    #[error("has no credentials")]
    NoCredentials,
}

/// Which files to read, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthFiles {
    /// `--authfile`: when set, the only file consulted, and it must exist and parse.
    pub explicit: Option<PathBuf>,
    /// The default chain; a missing file is skipped.
    pub defaults: Vec<PathBuf>,
}

impl AuthFiles {
    /// `--authfile FILE` when given, else the default chain from the environment.
    pub fn from_env(authfile: Option<PathBuf>) -> Self {
        Self::from_vars(authfile, |name| std::env::var_os(name))
    }

    /// Just these default files (tests, or a caller with its own idea of the chain).
    pub fn defaults(defaults: Vec<PathBuf>) -> Self {
        AuthFiles {
            explicit: None,
            defaults,
        }
    }

    /// Only this file.
    pub fn explicit(path: impl Into<PathBuf>) -> Self {
        AuthFiles {
            explicit: Some(path.into()),
            defaults: Vec::new(),
        }
    }

    fn from_vars(authfile: Option<PathBuf>, var: impl Fn(&str) -> Option<OsString>) -> Self {
        if authfile.is_some() {
            return AuthFiles {
                explicit: authfile,
                defaults: Vec::new(),
            };
        }
        let var = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = var("HOME");
        let mut defaults = Vec::new();
        defaults.extend(var("REGISTRY_AUTH_FILE"));
        defaults.extend(var("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
        defaults.extend(
            var("XDG_CONFIG_HOME")
                .or_else(|| home.as_ref().map(|h| h.join(".config")))
                .map(|d| d.join("containers/auth.json")),
        );
        defaults.extend(
            var("DOCKER_CONFIG")
                .or_else(|| home.as_ref().map(|h| h.join(".docker")))
                .map(|d| d.join("config.json")),
        );
        defaults.push(PathBuf::from(KUBELET_CONFIG));
        let mut seen = Vec::new();
        defaults.retain(|p| {
            let new = !seen.contains(p);
            seen.push(p.clone());
            new
        });
        AuthFiles {
            explicit: None,
            defaults,
        }
    }

    /// Every file, in the order consulted.
    pub fn paths(&self) -> Vec<&Path> {
        match &self.explicit {
            Some(path) => vec![path.as_path()],
            None => self.defaults.iter().map(PathBuf::as_path).collect(),
        }
    }
}

/// The parsed auth files, ready for lookups. Parse errors surface when loading; an entry's own errors
/// (bad base64, a failing helper) only when that entry is the one chosen.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    files: Vec<AuthFile>,
}

#[derive(Clone)]
struct AuthFile {
    path: PathBuf,
    /// (normalized key, key as written, entry)
    auths: Vec<(Key, String, RawAuth)>,
    /// (normalized host, helper name)
    cred_helpers: Vec<(String, String)>,
    creds_store: Option<String>,
}

impl fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthFile")
            .field("path", &self.path)
            .field(
                "keys",
                &self
                    .auths
                    .iter()
                    .map(|(_, written, _)| written)
                    .collect::<Vec<_>>(),
            )
            .field("cred_helpers", &self.cred_helpers)
            .field("creds_store", &self.creds_store)
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    host: String,
    /// Path below the host, without slashes at either end; empty for a bare host.
    path: String,
}

#[derive(Clone, Default, Deserialize)]
struct RawAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
    registrytoken: Option<String>,
}

#[derive(Default, Deserialize)]
struct RawConfig {
    auths: Option<HashMap<String, RawAuth>>,
    #[serde(rename = "credHelpers")]
    cred_helpers: Option<HashMap<String, String>>,
    #[serde(rename = "credsStore")]
    creds_store: Option<String>,
}

impl Credentials {
    /// No files: every registry is accessed anonymously.
    pub fn none() -> Self {
        Credentials::default()
    }

    /// Reads and parses the files. A missing default file is skipped, as is (with a warning in the log) one
    /// that cannot be read, like the kubelet's root-only file for a non-root user. An explicit file that is
    /// missing or unreadable, and any file that is not valid JSON, is an error naming the file.
    pub fn load(files: &AuthFiles) -> Result<Self, CredentialsError> {
        let mut loaded = Vec::new();
        for path in files.paths() {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if files.explicit.is_none() && e.kind() == io::ErrorKind::NotFound => {
                    continue;
                }
                Err(e) if files.explicit.is_none() => {
                    tracing::warn!(
                        "{}: cannot read this auth file ({e}), so its credentials are not used; make it \
                         readable, or pass --authfile FILE",
                        path.display()
                    );
                    continue;
                }
                Err(e) => {
                    return Err(CredentialsError::Unreadable {
                        path: path.to_owned(),
                        cause: e.to_string(),
                    });
                }
            };
            loaded.push(AuthFile::parse(path, &text)?);
        }
        tracing::debug!(files = ?loaded.iter().map(|f| f.path.display().to_string()).collect::<Vec<_>>(), "auth files loaded");
        Ok(Credentials { files: loaded })
    }

    /// Parses one file's text, as if read from `path` (tests, or text from elsewhere).
    pub fn from_text(path: impl Into<PathBuf>, text: &str) -> Result<Self, CredentialsError> {
        Ok(Credentials {
            files: vec![AuthFile::parse(&path.into(), text)?],
        })
    }

    /// These credentials, then `rest`'s for registries these have none for.
    pub fn then(mut self, rest: Credentials) -> Credentials {
        self.files.extend(rest.files);
        self
    }

    /// The files that were read, in order.
    pub fn files(&self) -> Vec<&Path> {
        self.files.iter().map(|f| f.path.as_path()).collect()
    }

    /// The credential for `repository` on `registry` (as an image reference spells them, e.g. `quay.io` and
    /// `org/app`), or `None` for anonymous access. May run a credential helper: this blocks, so call it from
    /// a blocking context (`tokio::task::spawn_blocking`).
    pub fn lookup(
        &self,
        registry: &str,
        repository: &str,
    ) -> Result<Option<Found>, CredentialsError> {
        let host = normalize_host(registry);
        let repository = repository.trim_matches('/');
        for file in &self.files {
            if let Some(found) = file.lookup(&host, repository)? {
                tracing::debug!(registry, repository, source = %found.source, credential = %found.credential, "credential found");
                return Ok(Some(found));
            }
        }
        tracing::debug!(registry, repository, "no credential found; anonymous");
        Ok(None)
    }
}

impl AuthFile {
    fn parse(path: &Path, text: &str) -> Result<AuthFile, CredentialsError> {
        let config: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_json::from_str(text).map_err(|e| malformed(path, &e))?
        };
        let mut auths: Vec<(Key, String, RawAuth)> = config
            .auths
            .unwrap_or_default()
            .into_iter()
            .map(|(written, entry)| (normalize_key(&written), written, entry))
            .collect();
        // HashMap order is random; keep lookups deterministic when two keys normalize alike.
        auths.sort_by(|a, b| a.1.cmp(&b.1));
        let mut cred_helpers: Vec<(String, String)> = config
            .cred_helpers
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, helper)| !helper.is_empty())
            .map(|(key, helper)| (normalize_key(&key).host, helper))
            .collect();
        cred_helpers.sort();
        let creds_store = config.creds_store.filter(|s| !s.is_empty());
        Ok(AuthFile {
            path: path.to_owned(),
            auths,
            cred_helpers,
            creds_store,
        })
    }

    /// In one file: a `credHelpers` entry for the host, else the most specific `auths` entry with
    /// credentials, else `credsStore`.
    fn lookup(&self, host: &str, repository: &str) -> Result<Option<Found>, CredentialsError> {
        if let Some((_, helper)) = self.cred_helpers.iter().find(|(h, _)| h == host) {
            return self.ask_helper(helper, host);
        }
        let best = self
            .auths
            .iter()
            .filter(|(key, _, entry)| key.matches(host, repository) && entry.has_credentials())
            .max_by_key(|(key, _, _)| key.path.len());
        if let Some((_, written, entry)) = best {
            let credential = entry
                .decode()
                .map_err(|problem| CredentialsError::BadEntry {
                    path: self.path.clone(),
                    key: written.clone(),
                    problem,
                })?;
            return Ok(Some(Found {
                credential,
                source: CredentialSource::File {
                    path: self.path.clone(),
                    key: written.clone(),
                },
            }));
        }
        match &self.creds_store {
            Some(store) => self.ask_helper(store, host),
            None => Ok(None),
        }
    }

    fn ask_helper(&self, helper: &str, host: &str) -> Result<Option<Found>, CredentialsError> {
        let server = if host == DOCKER_HUB {
            DOCKER_HUB_SERVER
        } else {
            host
        };
        // docker_credential reads a config and runs the helper it names; give it just the helper.
        let config = serde_json::json!({ "credsStore": helper }).to_string();
        let error = |cause: String| CredentialsError::Helper {
            helper: helper.to_string(),
            path: self.path.clone(),
            server: server.to_string(),
            cause,
        };
        use docker_credential::{CredentialRetrievalError as E, DockerCredential};
        let credential = match docker_credential::get_credential_from_reader(
            config.as_bytes(),
            server,
        ) {
            Ok(DockerCredential::UsernamePassword(username, password)) if username == "<token>" => {
                Credential::IdentityToken(password)
            }
            Ok(DockerCredential::UsernamePassword(username, password)) => {
                Credential::Basic { username, password }
            }
            Ok(DockerCredential::IdentityToken(token)) => Credential::IdentityToken(token),
            // The helper's way of saying "no entry": move on to the next file.
            Err(E::HelperFailure { stdout, stderr, .. })
                if format!("{stdout}{stderr}")
                    .to_ascii_lowercase()
                    .contains("credentials not found") =>
            {
                return Ok(None);
            }
            // stdout may hold a partial secret; only stderr's first line is shown.
            Err(E::HelperFailure { stderr, .. }) => {
                let first = stderr
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no message");
                return Err(error(format!(
                    "it exited with an error ({}); run `docker-credential-{helper} get` to see why, or remove it from the file",
                    truncate(first.trim(), 200)
                )));
            }
            Err(E::HelperCommunicationError) => {
                return Err(error(format!(
                    "it could not be run; install docker-credential-{helper} on PATH or remove it from the file"
                )));
            }
            Err(E::MalformedHelperResponse) | Err(E::CredentialDecodingError) => {
                return Err(error(
                    "its answer could not be read; check the helper's version".into(),
                ));
            }
            Err(other) => return Err(error(other.to_string())),
        };
        Ok(Some(Found {
            credential,
            source: CredentialSource::Helper {
                helper: helper.to_string(),
                path: self.path.clone(),
            },
        }))
    }
}

impl RawAuth {
    fn has_credentials(&self) -> bool {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        set(&self.auth)
            || set(&self.identitytoken)
            || set(&self.registrytoken)
            || (set(&self.username) && set(&self.password))
    }

    /// The credential this entry holds. Errors describe the problem without quoting any of it.
    fn decode(&self) -> Result<Credential, EntryProblem> {
        let set = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        if let Some(token) = set(&self.identitytoken) {
            return Ok(Credential::IdentityToken(token));
        }
        if let Some(token) = set(&self.registrytoken) {
            return Ok(Credential::RegistryToken(token));
        }
        if let Some(auth) = set(&self.auth) {
            let engine = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            );
            let bytes = engine
                .decode(auth.trim())
                .map_err(|_| EntryProblem::AuthNotBase64)?;
            let text = String::from_utf8(bytes).map_err(|_| EntryProblem::AuthNotUtf8)?;
            let (username, password) = text
                .split_once(':')
                .ok_or(EntryProblem::AuthNotUserPassword)?;
            if username.is_empty() {
                return Err(EntryProblem::AuthEmptyUser);
            }
            return Ok(Credential::Basic {
                username: username.to_string(),
                password: password.to_string(),
            });
        }
        match (set(&self.username), set(&self.password)) {
            (Some(username), Some(password)) => Ok(Credential::Basic { username, password }),
            _ => Err(EntryProblem::NoCredentials),
        }
    }
}

impl Key {
    fn matches(&self, host: &str, repository: &str) -> bool {
        self.host == host
            && (self.path.is_empty()
                || repository == self.path
                || repository
                    .strip_prefix(self.path.as_str())
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

/// One spelling per registry host: lower case, Docker Hub's aliases folded into `docker.io`.
fn normalize_host(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            DOCKER_HUB.to_string()
        }
        _ => host,
    }
}

/// `https://index.docker.io/v1/` (a URL: the path is an API version, ignored), `quay.io`, `quay.io/org/app`.
fn normalize_key(key: &str) -> Key {
    let key = key.trim();
    let (rest, is_url) = match key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
    {
        Some(rest) => (rest, true),
        None => (key, false),
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Key {
        host: normalize_host(host),
        path: if is_url {
            String::new()
        } else {
            path.trim_matches('/').to_string()
        },
    }
}

/// A JSON error without serde's quoting of the offending value (which may be a secret).
fn malformed(path: &Path, e: &serde_json::Error) -> CredentialsError {
    use serde_json::error::Category;
    let cause = match e.classify() {
        Category::Data => format!(
            "unexpected structure at column {} (expected {{\"auths\": {{\"HOST\": {{\"auth\": \"BASE64\"}}}}}})",
            e.column()
        ),
        Category::Eof => "the file ends too early".to_string(),
        Category::Syntax | Category::Io => {
            let text = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = text.strip_suffix(&suffix).unwrap_or(&text);
            format!("{message} at column {}", e.column())
        }
    };
    CredentialsError::Malformed {
        path: path.to_owned(),
        line: e.line(),
        cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};

    fn basic(username: &str, password: &str) -> Credential {
        Credential::Basic {
            username: username.into(),
            password: password.into(),
        }
    }

    fn auth(user_pass: &str) -> String {
        STANDARD.encode(user_pass)
    }

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn cred(credentials: &Credentials, registry: &str, repository: &str) -> Option<Credential> {
        credentials
            .lookup(registry, repository)
            .unwrap()
            .map(|f| f.credential)
    }

    #[test]
    fn default_chain_follows_the_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let files = AuthFiles::from_vars(
            None,
            env(&[
                ("REGISTRY_AUTH_FILE", "/etc/auth.json"),
                ("XDG_RUNTIME_DIR", "/run/user/0"),
                ("HOME", "/root"),
                ("DOCKER_CONFIG", "/opt/docker"),
            ]),
        );
        assert_eq!(
            files.paths(),
            [
                Path::new("/etc/auth.json"),
                Path::new("/run/user/0/containers/auth.json"),
                Path::new("/root/.config/containers/auth.json"),
                Path::new("/opt/docker/config.json"),
                Path::new(KUBELET_CONFIG),
            ]
        );
        let files = AuthFiles::from_vars(
            None,
            env(&[("HOME", "/home/a"), ("XDG_CONFIG_HOME", "/cfg")]),
        );
        assert_eq!(
            files.paths(),
            [
                Path::new("/cfg/containers/auth.json"),
                Path::new("/home/a/.docker/config.json"),
                Path::new(KUBELET_CONFIG)
            ]
        );
        // --authfile replaces the chain.
        let files = AuthFiles::from_vars(Some("/x/auth.json".into()), env(&[("HOME", "/root")]));
        assert_eq!(files.paths(), [Path::new("/x/auth.json")]);
    }

    #[test]
    fn first_file_with_an_entry_wins() {
        let dir = tempfile::tempdir().unwrap();
        let first = write(
            &dir,
            "first.json",
            &format!(
                r#"{{"auths": {{"quay.io": {{"auth": "{}"}}}}}}"#,
                auth("q1:p1")
            ),
        );
        let second = write(
            &dir,
            "second.json",
            &format!(
                r#"{{"auths": {{"quay.io": {{"auth": "{}"}}, "registry.example.com:5000": {{"username": "e", "password": "pe"}}}}}}"#,
                auth("q2:p2")
            ),
        );
        let missing = dir.path().join("missing.json");
        let credentials = Credentials::load(&AuthFiles::defaults(vec![
            missing,
            first.clone(),
            second.clone(),
        ]))
        .unwrap();
        assert_eq!(credentials.files(), [first.as_path(), second.as_path()]);
        assert_eq!(
            cred(&credentials, "quay.io", "org/app"),
            Some(basic("q1", "p1"))
        );
        assert_eq!(
            cred(&credentials, "registry.example.com:5000", "app"),
            Some(basic("e", "pe"))
        );
        // The port is part of the host.
        assert_eq!(cred(&credentials, "registry.example.com", "app"), None);
        assert_eq!(cred(&credentials, "ghcr.io", "org/app"), None);
        let found = credentials.lookup("quay.io", "org/app").unwrap().unwrap();
        assert_eq!(
            found.source,
            CredentialSource::File {
                path: first,
                key: "quay.io".into()
            }
        );
    }

    #[test]
    fn explicit_file_replaces_the_chain_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.json");
        let err = Credentials::load(&AuthFiles::explicit(&missing)).unwrap_err();
        assert!(matches!(err, CredentialsError::Unreadable { .. }));
        let message = err.to_string();
        assert!(
            message.contains(&missing.display().to_string()),
            "{message}"
        );
        // A missing default file is fine.
        assert!(
            Credentials::load(&AuthFiles::defaults(vec![missing]))
                .unwrap()
                .files()
                .is_empty()
        );
    }

    #[test]
    fn malformed_files_are_errors_naming_file_and_line_without_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "auth.json",
            "{\n  \"auths\": {\n    \"quay.io\": {\"auth\": \"c2VjcmV0\"\n}\n",
        );
        let err = Credentials::load(&AuthFiles::defaults(vec![path.clone()])).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "auth file {} is not valid JSON at line",
                path.display()
            )),
            "{message}"
        );
        assert!(
            message.contains("fix or remove it, or pass --authfile"),
            "{message}"
        );

        let path = write(&dir, "syntax.json", "{\"auths\": {\n\"quay.io\" {}}}");
        let message = Credentials::load(&AuthFiles::explicit(&path))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("at line 2: expected `:` at column"),
            "{message}"
        );

        // A secret in the wrong place is not quoted back.
        let path = write(
            &dir,
            "shape.json",
            "{\"auths\": {\"quay.io\": \"dG9wc2VjcmV0\"}}",
        );
        let message = Credentials::load(&AuthFiles::explicit(&path))
            .unwrap_err()
            .to_string();
        assert!(message.contains("unexpected structure"), "{message}");
        assert!(!message.contains("dG9wc2VjcmV0"), "{message}");

        // An empty file is an empty config, as podman treats it.
        let path = write(&dir, "empty.json", "\n");
        assert_eq!(
            cred(
                &Credentials::load(&AuthFiles::explicit(&path)).unwrap(),
                "quay.io",
                "a"
            ),
            None
        );
    }

    #[test]
    fn hosts_and_path_prefixes_match_most_specific_first() {
        let text = format!(
            r#"{{"auths": {{
                "quay.io": {{"auth": "{}"}},
                "quay.io/org": {{"auth": "{}"}},
                "quay.io/org/special": {{"auth": "{}"}},
                "QUAY.IO/other/": {{"auth": "{}"}}
            }}}}"#,
            auth("host:1"),
            auth("org:2"),
            auth("special:3"),
            auth("other:4")
        );
        let credentials = Credentials::from_text("/x/auth.json", &text).unwrap();
        assert_eq!(
            cred(&credentials, "quay.io", "org/app"),
            Some(basic("org", "2"))
        );
        assert_eq!(
            cred(&credentials, "quay.io", "org/special"),
            Some(basic("special", "3"))
        );
        assert_eq!(
            cred(&credentials, "quay.io", "org/special/sub"),
            Some(basic("special", "3"))
        );
        // Prefixes match whole path components only.
        assert_eq!(
            cred(&credentials, "quay.io", "org/specialist"),
            Some(basic("org", "2"))
        );
        assert_eq!(
            cred(&credentials, "quay.io", "organisation/app"),
            Some(basic("host", "1"))
        );
        assert_eq!(
            cred(&credentials, "quay.io", "other/app"),
            Some(basic("other", "4"))
        );
        assert_eq!(cred(&credentials, "Quay.io", "x"), Some(basic("host", "1")));
    }

    #[test]
    fn url_keys_and_docker_hub_aliases() {
        let text = format!(
            r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{}"}}, "http://registry.local:5000/v2/": {{"auth": "{}"}}}}}}"#,
            auth("hub:h"),
            auth("local:l")
        );
        let credentials = Credentials::from_text("/x/config.json", &text).unwrap();
        assert_eq!(
            cred(&credentials, "docker.io", "library/nginx"),
            Some(basic("hub", "h"))
        );
        assert_eq!(
            cred(&credentials, "index.docker.io", "library/nginx"),
            Some(basic("hub", "h"))
        );
        // The URL's path is an API version, not a repository prefix.
        assert_eq!(
            cred(&credentials, "registry.local:5000", "app"),
            Some(basic("local", "l"))
        );

        let text = format!(
            r#"{{"auths": {{"docker.io": {{"auth": "{}"}}}}}}"#,
            auth("hub2:x")
        );
        let credentials = Credentials::from_text("/x/auth.json", &text).unwrap();
        assert_eq!(
            cred(&credentials, "docker.io", "library/busybox"),
            Some(basic("hub2", "x"))
        );
    }

    #[test]
    fn entry_forms_and_base64_decoding() {
        let text = format!(
            r#"{{"auths": {{
                "padded.io": {{"auth": "{}"}},
                "unpadded.io": {{"auth": "{}"}},
                "colon.io": {{"auth": "{}"}},
                "plain.io": {{"username": "u", "password": "p"}},
                "token.io": {{"identitytoken": "tok"}},
                "regtoken.io": {{"registrytoken": "rtok"}},
                "both.io": {{"auth": "{}", "identitytoken": "itok"}},
                "empty.io": {{}},
                "emptyauth.io": {{"auth": ""}},
                "bad.io": {{"auth": "%%%not base64"}},
                "nocolon.io": {{"auth": "{}"}}
            }}}}"#,
            STANDARD.encode("user:pa"),
            STANDARD_NO_PAD.encode("user:pa"),
            auth("user:pass:with:colons"),
            auth("<token>:x"),
            auth("justuser")
        );
        let credentials = Credentials::from_text("/x/auth.json", &text).unwrap();
        assert_eq!(
            cred(&credentials, "padded.io", "a"),
            Some(basic("user", "pa"))
        );
        assert_eq!(
            cred(&credentials, "unpadded.io", "a"),
            Some(basic("user", "pa"))
        );
        assert_eq!(
            cred(&credentials, "colon.io", "a"),
            Some(basic("user", "pass:with:colons"))
        );
        assert_eq!(cred(&credentials, "plain.io", "a"), Some(basic("u", "p")));
        assert_eq!(
            cred(&credentials, "token.io", "a"),
            Some(Credential::IdentityToken("tok".into()))
        );
        assert_eq!(
            cred(&credentials, "regtoken.io", "a"),
            Some(Credential::RegistryToken("rtok".into()))
        );
        // docker writes `auth` beside an identity token; the token is the credential.
        assert_eq!(
            cred(&credentials, "both.io", "a"),
            Some(Credential::IdentityToken("itok".into()))
        );
        // Entries without credentials (docker writes `{}` when a store holds them) are not matches.
        assert_eq!(cred(&credentials, "empty.io", "a"), None);
        assert_eq!(cred(&credentials, "emptyauth.io", "a"), None);
        let err = credentials.lookup("bad.io", "a").unwrap_err();
        assert_eq!(
            err.to_string(),
            "auth file /x/auth.json: the entry \"bad.io\" has an \"auth\" value that is not valid base64; \
             log in again with podman login / docker login, or fix it by hand"
        );
        let err = credentials
            .lookup("nocolon.io", "a")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not decode to user:password") && !err.contains("justuser"),
            "{err}"
        );
    }

    #[test]
    fn empty_entry_falls_through_to_the_next_file() {
        let dir = tempfile::tempdir().unwrap();
        let first = write(&dir, "a.json", r#"{"auths": {"quay.io": {}}}"#);
        let second = write(
            &dir,
            "b.json",
            &format!(
                r#"{{"auths": {{"quay.io": {{"auth": "{}"}}}}}}"#,
                auth("b:b")
            ),
        );
        let credentials = Credentials::load(&AuthFiles::defaults(vec![first, second])).unwrap();
        assert_eq!(cred(&credentials, "quay.io", "x"), Some(basic("b", "b")));
    }

    #[test]
    fn missing_helper_is_an_error_naming_it_and_the_file() {
        let text = r#"{"auths": {"quay.io": {}}, "credHelpers": {"quay.io": "pinboard-test-no-such-helper"}}"#;
        let credentials = Credentials::from_text("/root/.docker/config.json", text).unwrap();
        let message = credentials
            .lookup("quay.io", "org/app")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "credential helper docker-credential-pinboard-test-no-such-helper (named in /root/.docker/config.json) \
             failed for quay.io: it could not be run; install docker-credential-pinboard-test-no-such-helper on PATH \
             or remove it from the file"
        );
        // credHelpers only covers its hosts; no credsStore means anonymous elsewhere.
        assert_eq!(cred(&credentials, "ghcr.io", "x"), None);
    }

    #[test]
    fn secrets_never_show_in_debug_or_display() {
        let secret = "hunter2-secret";
        for credential in [
            basic("admin", secret),
            Credential::IdentityToken(secret.into()),
            Credential::RegistryToken(secret.into()),
        ] {
            let debug = format!("{credential:?}");
            let display = format!("{credential}");
            let cri = format!("{:?}", credential.to_cri_auth());
            for shown in [&debug, &display, &cri] {
                assert!(!shown.contains(secret), "{shown}");
            }
        }
        assert_eq!(
            format!("{:?}", basic("u", secret)),
            r#"Basic { username: "u", password: <redacted> }"#
        );
        assert_eq!(
            format!("{:?}", Credential::IdentityToken(secret.into())),
            "IdentityToken(<redacted>)"
        );
        let text = format!(
            r#"{{"auths": {{"quay.io": {{"auth": "{}"}}}}}}"#,
            auth(&format!("u:{secret}"))
        );
        let credentials = Credentials::from_text("/x/auth.json", &text).unwrap();
        let found = credentials.lookup("quay.io", "a").unwrap();
        assert!(!format!("{credentials:?} {found:?}").contains(secret));
        assert!(!format!("{credentials:?}").contains(&auth(&format!("u:{secret}"))));
    }

    #[test]
    fn runtimes_get_each_kind_without_a_server_address() {
        assert_eq!(Credential::Anonymous.to_cri_auth(), None);
        let auth = basic("u", "p").to_cri_auth().unwrap();
        assert_eq!(
            (
                auth.username.as_str(),
                auth.password.as_str(),
                auth.server_address.as_str()
            ),
            ("u", "p", "")
        );
        // containerd takes a user name as meaning user/password: none goes with a token.
        let identity = Credential::IdentityToken("it".into())
            .to_cri_auth()
            .unwrap();
        assert_eq!(
            (identity.identity_token.as_str(), identity.username.as_str()),
            ("it", "")
        );
        let registry = Credential::RegistryToken("rt".into())
            .to_cri_auth()
            .unwrap();
        assert_eq!(
            (
                registry.registry_token.as_str(),
                registry.server_address.as_str()
            ),
            ("rt", "")
        );
    }
}

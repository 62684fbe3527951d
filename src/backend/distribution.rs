//! The client side of the OCI distribution protocol, as far as pinboard needs it: one HTTP client per
//! registry, the registry's challenge learned once (from `/v2/` when a credential must be presented, else
//! from the first request it refuses: anonymous reads of an open registry cost no extra round trip), access
//! to a repository from a credential, and authenticated GETs. [`super::registry`] builds manifests on it; anything else that reads a registry (a
//! blob cache, say) can share it.
//!
//! - **Transport.** HTTPS trusting the system store (or `SSL_CERT_FILE`) plus the registry's certs.d CAs,
//!   presenting its certs.d client certificate ([`super::certs`]); plain HTTP only for registries named
//!   insecure. The token service is reached with the registry's own client, as containerd and
//!   containers/image do.
//! - **Access.** An open registry gets no credential at all. A `Basic` challenge gets the user and
//!   password. A `Bearer` challenge gets a token for `repository:NAME:pull` from the realm: with basic
//!   auth by GET (the distribution token protocol), an identity token by the OAuth2 refresh-token grant
//!   (POST), anonymously by GET; a registry token is the bearer token itself.
//!
//! Passwords and tokens never reach logs, errors or Debug: headers carrying them are marked sensitive and
//! [`Access`] redacts its Debug.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http::header::{ACCEPT, AUTHORIZATION, HeaderValue, RANGE, WWW_AUTHENTICATE};
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::certs::{CertDirs, CertsError, SiteTls};
use super::credentials::Credential;

const USER_AGENT: &str = concat!("pinboard/", env!("CARGO_PKG_VERSION"));
/// The OAuth2 client id pinboard names itself with at token services.
const CLIENT_ID: &str = "pinboard";
/// A token's lifetime when the token service does not say (the distribution token spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// Error bodies are read up to this size, for messages.
const MAX_ERROR_BODY: usize = 64 << 10;

/// How to reach registries: their certs.d, which ones speak plain HTTP, and the connect timeout.
pub struct Distribution {
    certs: CertDirs,
    insecure: Vec<String>,
    timeout: Duration,
    hosts: Mutex<HashMap<String, Arc<OnceCell<Arc<Host>>>>>,
}

/// One registry: its client and, once learned, what it asks for.
pub struct Host {
    /// What certs.d gave it.
    pub tls: SiteTls,
    /// `https://endpoint` or `http://endpoint`.
    base: String,
    http: reqwest::Client,
    /// None until `/v2/` or a refused request said.
    challenge: Mutex<Option<Challenge>>,
}

impl Host {
    fn known_challenge(&self) -> Option<Challenge> {
        self.challenge.lock().expect("challenge lock").clone()
    }

    /// For an anonymous request the registry refused: learns the challenge from its `WWW-Authenticate` (if
    /// not known yet), and whether access should be asked for again now that it is known. Requests sent at
    /// once all learn it, whichever answer came first.
    fn learn(&self, response: &reqwest::Response, anonymous: bool) -> bool {
        if !anonymous || response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return false;
        }
        let mut known = self.challenge.lock().expect("challenge lock");
        if known.is_none() {
            *known = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|h| parse_challenge(h.to_str().unwrap_or_default()));
        }
        matches!(*known, Some(Challenge::Basic | Challenge::Bearer { .. }))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Challenge {
    /// `/v2/` answered without asking for credentials.
    Open,
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// What authorizes requests to one repository, until `expires`.
#[derive(Clone, Default)]
pub struct Access {
    header: Option<HeaderValue>,
    expires: Option<Instant>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("authorized", &self.header.is_some())
            .field("expires", &self.expires)
            .finish()
    }
}

impl Access {
    /// Whether it must be renewed before the next request (a little before the token service's expiry).
    pub fn expired(&self) -> bool {
        self.expires.is_some_and(|at| Instant::now() >= at)
    }

    /// Whether requests carry a credential or token.
    pub fn authorized(&self) -> bool {
        self.header.is_some()
    }
}

/// Why a request failed, before it is put in words for a reference (see [`super::registry`]).
#[derive(Debug)]
pub enum HttpError {
    /// No connection, or it broke: DNS, refused, reset, TLS.
    Transport(reqwest::Error),
    /// The registry answered with an error status.
    Status { status: u16, body: String },
    /// The registry answered 429 or 503 to a read: it is busy, asking again later may succeed, after
    /// `Retry-After` when it said how long.
    Busy {
        status: u16,
        body: String,
        retry_after: Option<Duration>,
    },
    /// The token service refused or failed.
    Token { status: u16, body: String },
    /// The token service answered 200 with something that is not a token.
    NotAToken(String),
    /// The registry's certs.d holds a file that cannot be used.
    Certs(CertsError),
    /// The HTTP client could not be built from certs.d's files.
    Setup(String),
    /// The registry refused an anonymous request and said what it asks for: ask for access again.
    Challenged,
    /// The registry refused a request that carried a credential or token with `error="insufficient_scope"`
    /// in its challenge (RFC 6750): what was sent is good, but grants no pull access to the repository.
    InsufficientScope { status: u16, body: String },
    /// The connection failed, and the registry's handshake asks for a client certificate that certs.d does
    /// not hold ([`super::tls_probe`]).
    ClientCertificateRequired,
}

#[derive(Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

impl Distribution {
    pub fn new(certs: CertDirs, insecure: Vec<String>, timeout: Duration) -> Distribution {
        Distribution {
            certs,
            insecure,
            timeout,
            hosts: Mutex::default(),
        }
    }

    /// Where certs.d files are read from.
    pub fn certs(&self) -> &CertDirs {
        &self.certs
    }

    /// Whether `registry` is reached over plain HTTP.
    pub fn is_insecure(&self, registry: &str) -> bool {
        self.insecure.iter().any(|r| r == registry)
    }

    /// The registry's client, its `/v2/` asked once per process however many callers ask at once.
    pub async fn host(&self, registry: &str) -> Result<Arc<Host>, HttpError> {
        let cell = self
            .hosts
            .lock()
            .expect("hosts lock")
            .entry(registry.to_string())
            .or_default()
            .clone();
        cell.get_or_try_init(|| self.connect(registry))
            .await
            .cloned()
    }

    async fn connect(&self, registry: &str) -> Result<Arc<Host>, HttpError> {
        let tls = self
            .certs
            .for_registry(registry)
            .map_err(HttpError::Certs)?;
        // No read timeout: callers bound manifest and token exchanges as a whole, and the blob cache
        // detects stalled bodies itself.
        let cas = tls
            .cas
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok());
        let builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .connect_timeout(self.timeout);
        let mut builder = match system_roots_usable() {
            true => builder.tls_certs_merge(cas),
            false => builder.tls_certs_only(cas),
        };
        if let Some(client) = &tls.client {
            let identity = reqwest::Identity::from_pem(&client.pem).map_err(|e| {
                HttpError::Setup(format!(
                    "client certificate {} with key {}: {e}",
                    client.cert.display(),
                    client.key.display()
                ))
            })?;
            builder = builder.identity(identity);
        }
        let http = builder
            .build()
            .map_err(|e| HttpError::Setup(e.to_string()))?;
        let scheme = if self.is_insecure(registry) {
            "http"
        } else {
            "https"
        };
        let base = format!("{scheme}://{}", endpoint(registry));
        tracing::debug!(
            registry,
            base,
            ca_files = ?tls.ca_files,
            client_certificate = ?tls.client.as_ref().map(|c| &c.cert),
            "registry client"
        );
        Ok(Arc::new(Host {
            tls,
            base,
            http,
            challenge: Mutex::default(),
        }))
    }

    /// What `host` asks for: learned already, or asked of its `/v2/` now.
    async fn challenge(&self, host: &Host) -> Result<Challenge, HttpError> {
        if let Some(known) = host.known_challenge() {
            return Ok(known);
        }
        let started = Instant::now();
        let response = host
            .http
            .get(format!("{}/v2/", host.base))
            .send()
            .await
            .map_err(HttpError::Transport)?;
        let status = response.status().as_u16();
        let challenge = match (status, response.headers().get(WWW_AUTHENTICATE)) {
            (200..=299, _) => Challenge::Open,
            (401, Some(header)) => parse_challenge(header.to_str().unwrap_or_default())
                .ok_or_else(|| HttpError::Status {
                    status,
                    body: format!(
                        "its /v2/ asks for an unknown authentication scheme ({})",
                        header.to_str().unwrap_or("unreadable")
                    ),
                })?,
            _ => {
                return Err(HttpError::Status {
                    status,
                    body: error_body(response).await,
                });
            }
        };
        tracing::debug!(
            base = host.base,
            ?challenge,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "registry pinged"
        );
        *host.challenge.lock().expect("challenge lock") = Some(challenge.clone());
        Ok(challenge)
    }

    /// What authorizes pulls from `repository` on `host` with `credential`: nothing for an open registry,
    /// the credential for `Basic`, a token from the token service for `Bearer`.
    pub async fn access(
        &self,
        host: &Host,
        repository: &str,
        credential: &Credential,
    ) -> Result<Access, HttpError> {
        let challenge = match (host.known_challenge(), credential) {
            (_, Credential::RegistryToken(token)) => return Ok(bearer(token, None)),
            (Some(known), _) => known,
            // Nothing to present: try without, and learn the challenge if the registry refuses.
            (None, Credential::Anonymous) => return Ok(Access::default()),
            (None, _) => self.challenge(host).await?,
        };
        let (realm, service) = match (&challenge, credential) {
            (Challenge::Open, _) => return Ok(Access::default()),
            (_, Credential::RegistryToken(token)) => return Ok(bearer(token, None)),
            (Challenge::Basic, Credential::Basic { username, password }) => {
                return Ok(basic(username, password));
            }
            // The registry will refuse the request; its answer says why.
            (Challenge::Basic, _) => return Ok(Access::default()),
            (Challenge::Bearer { realm, service }, _) => (realm, service),
        };
        let scope = format!("repository:{repository}:pull");
        let mut query = vec![("scope", scope.as_str())];
        query.extend(service.as_deref().map(|s| ("service", s)));
        let request = match credential {
            Credential::IdentityToken(token) => {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", token.as_str()),
                    ("client_id", CLIENT_ID),
                ];
                form.extend(query);
                host.http
                    .post(realm)
                    .header(
                        http::header::CONTENT_TYPE,
                        "application/x-www-form-urlencoded",
                    )
                    .body(form_urlencoded(&form))
            }
            Credential::Basic { username, password } => host.http.get(realm).query(&query).header(
                AUTHORIZATION,
                basic(username, password).header.expect("set"),
            ),
            Credential::Anonymous | Credential::RegistryToken(_) => {
                host.http.get(realm).query(&query)
            }
        };
        let response = request.send().await.map_err(HttpError::Transport)?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(HttpError::Token {
                status,
                body: error_body(response).await,
            });
        }
        let body = response.bytes().await.map_err(HttpError::Transport)?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| HttpError::NotAToken(e.to_string()))?;
        let token = answer
            .access_token
            .or(answer.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| HttpError::NotAToken("no token in the answer".into()))?;
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(DEFAULT_TOKEN_SECONDS));
        Ok(bearer(&token, Some(lifetime)))
    }

    /// `GET base/v2/PATH` with `access`, and `Accept` and `Range` when given: the answer as it comes, whatever
    /// its status.
    pub async fn send(
        &self,
        host: &Host,
        path: &str,
        access: &Access,
        accept: Option<&str>,
        range: Option<&str>,
    ) -> Result<reqwest::Response, HttpError> {
        let mut request = host.http.get(format!("{}/v2/{path}", host.base));
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(range) = range {
            request = request.header(RANGE, range);
        }
        if let Some(header) = &access.header {
            request = request.header(AUTHORIZATION, header.clone());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return Err(self.transport_failure(host, e).await),
        };
        if host.learn(&response, access.header.is_none()) {
            return Err(HttpError::Challenged);
        }
        Ok(response)
    }

    /// A request that failed before an answer. When no TLS error says why, and the registry's handshake asks
    /// for a client certificate that certs.d does not hold, that is why: over TLS 1.3 the registry's alert
    /// saying so may be lost to the request.
    async fn transport_failure(&self, host: &Host, error: reqwest::Error) -> HttpError {
        let unexplained = host.tls.client.is_none()
            && host.base.starts_with("https://")
            && !error.is_timeout()
            && !causes(&error).any(|e| e.is::<rustls::Error>());
        if unexplained {
            let endpoint = host.base.trim_start_matches("https://");
            if super::tls_probe::asks_for_client_certificate(endpoint, self.timeout).await {
                tracing::debug!(endpoint, error = %error, "its handshake asks for a client certificate");
                return HttpError::ClientCertificateRequired;
            }
        }
        HttpError::Transport(error)
    }

    /// `GET base/v2/PATH` with `access` and `accept`; the body of a 2xx answer, up to `limit` bytes.
    pub async fn get(
        &self,
        host: &Host,
        path: &str,
        access: &Access,
        accept: &str,
        limit: usize,
    ) -> Result<Vec<u8>, HttpError> {
        let mut response = self.send(host, path, access, Some(accept), None).await?;
        let status = response.status().as_u16();
        if matches!(status, 429 | 503) {
            let retry_after = retry_after(response.headers(), std::time::SystemTime::now());
            return Err(HttpError::Busy {
                status,
                body: error_body(response).await,
                retry_after,
            });
        }
        if !response.status().is_success() {
            let scope = access.authorized() && insufficient_scope(response.headers());
            let body = error_body(response).await;
            return Err(match scope {
                true => HttpError::InsufficientScope { status, body },
                false => HttpError::Status { status, body },
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(HttpError::Transport)? {
            if body.len() + chunk.len() > limit {
                return Err(HttpError::Status {
                    status,
                    body: format!("the answer is larger than {limit} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// `error` and its causes, innermost last, including the errors hyper and rustls wrap in an `io::Error`
/// (whose `source()` skips the wrapped error).
pub fn causes<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io
            .get_ref()
            .map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
}

/// The host that serves a registry's API: Docker Hub's images are named `docker.io` but served elsewhere.
fn endpoint(registry: &str) -> &str {
    match registry {
        "docker.io" => "registry-1.docker.io",
        other => other,
    }
}

fn sensitive(value: String) -> HeaderValue {
    let mut header = HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""));
    header.set_sensitive(true);
    header
}

fn basic(username: &str, password: &str) -> Access {
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    Access {
        header: Some(sensitive(format!("Basic {encoded}"))),
        expires: None,
    }
}

/// A bearer token, renewed a little before `lifetime` runs out (a tenth of it, at most 30 s).
fn bearer(token: &str, lifetime: Option<Duration>) -> Access {
    Access {
        header: Some(sensitive(format!("Bearer {token}"))),
        expires: lifetime.map(|l| Instant::now() + l - (l / 10).min(Duration::from_secs(30))),
    }
}

/// How long `Retry-After` asks to wait: a number of seconds, or an HTTP date (a date already past: 0).
pub(super) fn retry_after(
    headers: &http::HeaderMap,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            Some(at.duration_since(now).unwrap_or_default())
        }
    }
}

/// The bytes a 206 carries, from its `Content-Range: bytes FIRST-LAST/TOTAL`.
pub(super) fn content_range(headers: &http::HeaderMap) -> Option<std::ops::Range<u64>> {
    let value = headers.get(http::header::CONTENT_RANGE)?.to_str().ok()?;
    let (first, last) = value
        .trim()
        .strip_prefix("bytes ")?
        .split_once('/')?
        .0
        .split_once('-')?;
    Some(first.trim().parse().ok()?..last.trim().parse::<u64>().ok()? + 1)
}

/// A `Range: bytes=...` header against a blob of `size` bytes: `Ok(None)` for the whole blob (no header,
/// or one this endpoint serves whole, such as several ranges), `Err` when it cannot be satisfied.
pub(super) fn parse_range(
    header: Option<&str>,
    size: u64,
) -> Result<Option<std::ops::Range<u64>>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.split_once('-') else {
        return Ok(None);
    };
    let number = |text: &str| text.trim().parse::<u64>().map_err(|_| ());
    let range = match (first.trim().is_empty(), last.trim().is_empty()) {
        // `bytes=-N`: the last N bytes.
        (true, false) => {
            let n = number(last)?.min(size);
            if n == 0 {
                return Err(());
            }
            size - n..size
        }
        (false, true) => number(first)?..size,
        (false, false) => number(first)?..number(last)?.saturating_add(1).min(size),
        (true, true) => return Ok(None),
    };
    if range.start >= size || range.start >= range.end {
        return Err(());
    }
    Ok(Some(range))
}

/// Whether a 401's challenge says `error="insufficient_scope"`: the token is valid but does not cover the
/// request (distribution, Docker Hub).
fn insufficient_scope(headers: &http::HeaderMap) -> bool {
    headers.get_all(WWW_AUTHENTICATE).iter().any(|value| {
        value
            .to_str()
            .unwrap_or_default()
            .to_ascii_lowercase()
            .replace(' ', "")
            .contains("error=\"insufficient_scope\"")
    })
}

/// A failed answer's body, for messages (cut at [`MAX_ERROR_BODY`]).
async fn error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// `Bearer realm="...",service="..."` or `Basic realm="..."` (RFC 7235); None for another scheme.
fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(rest);
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: param("realm")?,
            service: param("service"),
        }),
        _ => None,
    }
}

/// `key="value", key=token` pairs; quoted values may hold commas and `\"`.
fn parse_params(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return params;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = chars.by_ref().take_while(|c| *c != ',').collect();
        }
        params.push((key.trim().to_string(), value.trim().to_string()));
    }
}

/// `application/x-www-form-urlencoded`: unreserved characters as they are, everything else escaped.
fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
    let escape = |text: &str| {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether the system's CA certificates can be used (asked once). In a bare image (the agent's) there are
/// none and the platform verifier cannot start: then only each registry's own CAs (certs.d) are trusted,
/// and a plain-HTTP registry needs none.
fn system_roots_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| match reqwest::Client::builder().build() {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(
                "no usable system CA certificates ({e}): registries are trusted only through their \
                 certs.d CAs"
            );
            false
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_as_http_says() {
        assert_eq!(parse_range(None, 100), Ok(None));
        assert_eq!(parse_range(Some("bytes=10-"), 100), Ok(Some(10..100)));
        assert_eq!(parse_range(Some("bytes=10-19"), 100), Ok(Some(10..20)));
        assert_eq!(parse_range(Some("bytes=90-500"), 100), Ok(Some(90..100)));
        assert_eq!(parse_range(Some("bytes=-30"), 100), Ok(Some(70..100)));
        assert_eq!(parse_range(Some("bytes=-300"), 100), Ok(Some(0..100)));
        assert_eq!(parse_range(Some("bytes=0-0"), 100), Ok(Some(0..1)));
        // Several ranges, or another unit: served whole.
        assert_eq!(parse_range(Some("bytes=0-1,5-6"), 100), Ok(None));
        assert_eq!(parse_range(Some("items=0-1"), 100), Ok(None));
        assert_eq!(parse_range(Some("bytes=100-"), 100), Err(()));
        assert_eq!(parse_range(Some("bytes=20-10"), 100), Err(()));
        assert_eq!(parse_range(Some("bytes=-0"), 100), Err(()));
        assert_eq!(parse_range(Some("bytes=x-"), 100), Err(()));
    }

    #[test]
    fn a_token_short_of_the_repository_is_told_from_other_refusals() {
        let challenge = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_str(value).unwrap());
            insufficient_scope(&headers)
        };
        // distribution's and Docker Hub's answer to a token without the repository.
        assert!(challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull",error="insufficient_scope""#
        ));
        assert!(challenge(
            r#"Bearer realm="r", error = "insufficient_scope""#
        ));
        assert!(!challenge(r#"Bearer realm="r",error="invalid_token""#));
        assert!(!challenge(r#"Bearer realm="r",service="s""#));
        assert!(!insufficient_scope(&http::HeaderMap::new()));
    }

    #[test]
    fn challenges_are_read_as_registries_send_them() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into())
            })
        );
        // quay.io's order and spacing, and a scope with a comma inside quotes.
        assert_eq!(
            parse_challenge(
                r#"bearer service="quay.io", scope="repository:a/b:pull,push", realm="https://quay.io/v2/auth""#
            ),
            Some(Challenge::Bearer {
                realm: "https://quay.io/v2/auth".into(),
                service: Some("quay.io".into())
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None, "no realm");
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(
            parse_params(r#"a="x\"y", b=plain ,c="""#),
            [
                ("a".to_string(), "x\"y".to_string()),
                ("b".into(), "plain".into()),
                ("c".into(), String::new())
            ]
        );
    }

    #[test]
    fn forms_escape_everything_but_unreserved_characters() {
        assert_eq!(
            form_urlencoded(&[("scope", "repository:a/b:pull"), ("t", "x+y z~")]),
            "scope=repository%3Aa%2Fb%3Apull&t=x%2By%20z~"
        );
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let access = basic("user", "hunter2");
        let debug = format!("{access:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("aHVudGVyMg"),
            "{debug}"
        );
        assert!(access.authorized() && !access.expired());
        let token = bearer("tok-secret", Some(Duration::from_secs(300)));
        assert!(!format!("{token:?}").contains("tok-secret"));
        assert!(token.header.as_ref().unwrap().is_sensitive());
        // A token with no time left is renewed at once.
        assert!(bearer("t", Some(Duration::ZERO)).expired());
    }

    #[test]
    fn docker_hub_is_served_by_its_registry_host() {
        assert_eq!(endpoint("docker.io"), "registry-1.docker.io");
        assert_eq!(endpoint("127.0.0.1:5000"), "127.0.0.1:5000");
    }
}

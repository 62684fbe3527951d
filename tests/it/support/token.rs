//! The lab registry's token service, speaking the distribution token protocol as quay.io's and Docker Hub's
//! do, so that pinboard, containerd and the lab pusher authenticate to `docker-registry` (`auth: token`) for
//! real:
//!
//! - `GET /token?service=S&scope=repository:NAME:pull`, with HTTP basic auth or anonymously;
//! - `POST /token`, the OAuth2 password grant (`grant_type=password`, with `access_type=offline` also a
//!   `refresh_token`: the identity token `docker login` keeps) and refresh-token grant
//!   (`grant_type=refresh_token`), which containerd tries before GET;
//! - tokens are RS256 JWTs whose `x5c` header holds the self-signed certificate that the registry's
//!   `rootcertbundle` names, with the claims `iss`, `sub`, `aud` (= service), `exp`, `nbf`, `iat`, `jti` and
//!   `access` (per repository: a user gets only the repositories it may pull; others are left out of the
//!   token, and the registry then refuses them).
//!
//! It runs on its own thread (one more per connection), records every request and every token it issues
//! (so tests can prove no secret leaked into pinboard's output), and stops when dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

use super::pki::self_signed;

/// The `service` the registry names in its challenge and expects as the tokens' audience.
pub const SERVICE: &str = "pinboard-lab-registry";
/// The tokens' issuer, as the registry's config names it.
pub const ISSUER: &str = "pinboard-lab-token-service";
/// How long a token lasts.
const LIFETIME: Duration = Duration::from_secs(300);

/// Who may pull what.
#[derive(Clone, Debug, Default)]
pub struct TokenConfig {
    pub users: Vec<TokenUser>,
    /// Repositories anyone may pull without credentials (`name`, `prefix/*` or `*`).
    pub public: Vec<String>,
}

/// A user of the token service.
#[derive(Clone, Debug)]
pub struct TokenUser {
    pub name: String,
    pub password: String,
    /// Repositories this user may pull (`name`, `prefix/*` or `*`).
    pub pull: Vec<String>,
    /// The identity token (OAuth2 refresh token) the password grant hands out with
    /// `access_type=offline`, and the refresh-token grant takes.
    pub identity_token: Option<String>,
}

impl TokenUser {
    pub fn new(name: &str, password: &str, pull: &[&str]) -> TokenUser {
        TokenUser {
            name: name.to_owned(),
            password: password.to_owned(),
            pull: pull.iter().map(|p| p.to_string()).collect(),
            identity_token: None,
        }
    }
}

/// One request the service answered: `GET` or `POST`, the grant (`basic`, `anonymous`, `password`,
/// `refresh_token`), the user it was for, and the HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    pub method: String,
    pub grant: String,
    pub user: Option<String>,
    pub status: u16,
}

/// A running token service.
pub struct TokenService {
    ip: std::net::IpAddr,
    port: u16,
    cert: PathBuf,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    config: TokenConfig,
    key: RsaKeyPair,
    /// base64 (standard) DER of the signing certificate, for the `x5c` header.
    x5c: String,
    issued: Mutex<Vec<String>>,
    requests: Mutex<Vec<TokenRequest>>,
    next_id: AtomicU64,
}

impl TokenService {
    /// Makes a signing key and self-signed certificate in `dir` (openssl) and serves on a port of `ip` (the registry's address, so a cluster lab's nodes reach it).
    pub fn start(dir: &Path, config: TokenConfig, ip: std::net::IpAddr) -> Result<TokenService> {
        std::fs::create_dir_all(dir)?;
        let (key_path, cert) = (dir.join("token-signer.key"), dir.join("token-signer.crt"));
        self_signed(&key_path, &cert, "/CN=pinboard lab token signer")?;
        let key = match PrivateKeyDer::from_pem_file(&key_path)? {
            PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
                .map_err(|e| anyhow::anyhow!("the token signing key: {e}"))?,
            _ => anyhow::bail!("openssl wrote a key that is not PKCS#8"),
        };
        let der = CertificateDer::from_pem_file(&cert)?;
        let shared = Arc::new(Shared {
            config,
            key,
            x5c: STANDARD.encode(der.as_ref()),
            issued: Mutex::default(),
            requests: Mutex::default(),
            next_id: AtomicU64::new(1),
        });
        let listener = TcpListener::bind((ip, 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let (stopping, serving) = (stop.clone(), shared.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok(stream) = stream {
                    let shared = serving.clone();
                    std::thread::spawn(move || {
                        // One bad client must not stop the service.
                        let _ = serve(&shared, stream);
                    });
                }
            }
        });
        Ok(TokenService {
            port,
            ip,
            cert,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// `http://IP:PORT/token`
    pub fn realm(&self) -> String {
        format!(
            "http://{}/token",
            std::net::SocketAddr::new(self.ip, self.port)
        )
    }

    /// The certificate (PEM) the registry verifies tokens with.
    pub fn cert_bundle(&self) -> &Path {
        &self.cert
    }

    /// Every token issued so far, in order.
    pub fn issued(&self) -> Vec<String> {
        self.shared.issued.lock().expect("issued lock").clone()
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<TokenRequest> {
        self.shared.requests.lock().expect("requests lock").clone()
    }

    /// A token for `subject` with these `(repository, actions)`, as if the service had granted them: for
    /// the lab's own pushes.
    pub fn mint(&self, subject: &str, access: &[(&str, &[&str])]) -> String {
        self.shared.token(
            subject,
            access
                .iter()
                .map(|(name, actions)| {
                    (
                        name.to_string(),
                        actions.iter().map(|a| a.to_string()).collect(),
                    )
                })
                .collect(),
        )
    }
}

impl Drop for TokenService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect((self.ip, self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn matches(pattern: &str, repository: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => repository.starts_with(prefix),
        None => pattern == repository,
    }
}

impl Shared {
    /// The actions of `requested` that `user` (None: anonymous) may have on each repository.
    fn grant(&self, user: Option<&TokenUser>, requested: &[String]) -> Vec<(String, Vec<String>)> {
        let mut granted = Vec::new();
        for scope in requested {
            let mut parts = scope.splitn(3, ':');
            let (Some("repository"), Some(name), Some(actions)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let patterns = self
                .config
                .public
                .iter()
                .chain(user.into_iter().flat_map(|u| &u.pull));
            let may_pull = patterns.into_iter().any(|p| matches(p, name));
            let actions: Vec<String> = actions
                .split(',')
                .filter(|a| *a == "pull" && may_pull)
                .map(str::to_owned)
                .collect();
            if !actions.is_empty() {
                granted.push((name.to_owned(), actions));
            }
        }
        granted
    }

    /// A signed RS256 JWT, recorded as issued.
    fn token(&self, subject: &str, access: Vec<(String, Vec<String>)>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let header = json!({"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]});
        let access: Vec<_> = access
            .into_iter()
            .map(|(name, actions)| json!({"type": "repository", "name": name, "actions": actions}))
            .collect();
        let claims = json!({
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + LIFETIME.as_secs(),
            "nbf": now - 10,
            "iat": now,
            "jti": format!("lab-{}", self.next_id.fetch_add(1, Ordering::Relaxed)),
            "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut signature,
            )
            .expect("RSA signing works");
        let token = format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature));
        self.issued.lock().expect("issued lock").push(token.clone());
        token
    }

    fn user(&self, name: &str) -> Option<&TokenUser> {
        self.config.users.iter().find(|u| u.name == name)
    }

    /// The answer to one request: status and JSON body.
    fn answer(&self, request: &Request) -> (u16, serde_json::Value, TokenRequest) {
        let log = |grant: &str, user: Option<&str>, status: u16| TokenRequest {
            method: request.method.clone(),
            grant: grant.to_owned(),
            user: user.map(str::to_owned),
            status,
        };
        let refused = json!({"details": "incorrect username or password"});
        let params = match request.method.as_str() {
            "GET" => &request.query,
            "POST" => &request.form,
            _ => return (405, json!({}), log("none", None, 405)),
        };
        let one = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        // GET repeats `scope`; the OAuth2 form separates scopes by spaces.
        let scopes: Vec<String> = params
            .iter()
            .filter(|(k, _)| k == "scope")
            .flat_map(|(_, v)| v.split(' ').map(str::to_owned))
            .collect();
        if one("service") != Some(SERVICE) {
            return (
                400,
                json!({"details": "unknown service"}),
                log("none", None, 400),
            );
        }
        let (grant, user) =
            match (request.method.as_str(), one("grant_type")) {
                ("GET", _) => match &request.basic {
                    None => ("anonymous", None),
                    Some((name, password)) => match self.user(name) {
                        Some(user) if user.password == *password => ("basic", Some(user)),
                        _ => return (401, refused, log("basic", Some(name), 401)),
                    },
                },
                ("POST", Some("password")) => {
                    let name = one("username").unwrap_or_default();
                    match self.user(name) {
                        Some(user) if Some(user.password.as_str()) == one("password") => {
                            ("password", Some(user))
                        }
                        _ => return (401, refused, log("password", Some(name), 401)),
                    }
                }
                ("POST", Some("refresh_token")) => {
                    let token = one("refresh_token");
                    match self.config.users.iter().find(|u| {
                        u.identity_token.is_some() && u.identity_token.as_deref() == token
                    }) {
                        Some(user) => ("refresh_token", Some(user)),
                        None => return (401, refused, log("refresh_token", None, 401)),
                    }
                }
                _ => {
                    return (
                        400,
                        json!({"details": "unsupported grant_type"}),
                        log("none", None, 400),
                    );
                }
            };
        let subject = user.map_or("anonymous", |u| u.name.as_str());
        let token = self.token(subject, self.grant(user, &scopes));
        let issued_at = humantime_now();
        let mut body = json!({
            "access_token": token,
            "expires_in": LIFETIME.as_secs(),
            "issued_at": issued_at,
        });
        if request.method == "GET" {
            body["token"] = json!(body["access_token"]);
        }
        if grant == "password"
            && one("access_type") == Some("offline")
            && let Some(identity) = user.and_then(|u| u.identity_token.as_ref())
        {
            body["refresh_token"] = json!(identity);
        }
        (200, body, log(grant, Some(subject), 200))
    }
}

/// `2000-01-01T00:00:00Z`-style UTC time of now (the `issued_at` field).
fn humantime_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// What the service reads from a request.
struct Request {
    method: String,
    query: Vec<(String, String)>,
    form: Vec<(String, String)>,
    basic: Option<(String, String)>,
}

/// Reads one request, answers it, closes the connection.
fn serve(shared: &Shared, mut stream: TcpStream) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, target) = (
        words.next().unwrap_or_default().to_owned(),
        words.next().unwrap_or_default().to_owned(),
    );
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let (status, answer) = if path == "/token" {
        let request = Request {
            method,
            query: parse_form(query),
            form: parse_form(&String::from_utf8_lossy(&body)),
            basic: headers.get("authorization").and_then(|h| basic(h)),
        };
        let (status, answer, logged) = shared.answer(&request);
        shared.requests.lock().expect("requests lock").push(logged);
        (status, answer)
    } else {
        (404, json!({"details": "not found"}))
    };
    let body = answer.to_string();
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Bad Request",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    Ok(())
}

/// `Basic base64(user:password)`.
fn basic(header: &str) -> Option<(String, String)> {
    let encoded = header
        .strip_prefix("Basic ")
        .or_else(|| header.strip_prefix("basic "))?;
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// `a=b&c=d` with `%XX` escapes and `+` for space.
fn parse_form(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

//! Why a reference could not be inspected or a blob fetched ([`RegistryError`]), and how a failed request
//! becomes one: the registry's answer (HTTP status, error envelope, token service), or the transport's
//! failure, with a cause a person can act on (where a TLS CA or client certificate goes).

use std::time::Duration;

use serde::Deserialize;

use crate::backend::certs::{CertDirs, CertsError};
use crate::backend::credentials::CredentialsError;
use crate::backend::distribution::{self, Host, HttpError};
use crate::backend::truncate;
use crate::model::image::Platform;
use crate::model::mirror_rules::Candidate;

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

    pub(super) fn for_reference(mut self, label: &str) -> Self {
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

/// What an error message needs to know about the request that failed.
pub(super) struct Context<'a> {
    pub(super) label: &'a str,
    pub(super) registry: &'a str,
    pub(super) insecure: bool,
    pub(super) credentials: &'a str,
    pub(super) timeout: Duration,
    pub(super) certs: &'a CertDirs,
    /// What certs.d gave the registry, once it was reached.
    pub(super) host: Option<&'a Host>,
}

pub(super) fn timeout_error(context: &Context<'_>) -> RegistryError {
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
pub(super) fn map_error(error: HttpError, context: &Context<'_>) -> RegistryError {
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
pub(super) fn transport_cause(
    error: &(dyn std::error::Error + 'static),
    context: &Context<'_>,
) -> String {
    let (registry, insecure) = (context.registry, context.insecure);
    let chain: Vec<_> = distribution::causes(error).collect();
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

/// Why no place served a reference: the one error when one place was tried; otherwise every place and its
/// answer (each mirror, then the source).
pub(super) fn tried_everywhere(
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

/// What an unsuccessful answer to a blob request means: as for manifests, except that a client error other
/// than 408 and 429 is final, since asking again the same way gets the same answer (416, 400, ...).
pub(super) fn blob_error(
    status: http::StatusCode,
    body: &[u8],
    context: &Context<'_>,
) -> RegistryError {
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

#[cfg(test)]
mod tests {
    use super::*;

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
            platform: Platform::parse("linux/s390x").unwrap(),
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

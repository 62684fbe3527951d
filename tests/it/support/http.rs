//! The one HTTP client setup for talking to the lab's servers (registry, proxy, kube-apiserver).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

/// A blocking HTTP client for the lab: plain HTTP, TLS without certificate verification (the apiserver's
/// certificate is self-signed), no proxy from the environment, and non-2xx statuses returned as responses
/// rather than errors. Blocking and runtime-free, so it works from sync tests and inside tokio tests alike.
pub fn agent() -> ureq::Agent {
    agent_presenting(None)
}

/// [`agent`], presenting the client certificate `cert` with its key `key` (PEM) to TLS servers.
pub fn agent_with_client_certificate(cert: &Path, key: &Path) -> Result<ureq::Agent> {
    let chain = certificates(cert)?;
    let key = ureq::tls::PrivateKey::from_pem(&std::fs::read(key)?)?;
    Ok(agent_presenting(Some(
        ureq::tls::ClientCert::new_with_certs(&chain, key),
    )))
}

/// [`agent`], verifying TLS servers' certificates against the CA certificate `ca` (PEM) only.
pub fn agent_trusting(ca: &Path) -> Result<ureq::Agent> {
    let roots = certificates(ca)?;
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(roots)))
        .build();
    Ok(with_tls(tls))
}

/// The certificates in the PEM file `path`.
fn certificates(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>> {
    Ok(ureq::tls::parse_pem(&std::fs::read(path)?)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect())
}

fn agent_presenting(client: Option<ureq::tls::ClientCert>) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .disable_verification(true)
        .client_cert(client)
        .build();
    with_tls(tls)
}

fn with_tls(tls: ureq::tls::TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls)
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// The status of `GET url` (with a bearer token if given), or `None` if the server did not answer within
/// a second or two: for readiness probes.
pub(crate) fn probe(agent: &ureq::Agent, url: &str, token: Option<&str>) -> Option<u16> {
    let mut request = agent.get(url);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let response = request
        .config()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .call()
        .ok()?;
    Some(response.status().as_u16())
}

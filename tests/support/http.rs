//! The one HTTP client setup for talking to the lab's loopback servers (registry, proxy, kube-apiserver).

use std::time::Duration;

/// A blocking HTTP client for the lab: plain HTTP, TLS without certificate verification (the apiserver's
/// certificate is self-signed), no proxy from the environment, and non-2xx statuses returned as responses
/// rather than errors. Blocking and runtime-free, so it works from sync tests and inside tokio tests alike.
pub fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .disable_verification(true)
        .build();
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

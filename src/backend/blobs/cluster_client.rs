//! The HTTP client an agent reaches the in-cluster cache and the other nodes with: plain HTTP inside the
//! cluster, so it trusts no CA at all (an agent's bare image has no system certificates, and a client
//! that looked for them could not be built there), and never goes through a proxy.

use std::time::Duration;

/// How long a connection to the cache or another node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The client, or why it cannot be built.
pub fn cluster_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .tls_certs_only([])
        .build()
}

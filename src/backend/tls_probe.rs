//! Whether a registry's TLS handshake asks for a client certificate.
//!
//! Over TLS 1.3, a registry that requires a client certificate says it is missing in an alert sent after
//! the handshake. That alert races with the client's first request and is often lost: the request then
//! fails as "connection was not ready" or "connection closed". The CertificateRequest inside the handshake
//! cannot be lost, so a failure like that is explained by one more handshake that only listens for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio_rustls::TlsConnector;

/// True when `endpoint` (`host[:port]`, port 443 by default) asks for a client certificate during its
/// handshake. False when it does not, or cannot be reached within `timeout`.
pub async fn asks_for_client_certificate(endpoint: &str, timeout: Duration) -> bool {
    let Some((host, port)) = host_and_port(endpoint) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(host.to_owned()) else {
        return false;
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let Ok(builder) =
        ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let asked = Arc::new(Asked::default());
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(algorithms)))
        .with_client_cert_resolver(asked.clone());
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    };
    // Refused for want of a certificate or not, what counts is whether it was asked for.
    let _ = tokio::time::timeout(timeout, handshake).await;
    asked.0.load(Ordering::Relaxed)
}

fn host_and_port(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()?),
        _ => (endpoint, 443),
    };
    Some((host.trim_start_matches('[').trim_end_matches(']'), port))
}

/// Remembers being asked for a client certificate, and presents none.
#[derive(Debug, Default)]
struct Asked(AtomicBool);

impl ResolvesClientCert for Asked {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Accepts any server certificate: the probe sends nothing but its handshake and reads nothing after it.
#[derive(Debug)]
struct AnyServer(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, signature, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, signature, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_split_into_host_and_port() {
        assert_eq!(host_and_port("quay.io"), Some(("quay.io", 443)));
        assert_eq!(host_and_port("127.0.0.1:5000"), Some(("127.0.0.1", 5000)));
        assert_eq!(host_and_port("[::1]:5000"), Some(("::1", 5000)));
        assert_eq!(host_and_port("[::1]"), Some(("::1", 443)));
        assert_eq!(host_and_port("host:port"), None);
    }
}

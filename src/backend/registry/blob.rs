//! Blobs for the blob cache ([`crate::backend::blobs`]): one GET per call, from a byte offset, with the same
//! client, credentials and certificates as manifests, and the answer's status line and headers kept:
//! whether a `Range` was honoured (206 and `Content-Range`) and how long `Retry-After` asks to wait.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};

use super::Registry;
use super::error::{
    Context, RegistryError, blob_error, map_error, transport_cause, tried_everywhere,
};
use super::reference::parse_reference;
use crate::backend::distribution::{HttpError, content_range, retry_after};
use crate::model::reference::ImageRef;
use crate::model::served::Source;

/// One blob response under way: its body from byte `start` of the blob.
pub struct BlobBody {
    /// Where the body starts in the blob: the offset asked for when the registry answered 206, 0 when it
    /// answered 200 (it ignored the `Range`, or none was sent).
    pub start: u64,
    /// Whether the registry honoured the range (206).
    pub ranged: bool,
    /// The body as it arrives. An error means the transfer broke off (reset, closed early).
    pub stream: BoxStream<'static, Result<Bytes, BrokenOff>>,
}

/// Why a blob's body broke off on the way, in the transport's words made actionable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{cause}")]
pub struct BrokenOff {
    pub cause: String,
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

impl Registry {
    /// One GET of blob `digest` from `source`, from byte `offset` up to `end` (exclusive) or its end, with
    /// a `Range` unless that is the whole blob, with the repository's credentials; a 401 to a token renews it once. The body is not verified
    /// here: the caller hashes the whole blob. A 206 whose `Content-Range` does not start at `offset` is
    /// refused, so bytes never land in the wrong place. No read timeout: the blob cache detects stalls.
    pub async fn blob(
        &self,
        source: &Source,
        digest: &str,
        offset: u64,
        end: Option<u64>,
    ) -> Result<BlobBody, BlobFailure> {
        let label = format!("blob {digest} of {source}");
        let reference = parse_reference(&format!("{source}@{digest}"))?;
        let mut tried = Vec::new();
        let mut retry_after = None;
        for candidate in self.candidates(&reference, &label)? {
            let target = parse_reference(&candidate.reference)?;
            match self.blob_from(&target, &label, digest, offset, end).await {
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
        end: Option<u64>,
    ) -> Result<BlobBody, BlobFailure> {
        let label = label.to_owned();
        let registry = reference.registry.as_str();
        let host = self.host(registry, &label).await?;
        let path = format!("{}/blobs/{digest}", reference.repository);
        let range = match end {
            Some(end) => Some(format!("bytes={offset}-{}", end.saturating_sub(1))),
            None => (offset > 0).then(|| format!("bytes={offset}-")),
        };
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
                    let start = content_range(response.headers()).map(|r| r.start);
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
                            BrokenOff {
                                cause: transport_cause(&e, &context),
                            }
                        })
                    })
                    .boxed();
                Ok(BlobBody {
                    start,
                    ranged: status == http::StatusCode::PARTIAL_CONTENT,
                    stream,
                })
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn content_range_gives_the_bytes_a_partial_body_carries() {
        let range = |value: &str| content_range(&headers(&[(http::header::CONTENT_RANGE, value)]));
        assert_eq!(
            range("bytes 1048576-4194303/4194304"),
            Some(1_048_576..4_194_304)
        );
        assert_eq!(range("bytes 0-0/1"), Some(0..1));
        assert_eq!(range("bytes */4194304"), None);
        assert_eq!(range("items 1-2/3"), None);
    }
}

//! An image's config blob, read for what its manifest does not say: its layers' uncompressed digests,
//! which is how CRI-O knows a layer it holds already, and whole pulls name their layers' snapshots.

use futures::StreamExt;

use super::Registry;
use super::error::RegistryError;
use super::manifest::content_digest;
use crate::model::image::{ImageFacts, config_diff_ids};
use crate::model::served::Source;

/// An image config larger than this is refused: real ones are a few KiB.
const MAX_CONFIG_BYTES: usize = 4 << 20;

impl Registry {
    /// The uncompressed digests of `reference`'s layers (as resolved in `facts`), from its config blob,
    /// checked against its digest; in layer order.
    pub async fn diff_ids(
        &self,
        reference: &str,
        facts: &ImageFacts,
    ) -> Result<Vec<String>, RegistryError> {
        let config = self.config_blob(reference, facts).await?;
        let config: serde_json::Value =
            serde_json::from_slice(&config).map_err(|e| RegistryError::Invalid {
                reference: reference.to_string(),
                cause: format!("config {} is not JSON: {e}", facts.config_digest),
            })?;
        Ok(config_diff_ids(&config))
    }

    /// `reference`'s config blob (as resolved in `facts`), checked against its digest.
    pub async fn config_blob(
        &self,
        reference: &str,
        facts: &ImageFacts,
    ) -> Result<Vec<u8>, RegistryError> {
        let invalid = |cause: String| RegistryError::Invalid {
            reference: reference.to_string(),
            cause,
        };
        let source = Source::of(reference).map_err(|e| invalid(e.to_string()))?;
        let digest = &facts.config_digest;
        let mut body = self
            .blob(&source, digest, 0, None)
            .await
            .map_err(|failure| failure.error)?
            .stream;
        let mut config = Vec::new();
        while let Some(chunk) = body.next().await {
            config.extend_from_slice(&chunk.map_err(|e| invalid(format!("config {digest}: {e}")))?);
            if config.len() > MAX_CONFIG_BYTES {
                return Err(invalid(format!(
                    "config {digest} is over {MAX_CONFIG_BYTES} bytes"
                )));
            }
        }
        if content_digest(&config, digest).as_deref() != Some(digest.as_str()) {
            return Err(invalid(format!(
                "config {digest} does not match its digest"
            )));
        }
        Ok(config)
    }
}

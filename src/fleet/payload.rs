//! A release payload resolved into PinnedImageSets: the pull spec resolved once to a digest (for a
//! multi-arch payload, the index's; its entry for the nodes' platform is what is read), the payload's last
//! layer read as it streams in and no further ([`crate::backend::payload_layer`]), and its components made sets
//! ([`crate::model::release_payload`]). The one path behind `pinboard release` and every `--release`.

use futures::StreamExt as _;

use crate::backend::payload_layer::{PayloadLayerError, read_payload_layer};
use crate::backend::registry::{Registry, RegistryError};
use crate::error::Failure;
use crate::model::image::Platform;
use crate::model::reference::{ImageRef, ReferenceError};
use crate::model::release_payload::{
    Release, ReleasePayloadError, ReleaseSets, SetOptions, release_sets,
};
use crate::model::served::Source;

/// A release as read from its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The payload by digest: the pull spec a tag resolved to (an index's digest for a multi-arch payload).
    pub image: String,
    pub release: Release,
    /// The mirror the payload was read through; None: its own registry.
    pub mirror: Option<String>,
}

/// Why a release could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{pullspec}: {why}")]
    NotARelease {
        pullspec: String,
        #[source]
        why: NotARelease,
    },
}

/// Why what a pull spec names is not a release payload.
#[derive(Debug, thiserror::Error)]
pub enum NotARelease {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("its image has no layers")]
    NoLayers,
    #[error(transparent)]
    Layer(#[from] PayloadLayerError),
    #[error("not a release payload: {0}")]
    Payload(#[from] ReleasePayloadError),
}

impl From<ReleaseError> for Failure {
    fn from(error: ReleaseError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// Resolves `pullspec` for `platform` and reads its payload.
pub async fn resolve(
    registry: &Registry,
    pullspec: &str,
    platform: &Platform,
) -> Result<Resolved, ReleaseError> {
    let not_a_release = |why: NotARelease| ReleaseError::NotARelease {
        pullspec: pullspec.to_owned(),
        why,
    };
    let parsed = ImageRef::parse(pullspec).map_err(|e| not_a_release(e.into()))?;
    let (_, facts) = registry
        .inspect(pullspec, std::slice::from_ref(platform))
        .await?
        .swap_remove(0);
    let repository = format!("{}/{}", parsed.registry, parsed.repository);
    let image = format!(
        "{repository}@{}",
        facts
            .index_digest
            .as_deref()
            .unwrap_or(&facts.manifest_digest)
    );
    let last = facts
        .layers
        .last()
        .ok_or_else(|| not_a_release(NotARelease::NoLayers))?;
    let source = Source {
        registry: parsed.registry.clone(),
        repository: parsed.repository.clone(),
    };
    let layer = registry
        .blob(&source, &last.digest, 0, None)
        .await
        .map_err(|failure| failure.error)?;
    let bytes = layer
        .stream
        .map(|chunk| chunk.map_err(std::io::Error::other));
    let files = read_payload_layer(bytes)
        .await
        .map_err(|e| not_a_release(e.into()))?;
    let release = Release::parse(&files.image_references, &files.release_metadata)
        .map_err(|e| not_a_release(e.into()))?;
    Ok(Resolved {
        image,
        release,
        mirror: facts.mirror,
    })
}

/// `pullspec`'s release as sets (see [`release_sets`]).
pub async fn sets(
    registry: &Registry,
    pullspec: &str,
    platform: &Platform,
    options: &SetOptions,
) -> Result<(Resolved, ReleaseSets), ReleaseError> {
    let resolved = resolve(registry, pullspec, platform).await?;
    let sets = release_sets(&resolved.image, &resolved.release, options);
    Ok((resolved, sets))
}

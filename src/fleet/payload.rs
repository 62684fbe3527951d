//! A release payload resolved into PinnedImageSets: the pull spec resolved once to a digest (for a
//! multi-arch payload, the index's; its entry for the nodes' platform is what is read), the payload's last
//! layer read as it streams in and no further ([`crate::backend::payload_layer`]), and its components made sets
//! ([`crate::model::release_payload`]). The one path behind `pinboard release` and every `--release`.

use futures::StreamExt as _;

use crate::backend::payload_layer::read_payload_layer;
use crate::backend::registry::{Registry, RegistryError};
use crate::error::Failure;
use crate::model::image::Platform;
use crate::model::reference::ImageRef;
use crate::model::release_payload::{Release, ReleaseSets, SetOptions, release_sets};
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
    NotARelease { pullspec: String, why: String },
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
    let not_a_release = |why: String| ReleaseError::NotARelease {
        pullspec: pullspec.to_owned(),
        why,
    };
    let parsed = ImageRef::parse(pullspec).map_err(not_a_release)?;
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
        .ok_or_else(|| not_a_release("its image has no layers".into()))?;
    let source = Source {
        registry: parsed.registry.clone(),
        repository: parsed.repository.clone(),
    };
    let layer = registry
        .blob(&source, &last.digest, 0)
        .await
        .map_err(|failure| failure.error)?;
    let bytes = layer
        .stream
        .map(|chunk| chunk.map_err(std::io::Error::other));
    let files = read_payload_layer(bytes).await.map_err(not_a_release)?;
    let release = Release::parse(&files.image_references, &files.release_metadata)
        .map_err(|why| not_a_release(format!("not a release payload: {why}")))?;
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

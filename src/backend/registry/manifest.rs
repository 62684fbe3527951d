//! Manifests and indexes as registries send them: read (OCI and Docker v2), checked against their digest,
//! resolved per platform, and turned into [`ImageFacts`].

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Deserialize;
use sha2::Digest as _;

use super::reference::valid_digest;
use crate::model::image::{ImageFacts, Layer, Platform};

pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
const MEDIA_TYPE_DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
const MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// The `Accept` list of every manifest request.
pub const ACCEPTED_MEDIA_TYPES: [&str; 4] = [
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
];

/// The largest manifest accepted, as containerd limits them.
pub(super) const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// A manifest as fetched and verified.
#[derive(Debug)]
pub(super) struct Fetched {
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) manifest: Manifest,
    /// The mirror that served it; None: the source.
    pub(super) mirror: Option<String>,
    /// The bytes exactly as the registry sent them, and their media type: what a mirror serves.
    pub(super) body: Bytes,
    pub(super) media_type: String,
}

/// A manifest's bytes as its registry sent them (their digest verified), with its media type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestBytes {
    pub body: Bytes,
    pub media_type: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Manifest {
    Image {
        config: Layer,
        layers: Vec<Layer>,
        annotations: BTreeMap<String, String>,
    },
    Index {
        entries: Vec<IndexEntry>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct IndexEntry {
    pub(super) media_type: String,
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) platform: Option<Platform>,
    pub(super) annotations: BTreeMap<String, String>,
}

/// The media type a manifest declares, else the OCI one of its kind (OCI allows leaving it out).
pub(super) fn media_type(body: &[u8], manifest: &Manifest) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Declared {
        media_type: Option<String>,
    }
    let declared = serde_json::from_slice::<Declared>(body)
        .ok()
        .and_then(|d| d.media_type)
        .filter(|m| !m.is_empty());
    declared.unwrap_or_else(|| {
        match manifest {
            Manifest::Image { .. } => MEDIA_TYPE_OCI_MANIFEST,
            Manifest::Index { .. } => MEDIA_TYPE_OCI_INDEX,
        }
        .to_string()
    })
}

/// The digest of `body` with the algorithm of `like` (`sha256:...` or `sha512:...`).
pub(super) fn content_digest(body: &[u8], like: &str) -> Option<String> {
    match like.split_once(':')?.0 {
        "sha256" => Some(format!("sha256:{:x}", sha2::Sha256::digest(body))),
        "sha512" => Some(format!("sha512:{:x}", sha2::Sha512::digest(body))),
        _ => None,
    }
}

pub(super) fn image_facts(fetched: &Fetched, index: Option<(&Fetched, &IndexEntry)>) -> ImageFacts {
    let Manifest::Image {
        config,
        layers,
        annotations,
    } = &fetched.manifest
    else {
        unreachable!("image_facts is only called for image manifests")
    };
    // The index entry's annotations (SOCI puts its index digest there too), overridden by the manifest's.
    let mut all = index
        .map(|(_, entry)| entry.annotations.clone())
        .unwrap_or_default();
    all.extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    ImageFacts {
        manifest_digest: fetched.digest.clone(),
        manifest_size: fetched.size,
        index_digest: index.map(|(index, _)| index.digest.clone()),
        platform: index.and_then(|(_, entry)| entry.platform.clone()),
        config_digest: config.digest.clone(),
        config_size: config.size,
        layers: layers.clone(),
        annotations: all,
        mirror: fetched.mirror.clone(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    schema_version: Option<u32>,
    media_type: Option<String>,
    config: Option<RawDescriptor>,
    layers: Option<Vec<RawDescriptor>>,
    manifests: Option<Vec<RawDescriptor>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    annotations: Option<BTreeMap<String, String>>,
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

impl RawDescriptor {
    fn layer(self) -> Layer {
        Layer {
            digest: self.digest,
            media_type: self.media_type,
            size: self.size,
            annotations: self.annotations.unwrap_or_default(),
            diff_id: None,
        }
    }
}

/// What is wrong with a manifest a registry sent.
#[derive(Debug, thiserror::Error)]
pub(super) enum ManifestError {
    #[error("the registry sent a manifest that cannot be read ({0})")]
    Unreadable(serde_json::Error),
    #[error(
        "is a Docker schema 1 manifest, which pinboard and current runtimes do not support; \
         push the image again with a current tool"
    )]
    Schema1,
    #[error("has manifest schemaVersion {0}; only 2 is supported")]
    SchemaVersion(u32),
    #[error("has media type {0}, which is not an image manifest or index")]
    MediaType(String),
    #[error("is neither an image manifest nor an image index")]
    Neither,
    #[error("is an index without a \"manifests\" list")]
    IndexWithoutManifests,
    #[error("lists a manifest with an invalid digest {0:?}")]
    EntryDigest(String),
    #[error("is an image manifest without a config descriptor")]
    NoConfig,
}

/// Reads an OCI manifest or index, or a Docker v2 manifest or manifest list. Errors say what is wrong.
pub(super) fn parse_manifest(body: &[u8]) -> Result<Manifest, ManifestError> {
    let raw: RawManifest = serde_json::from_slice(body).map_err(ManifestError::Unreadable)?;
    let media_type = raw.media_type.as_deref().filter(|m| !m.is_empty());
    if raw.schema_version == Some(1)
        || matches!(
            media_type,
            Some(MEDIA_TYPE_DOCKER_SCHEMA1 | MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED)
        )
    {
        return Err(ManifestError::Schema1);
    }
    if let Some(version) = raw.schema_version.filter(|v| *v != 2) {
        return Err(ManifestError::SchemaVersion(version));
    }
    let is_index = match media_type {
        Some(MEDIA_TYPE_OCI_INDEX | MEDIA_TYPE_DOCKER_MANIFEST_LIST) => true,
        Some(MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST) => false,
        Some(other) => return Err(ManifestError::MediaType(other.to_owned())),
        None if raw.manifests.is_some() => true,
        None if raw.config.is_some() => false,
        None => return Err(ManifestError::Neither),
    };
    if is_index {
        let entries = raw
            .manifests
            .ok_or(ManifestError::IndexWithoutManifests)?
            .into_iter()
            .map(|d| {
                if !valid_digest(&d.digest) {
                    return Err(ManifestError::EntryDigest(d.digest));
                }
                Ok(IndexEntry {
                    platform: d.platform.map(|p| Platform {
                        os: p.os,
                        architecture: p.architecture,
                        variant: p.variant.filter(|v| !v.is_empty()),
                    }),
                    media_type: d.media_type,
                    digest: d.digest,
                    size: d.size,
                    annotations: d.annotations.unwrap_or_default(),
                })
            })
            .collect::<Result<_, ManifestError>>()?;
        Ok(Manifest::Index { entries })
    } else {
        let config = raw.config.ok_or(ManifestError::NoConfig)?.layer();
        let layers = raw
            .layers
            .unwrap_or_default()
            .into_iter()
            .map(RawDescriptor::layer)
            .collect();
        Ok(Manifest::Image {
            config,
            layers,
            annotations: raw.annotations.unwrap_or_default(),
        })
    }
}

fn is_image_manifest_entry(entry: &IndexEntry) -> bool {
    matches!(
        entry.media_type.as_str(),
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST | ""
    )
}

/// The index entry serving `want`: an exact variant match first, else the first entry that
/// [`Platform::accepts`], in index order.
pub(super) fn select_entry<'a>(
    entries: &'a [IndexEntry],
    want: &Platform,
) -> Option<&'a IndexEntry> {
    let candidates = || {
        entries.iter().filter(|e| {
            is_image_manifest_entry(e) && e.platform.as_ref().is_some_and(|p| want.accepts(p))
        })
    };
    candidates()
        .find(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| p.variant == want.variant)
        })
        .or_else(|| candidates().next())
}

/// The platforms an index offers, for messages; attestation entries (`unknown/unknown`) left out.
pub(super) fn available_platforms(entries: &[IndexEntry]) -> Vec<String> {
    let mut seen = Vec::new();
    for platform in entries
        .iter()
        .filter(|e| is_image_manifest_entry(e))
        .filter_map(|e| e.platform.as_ref())
    {
        let text = platform.to_string();
        if platform.os != "unknown" && !seen.contains(&text) {
            seen.push(text);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::image::{ANNOTATION_ESTARGZ_TOC, LazyFormat};

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
    const D4: &str = "sha256:4444444444444444444444444444444444444444444444444444444444444444";

    fn platform(text: &str) -> Platform {
        Platform::parse(text).unwrap()
    }

    fn index(entries: &[(&str, &str, &str)]) -> Vec<IndexEntry> {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(media_type, digest, platform)| {
                let parts: Vec<&str> = platform.split('/').collect();
                let mut p = serde_json::json!({"os": parts[0], "architecture": parts[1]});
                if let Some(v) = parts.get(2) {
                    p["variant"] = serde_json::json!(v);
                }
                serde_json::json!({"mediaType": media_type, "digest": digest, "size": 500, "platform": p})
            })
            .collect();
        let body = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": manifests});
        match parse_manifest(body.to_string().as_bytes()).unwrap() {
            Manifest::Index { entries } => entries,
            other => panic!("not an index: {other:?}"),
        }
    }

    #[test]
    fn parses_an_oci_manifest_with_sizes_and_annotations() {
        let body = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": D1, "size": 1234},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D2, "size": 5_000_000_000u64},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D3, "size": 77,
                 "annotations": {ANNOTATION_ESTARGZ_TOC: D4}}
            ],
            "annotations": {"org.opencontainers.image.title": "web"}
        });
        let Manifest::Image {
            config,
            layers,
            annotations,
        } = parse_manifest(body.to_string().as_bytes()).unwrap()
        else {
            panic!("not an image manifest")
        };
        assert_eq!((config.digest.as_str(), config.size), (D1, 1234));
        assert_eq!(
            layers.iter().map(|l| l.size).collect::<Vec<_>>(),
            [5_000_000_000, 77]
        );
        assert_eq!(layers[1].annotations[ANNOTATION_ESTARGZ_TOC], D4);
        assert_eq!(annotations["org.opencontainers.image.title"], "web");
        let fetched = Fetched {
            digest: D4.into(),
            size: 300,
            manifest: Manifest::Image {
                config,
                layers,
                annotations,
            },
            body: Bytes::from(body.to_string()),
            media_type: MEDIA_TYPE_OCI_MANIFEST.into(),
            mirror: None,
        };
        let facts = image_facts(&fetched, None);
        assert_eq!(facts.lazy_format(), LazyFormat::Estargz);
        assert_eq!(facts.compressed_layer_bytes(), 5_000_000_077);
        assert_eq!((facts.index_digest, facts.platform), (None, None));
    }

    #[test]
    fn media_types_decide_the_kind_and_old_or_foreign_ones_are_refused() {
        let config = serde_json::json!({"mediaType": "application/vnd.docker.container.image.v1+json", "digest": D1, "size": 1});
        let docker = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST, "config": config, "layers": []});
        assert!(matches!(
            parse_manifest(docker.to_string().as_bytes()),
            Ok(Manifest::Image { .. })
        ));
        // OCI allows leaving mediaType out; the fields tell.
        let bare = serde_json::json!({"schemaVersion": 2, "config": config, "layers": []});
        assert!(matches!(
            parse_manifest(bare.to_string().as_bytes()),
            Ok(Manifest::Image { .. })
        ));
        let bare_index = serde_json::json!({"schemaVersion": 2, "manifests": []});
        assert!(matches!(
            parse_manifest(bare_index.to_string().as_bytes()),
            Ok(Manifest::Index { .. })
        ));
        let list = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST_LIST, "manifests": [
            {"mediaType": MEDIA_TYPE_DOCKER_MANIFEST, "digest": D2, "size": 10,
             "platform": {"os": "linux", "architecture": "arm", "variant": "v7", "features": ["x"]}}]});
        let Ok(Manifest::Index { entries }) = parse_manifest(list.to_string().as_bytes()) else {
            panic!()
        };
        assert_eq!(entries[0].platform, Some(platform("linux/arm/v7")));

        let schema1 = serde_json::json!({"schemaVersion": 1, "name": "x", "fsLayers": []});
        assert!(
            parse_manifest(schema1.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("schema 1")
        );
        let artifact = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.chart", "config": config});
        assert!(
            parse_manifest(artifact.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("application/vnd.cncf.helm.chart")
        );
        let negative = serde_json::json!({"schemaVersion": 2, "config": {"mediaType": "x", "digest": D1, "size": -1}});
        assert!(parse_manifest(negative.to_string().as_bytes()).is_err());
        let bad_entry = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": "sha256:../../x", "size": 1}]});
        assert!(
            parse_manifest(bad_entry.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("invalid digest")
        );
        assert!(
            parse_manifest(b"<html>")
                .unwrap_err()
                .to_string()
                .contains("cannot be read")
        );
    }

    #[test]
    fn index_resolves_per_platform_preferring_exact_variants() {
        let entries = index(&[
            (MEDIA_TYPE_OCI_MANIFEST, D1, "linux/amd64"),
            (MEDIA_TYPE_OCI_MANIFEST, D2, "linux/arm64"),
            (MEDIA_TYPE_OCI_MANIFEST, D3, "linux/arm64/v8"),
            (MEDIA_TYPE_OCI_MANIFEST, D4, "unknown/unknown"),
        ]);
        let pick = |p: &str| select_entry(&entries, &platform(p)).map(|e| e.digest.as_str());
        assert_eq!(pick("linux/amd64"), Some(D1));
        assert_eq!(pick("linux/arm64/v8"), Some(D3));
        assert_eq!(pick("linux/arm64"), Some(D2));
        assert_eq!(pick("linux/s390x"), None);
        assert_eq!(pick("windows/amd64"), None);
        assert_eq!(
            available_platforms(&entries),
            ["linux/amd64", "linux/arm64", "linux/arm64/v8"]
        );
        // Entries that are not image manifests (nested indexes, artifacts) are not candidates.
        let nested = index(&[(MEDIA_TYPE_OCI_INDEX, D1, "linux/amd64")]);
        assert_eq!(select_entry(&nested, &platform("linux/amd64")), None);
    }

    #[test]
    fn digests_are_verified_with_the_reference_algorithm() {
        let body = b"{}";
        let sha256 = format!("sha256:{:x}", sha2::Sha256::digest(body));
        assert_eq!(content_digest(body, D1), Some(sha256.clone()));
        assert_eq!(
            sha256, "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "known sha256 of {{}}"
        );
        assert!(
            content_digest(body, "sha512:00")
                .unwrap()
                .starts_with("sha512:")
        );
        assert_eq!(content_digest(body, "md5:00"), None);
        assert!(valid_digest(D1) && !valid_digest("sha256:ABC") && !valid_digest("D1"));
    }

    #[test]
    fn manifests_without_a_media_type_get_the_oci_one_of_their_kind() {
        let bare_index = br#"{"schemaVersion": 2, "manifests": []}"#;
        let parsed = parse_manifest(bare_index).unwrap();
        assert_eq!(media_type(bare_index, &parsed), MEDIA_TYPE_OCI_INDEX);
        let docker =
            serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_DOCKER_MANIFEST,
            "config": {"mediaType": "x", "digest": D1, "size": 1}, "layers": []})
            .to_string();
        let parsed = parse_manifest(docker.as_bytes()).unwrap();
        assert_eq!(
            media_type(docker.as_bytes(), &parsed),
            MEDIA_TYPE_DOCKER_MANIFEST
        );
    }
}

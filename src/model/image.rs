//! What a registry says about one image for one platform: its blobs, their sizes, and its lazy-pull format.
//!
//! These are plain facts, filled in by `backend::registry` and read by the planner. The lazy-pull format is
//! decided here, from manifest and layer annotations alone, so it is testable without a registry.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Failure;

/// A `--platform` that is not `os/architecture[/variant]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("platform {text:?} is not os/architecture[/variant], e.g. linux/arm64/v8")]
pub struct PlatformError {
    pub text: String,
}

impl From<PlatformError> for Failure {
    fn from(error: PlatformError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// An OCI platform: what an image index is resolved against for one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// The platform pinboard itself runs on, in OCI's names (`amd64`, `arm64`, ...).
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture: architecture.to_string(),
            variant: None,
        }
    }

    /// Parses `os/arch[/variant]`, as `--platform` takes it.
    pub fn parse(text: &str) -> Result<Self, PlatformError> {
        let parts: Vec<&str> = text.split('/').collect();
        match parts.as_slice() {
            [os, arch] if !os.is_empty() && !arch.is_empty() => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if !os.is_empty() && !arch.is_empty() && !variant.is_empty() => {
                Ok(Platform {
                    os: os.to_string(),
                    architecture: arch.to_string(),
                    variant: Some(variant.to_string()),
                })
            }
            _ => Err(PlatformError {
                text: text.to_owned(),
            }),
        }
    }

    /// Whether an index entry for `candidate` serves this platform. A missing variant on either side matches,
    /// as containerd's default matcher does for the common single-variant architectures.
    pub fn accepts(&self, candidate: &Platform) -> bool {
        self.os == candidate.os
            && self.architecture == candidate.architecture
            && match (&self.variant, &candidate.variant) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// How an image can be pulled lazily, if at all (docs/lazy-pulling.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LazyFormat {
    #[serde(rename = "estargz")]
    Estargz,
    #[serde(rename = "zstd:chunked")]
    ZstdChunked,
    #[serde(rename = "nydus")]
    Nydus,
    #[serde(rename = "soci")]
    Soci,
    #[serde(rename = "none")]
    None,
}

impl LazyFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LazyFormat::Estargz => "estargz",
            LazyFormat::ZstdChunked => "zstd:chunked",
            LazyFormat::Nydus => "nydus",
            LazyFormat::Soci => "soci",
            LazyFormat::None => "none",
        }
    }
}

impl fmt::Display for LazyFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub const ANNOTATION_ESTARGZ_TOC: &str = "containerd.io/snapshot/stargz/toc.digest";
pub const ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE: &str = "io.containers.estargz.uncompressed-size";
pub const ANNOTATION_ZSTD_CHUNKED_CHECKSUM: &str =
    "io.github.containers.zstd-chunked.manifest-checksum";
pub const ANNOTATION_ZSTD_CHUNKED_POSITION: &str =
    "io.github.containers.zstd-chunked.manifest-position";
pub const ANNOTATION_SOCI_INDEX: &str = "com.amazon.soci.index-digest";
pub const MEDIA_TYPE_NYDUS_BLOB: &str = "application/vnd.oci.image.layer.nydus.blob.v1";

/// A content-addressed blob: a config or a layer as the manifest describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    pub digest: String,
    pub media_type: String,
    /// Compressed size: what crosses the network.
    pub size: u64,
    pub annotations: BTreeMap<String, String>,
    /// The uncompressed digest (from the image config's `rootfs.diff_ids`), where the config was read: how
    /// CRI-O knows a layer it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_id: Option<String>,
}

impl Layer {
    /// The uncompressed size, where an annotation states it (eStargz does).
    pub fn uncompressed_size(&self) -> Option<u64> {
        self.annotations
            .get(ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE)
            .and_then(|v| v.trim().parse().ok())
    }
}

/// One image, resolved to one platform.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFacts {
    /// Digest of the platform manifest (equal to the reference's digest unless it named an index).
    pub manifest_digest: String,
    /// Size of the platform manifest itself.
    pub manifest_size: u64,
    /// Set when the reference named an index (manifest list) that was resolved for a platform.
    pub index_digest: Option<String>,
    pub platform: Option<Platform>,
    pub config_digest: String,
    pub config_size: u64,
    pub layers: Vec<Layer>,
    pub annotations: BTreeMap<String, String>,
    /// The mirror whose location served the manifest (registries.conf, ImageDigestMirrorSet); None: the
    /// source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
}

impl ImageFacts {
    pub fn compressed_layer_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }

    /// The lazy-pull format, from the manifest's annotations and its layers'. A format counts when any layer
    /// carries it: those layers are fetched lazily even when others are not.
    pub fn lazy_format(&self) -> LazyFormat {
        if self.annotations.contains_key(ANNOTATION_SOCI_INDEX) {
            return LazyFormat::Soci;
        }
        let any = |pred: &dyn Fn(&Layer) -> bool| self.layers.iter().any(pred);
        if any(&|l| l.media_type == MEDIA_TYPE_NYDUS_BLOB) {
            LazyFormat::Nydus
        } else if any(&|l| l.annotations.contains_key(ANNOTATION_ZSTD_CHUNKED_CHECKSUM)) {
            LazyFormat::ZstdChunked
        } else if any(&|l| l.annotations.contains_key(ANNOTATION_ESTARGZ_TOC)) {
            LazyFormat::Estargz
        } else {
            LazyFormat::None
        }
    }
}

/// The uncompressed digests of an OCI image config's layers (`rootfs.diff_ids`), in layer order; empty when
/// it lists none.
pub fn config_diff_ids(config: &serde_json::Value) -> Vec<String> {
    config["rootfs"]["diff_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(|id| id.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_config_lists_its_layers_by_uncompressed_digest() {
        let config = serde_json::json!({
            "architecture": "amd64",
            "rootfs": {"type": "layers", "diff_ids": ["sha256:aa", "sha256:bb"]},
        });
        assert_eq!(config_diff_ids(&config), ["sha256:aa", "sha256:bb"]);
        assert!(config_diff_ids(&serde_json::json!({})).is_empty());
    }

    fn layer(media_type: &str, annotations: &[(&str, &str)]) -> Layer {
        Layer {
            digest: "sha256:00".into(),
            media_type: media_type.into(),
            size: 10,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            diff_id: None,
        }
    }

    fn facts(layers: Vec<Layer>, annotations: &[(&str, &str)]) -> ImageFacts {
        ImageFacts {
            manifest_digest: "sha256:aa".into(),
            manifest_size: 1,
            index_digest: None,
            platform: None,
            config_digest: "sha256:bb".into(),
            config_size: 1,
            layers,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mirror: None,
        }
    }

    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

    #[test]
    fn lazy_format_comes_from_annotations_and_media_types() {
        assert_eq!(
            facts(vec![layer(GZIP, &[])], &[]).lazy_format(),
            LazyFormat::None
        );
        let estargz = layer(GZIP, &[(ANNOTATION_ESTARGZ_TOC, "sha256:11")]);
        assert_eq!(
            facts(vec![layer(GZIP, &[]), estargz], &[]).lazy_format(),
            LazyFormat::Estargz
        );
        let chunked = layer(ZSTD, &[(ANNOTATION_ZSTD_CHUNKED_CHECKSUM, "sha256:22")]);
        assert_eq!(
            facts(vec![chunked], &[]).lazy_format(),
            LazyFormat::ZstdChunked
        );
        assert_eq!(
            facts(vec![layer(MEDIA_TYPE_NYDUS_BLOB, &[])], &[]).lazy_format(),
            LazyFormat::Nydus
        );
        assert_eq!(
            facts(
                vec![layer(GZIP, &[])],
                &[(ANNOTATION_SOCI_INDEX, "sha256:33")]
            )
            .lazy_format(),
            LazyFormat::Soci
        );
    }

    #[test]
    fn uncompressed_size_only_where_annotated() {
        assert_eq!(layer(GZIP, &[]).uncompressed_size(), None);
        assert_eq!(
            layer(GZIP, &[(ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE, "4096")]).uncompressed_size(),
            Some(4096)
        );
        assert_eq!(
            layer(GZIP, &[(ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE, "lots")]).uncompressed_size(),
            None
        );
    }

    #[test]
    fn platforms_parse_and_match_like_containerd() {
        let arm = Platform::parse("linux/arm64/v8").unwrap();
        assert_eq!(arm.to_string(), "linux/arm64/v8");
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux//v7").is_err());
        let plain_arm = Platform::parse("linux/arm64").unwrap();
        assert!(plain_arm.accepts(&arm));
        assert!(arm.accepts(&plain_arm));
        assert!(!arm.accepts(&Platform::parse("linux/arm/v7").unwrap()));
        assert!(
            !Platform::parse("linux/arm/v6")
                .unwrap()
                .accepts(&Platform::parse("linux/arm/v7").unwrap())
        );
    }
}

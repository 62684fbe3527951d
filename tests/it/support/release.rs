//! OpenShift-like release payloads in the lab registry, laid out as `oc adm release new` writes them: a
//! base layer standing in for the cluster-version operator's binary, then the payload layer, last, which
//! starts with `release-manifests/`, `release-manifests/image-references` (an indented `ImageStream` JSON)
//! and `release-manifests/release-metadata` (`cincinnati-metadata-v0`), followed by operators' manifests.
//! The image config carries the label `io.openshift.release`. Pushed under a release-like tag; a multi-arch
//! release is an index over one such image per platform.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::json;

use super::images::{self, BuiltLayer, Extras, ImageSpec, LayerFormat, LayerSpec, Platform};
use super::lab::Lab;

/// One release payload: its version, its `image-references` tags (name, `from.kind`, `from.name`), and how
/// big the parts that must never be downloaded are.
#[derive(Clone, Debug)]
pub struct ReleaseSpec {
    pub version: String,
    pub tags: Vec<(String, String, String)>,
    /// The base layer (the operator's binary).
    pub base_bytes: usize,
    /// The operators' manifests that follow the two files in the payload layer.
    pub manifests_bytes: usize,
}

/// A release as pushed: the digest its tag resolves to, and its base layer's size.
#[derive(Clone, Debug)]
pub struct PushedRelease {
    /// `HOST/REPO:TAG`.
    pub tag_reference: String,
    /// The manifest's digest, or the index's for a multi-arch release.
    pub digest: String,
    pub base_layer_size: u64,
}

impl PushedRelease {
    /// `HOST/REPO@DIGEST`.
    pub fn digest_reference(&self) -> String {
        let name = self.tag_reference.rsplit_once(':').map_or("", |(n, _)| n);
        format!("{name}@{}", self.digest)
    }
}

impl ReleaseSpec {
    /// The payload layer: the two files first, as `oc adm release new` writes them, then the manifests.
    fn payload_layer(&self) -> Result<BuiltLayer> {
        let tags: Vec<_> = self
            .tags
            .iter()
            .map(|(name, kind, from)| {
                json!({"name": name, "annotations": {"io.openshift.build.source-location": "https://github.com/openshift/x"},
                       "from": {"kind": kind, "name": from}, "generation": null, "importPolicy": {},
                       "referencePolicy": {"type": "Source"}})
            })
            .collect();
        let references = serde_json::to_string_pretty(&json!({
            "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
            "metadata": {"name": self.version, "creationTimestamp": null,
                         "annotations": {"release.openshift.io/from-image-stream": "ocp/4.19-art-latest"}},
            "spec": {"lookupPolicy": {"local": false}, "tags": tags},
            "status": {"dockerImageRepository": ""}
        }))?;
        let metadata = json!({"kind": "cincinnati-metadata-v0", "version": self.version,
            "previous": ["4.19.1", "4.19.2"], "metadata": {"url": "https://example.com/errata"}})
        .to_string();
        let manifests = images::random_bytes(0x0c70, self.manifests_bytes);
        let mut builder = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_ustar();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_cksum();
        builder.append_data(&mut dir, "release-manifests/", std::io::empty())?;
        for (name, content) in [
            ("release-manifests/image-references", references.as_bytes()),
            ("release-manifests/release-metadata", metadata.as_bytes()),
            (
                "release-manifests/0000_50_cluster-operator_07_manifests.yaml",
                &manifests,
            ),
        ] {
            let mut header = tar::Header::new_ustar();
            header.set_mode(0o644);
            header.set_size(content.len() as u64);
            builder.append_data(&mut header, name, content)?;
        }
        BuiltLayer::gzip(&builder.into_inner()?)
    }

    /// The base layer's spec (seeded by the version, so two releases differ).
    fn base(&self) -> ImageSpec {
        let seed = self.version.bytes().fold(0x5eed_u64, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        });
        ImageSpec {
            layers: vec![LayerSpec {
                seed,
                bytes: self.base_bytes,
                format: LayerFormat::Gzip,
            }],
            annotations: BTreeMap::new(),
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("io.openshift.release".to_owned(), self.version.clone())])
    }
}

impl Lab {
    /// Pushes a single-platform (linux/amd64) release to `repo` under `tag`.
    pub fn push_release(&self, repo: &str, tag: &str, spec: &ReleaseSpec) -> Result<PushedRelease> {
        let payload = spec.payload_layer()?;
        let extras = Extras {
            built: std::slice::from_ref(&payload),
            labels: spec.labels(),
            tag: Some(tag),
            ..Extras::default()
        };
        let image = images::push_image_with(
            self.registry(),
            self.layer_cache(),
            repo,
            &spec.base(),
            &Platform::linux_amd64(),
            &extras,
        )?;
        Ok(PushedRelease {
            tag_reference: format!("{}/{repo}:{tag}", self.registry_host()),
            digest: image.manifest_digest,
            base_layer_size: image.layers[0].size,
        })
    }

    /// Pushes a multi-arch release: an index over one release image per platform, under `tag`.
    pub fn push_multi_release(
        &self,
        repo: &str,
        tag: &str,
        per_platform: &[(Platform, ReleaseSpec)],
    ) -> Result<PushedRelease> {
        let payloads = per_platform
            .iter()
            .map(|(_, spec)| spec.payload_layer())
            .collect::<Result<Vec<_>>>()?;
        let images: Vec<_> = per_platform
            .iter()
            .zip(&payloads)
            .map(|((platform, spec), payload)| {
                let extras = Extras {
                    built: std::slice::from_ref(payload),
                    labels: spec.labels(),
                    tag: None,
                    ..Extras::default()
                };
                (platform.clone(), spec.base(), extras)
            })
            .collect();
        let index = images::push_index_with(
            self.registry(),
            self.layer_cache(),
            repo,
            &images,
            Some(tag),
        )?;
        let first = &index.manifests[0].1;
        Ok(PushedRelease {
            tag_reference: format!("{}/{repo}:{tag}", self.registry_host()),
            digest: index.digest,
            base_layer_size: first.layers[0].size,
        })
    }
}

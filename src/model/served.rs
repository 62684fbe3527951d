//! What a pull-through mirror of image sets may serve, and for which source repository a request is.
//!
//! [`ServedDigests`] lists, per source repository, the digests of the sets' images: each reference's index (if it
//! names one), the platform manifest, the config and the layers, with their sizes. The endpoint answers
//! only these: anything else is 404, so it never becomes an open proxy to private images. Tags are never
//! listed: sets are digest-only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::image::ImageFacts;
use crate::model::reference::{ImageRef, ReferenceError};

/// A repository on its source registry, as the image reference names it (`127.0.0.1:5000` + `app/web`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    /// Host with optional port.
    pub registry: String,
    pub repository: String,
}

impl Source {
    /// The source repository of an image reference.
    pub fn of(reference: &str) -> Result<Source, ReferenceError> {
        let parsed = ImageRef::parse(reference)?;
        Ok(Source {
            registry: parsed.registry,
            repository: parsed.repository,
        })
    }
}

/// How a source registry is named as the first path segment of a mirror location (`<endpoint>/<segment>`):
/// lowercase, a port's `:` as `_`, so that the references containers-image makes of it are valid (a path
/// segment holds no `:`; real CRI-O refuses `mirror:5050/registry:5000/app` as an invalid reference).
/// A host name holds no `_`, so the segment names one registry.
pub fn mirror_segment(registry: &str) -> String {
    registry.to_lowercase().replace(':', "_")
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)
    }
}

/// What a digest is, and what is known of its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// A manifest or index, served from `/manifests/`. An index's size is not in the facts: `None`.
    Manifest { size: Option<u64> },
    /// A config or layer, served from `/blobs/`.
    Blob { size: u64 },
}

/// The digests a mirror may serve, per source repository.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServedDigests {
    repos: BTreeMap<Source, BTreeMap<String, Content>>,
}

impl ServedDigests {
    /// Everything the images need, from their facts (reference → facts for the nodes' platform). A reference
    /// that cannot be parsed is skipped: the sets were validated before they were surveyed.
    pub fn from_facts<'a>(
        facts: impl IntoIterator<Item = (&'a str, &'a ImageFacts)>,
    ) -> ServedDigests {
        let mut allowed = ServedDigests::default();
        for (reference, facts) in facts {
            let Ok(source) = Source::of(reference) else {
                continue;
            };
            let digests = allowed.repos.entry(source).or_default();
            if let Some(index) = &facts.index_digest {
                digests.insert(index.clone(), Content::Manifest { size: None });
            }
            digests.insert(
                facts.manifest_digest.clone(),
                Content::Manifest {
                    size: Some(facts.manifest_size),
                },
            );
            digests.insert(
                facts.config_digest.clone(),
                Content::Blob {
                    size: facts.config_size,
                },
            );
            for layer in &facts.layers {
                digests.insert(layer.digest.clone(), Content::Blob { size: layer.size });
            }
        }
        allowed
    }

    /// What `digest` is in `source`, if the mirror may serve it there.
    pub fn get(&self, source: &Source, digest: &str) -> Option<Content> {
        self.repos.get(source)?.get(digest).copied()
    }

    /// The source repository a request for `/v2/<name>/...` is about: with containerd's `ns=<registry>`
    /// parameter, `name` is the repository on that registry; without it (containers-image and OpenShift
    /// mirrors with a path prefix), `name` starts with the registry host, as [`mirror_segment`] writes it
    /// (or as written). `None` when no set uses it.
    pub fn source_of(&self, ns: Option<&str>, name: &str) -> Option<Source> {
        let source = match ns {
            Some(registry) => Source {
                registry: registry.to_string(),
                repository: name.to_string(),
            },
            None => {
                let (segment, repository) = name.split_once('/')?;
                let registry = self
                    .registries()
                    .into_iter()
                    .find(|r| *r == segment || mirror_segment(r) == segment)?;
                Source {
                    registry: registry.to_string(),
                    repository: repository.to_string(),
                }
            }
        };
        self.repos.contains_key(&source).then_some(source)
    }

    /// The source registries, each once, sorted.
    pub fn registries(&self) -> BTreeSet<&str> {
        self.repos.keys().map(|s| s.registry.as_str()).collect()
    }

    /// Every distinct blob (config or layer) with its size and one repository that has it: what crosses
    /// the link once when every node pulls through the mirror. Sorted by digest.
    pub fn blobs(&self) -> Vec<(&Source, &str, u64)> {
        let mut seen = BTreeMap::new();
        for (source, digests) in &self.repos {
            for (digest, content) in digests {
                if let Content::Blob { size } = content {
                    seen.entry(digest.as_str()).or_insert((source, *size));
                }
            }
        }
        seen.into_iter()
            .map(|(digest, (source, size))| (source, digest, size))
            .collect()
    }

    /// Distinct manifests and indexes (all repositories together).
    pub fn manifest_count(&self) -> usize {
        let manifests: BTreeSet<&str> = self
            .repos
            .values()
            .flat_map(|digests| {
                digests
                    .iter()
                    .filter(|(_, c)| matches!(c, Content::Manifest { .. }))
                    .map(|(d, _)| d.as_str())
            })
            .collect();
        manifests.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::image::Layer;

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn facts(manifest: u8, index: Option<u8>, config: u8, layers: &[(u8, u64)]) -> ImageFacts {
        ImageFacts {
            manifest_digest: digest(manifest),
            manifest_size: 500,
            index_digest: index.map(digest),
            platform: None,
            config_digest: digest(config),
            config_size: 100,
            layers: layers
                .iter()
                .map(|&(d, size)| Layer {
                    digest: digest(d),
                    media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                    size,
                    annotations: BTreeMap::new(),
                    diff_id: None,
                })
                .collect(),
            annotations: BTreeMap::new(),
            mirror: None,
        }
    }

    fn source(text: &str) -> Source {
        let (registry, repository) = text.split_once('/').unwrap();
        Source {
            registry: registry.into(),
            repository: repository.into(),
        }
    }

    #[test]
    fn only_the_sets_digests_are_allowed_and_only_in_their_repositories() {
        let web = facts(1, Some(2), 3, &[(10, 1000), (11, 2000)]);
        let db = facts(4, None, 5, &[(10, 1000), (12, 3000)]);
        let web_ref = format!("quay.io/acme/web@{}", digest(2));
        let db_ref = format!("127.0.0.1:5000/db@{}", digest(4));
        let allowed = ServedDigests::from_facts([(web_ref.as_str(), &web), (db_ref.as_str(), &db)]);

        let web_source = source("quay.io/acme/web");
        assert_eq!(
            allowed.get(&web_source, &digest(2)),
            Some(Content::Manifest { size: None }),
            "the index the reference names"
        );
        assert_eq!(
            allowed.get(&web_source, &digest(1)),
            Some(Content::Manifest { size: Some(500) })
        );
        assert_eq!(
            allowed.get(&web_source, &digest(3)),
            Some(Content::Blob { size: 100 })
        );
        assert_eq!(
            allowed.get(&web_source, &digest(11)),
            Some(Content::Blob { size: 2000 })
        );
        // A digest of another repository is not served from this one, nor an unknown digest, nor a tag.
        assert_eq!(allowed.get(&web_source, &digest(12)), None);
        assert_eq!(allowed.get(&web_source, &digest(99)), None);
        assert_eq!(allowed.get(&web_source, "latest"), None);
        assert_eq!(allowed.get(&source("quay.io/acme/other"), &digest(1)), None);

        assert_eq!(
            allowed.registries().into_iter().collect::<Vec<_>>(),
            ["127.0.0.1:5000", "quay.io"]
        );
        // The shared layer counts once.
        let blobs = allowed.blobs();
        assert_eq!(blobs.len(), 5, "{blobs:?}");
        assert_eq!(
            blobs.iter().map(|(_, _, size)| size).sum::<u64>(),
            100 + 100 + 1000 + 2000 + 3000
        );
        assert_eq!(allowed.manifest_count(), 3);
    }

    #[test]
    fn requests_name_their_source_by_ns_or_by_a_host_prefix() {
        let app = facts(1, None, 3, &[(10, 1)]);
        let hub = facts(4, None, 5, &[(11, 1)]);
        let app_ref = format!("127.0.0.1:5000/team/app@{}", digest(1));
        let hub_ref = format!("docker.io/library/nginx@{}", digest(4));
        let allowed =
            ServedDigests::from_facts([(app_ref.as_str(), &app), (hub_ref.as_str(), &hub)]);

        // containerd: `?ns=<registry>` and the repository as the path.
        assert_eq!(
            allowed.source_of(Some("127.0.0.1:5000"), "team/app"),
            Some(source("127.0.0.1:5000/team/app"))
        );
        assert_eq!(
            allowed.source_of(Some("docker.io"), "library/nginx"),
            Some(source("docker.io/library/nginx"))
        );
        // containers-image / ImageDigestMirrorSet: the source host is the first path segment.
        assert_eq!(
            allowed.source_of(None, "127.0.0.1:5000/team/app"),
            Some(source("127.0.0.1:5000/team/app"))
        );
        // A port as containers-image can name it in a path: `_` for `:`.
        assert_eq!(mirror_segment("127.0.0.1:5000"), "127.0.0.1_5000");
        assert_eq!(mirror_segment("Quay.IO"), "quay.io");
        assert_eq!(
            allowed.source_of(None, "127.0.0.1_5000/team/app"),
            Some(source("127.0.0.1:5000/team/app"))
        );
        assert_eq!(
            allowed.source_of(None, "docker.io/library/nginx"),
            Some(source("docker.io/library/nginx"))
        );
        assert_eq!(allowed.source_of(None, "team/app"), None);
        assert_eq!(allowed.source_of(Some("quay.io"), "team/app"), None);
        assert_eq!(allowed.source_of(None, "nginx"), None);
    }

    #[test]
    fn sources_come_from_references_as_container_tools_read_them() {
        assert_eq!(
            Source::of("quay.io/ns/img@sha256:00").unwrap().to_string(),
            "quay.io/ns/img"
        );
        assert_eq!(
            Source::of("nginx").unwrap(),
            source("docker.io/library/nginx")
        );
        assert!(Source::of("").is_err());
    }
}

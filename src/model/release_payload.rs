//! OpenShift release payloads as image sets: what `release-manifests/image-references` (an ImageStream
//! naming every component's pull spec) and `release-manifests/release-metadata` (the version) say, and the
//! PinnedImageSets that pin an upgrade's images: every unique component digest plus the release image
//! itself, by digest (`image-references` does not list it, yet the cluster-version operator runs it during
//! the upgrade). Pure: reading the payload is [`crate::backend::payload_layer`]'s job.

use std::collections::{BTreeMap, HashSet};

use regex::Regex;
use serde::Deserialize;

use super::machine_config::ROLE_LABEL;
use super::set::{Entry, ImageSet, MAX_ENTRIES, Origin};

/// Where `oc adm release new` puts the component list and the version in the payload's last layer.
pub const IMAGE_REFERENCES: &str = "release-manifests/image-references";
pub const RELEASE_METADATA: &str = "release-manifests/release-metadata";

/// Why the two files are not a release's: what was found instead.
#[derive(Debug, thiserror::Error)]
pub enum ReleasePayloadError {
    #[error("{IMAGE_REFERENCES} is not JSON ({0}); a release payload holds an ImageStream there")]
    ReferencesNotJson(serde_json::Error),
    #[error(
        "{IMAGE_REFERENCES} is kind {kind:?} apiVersion {api_version:?}, not an ImageStream of \
         image.openshift.io/v1"
    )]
    NotAnImageStream { kind: String, api_version: String },
    #[error("{RELEASE_METADATA} is not JSON ({0})")]
    MetadataNotJson(serde_json::Error),
    #[error(
        "{RELEASE_METADATA} is kind {kind:?} with version {version:?}, not cincinnati-metadata-v0 with a \
         version"
    )]
    NotReleaseMetadata { kind: String, version: String },
}

/// One component of a release: its tag name in `image-references` and its pull spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub pullspec: String,
}

/// What a payload says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// `4.19.3`, from `release-metadata`.
    pub version: String,
    /// Every `DockerImage` tag, in the order `image-references` lists them.
    pub components: Vec<Component>,
    /// Tags whose `from.kind` is not `DockerImage`: (name, kind). `oc adm release info` leaves them out too.
    pub skipped: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageStream {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    spec: StreamSpec,
}

#[derive(Default, Deserialize)]
struct StreamSpec {
    #[serde(default)]
    tags: Vec<Tag>,
}

#[derive(Deserialize)]
struct Tag {
    name: String,
    from: Option<From>,
}

#[derive(Deserialize)]
struct From {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    version: String,
}

impl Release {
    /// Reads the two files. Errors say what was found instead of a release.
    pub fn parse(
        image_references: &str,
        release_metadata: &str,
    ) -> Result<Release, ReleasePayloadError> {
        let stream: ImageStream = serde_json::from_str(image_references)
            .map_err(ReleasePayloadError::ReferencesNotJson)?;
        if stream.kind != "ImageStream" || !stream.api_version.starts_with("image.openshift.io/") {
            return Err(ReleasePayloadError::NotAnImageStream {
                kind: stream.kind,
                api_version: stream.api_version,
            });
        }
        let metadata: Metadata =
            serde_json::from_str(release_metadata).map_err(ReleasePayloadError::MetadataNotJson)?;
        if metadata.kind != "cincinnati-metadata-v0" || metadata.version.is_empty() {
            return Err(ReleasePayloadError::NotReleaseMetadata {
                kind: metadata.kind,
                version: metadata.version,
            });
        }
        let (mut components, mut skipped) = (Vec::new(), Vec::new());
        for tag in stream.spec.tags {
            match tag.from {
                Some(from) if from.kind == "DockerImage" && !from.name.is_empty() => components
                    .push(Component {
                        name: tag.name,
                        pullspec: from.name,
                    }),
                Some(from) => skipped.push((tag.name, from.kind)),
                None => skipped.push((tag.name, "none".into())),
            }
        }
        Ok(Release {
            version: metadata.version,
            components,
            skipped,
        })
    }
}

/// How a release becomes sets.
#[derive(Clone, Debug, Default)]
pub struct SetOptions {
    /// `--name`; default `release-<version>`.
    pub name: Option<String>,
    /// The pool the sets land in (their `machineconfiguration.openshift.io/role` label).
    pub pool: String,
    /// `--exclude`: components whose tag name or pull spec matches any of these are left out.
    pub exclude: Vec<Regex>,
}

/// The sets of a release, and what was left out of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseSets {
    pub sets: Vec<ImageSet>,
    /// Components `--exclude` matched.
    pub excluded: Vec<Component>,
    /// Components whose pull spec another component already has (several tags share a digest).
    pub folded: usize,
}

/// The PinnedImageSets pinning `release`, whose payload is `release_image` (a reference by digest): the
/// release image first, then every unique component pull spec in `image-references` order. Over
/// [`MAX_ENTRIES`] entries they are split into sets numbered from 1 (`release-4.19.3-1`, ...).
pub fn release_sets(release_image: &str, release: &Release, options: &SetOptions) -> ReleaseSets {
    let name = options
        .name
        .clone()
        .unwrap_or_else(|| format!("release-{}", release.version));
    let origin = |component: Option<&str>| Origin::Release {
        image: release_image.to_owned(),
        version: release.version.clone(),
        component: component.map(str::to_owned),
    };
    let mut seen = HashSet::from([release_image.to_owned()]);
    let mut entries = vec![Entry {
        reference: release_image.to_owned(),
        origin: origin(None),
    }];
    let (mut excluded, mut folded) = (Vec::new(), 0);
    for component in &release.components {
        let matched = options
            .exclude
            .iter()
            .any(|re| re.is_match(&component.name) || re.is_match(&component.pullspec));
        if matched {
            excluded.push(component.clone());
        } else if seen.insert(component.pullspec.clone()) {
            entries.push(Entry {
                reference: component.pullspec.clone(),
                origin: origin(Some(&component.name)),
            });
        } else {
            folded += 1;
        }
    }
    let labels = BTreeMap::from([(ROLE_LABEL.to_owned(), options.pool.clone())]);
    let chunks: Vec<&[Entry]> = entries.chunks(MAX_ENTRIES).collect();
    let numbered = chunks.len() > 1;
    let sets = chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| ImageSet {
            name: match numbered {
                true => format!("{name}-{}", i + 1),
                false => name.clone(),
            },
            labels: labels.clone(),
            entries: chunk.to_vec(),
            origin: origin(None),
            node_selector: None,
            pull_secrets: Vec::new(),
            fan_out: false,
        })
        .collect();
    ReleaseSets {
        sets,
        excluded,
        folded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u32) -> String {
        format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{n:064x}")
    }

    fn references(tags: &[(&str, &str, &str)]) -> String {
        let tags: Vec<serde_json::Value> = tags
            .iter()
            .map(|(name, kind, from)| {
                serde_json::json!({"name": name, "annotations": {"io.openshift.build.commit.id": "abc"},
                    "from": {"kind": kind, "name": from}, "generation": null, "importPolicy": {},
                    "referencePolicy": {"type": "Source"}})
            })
            .collect();
        serde_json::to_string_pretty(&serde_json::json!({
            "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
            "metadata": {"name": "4.19.3", "creationTimestamp": null},
            "spec": {"lookupPolicy": {"local": false}, "tags": tags},
            "status": {"dockerImageRepository": ""}
        }))
        .unwrap()
    }

    const METADATA: &str = r#"{"kind": "cincinnati-metadata-v0", "version": "4.19.3",
        "previous": ["4.19.1", "4.19.2"], "metadata": {"url": "https://example.com/errata"}}"#;
    const RELEASE_IMAGE: &str = "quay.io/openshift-release-dev/ocp-release@sha256:\
        00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff";

    fn release() -> Release {
        let (etcd, console, shared) = (digest(1), digest(2), digest(3));
        let text = references(&[
            ("etcd", "DockerImage", &etcd),
            ("console", "DockerImage", &console),
            ("cli", "DockerImage", &shared),
            // Several tags share a digest in real payloads.
            ("cli-artifacts", "DockerImage", &shared),
            ("tests", "ImageStreamTag", "tests:latest"),
        ]);
        Release::parse(&text, METADATA).unwrap()
    }

    #[test]
    fn docker_image_tags_are_the_components_and_others_are_skipped() {
        let release = release();
        assert_eq!(release.version, "4.19.3");
        let names: Vec<&str> = release.components.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["etcd", "console", "cli", "cli-artifacts"]);
        assert_eq!(
            release.skipped,
            [("tests".to_owned(), "ImageStreamTag".to_owned())]
        );
    }

    #[test]
    fn what_is_not_a_release_says_what_it_is() {
        let deployment = r#"{"kind": "Deployment", "apiVersion": "apps/v1"}"#;
        let err = Release::parse(deployment, METADATA)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kind \"Deployment\" apiVersion \"apps/v1\""),
            "{err}"
        );
        let err = Release::parse("not json", METADATA)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("release-manifests/image-references is not JSON"),
            "{err}"
        );
        let err = Release::parse(&references(&[]), "{\"kind\": \"x\"}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not cincinnati-metadata-v0"), "{err}");
    }

    #[test]
    fn the_set_holds_the_release_image_and_each_digest_once() {
        let options = SetOptions {
            pool: "worker".into(),
            ..SetOptions::default()
        };
        let made = release_sets(RELEASE_IMAGE, &release(), &options);
        assert_eq!(made.folded, 1);
        let [set] = made.sets.as_slice() else {
            panic!("one set: {:?}", made.sets)
        };
        assert_eq!(set.name, "release-4.19.3");
        assert_eq!(set.labels[ROLE_LABEL], "worker");
        let refs: Vec<&str> = set.references().collect();
        assert_eq!(refs, [RELEASE_IMAGE, &digest(1), &digest(2), &digest(3)]);
        assert_eq!(
            set.entries[1].origin.to_string(),
            format!("release 4.19.3 ({RELEASE_IMAGE}), component etcd")
        );
    }

    #[test]
    fn exclude_matches_tag_names_or_pull_specs_and_names_can_be_chosen() {
        let options = SetOptions {
            name: Some("upgrade".into()),
            pool: "master".into(),
            exclude: vec![
                Regex::new("^console$").unwrap(),
                Regex::new(&format!("{:064x}$", 1)).unwrap(),
            ],
        };
        let made = release_sets(RELEASE_IMAGE, &release(), &options);
        let excluded: Vec<&str> = made.excluded.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(excluded, ["etcd", "console"]);
        assert_eq!(made.sets[0].name, "upgrade");
        assert_eq!(
            made.sets[0].references().count(),
            2,
            "the release image and cli"
        );
    }

    #[test]
    fn more_than_500_entries_are_split_into_numbered_sets() {
        let many: Vec<(String, String)> = (1..=700).map(|n| (format!("c{n}"), digest(n))).collect();
        let tags: Vec<(&str, &str, &str)> = many
            .iter()
            .map(|(name, pullspec)| (name.as_str(), "DockerImage", pullspec.as_str()))
            .collect();
        let release = Release::parse(&references(&tags), METADATA).unwrap();
        let options = SetOptions {
            pool: "worker".into(),
            ..SetOptions::default()
        };
        let made = release_sets(RELEASE_IMAGE, &release, &options);
        let sizes: Vec<(&str, usize)> = made
            .sets
            .iter()
            .map(|s| (s.name.as_str(), s.entries.len()))
            .collect();
        assert_eq!(
            sizes,
            [("release-4.19.3-1", 500), ("release-4.19.3-2", 201)]
        );
        assert!(made.sets.iter().all(|s| s.validate().is_empty()));
    }
}

//! What a node's agent publishes of what its runtime holds, so that a plan on agents is exact without
//! reading any node's image list: the `PinboardNodeBlobs` beside its report (cluster-scoped, named after
//! its Node, owned by it). Pure: the object, how an agent makes it from what its runtime says, and what a
//! plan takes from it.
//!
//! - `basis`: `content-store` (containerd: every blob of its content store, namespace `k8s.io`, by digest),
//!   `layers` (CRI-O: its layers' uncompressed digests and its images' configs' digests) or `unknown` (the
//!   runtime could not be asked: a plan is an upper bound, as without the object).
//! - `images`: the digests its image records are known by (for presence: an image is on the node when a
//!   record has its digest, under whatever name, since pulling it fetches nothing).
//! - `blobs`: the held digests. Both as [`DigestPrefixes`]: 8 bytes a digest, base64.
//! - `lazy`: the images present only lazily, by digest, with their remote layers.

use serde::{Deserialize, Serialize};

use super::digest_prefix::DigestPrefixes;
use super::lazy::RemoteLayers;
use super::pinboard_api::ObjectMeta;
use super::plan::{HeldBlobs, NodeFacts, Presence};

/// One node's published holdings, as its agent writes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinboardNodeBlobs {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeBlobs>,
}

/// What a node's runtime holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeBlobs {
    pub basis: BlobBasis,
    /// How many image records and held blobs: what `kubectl get pinboardnodeblobs` shows.
    #[serde(default)]
    pub image_count: usize,
    #[serde(default)]
    pub blob_count: usize,
    /// Left out when empty: server-side apply turns a field that was set and is now `""` into null, which
    /// the schema refuses, and the object would keep what the node held before.
    #[serde(default, skip_serializing_if = "DigestPrefixes::is_empty")]
    pub images: DigestPrefixes,
    #[serde(default, skip_serializing_if = "DigestPrefixes::is_empty")]
    pub blobs: DigestPrefixes,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lazy: Vec<LazyImage>,
}

/// How a node's held blobs are matched against an image's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlobBasis {
    /// containerd: by digest, every blob of its content store.
    ContentStore,
    /// CRI-O: layers by uncompressed digest (diff ID), configs by digest.
    Layers,
    /// The runtime could not say.
    #[default]
    Unknown,
}

/// An image present only lazily, by the digest its record is known by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LazyImage {
    pub digest: String,
    #[serde(flatten)]
    pub remote: RemoteLayers,
}

/// The digest a reference or a repo digest names (`name@sha256:…`), or a bare digest as it is.
fn digest_of(name: &str) -> &str {
    name.rsplit_once('@').map_or(name, |(_, digest)| digest)
}

impl NodeBlobs {
    /// What an agent publishes: what its runtime `held`, the `records`' names (repo digests; tags are left
    /// out), and each record's remote layers when it is present only lazily.
    pub fn published<'a>(
        held: &HeldBlobs,
        records: impl IntoIterator<Item = (&'a [String], Option<RemoteLayers>)>,
    ) -> NodeBlobs {
        let (basis, blobs) = match held {
            HeldBlobs::Digests(digests) => (
                BlobBasis::ContentStore,
                DigestPrefixes::of(digests.iter().map(String::as_str)),
            ),
            HeldBlobs::Layers { diff_ids, configs } => (
                BlobBasis::Layers,
                DigestPrefixes::of(diff_ids.iter().chain(configs).map(String::as_str)),
            ),
            // An agent reads its runtime, never another agent's object.
            HeldBlobs::Unknown | HeldBlobs::Prefixes { .. } => {
                (BlobBasis::Unknown, DigestPrefixes::default())
            }
        };
        let mut names: Vec<&str> = Vec::new();
        let mut lazy = Vec::new();
        for (repo_digests, remote) in records {
            let digests = repo_digests.iter().map(|n| digest_of(n));
            names.extend(digests.clone());
            if let Some(remote) = remote {
                lazy.extend(digests.map(|digest| LazyImage {
                    digest: digest.to_owned(),
                    remote: remote.clone(),
                }));
            }
        }
        lazy.sort_by(|a, b| a.digest.cmp(&b.digest));
        lazy.dedup_by(|a, b| a.digest == b.digest);
        let images = DigestPrefixes::of(names);
        NodeBlobs {
            basis,
            image_count: images.len(),
            blob_count: blobs.len(),
            images,
            blobs,
            lazy,
        }
    }

    /// Whether the node holds the image `reference` names; None when it names no digest.
    pub fn holds(&self, reference: &str) -> Presence {
        reference
            .contains('@')
            .then(|| self.images.contains(digest_of(reference)))
            .flatten()
    }

    /// Puts into `facts` what the plan needs of these holdings for `references` (what the runtime holds,
    /// the images present only lazily), and says which of them the node holds, in order.
    pub fn plan_facts<R: AsRef<str>>(
        self,
        facts: &mut NodeFacts,
        references: &[R],
    ) -> Vec<Presence> {
        let presence: Vec<Presence> = references.iter().map(|r| self.holds(r.as_ref())).collect();
        facts.lazy = references
            .iter()
            .zip(&presence)
            .filter(|(_, present)| **present == Some(true))
            .filter_map(|(reference, _)| {
                let digest = digest_of(reference.as_ref());
                let lazy = self.lazy.iter().find(|l| l.digest == digest)?;
                Some((reference.as_ref().to_owned(), lazy.remote.clone()))
            })
            .collect();
        facts.held = match self.basis {
            BlobBasis::ContentStore => HeldBlobs::Prefixes {
                by_diff_id: false,
                prefixes: self.blobs,
            },
            BlobBasis::Layers => HeldBlobs::Prefixes {
                by_diff_id: true,
                prefixes: self.blobs,
            },
            BlobBasis::Unknown => HeldBlobs::Unknown,
        };
        presence
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::model::image::{ImageFacts, Layer};
    use crate::model::plan::{FetchBasis, Limits, PlannedImage, plan_node};

    /// Digest number `i`, as a runtime would name a blob.
    fn digest(i: usize) -> String {
        use sha2::Digest as _;
        format!("sha256:{:x}", sha2::Sha256::digest(format!("blob {i}")))
    }

    fn layer(i: usize, size: u64) -> Layer {
        Layer {
            digest: digest(i),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            size,
            annotations: BTreeMap::new(),
            diff_id: Some(digest(1000 + i)),
        }
    }

    fn image(config: usize, layers: Vec<Layer>) -> ImageFacts {
        ImageFacts {
            manifest_digest: digest(2000 + config),
            manifest_size: 500,
            index_digest: None,
            platform: None,
            config_digest: digest(config),
            config_size: 1000,
            layers,
            annotations: BTreeMap::new(),
            mirror: None,
        }
    }

    /// Node n1 holds image X (base B, layer x) outside any set; the set's Y shares B and adds y; Z is
    /// present only lazily, its second layer still in the registry.
    #[test]
    fn a_plan_from_published_holdings_counts_exactly_what_the_node_lacks() {
        let (b, x, y) = (
            layer(1, 6_000_000),
            layer(2, 2_000_000),
            layer(3, 3_500_000),
        );
        let image_x = image(10, vec![b.clone(), x.clone()]);
        let image_y = image(11, vec![b.clone(), y]);
        let image_z = image(12, vec![layer(4, 100), layer(5, 700)]);
        let reference = |facts: &ImageFacts| format!("reg.example/app@{}", facts.manifest_digest);
        let (ref_y, ref_z) = (reference(&image_y), reference(&image_z));
        let containerd = HeldBlobs::Digests(HashSet::from([
            b.digest.clone(),
            x.digest.clone(),
            image_x.config_digest.clone(),
            image_z.config_digest.clone(),
            image_z.layers[0].digest.clone(),
        ]));
        let records = [
            vec![reference(&image_x), "reg.example/app:x".into()],
            vec![format!("other.example/z@{}", image_z.manifest_digest)],
        ];
        let lazily = RemoteLayers::of(&[false, true]).expect("one layer remote");
        let published = NodeBlobs::published(
            &containerd,
            [
                (&records[0][..], None),
                (&records[1][..], Some(lazily.clone())),
            ],
        );
        assert_eq!(published.basis, BlobBasis::ContentStore);
        assert_eq!((published.image_count, published.blob_count), (2, 5));
        // Written and read back as the API server stores it.
        let json = serde_json::to_string(&published).unwrap();
        let read: NodeBlobs = serde_json::from_str(&json).unwrap();
        assert_eq!(read, published);

        let references = [ref_y.clone(), ref_z.clone()];
        let mut facts = NodeFacts {
            name: "n1".into(),
            capacity_bytes: Some(1 << 30),
            available_bytes: Some(1 << 29),
            ..NodeFacts::default()
        };
        let presence = read.plan_facts(&mut facts, &references);
        assert_eq!(presence, [Some(false), Some(true)], "Z by its digest");
        assert_eq!(facts.lazy.get(&ref_z), Some(&lazily));
        let images = [
            PlannedImage {
                reference: ref_y.as_str().into(),
                facts: &image_y,
                present: presence[0],
                lazy: None,
            },
            PlannedImage {
                reference: ref_z.as_str().into(),
                facts: &image_z,
                present: presence[1],
                lazy: facts.lazy.get(&ref_z),
            },
        ];
        let plan = plan_node(&facts, &images, &Limits::default());
        assert_eq!(plan.fetch_basis, FetchBasis::Exact);
        assert_eq!(
            plan.images[0].fetch_bytes,
            3_500_000 + 1000,
            "y and Y's config: not B, which X brought"
        );
        assert_eq!(plan.images[1].fetch_bytes, 700, "Z's remote layer");
    }

    #[test]
    fn crio_layers_match_by_uncompressed_digest_and_unknown_holdings_are_an_upper_bound() {
        let b = layer(1, 6_000_000);
        let image_y = image(11, vec![b.clone(), layer(3, 3_500_000)]);
        let reference = format!("reg.example/y@{}", image_y.manifest_digest);
        let crio = HeldBlobs::Layers {
            diff_ids: HashSet::from([b.diff_id.clone().unwrap()]),
            configs: HashSet::from([digest(99)]),
        };
        let plan = |held: &HeldBlobs| {
            let mut facts = NodeFacts::default();
            let published = NodeBlobs::published(held, []);
            let presence = published.plan_facts(&mut facts, std::slice::from_ref(&reference));
            let images = [PlannedImage {
                reference: reference.as_str().into(),
                facts: &image_y,
                present: presence[0],
                lazy: None,
            }];
            plan_node(&facts, &images, &Limits::default())
        };
        let by_layers = plan(&crio);
        assert_eq!(by_layers.fetch_bytes, 3_500_000 + 1000);
        assert_eq!(by_layers.fetch_basis, FetchBasis::Exact);
        let unknown = plan(&HeldBlobs::Unknown);
        assert_eq!(unknown.fetch_bytes, 9_500_000 + 1000);
        assert_eq!(unknown.fetch_basis, FetchBasis::UpperBound);
    }

    #[test]
    fn a_node_that_holds_nothing_publishes_neither_images_nor_blobs_and_reads_back_empty() {
        let empty = NodeBlobs {
            basis: BlobBasis::ContentStore,
            ..NodeBlobs::default()
        };
        let json = serde_json::to_value(&empty).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"basis": "content-store", "imageCount": 0, "blobCount": 0}),
            "no empty strings for server-side apply to turn into null"
        );
        assert_eq!(serde_json::from_value::<NodeBlobs>(json).unwrap(), empty);
    }

    /// 200 images sharing base layers, about 1,000 distinct blobs: what one node's object costs.
    #[test]
    fn a_node_of_200_images_and_1000_blobs_publishes_them_in_about_13_kb() {
        let held = HeldBlobs::Digests((0..1000).map(digest).collect());
        let names: Vec<Vec<String>> = (0..200)
            .map(|i| {
                vec![format!(
                    "registry.example.com/team/app-{i}@{}",
                    digest(5000 + i)
                )]
            })
            .collect();
        let published = NodeBlobs::published(&held, names.iter().map(|n| (&n[..], None)));
        let object = PinboardNodeBlobs {
            metadata: ObjectMeta {
                name: "worker-0001".into(),
                ..ObjectMeta::default()
            },
            status: Some(published),
        };
        let bytes = serde_json::to_vec(&object).unwrap().len();
        println!("200 images, 1,000 blobs: {bytes} bytes of JSON");
        assert!((12_000..14_000).contains(&bytes), "{bytes} bytes");
    }
}

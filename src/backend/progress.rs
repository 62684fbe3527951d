//! Byte progress of running pulls on containerd. CRI's PullImage is unary, so pinboard watches containerd's
//! content ingests (`Content/ListStatuses`, namespace `k8s.io`) on the same socket and maps each blob back
//! to the images being pulled, from what the registry said those images are made of.
//!
//! The mapping ([`Tracker`]) is pure. Each blob counts for one image only: the first one tracked that needs
//! it (a blob shared by two pulls is fetched once, as the plan counts it), and not at all when it was on the
//! node already. A blob seen in progress and then gone is done: containerd drops an ingest once committed.
//! CRI-O has no such API: its bytes come from its own counters ([`super::crio_counter`]).

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use tonic::transport::Channel;

use super::pins::CONTAINERD_NAMESPACE;
use super::proto::containerd_content::{ListStatusesRequest, content_client::ContentClient};
use crate::model::image::ImageFacts;
use crate::model::readiness::PullSeen;

/// One in-progress ingest: the blob's digest, the bytes written so far, and when it started and last moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingest {
    pub digest: String,
    pub offset: u64,
    pub started: Option<SystemTime>,
    pub updated: Option<SystemTime>,
}

/// The blob digest of an ingest ref (`layer-sha256:<hex>`, `config-sha256:<hex>`; other kinds, such as
/// manifests, are not counted by the plan and are left out).
pub fn blob_of_ref(reference: &str) -> Option<&str> {
    reference
        .strip_prefix("layer-")
        .or_else(|| reference.strip_prefix("config-"))
}

/// The ingests running in the node's `k8s.io` namespace.
pub async fn list_ingests(channel: Channel) -> Result<Vec<Ingest>, tonic::Status> {
    let mut request = tonic::Request::new(ListStatusesRequest::default());
    request.metadata_mut().insert(
        "containerd-namespace",
        CONTAINERD_NAMESPACE.parse().expect("ascii"),
    );
    let statuses = ContentClient::new(channel)
        .list_statuses(request)
        .await?
        .into_inner()
        .statuses;
    Ok(statuses
        .into_iter()
        .filter_map(|s| {
            let time = |t: Option<prost_types::Timestamp>| SystemTime::try_from(t?).ok();
            Some(Ingest {
                digest: blob_of_ref(&s.r#ref)?.to_string(),
                offset: u64::try_from(s.offset).unwrap_or(0),
                started: time(s.started_at),
                updated: time(s.updated_at),
            })
        })
        .collect())
}

/// Bytes done out of total for one image being pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes {
    pub done: u64,
    pub total: u64,
}

/// What the ingests say about a pull of the image made of `facts`: `None` when none of its blobs is
/// being written; else how long since the first of them started, how long since any last moved, and the
/// bytes written of the blobs in flight, at `now`.
pub fn pull_seen(facts: &ImageFacts, ingests: &[Ingest], now: SystemTime) -> Option<PullSeen> {
    let sizes: HashMap<&str, u64> = blobs(facts).collect();
    let mine: Vec<&Ingest> = ingests
        .iter()
        .filter(|i| sizes.contains_key(i.digest.as_str()))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let ago = |t: Option<SystemTime>| t.and_then(|t| now.duration_since(t).ok());
    Some(PullSeen {
        running_seconds: mine
            .iter()
            .filter_map(|i| ago(i.started))
            .max()
            .map(|d| d.as_secs()),
        idle_seconds: mine
            .iter()
            .filter_map(|i| ago(i.updated))
            .min()
            .map(|d| d.as_secs()),
        blobs: mine.len(),
        done_bytes: mine.iter().map(|i| i.offset).sum(),
        total_bytes: mine.iter().map(|i| sizes[i.digest.as_str()]).sum(),
    })
}

/// Per-node mapping from ingests to images.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Blobs on the node before their image was tracked, or finished since.
    on_node: HashSet<String>,
    /// Image -> its blobs (digest, size) that had to be fetched when tracking began.
    images: HashMap<String, Vec<(String, u64)>>,
    /// Blob -> the one image it counts for.
    owner: HashMap<String, String>,
    /// The last ingests seen, by digest.
    running: HashMap<String, u64>,
}

impl Tracker {
    /// A tracker for a node that holds these blobs already.
    pub fn new(on_node: impl IntoIterator<Item = String>) -> Self {
        Tracker {
            on_node: on_node.into_iter().collect(),
            ..Tracker::default()
        }
    }

    /// Records that `facts`'s blobs are on the node (an image present or pulled).
    pub fn add_present(&mut self, facts: &ImageFacts) {
        self.on_node
            .extend(blobs(facts).map(|(d, _)| d.to_string()));
    }

    /// Starts tracking a pull of `image`; returns its total.
    pub fn track(&mut self, image: &str, facts: &ImageFacts) -> u64 {
        self.untrack(image);
        let mut mine = Vec::new();
        for (digest, size) in blobs(facts) {
            if !self.on_node.contains(digest) && !self.owner.contains_key(digest) {
                self.owner.insert(digest.to_string(), image.to_string());
                mine.push((digest.to_string(), size));
            }
        }
        let total = mine.iter().map(|(_, s)| s).sum();
        self.images.insert(image.to_string(), mine);
        total
    }

    /// Stops tracking `image` (pulled, failed or cancelled); its blobs may then count for another pull.
    pub fn untrack(&mut self, image: &str) {
        if self.images.remove(image).is_some() {
            self.owner.retain(|_, owner| owner != image);
        }
    }

    /// Whether anything is tracked.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Folds in one poll's ingests; returns every tracked image's figures.
    pub fn update(&mut self, ingests: &[Ingest]) -> HashMap<String, Bytes> {
        let now: HashMap<String, u64> = ingests
            .iter()
            .map(|i| (i.digest.clone(), i.offset))
            .collect();
        for gone in self.running.keys().filter(|d| !now.contains_key(*d)) {
            self.on_node.insert(gone.clone());
        }
        // A blob ingested again (a retried pull) is not done after all.
        self.on_node.retain(|d| !now.contains_key(d));
        self.running = now;
        self.images
            .iter()
            .map(|(image, blobs)| {
                let done = blobs
                    .iter()
                    .map(|(digest, size)| match self.running.get(digest) {
                        Some(offset) => (*offset).min(*size),
                        None if self.on_node.contains(digest) => *size,
                        None => 0,
                    })
                    .sum();
                let total = blobs.iter().map(|(_, s)| s).sum();
                (image.clone(), Bytes { done, total })
            })
            .collect()
    }
}

/// Config and layers: the blobs the plan counts.
fn blobs(facts: &ImageFacts) -> impl Iterator<Item = (&str, u64)> {
    std::iter::once((facts.config_digest.as_str(), facts.config_size))
        .chain(facts.layers.iter().map(|l| (l.digest.as_str(), l.size)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::image::Layer;

    fn facts(config: &str, layers: &[(&str, u64)]) -> ImageFacts {
        ImageFacts {
            manifest_digest: format!("sha256:m{config}"),
            manifest_size: 1,
            index_digest: None,
            platform: None,
            config_digest: config.into(),
            config_size: 10,
            layers: layers
                .iter()
                .map(|(d, size)| Layer {
                    digest: d.to_string(),
                    media_type: String::new(),
                    size: *size,
                    annotations: Default::default(),
                    diff_id: None,
                })
                .collect(),
            annotations: Default::default(),
            mirror: None,
        }
    }

    fn ingest(digest: &str, offset: u64) -> Ingest {
        Ingest {
            digest: digest.into(),
            offset,
            started: None,
            updated: None,
        }
    }

    #[test]
    fn a_pull_in_flight_is_seen_from_the_ingests_of_its_blobs() {
        let image = facts("c", &[("l1", 1000), ("l2", 3000)]);
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let at = |s: u64| Some(t0 + std::time::Duration::from_secs(s));
        let ingest = |digest: &str, offset, started, updated| Ingest {
            digest: digest.into(),
            offset,
            started: at(started),
            updated: at(updated),
        };
        let ingests = [
            ingest("l1", 400, 10, 70),
            ingest("l2", 100, 40, 50),
            ingest("other", 9, 0, 0),
        ];
        let seen = pull_seen(&image, &ingests, t0 + std::time::Duration::from_secs(100)).unwrap();
        assert_eq!(
            seen,
            PullSeen {
                running_seconds: Some(90),
                idle_seconds: Some(30),
                blobs: 2,
                done_bytes: 500,
                total_bytes: 4000,
            }
        );
        assert_eq!(pull_seen(&image, &ingests[2..], t0), None, "not its blobs");
    }

    #[test]
    fn refs_name_blobs() {
        assert_eq!(blob_of_ref("layer-sha256:ab"), Some("sha256:ab"));
        assert_eq!(blob_of_ref("config-sha256:cd"), Some("sha256:cd"));
        assert_eq!(blob_of_ref("manifest-sha256:ef"), None);
        assert_eq!(blob_of_ref("index-sha256:ef"), None);
    }

    #[test]
    fn progress_counts_offsets_finished_blobs_and_shared_blobs_once() {
        let mut t = Tracker::new(["base0".to_string()]);
        // a: base0 (on the node), base1 (shared with b), own layer a1.
        let a = facts("ca", &[("base0", 100), ("base1", 200), ("a1", 50)]);
        let b = facts("cb", &[("base1", 200), ("b1", 70)]);
        assert_eq!(t.track("a", &a), 10 + 200 + 50);
        assert_eq!(
            t.track("b", &b),
            10 + 70,
            "base1 counts for a, the first pull that needs it"
        );
        let p = t.update(&[ingest("base1", 120), ingest("a1", 50), ingest("b1", 7)]);
        assert_eq!(
            p["a"],
            Bytes {
                done: 170,
                total: 260
            }
        );
        assert_eq!(p["b"], Bytes { done: 7, total: 80 });
        // a1 and base1 committed (gone), b's config appeared; an offset past the size is capped.
        let p = t.update(&[ingest("b1", 90), ingest("cb", 4)]);
        assert_eq!(
            p["a"],
            Bytes {
                done: 250,
                total: 260
            }
        );
        assert_eq!(
            p["b"],
            Bytes {
                done: 74,
                total: 80
            }
        );
        t.untrack("a");
        assert_eq!(t.update(&[]).keys().collect::<Vec<_>>(), ["b"]);
        assert!(!t.is_empty());
    }

    #[test]
    fn a_retried_pull_starts_again_and_blobs_on_the_node_count_for_nobody() {
        let mut t = Tracker::new([]);
        let a = facts("ca", &[("l1", 100)]);
        t.add_present(&facts("cx", &[("l1", 100)]));
        assert_eq!(t.track("a", &a), 10);
        t.update(&[ingest("ca", 5)]);
        assert_eq!(
            t.update(&[ingest("ca", 3)])["a"],
            Bytes { done: 3, total: 10 }
        );
        t.untrack("a");
        assert!(t.is_empty());
    }
}

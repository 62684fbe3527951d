//! A stand-in machine-config daemon for the cluster demo, as no real one runs here: for every worker node
//! it pre-loads each PinnedImageSet labelled for the worker pool through that node's real containerd (CRI
//! PullImage), and reports as the daemon does, in the node's MachineConfigNode status (desired, current and
//! last-failed generation, the error, the Progressing and Degraded conditions) and, as the kubelet would,
//! the images the node holds in `Node.status.images`. A node out of space fails the set with the runtime's
//! error, as on a real cluster. It pulls with the cluster's global pull secret, as the daemon pulls with the
//! kubelet's config.json that the machine-config operator writes from it. Pinning itself is not played: the
//! demo's nodes are containerd.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use pinboard::backend::credentials::{Credentials, KUBELET_CONFIG};
use pinboard::backend::cri::{CriClient, CriEndpoint};
use pinboard::backend::openshift::Cluster;
use pinboard::backend::openshift::pull_secret::PullSecret;
use pinboard::backend::proto::cri::AuthConfig;
use pinboard::model::machine_config::{DEGRADED, PROGRESSING, PinnedImageSet, ROLE_LABEL};
use pinboard::model::reference::ImageRef;
use serde_json::{Value, json};

use crate::support::cluster;

const PULL_TIMEOUT: Duration = Duration::from_secs(300);
const EVERY: Duration = Duration::from_secs(1);

/// The running daemon; dropping it stops it.
pub struct Daemon {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the daemon remembers of one set on one node.
#[derive(Clone, Default)]
struct Entry {
    desired: i64,
    current: Option<i64>,
    failed: Option<(i64, String)>,
}

/// Starts the daemon for `nodes` (name, CRI endpoint), all in pool `worker`, on its own thread and
/// runtime, with its own client from `kubeconfig` (a client serves only while the runtime that made it
/// runs).
pub fn start(kubeconfig: PathBuf, nodes: Vec<(String, String)>) -> Daemon {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async move {
            let cluster = cluster::discover(&cluster::client(&kubeconfig, None).await).await;
            let tasks = nodes.into_iter().map(|(name, endpoint)| {
                let (cluster, stopping) = (cluster.clone(), stopping.clone());
                tokio::spawn(async move { node_loop(cluster, name, endpoint, stopping).await })
            });
            futures::future::join_all(tasks).await;
        });
    });
    Daemon {
        stop,
        thread: Some(thread),
    }
}

async fn node_loop(cluster: Cluster, node: String, endpoint: String, stop: Arc<AtomicBool>) {
    let endpoint: CriEndpoint = endpoint.parse().expect("a CRI endpoint");
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let mut listed = false;
    while !stop.load(Ordering::Relaxed) {
        let Ok(client) = CriClient::connect(&endpoint, Duration::from_secs(10)).await else {
            tokio::time::sleep(EVERY).await;
            continue;
        };
        if !listed {
            list_images(&cluster, &node, &client).await;
            listed = true;
        }
        let sets = worker_sets(&cluster).await;
        entries.retain(|name, _| sets.iter().any(|s| s.name() == name));
        for set in &sets {
            let entry = entries.entry(set.name().to_owned()).or_default();
            let seen = entry.current == Some(set.generation())
                || entry
                    .failed
                    .as_ref()
                    .is_some_and(|(g, _)| *g == set.generation());
            if seen || stop.load(Ordering::Relaxed) {
                continue;
            }
            entry.desired = set.generation();
            report(&cluster, &node, &entries, true).await;
            let mut failure = None;
            let credentials = node_credentials(&cluster).await;
            for image in set.images() {
                let auth = auth_for(&credentials, image);
                if let Err(e) = client.pull_image(image, auth, PULL_TIMEOUT).await {
                    failure = Some(format!("failed to pull {image}: {e}"));
                    break;
                }
                list_images(&cluster, &node, &client).await;
            }
            let entry = entries.get_mut(set.name()).expect("just added");
            match failure {
                Some(error) => entry.failed = Some((set.generation(), error)),
                None => {
                    entry.current = Some(set.generation());
                    entry.failed = None;
                }
            }
            report(&cluster, &node, &entries, false).await;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// What the node's kubelet config.json holds: the cluster's pull secret (none when there is none).
async fn node_credentials(cluster: &Cluster) -> Credentials {
    match cluster.pull_secret().await {
        Ok(PullSecret::Found(text)) => Credentials::from_text(KUBELET_CONFIG, &text)
            .unwrap_or_else(|e| {
                eprintln!("stand-in daemon: the pull secret: {e}");
                Credentials::none()
            }),
        _ => Credentials::none(),
    }
}

/// The CRI credential for `image`, as the daemon hands it to the runtime.
fn auth_for(credentials: &Credentials, image: &str) -> Option<AuthConfig> {
    let reference = ImageRef::parse(image).ok()?;
    let found = credentials
        .lookup(&reference.registry, &reference.repository)
        .ok()??;
    found.credential.to_cri_auth()
}

/// The PinnedImageSets labelled for the worker pool.
async fn worker_sets(cluster: &Cluster) -> Vec<PinnedImageSet> {
    let api: Api<DynamicObject> = Api::all_with(
        cluster.client().clone(),
        &cluster.resources().pinned_image_set,
    );
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter_map(|o| serde_json::from_value(serde_json::to_value(o).ok()?).ok())
        .filter(|s: &PinnedImageSet| {
            s.metadata.labels.get(ROLE_LABEL).map(String::as_str) == Some("worker")
        })
        .collect()
}

/// Writes the node's MachineConfigNode status: every set's entry, Progressing while `pulling`, Degraded
/// while some set's last generation failed.
async fn report(cluster: &Cluster, node: &str, entries: &BTreeMap<String, Entry>, pulling: bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let sets: Vec<Value> = entries
        .iter()
        .map(|(name, e)| {
            let mut entry = json!({"name": name, "desiredGeneration": e.desired});
            if let Some(current) = e.current {
                entry["currentGeneration"] = json!(current);
            }
            if let Some((generation, error)) = &e.failed {
                entry["lastFailedGeneration"] = json!(generation);
                entry["lastFailedGenerationError"] = json!(error);
            }
            entry
        })
        .collect();
    let degraded = entries.values().any(|e| e.failed.is_some());
    let condition = |type_: &str, on: bool, reason: &str, message: &str| {
        json!({"type": type_, "status": if on { "True" } else { "False" },
               "reason": if on { reason } else { "AsExpected" }, "message": message, "lastTransitionTime": now})
    };
    let status = json!({"status": {
        "pinnedImageSets": sets,
        "conditions": [
            condition(PROGRESSING, pulling, "ImagePrefetch", &format!("node is prefetching images: {node}")),
            condition(DEGRADED, degraded, "PrefetchFailed",
                      if degraded { "One or more PinnedImageSet is experiencing an error" } else { "no errors" }),
        ],
    }});
    let api: Api<DynamicObject> = Api::all_with(
        cluster.client().clone(),
        &cluster.resources().machine_config_node,
    );
    if let Err(e) = api
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        eprintln!("stand-in daemon: status of MachineConfigNode {node}: {e}");
    }
}

/// How many images the kubelet lists in `Node.status.images` (its default `nodeStatusMaxImages`).
const LISTED_AT_MOST: usize = 50;

/// Writes the node's images into `Node.status.images`, and its runtime into `nodeInfo`, as the kubelet
/// does: the largest first, at most [`LISTED_AT_MOST`].
async fn list_images(cluster: &Cluster, node: &str, client: &CriClient) {
    let (Ok(mut images), Ok(version)) = (client.list_images().await, client.version().await) else {
        return;
    };
    images.sort_by_key(|i| std::cmp::Reverse(i.size));
    let listed: Vec<Value> = images
        .iter()
        .take(LISTED_AT_MOST)
        .map(|i| {
            let names: Vec<&String> = i.repo_digests.iter().chain(&i.repo_tags).collect();
            json!({"names": names, "sizeBytes": i.size})
        })
        .collect();
    let runtime = format!("{}://{}", version.runtime_name, version.runtime_version);
    let body =
        json!({"status": {"images": listed, "nodeInfo": {"containerRuntimeVersion": runtime}}});
    let nodes: Api<KubeNode> = Api::all(cluster.client().clone());
    if let Err(e) = nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        eprintln!("stand-in daemon: images of Node {node}: {e}");
    }
}

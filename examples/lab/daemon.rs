//! A stand-in machine-config daemon for the cluster demo, as no real one runs here. For every worker node
//! it does what the daemon's pinned-image-set manager does with each PinnedImageSet labelled for the worker
//! pool, through the node's CRI-O: it checks the node has room for the set (twice the compressed size of the
//! images the node lacks, each layer counted once, must leave a floor of the Node's allocatable ephemeral
//! storage free, else `storage available is less than minimum required`), pulls each image the node lacks
//! (CRI PullImage, with the cluster's global pull secret, as the daemon pulls with the kubelet's config.json
//! that the machine-config operator writes from it), and only once every pull succeeded pins the images of
//! every set: `50-pinned-images` in CRI-O's `crio.conf.d` (`pinned_images`, sorted and de-duplicated,
//! written only when its content changes; no image at all deletes it), then `systemctl reload crio` (a
//! SIGHUP to the pid in CRI-O's pidfile). It reports as the daemon does, in the node's MachineConfigNode
//! status (desired, current and last-failed generation, the error, the Progressing and Degraded
//! conditions) and, as the kubelet would, the images the node holds in `Node.status.images` and its runtime
//! in `nodeInfo`. Unlike the daemon, it tries each generation of a set once (no retries) and sizes an image
//! from the layers the lab pushed ([`Layers`]; the daemon asks `podman manifest inspect`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pinboard::backend::credentials::{Credentials, KUBELET_CONFIG};
use pinboard::backend::cri::{CriClient, CriEndpoint};
use pinboard::backend::openshift::Cluster;
use pinboard::backend::openshift::pull_secret::PullSecret;
use pinboard::backend::proto::cri::AuthConfig;
use pinboard::model::machine_config::{
    ClusterNode, DEGRADED, PROGRESSING, PinnedImageSet, ROLE_LABEL,
};
use pinboard::model::reference::ImageRef;
use serde_json::{Value, json};

use crate::support::cluster;

const PULL_TIMEOUT: Duration = Duration::from_secs(300);
const EVERY: Duration = Duration::from_secs(1);
/// The daemon's drop-in in CRI-O's `crio.conf.d`.
const DROP_IN: &str = "50-pinned-images";
/// The daemon's error for a set the node has no room for.
const INSUFFICIENT_STORAGE: &str = "storage available is less than minimum required";

/// Each image's layers (digest, compressed size) as its manifest lists them, by reference: what
/// `podman manifest inspect` tells the daemon.
pub type Layers = BTreeMap<String, Vec<(String, u64)>>;

/// A node the daemon runs on: its CRI-O's socket, drop-in directory and pidfile.
pub struct Node {
    pub name: String,
    pub endpoint: String,
    pub crio_config_dir: PathBuf,
    pub crio_pidfile: PathBuf,
}

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

impl Entry {
    /// Whether the daemon is done with `generation`, pinned or failed.
    fn settled(&self, generation: i64) -> bool {
        self.current == Some(generation)
            || self.failed.as_ref().is_some_and(|(g, _)| *g == generation)
    }
}

/// What the daemon on one node works with.
struct Context {
    cluster: Cluster,
    node: Node,
    layers: Arc<Layers>,
    /// What must stay free of the allocatable ephemeral storage after pre-loading.
    min_free: u64,
}

/// Starts the daemon for `nodes`, all in pool `worker`, keeping `min_free` bytes free on each (the daemon
/// keeps 16 GiB), on its own thread and runtime, with its own client from `kubeconfig` (a client serves
/// only while the runtime that made it runs).
pub fn start(kubeconfig: PathBuf, nodes: Vec<Node>, layers: Layers, min_free: u64) -> Daemon {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async move {
            let cluster = cluster::discover(&cluster::client(&kubeconfig, None).await).await;
            let layers = Arc::new(layers);
            let tasks = nodes.into_iter().map(|node| {
                let context = Context {
                    cluster: cluster.clone(),
                    node,
                    layers: layers.clone(),
                    min_free,
                };
                let stopping = stopping.clone();
                tokio::spawn(async move { node_loop(context, stopping).await })
            });
            futures::future::join_all(tasks).await;
        });
    });
    Daemon {
        stop,
        thread: Some(thread),
    }
}

async fn node_loop(context: Context, stop: Arc<AtomicBool>) {
    let (cluster, node) = (&context.cluster, &context.node.name);
    let endpoint: CriEndpoint = context.node.endpoint.parse().expect("a CRI endpoint");
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let mut listed = false;
    while !stop.load(Ordering::Relaxed) {
        let Ok(client) = CriClient::connect(&endpoint, Duration::from_secs(10)).await else {
            tokio::time::sleep(EVERY).await;
            continue;
        };
        if !listed {
            list_images(cluster, node, &client).await;
            listed = true;
        }
        let sets = worker_sets(cluster).await;
        entries.retain(|name, _| sets.iter().any(|s| s.name() == name));
        let pending: Vec<&PinnedImageSet> = sets
            .iter()
            .filter(|set| {
                !entries
                    .get(set.name())
                    .is_some_and(|e| e.settled(set.generation()))
            })
            .collect();
        if pending.is_empty() {
            // Nothing new: the pins follow the sets (a deleted set's go), unless a set failed.
            if entries.values().all(|e| e.failed.is_none())
                && let Err(error) = ensure_pins(&context.node, &sets)
            {
                eprintln!("stand-in daemon: {node}: {error}");
            }
        } else {
            for set in &pending {
                entries.entry(set.name().to_owned()).or_default().desired = set.generation();
            }
            report(cluster, node, &entries, true).await;
            // Pins last, once every pull succeeded.
            let outcome = match prefetch(&context, &client, &pending).await {
                Ok(()) => ensure_pins(&context.node, &sets),
                Err(error) => Err(error),
            };
            for set in &pending {
                let entry = entries.get_mut(set.name()).expect("just added");
                match &outcome {
                    Ok(()) => {
                        entry.current = Some(set.generation());
                        entry.failed = None;
                    }
                    Err(error) => entry.failed = Some((set.generation(), error.clone())),
                }
            }
            report(cluster, node, &entries, false).await;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// What the daemon does with new `sets` before it pins: checks the node has room for each, then pulls each
/// image the node lacks. The first failure is the outcome.
async fn prefetch(
    context: &Context,
    client: &CriClient,
    sets: &[&PinnedImageSet],
) -> Result<(), String> {
    let mut counted = BTreeSet::new();
    for set in sets {
        check_storage(context, client, set, &mut counted).await?;
    }
    let credentials = node_credentials(&context.cluster).await;
    for image in sets.iter().flat_map(|set| set.images()) {
        if present(client, image).await? {
            continue;
        }
        let auth = auth_for(&credentials, image);
        client
            .pull_image(image, auth, PULL_TIMEOUT)
            .await
            .map_err(|e| format!("failed to pull {image}: {e}"))?;
        list_images(&context.cluster, &context.node.name, client).await;
    }
    Ok(())
}

async fn present(client: &CriClient, image: &str) -> Result<bool, String> {
    Ok(client
        .image_status(image)
        .await
        .map_err(|e| e.to_string())?
        .is_some())
}

/// The daemon's check before it pulls `set`: twice the compressed size of the images the node lacks (room
/// to decompress; each layer counted once, `counted` holding those already counted) must leave
/// `min_free` of the Node's allocatable ephemeral storage.
async fn check_storage(
    context: &Context,
    client: &CriClient,
    set: &PinnedImageSet,
    counted: &mut BTreeSet<String>,
) -> Result<(), String> {
    let node = &context.node.name;
    let nodes: Api<KubeNode> = Api::all(context.cluster.client().clone());
    let allocatable = nodes
        .get(node)
        .await
        .map_err(|e| format!("failed to get node {node:?}: {e}"))?;
    let capacity = ClusterNode::from(&allocatable)
        .allocatable_ephemeral
        .ok_or_else(|| format!("node {node:?} has no ephemeral storage capacity"))?;
    let min_free = context.min_free;
    if capacity < min_free {
        return Err(format!(
            "{INSUFFICIENT_STORAGE} capacity: {capacity}, required: {min_free}"
        ));
    }
    let mut required = 0;
    for image in set.images() {
        if present(client, image).await? {
            continue;
        }
        let layers = context.layers.get(image).ok_or_else(|| {
            format!("failed to execute podman manifest inspect for {image:?}: not found")
        })?;
        for (digest, size) in layers {
            if counted.insert(digest.clone()) {
                required += 2 * size;
            }
        }
    }
    if required >= capacity - min_free {
        return Err(INSUFFICIENT_STORAGE.to_owned());
    }
    Ok(())
}

/// Pins every image of `sets` as the daemon does: CRI-O's drop-in [`DROP_IN`], written and CRI-O reloaded
/// only when its content changes; with no image at all, the drop-in deleted and CRI-O reloaded.
fn ensure_pins(node: &Node, sets: &[PinnedImageSet]) -> Result<(), String> {
    let images: BTreeSet<&str> = sets
        .iter()
        .flat_map(|set| set.images())
        .map(str::trim)
        .filter(|image| !image.is_empty())
        .collect();
    let path = node.crio_config_dir.join(DROP_IN);
    let existing = std::fs::read_to_string(&path).ok();
    if images.is_empty() {
        if existing.is_none() {
            return Ok(());
        }
        std::fs::remove_file(&path)
            .map_err(|e| format!("failed to remove CRI-O config file: {e}"))?;
        return reload_crio(node);
    }
    let quoted: Vec<String> = images.iter().map(|image| format!("\"{image}\"")).collect();
    let text = format!(
        "[crio]\n  [crio.image]\n    pinned_images = [{}]\n",
        quoted.join(", ")
    );
    if existing.as_deref().map(str::trim) == Some(text.trim()) {
        return Ok(());
    }
    std::fs::write(&path, text).map_err(|e| format!("failed to write CRIO config file: {e}"))?;
    reload_crio(node)
}

/// `systemctl reload crio`: SIGHUP to the pid in CRI-O's pidfile.
fn reload_crio(node: &Node) -> Result<(), String> {
    let failed = |e: String| {
        format!("could not apply update: reloading crio configuration failed. Error: {e}")
    };
    let pidfile = &node.crio_pidfile;
    let pid: i32 = std::fs::read_to_string(pidfile)
        .map_err(|e| failed(format!("{}: {e}", pidfile.display())))?
        .trim()
        .parse()
        .map_err(|e| failed(format!("{}: {e}", pidfile.display())))?;
    kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|e| failed(e.to_string()))
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

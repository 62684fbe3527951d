//! Fan-out across a cluster through pinboard's agents and the in-cluster cache: 3 containerd nodes with
//! real kubelets, an agent on each (processes started as their pods would run, each eligible for the
//! cache's role), the registry behind the counting proxy. A set with `spec.fanOut` ends pinned on every
//! node while each blob crosses the link about once, and every node's hosts.toml is back afterwards.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use support::agents::AgentsLab;
use support::kube_objects::{apply_yaml, wait_for};
use support::{ImageSpec, LayerFormat, LayerSpec, NodeSpec, PushedImage};

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(180);
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// Where every eligible agent's cache serves on its node.
const CACHE_PORT: &str = "5050";

/// A lab whose agents are all eligible for the cache's role and reach the registry through the proxy.
async fn cache_lab(name: &str) -> AgentsLab {
    let nodes = NODES.iter().map(|n| NodeSpec::new(n, 256 * MI)).collect();
    AgentsLab::start_with(
        name,
        nodes,
        None,
        vec![
            "--insecure-registry={proxy}".into(),
            format!("--cache-port={CACHE_PORT}"),
            "--cache-dir={lab}/cache-{node}".into(),
        ],
    )
    .await
}

/// `count` images, each of a base layer shared by all and a layer of its own.
fn push_images(lab: &AgentsLab, repo: &str, seed: u64, count: u64) -> Vec<PushedImage> {
    (0..count)
        .map(|i| {
            let layer = |seed, bytes| LayerSpec {
                seed,
                bytes,
                format: LayerFormat::Gzip,
            };
            let spec = ImageSpec {
                layers: vec![
                    layer(seed, 3 * MI as usize),
                    layer(
                        seed + 100 + i,
                        2 * MI as usize + i as usize * 16 * KI as usize,
                    ),
                ],
                ..ImageSpec::default()
            };
            lab.lab
                .push_image(&format!("{repo}{i}"), &spec)
                .expect("push")
        })
        .collect()
}

/// Unique bytes of `images` as they cross the link: every config, layer and manifest once.
fn unique_bytes(images: &[PushedImage]) -> u64 {
    let mut blobs = BTreeMap::new();
    for image in images {
        blobs.insert(&image.config_digest, image.config_size);
        blobs.insert(&image.manifest_digest, image.manifest_size);
        for l in &image.layers {
            blobs.insert(&l.digest, l.size);
        }
    }
    blobs.values().sum()
}

/// Applies PinSet `name` with `spec.fanOut` listing `references`, as `kubectl apply` would.
async fn apply_fan_out_set(lab: &AgentsLab, name: &str, references: &[String]) {
    let listed: String = references
        .iter()
        .map(|r| format!("  - name: {r}\n"))
        .collect();
    let yaml = format!(
        "apiVersion: pinboard.dev/v1alpha1\nkind: PinSet\nmetadata:\n  name: {name}\nspec:\n  fanOut: true\n  \
         pinnedImages:\n{listed}"
    );
    apply_yaml(&lab.admin, &yaml).await;
}

/// The PinboardNode reports, by node.
async fn reports(lab: &AgentsLab) -> BTreeMap<String, Value> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("pinboard.dev", "v1alpha1", "PinboardNode"),
        "pinboardnodes",
    );
    let api: Api<DynamicObject> = Api::all_with(lab.admin.clone(), &resource);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| {
            let value = serde_json::to_value(o).unwrap();
            (
                value["metadata"]["name"].as_str().unwrap().to_owned(),
                value,
            )
        })
        .collect()
}

/// Waits until every node's report has set `name` pinned.
async fn wait_set_pinned(lab: &AgentsLab, name: &str) -> BTreeMap<String, Value> {
    wait_for(
        &format!("set {name} pinned on every node"),
        WAIT,
        || async {
            let reports = reports(lab).await;
            let pinned = NODES.iter().all(|node| {
                reports.get(*node).is_some_and(|r| {
                    r["status"]["sets"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s["name"] == name && s["state"] == "pinned")
                })
            });
            pinned
                .then(|| reports.clone())
                .ok_or_else(|| format!("{reports:?}"))
        },
    )
    .await
}

/// Every node's hosts.toml for the proxy, as it is now (None: no file).
fn hosts_files(lab: &AgentsLab) -> Vec<Option<String>> {
    NODES
        .iter()
        .map(|n| std::fs::read_to_string(lab.lab.node(n).hosts_toml(&lab.lab.proxy_host())).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_set_is_pinned_on_every_node_with_each_blob_over_the_link_about_once() {
    let lab = cache_lab("agents-fanout").await;
    let images = push_images(&lab, "fanout/app", 9100, 3);
    let references: Vec<String> = images
        .iter()
        .map(|i| i.reference(&lab.lab.proxy_host()))
        .collect();
    let unique = unique_bytes(&images);
    let hosts_before = hosts_files(&lab);
    let before = lab.lab.proxy().bytes_down();
    apply_fan_out_set(&lab, "web", &references).await;
    let reports = wait_set_pinned(&lab, "web").await;
    for node in NODES {
        lab.lab.node(node).assert_pinned(&references);
        let set = &reports[node]["status"]["sets"][0];
        assert!(
            set["fanOut"]["cache"]
                .as_str()
                .is_some_and(|c| c.ends_with(&format!(":{CACHE_PORT}"))),
            "{node} pulled through the cache: {set}"
        );
    }
    let moved = lab.lab.proxy().bytes_down() - before;
    assert!(
        moved as f64 <= 1.05 * unique as f64,
        "{moved} bytes crossed the link for {unique} unique bytes (lab: {})",
        lab.lab.dir().display()
    );
    let holders: Vec<&Value> = reports
        .values()
        .filter_map(|r| r["status"].get("cache"))
        .collect();
    assert_eq!(holders.len(), 1, "one agent holds the cache's role");
    assert!(holders[0]["servedBytes"].as_u64().unwrap() >= 3 * (unique - unique / 20));
    wait_for("every hosts.toml back", Duration::from_secs(30), || async {
        let now = hosts_files(&lab);
        (now == hosts_before)
            .then_some(())
            .ok_or(format!("{now:?}"))
    })
    .await;
    eprintln!(
        "fan-out through the in-cluster cache: {moved} bytes over the link for {unique} unique ({:.3}x)",
        moved as f64 / unique as f64
    );
}

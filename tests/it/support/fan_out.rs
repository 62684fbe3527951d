//! The in-cluster cache's lab tests' common steps: a lab of agents all eligible for the cache's role,
//! images of a shared base layer, fan-out sets applied as `kubectl apply` would, waiting for reports, and
//! the link's bytes checked against the unique bytes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;

use super::agents::{AgentsLab, AgentsSetup};
use super::kube_objects::{apply_yaml, wait_for};
use super::{ImageSpec, LayerFormat, LayerSpec, NodeSpec, PushedImage, RegistrySetup};

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
pub const WAIT: Duration = Duration::from_secs(180);
/// Where every eligible agent's cache serves on its node.
pub const CACHE_PORT: &str = "5050";

/// A lab of `nodes` whose agents are all eligible for the cache's role (at [`CACHE_PORT`]) and reach
/// `registry` through the proxy, every agent with `more` arguments.
pub async fn cache_lab(
    name: &str,
    nodes: &[&str],
    registry: RegistrySetup,
    more: &[&str],
) -> AgentsLab {
    let nodes = nodes.iter().map(|n| NodeSpec::new(n, 256 * MI)).collect();
    let mut agent_args = vec![
        "--insecure-registry={proxy}".to_string(),
        format!("--cache-port={CACHE_PORT}"),
        "--cache-dir={lab}/cache-{node}".into(),
    ];
    agent_args.extend(more.iter().map(|a| a.to_string()));
    let setup = AgentsSetup {
        agent_args,
        registry,
        ..AgentsSetup::default()
    };
    AgentsLab::start_with(name, nodes, None, setup).await
}

/// `count` images, each of a base layer shared by all and a layer of its own.
pub fn push_images(lab: &AgentsLab, repo: &str, seed: u64, count: u64) -> Vec<PushedImage> {
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

/// Applies PinSet `name` with `spec.fanOut` listing `references` (and `extra` YAML under its spec), as
/// `kubectl apply` would.
pub async fn apply_fan_out_set(lab: &AgentsLab, name: &str, references: &[String], extra: &str) {
    let listed: String = references
        .iter()
        .map(|r| format!("  - name: {r}\n"))
        .collect();
    let yaml = format!(
        "apiVersion: pinboard.dev/v1alpha1\nkind: PinSet\nmetadata:\n  name: {name}\nspec:\n  fanOut: true\n  \
         pinnedImages:\n{listed}{extra}"
    );
    apply_yaml(&lab.admin, &yaml).await;
}

/// The PinboardNode reports, by node.
pub async fn reports(lab: &AgentsLab) -> BTreeMap<String, Value> {
    lab.reports()
        .await
        .into_iter()
        .map(|r| (r["metadata"]["name"].as_str().unwrap().to_owned(), r))
        .collect()
}

/// Waits until the reports of `nodes` have set `name` pinned.
pub async fn wait_set_pinned_on(
    lab: &AgentsLab,
    name: &str,
    nodes: &[&str],
) -> BTreeMap<String, Value> {
    wait_for(&format!("set {name} pinned on {nodes:?}"), WAIT, || async {
        let reports = reports(lab).await;
        let pinned = nodes.iter().all(|node| {
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
    })
    .await
}

/// `images`' references through the lab's counting proxy.
pub fn through_proxy(lab: &AgentsLab, images: &[PushedImage]) -> Vec<String> {
    images
        .iter()
        .map(|i| i.reference(&lab.lab.proxy_host()))
        .collect()
}

/// The cache's token, from its Secret.
pub async fn cache_token(lab: &AgentsLab) -> String {
    let secrets: Api<Secret> = Api::namespaced(lab.admin.clone(), super::agents::NAMESPACE);
    let secret = secrets
        .get("pinboard-cache-token")
        .await
        .expect("the token's Secret");
    let data = secret.data.expect("data");
    String::from_utf8(data["token"].0.clone()).expect("a text token")
}

/// Waits until the link carried `bytes` more than the `before` its proxy had sent.
pub async fn wait_link_moved(lab: &AgentsLab, before: u64, bytes: u64) {
    wait_for(&format!("{bytes} bytes over the link"), WAIT, || async {
        let moved = lab.lab.proxy().bytes_down() - before;
        (moved >= bytes)
            .then_some(())
            .ok_or_else(|| format!("{moved} bytes"))
    })
    .await;
}

//! Integration tests of the lab itself (tests/it/support): real containerd nodes, docker-registry, the proxy in
//! front of it, and etcd + kube-apiserver. They fail, never skip, when the lab cannot start.

use crate::support;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::{Duration, Instant};

use nix::sys::statvfs::statvfs;
use sha2::{Digest as _, Sha256};
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, PushedImage};

const MIB: u64 = 1 << 20;

fn start(name: &str, nodes: &[(&str, u64)], apiserver: bool) -> Lab {
    let nodes = nodes
        .iter()
        .map(|&(name, bytes)| NodeSpec::new(name, bytes))
        .collect();
    Lab::start(
        name,
        LabConfig {
            nodes,
            apiserver,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start")
}

fn layer(seed: u64, bytes: usize, format: LayerFormat) -> LayerSpec {
    LayerSpec {
        seed,
        bytes,
        format,
    }
}

fn image(layers: Vec<LayerSpec>) -> ImageSpec {
    ImageSpec {
        layers,
        annotations: BTreeMap::new(),
    }
}

/// Total and free bytes of the filesystem holding `path`.
fn fs_space(path: &std::path::Path) -> (u64, u64) {
    let stat = statvfs(path).expect("statvfs");
    (
        stat.blocks() * stat.fragment_size(),
        stat.blocks_available() * stat.fragment_size(),
    )
}

/// `GET` a blob of `image`'s repo from `host`, returning its bytes.
fn get_blob(host: &str, image: &PushedImage, digest: &str) -> Vec<u8> {
    let mut response = support::http::agent()
        .get(format!("http://{host}/v2/{}/blobs/{digest}", image.repo))
        .call()
        .expect("GET blob");
    assert_eq!(response.status(), 200, "GET blob {digest}");
    response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .expect("blob body")
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[test]
fn each_node_has_its_own_image_filesystem() {
    let lab = start("own_imagefs", &[("n1", 64 * MIB), ("n2", 96 * MIB)], false);
    assert_eq!(lab.nodes().len(), 2);
    for node in lab.nodes() {
        let (total, free) = fs_space(&node.imagefs_dir());
        assert_eq!(total, node.imagefs_bytes, "{}: tmpfs size", node.name);
        assert!(
            free > total / 2,
            "{}: a fresh node's image fs is mostly free",
            node.name
        );
        assert!(
            node.endpoint().starts_with("unix:///"),
            "{}",
            node.endpoint()
        );
    }
    assert_eq!(lab.node("n2").imagefs_bytes, 96 * MIB);
}

#[test]
fn pushed_images_are_deterministic_and_share_layers() {
    let lab = start("deterministic", &[], false);
    let base = layer(1, 300_000, LayerFormat::Gzip);
    let mut spec = image(vec![
        base.clone(),
        layer(2, 200_000, LayerFormat::Estargz),
        layer(3, 100_000, LayerFormat::ZstdChunked),
    ]);
    spec.annotations
        .insert("org.example/purpose".into(), "lab smoke".into());
    let first = lab.push_image("smoke/app", &spec).unwrap();
    // Built from scratch in another lab (a lab builds each layer once), the same spec gives the same bytes.
    let rebuilt = start("deterministic_again", &[], false)
        .push_image("smoke/app", &spec)
        .unwrap();
    assert_eq!(first.manifest_digest, rebuilt.manifest_digest);
    assert_eq!(first.layers, rebuilt.layers);
    assert_eq!(first.config_digest, rebuilt.config_digest);

    // Another image on the same base layer, in another repository.
    let other = lab
        .push_image(
            "smoke/other",
            &image(vec![base, layer(4, 50_000, LayerFormat::Gzip)]),
        )
        .unwrap();
    let shared = &first.layers[0].digest;
    assert_eq!(&other.layers[0].digest, shared);
    assert_ne!(other.manifest_digest, first.manifest_digest);

    // The registry's own access log: the shared layer was uploaded (PUT ...?digest=) exactly once.
    let log = std::fs::read_to_string(lab.dir().join("registry.log")).unwrap();
    let uploads = log
        .lines()
        .filter(|l| {
            l.contains("\"PUT ") && l.contains(&format!("digest={shared}")) && l.contains("\" 201 ")
        })
        .count();
    assert_eq!(uploads, 1, "uploads of the shared layer:\n{log}");

    // What the registry serves matches the descriptors: digests, sizes, formats and diff IDs.
    assert_eq!(
        first
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect::<Vec<_>>(),
        [
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ]
    );
    let host = lab.registry_host();
    let config = get_blob(&host, &first, &first.config_digest);
    assert_eq!(config.len() as u64, first.config_size);
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    for (i, pushed) in first.layers.iter().enumerate() {
        let blob = get_blob(&host, &first, &pushed.digest);
        assert_eq!(sha256(&blob), pushed.digest);
        assert_eq!(blob.len() as u64, pushed.size);
        let mut tar = Vec::new();
        if pushed.media_type.ends_with("+zstd") {
            zstd::stream::read::Decoder::new(&blob[..])
                .unwrap()
                .read_to_end(&mut tar)
                .unwrap();
        } else {
            flate2::read::GzDecoder::new(&blob[..])
                .read_to_end(&mut tar)
                .unwrap();
        }
        assert_eq!(tar.len() as u64, pushed.uncompressed_size);
        assert_eq!(config["rootfs"]["diff_ids"][i], sha256(&tar));
    }
    let manifest = support::http::agent()
        .get(format!(
            "http://{host}/v2/smoke/app/manifests/{}",
            first.manifest_digest
        ))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .call()
        .unwrap()
        .body_mut()
        .read_to_vec()
        .unwrap();
    assert_eq!(manifest.len() as u64, first.manifest_size);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(manifest["annotations"]["org.example/purpose"], "lab smoke");
    let annotations = &manifest["layers"];
    assert!(annotations[1]["annotations"]["containerd.io/snapshot/stargz/toc.digest"].is_string());
    assert!(
        annotations[2]["annotations"]["io.github.containers.zstd-chunked.manifest-position"]
            .is_string()
    );
}

#[test]
fn node_pulls_through_the_proxy() {
    let lab = start("pull_via_proxy", &[("n1", 64 * MIB)], false);
    let pushed = lab
        .push_image(
            "smoke/pull",
            &image(vec![
                layer(10, 2 << 20, LayerFormat::Gzip),
                layer(11, 1 << 20, LayerFormat::Estargz),
                layer(12, 1 << 20, LayerFormat::ZstdChunked),
            ]),
        )
        .unwrap();
    let node = lab.node("n1");
    let (_, free_before) = fs_space(&node.imagefs_dir());
    let requests_before = lab.proxy().requests();

    node.pull(&pushed.reference(&lab.proxy_host()))
        .expect("ctr pull through the proxy, seen by CRI");

    assert!(
        lab.proxy().requests() > requests_before,
        "the pull went through the proxy"
    );
    let layer_bytes: u64 = pushed.layers.iter().map(|l| l.size).sum();
    assert!(
        lab.proxy().bytes_down() >= layer_bytes,
        "{} < {layer_bytes}",
        lab.proxy().bytes_down()
    );
    let (_, free_after) = fs_space(&node.imagefs_dir());
    assert!(
        free_before - free_after >= 4 * MIB,
        "content and snapshots land on the node's tmpfs: {free_before} -> {free_after}"
    );
}

#[test]
fn proxy_limits_bandwidth_and_delays_requests() {
    let lab = start("proxy_faults", &[], false);
    let pushed = lab
        .push_image(
            "smoke/big",
            &image(vec![layer(20, 4 << 20, LayerFormat::Gzip)]),
        )
        .unwrap();
    let digest = &pushed.layers[0].digest;
    let proxy = lab.proxy_host();

    lab.proxy().set_bandwidth(Some(2 * MIB));
    let before = lab.proxy().bytes_down();
    let started = Instant::now();
    let blob = get_blob(&proxy, &pushed, digest);
    let took = started.elapsed();
    assert_eq!(&sha256(&blob), digest);
    assert!(
        took >= Duration::from_millis(1500),
        "4 MiB at 2 MiB/s took only {took:?}"
    );
    assert!(lab.proxy().bytes_down() - before >= 4 * MIB);

    lab.proxy().set_bandwidth(None);
    lab.proxy().set_delay(Duration::from_millis(400));
    let requests = lab.proxy().requests();
    let started = Instant::now();
    for _ in 0..2 {
        let status = support::http::agent()
            .get(format!("http://{proxy}/v2/"))
            .call()
            .unwrap()
            .status();
        assert_eq!(status, 200);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(lab.proxy().requests(), requests + 2);
}

#[tokio::test]
async fn apiserver_kubeconfig_works() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::config::{KubeConfigOptions, Kubeconfig};

    pinboard::install_crypto_provider();
    let lab = start("apiserver", &[("n1", 32 * MIB)], true);
    let apiserver = lab.apiserver().expect("apiserver requested");

    let kubeconfig = Kubeconfig::read_from(apiserver.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    // The API server's bootstrap controller creates `default` shortly after it answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let namespaces = kube::Api::<Namespace>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let names: Vec<_> = namespaces
            .iter()
            .filter_map(|ns| ns.metadata.name.clone())
            .collect();
        if names.iter().any(|n| n == "default") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no namespace default: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let url = format!("{}/api/v1/namespaces", apiserver.url());
    let get = |token: &str| {
        let agent = support::http::agent();
        agent
            .get(&url)
            .header("Authorization", format!("Bearer {token}"))
            .call()
            .unwrap()
            .status()
    };
    assert_eq!(get(apiserver.admin_token()), 200);
    assert_eq!(
        get(apiserver.viewer_token()),
        403,
        "viewer has no RBAC grants"
    );
}

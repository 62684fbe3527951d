//! `plan` on pinboard's agents (real kubelets and containerd nodes, the registry behind the counting
//! proxy): each node planned by what its agent published of what its runtime holds, so its figure is what
//! containerd then fetches; and judged by the floor its agent pulls by, not by the command line's default.

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use pinboard::model::digest_prefix::DigestPrefixes;
use serde_json::Value;
use support::agents::{AgentsLab, AgentsSetup};
use support::kube_objects::wait_for;
use support::{ImageSpec, LayerFormat, LayerSpec, NodeSpec, PushedImage};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(120);

fn layer(seed: u64, bytes: u64) -> LayerSpec {
    LayerSpec {
        seed,
        bytes: bytes as usize,
        format: LayerFormat::Gzip,
    }
}

/// X = B + x and Y = B + y, pushed: (X, Y).
fn push_sharing_a_base(lab: &AgentsLab) -> (PushedImage, PushedImage) {
    let base = layer(2901, 6 * MIB);
    let image = |own: LayerSpec| ImageSpec {
        layers: vec![base.clone(), own],
        ..ImageSpec::default()
    };
    let x = lab.lab.push_image("plan/x", &image(layer(2902, 2 * MIB)));
    let y = lab.lab.push_image("plan/y", &image(layer(2903, 3 * MIB)));
    (x.expect("push X"), y.expect("push Y"))
}

/// `node`'s entry in `plan -o json`'s output.
fn node_plan(run: &support::Run, node: &str) -> Value {
    let plan: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("plan -o json ({e}): {}\n{}", run.stdout, run.stderr));
    plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["node"] == node)
        .cloned()
        .unwrap_or_else(|| panic!("no {node} in {plan}"))
}

/// Waits until `node`'s agent has reported, and published that its runtime holds the image `digest`.
async fn wait_published(lab: &AgentsLab, node: &str, digest: &str) {
    wait_for(&format!("{node} publishes {digest}"), WAIT, || async {
        let objects = lab.objects("PinboardNodeBlobs", "pinboardnodeblobs").await;
        let status = objects
            .iter()
            .find(|o| o["metadata"]["name"] == node)
            .map(|o| o["status"].clone());
        let images = status.as_ref().and_then(|s| s["images"].as_str());
        let held = images
            .and_then(|text| DigestPrefixes::from_base64(text).ok())
            .and_then(|prefixes| prefixes.contains(digest));
        // A plan takes a node's holdings only with its report: an agent's first publishes a moment before.
        let reported = lab
            .reports()
            .await
            .iter()
            .any(|r| r["metadata"]["name"] == node);
        (held == Some(true) && reported)
            .then_some(())
            .ok_or(format!("reported: {reported}, {status:?}"))
    })
    .await;
}

/// A pod on `node` running `image`, pulled by the kubelet as any workload's would be (the image runs no
/// program: its container never starts, its pull is what counts).
fn pod_on(node: &str, image: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "workload", "namespace": "default"},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent"}],
        },
    }))
    .expect("a pod")
}

/// While n1's agent runs, a pod's pull brings X outside any set; the set holds Y, which shares X's base.
/// Within 15 s of the pull the plan counts only what n1 lacks, exactly (no restart of the agent, no
/// 5-minute wait), and the link carries that when the set is applied.
#[tokio::test(flavor = "multi_thread")]
async fn a_plan_on_agents_counts_only_the_blobs_a_node_lacks_and_the_link_carries_that() {
    let setup = AgentsSetup {
        agent_args: vec!["--insecure-registry={proxy}".into()],
        ..AgentsSetup::default()
    };
    let lab = AgentsLab::start_with(
        "agents-plan",
        vec![NodeSpec::new("n1", 200 * MIB)],
        None,
        setup,
    )
    .await;
    let (x, y) = push_sharing_a_base(&lab);
    let proxy = lab.lab.proxy_host();
    // The agent has read and published its node before the pod comes.
    wait_for("n1's first report", WAIT, || async {
        let reports = lab.reports().await;
        let reported = reports.iter().any(|r| r["metadata"]["name"] == "n1");
        reported.then_some(()).ok_or("none yet".to_string())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(lab.admin.clone(), "default");
    let x_reference = x.reference(&lab.lab.registry_host());
    pods.create(&PostParams::default(), &pod_on("n1", &x_reference))
        .await
        .expect("the pod");
    let node = lab.lab.node("n1");
    wait_for("the kubelet pulls X", WAIT, || async {
        let pulled = node.cri_image(&x_reference).is_some();
        pulled.then_some(()).ok_or("not yet".to_string())
    })
    .await;
    let pulled = Instant::now();
    wait_published(&lab, "n1", &x.manifest_digest).await;
    let after = pulled.elapsed();
    println!("n1 published X {after:?} after the kubelet pulled it");
    assert!(
        after <= Duration::from_secs(15),
        "the plan learns of a pod's pull within 15 s, not at the agent's next 5-minute read: {after:?}"
    );

    let set = lab.set_file("y", &[&y.reference(&proxy)], "");
    let file = set.to_str().unwrap();
    let run = lab.pinboard(&[
        "plan",
        "--insecure-registry",
        &proxy,
        "--set",
        file,
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = node_plan(&run, "n1");
    let lacking = y.layers[1].size + y.config_size;
    assert_eq!(n1["fetchBasis"], "exact", "{n1}");
    assert_eq!(
        n1["fetchBytes"], lacking,
        "y and Y's config, not the base X brought: {n1}"
    );
    assert_eq!(n1["images"][0]["present"], false, "{n1}");

    let before = lab.lab.proxy().bytes_down();
    let run = lab.apply(&set, "120s", &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let moved = lab.lab.proxy().bytes_down() - before;
    lab.lab.node("n1").assert_pinned(&[&y.reference(&proxy)]);
    support::assert_within(
        "n1: the link's bytes, against the exact plan",
        moved,
        lacking,
        0.02,
    );
}

/// Agents started with `--min-free 1Mi` on nodes far below the command line's default floor (16 GiB):
/// `plan` and `apply` without `--min-free` judge each node by its agent's floor; a `--min-free` given to
/// `plan` is named a what-if, and one given to `apply` is said not to apply to the agents.
#[tokio::test(flavor = "multi_thread")]
async fn the_agents_own_floor_decides_and_a_given_min_free_is_a_what_if() {
    let setup = AgentsSetup {
        min_free: "1Mi",
        ..AgentsSetup::default()
    };
    let nodes = vec![
        NodeSpec::new("n1", 100 * MIB),
        NodeSpec::new("n2", 100 * MIB),
    ];
    let lab = AgentsLab::start_with("agents-floor", nodes, None, setup).await;
    let image = lab
        .lab
        .push_image("floor/app", &ImageSpec::small(2950))
        .expect("push")
        .reference(&lab.lab.registry_host());
    let file = lab.set_file("app", &[&image], "");
    let file = file.to_str().unwrap();
    // Every agent has reported what it pulls by.
    wait_for("both agents report their floor", WAIT, || async {
        let reports = lab.reports().await;
        let floors: Vec<Value> = reports
            .iter()
            .map(|r| r["status"]["limits"]["minFreeBytes"].clone())
            .collect();
        (floors == [Value::from(MIB), Value::from(MIB)])
            .then_some(())
            .ok_or(format!("{floors:?}"))
    })
    .await;

    let run = lab.pinboard(&["plan", "--set", file, "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for node in ["n1", "n2"] {
        let plan = node_plan(&run, node);
        assert_eq!(plan["verdict"], "fits", "{plan}");
        assert_eq!(plan["minFreeSource"], "agent", "{plan}");
        assert_eq!(plan["minFreeBytes"], MIB, "{plan}");
    }
    let run = lab.pinboard(&["apply", "--set", file, "--timeout", "120s"]);
    assert_eq!(run.code, 0, "not refused: {}\n{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("do not fit"), "{}", run.stderr);
    for node in ["n1", "n2"] {
        lab.lab.node(node).assert_pinned(&[&image]);
    }

    let run = lab.pinboard(&["plan", "--set", file, "--min-free", "16Gi", "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = node_plan(&run, "n1");
    assert_eq!(n1["verdict"], "no-space", "{n1}");
    assert_eq!(n1["minFreeSource"], "what-if", "{n1}");
    assert_eq!(n1["agentMinFreeBytes"], MIB, "{n1}");
    let run = lab.pinboard(&["plan", "--set", file, "--min-free", "16Gi"]);
    assert!(
        run.stdout.contains(
            "--min-free 16 GiB is a what-if: the agents pull by their own floors (1 MiB on n1, n2)"
        ),
        "{}",
        run.stdout
    );

    let run = lab.pinboard(&[
        "apply",
        "--set",
        file,
        "--min-free",
        "16Gi",
        "--timeout",
        "120s",
    ]);
    assert_eq!(run.code, 0, "not refused: {}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("--min-free 16 GiB does not apply to the agents"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("do not fit"), "{}", run.stderr);
}

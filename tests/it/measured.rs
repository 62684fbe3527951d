//! The figures are what the runtime really does. Image X (base B, layer x) is on the node; image Y shares
//! B and adds layer y. The runtime skips every blob it holds, whichever image brought it, so:
//! - `plan` for Y counts y and Y's config, not B: containerd's content store says it holds B; CRI-O's
//!   layers, by uncompressed digest, say so too;
//! - `apply` reports what crossed the registry link, counted at the lab proxy: on containerd the blobs its
//!   content store gained; on CRI-O, which reports no bytes, the plan's figure, which the proxy confirms;
//! - `present` and `pulled` say which images were there and which were pulled, after pinning too.

use crate::support;

use serde_json::Value;
use support::{ImageSpec, Lab, LayerFormat, LayerSpec, NodeSpec, PushedImage, Runtime, pinboard};

const MI: usize = 1 << 20;

fn layer(seed: u64, bytes: usize) -> LayerSpec {
    LayerSpec {
        seed,
        bytes,
        format: LayerFormat::Gzip,
    }
}

/// X = B + x and Y = B + y, pushed: (X, Y).
fn push_sharing_a_base(lab: &Lab) -> (PushedImage, PushedImage) {
    let base = layer(901, 3 * MI);
    let x = ImageSpec {
        layers: vec![base.clone(), layer(902, 2 * MI)],
        ..ImageSpec::default()
    };
    let y = ImageSpec {
        layers: vec![base, layer(903, 4 * MI)],
        ..ImageSpec::default()
    };
    let pushed_x = lab.push_image("measured/x", &x).expect("push X");
    let pushed_y = lab.push_image("measured/y", &y).expect("push Y");
    assert_eq!(
        pushed_x.layers[0].digest, pushed_y.layers[0].digest,
        "B is shared"
    );
    (pushed_x, pushed_y)
}

/// What every command here takes: the registry through the proxy, a small floor, the node.
fn common(lab: &Lab, node: &[String]) -> Vec<String> {
    let mut args = vec![
        "--insecure-registry".to_string(),
        lab.proxy_host(),
        "--min-free".into(),
        "1Mi".into(),
        "-o".into(),
        "json".into(),
    ];
    args.extend_from_slice(node);
    args
}

fn json(run: &support::Run, what: &str) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: {e}\nstdout: {}\nstderr: {}",
            run.stdout, run.stderr
        )
    })
}

/// `plan --image Y`: what the node will fetch is y and Y's config, exactly.
fn plan_counts_only_what_the_node_lacks(lab: &Lab, node: &[String], y: &PushedImage) {
    let mut args = vec![
        "plan".to_string(),
        "--image".into(),
        y.reference(&lab.proxy_host()),
    ];
    args.extend(common(lab, node));
    let run = pinboard(args);
    assert_eq!(run.code, 0, "plan: {}", run.stderr);
    let plan = json(&run, "plan");
    let n1 = &plan["nodes"][0];
    assert_eq!(
        n1["fetchBytes"],
        y.layers[1].size + y.config_size,
        "y and Y's config, not the base B the node holds through X: {n1}"
    );
    assert_eq!(n1["fetchBasis"], "exact", "{n1}");
}

/// `apply --image X --image Y`: X was there, Y is pulled; what the node reports fetching is within 2 % of
/// what the proxy carried, and the plan's figure stays beside it.
fn apply_reports_what_crossed_the_link(
    lab: &Lab,
    node: &[String],
    (x, y): (&PushedImage, &PushedImage),
    source: &str,
) {
    let host = lab.proxy_host();
    let mut args = vec!["apply".to_string()];
    for image in [x, y] {
        args.extend(["--image".to_string(), image.reference(&host)]);
    }
    args.extend(common(lab, node));
    let before = lab.proxy().bytes_down();
    let run = pinboard(args);
    let moved = lab.proxy().bytes_down() - before;
    assert_eq!(run.code, 0, "apply: {}", run.stderr);
    let report = json(&run, "apply");
    let n1 = &report["rollout"][0];
    assert_eq!(
        (n1["present"].clone(), n1["pulled"].clone()),
        (1.into(), 1.into()),
        "{n1}"
    );
    assert_eq!(n1["state"], "pinned", "{n1}");
    assert_eq!(n1["fetchedSource"], source, "{n1}");
    assert_eq!(n1["plannedBytes"], y.layers[1].size + y.config_size, "{n1}");
    let fetched = n1["fetchedBytes"].as_u64().expect("fetchedBytes");
    support::assert_within(
        "the node's fetched bytes, against the proxy's",
        fetched,
        moved,
        0.02,
    );
    assert!(
        !report["interrupted"].as_bool().expect("interrupted"),
        "{report}"
    );
}

#[test]
fn containerd_plans_and_measures_only_the_blobs_it_lacks() {
    let lab = Lab::with_nodes("measured", vec![NodeSpec::new("n1", 200 << 20)]);
    let (x, y) = push_sharing_a_base(&lab);
    lab.node("n1")
        .pull(&x.reference(&lab.proxy_host()))
        .expect("X pre-loaded");
    let node = vec![
        "--cri".to_string(),
        format!("n1={}", lab.node("n1").endpoint()),
    ];
    plan_counts_only_what_the_node_lacks(&lab, &node, &y);
    apply_reports_what_crossed_the_link(&lab, &node, (&x, &y), "content-store");
}

#[test]
fn crio_1_33_plans_by_its_layers_and_reports_the_plans_figure_which_the_link_confirms() {
    let lab = Lab::with_nodes(
        "measured-crio",
        vec![NodeSpec::new("n1", 200 << 20).on(Runtime::Crio133)],
    );
    let (x, y) = push_sharing_a_base(&lab);
    let node = lab.node("n1").node_args();
    // X onto the node as CRI-O pulls it.
    let mut preload = vec![
        "apply".to_string(),
        "--image".into(),
        x.reference(&lab.proxy_host()),
    ];
    preload.extend(common(&lab, &node));
    let run = pinboard(preload);
    assert_eq!(run.code, 0, "pre-load X: {}", run.stderr);
    plan_counts_only_what_the_node_lacks(&lab, &node, &y);
    apply_reports_what_crossed_the_link(&lab, &node, (&x, &y), "plan");
}

#[test]
fn an_interrupted_apply_still_writes_its_json_and_says_so() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};

    let lab = Lab::with_nodes("measured-interrupt", vec![NodeSpec::new("n1", 200 << 20)]);
    let (x, _) = push_sharing_a_base(&lab);
    // Slow enough that the pull is still running when the signal comes.
    lab.proxy().set_bandwidth(Some(256 << 10));
    let node = vec![
        "--cri".to_string(),
        format!("n1={}", lab.node("n1").endpoint()),
    ];
    let mut args = vec![
        "apply".to_string(),
        "--image".into(),
        x.reference(&lab.proxy_host()),
    ];
    args.extend(common(&lab, &node));
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pinboard runs");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
    let mut said = String::new();
    while !said.contains(": pulling ") {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).expect("stderr") > 0,
            "apply ended before pulling: {said}"
        );
        said.push_str(&line);
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) takes no pointers; the PID is our own unreaped child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = child.wait().expect("it exits");
    stderr.read_to_string(&mut said).expect("stderr");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)
        .expect("stdout");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("error: interrupted by SIGINT"), "{said}");
    let report: Value = serde_json::from_str(&stdout).expect("the JSON, interrupted or not");
    assert_eq!(report["interrupted"], true, "{report}");
    assert_eq!(report["readiness"], Value::Null, "{report}");
    assert_eq!(report["rollout"][0]["node"], "n1", "{report}");
}

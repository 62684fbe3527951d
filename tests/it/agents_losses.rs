//! The agents' word stays true after the rollout: an image removed or a pin label cleared behind
//! pinboard's back on a node (as kubelet image GC, `crictl rmi` or an administrator would) is noticed by
//! the node's agent, named by `check`, and put back; on containerd at once from its image events, on
//! CRI-O (which has no image events) at the agent's periodic check. Real kubelets on containerd 1.7, and
//! beside them a node of each other runtime with its agent on this host (containerd 1.6 and 2.1, the real
//! CRI-O); the registry behind the counting proxy; the agents with their default checking interval.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::agents::AgentsLab;
use support::kube_objects::wait_for;
use support::{ImageSpec, NodeSpec, Runtime};

const MIB: u64 = 1 << 20;
/// What the issue asks: a loss named within this long at the agents' default settings.
const NOTICED_WITHIN: Duration = Duration::from_secs(60);
/// How many times `check` is polled, a second apart, after a loss the agent cannot put back.
const GATE_POLLS: usize = 8;

/// Every node's report, by node.
async fn reports(lab: &AgentsLab) -> BTreeMap<String, Value> {
    lab.reports()
        .await
        .into_iter()
        .map(|r| (r["metadata"]["name"].as_str().unwrap().to_owned(), r))
        .collect()
}

/// Node `node`'s report of set `set`.
async fn set_report(lab: &AgentsLab, node: &str, set: &str) -> Value {
    let reports = reports(lab).await;
    reports
        .get(node)
        .and_then(|r| r["status"]["sets"].as_array())
        .and_then(|sets| sets.iter().find(|s| s["name"] == set).cloned())
        .unwrap_or(Value::Null)
}

/// Applies set `name` of `references` (through the proxy host `proxy`) and waits for it to be ready.
fn apply(lab: &AgentsLab, name: &str, references: &[&str], proxy: &str) {
    let file = lab.set_file(name, references, "");
    let run = lab.pinboard(&[
        "apply",
        "--insecure-registry",
        proxy,
        "--set",
        file.to_str().unwrap(),
        "--timeout",
        "120s",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
}

/// Polls `check --set SET` until it exits 1 with a reason on `node` naming `image` and `found`; how long
/// that took since `since`, and the reason.
async fn named_not_ready(
    lab: &AgentsLab,
    set: &str,
    node: &str,
    image: &str,
    found: &str,
    since: Instant,
) -> (Duration, String) {
    wait_for(
        &format!("check names {node}: {image} {found}"),
        NOTICED_WITHIN,
        || async {
            let (code, judged, stderr) = lab.check(&["--set", set]);
            let reason = judged
                .nodes
                .iter()
                .find(|n| n.node == node && !n.ready)
                .and_then(|n| {
                    n.reasons
                        .iter()
                        .find(|r| r.contains(image) && r.contains(found))
                        .cloned()
                });
            match (code, reason) {
                (1, Some(reason)) => Ok((since.elapsed(), reason)),
                _ => Err(format!("exit {code}: {judged:?}\n{stderr}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_removed_or_a_pin_cleared_behind_the_agents_back_is_named_and_put_back() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
        NodeSpec::new("n3", 200 * MIB),
    ];
    let lab = AgentsLab::through_proxy("agents-losses", nodes).await;
    let proxy = lab.lab.proxy_host();
    let push = |repository: &str, spec: &ImageSpec| {
        lab.lab
            .push_image(repository, spec)
            .expect("push")
            .reference(&proxy)
    };
    let a = push("losses/a", &ImageSpec::small(7700));
    let b = push(
        "losses/b",
        &ImageSpec::gzip_layers(7701, &[6 * MIB as usize]),
    );
    apply(&lab, "web", &[&a, &b], &proxy);

    // `ctr images rm` of b on n2, the link slowed so that the agent's restore takes a while (24 s).
    lab.lab.proxy().set_bandwidth(Some(MIB / 4));
    let removed = Instant::now();
    lab.lab.node("n2").remove_image(&b);
    let (noticed, reason) = named_not_ready(&lab, "web", "n2", &b, "absent", removed).await;
    eprintln!("lost image named by check after {noticed:?}: {reason}");
    assert!(reason.contains("web"), "{reason}");
    let report = set_report(&lab, "n2", "web").await;
    assert_eq!(report["state"], "restoring", "{report}");
    // The agent pulls it again and pins it; `check` is then ready again.
    lab.lab.proxy().set_bandwidth(None);
    let (code, _, stderr) = lab.check(&["--set", "web", "--wait", "--timeout", "60s"]);
    assert_eq!(code, 0, "{stderr}");
    lab.lab.node("n2").assert_pinned(&[&a, &b]);
    let report = set_report(&lab, "n2", "web").await;
    assert_eq!(report["state"], "pinned", "{report}");
    assert_eq!(report["restores"]["count"], 1, "{report}");
    assert_eq!(report["restores"]["last"]["images"][0]["name"], json!(b));
    assert_eq!(report["restores"]["last"]["images"][0]["found"], "absent");
    eprintln!("put back {:?} after its removal", removed.elapsed());

    // The pin label of a cleared on n3: noticed, named in the report, and put back.
    let cleared = Instant::now();
    lab.lab
        .node("n3")
        .clear_label(&a, "io.cri-containerd.pinned");
    let restored = wait_for("n3's pin put back", NOTICED_WITHIN, || async {
        let report = set_report(&lab, "n3", "web").await;
        let back = report["state"] == "pinned" && report["restores"]["count"] == 1;
        back.then_some(report.clone()).ok_or(report.to_string())
    })
    .await;
    eprintln!("pin put back {:?} after it was cleared", cleared.elapsed());
    assert_eq!(restored["restores"]["last"]["images"][0]["name"], json!(a));
    assert_eq!(
        restored["restores"]["last"]["images"][0]["found"], "unpinned",
        "{restored}"
    );
    lab.lab.node("n3").assert_pinned(&[&a, &b]);
    // n1 lost nothing and was left alone.
    assert!(set_report(&lab, "n1", "web").await["restores"].is_null());
    let (code, _, stderr) = lab.check(&["--set", "web"]);
    assert_eq!(code, 0, "{stderr}");
}

crate::on_runtimes! {
    /// A node of each runtime beside the kubelets' (its runtime a process of this host, its agent too): an
    /// image removed behind the agent's back is named by `check` and put back; on containerd at once from
    /// its image events, on CRI-O at the agent's periodic check. On containerd a pin label cleared on every
    /// record of the image is named and put back as well.
    [containerd_1_6, containerd_2_1, crio_1_33]
    fn a_loss_on_a_node_of_each_runtime_is_named_and_put_back(runtime) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(loss_on(runtime));
    }
}

async fn loss_on(runtime: Runtime) {
    let nodes = vec![NodeSpec::new("n1", 200 * MIB)];
    let mut lab = AgentsLab::through_proxy(&format!("agents-losses-{runtime}"), nodes).await;
    lab.add_host_node(NodeSpec::new("x1", 200 * MIB).on(runtime), &[])
        .await;
    eprintln!("x1 runs {}", lab.lab.node("x1").runtime_version());
    let proxy = lab.lab.proxy_host();
    let push = |repository: &str, spec: &ImageSpec| {
        lab.lab
            .push_image(repository, spec)
            .expect("push")
            .reference(&proxy)
    };
    let a = push("losses/a", &ImageSpec::small(7710));
    let b = push(
        "losses/b",
        &ImageSpec::gzip_layers(7711, &[6 * MIB as usize]),
    );
    apply(&lab, "web", &[&a, &b], &proxy);
    let x1 = lab.lab.node("x1");
    x1.assert_pinned(&[&a, &b]);

    // The gate after a loss: removed behind the agent's back (`crictl rmi`, `ctr images rm`) with the
    // registry link down, so that nothing can put it back. `check` polled at once and every second after
    // never says ready while the runtime lacks the image: each asks the agent, which asks its runtime
    // (CRI-O announces no image events, and its periodic check is 30 s away).
    lab.lab.proxy().fail_requests(503, u64::MAX, None);
    let removed = Instant::now();
    x1.remove_image(&b);
    let mut named = None;
    for _ in 0..GATE_POLLS {
        let polled = Instant::now();
        let (code, judged, stderr) = lab.check(&["--set", "web"]);
        let absent = x1.cri_image(&b).is_none();
        assert!(
            !(code == 0 && absent),
            "{runtime}: check said ready {:?} after the removal while the runtime lacks {b}",
            removed.elapsed()
        );
        assert_eq!(code, 1, "{stderr}");
        let reason = judged
            .nodes
            .iter()
            .find(|n| n.node == "x1")
            .and_then(|n| n.reasons.iter().find(|r| r.contains(&b)).cloned());
        if let (None, Some(reason)) = (&named, reason) {
            named = Some((removed.elapsed(), reason));
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(polled.elapsed())).await;
    }
    let (noticed, reason) = named.expect("check names the lost image on x1");
    eprintln!("{runtime}: lost image named by check after {noticed:?}: {reason}");
    lab.lab.proxy().clear_faults();
    let (code, _, stderr) = lab.check(&["--set", "web", "--wait", "--timeout", "150s"]);
    assert_eq!(code, 0, "{stderr}");
    x1.assert_pinned(&[&a, &b]);
    let report = set_report(&lab, "x1", "web").await;
    assert_eq!(report["restores"]["count"], 1, "{report}");
    assert_eq!(report["restores"]["last"]["images"][0]["found"], "absent");
    if runtime.is_crio() {
        return;
    }

    // The pin label cleared on every record of a: named, and put back.
    let cleared = Instant::now();
    x1.clear_label(&a, "io.cri-containerd.pinned");
    let restored = wait_for("x1's pin put back", NOTICED_WITHIN, || async {
        let report = set_report(&lab, "x1", "web").await;
        let back = report["state"] == "pinned" && report["restores"]["count"] == 2;
        back.then_some(report.clone()).ok_or(report.to_string())
    })
    .await;
    eprintln!(
        "{runtime}: pin put back {:?} after it was cleared",
        cleared.elapsed()
    );
    assert_eq!(restored["restores"]["last"]["images"][0]["name"], json!(a));
    assert_eq!(
        restored["restores"]["last"]["images"][0]["found"], "unpinned",
        "{restored}"
    );
    x1.assert_pinned(&[&a]);
}

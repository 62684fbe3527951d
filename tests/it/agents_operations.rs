//! Agents an operations team can leave running: what `kubectl get events` and a real Prometheus (Debian's
//! package) learn of them. Real kubelets, containerd nodes and the registry behind the counting proxy.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use pinboard::backend::pinboard_api::PinboardApi;
use pinboard::model::set::from_flags;
use serde_json::Value;
use support::agents::{AgentsLab, AgentsSetup, NAMESPACE};
use support::kube_objects::{PodState, wait_for, wait_for_pod};
use support::prometheus::Prometheus;
use support::{ImageSpec, NodeSpec};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(150);

async fn lab(name: &str, nodes: &[&str]) -> AgentsLab {
    let nodes = nodes.iter().map(|n| NodeSpec::new(n, 200 * MIB)).collect();
    AgentsLab::through_proxy(name, nodes).await
}

/// The Events of `reason` about node `node`'s PinboardNode.
async fn events(lab: &AgentsLab, node: &str, reason: &str) -> Vec<Event> {
    events_about(lab, "PinboardNode", node, reason).await
}

/// The Events of `reason` about pinboard's object `kind` `name`.
async fn events_about(lab: &AgentsLab, kind: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::all(lab.admin.clone());
    api.list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind)
        })
        .collect()
}

/// Waits until node `node` has exactly one Event of `reason`, repeated at least `count` times in its series.
async fn one_series(lab: &AgentsLab, node: &str, reason: &str, count: i32) -> Event {
    wait_for(
        &format!("{node}: one {reason} Event, {count} times"),
        WAIT,
        || async {
            let found = events(lab, node, reason).await;
            let repeated = found
                .first()
                .and_then(|e| e.series.as_ref())
                .map(|s| s.count);
            match (found.len(), repeated) {
                (1, Some(n)) if n >= count => Ok(found[0].clone()),
                _ => Err(format!("{found:#?}")),
            }
        },
    )
    .await
}

/// Node `node`'s report of set `set`.
async fn set_report(lab: &AgentsLab, node: &str, set: &str) -> Value {
    lab.reports()
        .await
        .into_iter()
        .find(|r| r["metadata"]["name"] == node)
        .and_then(|r| {
            r["status"]["sets"]
                .as_array()?
                .iter()
                .find(|s| s["name"] == set)
                .cloned()
        })
        .unwrap_or(Value::Null)
}

/// Agents through the proxy, with the in-cluster cache and the gate for new nodes.
fn gated_with_a_cache() -> AgentsSetup {
    AgentsSetup {
        agent_args: vec![
            "--insecure-registry={proxy}".into(),
            "--cache-port=5050".into(),
            "--cache-dir={lab}/cache-{node}".into(),
            "--gate".into(),
        ],
        ..AgentsSetup::default()
    }
}

/// What `kubectl describe pinboardnode NODE` shows under `Events:`.
fn described_events(lab: &AgentsLab, node: &str) -> String {
    let described = lab.kubectl(&["describe", "pinboardnode", node]);
    described
        .split_once("\nEvents:")
        .map(|(_, events)| events.to_owned())
        .unwrap_or_else(|| panic!("no Events in kubectl describe:\n{described}"))
}

/// The Events, and `kubectl describe` of the objects the docs send an administrator to: n1 serves the
/// in-cluster cache; n2 joins gated while a set that cannot be pulled selects it, so its agent's first
/// Events come before its PinboardNode exists.
#[tokio::test(flavor = "multi_thread")]
async fn events_say_a_failed_pull_and_a_lost_pin_put_back_each_once_as_a_series() {
    let nodes = vec![NodeSpec::new("n1", 200 * MIB)];
    let mut lab = AgentsLab::start_with("agents-events", nodes, None, gated_with_a_cache()).await;
    let proxy = lab.lab.proxy_host();
    let (holder, _) = lab.cache_holder().await;
    assert_eq!(holder, "n1");
    let image = lab
        .lab
        .push_image("events/app", &ImageSpec::small(7800))
        .expect("push")
        .reference(&proxy);
    let api = PinboardApi::new(lab.admin.clone(), NAMESPACE);
    // A set whose image the registry does not have, written as kubectl would (pinboard's own apply
    // refuses it): its pull fails for good, and the agent tries it again every minute.
    let missing = format!("{proxy}/events/gone@sha256:{}", "0".repeat(64));
    api.apply_set(&from_flags("broken", &[missing]))
        .await
        .expect("the set is written");
    lab.lab
        .add_node(NodeSpec::new("n2", 200 * MIB).tainted("pinboard.dev/preloading=:NoSchedule"))
        .expect("n2 joins");
    lab.start_agent("n2");
    let failed = one_series(&lab, "n2", "PullFailed", 2).await;
    // `kubectl describe` matches Events by the object's uid: these name it although they came first.
    let gated = described_events(&lab, "n2");
    assert!(gated.contains("PullFailed"), "{gated}");
    let holding = described_events(&lab, "n1");
    assert!(holding.contains("CacheServing"), "{holding}");
    // `kubectl get pinboardnodes` shows each node's free image space as a person reads it.
    let listed = lab.kubectl(&["get", "pinboardnodes"]);
    let free = |line: &str| line.contains(" MiB") || line.contains(" GiB");
    assert!(
        listed.starts_with("NAME") && listed.lines().skip(1).all(free),
        "{listed}"
    );
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(
        failed.note.as_deref().is_some_and(|n| n.contains("broken")),
        "{failed:?}"
    );
    assert_eq!(
        failed.related.as_ref().and_then(|r| r.name.as_deref()),
        Some("broken"),
        "the Event names the PinSet"
    );
    api.delete_set("broken").await.unwrap();

    // A pin cleared twice: lost, then put back; each kind of Event once, as a series.
    api.apply_set(&from_flags("web", std::slice::from_ref(&image)))
        .await
        .unwrap();
    let (code, _, stderr) = lab.check(&[
        "--insecure-registry",
        &proxy,
        "--set",
        "web",
        "--wait",
        "--timeout",
        "60s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    for round in 1..=2 {
        lab.lab
            .node("n1")
            .clear_label(&image, "io.cri-containerd.pinned");
        wait_for(&format!("restore {round}"), WAIT, || async {
            let report = set_report(&lab, "n1", "web").await;
            let restored =
                report["restores"]["count"].as_u64() == Some(round) && report["state"] == "pinned";
            restored.then_some(()).ok_or(report.to_string())
        })
        .await;
    }
    let restored = one_series(&lab, "n1", "Restored", 2).await;
    assert_eq!(restored.type_.as_deref(), Some("Normal"));
    let lost = one_series(&lab, "n1", "ImageLost", 2).await;
    assert!(
        lost.note
            .as_deref()
            .is_some_and(|n| n.contains("present but not pinned")),
        "{lost:?}"
    );
    let pinned = events(&lab, "n1", "Pinned").await;
    assert_eq!(pinned.len(), 1, "{pinned:#?}");
    // The aggregating agent's news of the set as a whole: `kubectl describe pinset web` shows it.
    let ready = events_about(&lab, "PinSet", "web", "Ready").await;
    assert_eq!(ready.len(), 1, "{ready:#?}");
    let restoring = events_about(&lab, "PinSet", "web", "NodesRestoring").await;
    assert_eq!(
        restoring.len(),
        1,
        "one Event, its repeats in its series: {restoring:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_agents_during_a_rollout_and_agrees_with_their_reports() {
    let nodes = ["n1", "n2"];
    let mut lab = lab("agents-prometheus", &nodes).await;
    let proxy = lab.lab.proxy_host();
    // The lab's nodes share its network namespace: each agent gets a port of its own.
    let lab_ip = lab.lab.network().expect("a cluster lab").lab_ip();
    let mut targets = Vec::new();
    for node in nodes {
        let port = support::free_port().unwrap().to_string();
        lab.stop_agent(node);
        lab.start_agent_with(node, &["--metrics-port", &port]);
        targets.push(format!("{lab_ip}:{port}"));
    }
    let prometheus = Prometheus::start(&lab.lab.dir().join("prometheus"), &targets).unwrap();
    let images: Vec<String> = (0..3)
        .map(|i| {
            let spec = ImageSpec::gzip_layers(7810 + i, &[2 * MIB as usize]);
            lab.lab
                .push_image(&format!("metrics/app{i}"), &spec)
                .expect("push")
                .reference(&proxy)
        })
        .collect();
    // Slow enough that Prometheus scrapes the rollout while it runs.
    lab.lab.proxy().set_bandwidth(Some(MIB));
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    let set = lab.set_file("web", &refs, "");
    let run = lab.apply(&set, "120s", &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let by_node = |samples: Vec<support::prometheus::Sample>| -> BTreeMap<String, f64> {
        samples
            .into_iter()
            .map(|(labels, value)| (labels["node"].clone(), value))
            .collect()
    };
    // What Prometheus has, once it scraped the agents after they pinned.
    let pinned = wait_for("Prometheus sees web pinned on both", WAIT, || async {
        let seen = by_node(
            prometheus
                .query(r#"pinboard_set_phase{set="web",phase="pinned"}"#)
                .map_err(|e| e.to_string())?,
        );
        (seen.values().filter(|v| **v == 1.0).count() == 2)
            .then_some(seen.clone())
            .ok_or(format!("{seen:?}"))
    })
    .await;
    assert_eq!(pinned.len(), 2);
    let pulling = by_node(
        prometheus
            .query(r#"max_over_time(pinboard_set_phase{set="web",phase="pulling"}[5m])"#)
            .unwrap(),
    );
    assert_eq!(
        pulling.values().filter(|v| **v == 1.0).count(),
        2,
        "the rollout was scraped while it ran: {pulling:?}"
    );
    // Bytes counted as they arrive: the counter rose while the set was still pulling, not in one jump at
    // its end.
    let rising = by_node(
        prometheus
            .query(
                r#"max_over_time((rate(pinboard_pulled_bytes_total{set="web"}[5s]) > 0
                   and on (node, set) pinboard_set_phase{set="web",phase="pulling"} == 1)[5m:1s])"#,
            )
            .unwrap(),
    );
    assert_eq!(
        rising.len(),
        2,
        "rate(pinboard_pulled_bytes_total) above 0 while pulling, on both nodes: {rising:?}"
    );
    let images_pinned = by_node(
        prometheus
            .query(r#"pinboard_set_images{set="web",state="pinned"}"#)
            .unwrap(),
    );
    let bytes = by_node(
        prometheus
            .query(r#"pinboard_pulled_bytes_total{set="web"}"#)
            .unwrap(),
    );
    for node in nodes {
        let report = set_report(&lab, node, "web").await;
        assert_eq!(images_pinned[node], 3.0, "{node}: {images_pinned:?}");
        assert_eq!(
            bytes[node],
            report["outcome"]["fetchedBytes"].as_f64().unwrap(),
            "{node}: Prometheus' bytes are the report's: {report}"
        );
    }
    let floors = by_node(prometheus.query("pinboard_min_free_bytes").unwrap());
    assert_eq!(floors.len(), 2, "{floors:?}");
    let heartbeats = prometheus
        .query("time() - pinboard_heartbeat_last_success_timestamp_seconds < 30")
        .unwrap();
    assert_eq!(heartbeats.len(), 2, "both agents renew: {heartbeats:?}");
}

/// The gate, with a real kubelet and scheduler: a node that registers with `pinboard.dev/preloading`
/// (`--register-with-taints`) joins a cluster whose fan-out set selects it; a pod that needs the set's
/// image (`imagePullPolicy: Never`, so the kubelet may not pull it) stays Pending while the node's agent
/// pre-loads through the in-cluster cache; once the agent has pinned the set it lifts the taint, and the
/// pod is scheduled there and runs. The registry link carried nothing for the new node: its bytes came
/// from the cache.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_node_takes_no_pod_until_its_agent_has_pinned_the_sets_then_the_pod_runs_without_a_pull()
 {
    let nodes = ["n1", "n2"]
        .iter()
        .map(|n| NodeSpec::new(n, 200 * MIB))
        .collect();
    let mut lab = AgentsLab::start_with("agents-gate", nodes, None, gated_with_a_cache()).await;
    let proxy = lab.lab.proxy_host();
    // A runnable image (busybox), through the counting proxy.
    let image = lab
        .lab
        .push_binary_image(std::path::Path::new("/bin/busybox"), "gate/busybox")
        .expect("push busybox")
        .replace(&lab.lab.registry_host(), &proxy);
    lab.cache_holder().await;
    let set = lab.set_file("web", &[&image], "");
    let run = lab.apply(&set, "120s", &["--fan-out"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // n3 joins with the startup taint; its agent starts as its DaemonSet's pod would, the link slowed.
    let before = lab.lab.proxy().bytes_down();
    lab.lab.proxy().set_bandwidth(Some(MIB / 2));
    lab.lab
        .add_node(NodeSpec::new("n3", 200 * MIB).tainted("pinboard.dev/preloading=:NoSchedule"))
        .expect("n3 joins");
    let pods: Api<Pod> = Api::namespaced(lab.admin.clone(), "default");
    pods.create(&PostParams::default(), &app_pod(&image))
        .await
        .expect("the pod");
    lab.start_agent("n3");
    // Pending while the agent pre-loads: not scheduled, the taint named by the scheduler.
    let pending = wait_for("app Pending, held off n3 by the taint", WAIT, || async {
        let pod = pods.get("app").await.map_err(|e| e.to_string())?;
        let unscheduled = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none();
        let why = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        (unscheduled && why.contains("pinboard.dev/preloading"))
            .then_some(why.clone())
            .ok_or(why)
    })
    .await;
    eprintln!("while n3 pre-loads: {pending}");
    wait_for("n3's gate lifted", WAIT, || async {
        let node = Api::<Node>::all(lab.admin.clone())
            .get("n3")
            .await
            .map_err(|e| e.to_string())?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        let gated = taints.iter().any(|t| t.key == "pinboard.dev/preloading");
        let pod = pods.get("app").await.map_err(|e| e.to_string())?;
        let scheduled = pod.spec.and_then(|s| s.node_name);
        match (gated, scheduled) {
            (true, Some(node)) => panic!("app was scheduled on {node} while n3 was gated"),
            (false, _) => Ok(()),
            (true, None) => Err("still gated".to_string()),
        }
    })
    .await;
    let report = set_report(&lab, "n3", "web").await;
    assert_eq!(
        report["state"], "pinned",
        "the gate lifts only once pinned: {report}"
    );
    let running = wait_for_pod(&lab.admin, "default", "app", PodState::Running).await;
    assert_eq!(
        running.spec.and_then(|s| s.node_name).as_deref(),
        Some("n3")
    );
    let lifted_event = events(&lab, "n3", "GateLifted").await;
    assert_eq!(lifted_event.len(), 1, "{lifted_event:#?}");
    // The link: nothing for n3 (its agent pulled through the cache, which had every blob), and the pod pulled
    // nothing (imagePullPolicy: Never, and it runs).
    let moved = lab.lab.proxy().bytes_down() - before;
    eprintln!("the link carried {moved} bytes while n3 joined");
    assert!(moved < 64 * 1024, "the link carried {moved} bytes for n3");
    assert!(
        report["fanOut"]["cache"].is_string(),
        "n3 pulled through the cache: {report}"
    );
}

/// A pod for node n3 that runs the set's `image` only if it is on the node already.
fn app_pod(image: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "n3"},
            // The lab's pod network is not up (its Nodes stay NotReady): the host's network, and the
            // lifecycle controller's own taints tolerated, but not the gate's.
            "hostNetwork": true,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
            ],
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{
                "name": "app",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/busybox", "sleep", "3600"],
            }],
        },
    }))
    .expect("a pod")
}

//! Agents an operations team can leave running: what `kubectl get events` and a real Prometheus (Debian's
//! package) learn of them. Real kubelets, containerd nodes and the registry behind the counting proxy.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use pinboard::backend::pinboard_api::PinboardApi;
use pinboard::model::set::from_flags;
use serde_json::Value;
use support::agents::{AgentsLab, NAMESPACE};
use support::kube_objects::wait_for;
use support::prometheus::Prometheus;
use support::{ImageSpec, NodeSpec, RegistrySetup};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(150);

async fn lab(name: &str, nodes: &[&str]) -> AgentsLab {
    let nodes = nodes.iter().map(|n| NodeSpec::new(n, 200 * MIB)).collect();
    AgentsLab::start_with(
        name,
        nodes,
        None,
        vec!["--insecure-registry={proxy}".into()],
        RegistrySetup::default(),
    )
    .await
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

#[tokio::test(flavor = "multi_thread")]
async fn events_say_a_failed_pull_and_a_lost_pin_put_back_each_once_as_a_series() {
    let lab = lab("agents-events", &["n1"]).await;
    let proxy = lab.lab.proxy_host();
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
    let failed = one_series(&lab, "n1", "PullFailed", 2).await;
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
    let run = lab.pinboard(&[
        "apply",
        "--insecure-registry",
        &proxy,
        "--set",
        set.to_str().unwrap(),
        "--timeout",
        "120s",
    ]);
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

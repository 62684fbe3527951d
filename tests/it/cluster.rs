//! Cluster mode against the lab's real etcd + kube-apiserver, with the machine-config CRDs from
//! tests/fixtures/crds. No kubelet and no machine-config daemon run: the tests write Node objects and
//! MachineConfigNode status the way they would, step by step, and check that pinboard's watched view
//! converges on what an administrator should see, also after the API server was down and the data changed
//! meanwhile.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use pinboard::backend::openshift::{Cluster, ClusterError, Watch, watch};
use pinboard::model::machine_config::{
    ClusterView, Connection, Kind, REQUEUE_TIMEOUT, ROLE_LABEL, SetProgress, pool_rollup,
    pool_warning, pools_for_set,
};
use pinboard::model::readiness::SetState;
use pinboard::model::set::{ImageSet, from_flags};
use serde_json::{Value, json};
use support::cluster::{
    WAIT, Writer, apply_crd, client, digest, discover, install_crds, kubeconfig_with_viewer, lab,
    openshift, read_crd,
};

/// Reads updates into `view` until `done` holds; panics with the view after [`WAIT`].
async fn until(
    watch: &mut Watch,
    view: &mut ClusterView,
    what: &str,
    done: impl Fn(&ClusterView) -> bool,
) {
    until_within(WAIT, watch, view, what, done).await;
}

/// [`until`], waiting up to `wait`.
async fn until_within(
    wait: Duration,
    watch: &mut Watch,
    view: &mut ClusterView,
    what: &str,
    done: impl Fn(&ClusterView) -> bool,
) {
    let deadline = tokio::time::Instant::now() + wait;
    while !done(view) {
        match tokio::time::timeout_at(deadline, watch.updates.recv()).await {
            Ok(Some(update)) => view.apply(update),
            Ok(None) => panic!("the watchers stopped before: {what}"),
            Err(_) => panic!("timed out waiting for: {what}\n{view:#?}"),
        }
    }
}

fn worker_set(name: &str, images: &[String]) -> ImageSet {
    let mut set = from_flags(name, images);
    set.labels = BTreeMap::from([(ROLE_LABEL.to_owned(), "worker".to_owned())]);
    set
}

fn states(view: &ClusterView, set: &str) -> Vec<(String, SetProgress)> {
    view.rollout(set, SystemTime::now())
}

fn words(view: &ClusterView, set: &str) -> Vec<String> {
    states(view, set)
        .iter()
        .map(|(node, state)| format!("{node}={}", SetState::from(state).word()))
        .collect()
}

#[tokio::test]
async fn discovery_watch_and_a_rollout_played_by_the_daemon() {
    let lab = lab("cluster-rollout");
    let admin = client(lab.apiserver().unwrap().kubeconfig(), None).await;

    // Before the CRDs, the lab is plain Kubernetes.
    let plain = Cluster::discover(admin.clone())
        .await
        .err()
        .expect("no machine-config API yet");
    assert!(matches!(plain, ClusterError::NotOpenShift), "{plain}");
    let message = plain.to_string();
    assert!(
        message.contains("plain Kubernetes") && message.contains("--cri"),
        "{message}"
    );

    install_crds(&admin).await;
    let cluster = discover(&admin).await;
    assert_eq!(cluster.resources().pinned_image_set.version, "v1");
    let writer = Writer {
        cluster: cluster.clone(),
    };
    writer.pool("worker").await;
    writer.pool("master").await;
    for node in ["n1", "n2", "n3"] {
        writer.worker(node).await;
    }

    let store = json!({"additionalLayerStores": [{"path": "/var/lib/stargz-store/store:ref"}]});
    let crc = json!({"spec": {"machineConfigPoolSelector": {"matchLabels": {"custom-crio": "lazy"}},
                              "containerRuntimeConfig": store}});
    let resource = &cluster.resources().runtime_config;
    writer.apply(resource, "lazy", crc).await;

    let mut watch = watch(&cluster);
    let mut view = ClusterView::default();
    until(
        &mut watch,
        &mut view,
        "every watch synced with 3 nodes",
        |v| {
            v.connection() == Connection::Synced
                && v.nodes().len() == 3
                && v.runtime_configs.len() == 1
                && v.machine_config_nodes().len() == 3
        },
    )
    .await;
    assert_eq!(view.pools.len(), 2);
    let lazy = &view.runtime_configs[0].spec.container_runtime_config;
    assert_eq!(
        lazy.additional_layer_stores[0].path,
        "/var/lib/stargz-store/store:ref"
    );
    let n1 = view.nodes().iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(
        (n1.ready, n1.allocatable_ephemeral),
        (Some(true), Some(100 << 30))
    );
    assert_eq!(
        n1.presence(
            &format!("quay.io/pinboard/n1@sha256:{}", "a".repeat(64)),
            50
        ),
        pinboard::model::machine_config::Presence::Present
    );

    // Apply: the set lands in the worker pool only.
    let images = [digest(1), digest(2)];
    let set = worker_set("upgrade", &images);
    assert_eq!(pools_for_set(&set.labels, &view.pools), ["worker"]);
    assert_eq!(
        pool_warning(&set.name, &pools_for_set(&set.labels, &view.pools)),
        None
    );
    let stored = cluster.apply_set(&set).await.unwrap();
    assert_eq!(stored.images().collect::<Vec<_>>(), images);
    assert_eq!(stored.generation(), 1);
    until(
        &mut watch,
        &mut view,
        "the set, not yet seen by any node",
        |v| words(v, "upgrade") == ["n1=waiting", "n2=waiting", "n3=waiting"],
    )
    .await;

    // The daemon: n1 prefetching, n2 failing, n3 slow (the 5-minute window ended; it carries on).
    let entry = |current: Option<i64>, failed: Option<&str>| {
        let mut entry = json!({"name": "upgrade", "desiredGeneration": 1});
        if let Some(current) = current {
            entry["currentGeneration"] = json!(current);
        }
        if let Some(error) = failed {
            entry["lastFailedGeneration"] = json!(1);
            entry["lastFailedGenerationError"] = json!(error);
        }
        entry
    };
    let degraded =
        "One or more PinnedImageSet is experiencing an error, see MachineConfigNode status";
    let requeue = format!("{REQUEUE_TIMEOUT}: 1 of 2 images left");
    writer.daemon("n1", entry(None, None), true, None).await;
    writer
        .daemon(
            "n2",
            entry(None, Some("exit status 125: no space left on device")),
            false,
            Some(degraded),
        )
        .await;
    writer
        .daemon("n3", entry(None, Some(&requeue)), true, Some(degraded))
        .await;
    until(&mut watch, &mut view, "pulling, failed, slow", |v| {
        words(v, "upgrade") == ["n1=pulling", "n2=failed", "n3=slow"]
    })
    .await;
    let rows = states(&view, "upgrade");
    assert!(
        matches!(&rows[0].1, SetProgress::Progressing { elapsed: Some(_) }),
        "{rows:?}"
    );
    assert_eq!(
        rows[1].1,
        SetProgress::Failed {
            generation: 1,
            error: "exit status 125: no space left on device".into()
        }
    );
    assert!(
        matches!(&rows[2].1, SetProgress::SlowButWorking { elapsed: Some(_), message } if *message == requeue),
        "{rows:?}"
    );

    // A node joins mid-rollout.
    writer.worker("n4").await;
    until(&mut watch, &mut view, "n4 appears, waiting", |v| {
        v.nodes().len() == 4 && words(v, "upgrade").contains(&"n4=waiting".to_owned())
    })
    .await;

    // Every node finishes; the pool rolls up.
    for node in ["n1", "n2", "n3", "n4"] {
        writer.daemon(node, entry(Some(1), None), false, None).await;
    }
    writer.pool_status("worker", 4, 4).await;
    until(&mut watch, &mut view, "every node done, pool 4/4", |v| {
        let worker = v.pools.iter().find(|p| p.name() == "worker");
        states(v, "upgrade")
            .iter()
            .all(|(_, s)| *s == SetProgress::Done)
            && v.rollout("upgrade", SystemTime::now()).len() == 4
            && worker.and_then(pool_rollup) == Some((4, 4))
    })
    .await;

    // Edit: a new generation, which no node has seen yet.
    let stored = cluster
        .apply_set(&worker_set("upgrade", &[digest(1), digest(2), digest(3)]))
        .await
        .unwrap();
    assert_eq!(stored.generation(), 2);
    until(
        &mut watch,
        &mut view,
        "generation 2 waiting everywhere",
        |v| {
            v.set("upgrade").is_some_and(|s| s.images().count() == 3)
                && states(v, "upgrade")
                    .iter()
                    .all(|(_, s)| *s == SetProgress::Waiting)
        },
    )
    .await;

    // A set no pool selects: warned about before applying.
    let mut stray = worker_set("stray", &[digest(4)]);
    stray.labels = BTreeMap::from([(ROLE_LABEL.to_owned(), "infra".to_owned())]);
    let warning = pool_warning(&stray.name, &pools_for_set(&stray.labels, &view.pools)).unwrap();
    assert!(
        warning.contains("matches no MachineConfigPool"),
        "{warning}"
    );

    // Delete.
    cluster.delete_set("upgrade").await.unwrap();
    until(&mut watch, &mut view, "the set gone", |v| {
        v.set("upgrade").is_none()
    })
    .await;
    let again = cluster.delete_set("upgrade").await.unwrap_err();
    assert!(matches!(again, ClusterError::NoSuchSet(_)), "{again}");
    let invalid = cluster
        .apply_set(&worker_set("bad", &["quay.io/x:latest".to_owned()]))
        .await
        .unwrap_err();
    assert!(matches!(invalid, ClusterError::Invalid { .. }), "{invalid}");
}

#[tokio::test]
async fn viewers_are_read_only_and_v1alpha1_clusters_still_work() {
    let lab = lab("cluster-viewer");
    let kubeconfig = kubeconfig_with_viewer(&lab);
    let admin = client(&kubeconfig, Some("lab")).await;
    install_crds(&admin).await;
    discover(&admin).await;

    let viewer = discover(&client(&kubeconfig, Some("viewer")).await).await;
    let mut viewer_watch = watch(&viewer);
    let mut view = ClusterView::default();
    until(&mut viewer_watch, &mut view, "the viewer's watches refused", |v| {
        matches!(v.connections.get(&Kind::PinnedImageSet), Some(Connection::Reconnecting { error, .. }) if error.contains("forbidden"))
    })
    .await;
    assert!(
        view.connection()
            .to_string()
            .starts_with("reconnecting since "),
        "{}",
        view.connection()
    );

    // Grant read access: every watch recovers on its next retry, and says so.
    let rules = json!([
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["machineconfiguration.openshift.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
    ]);
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": "pinboard-viewer"}, "rules": rules}))
            .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "pinboard-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pinboard-viewer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}],
    }))
    .unwrap();
    let pp = PostParams::default();
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await
        .unwrap();
    until(&mut viewer_watch, &mut view, "every watch synced", |v| {
        v.connection() == Connection::Synced
    })
    .await;

    // An older cluster: PinnedImageSet served only as v1alpha1. Discovery falls back, and pinboard
    // applies and watches sets there.
    let mut alpha = read_crd("pinnedimagesets.yaml");
    alpha["spec"]["versions"][0]["served"] = json!(false);
    apply_crd(&admin, &alpha).await;
    let deadline = Instant::now() + WAIT;
    let old = loop {
        let cluster = discover(&admin).await;
        if cluster.resources().pinned_image_set.version == "v1alpha1" {
            break cluster;
        }
        assert!(
            Instant::now() < deadline,
            "discovery never fell back to v1alpha1"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stored = old
        .apply_set(&worker_set("legacy", &[digest(5)]))
        .await
        .unwrap();
    assert_eq!(stored.images().collect::<Vec<_>>(), [digest(5)]);
    let mut old_watch = watch(&old);
    let mut old_view = ClusterView::default();
    until(
        &mut old_watch,
        &mut old_view,
        "the v1alpha1 set watched",
        |v| v.connection() == Connection::Synced && v.set("legacy").is_some(),
    )
    .await;

    // Reading is not writing.
    for result in [
        viewer
            .apply_set(&worker_set("upgrade", &[digest(1)]))
            .await
            .map(|_| ()),
        viewer.delete_set("upgrade").await,
    ] {
        let error = result.unwrap_err();
        assert!(matches!(error, ClusterError::ReadOnly { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.starts_with("read-only: your account may not")
                && message.contains("pinboard-operator"),
            "{message}"
        );
    }
}

/// etcd's v3 JSON gateway, to change what the API server stores while it is down. Keys and values travel
/// base64-encoded; custom resources are stored as JSON, Nodes as protobuf.
struct Etcd {
    url: String,
    agent: ureq::Agent,
}

impl Etcd {
    fn call(&self, method: &str, body: Value) -> Value {
        let url = format!("{}/v3/kv/{method}", self.url);
        let mut response = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let text = response.body_mut().read_to_string().unwrap();
        assert_eq!(response.status(), 200, "{url}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The keys under `prefix`.
    fn keys(&self, prefix: &str) -> Vec<String> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let found = self.call(
            "range",
            json!({"key": BASE64.encode(prefix), "range_end": BASE64.encode(end), "keys_only": true}),
        );
        let kvs = found["kvs"].as_array().cloned().unwrap_or_default();
        kvs.iter()
            .map(|kv| String::from_utf8(decode(&kv["key"])).unwrap())
            .collect()
    }

    fn get_json(&self, key: &str) -> Value {
        let found = self.call("range", json!({"key": BASE64.encode(key)}));
        serde_json::from_slice(&decode(&found["kvs"][0]["value"])).unwrap()
    }

    fn put_json(&self, key: &str, value: &Value) {
        let value = BASE64.encode(value.to_string());
        self.call("put", json!({"key": BASE64.encode(key), "value": value}));
    }

    fn delete(&self, key: &str) {
        let deleted = self.call("deleterange", json!({"key": BASE64.encode(key)}));
        assert_eq!(deleted["deleted"], "1", "{key}: {deleted}");
    }
}

fn decode(value: &Value) -> Vec<u8> {
    BASE64.decode(value.as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_mid_watch_resyncs_without_stale_rows() {
    let lab = lab("cluster-restart");
    let apiserver = lab.apiserver().unwrap();
    let (_, writer) = openshift(&lab, &["worker"], &[]).await;
    let cluster = writer.cluster.clone();
    cluster
        .apply_set(&worker_set("upgrade", &[digest(1)]))
        .await
        .unwrap();
    for node in ["n1", "n2", "n3"] {
        writer.worker(node).await;
        let entry = json!({"name": "upgrade", "desiredGeneration": 1});
        writer.daemon(node, entry, true, None).await;
    }
    let mut watch = watch(&cluster);
    let mut view = ClusterView::default();
    until(&mut watch, &mut view, "synced, every node pulling", |v| {
        v.connection() == Connection::Synced
            && words(v, "upgrade") == ["n1=pulling", "n2=pulling", "n3=pulling"]
    })
    .await;

    apiserver.stop();
    until(&mut watch, &mut view, "the outage shown", |v| {
        matches!(v.connection(), Connection::Reconnecting { .. })
    })
    .await;

    // Meanwhile, seen by no watch: n3 leaves the cluster and n2 finishes.
    let etcd = Etcd {
        url: apiserver.etcd_url(),
        agent: support::http::agent(),
    };
    let mcns = "/registry/machineconfiguration.openshift.io/machineconfignodes/";
    assert_eq!(
        etcd.keys(mcns),
        ["n1", "n2", "n3"].map(|n| format!("{mcns}{n}"))
    );
    assert!(
        etcd.keys("/registry/minions/")
            .contains(&"/registry/minions/n3".to_owned())
    );
    etcd.delete(&format!("{mcns}n3"));
    etcd.delete("/registry/minions/n3");
    let n2 = format!("{mcns}n2");
    let mut done = etcd.get_json(&n2);
    done["status"]["pinnedImageSets"][0]["currentGeneration"] = json!(1);
    let conditions = done["status"]["conditions"].as_array_mut().unwrap();
    for condition in conditions {
        condition["status"] = json!("False");
    }
    etcd.put_json(&n2, &done);

    apiserver
        .start_again()
        .expect("the API server starts again");
    // The watches retry 1 s, 2 s, 4 s… apart, so a few tens of seconds after the outage at most.
    until_within(
        Duration::from_secs(90),
        &mut watch,
        &mut view,
        "resynced: n3 gone, n2 done",
        |v| {
            v.connection() == Connection::Synced
                && v.nodes().len() == 2
                && words(v, "upgrade") == ["n1=pulling", "n2=done"]
        },
    )
    .await;
    let names: Vec<&str> = view.nodes().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n1", "n2"]);
    let mcn_names: Vec<&str> = view
        .machine_config_nodes()
        .iter()
        .map(|m| m.node_name())
        .collect();
    assert_eq!(mcn_names, ["n1", "n2"]);
    assert_eq!(view.pools.len(), 1);
    assert_eq!(
        view.set("upgrade").map(|s| s.images().collect::<Vec<_>>()),
        Some(vec![digest(1).as_str()])
    );
}

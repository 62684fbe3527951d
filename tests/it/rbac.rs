//! deploy/rbac.yaml against the lab's real kube-apiserver (RBAC authorization on): the CRDs from
//! tests/fixtures/crds are installed, the file's ClusterRoles and its Role applied as the admin, and each
//! role bound in turn to the lab's `viewer` user (the lab has only the admin and viewer tokens).
//!
//! - `pinboard-viewer`: pinboard's watches all reach Synced; applying or deleting a PinnedImageSet fails
//!   with the read-only error naming `pinboard-operator`; `get nodes/proxy` (kubelet stats) is allowed and
//!   the proxied request fails for want of a kubelet, not with 403; nothing else is granted.
//! - `pinboard-operator`: pinboard applies (creating) and deletes sets; it still may not patch a
//!   MachineConfigPool or a Node (403 from the API server).
//! - `pinboard-pull-secret` (a Role in openshift-config): pinboard reads the cluster's pull secret with it,
//!   is refused without it, and it grants `get` on that one Secret and nothing else.
//!
//! Every grant is also checked with SelfSubjectAccessReviews, both what each role may do and a list of
//! what it must not.

use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use pinboard::backend::openshift::pull_secret::PullSecret;
use pinboard::backend::openshift::{ClusterError, watch};
use pinboard::model::machine_config::{ClusterView, Connection, ROLE_LABEL};
use pinboard::model::set::{ImageSet, from_flags};
use serde_json::{Value, json};
use support::cluster::{
    WAIT, allowed, apply_rbac, bind_viewer, client, discover, eventually, install_crds,
    kubeconfig_with_viewer, pull_secret, rbac_documents,
};
use support::{Lab, LabConfig};

const MANAGER: &str = "pinboard-rbac-test";
const GROUP: &str = "machineconfiguration.openshift.io";
const PULL_SECRET_ROLE: &str = "pinboard-pull-secret";

/// The example bindings at the end of deploy/rbac.yaml, uncommented.
fn example_bindings() -> Vec<Value> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml")).unwrap();
    let (_, examples) = text.split_once("# Example bindings").unwrap();
    let uncommented: String = examples
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or("")))
        .collect();
    let documents: Vec<Option<Value>> = serde_saphyr::from_multiple(&uncommented).unwrap();
    documents.into_iter().flatten().collect()
}

/// `(verb, group, resource)` the role grants.
type Access = (&'static str, &'static str, &'static str);

const READ: [&str; 3] = ["get", "list", "watch"];
const WRITE: [&str; 5] = ["create", "patch", "update", "delete", "deletecollection"];
const MACHINE_CONFIG: [&str; 4] = [
    "pinnedimagesets",
    "machineconfigpools",
    "machineconfignodes",
    "containerruntimeconfigs",
];

/// Every access either role might plausibly be given, and some it must never have.
fn probes() -> Vec<Access> {
    let mut probes = Vec::new();
    for verb in READ.iter().chain(&WRITE) {
        probes.push((*verb, "", "nodes"));
        probes.push((*verb, "", "nodes/proxy"));
        probes.push((*verb, "", "nodes/status"));
        for resource in MACHINE_CONFIG {
            probes.push((*verb, GROUP, resource));
        }
        probes.push((*verb, GROUP, "machineconfignodes/status"));
        probes.push((*verb, GROUP, "machineconfigpools/status"));
        probes.push((*verb, GROUP, "machineconfigs"));
        probes.push((*verb, "", "secrets"));
        probes.push((*verb, "", "pods"));
        probes.push((*verb, "rbac.authorization.k8s.io", "clusterrolebindings"));
        for (group, resource) in MIRROR_SETS {
            probes.push((*verb, group, resource));
        }
    }
    probes
}

/// The cluster's digest mirrors, which pinboard's registry reads follow: (group, resource).
const MIRROR_SETS: [(&str, &str); 2] = [
    ("config.openshift.io", "imagedigestmirrorsets"),
    ("operator.openshift.io", "imagecontentsourcepolicies"),
];

fn viewer_grants() -> Vec<Access> {
    let mut grants = vec![("get", "", "nodes/proxy")];
    for verb in READ {
        grants.push((verb, "", "nodes"));
        grants.extend(MACHINE_CONFIG.map(|resource| (verb, GROUP, resource)));
    }
    for verb in ["get", "list"] {
        grants.extend(MIRROR_SETS.map(|(group, resource)| (verb, group, resource)));
    }
    grants
}

fn operator_grants() -> Vec<Access> {
    let mut grants = viewer_grants();
    for verb in ["create", "patch", "update", "delete"] {
        grants.push((verb, GROUP, "pinnedimagesets"));
        grants.push((verb, GROUP, "containerruntimeconfigs"));
    }
    grants
}

/// Checks every probe against `grants`, waiting first until the newest binding is in force.
async fn assert_exactly(client: &kube::Client, role: &str, grants: &[Access]) {
    let (verb, group, resource) = *grants.last().unwrap();
    eventually(&format!("{role} in force"), || async {
        allowed(client, verb, group, resource, None, None)
            .await
            .then_some(())
    })
    .await;
    let mut wrong = Vec::new();
    for probe @ (verb, group, resource) in probes() {
        let expected = grants.contains(&probe);
        if allowed(client, verb, group, resource, None, None).await != expected {
            wrong.push(format!("{verb} {group}/{resource}: expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{role}:\n{}", wrong.join("\n"));
}

fn worker_set(name: &str) -> ImageSet {
    let reference = format!("quay.io/openshift/release@sha256:{}", "a".repeat(64));
    let mut set = from_flags(name, &[reference]);
    set.labels = BTreeMap::from([(ROLE_LABEL.to_owned(), "worker".to_owned())]);
    set
}

fn is_forbidden(result: Result<impl std::fmt::Debug, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[test]
fn the_file_parses_and_its_examples_bind_the_roles() {
    let documents = rbac_documents();
    let kinds: Vec<_> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ClusterRole", "ClusterRole", "Role"]);
    let roles: Vec<ClusterRole> = documents[..2]
        .iter()
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .collect();
    let names: Vec<_> = roles
        .iter()
        .map(|r| r.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["pinboard-viewer", "pinboard-operator"]);
    for role in &roles {
        for rule in role.rules.as_deref().unwrap() {
            assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
            for list in [&rule.api_groups, &rule.resources] {
                assert!(!list.as_ref().unwrap().iter().any(|s| s == "*"), "{rule:?}");
            }
            assert!(!rule.verbs.iter().any(|v| v == "*"), "{rule:?}");
        }
    }
    // The optional Role: `get` on the one Secret, in its namespace, nothing else.
    let role: Role = serde_json::from_value(documents[2].clone()).unwrap();
    assert_eq!(
        (
            role.metadata.name.as_deref(),
            role.metadata.namespace.as_deref()
        ),
        (Some(PULL_SECRET_ROLE), Some("openshift-config"))
    );
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_string()][..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["pull-secret".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["get"]);

    let bindings = example_bindings();
    let bound: Vec<_> = bindings
        .iter()
        .map(|b| {
            (
                b["kind"].as_str().unwrap(),
                b["roleRef"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bound,
        [
            ("ClusterRoleBinding", "pinboard-viewer"),
            ("ClusterRoleBinding", "pinboard-operator"),
            ("RoleBinding", PULL_SECRET_ROLE)
        ]
    );
    let subjects: Vec<_> = bindings
        .iter()
        .map(|b| b["subjects"][0]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["User", "ServiceAccount", "User"]);
    let _: Vec<ClusterRoleBinding> = bindings[..2]
        .iter()
        .map(|b| serde_json::from_value(b.clone()).unwrap())
        .collect();
    assert_eq!(bindings[2]["metadata"]["namespace"], "openshift-config");
}

#[tokio::test]
async fn viewer_reads_and_operator_writes_only_sets_and_runtime_configs() {
    pinboard::install_crypto_provider();
    let lab = Lab::start(
        "rbac",
        LabConfig {
            nodes: Vec::new(),
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start");
    let kubeconfig = kubeconfig_with_viewer(&lab);
    let admin = client(&kubeconfig, Some("lab")).await;
    install_crds(&admin).await;
    let admin_cluster = discover(&admin).await;

    // The roles, as an administrator applies the file.
    apply_rbac(&admin).await;
    let params = PatchParams::apply(MANAGER).force();

    // Something to read and to be refused on: a pool, a node.
    let pools: Api<DynamicObject> = Api::all_with(admin.clone(), &admin_cluster.resources().pool);
    let pool = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "MachineConfigPool",
        "metadata": {"name": "worker"}, "spec": {"machineConfigSelector": {"matchLabels": {ROLE_LABEL: "worker"}}}});
    pools
        .patch("worker", &params, &Patch::Apply(&pool))
        .await
        .unwrap();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "worker-0"}})).unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // pinboard-viewer.
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bind_viewer(&admin, "pinboard-viewer", None).await;
    let viewer = client(&kubeconfig, Some("viewer")).await;
    assert_exactly(&viewer, "pinboard-viewer", &viewer_grants()).await;
    let viewer_cluster = discover(&viewer).await;
    let mut viewer_watch = watch(&viewer_cluster);
    let mut view = ClusterView::default();
    let deadline = tokio::time::Instant::now() + WAIT;
    while view.connection() != Connection::Synced || view.pools.is_empty() {
        match tokio::time::timeout_at(deadline, viewer_watch.updates.recv()).await {
            Ok(Some(update)) => view.apply(update),
            other => panic!("the viewer's watches never synced ({other:?}):\n{view:#?}"),
        }
    }
    drop(viewer_watch);
    for result in [
        viewer_cluster
            .apply_set(&worker_set("refused"))
            .await
            .map(|_| ()),
        viewer_cluster.delete_set("refused").await,
    ] {
        let error = result.unwrap_err();
        assert!(matches!(error, ClusterError::ReadOnly { .. }), "{error}");
        assert!(error.to_string().contains("pinboard-operator"), "{error}");
    }

    // Kubelet stats through the API server's node proxy: authorized, but this lab has no kubelet.
    let url = lab.apiserver().unwrap().url();
    let stats = format!("{url}/api/v1/nodes/worker-0/proxy/stats/summary");
    let token = lab.apiserver().unwrap().viewer_token().to_owned();
    let status = tokio::task::spawn_blocking(move || {
        let response = support::http::agent()
            .get(&stats)
            .header("Authorization", format!("Bearer {token}"))
            .call()
            .unwrap();
        response.status().as_u16()
    })
    .await
    .unwrap();
    assert!(status != 403 && status != 401 && status >= 400, "{status}");

    // The cluster's pull secret: refused to the viewer, then readable with pinboard-pull-secret bound, and
    // exactly that one Secret.
    pull_secret(
        &admin,
        &json!({"auths": {"registry.example.com": {"auth": "dTpw"}}}),
    )
    .await;
    assert!(matches!(
        viewer_cluster.pull_secret().await.unwrap(),
        PullSecret::Forbidden(_)
    ));
    bind_viewer(&admin, PULL_SECRET_ROLE, Some("openshift-config")).await;
    let may = |verb: &'static str, namespace: &'static str, name: Option<&'static str>| {
        let viewer = viewer.clone();
        async move { allowed(&viewer, verb, "", "secrets", Some(namespace), name).await }
    };
    eventually("pinboard-pull-secret in force", || async {
        may("get", "openshift-config", Some("pull-secret"))
            .await
            .then_some(())
    })
    .await;
    for (verb, namespace, name) in [
        ("get", "openshift-config", Some("other")),
        ("list", "openshift-config", None),
        ("watch", "openshift-config", Some("pull-secret")),
        ("update", "openshift-config", Some("pull-secret")),
        ("get", "default", Some("pull-secret")),
    ] {
        assert!(
            !may(verb, namespace, name).await,
            "{verb} {namespace}/{name:?}"
        );
    }
    match viewer_cluster.pull_secret().await.unwrap() {
        PullSecret::Found(config) => assert!(config.contains("registry.example.com"), "{config}"),
        _ => panic!("the viewer cannot read the pull secret with the Role bound"),
    }

    // pinboard-operator, bound to the same user in place of the viewer role.
    bindings
        .delete("pinboard-viewer-test", &DeleteParams::default())
        .await
        .unwrap();
    bind_viewer(&admin, "pinboard-operator", None).await;
    assert_exactly(&viewer, "pinboard-operator", &operator_grants()).await;
    let operator = discover(&viewer).await;
    let stored = operator.apply_set(&worker_set("upgrade")).await.unwrap();
    assert_eq!(stored.images().count(), 1);
    let sets: Api<DynamicObject> =
        Api::all_with(admin.clone(), &admin_cluster.resources().pinned_image_set);
    assert!(sets.get_opt("upgrade").await.unwrap().is_some());
    operator.apply_set(&worker_set("upgrade")).await.unwrap();
    operator.delete_set("upgrade").await.unwrap();
    eventually("the set deleted", || async {
        sets.get_opt("upgrade")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // Pools, machine-config nodes and nodes stay the controller's and the kubelet's.
    let as_operator: Api<DynamicObject> = Api::all_with(viewer.clone(), &operator.resources().pool);
    let paused = json!({"spec": {"paused": true}});
    assert!(is_forbidden(
        as_operator
            .patch("worker", &PatchParams::default(), &Patch::Merge(&paused))
            .await
    ));
    let label = json!({"metadata": {"labels": {"pinboard": "yes"}}});
    assert!(is_forbidden(
        Api::<Node>::all(viewer.clone())
            .patch("worker-0", &PatchParams::default(), &Patch::Merge(&label))
            .await
    ));
}

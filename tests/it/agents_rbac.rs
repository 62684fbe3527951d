//! The agents' RBAC as `pinboard agent manifests` prints it, applied to the lab's real kube-apiserver (RBAC
//! authorization on), asked of the API server for the agents' ServiceAccount (SubjectAccessReviews): they may
//! always record Events in `default`, where the Events of cluster-scoped objects go (in `kube-system` on an
//! API server that wants them there), and nowhere else, cluster-wide included; they may patch Nodes only once
//! installed with `--gate`, and still never update, delete or create one, nor write its status. The headless
//! metrics Service is accepted as written.

use crate::support;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::cluster::{client, eventually, lab};
use support::kube_objects::apply_yaml;
use support::pinboard;

const NAMESPACE: &str = "pinboard-system";

/// Whether the agents' ServiceAccount may `verb` `resource` (`resource/subresource`) of `group` (in
/// `namespace`), as the API server answers for it.
async fn agents_may(
    admin: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {
        "user": format!("system:serviceaccount:{NAMESPACE}:pinboard-agent"),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NAMESPACE}"),
                   "system:authenticated"],
        "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                               "subresource": subresource, "namespace": namespace},
    }}))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.unwrap().allowed
}

/// Applies `pinboard agent manifests FLAGS`.
async fn install(admin: &kube::Client, flags: &[&str]) {
    let printed = pinboard(["agent", "manifests"].iter().chain(flags));
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    apply_yaml(admin, &printed.stdout).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agents_record_events_in_default_only_and_patch_nodes_only_with_the_gate() {
    let lab = lab("agents-rbac");
    let apiserver = lab.apiserver().unwrap();
    let admin = client(apiserver.kubeconfig(), None).await;

    install(&admin, &["--metrics"]).await;
    for namespace in ["default", "kube-system"] {
        eventually(
            &format!("the agents' Events rights in {namespace}"),
            || async {
                (agents_may(&admin, "create", "events.k8s.io", "events", namespace).await
                    && agents_may(&admin, "patch", "events.k8s.io", "events", namespace).await)
                    .then_some(())
            },
        )
        .await;
    }
    for namespace in [NAMESPACE, "kube-public", ""] {
        assert!(
            !agents_may(&admin, "create", "events.k8s.io", "events", namespace).await,
            "no Events in {namespace}"
        );
    }
    assert!(!agents_may(&admin, "delete", "events.k8s.io", "events", "default").await);
    assert!(
        !agents_may(&admin, "create", "", "events", "default").await,
        "the events.k8s.io API only"
    );
    assert!(agents_may(&admin, "get", "", "nodes", "").await);
    assert!(
        !agents_may(&admin, "patch", "", "nodes", "").await,
        "no gate, no Node writes"
    );
    let service = Api::<Service>::namespaced(admin.clone(), NAMESPACE)
        .get("pinboard-agent-metrics")
        .await
        .unwrap();
    assert_eq!(service.spec.unwrap().cluster_ip.as_deref(), Some("None"));

    install(&admin, &["--metrics", "--gate"]).await;
    eventually("the gate's right to patch Nodes", || async {
        agents_may(&admin, "patch", "", "nodes", "")
            .await
            .then_some(())
    })
    .await;
    for verb in ["update", "delete", "create"] {
        assert!(
            !agents_may(&admin, verb, "", "nodes", "").await,
            "{verb} nodes"
        );
    }
    assert!(
        !agents_may(&admin, "patch", "", "nodes/status", "").await,
        "a Node's status"
    );
}

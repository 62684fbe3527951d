//! What tests do with the objects of a cluster lab ([`super::KubeCluster`]), as `kubectl` would: apply a
//! multi-document YAML, wait for a DaemonSet's pod on a node or for a pod to run or be ready, and read a
//! container's logs through the API server (which fetches them from the pod's kubelet).

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind, TypeMeta};
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;

/// How long a pod gets to be scheduled, have its image pulled and start, on a busy 2-core machine.
pub const POD_WAIT: Duration = Duration::from_secs(120);
const FIELD_MANAGER: &str = "pinboard-test";

/// Server-side applies every document of `yaml` in order (as `kubectl apply --server-side -f -`), each
/// in its `metadata.namespace` or else `default` if its kind is namespaced; returns the applied objects.
/// Panics, naming the object, if one is refused.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Vec<DynamicObject> {
    let documents: Vec<Option<Value>> = serde_saphyr::from_multiple(yaml).expect("the YAML parses");
    let mut applied = Vec::new();
    for object in documents.into_iter().flatten() {
        let types: TypeMeta =
            serde_json::from_value(object.clone()).expect("a document with apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).expect("a valid apiVersion");
        let name = object["metadata"]["name"]
            .as_str()
            .expect("a document with metadata.name")
            .to_owned();
        let what = format!("{} {name}", types.kind);
        // A kind a CRD just added is served a moment after the CRD is.
        let (resource, capabilities) = wait_for(&what, POD_WAIT, || async {
            pinned_kind(client, &gvk)
                .await
                .map_err(|e| format!("discovering {}: {e}", types.kind))
        })
        .await;
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => {
                let namespace = object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default");
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
        };
        let object = api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap_or_else(|e| panic!("applying {what}: {e}"));
        applied.push(object);
    }
    applied
}

/// What a pod waited for must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Phase Running: scheduled, sandbox up, its containers started.
    Running,
    /// Running, and every container ready.
    Ready,
    /// Phase Succeeded: every container exited 0 and will not restart.
    Succeeded,
}

/// Waits for the pod of DaemonSet `namespace/name` on node `node` to be in `state`; returns it.
pub async fn wait_for_daemonset_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    state: PodState,
) -> Pod {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let daemonset = daemonsets
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("DaemonSet {namespace}/{name}: {e}"));
    let labels = daemonset
        .spec
        .selector
        .match_labels
        .unwrap_or_default()
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let on_node = ListParams::default()
        .labels(&labels)
        .fields(&format!("spec.nodeName={node}"));
    let what = format!("the pod of DaemonSet {namespace}/{name} on node {node} to be {state:?}");
    wait_for(&what, POD_WAIT, || async {
        let list = pods.list(&on_node).await.map_err(|e| e.to_string())?;
        let pod = list.items.into_iter().next().ok_or("no pod yet")?;
        in_state(pod, state)
    })
    .await
}

/// Waits for pod `namespace/name` to be in `state`; returns it.
pub async fn wait_for_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    state: PodState,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let what = format!("pod {namespace}/{name} to be {state:?}");
    wait_for(&what, POD_WAIT, || async {
        in_state(pods.get(name).await.map_err(|e| e.to_string())?, state)
    })
    .await
}

/// The logs of `container` (the pod's only one when `None`) of pod `namespace/name`, through the API
/// server's pod log endpoint.
pub async fn pod_logs(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    container: Option<&str>,
) -> String {
    let params = LogParams {
        container: container.map(str::to_owned),
        ..LogParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), namespace)
        .logs(name, &params)
        .await
        .unwrap_or_else(|e| panic!("logs of pod {namespace}/{name} ({container:?}): {e}"))
}

/// Retries `attempt` every 200 ms until it returns `Ok`; panics after `timeout` with what it waited for
/// and the last reason it was not there yet.
pub async fn wait_for<T, F: Future<Output = Result<T, String>>>(
    what: &str,
    timeout: Duration,
    attempt: impl Fn() -> F,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let why_not = match attempt().await {
            Ok(value) => return value,
            Err(why_not) => why_not,
        };
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {why_not}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `pod` if it is in `state`, else what it is.
fn in_state(pod: Pod, state: PodState) -> Result<Pod, String> {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    let containers_ready = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| statuses.iter().all(|s| s.ready));
    match (state, phase, containers_ready) {
        (PodState::Running, Some("Running"), _)
        | (PodState::Ready, Some("Running"), true)
        | (PodState::Succeeded, Some("Succeeded"), _) => Ok(pod),
        _ => Err(describe(&pod)),
    }
}

/// The pod's phase and its containers' states, for messages.
fn describe(pod: &Pod) -> String {
    let status = serde_json::to_value(&pod.status).unwrap_or_default();
    format!(
        "pod {} on node {:?}: {status}",
        pod.metadata.name.as_deref().unwrap_or("?"),
        pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
    )
}

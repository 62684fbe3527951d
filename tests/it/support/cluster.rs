//! Playing an OpenShift cluster in the lab's API server: the machine-config CRDs from tests/fixtures/crds,
//! and the objects the controllers, the kubelet and the machine-config daemon would write (pools, Nodes with
//! status, MachineConfigNodes and their status). No kubelet or daemon runs: tests write what they would.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::wait::{await_condition, conditions};
use pinboard::backend::openshift::{Cluster, ClusterError, ConnectOptions, connect};
use pinboard::model::machine_config::{DEGRADED, PROGRESSING, ROLE_LABEL, pool_label};
use serde_json::{Value, json};

use super::kube_objects::wait_for;
use super::{Lab, LabConfig};

/// How long the API server gets for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(30);
const TEST_MANAGER: &str = "pinboard-test";

/// A lab with etcd and kube-apiserver only (no nodes need running for cluster mode).
pub fn lab(name: &str) -> Lab {
    pinboard::install_crypto_provider();
    Lab::start(
        name,
        LabConfig {
            nodes: Vec::new(),
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start")
}

/// Makes the lab's API server an OpenShift cluster as far as pinboard can tell: the machine-config CRDs,
/// `pools` (see [`Writer::pool`]) and a worker Node with its MachineConfigNode for each of `workers`.
/// Returns the admin's client and a writer.
pub async fn openshift(lab: &Lab, pools: &[&str], workers: &[&str]) -> (kube::Client, Writer) {
    let kubeconfig = lab
        .apiserver()
        .expect("the lab runs an API server")
        .kubeconfig();
    let admin = client(kubeconfig, None).await;
    install_crds(&admin).await;
    let writer = Writer {
        cluster: discover(&admin).await,
    };
    for pool in pools {
        writer.pool(pool).await;
    }
    for node in workers {
        writer.worker(node).await;
    }
    (admin, writer)
}

/// A client for `kubeconfig` (and `context`).
pub async fn client(kubeconfig: &Path, context: Option<&str>) -> kube::Client {
    connect(&ConnectOptions {
        kubeconfig: Some(kubeconfig.to_owned()),
        context: context.map(str::to_owned),
    })
    .await
    .expect("the lab's kubeconfig works")
}

/// A kubeconfig next to the lab's with two contexts: `lab` (the admin) and `viewer` (the lab's viewer
/// token, granted nothing until a test binds a role).
pub fn kubeconfig_with_viewer(lab: &Lab) -> PathBuf {
    let apiserver = lab.apiserver().expect("the lab runs an API server");
    let admin = std::fs::read_to_string(apiserver.kubeconfig()).unwrap();
    let user = format!(
        "users:\n- name: viewer\n  user:\n    token: {}\n",
        apiserver.viewer_token()
    );
    let context = "contexts:\n- name: viewer\n  context:\n    cluster: lab\n    user: viewer\n";
    let text = admin
        .replace("users:\n", &user)
        .replace("contexts:\n", context);
    let path = lab.dir().join("kubeconfig-with-viewer");
    std::fs::write(&path, text).unwrap();
    path
}

fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crds")
}

/// The CRD in tests/fixtures/crds/`file`.
pub fn read_crd(file: &str) -> Value {
    let path = crd_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Applies a CRD; returns its name.
pub async fn apply_crd(client: &kube::Client, crd: &Value) -> String {
    let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    name
}

/// Applies every CRD in tests/fixtures/crds and waits until each is established.
pub async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(crd_dir()).unwrap() {
        let file = entry.unwrap().file_name();
        names.push(apply_crd(client, &read_crd(&file.to_string_lossy())).await);
    }
    for name in names {
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(WAIT, established)
            .await
            .expect("CRD established in time")
            .unwrap();
    }
}

/// Discovery, retried while the API server's discovery catches up with freshly established CRDs.
pub async fn discover(client: &kube::Client) -> Cluster {
    let deadline = Instant::now() + WAIT;
    loop {
        match Cluster::discover(client.clone()).await {
            Ok(cluster) => return cluster,
            Err(ClusterError::MissingKind(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("discovery failed: {e}"),
        }
    }
}

/// What a worker node's kubelet reports.
pub struct NodeStatus<'a> {
    pub ready: bool,
    /// `status.images`, one entry per name.
    pub images: &'a [String],
    /// Pads `status.images` with other images up to this many entries (the kubelet reports at most 50).
    pub entries: usize,
}

/// Writes what the cluster stores, as the controllers, the kubelet and the daemon would.
pub struct Writer {
    pub cluster: Cluster,
}

impl Writer {
    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::all_with(self.cluster.client().clone(), resource)
    }

    /// Server-side applies `rest` (spec, labels...) to the object `name` of `resource`.
    pub async fn apply(&self, resource: &ApiResource, name: &str, rest: Value) {
        let mut body = json!({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}});
        body.as_object_mut()
            .unwrap()
            .extend(rest.as_object().unwrap().clone());
        self.api(resource)
            .patch(
                name,
                &PatchParams::apply(TEST_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {} {name}: {e}", resource.kind));
    }

    /// A pool selecting sets labelled with its role and nodes labelled `node-role.kubernetes.io/<name>`, itself
    /// labelled as OpenShift labels pools.
    pub async fn pool(&self, name: &str) {
        let role = json!({"matchLabels": {ROLE_LABEL: name}});
        let nodes = json!({"matchLabels": {format!("node-role.kubernetes.io/{name}"): ""}});
        let resource = &self.cluster.resources().pool;
        let labels = json!({pool_label(name): ""});
        self.apply(
            resource,
            name,
            json!({"metadata": {"name": name, "labels": labels},
                   "spec": {"machineConfigSelector": role, "nodeSelector": nodes}}),
        )
        .await;
    }

    pub async fn pool_status(&self, name: &str, updated: i64, machines: i64) {
        let status = json!({"status": {"poolSynchronizersStatus": [{
            "poolSynchronizerType": "PinnedImageSets", "machineCount": machines, "updatedMachineCount": updated,
        }]}});
        self.api(&self.cluster.resources().pool)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    /// A worker node (Ready, 120 GiB ephemeral storage of which 100 GiB allocatable, one image of its own) and its MachineConfigNode, as the
    /// kubelet and the machine-config operator create them.
    pub async fn worker(&self, name: &str) {
        let own = [format!("quay.io/pinboard/{name}@sha256:{}", "a".repeat(64))];
        let nodes: Api<Node> = Api::all(self.cluster.client().clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        self.node_status(
            name,
            &NodeStatus {
                ready: true,
                images: &own,
                entries: 1,
            },
        )
        .await;
        let resource = &self.cluster.resources().machine_config_node;
        self.apply(
            resource,
            name,
            json!({"spec": {"node": {"name": name}, "pool": {"name": "worker"}}}),
        )
        .await;
    }

    /// Writes a Node's status as its kubelet does.
    pub async fn node_status(&self, name: &str, status: &NodeStatus<'_>) {
        let mut images: Vec<Value> = status
            .images
            .iter()
            .map(|i| json!({"names": [i], "sizeBytes": 1}))
            .collect();
        images.extend((images.len()..status.entries).map(|n| {
            json!({"names": [format!("quay.io/pinboard/filler-{n}@sha256:{}", "f".repeat(64))], "sizeBytes": 1})
        }));
        let ready = if status.ready { "True" } else { "False" };
        let body = json!({"status": {
            "conditions": [{"type": "Ready", "status": ready}, {"type": "DiskPressure", "status": "False"}],
            "allocatable": {"ephemeral-storage": "100Gi"},
            "capacity": {"ephemeral-storage": "120Gi"},
            "nodeInfo": {"containerRuntimeVersion": "cri-o://1.33.2", "architecture": "amd64", "bootID": "b",
                         "kernelVersion": "6.1", "kubeProxyVersion": "", "kubeletVersion": "v1.33.2",
                         "machineID": "m", "operatingSystem": "linux", "osImage": "RHCOS", "systemUUID": "u"},
            "images": images,
        }});
        Api::<Node>::all(self.cluster.client().clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap_or_else(|e| panic!("status of Node {name}: {e}"));
    }

    /// Sets the kubelet version Node `name` reports (`status.nodeInfo.kubeletVersion`).
    pub async fn kubelet_version(&self, name: &str, version: &str) {
        let body = json!({"status": {"nodeInfo": {"kubeletVersion": version}}});
        Api::<Node>::all(self.cluster.client().clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap_or_else(|e| panic!("kubelet version of Node {name}: {e}"));
    }

    /// Points Node `name` at a kubelet listening on 127.0.0.1:`port`, as its status says where its kubelet
    /// is: the API server's node proxy goes there.
    pub async fn kubelet(&self, name: &str, port: u16) {
        let body = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        }});
        Api::<Node>::all(self.cluster.client().clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap_or_else(|e| panic!("kubelet address of Node {name}: {e}"));
    }

    /// Writes a MachineConfigNode's status as the daemon does: the set entry and both conditions. (No
    /// empty strings or nulls: this API server turns `""` into null in custom resources, which the schema's
    /// string fields then refuse.)
    pub async fn daemon(&self, node: &str, set: Value, progressing: bool, degraded: Option<&str>) {
        self.report(node, json!([set]), progressing, degraded).await;
    }

    /// As [`Writer::daemon`], for several sets done (`sets`: their entries), nothing progressing or failed.
    pub async fn daemons(&self, node: &str, sets: Value) {
        self.report(node, sets, false, None).await;
    }

    async fn report(&self, node: &str, sets: Value, progressing: bool, degraded: Option<&str>) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition = |type_: &str, on: bool, reason: &str, message: &str| {
            json!({"type": type_, "status": if on { "True" } else { "False" },
                   "reason": if on { reason } else { "AsExpected" }, "message": message, "lastTransitionTime": now})
        };
        let status = json!({"status": {
            "pinnedImageSets": sets,
            "conditions": [
                condition(PROGRESSING, progressing, "ImagePrefetch",
                          &format!("node is prefetching images: {node}")),
                condition(DEGRADED, degraded.is_some(), "PrefetchFailed",
                          degraded.unwrap_or("no errors")),
            ],
        }});
        self.api(&self.cluster.resources().machine_config_node)
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("status of MachineConfigNode {node}: {e}"));
    }
}

/// `quay.io/openshift/release@sha256:00…0n`, a valid digest reference per `n`.
pub fn digest(n: u32) -> String {
    format!("quay.io/openshift/release@sha256:{n:064x}")
}

/// The documents of deploy/rbac.yaml (the commented-out example bindings are not documents).
pub fn rbac_documents() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let documents: Vec<Option<Value>> = serde_saphyr::from_multiple(&text).unwrap();
    documents.into_iter().flatten().collect()
}

/// Applies deploy/rbac.yaml as an administrator would: its ClusterRoles, and its Roles in their namespaces
/// (created first if need be, as OpenShift has them).
pub async fn apply_rbac(admin: &kube::Client) {
    let params = PatchParams::apply(TEST_MANAGER).force();
    for document in rbac_documents() {
        let name = document["metadata"]["name"].as_str().unwrap().to_owned();
        match document["kind"].as_str().unwrap() {
            "ClusterRole" => {
                Api::<ClusterRole>::all(admin.clone())
                    .patch(&name, &params, &Patch::Apply(&document))
                    .await
                    .unwrap();
            }
            "Role" => {
                let namespace = document["metadata"]["namespace"].as_str().unwrap();
                ensure_namespace(admin, namespace).await;
                Api::<Role>::namespaced(admin.clone(), namespace)
                    .patch(&name, &params, &Patch::Apply(&document))
                    .await
                    .unwrap();
            }
            other => panic!("deploy/rbac.yaml holds a {other}"),
        }
    }
}

async fn ensure_namespace(admin: &kube::Client, name: &str) {
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    Api::<Namespace>::all(admin.clone())
        .patch(
            name,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&namespace),
        )
        .await
        .unwrap();
}

/// Binds ClusterRole `role` (or, with `namespace`, the Role of that name there) to the lab's `viewer` user,
/// as `<role>-test`.
pub async fn bind_viewer(admin: &kube::Client, role: &str, namespace: Option<&str>) {
    let subject =
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}]);
    let metadata = json!({"name": format!("{role}-test")});
    match namespace {
        None => {
            let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subject}))
            .unwrap();
            Api::<ClusterRoleBinding>::all(admin.clone())
                .create(&PostParams::default(), &binding)
                .await
                .unwrap();
        }
        Some(namespace) => {
            let binding: RoleBinding = serde_json::from_value(json!({"metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": subject}))
            .unwrap();
            Api::<RoleBinding>::namespaced(admin.clone(), namespace)
                .create(&PostParams::default(), &binding)
                .await
                .unwrap();
        }
    }
}

/// Whether the client's user may `verb` the resource (`resource/subresource`) in `group`, across the
/// cluster or, with `namespace` (and `name`), there.
pub async fn allowed(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({"spec": {
        "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                               "namespace": namespace.unwrap_or(""), "name": name.unwrap_or("")},
    }}))
    .unwrap();
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.unwrap().allowed
}

/// Retries `attempt` every 200 ms until it returns `Some` (RBAC and discovery changes reach the API
/// server's caches a moment after they are written); panics after [`WAIT`].
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    attempt: impl Fn() -> F,
) -> T {
    wait_for(what, WAIT, || async {
        attempt().await.ok_or_else(|| "not yet".to_owned())
    })
    .await
}

/// Stores `docker_config` (`{"auths": ...}`) as the cluster's global pull secret,
/// `openshift-config/pull-secret`, as OpenShift keeps it.
pub async fn pull_secret(admin: &kube::Client, docker_config: &Value) {
    ensure_namespace(admin, "openshift-config").await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "pull-secret", "namespace": "openshift-config"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": docker_config.to_string()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), "openshift-config")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

//! The plain Kubernetes cluster lab itself (tests/it/support/kube_cluster.rs): real kubelets register their
//! nodes, the controllers play a DaemonSet and collect garbage, a pod on a node sees what it would on a
//! real one, and a process outside any pod acts as the pod would. It fails, never skips, when the lab
//! cannot start.

use crate::support;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use support::cluster::client;
use support::kube_objects::{
    POD_WAIT, PodState, apply_yaml, pod_logs, wait_for, wait_for_daemonset_pod, wait_for_pod,
};
use support::{ClusterConfig, Lab, LabConfig, NodeSpec};

const MIB: u64 = 1 << 20;
/// n1's image filesystem, with room for the pinboard binary's image; the other nodes have 200 MiB.
const N1_IMAGEFS: u64 = 512 * MIB;
const NAMESPACE: &str = "pinboard-agent";
const ACCOUNT: &str = "agent";
const BUSYBOX: &str = "/usr/local/bin/busybox";
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// What the kubelet's `setupKernelTunables` would set on the host.
const KUBELET_SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

fn start() -> Lab {
    pinboard::install_crypto_provider();
    Lab::start(
        "kube-cluster",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", N1_IMAGEFS),
                NodeSpec::new("n2", 200 * MIB),
                NodeSpec::new("n3", 200 * MIB),
            ],
            cluster: Some(ClusterConfig {
                service_account_tokens: vec![(NAMESPACE.to_owned(), ACCOUNT.to_owned())],
            }),
            ..LabConfig::default()
        },
    )
    .expect("the cluster lab must start")
}

/// The node agent as its DaemonSet would run it (as deploy/agent/overlays/containerd/daemonset.yaml does): on every
/// node whatever its taints, on the pod network, without capabilities on a read-only root, with its own
/// ServiceAccount's token and the node's containerd socket, registry config, image filesystem and kubelet
/// credentials. An init container checks with openssl that the API server the pod's environment names
/// is served with a certificate its `ca.crt` verifies; the agent then prints what it sees and sleeps.
fn agent_yaml(busybox: &str, openssl: &str) -> String {
    let script = format!(
        "B={BUSYBOX}; \
         echo service=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; \
         echo namespace=$($B cat {SERVICE_ACCOUNT_DIR}/namespace); \
         echo token=$($B cat {SERVICE_ACCOUNT_DIR}/token); \
         $B test -s {SERVICE_ACCOUNT_DIR}/ca.crt && echo ca=present; \
         $B test -S /run/containerd/containerd.sock && echo containerd=socket; \
         echo hosts=$($B ls /etc/containerd/certs.d | $B wc -l); \
         echo imagefs=$(( $($B stat -f -c '%b * %S' /var/lib/containerd) )); \
         echo docker-config=$($B cat /var/lib/kubelet/config.json); \
         exec $B sleep 2147483647"
    );
    let hostpath = |name: &str, path: &str, kind: &str| json!({"name": name, "hostPath": {"path": path, "type": kind}});
    let documents = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}}),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": NAMESPACE},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "serviceAccountName": ACCOUNT,
                        "automountServiceAccountToken": true,
                        "initContainers": [{
                            "name": "verify", "image": openssl,
                            "args": ["s_client", "-brief", "-verify_return_error",
                                     "-connect", "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)",
                                     "-CAfile", format!("{SERVICE_ACCOUNT_DIR}/ca.crt")],
                        }],
                        "containers": [{
                            "name": "agent", "image": busybox,
                            "command": [BUSYBOX, "sh", "-c", script],
                            "securityContext": {
                                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                                "runAsUser": 0, "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "containerd", "mountPath": "/run/containerd"},
                                {"name": "certs", "mountPath": "/etc/containerd/certs.d"},
                                {"name": "image-fs", "mountPath": "/var/lib/containerd", "readOnly": true},
                                {"name": "docker-config", "mountPath": "/var/lib/kubelet/config.json",
                                 "readOnly": true},
                            ],
                        }],
                        "volumes": [
                            hostpath("containerd", "/run/containerd", "Directory"),
                            hostpath("certs", "/etc/containerd/certs.d", "Directory"),
                            hostpath("image-fs", "/var/lib/containerd", "Directory"),
                            hostpath("docker-config", "/var/lib/kubelet/config.json", "FileOrCreate"),
                        ],
                    },
                },
            },
        }),
    ];
    documents
        .iter()
        .map(|d| serde_saphyr::to_string(d).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A pod on n1's host network running the image of the pinboard binary (dynamically linked: its libraries
/// and loader come along) with `--version`.
fn pinboard_version_yaml(pinboard: &str) -> String {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pinboard-version", "namespace": NAMESPACE},
        "spec": {
            "nodeName": "n1",
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{"name": "pinboard", "image": pinboard, "args": ["--version"]}],
        },
    });
    serde_saphyr::to_string(&pod).expect("YAML")
}

/// `key=value` lines of `logs` whose key is `key`.
fn logged<'a>(logs: &'a str, key: &str) -> &'a str {
    logs.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in the logs:\n{logs}"))
}

/// `GET url` with `token`, trusting only `ca`; the status and body.
fn get_verified(ca: &Path, url: &str, token: &str) -> (u16, String) {
    let mut response = support::http::agent_trusting(ca)
        .unwrap()
        .get(url)
        .header("Authorization", format!("Bearer {token}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {url} trusting the cluster CA: {e}"));
    let body = response.body_mut().read_to_string().unwrap();
    (response.status().as_u16(), body)
}

fn sysctls() -> Vec<String> {
    KUBELET_SYSCTLS
        .iter()
        .map(|name| std::fs::read_to_string(Path::new("/proc/sys").join(name)).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelets_run_a_daemonset_that_reaches_the_api_server_and_deleted_nodes_are_collected() {
    let sysctls_before = sysctls();
    let started = Instant::now();
    let mut lab = start();
    eprintln!("cluster lab up in {:.1} s", started.elapsed().as_secs_f64());
    let cluster = lab.cluster().expect("a cluster lab");
    let network = lab.network().expect("a cluster lab has its network");
    let (ca, lab_ip, host_ip) = (
        cluster.ca_cert().to_owned(),
        network.lab_ip(),
        network.host_ip(),
    );
    let admin = client(cluster.kubeconfig(), None).await;

    // Every node registered, with its runtime, its images (the sandbox image, there from the start) and
    // its own address.
    let nodes: Api<Node> = Api::all(admin.clone());
    for name in ["n1", "n2", "n3"] {
        let node = wait_for(
            &format!("node {name} to list its images"),
            POD_WAIT,
            || async {
                let node = nodes.get(name).await.map_err(|e| e.to_string())?;
                let status = node.status.clone().unwrap_or_default();
                match status.images.as_deref() {
                    Some([_, ..]) => Ok(node),
                    _ => Err(format!("status: {:?}", status.node_info)),
                }
            },
        )
        .await;
        let status = node.status.unwrap();
        let runtime = &status.node_info.unwrap().container_runtime_version;
        assert!(runtime.starts_with("containerd://"), "{name}: {runtime}");
        let address = cluster.node_ip(name).unwrap().to_string();
        assert!(
            status
                .addresses
                .unwrap()
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == address),
            "{name} has its address {address}"
        );
    }

    // The kubelet's configuration, through the API server's node proxy.
    let configz: Value = serde_json::from_str(
        &admin
            .request_text(
                http::Request::get("/api/v1/nodes/n1/proxy/configz")
                    .body(Vec::new())
                    .unwrap(),
            )
            .await
            .expect("/configz through the node proxy"),
    )
    .unwrap();
    assert_eq!(
        configz["kubeletconfig"]["imageGCHighThresholdPercent"], 85,
        "{configz}"
    );
    // Its image filesystem, as it reports it, is the node's own.
    wait_for(
        "n1's kubelet to report its image filesystem",
        POD_WAIT,
        || async {
            let summary = admin
                .request_text(
                    http::Request::get("/api/v1/nodes/n1/proxy/stats/summary")
                        .body(Vec::new())
                        .unwrap(),
                )
                .await
                .map_err(|e| e.to_string())?;
            let summary: Value = serde_json::from_str(&summary).map_err(|e| e.to_string())?;
            let capacity = &summary["node"]["runtime"]["imageFs"]["capacityBytes"];
            match capacity.as_u64() {
                Some(bytes) if bytes == N1_IMAGEFS => Ok(()),
                _ => Err(format!("imageFs capacity {capacity}")),
            }
        },
    )
    .await;

    // The agent's DaemonSet: its pod on n1 runs with the node's standard paths and reaches the API server
    // where its environment says, verified by the CA it was given.
    let busybox = lab
        .push_binary_image(Path::new("/bin/busybox"), "lab/busybox")
        .unwrap();
    let openssl = lab
        .push_binary_image(Path::new("/usr/bin/openssl"), "lab/openssl")
        .unwrap();
    assert!(busybox.starts_with(&format!("{host_ip}:")), "{busybox}");
    let docker_config = lab.node("n1").path_in_node("/var/lib/kubelet/config.json");
    std::fs::write(&docker_config, r#"{"auths":{}}"#).unwrap();
    apply_yaml(&admin, &agent_yaml(&busybox, &openssl)).await;
    let pod = wait_for_daemonset_pod(&admin, NAMESPACE, "agent", "n1", PodState::Running).await;
    let pod_name = pod.metadata.name.unwrap();
    let pod = wait_for_pod(&admin, NAMESPACE, &pod_name, PodState::Ready).await;
    let pod_ip = pod.status.unwrap().pod_ip.unwrap();
    assert!(
        pod_ip.starts_with("10.244."),
        "a pod network address: {pod_ip}"
    );
    let verified = pod_logs(&admin, NAMESPACE, &pod_name, Some("verify")).await;
    assert!(verified.contains("Verification: OK"), "{verified}");
    let logs = wait_for("the agent to print what it sees", POD_WAIT, || async {
        let logs = pod_logs(&admin, NAMESPACE, &pod_name, Some("agent")).await;
        if logs.contains("docker-config=") {
            Ok(logs)
        } else {
            Err(logs)
        }
    })
    .await;
    assert_eq!(logged(&logs, "service"), format!("{lab_ip}:443"));
    assert_eq!(logged(&logs, "namespace"), NAMESPACE);
    assert_eq!(logged(&logs, "ca"), "present");
    assert_eq!(logged(&logs, "containerd"), "socket");
    assert_eq!(
        logged(&logs, "hosts"),
        "2",
        "the registry's and the proxy's hosts.toml"
    );
    assert_eq!(logged(&logs, "imagefs"), N1_IMAGEFS.to_string());
    assert_eq!(logged(&logs, "docker-config"), r#"{"auths":{}}"#);

    // The pinboard binary runs from its image.
    let pinboard = lab
        .push_binary_image(Path::new(env!("CARGO_BIN_EXE_pinboard")), "lab/pinboard")
        .unwrap();
    apply_yaml(&admin, &pinboard_version_yaml(&pinboard)).await;
    wait_for_pod(&admin, NAMESPACE, "pinboard-version", PodState::Succeeded).await;
    let version = pod_logs(&admin, NAMESPACE, "pinboard-version", None).await;
    assert!(version.starts_with("pinboard "), "{version}");

    // Its token authenticates as its ServiceAccount, as do the static token the lab gave that account and
    // the token Secret minted for another; a kubeconfig of the first acts as the pod would.
    let url = format!("https://{lab_ip}:443/api/v1/namespaces/{NAMESPACE}/secrets");
    let as_agent = cluster.in_cluster_view(NAMESPACE, ACCOUNT).unwrap();
    let as_default = cluster.in_cluster_view(NAMESPACE, "default").unwrap();
    assert_eq!(as_agent.server, format!("https://{lab_ip}:443"));
    assert_eq!(as_agent.ca_pem, std::fs::read_to_string(&ca).unwrap());
    for (token, account) in [
        (logged(&logs, "token"), ACCOUNT),
        (&as_agent.token, ACCOUNT),
        (&as_default.token, "default"),
    ] {
        let (status, body) = get_verified(&ca, &url, token);
        assert_eq!(status, 403, "{body}");
        let user = format!("system:serviceaccount:{NAMESPACE}:{account}");
        assert!(body.contains(&user), "{body}");
    }
    let kubeconfig = lab.dir().join("kubeconfig-as-agent");
    cluster
        .write_in_cluster_kubeconfig(NAMESPACE, ACCOUNT, &kubeconfig)
        .unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(client(&kubeconfig, None).await);
    let refused = secrets.list(&ListParams::default()).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains(&format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}")),
        "{refused}"
    );

    // A fourth node joins and gets the agent; once it leaves, what its Node owned is collected.
    lab.add_node(NodeSpec::new("n4", 200 * MIB)).unwrap();
    wait_for_daemonset_pod(&admin, NAMESPACE, "agent", "n4", PodState::Running).await;
    let n4 = nodes.get("n4").await.unwrap();
    let owned: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "owned-by-n4", "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": "n4", "uid": n4.metadata.uid.unwrap(),
        }]},
    }))
    .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    config_maps
        .create(&PostParams::default(), &owned)
        .await
        .unwrap();
    lab.remove_node("n4").unwrap();
    wait_for(
        "the garbage collector to delete owned-by-n4",
        POD_WAIT,
        || async {
            match config_maps.get_opt("owned-by-n4").await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Stopping the lab leaves nothing behind: no mounts, no network, the host's kernel settings untouched.
    let lab_dir = lab.dir().to_owned();
    let container_cgroups = container_cgroups(&lab_dir);
    assert!(
        !container_cgroups.is_empty(),
        "runc made cgroups for the pods"
    );
    drop(lab);
    assert_eq!(sysctls(), sysctls_before, "{KUBELET_SYSCTLS:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(lab_dir.to_str().unwrap()),
        "mounts left under {}:\n{mounts}",
        lab_dir.display()
    );
    for cgroup in &container_cgroups {
        assert!(!cgroup.exists(), "{} left", cgroup.display());
    }
    assert_host_address_gone(host_ip);
}

/// The cgroups runc made for the lab's containers, from its state on every node.
fn container_cgroups(lab_dir: &Path) -> Vec<PathBuf> {
    let mut cgroups = Vec::new();
    for node in std::fs::read_dir(lab_dir.join("nodes")).unwrap().flatten() {
        let runc = node.path().join("fs/run/containerd/runc/k8s.io");
        for container in std::fs::read_dir(runc).into_iter().flatten().flatten() {
            let state: Value = serde_json::from_slice(
                &std::fs::read(container.path().join("state.json")).unwrap(),
            )
            .unwrap();
            for path in state["cgroup_paths"].as_object().unwrap().values() {
                cgroups.push(PathBuf::from(path.as_str().unwrap()));
            }
        }
    }
    cgroups
}

/// The kernel deletes the namespace, and the veth pair with it, a moment after its last process exits.
fn assert_host_address_gone(host_ip: Ipv4Addr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("ip")
            .args(["-o", "addr"])
            .output()
            .unwrap();
        let addresses = String::from_utf8_lossy(&out.stdout).into_owned();
        if !addresses.contains(&format!("{host_ip}/")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{host_ip} still there:\n{addresses}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// OpenShift mode's figures come from a real kubelet: the lab's cluster made an OpenShift one (the
/// machine-config CRDs, a pool, n1's MachineConfigNode), `plan` reads n1's image filesystem from its
/// kubelet's summary and its image GC threshold from its `/configz`, through the API server's node proxy:
/// what the stand-in kubelet of cluster_cli's tests answers with figures a lab node cannot have.
#[tokio::test(flavor = "multi_thread")]
async fn openshift_mode_plans_from_a_real_kubelets_summary_and_configuration() {
    pinboard::install_crypto_provider();
    let lab = Lab::start(
        "kube-cluster-openshift",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 200 * MIB)],
            cluster: Some(ClusterConfig::default()),
            ..LabConfig::default()
        },
    )
    .expect("the cluster lab must start");
    let kubeconfig = lab.cluster().unwrap().kubeconfig().to_owned();
    let admin = client(&kubeconfig, None).await;
    support::cluster::install_crds(&admin).await;
    let writer = support::cluster::Writer {
        cluster: support::cluster::discover(&admin).await,
    };
    writer.pool("worker").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let role = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}});
    nodes
        .patch(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&role),
        )
        .await
        .unwrap();
    let resource = &writer.cluster.resources().machine_config_node;
    writer
        .apply(
            resource,
            "n1",
            json!({"spec": {"node": {"name": "n1"}, "pool": {"name": "worker"}}}),
        )
        .await;
    let image = lab
        .push_image("openshift/app", &support::ImageSpec::small(7600))
        .unwrap()
        .reference(&lab.registry_host());
    let set = lab.dir().join("app.yaml");
    std::fs::write(
        &set,
        format!(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: app\n  \
             labels:\n    machineconfiguration.openshift.io/role: worker\nspec:\n  pinnedImages:\n  - name: {image}\n"
        ),
    )
    .unwrap();
    let run = support::pinboard([
        "plan",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--set",
        set.to_str().unwrap(),
        "--insecure-registry",
        &lab.registry_host(),
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let survey: Value = serde_json::from_str(&run.stdout).unwrap();
    let n1 = &survey["nodes"][0];
    assert_eq!(n1["node"], "n1", "{n1}");
    assert_eq!(n1["spaceSource"], "kubelet-summary", "{n1}");
    let capacity = n1["capacityBytes"].as_u64().unwrap();
    assert!(
        (150 * MIB..=200 * MIB).contains(&capacity),
        "n1's image filesystem is its 200 MiB tmpfs: {n1}"
    );
    assert_eq!(
        n1["gcHighSource"], "kubelet-config",
        "read from its /configz: {n1}"
    );
}

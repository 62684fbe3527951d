//! A plain Kubernetes cluster in the lab ([`super::LabConfig::cluster`]): besides the API server
//! (`apiserver.rs`, on the lab's address), the real kube-controller-manager and kube-scheduler (so a
//! DaemonSet is played by its own controller, ServiceAccount token Secrets are minted and ownerReferences
//! are garbage-collected) and a real kubelet per containerd node, each in its node's [`NodeSandbox`] and
//! registering its Node. Everything runs in the lab's network namespace ([`LabNetwork`]); logs are
//! `<lab>/kube-controller-manager.log`, `<lab>/kube-scheduler.log` and `<lab>/nodes/<name>/kubelet.log`.
//!
//! The kubelets authenticate with client certificates of the cluster's CA (`system:node:<name>` in
//! `system:nodes`, authorized by the Node authorizer), so a node can join at any time. Each node's pods get
//! a network of their own ([`write_pod_network`]: Debian's CNI bridge plugin, no kube-proxy, no iptables),
//! from which they reach the API server at the `kubernetes` Service's address; hostNetwork pods share the
//! lab's namespace and reach it too.
//!
//! [`InClusterView`] is what a pod of a ServiceAccount finds (server, `ca.crt`, token), for running a
//! process "as the pod would" outside any pod, e.g. `pinboard agent --kubeconfig FILE` on the host against
//! a node's socket.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;

use super::apiserver::{ApiServer, cached_binary};
use super::binary_image::binary_layer;
use super::http;
use super::images::{Extras, oci_archive};
use super::network::LabNetwork;
use super::node::{Node, NodeSpec};
use super::pki::Ca;
use super::process::{Proc, stop_all};

/// The pod sandbox ("pause") image every node is configured with and has from the start, imported rather
/// than pulled (the lab's registry may want credentials): busybox sleeping.
pub(crate) const SANDBOX_IMAGE: &str = "lab.invalid/pause:busybox";
const BUSYBOX: &str = "/bin/busybox";

/// What a cluster lab has besides its nodes.
#[derive(Clone, Debug, Default)]
pub struct ClusterConfig {
    /// ServiceAccounts (namespace, name) given a static token in the API server's token file, written
    /// before it starts: with [`KubeCluster::in_cluster_view`], a process acts as that ServiceAccount's
    /// pod would, on a node without the pod, even before the ServiceAccount exists.
    pub service_account_tokens: Vec<(String, String)>,
}

/// The cluster's controllers and kubelets, stopped when dropped.
pub struct KubeCluster {
    ca: Ca,
    /// The admin's kubeconfig, which the controllers use too.
    kubeconfig: PathBuf,
    apiserver_url: String,
    admin_token: String,
    /// (namespace, name, token) of the ServiceAccounts with a static token.
    service_account_tokens: Vec<(String, String, String)>,
    /// [`SANDBOX_IMAGE`] as `ctr images import` takes it.
    sandbox_archive: PathBuf,
    controllers: Vec<Proc>,
    kubelets: Vec<Kubelet>,
}

struct Kubelet {
    node: String,
    ip: Ipv4Addr,
    process: Proc,
}

impl KubeCluster {
    /// The cluster around `apiserver` (launched, perhaps not ready yet), whose certificate `ca` signed.
    /// Nothing runs yet: kubelets start with [`KubeCluster::start_kubelet`] (at once: they keep trying the
    /// API server), the controllers with [`KubeCluster::start_controllers`].
    pub(crate) fn new(lab_dir: &Path, apiserver: &ApiServer, ca: Ca) -> Result<KubeCluster> {
        let (layer, busybox) = binary_layer(Path::new(BUSYBOX))?;
        let sleep = [busybox.as_str(), "sleep", "2147483647"];
        let extras = Extras {
            entrypoint: sleep.map(str::to_owned).to_vec(),
            ..Extras::default()
        };
        let sandbox_archive = lab_dir.join("sandbox-image.tar");
        std::fs::write(
            &sandbox_archive,
            oci_archive(SANDBOX_IMAGE, std::slice::from_ref(&layer), &extras)?,
        )?;
        Ok(KubeCluster {
            ca,
            kubeconfig: apiserver.kubeconfig().to_owned(),
            apiserver_url: apiserver.url(),
            admin_token: apiserver.admin_token().to_owned(),
            service_account_tokens: apiserver.service_account_tokens().to_vec(),
            sandbox_archive,
            controllers: Vec::new(),
            kubelets: Vec::new(),
        })
    }

    /// Starts kube-controller-manager and kube-scheduler against `apiserver` in `network`, with the
    /// cluster's CA as the root CA of the ServiceAccount token Secrets. The API server must be ready: the
    /// controller manager gives up on one that does not answer within seconds.
    pub(crate) fn start_controllers(
        &mut self,
        lab_dir: &Path,
        network: &LabNetwork,
        apiserver: &ApiServer,
    ) -> Result<()> {
        // Neither serves anything: their health is the cluster's.
        let common = |name: &str| -> Result<std::process::Command> {
            let mut command = network.command(cached_binary(name)?);
            command
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .args(["--leader-elect=false", "--port=0", "--secure-port=0"]);
            Ok(command)
        };
        let flex_volumes = lab_dir.join("controller-manager/volume-plugins");
        let mut controller_manager = common("kube-controller-manager")?;
        controller_manager
            .arg(format!("--root-ca-file={}", self.ca.cert.display()))
            // Its default is on the host, which it would create.
            .arg(format!(
                "--flex-volume-plugin-dir={}",
                flex_volumes.display()
            ))
            .arg(format!(
                "--service-account-private-key-file={}",
                apiserver.service_account_key().display()
            ))
            .arg("--controllers=*");
        let scheduler = common("kube-scheduler")?;
        for (name, command) in [
            ("kube-controller-manager", controller_manager),
            ("kube-scheduler", scheduler),
        ] {
            let log = lab_dir.join(format!("{name}.log"));
            self.controllers.push(Proc::spawn(name, command, &log)?);
        }
        Ok(())
    }

    /// Starts `node`'s kubelet (a cluster node's, in its sandbox) on a new address of `network`, registering
    /// its Node with the labels and taints of `spec`, without waiting for it (see
    /// [`KubeCluster::wait_registered`]).
    pub(crate) fn start_kubelet(
        &mut self,
        node: &Node,
        spec: &NodeSpec,
        network: &LabNetwork,
    ) -> Result<()> {
        let sandbox = node
            .sandbox()
            .with_context(|| format!("node {} has no sandbox", node.name))?;
        let name = &node.name;
        let dir = node.dir().join("kubelet");
        std::fs::create_dir_all(&dir)?;
        let (cert, key) = self.ca.sign(
            &format!("kubelet-{name}"),
            &format!("/O=system:nodes/CN=system:node:{name}"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )?;
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            json!({"server": self.apiserver_url, "certificate-authority": self.ca.cert}),
            json!({"client-certificate": cert, "client-key": key}),
            None,
        )?;
        // The sandbox image is there before the first pod, as on a provisioned node.
        node.import(&self.sandbox_archive, SANDBOX_IMAGE)?;
        std::fs::create_dir_all(sandbox.host_path("/var/lib/kubelet/manifests"))?;

        let ip = network.add_node_ip()?;
        write_pod_network(node, ip)?;
        let mut command = sandbox.command(cached_binary("kubelet")?);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "--container-runtime=remote",
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                // What this machine lacks or the lab does not want the kubelet to touch: swap, QoS
                // cgroups and node allocatable enforcement, the systemd cgroup driver, iptables.
                "--fail-swap-on=false",
                "--cgroups-per-qos=false",
                "--enforce-node-allocatable=",
                "--cgroup-driver=cgroupfs",
                "--make-iptables-util-chains=false",
                // The lab's nodes share this machine's disk: its free share is not theirs to judge, and a
                // pod evicted for DiskPressure would fail a test for another test's files.
                "--eviction-hard=nodefs.available<1%,imagefs.available<1%",
                "--root-dir=/var/lib/kubelet",
                "--cert-dir=/var/lib/kubelet/pki",
                "--volume-plugin-dir=/var/lib/kubelet/volumeplugins",
                "--pod-manifest-path=/var/lib/kubelet/manifests",
                "--read-only-port=0",
                "--healthz-port=0",
                "--port=10250",
            ])
            .arg(format!("--hostname-override={name}"))
            .arg(format!("--node-ip={ip}"))
            .arg(format!("--address={ip}"))
            // Which image the kubelet's image garbage collection spares.
            .arg(format!("--pod-infra-container-image={SANDBOX_IMAGE}"));
        if !spec.labels.is_empty() {
            let labels: Vec<String> = spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            command.arg(format!("--node-labels={}", labels.join(",")));
        }
        if !spec.taints.is_empty() {
            command.arg(format!("--register-with-taints={}", spec.taints.join(",")));
        }
        let log = node.dir().join("kubelet.log");
        let process = match Proc::spawn_group(&format!("kubelet ({name})"), command, &log) {
            Ok(process) => process,
            Err(e) => {
                let _ = network.remove_node_ip(ip);
                return Err(e);
            }
        };
        self.kubelets.push(Kubelet {
            node: name.clone(),
            ip,
            process,
        });
        Ok(())
    }

    /// Returns once node `name`'s kubelet has registered its Node, with its runtime's version.
    pub(crate) fn wait_registered(&mut self, name: &str) -> Result<()> {
        let kubelet = self
            .kubelets
            .iter_mut()
            .find(|k| k.node == name)
            .with_context(|| format!("node {name} has no kubelet"))?;
        let agent = http::agent();
        let url = format!("{}/api/v1/nodes/{name}", self.apiserver_url);
        let token = &self.admin_token;
        kubelet
            .process
            .wait_ready(Duration::from_secs(60), || registered(&agent, &url, token))
    }

    /// Stops node `name`'s kubelet and takes its address away; returns its address, if it had a kubelet.
    pub(crate) fn stop_kubelet(&mut self, name: &str, network: &LabNetwork) -> Option<Ipv4Addr> {
        let at = self.kubelets.iter().position(|k| k.node == name)?;
        let mut kubelet = self.kubelets.remove(at);
        stop_all(std::slice::from_mut(&mut kubelet.process));
        if let Err(e) = network.remove_node_ip(kubelet.ip) {
            eprintln!("lab: {e:#}");
        }
        Some(kubelet.ip)
    }

    /// Deletes the Node object `name`, as `kubectl delete node` does.
    pub(crate) fn delete_node(&self, name: &str) -> Result<()> {
        let response = http::agent()
            .delete(format!("{}/api/v1/nodes/{name}", self.apiserver_url))
            .header("Authorization", format!("Bearer {}", self.admin_token))
            .call()?;
        anyhow::ensure!(
            matches!(response.status().as_u16(), 200 | 404),
            "deleting Node {name}: HTTP {}",
            response.status()
        );
        Ok(())
    }

    /// The cluster's CA certificate: what pods find in their ServiceAccount's `ca.crt`, and what the
    /// admin's kubeconfig trusts.
    pub fn ca_cert(&self) -> &Path {
        &self.ca.cert
    }

    /// The admin's kubeconfig (token, trusting the cluster's CA).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Node `name`'s address (its kubelet's and its hostNetwork pods'), if it runs a kubelet.
    pub fn node_ip(&self, name: &str) -> Option<Ipv4Addr> {
        self.kubelets.iter().find(|k| k.node == name).map(|k| k.ip)
    }

    /// What a pod of ServiceAccount `namespace/name` finds: the API server's URL, the cluster's CA and
    /// the account's token: its static one if [`ClusterConfig::service_account_tokens`] named it (usable
    /// before the ServiceAccount even exists), else that of the token Secret the controller manager mints
    /// for the ServiceAccount (waited for, up to a minute).
    pub fn in_cluster_view(&self, namespace: &str, name: &str) -> Result<InClusterView> {
        let token = match self
            .service_account_tokens
            .iter()
            .find(|(ns, n, _)| ns == namespace && n == name)
        {
            Some((_, _, token)) => token.clone(),
            None => self.minted_token(namespace, name)?,
        };
        Ok(InClusterView {
            server: self.apiserver_url.clone(),
            ca_pem: std::fs::read_to_string(&self.ca.cert)?,
            token,
            namespace: namespace.to_owned(),
        })
    }

    /// Writes a kubeconfig at `path` that acts as ServiceAccount `namespace/name`
    /// ([`KubeCluster::in_cluster_view`]), for `--kubeconfig` of a process run outside a pod.
    pub fn write_in_cluster_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<()> {
        self.in_cluster_view(namespace, name)?
            .write_kubeconfig(path)
    }

    /// The token of the token Secret of ServiceAccount `namespace/name`, once the controller manager has
    /// minted it.
    fn minted_token(&self, namespace: &str, name: &str) -> Result<String> {
        let url = format!(
            "{}/api/v1/namespaces/{namespace}/secrets?fieldSelector=type%3Dkubernetes.io%2Fservice-account-token",
            self.apiserver_url
        );
        let agent = http::agent_trusting(&self.ca.cert)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let body = agent
                .get(&url)
                .header("Authorization", format!("Bearer {}", self.admin_token))
                .call()?
                .body_mut()
                .read_to_string()?;
            let secrets: serde_json::Value = serde_json::from_str(&body)?;
            let minted = secrets["items"].as_array().into_iter().flatten().find(|s| {
                s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == name
            });
            if let Some(token) = minted.and_then(|s| s["data"]["token"].as_str()) {
                return Ok(String::from_utf8(BASE64.decode(token)?)?);
            }
            if Instant::now() >= deadline {
                bail!("no token Secret for ServiceAccount {namespace}/{name} after a minute");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// What a pod of a ServiceAccount finds: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` and
/// the files of `/var/run/secrets/kubernetes.io/serviceaccount/`.
#[derive(Clone, Debug)]
pub struct InClusterView {
    /// `https://10.77.N.1:443`, reached from the host through the lab's veth.
    pub server: String,
    /// `ca.crt`: the cluster's CA (PEM), which verifies the API server's certificate for that address.
    pub ca_pem: String,
    /// `token`
    pub token: String,
    /// `namespace`
    pub namespace: String,
}

impl InClusterView {
    /// Writes a kubeconfig saying the same (CA inline, token, default namespace) at `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        write_kubeconfig(
            path,
            json!({"server": self.server, "certificate-authority-data": BASE64.encode(&self.ca_pem)}),
            json!({"token": self.token}),
            Some(&self.namespace),
        )
    }
}

/// Writes at `path` a kubeconfig of one context: the `cluster` entry (the server and how to trust it) and
/// the `user` entry (credentials), in `namespace` if given.
fn write_kubeconfig(
    path: &Path,
    cluster: serde_json::Value,
    user: serde_json::Value,
    namespace: Option<&str>,
) -> Result<()> {
    let mut context = json!({"cluster": "lab", "user": "lab"});
    if let Some(namespace) = namespace {
        context["namespace"] = namespace.into();
    }
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": cluster}],
        "users": [{"name": "lab", "user": user}],
        "contexts": [{"name": "lab", "context": context}],
        "current-context": "lab",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&kubeconfig)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The pod network of `node`, whose address is `ip` (`10.77.N.H`): a bridge `pbrH` of its own in the
/// lab's namespace, the gateway of the pods' subnet `10.244.H.0/24`. Pods reach the lab's addresses (the
/// API server's among them) through it and the lab routes back to them; nothing is masqueraded. Written
/// whole under a temporary name, then renamed: containerd watches the directory.
fn write_pod_network(node: &Node, ip: Ipv4Addr) -> Result<()> {
    let host = ip.octets()[3];
    let config = json!({
        "cniVersion": "0.4.0",
        "name": "lab-pods",
        "plugins": [{
            "type": "bridge",
            "bridge": format!("pbr{host}"),
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("10.244.{host}.0/24")}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    let dir = node.cni_conf_dir();
    let (partial, path) = (dir.join("pods.partial"), dir.join("10-pods.conflist"));
    std::fs::write(&partial, serde_json::to_vec_pretty(&config)?)?;
    std::fs::rename(&partial, &path)?;
    Ok(())
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        let mut processes: Vec<Proc> = self.kubelets.drain(..).map(|k| k.process).collect();
        processes.append(&mut self.controllers);
        stop_all(&mut processes);
    }
}

/// Whether Node `url` exists and says which container runtime its kubelet found.
fn registered(agent: &ureq::Agent, url: &str, token: &str) -> bool {
    let Ok(mut response) = agent
        .get(url)
        .header("Authorization", format!("Bearer {token}"))
        .call()
    else {
        return false;
    };
    if response.status() != 200 {
        return false;
    }
    let Ok(node) = response
        .body_mut()
        .read_to_string()
        .map(|body| serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default())
    else {
        return false;
    };
    node["status"]["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .is_some_and(|version| !version.is_empty())
}

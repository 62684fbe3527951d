//! A plain Kubernetes cluster lab with pinboard's agents: the manifests `pinboard agent manifests` prints,
//! applied to the lab's API server; on the node labelled for it, the agent runs as a real pod of that
//! DaemonSet under its kubelet, from an image of the test's own pinboard binary; on the others, as a
//! process started exactly as its pod would run: the same arguments and environment, the
//! ServiceAccount's identity, in the node's namespaces, where it sees the paths the pod mounts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use pinboard::model::readiness::Readiness;
use serde_json::{Value, json};

use super::binary;
use super::cluster::{client, kubeconfig_with_viewer};
use super::kube_objects::{PodState, apply_yaml, wait_for, wait_for_daemonset_pod};
use super::process::Proc;
use super::{ClusterConfig, Lab, LabConfig, NodeSpec, RegistrySetup, Run, pinboard_with};

pub const NAMESPACE: &str = "pinboard-system";
pub const ACCOUNT: &str = "pinboard-agent";
pub const DAEMONSET: &str = "pinboard-agent-containerd";
/// The label that puts the DaemonSet's pod on a node.
pub const POD_LABEL: &str = "pinboard.dev/agent-pod";
/// The DaemonSet's image when no test pod is to run: a name nothing resolves, so a pod made anyway (on a
/// node labelled for it later) fails to pull it.
const NO_IMAGE: &str = "unused.invalid/pinboard:none";
/// Short, so that a stopped agent is stale within seconds (its Lease stands for four of these).
pub const HEARTBEAT: &str = "1s";
/// How long an agent may take to take the cache's role.
const CACHE_WAIT: Duration = Duration::from_secs(180);

/// A cluster lab whose nodes run pinboard's agent.
pub struct AgentsLab {
    pub lab: Lab,
    pub admin: kube::Client,
    /// The ServiceAccount's kubeconfig, as a pod of the DaemonSet would have it.
    agent_kubeconfig: PathBuf,
    /// The agents running as processes, by node.
    processes: BTreeMap<String, Proc>,
    /// Arguments every agent process gets on top, `{node}`, `{lab}` and `{proxy}` replaced by its node's
    /// name, the lab's directory and the registry proxy's host.
    agent_args: Vec<String>,
    /// How often every agent renews its heartbeat: [`HEARTBEAT`], unless `agent_args` say
    /// `--heartbeat-every=DURATION`.
    heartbeat: String,
    /// Every agent's `--min-free`.
    min_free: &'static str,
}

/// How a lab's agents run, beyond what every agent gets.
#[derive(Clone, Debug)]
pub struct AgentsSetup {
    /// Arguments every agent process gets on top (see [`AgentsLab::agent_args`]).
    pub agent_args: Vec<String>,
    pub registry: RegistrySetup,
    /// The agents' free-space floor, `--min-free`: the lab's nodes are small (the default, 16 GiB, is a
    /// real node's).
    pub min_free: &'static str,
}

impl Default for AgentsSetup {
    fn default() -> Self {
        AgentsSetup {
            agent_args: Vec::new(),
            registry: RegistrySetup::default(),
            min_free: "4Mi",
        }
    }
}

impl AgentsLab {
    /// Starts the lab with `nodes`, installs the agents' manifests, and runs the agent as a pod on
    /// `pod_node` (when given; its image is pushed first) and as a process on every other node.
    pub async fn start(name: &str, nodes: Vec<NodeSpec>, pod_node: Option<&str>) -> AgentsLab {
        AgentsLab::start_with(name, nodes, pod_node, AgentsSetup::default()).await
    }

    /// [`AgentsLab::start`] with every agent process taking the registry through its proxy too (images
    /// referenced by the proxy's host, so that what the nodes pull is counted there).
    pub async fn through_proxy(name: &str, nodes: Vec<NodeSpec>) -> AgentsLab {
        let setup = AgentsSetup {
            agent_args: vec!["--insecure-registry={proxy}".into()],
            ..AgentsSetup::default()
        };
        AgentsLab::start_with(name, nodes, None, setup).await
    }

    /// Starts `spec` as a node of the lab without a kubelet (its runtime on this host: the real CRI-O, or
    /// containerd 2, which the lab's kubelet cannot use), registers its Node by hand, as a kubelet would,
    /// and starts its agent on this host with the node's arguments and `extra`.
    pub async fn add_host_node(&mut self, spec: NodeSpec, extra: &[String]) {
        let name = spec.name.clone();
        let mut args = self
            .lab
            .add_node(spec.without_kubelet())
            .unwrap_or_else(|e| panic!("node {name}: {e:#}"))
            .node_args();
        args.extend(extra.iter().cloned());
        let object: NodeObject =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<NodeObject>::all(self.admin.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("Node {name}: {e}"));
        self.start_agent_on_host(&name, &args);
    }

    /// [`AgentsLab::start`], the agents run as `setup` says (`--heartbeat-every=DURATION` among its
    /// `agent_args` replaces the lab's short heartbeat).
    pub async fn start_with(
        name: &str,
        nodes: Vec<NodeSpec>,
        pod_node: Option<&str>,
        setup: AgentsSetup,
    ) -> AgentsLab {
        let AgentsSetup {
            agent_args,
            registry,
            min_free,
        } = setup;
        pinboard::install_crypto_provider();
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let lab = Lab::start(
            name,
            LabConfig {
                nodes,
                cluster: Some(ClusterConfig {
                    service_account_tokens: vec![(NAMESPACE.to_owned(), ACCOUNT.to_owned())],
                }),
                registry,
                ..LabConfig::default()
            },
        )
        .expect("the cluster lab must start");
        let cluster = lab.cluster().expect("a cluster lab");
        let admin = client(cluster.kubeconfig(), None).await;
        let agent_kubeconfig = lab.dir().join("agent-kubeconfig");
        cluster
            .write_in_cluster_kubeconfig(NAMESPACE, ACCOUNT, &agent_kubeconfig)
            .expect("the agents' kubeconfig");
        let image = match pod_node {
            Some(_) => agent_image(&lab),
            None => NO_IMAGE.to_owned(),
        };
        let (heartbeat, agent_args): (Vec<String>, Vec<String>) = agent_args
            .into_iter()
            .partition(|a| a.starts_with("--heartbeat-every="));
        let heartbeat = heartbeat
            .last()
            .map_or(HEARTBEAT, |a| a.trim_start_matches("--heartbeat-every="));
        let mut agents = AgentsLab {
            heartbeat: heartbeat.to_owned(),
            lab,
            admin,
            agent_kubeconfig,
            processes: BTreeMap::new(),
            agent_args,
            min_free,
        };
        agents.install(&image).await;
        for node in &names {
            match Some(node.as_str()) == pod_node {
                true => agents.run_pod(node).await,
                false => agents.start_agent(node),
            }
        }
        agents
    }

    /// Applies the manifests `pinboard agent manifests` prints for the agent's `image`, its DaemonSet on the
    /// nodes labelled [`POD_LABEL`], every agent with the lab's registry and the short heartbeat.
    async fn install(&self, image: &str) {
        let mut args = vec![
            "agent".to_string(),
            "manifests".into(),
            "--image".into(),
            image.into(),
            "--node-selector".into(),
            format!("{POD_LABEL}=true"),
            format!(
                "--agent-arg=--insecure-registry={}",
                self.lab.registry_host()
            ),
            format!("--agent-arg=--heartbeat-every={}", self.heartbeat),
            format!("--agent-arg=--min-free={}", self.min_free),
        ];
        // Agents started with the gate need its rights: the manifests' own `--gate`.
        if self.agent_args.iter().any(|a| a == "--gate") {
            args.push("--gate".into());
        }
        let manifests = pinboard_with(args, |_| {});
        assert_eq!(manifests.code, 0, "{}", manifests.stderr);
        apply_yaml(&self.admin, &manifests.stdout).await;
    }

    /// Installs the manifests again with the agent's image of this build, as an administrator fixing the
    /// DaemonSet's image would: the DaemonSet replaces its pods, which then run the agent.
    pub async fn install_this_build(&self) {
        self.install(&agent_image(&self.lab)).await;
    }

    /// Labels `node` for the DaemonSet and waits for its pod to run.
    async fn run_pod(&self, node: &str) {
        let nodes: Api<NodeObject> = Api::all(self.admin.clone());
        let label = json!({"metadata": {"labels": {POD_LABEL: "true"}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        wait_for_daemonset_pod(&self.admin, NAMESPACE, DAEMONSET, node, PodState::Running).await;
    }

    /// Starts `node`'s agent as a process, as the DaemonSet's pod would run: its arguments, `NODE_NAME`
    /// and `POD_NAMESPACE`, the ServiceAccount's token, in the node's namespaces.
    pub fn start_agent(&mut self, node: &str) {
        self.start_agent_with(node, &[]);
    }

    /// [`Self::start_agent`], with `extra` arguments.
    pub fn start_agent_with(&mut self, node: &str, extra: &[&str]) {
        let sandbox = self.lab.node(node).sandbox().expect("a cluster node");
        let mut command = sandbox.command(binary());
        command.args([
            "agent",
            "--cri",
            "unix:///run/containerd/containerd.sock",
            "--registry-config-dir",
            "/etc/containerd/certs.d",
        ]);
        command.args(extra);
        self.spawn_agent(node, command);
    }

    /// Starts an agent for `node` as a process of this host, its runtime named by `runtime_args` (a CRI-O
    /// stand-in's, say: it runs on the host).
    pub fn start_agent_on_host(&mut self, node: &str, runtime_args: &[String]) {
        let mut command = std::process::Command::new(binary());
        command.arg("agent").args(runtime_args);
        self.spawn_agent(node, command);
    }

    /// Runs `command` (`pinboard agent` and its runtime's arguments) as `node`'s agent, as the DaemonSet's
    /// pod would run: its arguments, `NODE_NAME` and `POD_NAMESPACE`, the ServiceAccount's token, and no
    /// system CA certificates (the agent's image has none).
    fn spawn_agent(&mut self, node: &str, mut command: std::process::Command) {
        let no_cas = self.lab.dir().join("no-system-cas");
        std::fs::create_dir_all(&no_cas).expect("an empty directory");
        command
            .env("SSL_CERT_DIR", &no_cas)
            .env("SSL_CERT_FILE", no_cas.join("none.pem"))
            .args([
                "--insecure-registry",
                &self.lab.registry_host(),
                "--heartbeat-every",
                &self.heartbeat,
                "--min-free",
                self.min_free,
                "--kubeconfig",
            ])
            .arg(&self.agent_kubeconfig)
            .args(self.agent_args.iter().map(|a| {
                a.replace("{node}", node)
                    .replace("{lab}", &self.lab.dir().display().to_string())
                    .replace("{proxy}", &self.lab.proxy_host())
            }))
            .env("NODE_NAME", node)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("PINBOARD_LOG", "info");
        let log = self.lab.dir().join(format!("agent-{node}.log"));
        let proc =
            Proc::spawn_group(&format!("agent-{node}"), command, &log).expect("the agent starts");
        self.processes.insert(node.to_owned(), proc);
    }

    /// Runs `kubectl ARGS` as the cluster's administrator; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let kubectl = super::apiserver::cached_binary("kubectl").expect("kubectl");
        let cluster = self.lab.cluster().expect("a cluster lab");
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .args(args)
            .output()
            .expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?}: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills `node`'s agent process.
    pub fn stop_agent(&mut self, node: &str) {
        if let Some(mut proc) = self.processes.remove(node) {
            proc.kill().expect("the agent stops");
        }
    }

    /// Waits for an agent to hold the cache's Lease; its holder (a node) and its address.
    pub async fn cache_holder(&self) -> (String, String) {
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), NAMESPACE);
        wait_for("the cache's Lease", CACHE_WAIT, || async {
            let lease = leases.get_opt("pinboard-cache").await.ok().flatten();
            let holder = lease
                .as_ref()
                .and_then(|l| l.spec.as_ref()?.holder_identity.clone());
            let address = lease.as_ref().and_then(|l| {
                l.metadata
                    .annotations
                    .as_ref()?
                    .get("pinboard.dev/cache-address")
                    .cloned()
            });
            holder
                .zip(address)
                .ok_or_else(|| "no holder yet".to_string())
        })
        .await
    }

    /// Every object of pinboard's `kind` (its resource `plural`), as JSON.
    pub async fn objects(&self, kind: &str, plural: &str) -> Vec<Value> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("pinboard.dev", "v1alpha1", kind),
            plural,
        );
        let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), &resource);
        api.list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list {plural}: {e}"))
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect()
    }

    /// The PinboardNode reports.
    pub async fn reports(&self) -> Vec<Value> {
        self.objects("PinboardNode", "pinboardnodes").await
    }

    /// Runs `pinboard COMMAND` on the cluster as its administrator, reaching the lab's registry; the
    /// floors are the agents' own, as they report them.
    pub fn pinboard(&self, args: &[&str]) -> Run {
        let cluster = self.lab.cluster().expect("a cluster lab");
        self.pinboard_as(cluster.kubeconfig(), None, args)
    }

    /// `pinboard apply --set SET --timeout TIMEOUT EXTRA…`, the lab's proxy an insecure registry too (the
    /// images' references name it).
    pub fn apply(&self, set: &Path, timeout: &str, extra: &[&str]) -> Run {
        let proxy = self.lab.proxy_host();
        let set = set.to_str().expect("a UTF-8 path");
        let mut args = vec![
            "apply",
            "--insecure-registry",
            &proxy,
            "--set",
            set,
            "--timeout",
            timeout,
        ];
        args.extend(extra);
        self.pinboard(&args)
    }

    /// [`Self::pinboard`] as the lab's `viewer` user, granted what the test bound to it
    /// ([`super::cluster::bind_viewer`]).
    pub fn pinboard_as_viewer(&self, args: &[&str]) -> Run {
        self.pinboard_as(&kubeconfig_with_viewer(&self.lab), Some("viewer"), args)
    }

    fn pinboard_as(&self, kubeconfig: &Path, context: Option<&str>, args: &[&str]) -> Run {
        let (command, rest) = args.split_first().expect("a command");
        let mut all: Vec<String> = vec![command.to_string(), "--kubeconfig".into()];
        all.push(kubeconfig.display().to_string());
        if let Some(context) = context {
            all.extend(["--context".into(), context.into()]);
        }
        all.extend(["--insecure-registry".into(), self.lab.registry_host()]);
        all.extend(rest.iter().map(|a| a.to_string()));
        pinboard_with(all, |_| {})
    }

    /// `pinboard check -o json ARGS`: its exit code, the readiness it printed, and its stderr.
    pub fn check(&self, args: &[&str]) -> (i32, Readiness, String) {
        let mut all = vec!["check", "-o", "json"];
        all.extend(args);
        let run = self.pinboard(&all);
        let parsed = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("check -o json ({e}): {}\n{}", run.stdout, run.stderr));
        (run.code, parsed, run.stderr)
    }

    /// A PinSet file named `name` listing `images` (and `extra` YAML under its spec), in the lab's dir.
    pub fn set_file(&self, name: &str, images: &[&str], extra: &str) -> PathBuf {
        let path = self.lab.dir().join(format!("{name}.yaml"));
        let listed: String = images.iter().map(|i| format!("  - name: {i}\n")).collect();
        std::fs::write(
            &path,
            format!(
                "apiVersion: pinboard.dev/v1alpha1\nkind: PinSet\nmetadata:\n  name: {name}\nspec:\n  \
                 pinnedImages:\n{listed}{extra}"
            ),
        )
        .unwrap();
        path
    }
}

impl Drop for AgentsLab {
    fn drop(&mut self) {
        let nodes: Vec<String> = self.processes.keys().cloned().collect();
        for node in nodes {
            self.stop_agent(&node);
        }
    }
}

/// The test's pinboard binary, stripped of its debug information (half its size), as an image.
fn agent_image(lab: &Lab) -> String {
    let stripped = lab.dir().join("pinboard");
    let status = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(binary())
        .status()
        .expect("strip runs");
    assert!(status.success(), "strip {}", binary().display());
    lab.push_binary_image(Path::new(&stripped), "pinboard/agent")
        .expect("the agent's image is pushed")
}

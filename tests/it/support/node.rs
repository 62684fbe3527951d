//! A lab node: one real containerd (with its CRI plugin) whose root is a size-limited tmpfs, so each node
//! has an image filesystem of its own size. Its config, log and state live in `<lab>/nodes/<name>/`.
//!
//! A cluster lab's node runs its containerd in a [`NodeSandbox`] (with the kubelet the cluster starts beside
//! it), at the standard paths (root `/var/lib/containerd`, socket `/run/containerd/containerd.sock`, registry
//! config `/etc/containerd/certs.d`), configured as a kubelet needs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cri::{self, CriImage};
use super::crio_node::{self, CrioFiles};
use super::lab::mount_tmpfs;
use super::network::LabNetwork;
use super::node_sandbox::{self, CONTAINERD_ROOT, NodeSandbox, RUNC_ROOT};
use super::pki::SitePki;
use super::process::{Proc, run};
use super::runtime::Runtime;
use super::stargz::{Stargz, StargzEnv};
use super::unit::Unit;

/// Unix socket paths are limited to 108 bytes, and containerd adds `.ttrpc` to its socket path.
const MAX_SOCKET_PATH: usize = 100;

/// A node to start: its name and the size of its image filesystem (a tmpfs) in bytes.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub imagefs_bytes: u64,
    /// containerd's CRI plugin configured the deprecated way: `registry.mirrors` in its config, no
    /// `config_path` (so no hosts.toml is read).
    pub without_config_path: bool,
    /// containerd's config imports `<node>/conf.d/*.toml`, as a site's drop-in directory.
    pub imports_conf_d: bool,
    /// Where containerd serves its Prometheus metrics (`[metrics] address`), e.g. its gRPC calls by method.
    pub metrics_address: Option<String>,
    /// In a cluster lab, the labels its kubelet registers its Node with (`--node-labels`).
    pub labels: Vec<(String, String)>,
    /// stargz-snapshotter runs beside its containerd ([`Stargz`]); a plain lab's containerd then runs as
    /// systemd runs its unit, restarted by `systemctl restart containerd` ([`Unit`]).
    pub stargz: bool,
    /// In a cluster lab, the taints its kubelet registers its Node with (`--register-with-taints`),
    /// `KEY=VALUE:EFFECT`.
    pub taints: Vec<String>,
    /// Its runtime; None: the lab's default ([`Runtime::default_for`]).
    pub runtime: Option<Runtime>,
    /// In a cluster lab, runs no kubelet: its runtime is a process of this host, as a CRI-O node always
    /// is, and its Node is made by hand ([`super::agents::AgentsLab::add_host_node`]).
    pub without_kubelet: bool,
}

impl NodeSpec {
    pub fn new(name: &str, imagefs_bytes: u64) -> NodeSpec {
        NodeSpec {
            name: name.to_owned(),
            imagefs_bytes,
            without_config_path: false,
            imports_conf_d: false,
            metrics_address: None,
            labels: Vec::new(),
            stargz: false,
            taints: Vec::new(),
            runtime: None,
            without_kubelet: false,
        }
    }

    /// In a cluster lab, the node without a kubelet (its runtime on this host): for a runtime the lab's
    /// kubelet 1.20 cannot use, such as containerd 2.
    pub fn without_kubelet(mut self) -> NodeSpec {
        self.without_kubelet = true;
        self
    }

    /// Whether a cluster lab starts a kubelet beside it.
    pub(crate) fn has_kubelet(&self) -> bool {
        !self.without_kubelet && !self.runtime.is_some_and(Runtime::is_crio)
    }

    /// The node running `runtime` rather than the lab's default.
    pub fn on(mut self, runtime: Runtime) -> NodeSpec {
        self.runtime = Some(runtime);
        self
    }

    /// The node with stargz-snapshotter beside its containerd (not yet in containerd's config: `pinboard
    /// lazy on` puts it there), its containerd importing `<node>/conf.d/*.toml` and, in a plain lab,
    /// restarted by the `systemctl` of [`Node::unit`].
    pub fn with_stargz(mut self) -> NodeSpec {
        self.stargz = true;
        self.imports_conf_d = true;
        self
    }

    /// The node's containerd serving its metrics at `address` (`HOST:PORT`): [`Node::grpc_calls`].
    pub fn serving_metrics(mut self, address: &str) -> NodeSpec {
        self.metrics_address = Some(address.to_owned());
        self
    }

    /// In a cluster lab, the Node registered with the taint `taint` (`KEY=VALUE:EFFECT`), as a node an
    /// autoscaler makes with a startup taint.
    pub fn tainted(mut self, taint: &str) -> NodeSpec {
        self.taints.push(taint.to_owned());
        self
    }

    /// In a cluster lab, the Node registered with label `key=value` from the start, as a provisioned node
    /// joins labelled.
    pub fn labelled(mut self, key: &str, value: &str) -> NodeSpec {
        self.labels.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The node's containerd config importing `<node>/conf.d/*.toml`.
    pub fn importing_conf_d(mut self) -> NodeSpec {
        self.imports_conf_d = true;
        self
    }

    /// The node's containerd without a registry `config_path`, reaching the registries through
    /// `registry.mirrors` endpoints in its config instead.
    pub fn without_config_path(mut self) -> NodeSpec {
        self.without_config_path = true;
        self
    }
}

/// A running containerd node.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    /// What it runs.
    pub runtime: Runtime,
    /// The containerd socket, serving both containerd's API and CRI.
    pub socket: PathBuf,
    /// containerd's root directory: the node's tmpfs.
    pub root: PathBuf,
    pub imagefs_bytes: u64,
    /// containerd's config file, for starting it again.
    config: PathBuf,
    /// Its registry `config_path`, as the lab sees it.
    certs: PathBuf,
    /// A cluster node's namespaces.
    sandbox: Option<NodeSandbox>,
    /// Its stargz-snapshotter, when it runs one.
    stargz: Option<Stargz>,
    /// How a plain node with stargz runs its containerd, for `systemctl restart containerd`.
    unit: Option<Unit>,
    /// A CRI-O node's files.
    crio: Option<CrioFiles>,
    /// Where containerd serves its metrics, when it does.
    metrics_address: Option<String>,
}

/// What a node needs from the lab to start.
#[derive(Clone, Copy)]
pub(crate) struct NodeEnv<'a> {
    pub(crate) lab_dir: &'a Path,
    /// Registry hosts (`127.0.0.1:PORT`) the node pulls from.
    pub(crate) registry_hosts: &'a [&'a str],
    /// `http` or `https`.
    pub(crate) scheme: &'a str,
    /// The site CA the registry's certificate comes from (`ca = ` in hosts.toml), for HTTPS.
    pub(crate) pki: Option<&'a SitePki>,
    /// Whether the node presents the site's client certificate (`client = ` in hosts.toml).
    pub(crate) client_certificate: bool,
    /// Where to put the socket if the path under the lab dir is too long for a unix socket.
    pub(crate) short_socket_dir: &'a Path,
    /// Set in a cluster lab.
    pub(crate) cluster: Option<ClusterNodeEnv<'a>>,
}

/// What a cluster lab's node needs besides.
#[derive(Clone, Copy)]
pub(crate) struct ClusterNodeEnv<'a> {
    pub(crate) network: &'a LabNetwork,
    /// The pod sandbox ("pause") image, in the lab registry.
    pub(crate) sandbox_image: &'a str,
}

/// The standard paths a cluster node's containerd is configured with (in its [`NodeSandbox`]).
const STANDARD_SOCKET: &str = "/run/containerd/containerd.sock";
const STANDARD_STATE: &str = "/run/containerd";
const STANDARD_CERTS: &str = "/etc/containerd/certs.d";
/// Where Debian's containernetworking-plugins are.
const CNI_PLUGINS: &str = "/usr/lib/cni";

impl Node {
    /// Mounts the node's tmpfs (recorded in `mounts` at once, for unmounting) and starts its containerd
    /// (added to `procs` before it is waited on), returning once containerd and its CRI plugin answer.
    pub(crate) fn start(
        spec: &NodeSpec,
        env: &NodeEnv<'_>,
        procs: &mut Vec<Proc>,
        mounts: &mut Vec<PathBuf>,
    ) -> Result<Node> {
        if !spec.has_kubelet() && env.cluster.is_some() {
            let plain = NodeEnv {
                cluster: None,
                ..*env
            };
            return Node::start(spec, &plain, procs, mounts);
        }
        let runtime = match spec.runtime {
            Some(runtime) => runtime,
            None => Runtime::default_for(env.cluster.is_some())?,
        };
        if env.cluster.is_some() && !runtime.serves_kubelet_1_20() {
            bail!(
                "node {}: the lab's kubelet 1.20 speaks only CRI v1alpha2, which {runtime} does not serve; \
                 run a cluster lab's nodes on containerd 1.6 or 1.7",
                spec.name
            );
        }
        runtime.bin_dir()?;
        if runtime.is_crio() {
            return Node::start_crio(spec, env, procs, mounts);
        }
        let dir = env.lab_dir.join("nodes").join(&spec.name);
        let root = dir.join("root");
        let paths = ContainerdPaths::new(&dir, env, &spec.name)?;
        std::fs::create_dir_all(&root)?;
        for host in env.registry_hosts {
            let host_dir = paths.certs.join(host);
            std::fs::create_dir_all(&host_dir)?;
            let scheme = env.scheme;
            let mut text = format!(
                "server = \"{scheme}://{host}\"\n\n[host.\"{scheme}://{host}\"]\n  \
                 capabilities = [\"pull\", \"resolve\"]\n"
            );
            // What an administrator writes for a registry signed by the site's CA.
            if let Some(pki) = env.pki {
                text.push_str(&format!("  ca = \"{}\"\n", pki.ca.display()));
                if env.client_certificate {
                    text.push_str(&format!(
                        "  client = [[\"{}\", \"{}\"]]\n",
                        pki.client_cert.display(),
                        pki.client_key.display()
                    ));
                }
            }
            std::fs::write(host_dir.join("hosts.toml"), text)?;
        }

        mount_tmpfs(&root, spec.imagefs_bytes)?;
        mounts.push(root.clone());
        // After the tmpfs is mounted: the sandbox's mount namespace is a copy of the host's.
        let sandbox = match &env.cluster {
            Some(cluster) => Some(NodeSandbox::create(&dir, &root, cluster.network)?),
            None => None,
        };

        // containerd 2's CRI image settings are a plugin of their own in its config version 3.
        let images_plugin = match runtime.containerd_config_version() {
            3 => "io.containerd.cri.v1.images",
            _ => "io.containerd.grpc.v1.cri",
        };
        let registry = if spec.without_config_path {
            env.registry_hosts
                .iter()
                .map(|host| {
                    format!(
                        "    [plugins.\"{images_plugin}\".registry.mirrors.\"{host}\"]\n      \
                         endpoint = [\"http://{host}\"]\n"
                    )
                })
                .collect()
        } else {
            format!(
                "    config_path = \"{}\"\n",
                paths.certs_in_config.display()
            )
        };
        let (root_in_config, cri, runtimes) = match &env.cluster {
            Some(cluster) => {
                let (cri, runtimes) = kubelet_cri_config(&dir, cluster.sandbox_image)?;
                (PathBuf::from(CONTAINERD_ROOT), cri, runtimes)
            }
            None => (root.clone(), String::new(), String::new()),
        };
        let config = dir.join("config.toml");
        let imports = match spec.imports_conf_d {
            true => format!("imports = [\"{}/*.toml\"]\n", dir.join("conf.d").display()),
            false => String::new(),
        };
        let metrics = match &spec.metrics_address {
            Some(address) => format!("\n[metrics]\n  address = \"{address}\"\n"),
            None => String::new(),
        };
        let images = match runtime.containerd_config_version() {
            // `ctr images pull` goes through the transfer service, which unpacks only for the snapshotters
            // it is told of.
            3 => format!(
                r#"
[plugins."{images_plugin}"]
  snapshotter = "native"
  [plugins."{images_plugin}".registry]
{registry}
[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/amd64"
    snapshotter = "native"
"#
            ),
            _ => format!(
                r#"{cri}  [plugins."{images_plugin}".containerd]
    snapshotter = "native"
{runtimes}  [plugins."{images_plugin}".registry]
{registry}"#
            ),
        };
        std::fs::write(
            &config,
            format!(
                r#"version = {version}
{imports}root = "{root}"
state = "{state}"
# Only the native snapshotter is used; skip probing the others.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  # A free port rather than the default 10010, so several nodes can run side by side.
  stream_server_port = "0"
{images}{metrics}"#,
                version = runtime.containerd_config_version(),
                root = root_in_config.display(),
                state = paths.state_in_config.display(),
                socket = paths.socket_in_config.display(),
            ),
        )?;
        let stargz = match spec.stargz {
            true => Some(Stargz::prepare(&StargzEnv {
                node_dir: &dir,
                node: &spec.name,
                containerd_root: &root,
                containerd_root_in_node: &root_in_config,
                containerd_socket_in_node: &paths.socket_in_config,
                registry_hosts: env.registry_hosts,
                plain_http: env.scheme == "http",
                short_socket_dir: env.short_socket_dir,
                sandbox: sandbox.as_ref(),
            })?),
            false => None,
        };
        let unit = match (spec.stargz, &sandbox) {
            (true, None) => Some(Unit::write(&dir, &paths.socket, runtime)?),
            _ => None,
        };
        let node = Node {
            name: spec.name.clone(),
            runtime,
            socket: paths.socket,
            root,
            imagefs_bytes: spec.imagefs_bytes,
            config,
            certs: paths.certs,
            sandbox,
            stargz,
            unit,
            crio: None,
            metrics_address: spec.metrics_address.clone(),
        };
        if let Some(stargz) = &node.stargz {
            procs.push(stargz.spawn(&node.stargz_process_name(), node.sandbox.as_ref())?);
            stargz.wait_ready(procs.last_mut().expect("just pushed"))?;
        }
        procs.push(node.spawn_runtime()?);
        node.wait_ready(procs.last_mut().expect("just pushed"))?;
        Ok(node)
    }

    /// [`Node::start`] for a node running the real CRI-O: its files written ([`CrioFiles`]), its storage
    /// on the node's tmpfs.
    fn start_crio(
        spec: &NodeSpec,
        env: &NodeEnv<'_>,
        procs: &mut Vec<Proc>,
        mounts: &mut Vec<PathBuf>,
    ) -> Result<Node> {
        if spec.stargz || spec.without_config_path {
            bail!(
                "node {}: a CRI-O node runs without stargz or containerd's settings",
                spec.name
            );
        }
        crio_node::check_plain_http(env.scheme)?;
        let dir = env.lab_dir.join("nodes").join(&spec.name);
        let root = dir.join("root");
        std::fs::create_dir_all(&root)?;
        let mut socket = dir.join("crio.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            std::fs::create_dir_all(env.short_socket_dir)?;
            socket = env.short_socket_dir.join(format!("{}.sock", spec.name));
        }
        mount_tmpfs(&root, spec.imagefs_bytes)?;
        mounts.push(root.clone());
        let files = CrioFiles::write(&dir, &root, &socket, env.registry_hosts)?;
        let node = Node {
            name: spec.name.clone(),
            runtime: Runtime::Crio133,
            socket,
            root,
            imagefs_bytes: spec.imagefs_bytes,
            config: files.conf.clone(),
            certs: files.registries_dir.clone(),
            sandbox: None,
            stargz: None,
            unit: None,
            crio: Some(files),
            metrics_address: None,
        };
        procs.push(node.spawn_runtime()?);
        node.wait_ready(procs.last_mut().expect("just pushed"))?;
        Ok(node)
    }

    /// A CRI-O node's files; panics for a containerd node (a mistake in the test).
    pub fn crio(&self) -> &CrioFiles {
        self.crio
            .as_ref()
            .unwrap_or_else(|| panic!("node {} runs {}, not CRI-O", self.name, self.runtime))
    }

    /// The node's entry in a nodes file (docs/nodes-file.md) as an administrator writes it for pinboard
    /// on that node: a CRI-O node pins through its drop-in directory and is reloaded by signal; a
    /// containerd node's config is named (containerd 2 reports no registry config_path, so pinboard reads
    /// it there, as it reads `/etc/containerd/config.toml` on a node).
    pub fn nodes_file_entry(&self) -> String {
        let mut entry = format!("- name: {}\n  endpoint: {}\n", self.name, self.endpoint());
        if self.crio.is_none() && self.sandbox.is_none() {
            entry.push_str(&format!("  containerdConfig: {}\n", self.config.display()));
        }
        if let Some(crio) = &self.crio {
            entry.push_str(&format!(
                "  pin: crio-drop-in\n  crioConfigDir: {}\n  crioReload: signal:{}\n  \
                 crioRegistriesDir: {}\n  lazyDropIn: {}\n",
                crio.config_dir.display(),
                crio.pidfile.display(),
                crio.registries_dir.display(),
                crio.lazy_drop_in().display()
            ));
        }
        entry
    }

    /// pinboard's arguments for this node alone, as [`Node::nodes_file_entry`] describes it: `--cri
    /// NAME=ENDPOINT`, and for a CRI-O node its drop-in directory, its reload by signal and its
    /// registries.conf.d.
    pub fn node_args(&self) -> Vec<String> {
        let mut args = vec![
            "--cri".to_string(),
            format!("{}={}", self.name, self.endpoint()),
        ];
        if let Some(crio) = &self.crio {
            args.extend([
                "--crio-config-dir".into(),
                crio.config_dir.display().to_string(),
                "--crio-reload".into(),
                format!("signal:{}", crio.pidfile.display()),
                "--crio-registries-dir".into(),
                crio.registries_dir.display().to_string(),
            ]);
        }
        args
    }

    /// `systemctl reload crio`, as an administrator reloads CRI-O after editing its files: SIGHUP to the
    /// pid its pidfile names. CRI-O applies it asynchronously. Panics for a containerd node.
    pub fn reload_crio(&self) {
        let pid = std::fs::read_to_string(&self.crio().pidfile).expect("CRI-O's pidfile");
        let pid: libc::pid_t = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) takes no pointers; the pid is the lab's own CRI-O child, recorded at its start.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGHUP) },
            0,
            "SIGHUP to CRI-O"
        );
    }

    /// Every image as the node's runtime itself lists it over CRI (ListImages), with `pinned` (containerd
    /// 1.6.20 never says true).
    pub fn cri_images(&self) -> Vec<CriImage> {
        cri::list_images(&self.socket)
            .unwrap_or_else(|e| panic!("node {}: CRI ListImages: {e:#}", self.name))
    }

    /// The image known as `name` as the runtime lists it; None when it has none.
    pub fn cri_image(&self, name: &str) -> Option<CriImage> {
        self.cri_images().into_iter().find(|i| i.known_as(name))
    }

    /// Waits up to 10 s until the runtime's own ListImages says each of `images` is pinned as given (CRI-O
    /// applies a reload asynchronously); panics with what it says otherwise.
    pub fn wait_cri_pinned(&self, images: &[(&str, bool)]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let says = || -> Vec<(String, bool)> {
            images
                .iter()
                .map(|(image, _)| {
                    (
                        image.to_string(),
                        self.cri_image(image).is_some_and(|i| i.pinned),
                    )
                })
                .collect()
        };
        let wanted: Vec<(String, bool)> = images.iter().map(|(i, p)| (i.to_string(), *p)).collect();
        while says() != wanted {
            assert!(
                Instant::now() < deadline,
                "{}: {} says {:?}, not {wanted:?}",
                self.name,
                self.runtime,
                says()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The gRPC calls containerd has answered so far, by `service/method` (the service's last name) and
    /// answer code, as its own metrics count them (`grpc_server_handled_total`;
    /// [`NodeSpec::serving_metrics`]).
    pub fn grpc_calls(&self) -> BTreeMap<(String, String), f64> {
        let address = self
            .metrics_address
            .as_deref()
            .unwrap_or_else(|| panic!("node {} serves no metrics", self.name));
        let text = ureq::get(&format!("http://{address}/v1/metrics"))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("node {}: containerd's metrics: {e}", self.name));
        let mut calls = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
        {
            let (labels, value) = line.rsplit_once(' ').expect("a sample");
            let label = |name: &str| {
                labels
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            let service = label("grpc_service");
            let service = service.rsplit('.').next().unwrap_or_default();
            *calls
                .entry((
                    format!("{service}/{}", label("grpc_method")),
                    label("grpc_code"),
                ))
                .or_default() += value.parse::<f64>().expect("a count");
        }
        calls
    }

    /// The CRI calls CRI-O has answered so far, by name (`ListImages`), with how many of them failed, as its
    /// own metrics count them (`container_runtime_crio_operations_total` and `…_errors_total`).
    pub fn crio_operations(&self) -> BTreeMap<String, (f64, f64)> {
        let address = &self.crio().metrics_address;
        let text = ureq::get(&format!("http://{address}/metrics"))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("node {}: CRI-O's metrics: {e}", self.name));
        let mut operations: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (prefix, errors) in [
            (
                "container_runtime_crio_operations_total{operation=\"",
                false,
            ),
            (
                "container_runtime_crio_operations_errors_total{operation=\"",
                true,
            ),
        ] {
            for line in text.lines().filter_map(|l| l.strip_prefix(prefix)) {
                let (operation, rest) = line.split_once('"').expect("a label");
                let count: f64 = rest
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("a count");
                let entry = operations.entry(operation.to_string()).or_default();
                match errors {
                    true => entry.1 += count,
                    false => entry.0 += count,
                }
            }
        }
        operations
    }

    /// `NAME VERSION` of its runtime, as CRI Version says it: for a test's output.
    pub fn runtime_version(&self) -> String {
        cri::version(&self.socket)
            .unwrap_or_else(|e| panic!("node {}: CRI Version: {e:#}", self.name))
    }

    /// containerd's config file.
    pub fn config_file(&self) -> &Path {
        &self.config
    }

    /// `<lab>/nodes/<name>/`: the node's config, state and log (and `conf.d`, when it imports one).
    pub fn dir(&self) -> &Path {
        self.config
            .parent()
            .expect("the config is in the node's directory")
    }

    /// Leaves an image pulled here as a remote snapshotter leaves a lazily pulled one: its layers'
    /// snapshots labelled `containerd.io/snapshot/remote` (`ctr snapshots label`), and its layer blobs
    /// removed from the content store (`ctr content rm`). `config` is the image's config digest, `layers`
    /// its layer digests.
    pub fn make_lazy(&self, config: &str, layers: &[String]) -> Result<()> {
        let listed = run_ctr(self.runtime, &self.socket, &["content", "ls"])?;
        let top = listed
            .lines()
            .find(|l| l.starts_with(config))
            .and_then(|l| {
                l.split([',', '\t', ' '])
                    .find_map(|label| label.strip_prefix("containerd.io/gc.ref.snapshot.native="))
            })
            .with_context(|| {
                format!(
                    "node {}: {config} names no native snapshot:\n{listed}",
                    self.name
                )
            })?
            .to_string();
        let mut snapshot = Some(top);
        while let Some(key) = snapshot {
            let snapshots = ["snapshots", "--snapshotter", "native"];
            let label = [
                &snapshots[..],
                &["label", &key, "containerd.io/snapshot/remote=true"],
            ]
            .concat();
            run_ctr(self.runtime, &self.socket, &label)?;
            let info = run_ctr(
                self.runtime,
                &self.socket,
                &[&snapshots[..], &["info", &key]].concat(),
            )?;
            let info: serde_json::Value = serde_json::from_str(&info)?;
            snapshot = info["Parent"].as_str().map(str::to_string);
        }
        let remove = [
            &["content", "rm"][..],
            &layers.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat();
        run_ctr(self.runtime, &self.socket, &remove)?;
        Ok(())
    }

    /// The name of this node's runtime among the lab's processes: `containerd-2.1 (n1)`.
    pub(crate) fn process_name(&self) -> String {
        format!("{} ({})", self.runtime, self.name)
    }

    /// The name of this node's stargz-snapshotter among the lab's processes.
    pub(crate) fn stargz_process_name(&self) -> String {
        format!("stargz ({})", self.name)
    }

    /// Its stargz-snapshotter's socket as the node names it, when it runs one.
    pub fn stargz_socket(&self) -> Option<&Path> {
        self.stargz.as_ref().map(|s| s.socket_in_node.as_path())
    }

    /// Its stargz-snapshotter; panics for a node without one (a mistake in the test).
    pub fn stargz(&self) -> &Stargz {
        self.stargz
            .as_ref()
            .unwrap_or_else(|| panic!("node {} runs no stargz-snapshotter", self.name))
    }

    /// The mount points of the layers its stargz-snapshotter mounts from the registry (FUSE, under its
    /// root), as this machine's mount table lists them: a plain lab's node only (a cluster node's are in
    /// its own mount namespace).
    pub fn stargz_mounts(&self) -> Vec<String> {
        let root = &self.stargz().root;
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ');
                let (mountpoint, kind) = (fields.nth(1)?, fields.next()?);
                (kind == "fuse.rawBridge" && Path::new(mountpoint).starts_with(root))
                    .then(|| mountpoint.to_string())
            })
            .collect()
    }

    /// Returns once its containerd reaches its stargz-snapshotter again, when it has it as a proxy plugin
    /// (else at once): containerd dials a snapshotter that went away with a backoff of up to 3 s, and says
    /// it does not answer until then.
    pub(crate) fn wait_stargz_reached(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            match self.ctr(&["snapshots", "--snapshotter", "stargz", "ls"]) {
                Ok(_) => return Ok(()),
                Err(e) if e.to_string().contains("not loaded") => return Ok(()),
                Err(e) if std::time::Instant::now() > deadline => {
                    return Err(e.context("containerd does not reach the snapshotter"));
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }

    /// `ctr ARGS` on the node's containerd, in the CRI namespace: what it prints.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        run_ctr(self.runtime, &self.socket, args)
    }

    /// How a plain node with stargz runs its containerd: its `systemctl`. Panics for another node.
    pub fn unit(&self) -> &Unit {
        self.unit
            .as_ref()
            .unwrap_or_else(|| panic!("node {} has no unit: NodeSpec::with_stargz", self.name))
    }

    /// Starts this node's runtime (its log appended to), without waiting for it.
    pub(crate) fn spawn_runtime(&self) -> Result<Proc> {
        let dir = self.dir();
        if let Some(crio) = &self.crio {
            let proc = Proc::spawn(&self.process_name(), crio.command()?, &dir.join("crio.log"))?;
            crio.record_pid(proc.pid())?;
            return Ok(proc.watched());
        }
        let log = dir.join("containerd.log");
        match &self.sandbox {
            None if self.unit.is_some() => {
                let mut command = self.unit().command(&self.config);
                command.env("PATH", self.runtime.path_env()?);
                Proc::spawn_group(&self.process_name(), command, &log).map(Proc::watched)
            }
            None => {
                let mut command = Command::new(self.runtime.program("containerd")?);
                command
                    .arg("--config")
                    .arg(&self.config)
                    .env("PATH", self.runtime.path_env()?);
                Proc::spawn(&self.process_name(), command, &log).map(Proc::watched)
            }
            Some(sandbox) => {
                let mut command = sandbox.command(self.runtime.program("containerd")?);
                command
                    .arg("--config")
                    .arg(&self.config)
                    .env("PATH", self.runtime.path_env()?);
                Proc::spawn_group(&self.process_name(), command, &log).map(Proc::watched)
            }
        }
    }

    /// Where a cluster node's containerd finds its CNI network config.
    pub(crate) fn cni_conf_dir(&self) -> PathBuf {
        cni_conf_dir(self.dir())
    }

    /// A cluster node's namespaces.
    pub(crate) fn sandbox(&self) -> Option<&NodeSandbox> {
        self.sandbox.as_ref()
    }

    /// Where the lab finds `path` (absolute) as a cluster node sees it, for a path under `/run`,
    /// `/var/lib`, `/var/log` or `/etc/containerd`: e.g. the node's `/var/lib/kubelet/config.json`.
    /// Panics for a node outside a cluster lab (a mistake in the test).
    pub fn path_in_node(&self, path: &str) -> PathBuf {
        self.sandbox
            .as_ref()
            .unwrap_or_else(|| panic!("node {} is not a cluster lab's", self.name))
            .host_path(path)
    }

    /// Returns once `proc`, this node's containerd, serves containerd's API and CRI.
    pub(crate) fn wait_ready(&self, proc: &mut Proc) -> Result<()> {
        let socket = &self.socket;
        proc.wait_ready(Duration::from_secs(30), || {
            socket.exists()
                && (self.crio.is_some()
                    || ctr(self.runtime, socket)
                        .arg("version")
                        .output()
                        .is_ok_and(|out| out.status.success()))
                // The CRI plugin starts serving a moment after containerd's own services.
                && cri::image_id(socket, "lab.invalid/readiness-probe:1").is_ok()
        })
    }

    /// The `hosts.toml` through which this node's containerd reaches `registry_host` (`HOST:PORT`), in its
    /// registry `config_path`: what an administrator edits to add a mirror.
    pub fn hosts_toml(&self, registry_host: &str) -> PathBuf {
        self.certs.join(registry_host).join("hosts.toml")
    }

    /// `unix:///abs/path/containerd.sock`
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Where containerd keeps this node's unpacked layers (on the node's tmpfs): the path CRI's
    /// ImageFsInfo reports as the image filesystem.
    /// `ctr images ls` on the node, an independent view of its image records: one line each, with
    /// labels (e.g. `io.cri-containerd.pinned=pinned`).
    pub fn images_ls(&self) -> String {
        let out = ctr(self.runtime, &self.socket)
            .args(["images", "ls"])
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr images ls: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("ctr prints UTF-8")
    }

    /// Asserts, from `ctr images ls`, that every one of `references` is on the node with the pin label; on
    /// CRI-O, from its own ListImages, that it reports each one pinned.
    pub fn assert_pinned<S: AsRef<str>>(&self, references: &[S]) {
        if self.crio.is_some() {
            for reference in references {
                let reference = reference.as_ref();
                let image = self.cri_image(reference);
                assert!(
                    image.as_ref().is_some_and(|i| i.pinned),
                    "{}: CRI-O lists {reference} as {image:?}",
                    self.name
                );
            }
            return;
        }
        let listed = self.images_ls();
        for reference in references {
            let reference = reference.as_ref();
            let line = listed
                .lines()
                .find(|l| l.starts_with(reference))
                .unwrap_or_else(|| panic!("{}: {reference} missing:\n{listed}", self.name));
            assert!(
                line.contains("io.cri-containerd.pinned=pinned"),
                "{}: {line}",
                self.name
            );
        }
    }

    /// `ctr images label NAME LABEL`: labels an image record by hand, as an administrator would (e.g.
    /// `io.cri-containerd.pinned=pinned`).
    pub fn label(&self, name: &str, label: &str) {
        let out = ctr(self.runtime, &self.socket)
            .args(["images", "label", name, label])
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr images label: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Clears label `key` on every image record of the image `name` names (its tag or digest reference
    /// and its id: CRI keeps several), as `ctr images label RECORD KEY=` run for each would.
    pub fn clear_label(&self, name: &str, key: &str) {
        let listed = self.images_ls();
        let digest_of = |line: &str| line.split_whitespace().nth(2).map(str::to_owned);
        let target = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(digest_of)
            .unwrap_or_else(|| panic!("{}: no image {name}:\n{listed}", self.name));
        for record in listed
            .lines()
            .filter(|l| digest_of(l).as_deref() == Some(target.as_str()))
            .filter_map(|l| l.split_whitespace().next())
        {
            self.label(record, &format!("{key}="));
        }
    }

    /// Removes the image known as `name`, every name of it, as the kubelet's image garbage collection
    /// does (CRI RemoveImage).
    pub fn collect_image(&self, name: &str) {
        cri::remove_image(&self.socket, name)
            .unwrap_or_else(|e| panic!("{}: CRI RemoveImage {name}: {e:#}", self.name));
    }

    /// `ctr images rm --sync NAME`: removes an image record behind pinboard's back, as kubelet image GC,
    /// `crictl rmi` or an administrator would; its content goes with it. On CRI-O, CRI RemoveImage.
    pub fn remove_image(&self, name: &str) {
        if self.crio.is_some() {
            return self.collect_image(name);
        }
        let out = ctr(self.runtime, &self.socket)
            .args(["images", "rm", "--sync", name])
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr images rm: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn imagefs_dir(&self) -> PathBuf {
        match &self.crio {
            Some(crio) => crio.imagefs_dir(),
            None => self.root.join("io.containerd.snapshotter.v1.native"),
        }
    }

    /// Pre-loads an image with `ctr images pull` in containerd's `k8s.io` namespace, the way an
    /// administrator would, then waits until the node's CRI ImageStatus reports it (CRI picks up images
    /// created in that namespace from containerd's events, asynchronously).
    pub fn pull(&self, reference: &str) -> Result<()> {
        self.pull_as(reference, None)
    }

    /// [`Node::pull`] with `login` (`USER:PASSWORD`) for a registry that wants credentials. On CRI-O, a
    /// CRI PullImage, as a kubelet pulls.
    pub fn pull_as(&self, reference: &str, login: Option<&str>) -> Result<()> {
        if self.crio.is_some() {
            cri::pull_image(&self.socket, reference, login)
                .with_context(|| format!("node {}: CRI PullImage {reference}", self.name))?;
            return Ok(());
        }
        let mut command = ctr(self.runtime, &self.socket);
        command.args(["images", "pull", "--plain-http", "--snapshotter", "native"]);
        if let Some(login) = login {
            command.args(["--user", login]);
        }
        run(command.arg(reference))
            .with_context(|| format!("node {}: ctr pull {reference}", self.name))?;
        self.wait_for_cri_image(reference, "ctr pulled it")
    }

    /// Imports the image `name` from the OCI archive `archive` with `ctr images import` in containerd's
    /// `k8s.io` namespace, the way an administrator pre-loads an image without a registry, then waits until
    /// the node's CRI ImageStatus reports it.
    pub fn import(&self, archive: &Path, name: &str) -> Result<()> {
        run(ctr(self.runtime, &self.socket)
            .args(["images", "import", "--snapshotter", "native"])
            .arg(archive))
        .with_context(|| format!("node {}: ctr import {}", self.name, archive.display()))?;
        self.wait_for_cri_image(name, "ctr imported it")
    }

    /// Waits until the node's CRI reports `reference`, which containerd's `k8s.io` namespace has (CRI
    /// picks up images created there from containerd's events, asynchronously).
    fn wait_for_cri_image(&self, reference: &str, after: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if cri::image_id(&self.socket, reference)?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {}: CRI does not report {reference} after {after}",
                    self.name
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Where a node's containerd has its socket, state and registry config: as its config says (for a cluster
/// node, the standard paths in its sandbox) and, for the socket and registry config, as the lab sees them.
struct ContainerdPaths {
    socket_in_config: PathBuf,
    state_in_config: PathBuf,
    certs_in_config: PathBuf,
    /// A path short enough for a unix socket.
    socket: PathBuf,
    certs: PathBuf,
}

impl ContainerdPaths {
    /// The paths of node `name` in `dir`, with their directories created.
    fn new(dir: &Path, env: &NodeEnv<'_>, name: &str) -> Result<ContainerdPaths> {
        let in_sandbox = |path: &str| node_sandbox::own_path(dir, path);
        let (certs, state, listening) = match env.cluster {
            None => (
                dir.join("certs.d"),
                dir.join("state"),
                dir.join("containerd.sock"),
            ),
            Some(_) => (
                in_sandbox(STANDARD_CERTS),
                in_sandbox(STANDARD_STATE),
                in_sandbox(STANDARD_SOCKET),
            ),
        };
        for d in [&certs, &state] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut socket = listening.clone();
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            std::fs::create_dir_all(env.short_socket_dir)?;
            let short = env.short_socket_dir.join(format!("{name}.sock"));
            match env.cluster {
                // containerd listens on the short path, linked from the long one.
                None => std::os::unix::fs::symlink(&short, &listening)?,
                // containerd listens on the standard path in its sandbox; the lab reaches it through
                // the short link.
                Some(_) => std::os::unix::fs::symlink(&listening, &short)?,
            }
            socket = short;
        }
        Ok(match env.cluster {
            None => ContainerdPaths {
                socket_in_config: socket.clone(),
                state_in_config: state,
                certs_in_config: certs.clone(),
                socket,
                certs,
            },
            Some(_) => ContainerdPaths {
                socket_in_config: PathBuf::from(STANDARD_SOCKET),
                state_in_config: PathBuf::from(STANDARD_STATE),
                certs_in_config: PathBuf::from(STANDARD_CERTS),
                socket,
                certs,
            },
        })
    }
}

/// The CRI plugin's settings for a kubelet, beyond those every node has: the lines of its own table and
/// those of its `containerd` table. Its CNI plugins are Debian's; its network config is written into the
/// node's [`Node::cni_conf_dir`] once the node has an address (containerd watches that directory): until
/// then the node is NotReady ("cni plugin not initialized").
fn kubelet_cri_config(dir: &Path, sandbox_image: &str) -> Result<(String, String)> {
    let cni_conf = cni_conf_dir(dir);
    std::fs::create_dir_all(&cni_conf)?;
    let cri = format!(
        r#"  # This machine's root lacks CAP_SYS_RESOURCE: runc could not raise a container's oom_score_adj.
  restrict_oom_score_adj = true
  # In the lab registry: there is no other registry to pull the default one from.
  sandbox_image = "{sandbox_image}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_PLUGINS}"
    conf_dir = "{cni_conf}"
"#,
        cni_conf = cni_conf.display(),
    );
    let runtimes = format!(
        r#"    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{RUNC_ROOT}"
"#
    );
    Ok((cri, runtimes))
}

/// A cluster node's CNI config directory, in its directory `dir`.
fn cni_conf_dir(dir: &Path) -> PathBuf {
    dir.join("cni/net.d")
}

/// `ctr ARGS` on the node's containerd, in the CRI namespace: what it prints.
fn run_ctr(runtime: Runtime, socket: &Path, args: &[&str]) -> Result<String> {
    let out = ctr(runtime, socket)
        .args(args)
        .output()
        .context("ctr runs")?;
    if !out.status.success() {
        bail!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `runtime`'s own `ctr` talking to the node's containerd in the CRI namespace.
fn ctr(runtime: Runtime, socket: &Path) -> Command {
    let mut command = Command::new(
        runtime
            .program("ctr")
            .expect("checked when the node started"),
    );
    command
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"]);
    command
}

//! [`Lab`]: starts the registry, its proxy, the containerd nodes and optionally the API server (or a whole
//! plain Kubernetes cluster, in a network namespace of the lab's own), gives tests their addresses, and
//! stops everything (by PID) and unmounts the nodes' tmpfs when dropped.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use super::apiserver::{ApiServer, ClusterApiServer};
use super::binary_image::binary_layer;
use super::crio_node::remove_crun_state;
use super::estargz::{EstargzSpec, estargz_archive, push_archive};
use super::images::{self, Extras, ImageSpec, LayerCache, Platform, PushedImage, PushedIndex};
use super::kube_cluster::{ClusterConfig, KubeCluster, SANDBOX_IMAGE};
use super::network::LabNetwork;
use super::node::{ClusterNodeEnv, Node, NodeEnv, NodeSpec};
use super::node_sandbox::{RUNC_ROOT, own_path, remove_container_cgroups};
use super::pki::{Ca, SitePki};
use super::process::{Proc, run, stop_all};
use super::proxy::{Proxy, ProxyControl};
use super::registry::{Registry, RegistrySetup, RegistryTls};
use super::run::{Run, pinboard};
use super::stargz::unmount_fuse_under;
use super::token::TokenService;

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct LabConfig {
    pub nodes: Vec<NodeSpec>,
    /// Also start etcd and kube-apiserver.
    pub apiserver: bool,
    /// How the registry guards itself (default: open, plain HTTP). The nodes' hosts.toml trust the lab's
    /// CA and present its client certificate as the setup needs; clients outside the lab are given the
    /// files by the test ([`Lab::pki`]).
    pub registry: RegistrySetup,
    /// Make the lab a plain Kubernetes cluster ([`KubeCluster`]; implies `apiserver`): the API server,
    /// controller manager and scheduler, and a kubelet beside each node's containerd, all in the lab's
    /// network namespace ([`LabNetwork`]), where the registry and proxy are reached on the host's side.
    pub cluster: Option<ClusterConfig>,
}

/// A running lab. Dropping it stops every process it started and unmounts the nodes' image filesystems;
/// logs stay in [`Lab::dir`].
pub struct Lab {
    // Declared (and so dropped) before `resources`: the proxy thread stops before the processes do; the
    // kubelets before their nodes; the network namespace last.
    proxy: Proxy,
    registry: Registry,
    tokens: Option<Arc<TokenService>>,
    pki: Option<SitePki>,
    /// Whether the nodes present the site's client certificate to the registry.
    client_certificate: bool,
    layers: LayerCache,
    cluster: Option<KubeCluster>,
    nodes: Vec<Node>,
    apiserver: Option<ApiServer>,
    resources: Resources,
    network: Option<LabNetwork>,
}

impl Lab {
    /// [`Lab::start`] with `nodes`, the open plain-HTTP registry and no API server; panics if it cannot start.
    pub fn with_nodes(name: &str, nodes: Vec<NodeSpec>) -> Lab {
        Lab::start(
            name,
            LabConfig {
                nodes,
                ..LabConfig::default()
            },
        )
        .expect("the lab starts")
    }

    /// Starts a lab in `target/lab/<name>-<pid>-<n>/` and waits until every part of it is ready. `name`
    /// is for people reading the directory listing (use the test's name). Synchronous; callable from
    /// `#[test]` and `#[tokio::test]`.
    pub fn start(name: &str, config: LabConfig) -> Result<Lab> {
        let started = Instant::now();
        check_nodes(&config.nodes)?;
        let root = target_dir().join("lab");
        unmount_stale(&root);
        remove_stale_cgroups(&root);
        let (dir, unique) = create_unique_dir(&root, name)?;
        eprintln!("lab {name}: logs and state in {}", dir.display());
        let mut resources = Resources {
            dir: dir.clone(),
            short_socket_dir: std::env::temp_dir()
                .join(format!("pinboard-lab-{}-{unique}", std::process::id())),
            procs: Vec::new(),
            mounts: Vec::new(),
            deaths: Vec::new(),
        };
        let context = || format!("lab {name} did not start; logs in {}", dir.display());

        let network = match config.cluster {
            Some(_) => Some(LabNetwork::create(&dir).with_context(context)?),
            None => None,
        };
        // Where the nodes reach the registry and proxy.
        let registry_ip = network
            .as_ref()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| n.host_ip().into());
        let setup = &config.registry;
        let tokens = match &setup.tokens {
            Some(users) => Some(Arc::new(
                TokenService::start(&dir.join("token"), users.clone(), registry_ip)
                    .with_context(context)?,
            )),
            None => None,
        };
        let pki = match setup.tls {
            RegistryTls::Off => None,
            _ => Some(SitePki::make(&dir.join("pki"), registry_ip).with_context(context)?),
        };
        let registry = Registry::start(
            &dir,
            registry_ip,
            &mut resources.procs,
            tokens.clone(),
            setup.tls,
            pki.as_ref(),
        )
        .with_context(context)?;
        let proxy = Proxy::start(registry_ip, registry.host().parse()?)?;
        let client_certificate = setup.tls == RegistryTls::ClientCertificates;
        let registry_hosts = [registry.host(), proxy.host()];
        let env = NodeEnv {
            lab_dir: &dir,
            registry_hosts: &registry_hosts,
            scheme: registry.scheme(),
            pki: pki.as_ref(),
            client_certificate,
            short_socket_dir: &resources.short_socket_dir,
            cluster: network.as_ref().map(|network| ClusterNodeEnv {
                network,
                sandbox_image: SANDBOX_IMAGE,
            }),
        };
        let nodes = config
            .nodes
            .iter()
            .map(|spec| Node::start(spec, &env, &mut resources.procs, &mut resources.mounts))
            .collect::<Result<Vec<_>>>()
            .with_context(context)?;
        if config.apiserver || config.cluster.is_some() {
            etcd_on_tmpfs(&dir, &mut resources.mounts).with_context(context)?;
        }
        let (apiserver, cluster) = match (&network, &config.cluster) {
            (Some(network), Some(cluster_config)) => {
                let ca = Ca::make(&dir.join("cluster-pki"), "pinboard lab cluster CA")
                    .with_context(context)?;
                let in_cluster = ClusterApiServer {
                    network,
                    ca: &ca,
                    service_accounts: &cluster_config.service_account_tokens,
                };
                let apiserver = ApiServer::launch(&dir, &mut resources.procs, Some(&in_cluster))
                    .with_context(context)?;
                let mut cluster = KubeCluster::new(&dir, &apiserver, ca).with_context(context)?;
                // The kubelets take seconds to start and keep trying the API server meanwhile.
                for (node, spec) in nodes.iter().zip(&config.nodes) {
                    if spec.has_kubelet() {
                        cluster
                            .start_kubelet(node, spec, network)
                            .with_context(context)?;
                    }
                }
                apiserver.wait_launched().with_context(context)?;
                cluster
                    .start_controllers(&dir, network, &apiserver)
                    .with_context(context)?;
                for (node, spec) in nodes.iter().zip(&config.nodes) {
                    if spec.has_kubelet() {
                        cluster.wait_registered(&node.name).with_context(context)?;
                    }
                }
                (Some(apiserver), Some(cluster))
            }
            _ if config.apiserver => (
                Some(ApiServer::start(&dir, &mut resources.procs, None).with_context(context)?),
                None,
            ),
            _ => (None, None),
        };
        eprintln!(
            "lab {name}: ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(Lab {
            proxy,
            registry,
            tokens,
            pki,
            client_certificate,
            layers: LayerCache::default(),
            cluster,
            nodes,
            apiserver,
            resources,
            network,
        })
    }

    /// `target/lab/<name>-<pid>-<n>/`: configs, state and every log.
    pub fn dir(&self) -> &Path {
        &self.resources.dir
    }

    /// `127.0.0.1:PORT` of the registry itself.
    pub fn registry_host(&self) -> String {
        self.registry.host().to_owned()
    }

    /// Where the registry keeps the bytes of blob `digest` (`sha256:...`), for tests that corrupt them.
    pub fn registry_blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir()
            .join("registry/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// `127.0.0.1:PORT` of the proxy in front of the registry.
    pub fn proxy_host(&self) -> String {
        self.proxy.host().to_owned()
    }

    /// pinboard's registry client as a test or benchmark uses it: through the proxy (so what it fetches is
    /// counted there), no credentials.
    pub fn registry_client(&self) -> pinboard::backend::registry::Registry {
        self.registry_client_with(pinboard::backend::credentials::Credentials::none())
    }

    /// [`Lab::registry_client`] with `credentials` (for a registry behind the token service). Over plain
    /// HTTP, or, when the registry speaks TLS, trusting the lab's CA and presenting its client certificate
    /// from a certs.d directory in the lab dir.
    pub fn registry_client_with(
        &self,
        credentials: pinboard::backend::credentials::Credentials,
    ) -> pinboard::backend::registry::Registry {
        let mut options = pinboard::backend::registry::RegistryOptions::default();
        match &self.pki {
            None => options.insecure_registries = vec![self.proxy_host()],
            Some(pki) => {
                let certs = self.dir().join("client-certs.d");
                let dir = certs.join(self.proxy_host());
                std::fs::create_dir_all(&dir).expect("certs.d in the lab dir");
                for (from, name) in [
                    (&pki.ca, "ca.crt"),
                    (&pki.client_cert, "client.cert"),
                    (&pki.client_key, "client.key"),
                ] {
                    std::fs::copy(from, dir.join(name)).expect("certs.d file");
                }
                options.certs_dir = Some(certs);
            }
        }
        pinboard::backend::registry::Registry::with_credentials(options, credentials)
            .expect("registry client")
    }

    pub fn proxy(&self) -> &ProxyControl {
        self.proxy.control()
    }

    /// Asserts that the link carried at most `slack` times `unique` bytes since the proxy had sent
    /// `before`, and says on stderr what it carried for `what`; the bytes it carried.
    pub fn assert_moved_at_most(&self, what: &str, before: u64, unique: u64, slack: f64) -> u64 {
        let moved = self.proxy().bytes_down() - before;
        let ratio = moved as f64 / unique as f64;
        assert!(
            moved as f64 <= slack * unique as f64,
            "{what}: {moved} bytes crossed the link for {unique} unique bytes ({ratio:.3}x, more than \
             {slack}x; lab: {})",
            self.dir().display()
        );
        eprintln!("{what}: {moved} bytes over the link for {unique} unique ({ratio:.3}x)");
        moved
    }

    /// The registry's token service, when it uses bearer tokens.
    pub fn token_service(&self) -> Option<&TokenService> {
        self.tokens.as_deref()
    }

    /// The site CA and the certificates it signed, when the registry speaks TLS.
    pub fn pki(&self) -> Option<&SitePki> {
        self.pki.as_ref()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node called `name`; panics if there is none (a mistake in the test).
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("the lab has no node {name:?}"))
    }

    pub fn apiserver(&self) -> Option<&ApiServer> {
        self.apiserver.as_ref()
    }

    /// The controllers and kubelets of a cluster lab.
    pub fn cluster(&self) -> Option<&KubeCluster> {
        self.cluster.as_ref()
    }

    /// A cluster lab's network namespace and its addresses.
    pub fn network(&self) -> Option<&LabNetwork> {
        self.network.as_ref()
    }

    /// Starts one more node; in a cluster lab with its kubelet, returning once its Node is registered.
    pub fn add_node(&mut self, spec: NodeSpec) -> Result<&Node> {
        check_nodes(std::slice::from_ref(&spec))?;
        ensure!(
            self.nodes.iter().all(|n| n.name != spec.name),
            "node name {:?} is used twice",
            spec.name
        );
        let registry_hosts = [self.registry.host(), self.proxy.host()];
        let (lab_dir, short_socket_dir) = (
            self.resources.dir.clone(),
            self.resources.short_socket_dir.clone(),
        );
        let env = NodeEnv {
            lab_dir: &lab_dir,
            registry_hosts: &registry_hosts,
            scheme: self.registry.scheme(),
            pki: self.pki.as_ref(),
            client_certificate: self.client_certificate,
            short_socket_dir: &short_socket_dir,
            cluster: self.network.as_ref().map(|network| ClusterNodeEnv {
                network,
                sandbox_image: SANDBOX_IMAGE,
            }),
        };
        let resources = &mut self.resources;
        let node = Node::start(&spec, &env, &mut resources.procs, &mut resources.mounts)?;
        if let (Some(cluster), Some(network)) = (&mut self.cluster, &self.network)
            && spec.has_kubelet()
        {
            cluster.start_kubelet(&node, &spec, network)?;
            cluster.wait_registered(&node.name)?;
        }
        self.nodes.push(node);
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// Stops node `name` for good: in a cluster lab its kubelet too, and deletes its Node object (as
    /// `kubectl delete node` does). Its containerd, its pods and its image filesystem go.
    pub fn remove_node(&mut self, name: &str) -> Result<()> {
        let at = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .with_context(|| format!("the lab has no node {name:?}"))?;
        if let (Some(cluster), Some(network)) = (&mut self.cluster, &self.network) {
            cluster.stop_kubelet(name, network);
            cluster.delete_node(name)?;
        }
        let node = self.nodes.remove(at);
        let procs = &mut self.resources.procs;
        if let Some(at) = procs.iter().position(|p| p.name() == node.process_name()) {
            stop_all(std::slice::from_mut(&mut procs.remove(at)));
        }
        let root = node.root.clone();
        drop(node); // a cluster node's sandbox goes with it
        self.resources.mounts.retain(|mount| *mount != root);
        unmount(&root);
        Ok(())
    }

    /// Kills node `name`'s runtime (SIGKILL, as a crash) and starts it again on the same root, state and
    /// socket; returns once it serves CRI again.
    pub fn restart_node(&mut self, name: &str) -> Result<()> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("the lab has no node {name:?}"))?;
        let procs = &mut self.resources.procs;
        let at = procs
            .iter()
            .position(|p| p.name() == node.process_name())
            .context("the node's runtime is not among the lab's processes")?;
        procs[at].kill()?;
        procs[at] = node.spawn_runtime()?;
        node.wait_ready(&mut procs[at])
    }

    /// Node `name`'s stargz-snapshotter process, by its position among the lab's processes.
    fn stargz_at(&self, name: &str) -> Result<usize> {
        let wanted = self.node(name).stargz_process_name();
        self.resources
            .procs
            .iter()
            .position(|p| p.name() == wanted)
            .with_context(|| format!("node {name} runs no stargz-snapshotter"))
    }

    /// Kills node `name`'s stargz-snapshotter (SIGKILL, as a crash): its layers' FUSE mounts stay, dead.
    pub fn kill_stargz(&mut self, name: &str) -> Result<()> {
        let at = self.stargz_at(name)?;
        self.resources.procs[at].kill()
    }

    /// Starts node `name`'s stargz-snapshotter again (after [`Lab::kill_stargz`]);
    /// returns once it serves and the node's containerd reaches it, or its log's end when it exits first
    /// (it mounts every remote layer again at start, and gives up when one cannot be resolved).
    pub fn start_stargz(&mut self, name: &str) -> Result<()> {
        let at = self.stargz_at(name)?;
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .expect("found by stargz_at");
        let procs = &mut self.resources.procs;
        procs[at] = node
            .stargz()
            .spawn(&node.stargz_process_name(), node.sandbox())?;
        node.stargz().wait_ready(&mut procs[at])?;
        node.wait_stargz_reached()
    }

    /// Pushes a linux/amd64 image to the registry (directly, not through the proxy) under its digest.
    pub fn push_image(&self, repo: &str, spec: &ImageSpec) -> Result<PushedImage> {
        images::push_image(
            &self.registry,
            &self.layers,
            repo,
            spec,
            &Platform::linux_amd64(),
        )
    }

    /// [`Lab::push_image`], its manifest also pushed under `tag`, so that it can be pulled by tag as a pod
    /// pulls it.
    pub fn push_tagged(&self, repo: &str, spec: &ImageSpec, tag: &str) -> Result<PushedImage> {
        let extras = Extras {
            tag: Some(tag),
            ..Extras::default()
        };
        images::push_image_with(
            &self.registry,
            &self.layers,
            repo,
            spec,
            &Platform::linux_amd64(),
            &extras,
        )
    }

    /// Writes `<lab>/nodes.yaml`, a nodes file (docs/nodes-file.md) with every node as an administrator
    /// lists it for pinboard ([`Node::nodes_file_entry`]), and returns its path.
    pub fn nodes_file(&self) -> PathBuf {
        self.nodes_file_of(&self.nodes.iter().collect::<Vec<_>>())
    }

    /// [`Lab::nodes_file`] of `nodes` alone: `<lab>/nodes-<names>.yaml`.
    pub fn nodes_file_of(&self, nodes: &[&Node]) -> PathBuf {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let path = self.dir().join(match nodes.len() == self.nodes.len() {
            true => "nodes.yaml".to_string(),
            false => format!("nodes-{}.yaml", names.join("-")),
        });
        let text: String = nodes.iter().map(|n| n.nodes_file_entry()).collect();
        std::fs::write(&path, text).expect("the nodes file is written");
        path
    }

    /// `pinboard COMMAND` on every node of the lab (its nodes file, [`Lab::nodes_file`]) and its plain-HTTP
    /// registry and proxy, with `args` after; `plan` and `apply` with a floor of 1 MiB, as the lab's image
    /// filesystems are small.
    pub fn pinboard(&self, command: &str, args: &[&str]) -> Run {
        let nodes = self.nodes_file();
        let mut all = vec![
            command.to_string(),
            "--nodes".into(),
            nodes.display().to_string(),
        ];
        if command != "unpin" {
            for host in [self.registry_host(), self.proxy_host()] {
                all.extend(["--insecure-registry".into(), host]);
            }
        }
        if command == "plan" || command == "apply" {
            all.extend(["--min-free".into(), "1Mi".into()]);
        }
        all.extend(args.iter().map(|a| a.to_string()));
        pinboard(&all)
    }

    /// Writes the PinnedImageSet `name` listing `images` into the lab's directory, as an administrator
    /// writes one; its path, for `--set`.
    pub fn set_file(&self, name: &str, images: &[&str]) -> String {
        let path = self.dir().join(format!("{name}.yaml"));
        let entries: String = images
            .iter()
            .map(|i| format!("    - name: {i}\n"))
            .collect();
        std::fs::write(
            &path,
            format!(
                "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  \
                 name: {name}\nspec:\n  pinnedImages:\n{entries}"
            ),
        )
        .expect("the set's file is written");
        path.display().to_string()
    }

    /// Makes the eStargz image `spec` as its users do (`ctr-remote image convert --estargz --oci`) and
    /// pushes it to the registry (directly, not through the proxy) as `repo`, by digest.
    pub fn push_estargz(&self, repo: &str, spec: &EstargzSpec) -> Result<PushedImage> {
        self.push_estargz_archive(repo, &self.estargz_archive(spec)?)
    }

    /// The eStargz image `spec` made as [`Lab::push_estargz`] makes it, as an OCI archive, to push to
    /// this lab's registry or another's.
    pub fn estargz_archive(&self, spec: &EstargzSpec) -> Result<Vec<u8>> {
        estargz_archive(self.dir(), &self.resources.short_socket_dir, spec)
    }

    /// Pushes the image of the OCI archive `archive` ([`Lab::estargz_archive`]) as `repo`, by digest.
    pub fn push_estargz_archive(&self, repo: &str, archive: &[u8]) -> Result<PushedImage> {
        push_archive(&self.registry, repo, archive)
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn layer_cache(&self) -> &LayerCache {
        &self.layers
    }

    /// Pushes an image of `binary` (a program of this machine) to `repo`: one layer holding it at
    /// `/usr/local/bin/<name>` with every shared library `ldd` says it links, its entrypoint the binary.
    /// Returns its reference by digest, `HOST:PORT/REPO@sha256:…`.
    pub fn push_binary_image(&self, binary: &Path, repo: &str) -> Result<String> {
        let (layer, path) = binary_layer(binary)?;
        let extras = Extras {
            built: std::slice::from_ref(&layer),
            entrypoint: vec![path],
            ..Extras::default()
        };
        let image = images::push_image_with(
            &self.registry,
            &self.layers,
            repo,
            &ImageSpec::default(),
            &Platform::linux_amd64(),
            &extras,
        )?;
        Ok(image.reference(self.registry.host()))
    }

    /// Pushes one image per platform and an OCI index over them.
    pub fn push_index(&self, repo: &str, images: &[(Platform, ImageSpec)]) -> Result<PushedIndex> {
        images::push_index(&self.registry, &self.layers, repo, images)
    }
}

/// What must be undone when the lab goes away, also when it fails halfway through starting.
struct Resources {
    dir: PathBuf,
    short_socket_dir: PathBuf,
    procs: Vec<Proc>,
    mounts: Vec<PathBuf>,
    /// The nodes' runtimes that died during the test, as the lab found them when the test ended.
    deaths: Vec<String>,
}

impl Drop for Lab {
    /// Before anything stops (a cluster node's runtime goes with its sandbox): which runtimes died during
    /// the test, for [`Resources`] to report once everything is cleaned up.
    fn drop(&mut self) {
        self.resources.deaths = self
            .resources
            .procs
            .iter_mut()
            .filter_map(Proc::death)
            .collect();
    }
}

impl Drop for Resources {
    /// Stops everything; then fails the test if a node's runtime died during it (pinboard must never harm a
    /// runtime), naming the runtime and its log's last lines.
    fn drop(&mut self) {
        let deaths = std::mem::take(&mut self.deaths);
        stop_all(&mut self.procs);
        // A killed stargz-snapshotter's layers, mounted on the nodes' image filesystems.
        unmount_fuse_under(&self.dir);
        remove_crun_state();
        for mount in &self.mounts {
            unmount(mount);
        }
        // Bulky data goes; configs and logs stay for reading after the test.
        for path in [
            self.short_socket_dir.clone(),
            self.dir.join("registry"),
            self.dir.join("apiserver/etcd"),
        ] {
            if path.exists() {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
        if !deaths.is_empty() {
            let report = format!("lab {}: {}", self.dir.display(), deaths.join("\n"));
            // A test already failing says why it failed; this says what died with it.
            match std::thread::panicking() {
                true => eprintln!("{report}"),
                false => panic!("{report}"),
            }
        }
    }
}

/// Removes the cgroups that runc made for the containers of cluster labs whose process is gone (killed
/// before it could clean up: its nodes' processes died with it, the cgroups stayed).
fn remove_stale_cgroups(root: &Path) {
    let Ok(labs) = std::fs::read_dir(root) else {
        return;
    };
    for lab in labs.flatten() {
        if !lab.file_name().to_str().is_some_and(owner_is_gone) {
            continue;
        }
        let Ok(nodes) = std::fs::read_dir(lab.path().join("nodes")) else {
            continue;
        };
        for node in nodes.flatten() {
            remove_container_cgroups(&own_path(&node.path(), RUNC_ROOT));
        }
    }
}

/// Node names must be distinct path components; sizes must be set (tmpfs takes size=0 as "no limit").
fn check_nodes(nodes: &[NodeSpec]) -> Result<()> {
    for (i, node) in nodes.iter().enumerate() {
        let name = &node.name;
        ensure!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "node name {name:?}: use letters, digits and '-'"
        );
        ensure!(
            nodes[..i].iter().all(|other| other.name != *name),
            "node name {name:?} is used twice"
        );
        ensure!(
            node.imagefs_bytes > 0,
            "node {name}: imagefs_bytes must be > 0"
        );
    }
    Ok(())
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else `target/` in the crate.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    )
}

/// Creates `<root>/<name>-<pid>-<n>` for the first `n` not taken yet in this process.
pub(crate) fn create_unique_dir(root: &Path, name: &str) -> Result<(PathBuf, usize)> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("{name}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((dir, n)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
}

/// Mounts a tmpfs of `bytes` on `dir`: an image filesystem of its own size (tmpfs takes size=0 as "no
/// limit", so 0 is refused by the callers).
pub(crate) fn mount_tmpfs(dir: &Path, bytes: u64) -> Result<()> {
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={bytes}"))
        .arg("tmpfs")
        .arg(dir))?;
    Ok(())
}

/// The most etcd's tmpfs may hold: a bench's 5,000 nodes' reports with their revisions fit.
const ETCD_TMPFS_BYTES: u64 = 4 << 30;

/// Mounts a tmpfs where the lab's etcd keeps its data (`apiserver/etcd`): on the disk, its fsyncs took up
/// to 10.7 s while the suite's other labs wrote images, and the API server's requests timed out.
fn etcd_on_tmpfs(lab_dir: &Path, mounts: &mut Vec<PathBuf>) -> Result<()> {
    let data = lab_dir.join("apiserver/etcd");
    std::fs::create_dir_all(&data)?;
    mount_tmpfs(&data, ETCD_TMPFS_BYTES)?;
    mounts.push(data.clone());
    // etcd asks that only its user read its data.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// Unmounts a tmpfs [`mount_tmpfs`] mounted, lazily if something still holds it.
pub(crate) fn unmount(mount: &Path) {
    if run(Command::new("umount").arg(mount)).is_err()
        && let Err(e) = run(Command::new("umount").arg("-l").arg(mount))
    {
        eprintln!("lab: could not unmount {}: {e:#}", mount.display());
    }
}

/// Whether the process that started the lab in directory `lab` (`<name>-<pid>-<n>`) is gone.
fn owner_is_gone(lab: &str) -> bool {
    lab.rsplit('-')
        .nth(1)
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Unmounts the tmpfs of labs under `root` whose process is gone (killed before it could clean up), so
/// their memory is freed.
fn unmount_stale(root: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    for mountpoint in mounts.lines().filter_map(|line| line.split(' ').nth(1)) {
        let Ok(rest) = Path::new(mountpoint).strip_prefix(root) else {
            continue;
        };
        let Some(lab) = rest.iter().next().and_then(|c| c.to_str()) else {
            continue;
        };
        if owner_is_gone(lab) {
            eprintln!("lab: unmounting {mountpoint}, left behind by a lab whose process is gone");
            unmount(Path::new(mountpoint));
        }
    }
}

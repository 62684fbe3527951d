//! A lab node: one real containerd (with its CRI plugin) whose root is a size-limited tmpfs, so each node
//! has an image filesystem of its own size. Its config, log and state live in `<lab>/nodes/<name>/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cri;
use super::lab::mount_tmpfs;
use super::pki::SitePki;
use super::process::{Proc, run};

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
}

impl NodeSpec {
    pub fn new(name: &str, imagefs_bytes: u64) -> NodeSpec {
        NodeSpec {
            name: name.to_owned(),
            imagefs_bytes,
            without_config_path: false,
            imports_conf_d: false,
        }
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
    /// The containerd socket, serving both containerd's API and CRI.
    pub socket: PathBuf,
    /// containerd's root directory: the node's tmpfs.
    pub root: PathBuf,
    pub imagefs_bytes: u64,
    /// containerd's config file, for starting it again.
    config: PathBuf,
}

/// What a node needs from the lab to start.
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
}

impl Node {
    /// Mounts the node's tmpfs (recorded in `mounts` at once, for unmounting) and starts its containerd
    /// (added to `procs` before it is waited on), returning once containerd and its CRI plugin answer.
    pub(crate) fn start(
        spec: &NodeSpec,
        env: &NodeEnv<'_>,
        procs: &mut Vec<Proc>,
        mounts: &mut Vec<PathBuf>,
    ) -> Result<Node> {
        let dir = env.lab_dir.join("nodes").join(&spec.name);
        let root = dir.join("root");
        let state = dir.join("state");
        let certs = dir.join("certs.d");
        for d in [&root, &state, &certs] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut socket = dir.join("containerd.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            std::fs::create_dir_all(env.short_socket_dir)?;
            let short = env.short_socket_dir.join(format!("{}.sock", spec.name));
            std::os::unix::fs::symlink(&short, &socket)?;
            socket = short;
        }
        for host in env.registry_hosts {
            let host_dir = certs.join(host);
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

        let registry = if spec.without_config_path {
            env.registry_hosts
                .iter()
                .map(|host| {
                    format!(
                        "    [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{host}\"]\n      \
                         endpoint = [\"http://{host}\"]\n"
                    )
                })
                .collect()
        } else {
            format!("    config_path = \"{}\"\n", certs.display())
        };
        let config = dir.join("config.toml");
        let imports = match spec.imports_conf_d {
            true => format!("imports = [\"{}/*.toml\"]\n", dir.join("conf.d").display()),
            false => String::new(),
        };
        std::fs::write(
            &config,
            format!(
                r#"version = 2
{imports}root = "{root}"
state = "{state}"
# Only the native snapshotter is used; skip probing the others.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  # A free port rather than the default 10010, so several nodes can run side by side.
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".registry]
{registry}"#,
                root = root.display(),
                state = state.display(),
                socket = socket.display(),
            ),
        )?;
        let node = Node {
            name: spec.name.clone(),
            socket,
            root,
            imagefs_bytes: spec.imagefs_bytes,
            config,
        };
        procs.push(node.spawn_containerd()?);
        node.wait_ready(procs.last_mut().expect("just pushed"))?;
        Ok(node)
    }

    /// containerd's config file.
    pub fn config_file(&self) -> &Path {
        &self.config
    }

    /// The directory holding the node's config, state and log (and `conf.d`, when it imports one).
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
        let listed = run_ctr(&self.socket, &["content", "ls"])?;
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
            run_ctr(&self.socket, &label)?;
            let info = run_ctr(&self.socket, &[&snapshots[..], &["info", &key]].concat())?;
            let info: serde_json::Value = serde_json::from_str(&info)?;
            snapshot = info["Parent"].as_str().map(str::to_string);
        }
        let remove = [
            &["content", "rm"][..],
            &layers.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat();
        run_ctr(&self.socket, &remove)?;
        Ok(())
    }

    /// The name of this node's containerd among the lab's processes.
    pub(crate) fn process_name(&self) -> String {
        format!("containerd ({})", self.name)
    }

    /// Starts this node's containerd (its log appended to), without waiting for it.
    pub(crate) fn spawn_containerd(&self) -> Result<Proc> {
        let mut command = Command::new("containerd");
        command.arg("--config").arg(&self.config);
        let dir = self
            .config
            .parent()
            .expect("the config is in the node's directory");
        Proc::spawn(&self.process_name(), command, &dir.join("containerd.log"))
    }

    /// Returns once `proc`, this node's containerd, serves containerd's API and CRI.
    pub(crate) fn wait_ready(&self, proc: &mut Proc) -> Result<()> {
        let socket = &self.socket;
        proc.wait_ready(Duration::from_secs(30), || {
            socket.exists()
                && ctr(socket).arg("version").output().is_ok_and(|out| out.status.success())
                // The CRI plugin starts serving a moment after containerd's own services.
                && cri::image_id(socket, "lab.invalid/readiness-probe:1").is_ok()
        })
    }

    /// The `hosts.toml` through which this node's containerd reaches `registry_host` (`HOST:PORT`), in its
    /// registry `config_path`: what an administrator edits to add a mirror.
    pub fn hosts_toml(&self, registry_host: &str) -> PathBuf {
        self.root
            .parent()
            .expect("the root is in the node's directory")
            .join("certs.d")
            .join(registry_host)
            .join("hosts.toml")
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
        let out = ctr(&self.socket)
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

    /// Asserts, from `ctr images ls`, that every one of `references` is on the node with the pin label.
    pub fn assert_pinned<S: AsRef<str>>(&self, references: &[S]) {
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
        let out = ctr(&self.socket)
            .args(["images", "label", name, label])
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr images label: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn imagefs_dir(&self) -> PathBuf {
        self.root.join("io.containerd.snapshotter.v1.native")
    }

    /// Pre-loads an image with `ctr images pull` in containerd's `k8s.io` namespace, the way an
    /// administrator would, then waits until the node's CRI ImageStatus reports it (CRI picks up images
    /// created in that namespace from containerd's events, asynchronously).
    pub fn pull(&self, reference: &str) -> Result<()> {
        self.pull_as(reference, None)
    }

    /// [`Node::pull`] with `login` (`USER:PASSWORD`) for a registry that wants credentials.
    pub fn pull_as(&self, reference: &str, login: Option<&str>) -> Result<()> {
        let mut command = ctr(&self.socket);
        command.args(["images", "pull", "--plain-http", "--snapshotter", "native"]);
        if let Some(login) = login {
            command.args(["--user", login]);
        }
        run(command.arg(reference))
            .with_context(|| format!("node {}: ctr pull {reference}", self.name))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if cri::image_id(&self.socket, reference)?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {}: CRI does not report {reference} after ctr pulled it",
                    self.name
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `ctr ARGS` on the node's containerd, in the CRI namespace: what it prints.
fn run_ctr(socket: &Path, args: &[&str]) -> Result<String> {
    let out = ctr(socket).args(args).output().context("ctr runs")?;
    if !out.status.success() {
        bail!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ctr` talking to this node's containerd in the CRI namespace.
fn ctr(socket: &Path) -> Command {
    let mut command = Command::new("ctr");
    command
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"]);
    command
}

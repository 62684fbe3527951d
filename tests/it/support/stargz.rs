//! stargz-snapshotter beside a lab node's containerd ([`super::NodeSpec::with_stargz`]): the real
//! `containerd-stargz-grpc` scripts/setup builds (Debian's stargz-snapshotter 0.12 source under
//! scripts/stargz/main.go), with the node's own root directory, socket and config.
//!
//! - Its root is `io.containerd.snapshotter.v1.stargz` in containerd's root, on the node's image
//!   filesystem: where containerd's CRI plugin looks for the `stargz` snapshotter's files (ImageFsInfo).
//! - Its config enables the CRI keychain (credentials taken from the PullImage requests sent to its socket,
//!   forwarded to the node's containerd), and reaches the lab's registries over plain HTTP (stargz takes
//!   only `localhost` as plain HTTP by itself). Its docker-config keychain reads `<node>/stargz/docker`
//!   (`DOCKER_CONFIG`), empty unless a test puts credentials there.
//! - A plain node's snapshotter serves on a short path of the lab's (unix sockets are short); a cluster
//!   node's runs in the node's namespaces at the standard path
//!   (`/run/containerd-stargz-grpc/containerd-stargz-grpc.sock`), linked from a short path for the lab.
//! - It is stopped with SIGINT, which unmounts its layers; killed, it leaves its FUSE mounts dead, as a
//!   crash does, and [`unmount_fuse_under`] takes them down when the lab goes.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::apiserver::cached_binary;
use super::node_sandbox::NodeSandbox;
use super::process::{Proc, run};

/// Where a real node's snapshotter serves (the default of pinboard's `--stargz-socket`).
const STANDARD_SOCKET: &str = "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock";
/// Its root in containerd's root directory.
const ROOT_IN_CONTAINERD: &str = "io.containerd.snapshotter.v1.stargz";
/// How long the snapshotter may take to serve: it mounts every remote layer again first.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A node's snapshotter: its files, and its socket as the lab and as the node see it.
#[derive(Clone, Debug)]
pub struct Stargz {
    /// The socket as the lab reaches it.
    pub socket: PathBuf,
    /// The socket as containerd and pinboard on the node name it.
    pub socket_in_node: PathBuf,
    /// Its root as the node sees it.
    root_in_node: PathBuf,
    /// Its root as the lab sees it.
    pub root: PathBuf,
    config: PathBuf,
    /// Its docker-config keychain's directory (`DOCKER_CONFIG`).
    pub docker_config: PathBuf,
    pub log: PathBuf,
}

/// What the snapshotter of a node needs to know of it.
pub(crate) struct StargzEnv<'a> {
    /// `<lab>/nodes/<name>`.
    pub(crate) node_dir: &'a Path,
    pub(crate) node: &'a str,
    /// containerd's root as the lab and as the node see it.
    pub(crate) containerd_root: &'a Path,
    pub(crate) containerd_root_in_node: &'a Path,
    /// containerd's socket as the node sees it, for the CRI keychain.
    pub(crate) containerd_socket_in_node: &'a Path,
    /// Registry hosts (`IP:PORT`) the node pulls from, and whether over plain HTTP.
    pub(crate) registry_hosts: &'a [&'a str],
    pub(crate) plain_http: bool,
    pub(crate) short_socket_dir: &'a Path,
    pub(crate) sandbox: Option<&'a NodeSandbox>,
}

impl Stargz {
    /// The snapshotter's files for a node, its config written.
    pub(crate) fn prepare(env: &StargzEnv<'_>) -> Result<Stargz> {
        let dir = env.node_dir.join("stargz");
        let docker_config = dir.join("docker");
        std::fs::create_dir_all(&docker_config)?;
        std::fs::create_dir_all(env.short_socket_dir)?;
        let short = env
            .short_socket_dir
            .join(format!("{}-stargz.sock", env.node));
        let (socket_in_node, socket) = match env.sandbox {
            None => (short.clone(), short),
            Some(sandbox) => {
                let seen = sandbox.host_path(STANDARD_SOCKET);
                std::fs::create_dir_all(seen.parent().expect("a socket in a directory"))?;
                std::os::unix::fs::symlink(&seen, &short)?;
                (PathBuf::from(STANDARD_SOCKET), short)
            }
        };
        let mut config = format!(
            "# stargz-snapshotter for lab node {node}: credentials from the CRI PullImage requests sent to its\n\
             # socket, which forwards them to the node's containerd.\n\
             [cri_keychain]\n  enable_keychain = true\n  image_service_path = \"{cri}\"\n",
            node = env.node,
            cri = env.containerd_socket_in_node.display()
        );
        if env.plain_http {
            for host in env.registry_hosts {
                config.push_str(&format!(
                    "\n[[resolver.host.\"{host}\".mirrors]]\n  host = \"{host}\"\n  insecure = true\n"
                ));
            }
        }
        let config_file = dir.join("config.toml");
        std::fs::write(&config_file, config)?;
        let root = env.containerd_root.join(ROOT_IN_CONTAINERD);
        std::fs::create_dir_all(&root)?;
        Ok(Stargz {
            socket,
            socket_in_node,
            root_in_node: env.containerd_root_in_node.join(ROOT_IN_CONTAINERD),
            root,
            config: config_file,
            docker_config,
            log: env.node_dir.join("stargz.log"),
        })
    }

    /// Starts the snapshotter (in `sandbox`, a cluster node's namespaces, when given), without waiting.
    pub(crate) fn spawn(&self, name: &str, sandbox: Option<&NodeSandbox>) -> Result<Proc> {
        let binary = cached_binary("containerd-stargz-grpc")?;
        let mut command = match sandbox {
            None => std::process::Command::new(binary),
            Some(sandbox) => sandbox.command(binary),
        };
        command
            .arg("-address")
            .arg(&self.socket_in_node)
            .arg("-root")
            .arg(&self.root_in_node)
            .arg("-config")
            .arg(&self.config)
            .env("DOCKER_CONFIG", &self.docker_config);
        let proc = match sandbox {
            None => Proc::spawn(name, command, &self.log)?,
            Some(_) => Proc::spawn_group(name, command, &self.log)?,
        };
        Ok(proc.stopped_by(libc::SIGINT))
    }

    /// Returns once `proc`, this snapshotter, serves on its socket: after it mounted every remote layer it
    /// holds again, which fails (and it exits) when the registry cannot be reached.
    pub(crate) fn wait_ready(&self, proc: &mut Proc) -> Result<()> {
        proc.wait_ready(READY_WITHIN, || UnixStream::connect(&self.socket).is_ok())
    }
}

/// Unmounts every FUSE filesystem mounted under `dir` (a killed snapshotter's layers), deepest first.
pub(crate) fn unmount_fuse_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let mut fuse: Vec<&str> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (mountpoint, kind) = (fields.nth(1)?, fields.next()?);
            (kind.starts_with("fuse") && Path::new(mountpoint).starts_with(dir))
                .then_some(mountpoint)
        })
        .collect();
    fuse.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mountpoint in fuse {
        let unmounted = run(std::process::Command::new("umount").arg(mountpoint))
            .or_else(|_| {
                run(std::process::Command::new("umount")
                    .arg("-l")
                    .arg(mountpoint))
            })
            .with_context(|| format!("unmounting {mountpoint}"));
        if let Err(e) = unmounted {
            eprintln!("lab: {e:#}");
        }
    }
}

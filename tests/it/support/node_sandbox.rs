//! Where a cluster lab's node runs its containerd and kubelet: private mount and PID namespaces of its own,
//! inside the lab's network namespace, so that nothing they do reaches the host.
//!
//! - The node sees the standard paths, backed by its own directories under `<node>/fs/`: `/run`
//!   (containerd's socket at `/run/containerd/containerd.sock`, runc's state, the shims' sockets),
//!   `/var/lib` (the kubelet's root `/var/lib/kubelet`, with its hard-coded device-plugins directory),
//!   `/var/log` (`/var/log/pods`, `/var/log/containers`) and `/etc/containerd` (its registry config
//!   `certs.d`); `/var/lib/containerd` is the node's image filesystem (its tmpfs), containerd's root. A pod
//!   spec written for a real node (hostPath `/run/containerd`, `/etc/containerd/certs.d`,
//!   `/var/lib/containerd`, `/var/lib/kubelet/config.json`) therefore runs unchanged, and the lab reads and
//!   writes the same files under `<node>/fs/` (and the tmpfs). The rest of the host's filesystem (the lab
//!   directory, the binaries) is seen as is.
//! - The kernel settings the kubelet insists on (`vm.overcommit_memory=1`, `kernel.panic=10`, ...) are
//!   files of the node bind-mounted over `/proc/sys/...` with the values it wants, so it finds them set and
//!   never writes the host's.
//! - The mounts the kubelet and containerd make (secret volumes, the kubelet's root bound onto itself, the
//!   containers' root filesystems) stay in the namespace and vanish with it.
//! - Every process of the node (containerd's shims and the pods' processes too) is in the node's PID
//!   namespace, whose init is the holder's `sleep`: killing it kills them all, also when the test process
//!   died (the holder dies with it). Only the containers' cgroups outlive them, empty; [`NodeSandbox::stop`]
//!   removes them, reading their paths from runc's state.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::network::LabNetwork;
use super::process::{Proc, run, stop_all};

/// The host paths a node sees backed by its own directories (`<node>/fs/<path>`).
const OWN_PATHS: [&str; 4] = ["/run", "/var/lib", "/var/log", "/etc/containerd"];

/// The kernel settings the kubelet sets when they differ (`setupKernelTunables`), with its values.
const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// runc's state directory as the node sees it (containerd's runc runtime is configured with it).
pub(crate) const RUNC_ROOT: &str = "/run/containerd/runc";

/// containerd's root as the node sees it, where its image filesystem is mounted.
pub(crate) const CONTAINERD_ROOT: &str = "/var/lib/containerd";

/// A node's namespaces and the process holding them.
#[derive(Debug)]
pub(crate) struct NodeSandbox {
    /// `<lab>/nodes/<name>`, whose `fs/` holds the node's own `/run`, `/var/lib`, `/var/log` and
    /// `/etc/containerd`.
    node_dir: PathBuf,
    /// The node's image filesystem, seen at [`CONTAINERD_ROOT`].
    image_fs: PathBuf,
    /// `unshare --fork --pid --mount-proc ... sleep`; its child is the namespace's init.
    holder: Proc,
    /// The host PID of the namespaces' init.
    init: u32,
}

impl NodeSandbox {
    /// Creates the namespaces for the node whose directory is `node_dir`, inside `network`, and mounts the
    /// node's own paths, its image filesystem `image_fs` (a mount point) and kernel settings in them.
    pub(crate) fn create(
        node_dir: &Path,
        image_fs: &Path,
        network: &LabNetwork,
    ) -> Result<NodeSandbox> {
        for path in OWN_PATHS {
            ensure!(
                !node_dir.starts_with(path),
                "the lab directory {} is under {path}, which a cluster node mounts over",
                node_dir.display()
            );
            std::fs::create_dir_all(own_path(node_dir, path))?;
        }
        let mut command = network.command("unshare");
        command.args(["--fork", "--pid", "--mount-proc", "--kill-child"]);
        command.args(["--propagation", "private", "--", "sleep", "infinity"]);
        let mut holder = Proc::spawn(
            "node namespace holder",
            command,
            &node_dir.join("sandbox.log"),
        )?;
        let holder_pid = holder.pid();
        let mut init = None;
        let found = holder.wait_ready(Duration::from_secs(5), || {
            init = namespace_init(holder_pid);
            init.is_some()
        });
        if let Err(e) = found {
            stop_all(std::slice::from_mut(&mut holder));
            return Err(e);
        }
        let sandbox = NodeSandbox {
            node_dir: node_dir.to_owned(),
            image_fs: image_fs.to_owned(),
            holder,
            init: init.expect("found"),
        };
        // Once `sandbox` exists, dropping it (on any error below) stops the holder.
        for path in OWN_PATHS {
            sandbox.mount_bind(&own_path(node_dir, path), Path::new(path))?;
        }
        std::fs::create_dir_all(own_path(node_dir, CONTAINERD_ROOT))?;
        sandbox.mount_bind(image_fs, Path::new(CONTAINERD_ROOT))?;
        let sysctls = node_dir.join("sysctl");
        std::fs::create_dir_all(&sysctls)?;
        for (name, value) in KUBELET_SYSCTLS {
            let file = sysctls.join(name.replace('/', "."));
            std::fs::write(&file, format!("{value}\n"))?;
            sandbox.mount_bind(&file, &Path::new("/proc/sys").join(name))?;
        }
        Ok(sandbox)
    }

    /// `path` (absolute, as the node sees it) as the lab sees it, for one of the node's own paths or its
    /// image filesystem.
    pub(crate) fn host_path(&self, path: &str) -> PathBuf {
        match Path::new(path).strip_prefix(CONTAINERD_ROOT) {
            Ok(inside) => self.image_fs.join(inside),
            Err(_) => own_path(&self.node_dir, path),
        }
    }

    /// `program` to be run in the node's namespaces. `nsenter` forks to enter the PID namespace: start it
    /// with [`Proc::spawn_group`], so that stopping it reaches the program.
    pub(crate) fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--target={}", self.init))
            .args(["--mount", "--pid", "--net", "--"])
            .arg(program);
        command
    }

    fn mount_bind(&self, from: &Path, to: &Path) -> Result<()> {
        run(Command::new("nsenter")
            .arg(format!("--target={}", self.init))
            .args(["--mount", "--", "mount", "--bind"])
            .arg(from)
            .arg(to))
        .with_context(|| {
            format!(
                "mounting {} over {} in the node",
                from.display(),
                to.display()
            )
        })?;
        Ok(())
    }

    /// Kills every process of the node, waits until they are gone, and removes the cgroups runc made for
    /// its containers.
    pub(crate) fn stop(&mut self) {
        if !self.holder.has_exited() {
            // SAFETY: kill(2) takes no pointers. The init is the child of our unreaped, running holder,
            // which reaps it only once it has died: the PID is still the init's.
            unsafe {
                libc::kill(
                    libc::pid_t::try_from(self.init).expect("pid fits"),
                    libc::SIGKILL,
                )
            };
        }
        // The holder exits once the init is reaped, which is after every process of the namespace is.
        if let Err(e) = self.holder.wait_exit(Duration::from_secs(10)) {
            eprintln!("lab: {e:#}");
        }
        stop_all(std::slice::from_mut(&mut self.holder));
        remove_container_cgroups(&self.host_path(RUNC_ROOT));
    }
}

impl Drop for NodeSandbox {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `path` (absolute) as the node in `node_dir` sees it, as the lab sees it: `<node>/fs/<path>`.
pub(crate) fn own_path(node_dir: &Path, path: &str) -> PathBuf {
    node_dir.join("fs").join(path.trim_start_matches('/'))
}

/// The host PID of the child of `holder` (the `unshare` that forked it) once it runs `sleep`, i.e. once
/// `unshare` has set up its namespaces (and mounted its `/proc`).
fn namespace_init(holder: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children")).ok()?;
    let init = children.split_whitespace().next()?.parse().ok()?;
    let command = std::fs::read_to_string(format!("/proc/{init}/comm")).ok()?;
    (command.trim() == "sleep").then_some(init)
}

/// Removes the cgroups of the containers whose runc state is under `runc_root` (`<namespace>/<id>/
/// state.json`, whose `cgroup_paths` name them), deepest first, and then that state. Their processes must
/// be gone. Errors are reported, not returned: this runs while a lab is dropped.
pub(crate) fn remove_container_cgroups(runc_root: &Path) {
    let Ok(namespaces) = std::fs::read_dir(runc_root) else {
        return;
    };
    for container in namespaces
        .flatten()
        .filter_map(|namespace| std::fs::read_dir(namespace.path()).ok())
        .flatten()
        .flatten()
    {
        let state = container.path().join("state.json");
        if let Err(e) = remove_cgroups_of(&state) {
            eprintln!("lab: {}: {e:#}", state.display());
        }
        let _ = std::fs::remove_dir_all(container.path());
    }
}

fn remove_cgroups_of(state: &Path) -> Result<()> {
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(state)?)?;
    let Some(paths) = state["cgroup_paths"].as_object() else {
        return Ok(());
    };
    for path in paths.values().filter_map(|p| p.as_str()) {
        let path = Path::new(path);
        ensure!(
            path.starts_with("/sys/fs/cgroup/"),
            "unexpected cgroup path {}",
            path.display()
        );
        remove_cgroup(path)?;
    }
    Ok(())
}

/// Removes the cgroup directory `path` and those below it, retrying a moment while the kernel finishes
/// with processes that just exited.
fn remove_cgroup(path: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(path) else {
        return Ok(()); // already gone (several controllers can share a hierarchy)
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path())?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                bail!("removing cgroup {}: {e}", path.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

//! A lab node's real CRI-O (1.33, built by scripts/setup; docs/lab.md): its files in `<lab>/nodes/<name>/`,
//! laid out as on a node: `crio.conf` with every setting (a SIGHUP reload rebuilds the configuration from
//! the defaults, `crio.conf` and the drop-ins, not from command-line flags), the drop-in directory
//! `crio.conf.d/` (where pinboard writes `50-pinned-images`), `registries.conf` naming the lab's plain-HTTP
//! registries and `registries.conf.d/` (fan-out's mirrors), a signature policy accepting anything, and
//! `crio.pid`, which the lab writes as systemd would know the pid, for `--crio-reload signal:PIDFILE`. Its
//! storage (overlay) is the node's tmpfs, so its image filesystem has the node's size. It serves its
//! metrics on a loopback port: its count of the CRI calls it answered, for the tests' contract checks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Result, bail};

use super::process::free_port;
use super::runtime::Runtime;

/// Where the real CRI-O keeps a node's files.
#[derive(Clone, Debug)]
pub struct CrioFiles {
    pub conf: PathBuf,
    /// `crio.conf.d`: the drop-ins.
    pub config_dir: PathBuf,
    pub registries_conf: PathBuf,
    /// `registries.conf.d`.
    pub registries_dir: PathBuf,
    pub pidfile: PathBuf,
    /// Its graphroot: the node's tmpfs.
    pub storage: PathBuf,
    /// Where it serves its Prometheus metrics (`metrics_host:metrics_port`).
    pub metrics_address: String,
}

/// The storage driver: as CRI-O runs on a node (overlay works on a tmpfs here).
const STORAGE_DRIVER: &str = "overlay";

impl CrioFiles {
    /// Writes the files of a node in `dir` whose storage is `storage` and whose CRI socket is `socket`,
    /// pulling from `registries` (`HOST:PORT`, plain HTTP).
    pub(crate) fn write(
        dir: &Path,
        storage: &Path,
        socket: &Path,
        registries: &[&str],
    ) -> Result<CrioFiles> {
        let metrics_port = free_port()?;
        let files = CrioFiles {
            conf: dir.join("crio.conf"),
            config_dir: dir.join("crio.conf.d"),
            registries_conf: dir.join("registries.conf"),
            registries_dir: dir.join("registries.conf.d"),
            pidfile: dir.join("crio.pid"),
            storage: storage.to_path_buf(),
            metrics_address: format!("127.0.0.1:{metrics_port}"),
        };
        for d in [&files.config_dir, &files.registries_dir] {
            std::fs::create_dir_all(d)?;
        }
        let policy = dir.join("policy.json");
        std::fs::write(
            &policy,
            "{\"default\": [{\"type\": \"insecureAcceptAnything\"}]}\n",
        )?;
        let mut registries_conf = String::from("unqualified-search-registries = []\n");
        for host in registries {
            registries_conf.push_str(&format!(
                "\n[[registry]]\nlocation = \"{host}\"\ninsecure = true\n"
            ));
        }
        std::fs::write(&files.registries_conf, registries_conf)?;
        let pinns = Runtime::Crio133.program("pinns")?;
        let d = |name: &str| dir.join(name).display().to_string();
        std::fs::write(
            &files.conf,
            format!(
                r#"# The lab's CRI-O node (tests/it/support/crio_node.rs): every path under the node's directory.
[crio]
root = "{storage}"
runroot = "{run}"
storage_driver = "{STORAGE_DRIVER}"
log_dir = "{logs}"
version_file = "{run}/version"
version_file_persist = "{version}"
clean_shutdown_file = "{clean}"

[crio.api]
listen = "{socket}"
# A free port rather than the default, so several nodes can run side by side.
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
pinns_path = "{pinns}"
container_exits_dir = "{run}/exits"
container_attach_socket_dir = "{run}/attach"
namespaces_dir = "{run}/ns"
hooks_dir = ["{hooks}"]

[crio.image]
signature_policy = "{policy}"
signature_policy_dir = "{policies}"

[crio.network]
network_dir = "{cni}"
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = true
metrics_host = "127.0.0.1"
metrics_port = {metrics_port}

[crio.nri]
enable_nri = false
"#,
                storage = storage.display(),
                run = d("run"),
                logs = d("logs"),
                version = d("version"),
                clean = d("clean.shutdown"),
                socket = socket.display(),
                pinns = pinns.display(),
                hooks = d("hooks.d"),
                policy = policy.display(),
                policies = d("policies"),
                cni = d("cni"),
            ),
        )?;
        Ok(files)
    }

    /// CRI-O's command line for these files.
    pub(crate) fn command(&self) -> Result<Command> {
        crun_state_was_there();
        let mut command = Command::new(Runtime::Crio133.program("crio")?);
        command
            .arg("--config")
            .arg(&self.conf)
            .arg("--config-dir")
            .arg(&self.config_dir)
            .arg("--registries-conf")
            .arg(&self.registries_conf)
            .arg("--registries-conf-dir")
            .arg(&self.registries_dir)
            .env("PATH", Runtime::Crio133.path_env()?);
        Ok(command)
    }

    /// Records `pid` as CRI-O's, as systemd knows its main pid.
    pub(crate) fn record_pid(&self, pid: u32) -> Result<()> {
        let temporary = self.pidfile.with_extension("pid.tmp");
        std::fs::write(&temporary, format!("{pid}\n"))?;
        std::fs::rename(&temporary, &self.pidfile)?;
        Ok(())
    }

    /// Where pinboard writes the node's lazy-pulling drop-in (containers-storage's `storage.conf.d`, beside
    /// the registries' directory), so that it stays in the node's directory.
    pub fn lazy_drop_in(&self) -> PathBuf {
        self.registries_dir
            .with_file_name("storage.conf.d")
            .join("lazy-image-pull.conf")
    }

    /// Where CRI-O keeps its image records: the directory CRI's ImageFsInfo names.
    pub fn imagefs_dir(&self) -> PathBuf {
        self.storage.join(format!("{STORAGE_DRIVER}-images"))
    }
}

/// CRI-O's every start and reload run `crun --version`, which creates `/run/crun`: the lab removes it when
/// it was not there before this process first started a CRI-O ([`remove_crun_state`]).
const CRUN_STATE: &str = "/run/crun";

fn crun_state_was_there() -> bool {
    static THERE: OnceLock<bool> = OnceLock::new();
    *THERE.get_or_init(|| Path::new(CRUN_STATE).exists())
}

/// Removes `/run/crun` when the lab's CRI-O made it and it is empty (another lab's CRI-O may run still and
/// make it again: it holds nothing of theirs).
pub(crate) fn remove_crun_state() {
    if !crun_state_was_there() {
        let _ = std::fs::remove_dir(CRUN_STATE);
    }
}

/// CRI-O reaches only plain-HTTP registries here: c/image reads a registry's CA from the machine's
/// `/etc/containers/certs.d`, which the lab never writes.
pub(crate) fn check_plain_http(scheme: &str) -> Result<()> {
    if scheme != "http" {
        bail!(
            "a CRI-O lab node pulls from plain-HTTP registries only (its CAs would go in the machine's \
             /etc/containers/certs.d)"
        );
    }
    Ok(())
}

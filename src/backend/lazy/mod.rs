//! Lazy pulling on a node, the way its runtime does it, and what it has in force:
//!
//! - CRI-O ([`storage`]): the containers-storage drop-in naming stargz-store as an additional layer store.
//!   CRI-O does not report what it has in force: the drop-in and the store's mount say it.
//! - containerd ([`containerd`]): stargz-snapshotter as a proxy plugin and the CRI plugin's snapshotter, in a
//!   file its config imports; never a containers-storage file. What is in force is the snapshotter its CRI
//!   `Status` (verbose) reports, against its files and whether the snapshotter's socket serves.
//!
//! Files are written atomically and only when they change ([`crate::backend::files`]), and they are files
//! on the node: pinboard writes them where it runs, so only for nodes on a local socket. Either runtime
//! reads them when it starts: pinboard says so with the command, and restarts it only when asked.

pub mod containerd;
pub mod storage;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cri::{CriClient, CriEndpoint, CriError};
use super::files::{FileError, file_error, read_optional, write_if_changed};
use crate::model::diff::{DiffKind, lines};
use crate::model::lazy::{LazyPulling, LazyState, containerd_lazy, crio_lazy, restart_command};
use crate::model::runtime::RuntimeKind;

use containerd::{CONTAINERD_CONFIG, ContainerdFiles, SNAPSHOTTER, STARGZ_SOCKET};
use storage::{LAZY_DROP_IN, STARGZ_STORE, STORAGE_CONF_DIR};

/// How long a restarted runtime gets to answer CRI again.
const RESTART_WAIT: Duration = Duration::from_secs(60);

/// Where a node's lazy-pull settings go, per runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyConfig {
    /// CRI-O: the storage drop-in.
    pub file: PathBuf,
    /// CRI-O: the additional layer store it names.
    pub store: String,
    /// containerd: its config, whose `imports` say where pinboard's file goes.
    pub containerd_config: PathBuf,
    /// containerd: stargz-snapshotter's socket, which the proxy plugin names.
    pub stargz_socket: PathBuf,
}

impl Default for LazyConfig {
    fn default() -> Self {
        LazyConfig {
            file: Path::new(STORAGE_CONF_DIR).join(LAZY_DROP_IN),
            store: STARGZ_STORE.into(),
            containerd_config: CONTAINERD_CONFIG.into(),
            stargz_socket: STARGZ_SOCKET.into(),
        }
    }
}

/// Why lazy pulling could not be read or changed on a node.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("runtime {runtime:?}: pinboard sets lazy pulling only on containerd and CRI-O")]
    UnknownRuntime { runtime: String },
    #[error(
        "CRI endpoint {endpoint}: lazy pulling's files are on the node, and pinboard reads and writes them \
         only where it runs; run it on the node"
    )]
    Remote { endpoint: CriEndpoint },
    #[error(
        "nothing written: {} imports no directory for pinboard's file; add `{}` {place}, {then}",
        config.display(),
        add.join("` and `")
    )]
    NoImport {
        config: PathBuf,
        /// The exact lines to add.
        add: Vec<String>,
        /// Where.
        place: String,
        /// What to do next.
        then: String,
    },
    #[error(
        "nothing written: {} loads after {} and has a CRI plugin section of its own, which containerd 1.x \
         would keep instead; move its settings to the file it repeats, or remove that section",
        by.display(),
        file.display()
    )]
    Overridden { file: PathBuf, by: PathBuf },
    #[error("`{command}` failed: {cause}")]
    Restart { command: String, cause: String },
}

/// What pinboard's file for a node is, and would be after a change (None: no file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileChange {
    pub path: PathBuf,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// How a change is made: `write` the file (or only say what would change), then `restart` the runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Apply {
    pub write: bool,
    pub restart: bool,
}

impl Apply {
    /// Written, the runtime left to restart when its administrator says (`L`, an agent's wish).
    pub const WRITE: Apply = Apply {
        write: true,
        restart: false,
    };
}

/// What turning lazy pulling on or off did on one node, or what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyOutcome {
    /// `containerd 1.6.20`, as CRI `Version` names it.
    pub runtime: String,
    /// The file pinboard writes for the node.
    pub file: PathBuf,
    /// Whether the file changed (without `write`: would change).
    pub changed: bool,
    /// Without `write`: the file's lines, as changing it would make them.
    pub diff: Vec<(DiffKind, String)>,
    /// The command pinboard ran to restart the runtime, when it did.
    pub restarted: Option<&'static str>,
    /// Lazy pulling now, as [`read_lazy`] reads it.
    pub now: LazyPulling,
}

impl LazyOutcome {
    /// One line for the operator: what happened to the file and the runtime, and what lazy pulling is now.
    pub fn summary(&self) -> String {
        let file = self.file.display();
        let mut said = match (self.changed, self.diff.is_empty(), self.restarted) {
            (false, ..) => format!("lazy pulling {}: {file} unchanged", self.now.text),
            (true, false, _) => format!("would write {file}"),
            (true, true, Some(command)) => {
                format!(
                    "wrote {file}, ran `{command}`: lazy pulling {}",
                    self.now.text
                )
            }
            (true, true, None) => format!("wrote {file}: lazy pulling {}", self.now.text),
        };
        if let Some(detail) = &self.now.detail {
            said.push_str(&format!(" ({detail})"));
        }
        said
    }
}

/// The runtime a node's CRI `Version` names.
pub fn runtime_kind(runtime_name: &str) -> Result<RuntimeKind, LazyError> {
    RuntimeKind::of_cri_name(runtime_name).ok_or_else(|| LazyError::UnknownRuntime {
        runtime: runtime_name.to_string(),
    })
}

/// Lazy pulling on the node `client` reaches, whose runtime is `runtime`, and the file pinboard writes
/// for it there.
pub async fn read_lazy(
    client: &CriClient,
    runtime: RuntimeKind,
    config: &LazyConfig,
) -> Result<(LazyPulling, PathBuf), LazyError> {
    // The files that say it are on the node: this machine's would say nothing of a node over TCP.
    if !client.endpoint().is_local() {
        return Err(LazyError::Remote {
            endpoint: client.endpoint().clone(),
        });
    }
    match runtime {
        RuntimeKind::Crio => {
            let config = config.clone();
            blocking(move || {
                let configured = read_optional(&config.file)?
                    .is_some_and(|text| storage::names_store(&text, &config.store));
                let not_mounted = storage::store_not_mounted(&config.store);
                Ok((crio_lazy(configured, not_mounted), config.file))
            })
            .await
        }
        RuntimeKind::Containerd => {
            let in_force = client.cri_snapshotter().await;
            let path = config.containerd_config.clone();
            let files = blocking(move || ContainerdFiles::read(&path)).await?;
            let (snapshotter, address) = files.snapshotter();
            let configured = snapshotter == SNAPSHOTTER;
            let socket = address.unwrap_or_else(|| config.stargz_socket.clone());
            let live = std::os::unix::net::UnixStream::connect(&socket).is_ok();
            let in_force = in_force.unwrap_or_else(|e| {
                tracing::warn!(
                    "{}: cannot ask containerd which snapshotter it uses (CRI status), so lazy pulling is \
                     judged from its configuration files alone: {e}",
                    client.endpoint()
                );
                None
            });
            let restart = restart_command(runtime);
            let lazy = containerd_lazy(SNAPSHOTTER, configured, in_force.as_deref(), live, restart);
            let file = files
                .ours()
                .map_or_else(|| config.containerd_config.clone(), Path::to_path_buf);
            Ok((lazy, file))
        }
    }
}

/// Turns lazy pulling on or off (`wanted`; None: only reads it) on the node at `endpoint`, the way its
/// runtime does it: writes (or, without `apply.write`, only says) what the runtime needs, then with
/// `apply.restart` restarts the runtime when it has not read that yet. A change is refused on a node
/// pinboard does not share files with.
pub async fn set_lazy(
    endpoint: &CriEndpoint,
    config: &LazyConfig,
    wanted: Option<bool>,
    apply: Apply,
    timeout: Duration,
) -> Result<LazyOutcome, LazyError> {
    let client = CriClient::connect(endpoint, timeout).await?;
    let version = client.version().await?;
    let runtime = runtime_kind(&version.runtime_name)?;
    let runtime_text = format!("{} {}", version.runtime_name, version.runtime_version);
    let Some(enable) = wanted else {
        let (now, file) = read_lazy(&client, runtime, config).await?;
        return Ok(LazyOutcome {
            runtime: runtime_text,
            file,
            changed: false,
            diff: Vec::new(),
            restarted: None,
            now,
        });
    };
    if !endpoint.is_local() {
        return Err(LazyError::Remote {
            endpoint: endpoint.clone(),
        });
    }
    let client = &client;
    let owned = config.clone();
    let change = blocking(move || match runtime {
        RuntimeKind::Crio => {
            let old = read_optional(&owned.file)?;
            let new = storage::lazy_drop_in(old.as_deref(), &owned.store, enable)
                .map_err(file_error(&owned.file))?;
            Ok(FileChange {
                path: owned.file,
                old,
                new,
            })
        }
        RuntimeKind::Containerd => {
            ContainerdFiles::read(&owned.containerd_config)?.change(enable, &owned.stargz_socket)
        }
    })
    .await?;
    let changed = change.old != change.new;
    if !apply.write {
        let (now, _) = read_lazy(client, runtime, config).await?;
        let diff = match changed {
            true => lines(change.old.as_deref(), change.new.as_deref()),
            false => Vec::new(),
        };
        return Ok(LazyOutcome {
            runtime: runtime_text,
            file: change.path,
            changed,
            diff,
            restarted: None,
            now,
        });
    }
    let path = change.path.clone();
    blocking(move || write(&change)).await?;
    let (mut now, _) = read_lazy(client, runtime, config).await?;
    let pending = matches!(
        now.state,
        LazyState::OnAfterRestart | LazyState::OffAfterRestart
    );
    let mut restarted = None;
    if apply.restart && (changed || pending) {
        let command = restart_command(runtime);
        blocking(move || run(command)).await?;
        let client = answering(client.endpoint(), timeout).await?;
        now = read_lazy(&client, runtime, config).await?.0;
        restarted = Some(command);
    }
    Ok(LazyOutcome {
        runtime: runtime_text,
        file: path,
        changed,
        diff: Vec::new(),
        restarted,
        now,
    })
}

/// Writes a change, its directory made first when the file is new.
fn write(change: &FileChange) -> Result<(), LazyError> {
    if change.new.is_some()
        && let Some(dir) = change.path.parent()
    {
        std::fs::create_dir_all(dir).map_err(file_error(dir))?;
    }
    write_if_changed(&change.path, change.old.as_deref(), change.new.as_deref())?;
    Ok(())
}

/// Runs a restart command (`systemctl restart containerd`), which returns once the unit is restarted.
fn run(command: &str) -> Result<(), LazyError> {
    let failed = |cause: String| LazyError::Restart {
        command: command.to_string(),
        cause,
    };
    let mut words = command.split(' ');
    let program = words.next().unwrap_or_default();
    let out = std::process::Command::new(program)
        .args(words)
        .output()
        .map_err(|e| failed(e.to_string()))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// A client of the runtime at `endpoint` once it answers CRI `Version` again after a restart.
async fn answering(endpoint: &CriEndpoint, timeout: Duration) -> Result<CriClient, LazyError> {
    let deadline = Instant::now() + RESTART_WAIT;
    loop {
        let asked = async {
            let client = CriClient::connect(endpoint, timeout).await?;
            client.version().await?;
            Ok::<_, CriError>(client)
        };
        match asked.await {
            Ok(client) => return Ok(client),
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LazyError> + Send + 'static,
) -> Result<T, LazyError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_changed_and_what_is_in_force() {
        let outcome = |changed, diff: Vec<(DiffKind, String)>, restarted, now| LazyOutcome {
            runtime: "containerd 1.6.20".into(),
            file: "/etc/containerd/conf.d/x.toml".into(),
            changed,
            diff,
            restarted,
            now,
        };
        let after = containerd_lazy(
            "stargz",
            true,
            Some("native"),
            true,
            "systemctl restart containerd",
        );
        assert_eq!(
            outcome(true, Vec::new(), None, after.clone()).summary(),
            "wrote /etc/containerd/conf.d/x.toml: lazy pulling on after restart (containerd reads it when it \
             restarts: `systemctl restart containerd`)"
        );
        let on = containerd_lazy(
            "stargz",
            true,
            Some("stargz"),
            true,
            "systemctl restart containerd",
        );
        assert_eq!(
            outcome(
                true,
                Vec::new(),
                Some("systemctl restart containerd"),
                on.clone()
            )
            .summary(),
            "wrote /etc/containerd/conf.d/x.toml, ran `systemctl restart containerd`: lazy pulling on (stargz, \
             in force)"
        );
        assert_eq!(
            outcome(false, Vec::new(), None, on).summary(),
            "lazy pulling on (stargz, in force): /etc/containerd/conf.d/x.toml unchanged"
        );
        assert!(
            outcome(true, vec![(DiffKind::Added, "x".into())], None, after)
                .summary()
                .starts_with("would write /etc/containerd/conf.d/x.toml")
        );
    }
}

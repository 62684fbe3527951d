//! Fan-out's files on a node: pointing its runtime at pinboard's registry endpoint for a rollout, putting
//! everything back afterwards, and cleaning up after a pinboard that was killed before it could.
//!
//! - containerd: `<config_path>/<registry host>/hosts.toml` for each source registry, with the endpoint as
//!   the first host; the config path is the nodes file's `registryConfigDir`, else what containerd reports
//!   (CRI `Status`, verbose), else (containerd 2, whose `Status` no longer says) what its config files set
//!   ([`containerd_config_path`]). containerd re-reads the files on every pull: no restart. Afterwards each file
//!   is back byte for byte, or gone if there was none.
//! - CRI-O: the drop-in [`CRIO_DROP_IN`] in its registries.conf.d (`--crio-registries-dir`), then a reload
//!   (CRI-O re-reads registries on reload); removed, and CRI-O reloaded, afterwards.
//!
//! What is written is decided in [`crate::model::wiring`]; every file is written atomically
//! ([`write_if_changed`]) and starts with a marker naming the process that wrote it. A file whose writer is
//! gone (its pid is not running, or runs another process since) is stale: [`clean_stale`] puts it back.
//! A file whose writer is alive is left alone: another pinboard is fanning out to that node.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::cri::{CriClient, CriEndpoint, CriError};
use super::files::{FileError, read_optional, write_if_changed};
use super::lazy::containerd::ContainerdFiles;
use super::pins::{PinError, PinTarget, Reload, reload_crio};
use crate::model::runtime::RuntimeKind;
use crate::model::served::Source;
use crate::model::wiring::{
    Marker, RegistriesFile, WiringFileError, containerd_hosts, containerd_original, crio_registries,
};

/// CRI-O's drop-in directory for registries.conf.
pub const REGISTRIES_CONF_DIR: &str = "/etc/containers/registries.conf.d";
/// Fan-out's CRI-O drop-in. It sorts after the usual `NN-name.conf` drop-ins, so its tables (which carry
/// over the administrator's) are the ones in force.
pub const CRIO_DROP_IN: &str = "zz-pinboard-fan-out.conf";
const HOSTS_TOML: &str = "hosts.toml";

/// Why a node cannot be wired, or its files not all put back.
#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(
        "containerd at {endpoint}: its hosts.toml files are on the node, and pinboard writes where it runs; \
         run pinboard on the node, or name a directory this machine shares with it as registryConfigDir in \
         the nodes file"
    )]
    RemoteContainerd { endpoint: CriEndpoint },
    #[error(
        "containerd has no registry config_path, so it cannot be given a mirror without a restart: it pulls \
         directly; to fan out to it, set config_path under [plugins.\"io.containerd.grpc.v1.cri\".registry] \
         (containerd 2: [plugins.\"io.containerd.cri.v1.images\".registry]), e.g. /etc/containerd/certs.d, \
         and restart containerd, or name it as registryConfigDir in the nodes file"
    )]
    NoConfigPath,
    /// containerd's config files, read for its registry `config_path`.
    #[error("reading containerd's configuration for its registry config_path: {0}")]
    ContainerdConfig(String),
    #[error(
        "CRI-O at {endpoint}: its registries.conf.d is on the node, and pinboard writes where it runs"
    )]
    RemoteCrio { endpoint: CriEndpoint },
    #[error("runtime {runtime:?}: fan-out wires only containerd and CRI-O")]
    UnknownRuntime { runtime: String },
    #[error("{}: another pinboard (pid {pid}) is fanning out to this node through it", path.display())]
    Busy { path: PathBuf, pid: u32 },
    #[error("{}: a file pinboard did not write has fan-out's name; move it away", path.display())]
    NotOurs { path: PathBuf },
    /// A hosts.toml that cannot be wired or put back.
    #[error("{}: {problem}", path.display())]
    Hosts {
        path: PathBuf,
        #[source]
        problem: WiringFileError,
    },
    /// The administrator's registries.conf files (the error names the file).
    #[error(transparent)]
    Registries(#[from] WiringFileError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{}: {error}", path.display())]
    Dir { path: PathBuf, error: io::Error },
    #[error(transparent)]
    Reload(#[from] PinError),
    #[error(
        "{}: changed since pinboard wired it, so it is left as it is; remove its [host.\"{endpoint}\"] \
         table and its pinboard-fan-out lines",
        path.display()
    )]
    Changed { path: PathBuf, endpoint: String },
    /// Wiring failed, and so did undoing what it had written.
    #[error("{failed}; undoing it: {undoing}")]
    NotUndone {
        failed: Box<WiringError>,
        undoing: Box<WiringError>,
    },
    /// Every file that could not be put back.
    #[error("{}", joined(.0))]
    Several(Vec<WiringError>),
}

fn joined(errors: &[WiringError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("; ")
}

/// Where fan-out writes on a node, as the command line and the nodes file say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WiringPaths {
    /// containerd: its registry `config_path` when the nodes file names it; else asked from containerd.
    pub registry_config_dir: Option<PathBuf>,
    /// CRI-O: its registries.conf.d.
    pub crio_registries_dir: PathBuf,
}

impl Default for WiringPaths {
    fn default() -> Self {
        WiringPaths {
            registry_config_dir: None,
            crio_registries_dir: REGISTRIES_CONF_DIR.into(),
        }
    }
}

/// How one node's runtime is pointed at the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// A hosts.toml per registry under containerd's registry `config_path`.
    Containerd { config_path: PathBuf },
    /// A drop-in in CRI-O's registries.conf.d, then `reload`.
    Crio {
        registries_dir: PathBuf,
        reload: Reload,
    },
}

/// containerd's registry `config_path`: as the nodes file names it (`registryConfigDir`); else as containerd
/// reports it in CRI `Status` (1.x); else as its config files set it (`containerdConfig` and what it
/// imports), which containerd 2 no longer reports. None when it has none.
pub async fn containerd_config_path(
    paths: &WiringPaths,
    containerd_config: &Path,
    client: &CriClient,
) -> Result<Option<PathBuf>, WiringError> {
    if let Some(dir) = &paths.registry_config_dir {
        return Ok(Some(dir.clone()));
    }
    if let Some(dir) = client.registry_config_path().await? {
        return Ok(Some(dir));
    }
    let config = containerd_config.to_path_buf();
    tokio::task::spawn_blocking(move || ContainerdFiles::read(&config))
        .await
        .map_err(|e| WiringError::ContainerdConfig(e.to_string()))?
        .map(|files| files.registry_config_path())
        .map_err(|e| WiringError::ContainerdConfig(e.to_string()))
}

/// How a node's runtime is wired, asked over its CRI socket `client`, given where its files are
/// (`paths`, its containerd config) and how it pins (CRI-O is reloaded the same way); Err says why it
/// cannot be (the node then pulls directly).
pub async fn locate(
    paths: &WiringPaths,
    containerd_config: &Path,
    pin: &PinTarget,
    client: &CriClient,
) -> Result<Wiring, WiringError> {
    let version = client.version().await?;
    let local = client.endpoint().is_local();
    let runtime = version.runtime_name;
    match RuntimeKind::of_cri_name(&runtime) {
        Some(RuntimeKind::Containerd) => {
            if paths.registry_config_dir.is_none() && !local {
                return Err(WiringError::RemoteContainerd {
                    endpoint: client.endpoint().clone(),
                });
            }
            let config_path = containerd_config_path(paths, containerd_config, client)
                .await?
                .ok_or(WiringError::NoConfigPath)?;
            Ok(Wiring::Containerd { config_path })
        }
        Some(RuntimeKind::Crio) if !local => Err(WiringError::RemoteCrio {
            endpoint: client.endpoint().clone(),
        }),
        Some(RuntimeKind::Crio) => Ok(Wiring::Crio {
            registries_dir: paths.crio_registries_dir.clone(),
            reload: match pin {
                PinTarget::CrioDropIn { reload, .. } => reload.clone(),
                _ => Reload::Systemctl,
            },
        }),
        None => Err(WiringError::UnknownRuntime { runtime }),
    }
}

/// The marker for files this process writes, pointing at `endpoint` (`http://HOST:PORT`).
pub fn marker(endpoint: &str) -> Marker {
    let pid = std::process::id();
    Marker {
        pid,
        started: started(pid).unwrap_or(0),
        endpoint: endpoint.to_string(),
    }
}

/// Whether the process that wrote `marker` still runs: the same pid, started at the same time.
fn alive(marker: &Marker) -> bool {
    started(marker.pid) == Some(marker.started)
}

/// When process `pid` started (clock ticks since boot: field 22 of `/proc/PID/stat`).
fn started(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from the last `)`.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What fan-out wrote on one node, to be undone with [`unwire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wired {
    wiring: Wiring,
    marker: Marker,
    /// The files written.
    files: Vec<PathBuf>,
}

impl Wired {
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

/// Points the node at the endpoint `marker` names for `sources`. Call [`clean_stale`] first: a file still
/// marked by another pinboard stops the wiring (another rollout fans out to this node). Nothing is left
/// half-written: on failure, what was written is undone. Blocking: call from `spawn_blocking`.
pub fn wire(wiring: &Wiring, sources: &[Source], marker: &Marker) -> Result<Wired, WiringError> {
    let mut wired = Wired {
        wiring: wiring.clone(),
        marker: marker.clone(),
        files: Vec::new(),
    };
    let written = match wiring {
        Wiring::Containerd { config_path } => {
            let mut registries: Vec<&str> = sources.iter().map(|s| s.registry.as_str()).collect();
            registries.sort_unstable();
            registries.dedup();
            registries.into_iter().try_for_each(|registry| {
                let path = config_path.join(registry).join(HOSTS_TOML);
                let original = read_optional(&path)?;
                if let Some(theirs) = original.as_deref().and_then(Marker::of) {
                    return Err(busy(&path, &theirs));
                }
                let text = containerd_hosts(original.as_deref(), marker)
                    .map_err(|problem| hosts_error(&path, problem))?;
                create_parent(&path)?;
                write_if_changed(&path, original.as_deref(), Some(&text))?;
                wired.files.push(path);
                Ok(())
            })
        }
        Wiring::Crio {
            registries_dir,
            reload,
        } => {
            let path = registries_dir.join(CRIO_DROP_IN);
            let existing = read_optional(&path)?;
            if let Some(text) = &existing {
                return Err(match Marker::of(text) {
                    Some(theirs) => busy(&path, &theirs),
                    None => WiringError::NotOurs { path },
                });
            }
            let files = registries_files(registries_dir)?;
            let files: Vec<RegistriesFile> = files
                .iter()
                .map(|(name, text)| RegistriesFile { name, text })
                .collect();
            let text = crio_registries(&files, sources, marker)?;
            create_parent(&path)?;
            write_if_changed(&path, None, Some(&text))?;
            wired.files.push(path);
            // Not `?`: a failed reload undoes the wiring below.
            reload_crio(reload).map_err(WiringError::from)
        }
    };
    match written {
        Ok(()) => Ok(wired),
        Err(failed) => Err(match unwire(&wired) {
            Ok(()) => failed,
            Err(undoing) => WiringError::NotUndone {
                failed: Box::new(failed),
                undoing: Box::new(undoing),
            },
        }),
    }
}

fn busy(path: &Path, theirs: &Marker) -> WiringError {
    WiringError::Busy {
        path: path.to_owned(),
        pid: theirs.pid,
    }
}

fn hosts_error(path: &Path, problem: WiringFileError) -> WiringError {
    WiringError::Hosts {
        path: path.to_owned(),
        problem,
    }
}

/// Puts back what [`wire`] wrote: each hosts.toml as it was (or gone), the CRI-O drop-in removed and CRI-O
/// reloaded. A file changed since is left as it is, with an error saying what to remove. Blocking.
pub fn unwire(wired: &Wired) -> Result<(), WiringError> {
    let mut problems = Vec::new();
    let mut removed = false;
    for path in &wired.files {
        let restored = match read_optional(path) {
            Ok(Some(text)) if Marker::of(&text).as_ref() == Some(&wired.marker) => {
                restore(&wired.wiring, path, &text)
            }
            // Gone, or someone else's now: nothing of ours to undo.
            Ok(_) => Ok(false),
            Err(e) => Err(e.into()),
        };
        match restored {
            Ok(done) => removed |= done,
            Err(e) => problems.push(e),
        }
    }
    if let Wiring::Crio { reload, .. } = &wired.wiring
        && removed
        && let Err(e) = reload_crio(reload)
    {
        problems.push(e.into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(WiringError::Several(problems))
    }
}

/// Puts back every file of `wiring` that a pinboard which is gone left behind; returns one line per file
/// restored. Files of a pinboard that still runs are left, except with `agent_start`: an agent at its
/// start puts back every marked file on its node, as the node's only fan-out writer while it runs. From
/// inside a container whether the writer runs cannot be told (a restarted agent may be the same pid in its
/// own PID namespace, and the pid of another namespace says nothing). Blocking.
pub fn clean_stale(wiring: &Wiring, agent_start: bool) -> Result<Vec<String>, WiringError> {
    let candidates = match wiring {
        Wiring::Containerd { config_path } => match fs::read_dir(config_path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(dir_error(config_path, e)),
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|entry| entry.path().join(HOSTS_TOML))
                .collect(),
        },
        Wiring::Crio { registries_dir, .. } => vec![registries_dir.join(CRIO_DROP_IN)],
    };
    let mut restored = Vec::new();
    for path in candidates {
        let Some(text) = read_optional(&path)? else {
            continue;
        };
        let Some(marker) = Marker::of(&text).filter(|m| agent_start || !alive(m)) else {
            continue;
        };
        if restore(wiring, &path, &text)? {
            restored.push(format!(
                "{}: restored, left by pinboard pid {} which is gone (its endpoint {} is down)",
                path.display(),
                marker.pid,
                marker.endpoint
            ));
        }
    }
    if let Wiring::Crio { reload, .. } = wiring
        && !restored.is_empty()
    {
        reload_crio(reload)?;
    }
    Ok(restored)
}

/// Puts one marked file back: a hosts.toml to its original (if nothing changed it since it was written),
/// the CRI-O drop-in removed. Whether a file changed. Blocking.
fn restore(wiring: &Wiring, path: &Path, text: &str) -> Result<bool, WiringError> {
    let original = match wiring {
        Wiring::Crio { .. } => None,
        Wiring::Containerd { .. } => {
            let original =
                containerd_original(text).map_err(|problem| hosts_error(path, problem))?;
            let marker = Marker::of(text).expect("restore is given marked files");
            let unchanged = containerd_hosts(original.as_deref(), &marker).is_ok_and(|w| w == text);
            if !unchanged {
                return Err(WiringError::Changed {
                    path: path.to_owned(),
                    endpoint: marker.endpoint,
                });
            }
            original
        }
    };
    let changed = write_if_changed(path, Some(text), original.as_deref())?;
    if original.is_none()
        && let Some(dir) = path
            .parent()
            .filter(|_| matches!(wiring, Wiring::Containerd { .. }))
    {
        // The host's directory was made for the file; an administrator's other files keep it.
        let _ = fs::remove_dir(dir);
    }
    Ok(changed)
}

/// What containers-image reads before fan-out's drop-in: `registries.conf` beside the directory, then the
/// directory's `*.conf` files by name (fan-out's own left out), as (name, text).
fn registries_files(dir: &Path) -> Result<Vec<(String, String)>, WiringError> {
    let main = dir
        .parent()
        .unwrap_or(Path::new("/"))
        .join("registries.conf");
    let mut files: Vec<(String, String)> = read_optional(&main)?
        .map(|text| (main.display().to_string(), text))
        .into_iter()
        .collect();
    let mut names = match fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(dir_error(dir, e)),
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".conf") && name != CRIO_DROP_IN)
            .collect(),
    };
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if let Some(text) = read_optional(&path)? {
            files.push((path.display().to_string(), text));
        }
    }
    Ok(files)
}

fn create_parent(path: &Path) -> Result<(), WiringError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| dir_error(dir, e))
}

fn dir_error(dir: &Path, error: io::Error) -> WiringError {
    WiringError::Dir {
        path: dir.to_owned(),
        error,
    }
}

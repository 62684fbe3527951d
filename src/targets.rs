//! Direct-mode targets: the nodes pinboard reaches over their CRI sockets, and how each one pins and
//! pulls lazily. From `--cri [NAME=]ENDPOINT` flags, a `--nodes FILE`, or the endpoint crictl would use.
//!
//! A nodes file is YAML, a list of nodes:
//! ```yaml
//! - name: worker-0
//!   endpoint: unix:///run/crio/crio.sock
//!   pin: crio-drop-in            # or containerd-label; default: from the runtime's name
//!   crioConfigDir: /etc/crio/crio.conf.d
//!   crioReload: signal:/var/run/crio/crio.pid   # or systemctl, restart, none
//!   lazyDropIn: /etc/containers/storage.conf.d/lazy-image-pull.conf   # CRI-O: lazy pulling's drop-in
//!   lazyStore: /var/lib/stargz-store/store:ref
//!   containerdConfig: /etc/containerd/config.toml   # containerd: whose `imports` take lazy pulling's file
//!   stargzSocket: /run/containerd-stargz-grpc/containerd-stargz-grpc.sock
//!   crioRegistriesDir: /etc/containers/registries.conf.d   # CRI-O: where fan-out's drop-in goes
//!   registryConfigDir: /etc/containerd/certs.d   # containerd: its config_path, if not the one it reports
//! ```
//! Settings a node leaves out come from the command line's `--crio-config-dir`, `--crio-reload`,
//! `--crio-registries-dir`, `--lazy-drop-in`, `--lazy-store`, `--containerd-config` and `--stargz-socket`, then
//! from the defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::backend::cri::{CriEndpoint, CriEndpointError};
use crate::backend::lazy::LazyConfig;
use crate::backend::pins::{CRIO_CONFIG_DIR, PinTarget, Reload};
use crate::backend::target::{DirectNode, NodeTarget};
use crate::backend::wiring::WiringPaths;
use crate::engine::NodeJob;
use crate::error::Failure;
use crate::model::holders::holders_of;
use crate::model::plan::NodePlan;
use crate::model::set::ImageSet;

/// Why the nodes could not be known from `--cri`, the nodes file or crictl's configuration.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    #[error(
        "no CRI endpoint: CONTAINER_RUNTIME_ENDPOINT is unset, /etc/crictl.yaml names none, and neither \
         /run/crio/crio.sock nor /run/containerd/containerd.sock exists, and no kubeconfig was found; pass --cri \
         [NAME=]ENDPOINT or --nodes FILE for nodes, or --kubeconfig FILE for a cluster"
    )]
    NoEndpoint,
    #[error("node name {name:?} is given twice")]
    NameTwice { name: String },
    #[error("--cri {flag}: {problem}")]
    CriFlag {
        flag: String,
        #[source]
        problem: NodeError,
    },
    #[error("{}: not a valid nodes file: {message}", path.display())]
    NotANodesFile { path: PathBuf, message: String },
    #[error("{}: lists no nodes", path.display())]
    NoNodes { path: PathBuf },
    #[error("{}: node {name:?}: {problem}", path.display())]
    Entry {
        path: PathBuf,
        name: String,
        #[source]
        problem: NodeError,
    },
}

/// Only "no endpoint at all" means nothing could be reached; everything else is a typo.
impl From<TargetsError> for Failure {
    fn from(error: TargetsError) -> Failure {
        match error {
            TargetsError::NoEndpoint => Failure::unreachable(vec![error.to_string()]),
            _ => Failure::bad_input(error.to_string()),
        }
    }
}

/// What is wrong with one node as given (a `--cri` flag, a nodes-file entry), or with `--crio-reload`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Endpoint(#[from] CriEndpointError),
    #[error("node name {name:?} is not a DNS name (lowercase letters, digits, '-', '.')")]
    NotADnsName { name: String },
    #[error("name each node when giving several: --cri NAME={endpoint}")]
    Unnamed { endpoint: CriEndpoint },
    #[error("CRI-O reload {text:?} is not signal:PIDFILE, systemctl, restart or none")]
    Reload { text: String },
    #[error("pin {pin:?} is not crio-drop-in or containerd-label")]
    Pin { pin: String },
}

/// The engine's jobs: each target with its plan from a survey of those targets, in the same order, its
/// images' pins held by the `sets` that list them.
pub fn jobs(targets: &[NodeTarget], plans: Vec<NodePlan>, sets: &[ImageSet]) -> Vec<NodeJob> {
    let holders = Arc::new(holders_of(sets));
    targets
        .iter()
        .zip(plans)
        .map(|(t, plan)| NodeJob {
            node: t.node.clone(),
            plan,
            pin: t.pin.clone(),
            holders: Arc::clone(&holders),
            lazy: t.lazy.clone(),
        })
        .collect()
}

/// Settings that apply to every node unless its nodes-file entry says otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDefaults {
    /// Set when `--crio-config-dir` or `--crio-reload` was given: CRI-O nodes write there.
    pub crio_config_dir: Option<PathBuf>,
    pub crio_reload: Option<Reload>,
    pub lazy: LazyConfig,
    pub wiring: WiringPaths,
}

impl NodeDefaults {
    /// The pin target of a node that names no method: detected from the runtime, unless the command line
    /// named a CRI-O config dir or reload, which then apply to CRI-O nodes.
    fn pin(&self) -> PinTarget {
        if self.crio_config_dir.is_none() && self.crio_reload.is_none() {
            return PinTarget::Detect;
        }
        PinTarget::CrioDropIn {
            config_dir: self
                .crio_config_dir
                .clone()
                .unwrap_or_else(|| CRIO_CONFIG_DIR.into()),
            reload: self.crio_reload.clone().unwrap_or(Reload::Systemctl),
        }
    }
}

/// `signal:PIDFILE`, `systemctl`, `restart` or `none`, as `--crio-reload` takes it.
pub fn parse_reload(text: &str) -> Result<Reload, NodeError> {
    match text {
        "systemctl" => Ok(Reload::Systemctl),
        "restart" => Ok(Reload::Restart),
        "none" => Ok(Reload::None),
        _ => match text.strip_prefix("signal:") {
            Some(pidfile) if !pidfile.is_empty() => Ok(Reload::Signal {
                pidfile: pidfile.into(),
            }),
            _ => Err(NodeError::Reload {
                text: text.to_owned(),
            }),
        },
    }
}

/// The nodes of `--cri` flags, or of a nodes file's text, or the endpoint crictl would use.
pub fn resolve(
    cri: &[String],
    nodes_file: Option<(&Path, &str)>,
    defaults: &NodeDefaults,
) -> Result<Vec<NodeTarget>, TargetsError> {
    let target = |node| NodeTarget {
        node,
        pin: defaults.pin(),
        lazy: defaults.lazy.clone(),
        wiring: defaults.wiring.clone(),
    };
    let mut targets = match nodes_file {
        Some((path, text)) => parse_nodes_file(path, text, defaults)?,
        None => Vec::new(),
    };
    targets.extend(
        parse_cri_flags(cri, targets.is_empty())?
            .into_iter()
            .map(target),
    );
    if targets.is_empty() {
        let endpoint = default_endpoint().ok_or(TargetsError::NoEndpoint)?;
        targets.push(target(DirectNode {
            name: host_name(),
            endpoint,
        }));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = targets.iter().find(|t| !seen.insert(t.node.name.clone())) {
        return Err(TargetsError::NameTwice {
            name: twice.node.name.clone(),
        });
    }
    Ok(targets)
}

/// `--cri` values to nodes. An unnamed endpoint is named after this host, if it is the only node.
fn parse_cri_flags(flags: &[String], alone: bool) -> Result<Vec<DirectNode>, TargetsError> {
    flags
        .iter()
        .map(|flag| {
            parse_cri_flag(flag, alone && flags.len() == 1).map_err(|problem| {
                TargetsError::CriFlag {
                    flag: flag.clone(),
                    problem,
                }
            })
        })
        .collect()
}

/// One `--cri` value; `only` when it is the only node, which may then go unnamed.
fn parse_cri_flag(flag: &str, only: bool) -> Result<DirectNode, NodeError> {
    // `NAME=` only when what precedes `=` cannot be part of an endpoint.
    let (name, endpoint) = match flag.split_once('=') {
        Some((name, endpoint)) if !name.contains([':', '/']) => (Some(name), endpoint),
        _ => (None, flag),
    };
    let endpoint: CriEndpoint = endpoint.parse()?;
    let name = match name {
        Some(name) => checked_name(name)?,
        None if only => host_name(),
        None => return Err(NodeError::Unnamed { endpoint }),
    };
    Ok(DirectNode { name, endpoint })
}

fn checked_name(name: &str) -> Result<String, NodeError> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if valid {
        Ok(name.to_string())
    } else {
        Err(NodeError::NotADnsName {
            name: name.to_owned(),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeEntry {
    name: String,
    endpoint: String,
    pin: Option<String>,
    crio_config_dir: Option<PathBuf>,
    crio_reload: Option<String>,
    lazy_drop_in: Option<PathBuf>,
    lazy_store: Option<String>,
    containerd_config: Option<PathBuf>,
    stargz_socket: Option<PathBuf>,
    crio_registries_dir: Option<PathBuf>,
    registry_config_dir: Option<PathBuf>,
}

fn parse_nodes_file(
    path: &Path,
    text: &str,
    defaults: &NodeDefaults,
) -> Result<Vec<NodeTarget>, TargetsError> {
    let entries: Vec<NodeEntry> =
        serde_saphyr::from_str(text).map_err(|e| TargetsError::NotANodesFile {
            path: path.to_owned(),
            message: e
                .without_snippet()
                .to_string()
                .lines()
                .next()
                .unwrap_or("")
                .to_owned(),
        })?;
    if entries.is_empty() {
        return Err(TargetsError::NoNodes {
            path: path.to_owned(),
        });
    }
    entries
        .into_iter()
        .map(|entry| {
            let named = |problem: NodeError| TargetsError::Entry {
                path: path.to_owned(),
                name: entry.name.clone(),
                problem,
            };
            let endpoint: CriEndpoint = entry
                .endpoint
                .parse()
                .map_err(|e: CriEndpointError| named(e.into()))?;
            let reload = entry
                .crio_reload
                .as_deref()
                .map(parse_reload)
                .transpose()
                .map_err(named)?;
            let crio = || PinTarget::CrioDropIn {
                config_dir: entry
                    .crio_config_dir
                    .clone()
                    .or(defaults.crio_config_dir.clone())
                    .unwrap_or(CRIO_CONFIG_DIR.into()),
                reload: reload
                    .clone()
                    .or(defaults.crio_reload.clone())
                    .unwrap_or(Reload::Systemctl),
            };
            let pin = match entry.pin.as_deref() {
                None if entry.crio_config_dir.is_some() || reload.is_some() => crio(),
                None => defaults.pin(),
                Some("crio-drop-in") => crio(),
                Some("containerd-label") => PinTarget::ContainerdLabel,
                Some(other) => {
                    return Err(named(NodeError::Pin {
                        pin: other.to_owned(),
                    }));
                }
            };
            let lazy = LazyConfig {
                file: entry
                    .lazy_drop_in
                    .unwrap_or_else(|| defaults.lazy.file.clone()),
                store: entry
                    .lazy_store
                    .unwrap_or_else(|| defaults.lazy.store.clone()),
                containerd_config: entry
                    .containerd_config
                    .unwrap_or_else(|| defaults.lazy.containerd_config.clone()),
                stargz_socket: entry
                    .stargz_socket
                    .unwrap_or_else(|| defaults.lazy.stargz_socket.clone()),
            };
            let wiring = WiringPaths {
                registry_config_dir: entry.registry_config_dir,
                crio_registries_dir: entry
                    .crio_registries_dir
                    .unwrap_or_else(|| defaults.wiring.crio_registries_dir.clone()),
            };
            let name = checked_name(&entry.name).map_err(named)?;
            Ok(NodeTarget {
                node: DirectNode { name, endpoint },
                pin,
                lazy,
                wiring,
            })
        })
        .collect()
}

pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The endpoint crictl would pick: CONTAINER_RUNTIME_ENDPOINT, /etc/crictl.yaml, then the first existing
/// default socket of CRI-O or containerd.
pub fn default_endpoint() -> Option<CriEndpoint> {
    #[derive(Deserialize)]
    struct CrictlConfig {
        #[serde(rename = "runtime-endpoint")]
        runtime_endpoint: Option<String>,
    }
    if let Ok(value) = std::env::var("CONTAINER_RUNTIME_ENDPOINT") {
        return value.parse().ok();
    }
    let configured = std::fs::read_to_string("/etc/crictl.yaml")
        .ok()
        .and_then(|text| serde_saphyr::from_str::<CrictlConfig>(&text).ok())
        .and_then(|c| c.runtime_endpoint);
    if let Some(endpoint) = configured {
        return endpoint.parse().ok();
    }
    [
        "/run/crio/crio.sock",
        "/run/containerd/containerd.sock",
        "/var/run/crio/crio.sock",
    ]
    .iter()
    .find(|p| Path::new(p).exists())
    .map(|p| CriEndpoint::Unix(PathBuf::from(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(targets: &[NodeTarget]) -> Vec<&str> {
        targets.iter().map(|t| t.node.name.as_str()).collect()
    }

    #[test]
    fn cri_flags_name_nodes() {
        let d = NodeDefaults::default();
        let targets = resolve(
            &["n1=unix:///a.sock".into(), "n2=tcp://10.0.0.2:10010".into()],
            None,
            &d,
        )
        .unwrap();
        assert_eq!(names(&targets), ["n1", "n2"]);
        assert_eq!(
            targets[0].node.endpoint,
            CriEndpoint::Unix("/a.sock".into())
        );
        assert_eq!(
            targets[1].node.endpoint,
            CriEndpoint::Tcp("10.0.0.2:10010".into())
        );
        assert_eq!(targets[0].pin, PinTarget::Detect);

        assert_eq!(
            names(&resolve(&["unix:///a.sock".into()], None, &d).unwrap()),
            [host_name()]
        );
        let unnamed = resolve(
            &["unix:///a.sock".into(), "unix:///b.sock".into()],
            None,
            &d,
        )
        .unwrap_err()
        .to_string();
        assert!(unnamed.contains("name each node"), "{unnamed}");
        let twice = resolve(
            &["a=unix:///a.sock".into(), "a=unix:///b.sock".into()],
            None,
            &d,
        )
        .unwrap_err()
        .to_string();
        assert!(twice.contains("given twice"), "{twice}");
        assert!(
            resolve(&["n1=http://x".into()], None, &d)
                .unwrap_err()
                .to_string()
                .starts_with("--cri n1=http://x: CRI endpoint")
        );
        assert!(
            resolve(&["N_1=unix:///a.sock".into()], None, &d)
                .unwrap_err()
                .to_string()
                .contains("not a DNS name")
        );
    }

    #[test]
    fn command_line_crio_settings_apply_to_every_node() {
        let d = NodeDefaults {
            crio_config_dir: Some("/tmp/crio.d".into()),
            crio_reload: Some(Reload::Signal {
                pidfile: "/run/crio.pid".into(),
            }),
            ..NodeDefaults::default()
        };
        let targets = resolve(&["n1=unix:///a.sock".into()], None, &d).unwrap();
        assert_eq!(
            targets[0].pin,
            PinTarget::CrioDropIn {
                config_dir: "/tmp/crio.d".into(),
                reload: Reload::Signal {
                    pidfile: "/run/crio.pid".into()
                }
            }
        );
    }

    #[test]
    fn nodes_files_give_each_node_its_settings() {
        let text = "- name: w0\n  endpoint: unix:///run/crio/crio.sock\n  crioReload: signal:/run/crio.pid\n  \
                    crioRegistriesDir: /tmp/registries.conf.d\n\
                    - name: w1\n  endpoint: unix:///run/containerd/containerd.sock\n  pin: containerd-label\n  \
                    lazyDropIn: /tmp/lazy.conf\n  registryConfigDir: /tmp/certs.d\n  \
                    containerdConfig: /tmp/containerd.toml\n  stargzSocket: /tmp/stargz.sock\n\
                    - name: w2\n  endpoint: tcp://10.0.0.3:10010\n";
        let targets = resolve(
            &[],
            Some((Path::new("nodes.yaml"), text)),
            &NodeDefaults::default(),
        )
        .unwrap();
        assert_eq!(names(&targets), ["w0", "w1", "w2"]);
        assert_eq!(
            targets[0].pin,
            PinTarget::CrioDropIn {
                config_dir: CRIO_CONFIG_DIR.into(),
                reload: Reload::Signal {
                    pidfile: "/run/crio.pid".into()
                }
            }
        );
        assert_eq!(targets[1].pin, PinTarget::ContainerdLabel);
        assert_eq!(targets[1].lazy.file, PathBuf::from("/tmp/lazy.conf"));
        assert_eq!(
            targets[1].lazy.containerd_config,
            PathBuf::from("/tmp/containerd.toml")
        );
        assert_eq!(
            targets[1].lazy.stargz_socket,
            PathBuf::from("/tmp/stargz.sock")
        );
        assert_eq!(targets[2].pin, PinTarget::Detect);
        assert_eq!(targets[2].lazy, LazyConfig::default());
        assert_eq!(
            targets[0].wiring.crio_registries_dir,
            PathBuf::from("/tmp/registries.conf.d")
        );
        assert_eq!(
            targets[1].wiring.registry_config_dir,
            Some(PathBuf::from("/tmp/certs.d"))
        );
        assert_eq!(targets[2].wiring, WiringPaths::default());
    }

    #[test]
    fn bad_nodes_files_name_file_node_and_problem() {
        let path = Path::new("nodes.yaml");
        let bad_pin = "- name: w0\n  endpoint: unix:///a.sock\n  pin: glue\n";
        let err = resolve(&[], Some((path, bad_pin)), &NodeDefaults::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "nodes.yaml: node \"w0\": pin \"glue\" is not crio-drop-in or containerd-label"
        );
        let typo = "- name: w0\n  endpoint: unix:///a.sock\n  pinn: crio-drop-in\n";
        assert!(
            resolve(&[], Some((path, typo)), &NodeDefaults::default())
                .unwrap_err()
                .to_string()
                .starts_with("nodes.yaml: not a valid nodes file")
        );
        assert!(
            resolve(&[], Some((path, "[]")), &NodeDefaults::default())
                .unwrap_err()
                .to_string()
                .contains("lists no nodes")
        );
        assert_eq!(
            parse_reload("signal:").unwrap_err().to_string(),
            "CRI-O reload \"signal:\" is not signal:PIDFILE, systemctl, restart or none"
        );
        assert_eq!(parse_reload("restart"), Ok(Reload::Restart));
    }
}

//! The argument list every command and the terminal UI share: which sets (`--set`, `--images-file`,
//! `--image`), which nodes (`--cri`, `--nodes`, or a cluster), how to reach registries, where fetched blobs
//! are kept, when a node counts as full, and how a rollout runs. `plan`, `check`, `status`, `apply`, `unpin` and the TUI all take the
//! whole list, so an operator can reuse one argument list for every command: a flag a command does not
//! need is accepted and ignored. Also turning those arguments into what the commands and the TUI talk to:
//! the [`Fleet`] of nodes ([`CommonArgs::fleet`], the one place that decides how nodes are reached), the
//! sets' sources, and a registry client.

use std::net::{AddrParseError, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use regex::Regex;

use crate::backend::blobs::cache::{self, CacheOptions};
use crate::backend::kube::served_apis;
use crate::backend::lazy::LazyConfig;
use crate::backend::lazy::containerd::{CONTAINERD_CONFIG, STARGZ_SOCKET};
use crate::backend::lazy::storage::{LAZY_DROP_IN, STARGZ_STORE, STORAGE_CONF_DIR};
use crate::backend::openshift::ConnectOptions;
use crate::backend::registries_conf::MirrorSources;
use crate::backend::registry::{Registry, RegistryOptions};
use crate::backend::target::NodeTarget;
use crate::backend::wiring::{REGISTRIES_CONF_DIR, WiringPaths};
use crate::engine::EngineConfig;
use crate::error::Failure;
use crate::fanout::LOOPBACK;
use crate::fleet::agents::{AgentsFleet, AgentsSettings};
use crate::fleet::direct::{DirectConfig, DirectFleet};
use crate::fleet::machine_config::registry::RegistrySettings;
use crate::fleet::machine_config::{self, MachineConfigFleet, MachineConfigSettings};
use crate::fleet::{Fleet, SetSources};
use crate::model::image::Platform;
use crate::model::plan::Limits;
use crate::model::readiness::LazyImages;
use crate::model::release_payload::SetOptions;
use crate::model::units::{parse_bytes, parse_duration, parse_rate};
use crate::targets::{self, NodeDefaults, parse_reload};

/// `check --wait`'s default limit.
pub const CHECK_WAIT: Duration = Duration::from_secs(10 * 60);
/// Cluster-mode `apply`'s default wait for the daemons.
pub const APPLY_WAIT: Duration = Duration::from_secs(30 * 60);

/// A flag's value that names nothing pinboard can use.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("{text:?} is not IP:PORT ({error})")]
    NotAnAddress { text: String, error: AddrParseError },
    #[error(
        "{addr} is not an address nodes can be pointed at; give this machine's address on their network, \
         e.g. 10.0.0.5:{}",
        addr.port()
    )]
    Unspecified { addr: SocketAddr },
    #[error("not a regular expression: {0}")]
    NotARegex(regex::Error),
}

/// Who builds a fleet ([`CommonArgs::fleet`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A headless command; `check` asks the runtimes under `--verify-cri`.
    Command {
        asks_runtimes: bool,
    },
    Tui {
        readonly: bool,
    },
}

/// The API a cluster's nodes are reached through ([`TargetArgs::cluster_api`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterApi {
    /// pinboard's agents (PinSets and PinboardNodes), on any Kubernetes cluster.
    Agents,
    /// OpenShift's machine-config daemons (PinnedImageSets).
    MachineConfig,
}

/// The one argument list of every command.
#[derive(Args, Debug, Default)]
pub struct CommonArgs {
    #[command(flatten)]
    pub input: SetInput,
    #[command(flatten)]
    pub targets: TargetArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub rollout: RolloutArgs,
    #[command(flatten)]
    pub unpin: UnpinArgs,
    /// Output format of the headless commands: table (`release`: yaml), json, yaml.
    #[arg(short, long, value_enum, help_heading = "Output")]
    pub output: Option<Output>,
}

impl CommonArgs {
    /// `-o`, else a table.
    pub fn output(&self) -> Output {
        self.output.unwrap_or_default()
    }
}

/// How a rollout runs and how long readiness is waited for.
#[derive(Args, Debug)]
#[command(next_help_heading = "Rollout")]
pub struct RolloutArgs {
    /// Pulls at once per node.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub parallel: usize,
    /// Also start nodes whose plan verdict is no-space (cluster mode: also write a set that lands in no
    /// pool).
    #[arg(long)]
    pub force: bool,
    /// `check`: wait until every node is ready, observing them again every 2s; one line on stderr per change.
    #[arg(long)]
    pub wait: bool,
    /// How long `check --wait` (default 10m) and cluster-mode `apply` (default 30m) wait, e.g. 90s, 10m, 1h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Cluster-mode `check`: also ask the runtimes of the nodes named by --cri or --nodes, and require their
    /// confirmation.
    #[arg(long)]
    pub verify_cri: bool,
    /// `check`, `status`, `apply` (direct mode): an image present only lazily (layers still in the registry)
    /// counts as there, for sets whose purpose is a fast start rather than independence from the link.
    #[arg(long)]
    pub allow_lazy: bool,
    /// `apply` and the TUI: fan out. pinboard serves the sets' images from its blob cache and points every
    /// node at it for the rollout, so each blob crosses the registry link once (docs/fan-out.md). Through
    /// pinboard's agents, the sets get spec.fanOut: the nodes pull through the in-cluster cache.
    #[arg(long)]
    pub fan_out: bool,
    /// Where fan-out serves the nodes: an address of this machine they can reach, e.g. 10.0.0.5:5050.
    /// Default 127.0.0.1 on any free port, for nodes on local sockets.
    #[arg(long, value_name = "ADDR", value_parser = parse_reachable)]
    pub fan_out_listen: Option<SocketAddr>,
    /// `apply` and the TUI: a pull whose bytes have not moved for this long is cancelled and tried again,
    /// as containerd 1.7's image_pull_progress_timeout does (containerd 1.6 waits on a stalled connection
    /// for as long as the pull may last). 0 turns it off.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5m")]
    pub pull_progress_timeout: Duration,
}

/// `--fan-out-listen`: an address nodes can be pointed at, so not 0.0.0.0 or `[::]`.
fn parse_reachable(text: &str) -> Result<SocketAddr, OptionsError> {
    let addr: SocketAddr = text.parse().map_err(|error| OptionsError::NotAnAddress {
        text: text.to_owned(),
        error,
    })?;
    if addr.ip().is_unspecified() {
        return Err(OptionsError::Unspecified { addr });
    }
    Ok(addr)
}

impl Default for RolloutArgs {
    fn default() -> Self {
        RolloutArgs {
            parallel: 5,
            force: false,
            wait: false,
            timeout: None,
            verify_cri: false,
            allow_lazy: false,
            fan_out: false,
            fan_out_listen: None,
            pull_progress_timeout: EngineConfig::default().pull_progress_timeout,
        }
    }
}

impl RolloutArgs {
    /// `--timeout`, or `default` when it was not given.
    pub fn timeout_or(&self, default: Duration) -> Duration {
        self.timeout.unwrap_or(default)
    }

    /// Whether an image present only lazily counts as there (`--allow-lazy`).
    pub fn lazy_images(&self) -> LazyImages {
        match self.allow_lazy {
            true => LazyImages::Accepted,
            false => LazyImages::NotReady,
        }
    }

    /// How the engine runs these flags' rollouts.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            parallel: self.parallel.max(1),
            force: self.force,
            pull_progress_timeout: self.pull_progress_timeout,
            lazy_images: self.lazy_images(),
            ..EngineConfig::default()
        }
    }
}

/// What `unpin` releases in direct mode besides the holds of the sets it names (docs/pins.md).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Unpin")]
pub struct UnpinArgs {
    /// `unpin`: release every set's hold on the nodes; an administrator's entries and unowned pins stay.
    #[arg(long)]
    pub all_sets: bool,
    /// `unpin`: also release the pins of the named sets' images that no set holds (pinned before pinboard
    /// recorded holders, or by someone else).
    #[arg(long)]
    pub release_unowned: bool,
}

/// Which images: any mix of these, each set checked against the PinnedImageSet rules.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Sets")]
pub struct SetInput {
    /// PinnedImageSet YAML (several documents allowed). Repeatable.
    #[arg(long = "set", value_name = "FILE")]
    pub sets: Vec<PathBuf>,
    /// A list file: one reference per line, `#` comments, blank lines ignored. Repeatable.
    #[arg(long = "images-file", value_name = "FILE")]
    pub images_files: Vec<PathBuf>,
    /// One image reference (HOST/[NAMESPACE/]NAME@sha256:DIGEST). Repeatable.
    #[arg(long = "image", value_name = "REF")]
    pub images: Vec<String>,
    /// An OpenShift release image, by tag or digest: its components and the release image itself, as the
    /// PinnedImageSet `pinboard release` prints. Repeatable.
    #[arg(long = "release", value_name = "PULLSPEC")]
    pub releases: Vec<String>,
    /// Agents: the nodes the sets land on, as `kubectl -l` writes a selector (`role=web,zone in (a,b)`);
    /// it replaces the sets' own `nodeSelector`.
    #[arg(long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    #[command(flatten)]
    pub release: ReleaseArgs,
}

/// How a release becomes sets (`pinboard release` and `--release`).
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Releases")]
pub struct ReleaseArgs {
    /// The pool a release's sets land in: their machineconfiguration.openshift.io/role label.
    #[arg(long, value_name = "POOL", default_value = "worker")]
    pub pool: String,
    /// Leave out a release's components whose tag name or pull spec matches REGEX. Repeatable.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub exclude: Vec<Regex>,
    /// A release's set name (default release-VERSION; over 500 images, numbered from 1).
    #[arg(long = "release-name", visible_alias = "name", value_name = "NAME")]
    pub release_name: Option<String>,
}

impl ReleaseArgs {
    pub fn set_options(&self) -> SetOptions {
        SetOptions {
            name: self.release_name.clone(),
            pool: self.pool.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

fn parse_regex(text: &str) -> Result<Regex, OptionsError> {
    Regex::new(text).map_err(OptionsError::NotARegex)
}

/// Which nodes: reached directly over their CRI sockets (and how pinboard changes them), or through a
/// cluster's API server (cluster mode).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Nodes")]
pub struct TargetArgs {
    /// Cluster mode, with this kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Cluster mode, with this context of the kubeconfig.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Cluster mode, with the kubeconfig from KUBECONFIG or ~/.kube/config, or the pod's service account.
    /// Without any target flag, pinboard uses the local CRI endpoint if there is one, else this.
    #[arg(long)]
    pub cluster: bool,
    /// Cluster mode: which API pinboard works through when the cluster serves both OpenShift's
    /// machine-config API and pinboard's agents (default: agents); a cluster serving one needs no choice.
    #[arg(long, value_enum, value_name = "API")]
    pub cluster_api: Option<ClusterApi>,
    /// Cluster mode on agents: the namespace they run in (their heartbeats and pull Secrets). On OpenShift
    /// with the agents installed too, where the plan finds their heartbeats.
    #[arg(long, value_name = "NS", default_value = crate::model::pinboard_api::DEFAULT_NAMESPACE)]
    pub agents_namespace: String,
    /// A node's CRI endpoint: [NAME=]unix:///path or [NAME=]tcp://host:port. Repeatable. Without it or
    /// --nodes, the endpoint crictl would use (CONTAINER_RUNTIME_ENDPOINT, /etc/crictl.yaml, the CRI-O and
    /// containerd sockets).
    #[arg(long = "cri", value_name = "[NAME=]ENDPOINT")]
    pub cri: Vec<String>,
    /// YAML list of nodes: name, endpoint, and per-node pin and lazy-pull settings (docs/nodes-file.md).
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
    /// The nodes' platform, for multi-platform images: os/arch[/variant]. Default: this machine's.
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// Timeout for each CRI call: 30, 30s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub cri_timeout: Duration,
    /// CRI-O nodes: where the 50-pinned-images drop-in goes. Default /etc/crio/crio.conf.d.
    #[arg(long, value_name = "DIR")]
    pub crio_config_dir: Option<PathBuf>,
    /// CRI-O nodes: how CRI-O re-reads its config: signal:PIDFILE, systemctl (reload), restart
    /// (`systemctl restart crio`, for versions whose reload does not apply pins) or none. Default systemctl.
    #[arg(long, value_name = "HOW", value_parser = parse_reload)]
    pub crio_reload: Option<crate::backend::pins::Reload>,
    /// CRI-O nodes under fan-out: the registries.conf.d directory its mirror drop-in goes to.
    #[arg(long, value_name = "DIR", default_value = REGISTRIES_CONF_DIR)]
    pub crio_registries_dir: PathBuf,
    /// CRI-O nodes: the lazy-pull storage drop-in.
    #[arg(long, value_name = "FILE", default_value_t = format!("{STORAGE_CONF_DIR}/{LAZY_DROP_IN}"))]
    pub lazy_drop_in: String,
    /// CRI-O nodes: the additional layer store the lazy-pull drop-in names.
    #[arg(long, value_name = "PATH:ref", default_value = STARGZ_STORE)]
    pub lazy_store: String,
    /// containerd nodes: containerd's config, whose `imports` name the directory lazy pulling's file goes in.
    #[arg(long, value_name = "FILE", default_value = CONTAINERD_CONFIG)]
    pub containerd_config: PathBuf,
    /// containerd nodes: stargz-snapshotter's socket, which lazy pulling's proxy plugin names.
    #[arg(long, value_name = "PATH", default_value = STARGZ_SOCKET)]
    pub stargz_socket: PathBuf,
}

/// How to reach registries.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Registries")]
pub struct RegistryArgs {
    /// Registry credentials (containers-auth.json / docker config format). Default: REGISTRY_AUTH_FILE,
    /// $XDG_RUNTIME_DIR/containers/auth.json, ~/.docker/config.json, /var/lib/kubelet/config.json.
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
    /// Talk plain HTTP to this registry (HOST[:PORT]). Repeatable. All others use HTTPS.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Registry CAs (*.crt) and client certificates (*.cert + *.key) in DIR/HOST[:PORT]/, instead of
    /// /etc/containers/certs.d, /etc/docker/certs.d and ~/.config/containers/certs.d.
    #[arg(long, value_name = "DIR")]
    pub certs_dir: Option<PathBuf>,
    /// Manifest requests in flight at once.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub registry_concurrency: usize,
    /// Cluster mode: do not read the cluster's global pull secret (openshift-config/pull-secret), which is
    /// otherwise used before the default auth files when no --authfile is given.
    #[arg(long)]
    pub no_pull_secret: bool,
    /// Mirrors for pinboard's own registry reads: this registries.conf instead of
    /// /etc/containers/registries.conf (or ~/.config/containers/registries.conf).
    #[arg(long, value_name = "FILE")]
    pub registries_conf: Option<PathBuf>,
    /// Drop-ins (*.conf, by name) read after the registries.conf, instead of
    /// /etc/containers/registries.conf.d.
    #[arg(long, value_name = "DIR")]
    pub registries_conf_dir: Option<PathBuf>,
    /// ImageDigestMirrorSet or ImageContentSourcePolicy YAML whose digest mirrors pinboard's reads follow
    /// too (in cluster mode the cluster's own are read as well). Repeatable.
    #[arg(long = "idms", value_name = "FILE")]
    pub mirror_sets: Vec<PathBuf>,
}

impl RegistryArgs {
    /// Where mirror rules come from.
    pub fn mirror_sources(&self) -> MirrorSources {
        MirrorSources {
            conf: self.registries_conf.clone(),
            dir: self.registries_conf_dir.clone(),
            mirror_sets: self.mirror_sets.clone(),
        }
    }
}

/// Where blobs fetched from registries are kept (`pinboard mirror`).
#[derive(Args, Debug)]
#[command(next_help_heading = "Blob cache")]
pub struct CacheArgs {
    /// The blob cache. Default $XDG_CACHE_HOME/pinboard/blobs, else ~/.cache/pinboard/blobs.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Bytes of complete blobs the cache keeps; the least recently used go first, e.g. 100Gi.
    #[arg(long, value_name = "SIZE", default_value = "50Gi", value_parser = parse_bytes)]
    pub cache_max: u64,
    /// A budget for the registry link, e.g. 6MiB/s or 50Mbit/s: what the blob cache takes from the
    /// registries, all downloads together, stays under it however many nodes pull (fan-out, `mirror`);
    /// `plan` shows how long the link bytes take at it. Default: no budget.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub link_rate: Option<u64>,
}

impl Default for CacheArgs {
    fn default() -> Self {
        CacheArgs {
            cache_dir: None,
            cache_max: cache::DEFAULT_MAX_BYTES,
            link_rate: None,
        }
    }
}

impl CacheArgs {
    /// `--cache-dir`, else the default; bad input when there is no default (no XDG_CACHE_HOME nor HOME).
    pub fn dir(&self) -> Result<PathBuf, Failure> {
        self.cache_dir
            .clone()
            .or_else(cache::default_dir)
            .ok_or_else(|| {
                Failure::bad_input(
                    "no place for the blob cache: neither XDG_CACHE_HOME nor HOME is set; pass --cache-dir DIR",
                )
            })
    }

    pub fn options(&self) -> CacheOptions {
        CacheOptions {
            max_bytes: self.cache_max,
            link_rate: self.link_rate,
            ..CacheOptions::default()
        }
    }
}

/// When a node counts as full.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Disk limits")]
pub struct LimitArgs {
    /// Kubelet image GC high threshold, percent: a node above it after pre-loading is `tight`. Default: in
    /// cluster mode each node's kubelet's own (its configuration), else 85.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub gc_high_percent: Option<u8>,
    /// Free space that must remain after pre-loading, e.g. 16Gi (default: 16Gi, the OpenShift daemon's
    /// floor). On pinboard's agents each agent pulls by its own: given to `plan`, a what-if.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub min_free: Option<u64>,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        let default = Limits::default();
        Limits {
            gc_high_percent: self.gc_high_percent.unwrap_or(default.gc_high_percent),
            gc_high_given: self.gc_high_percent.is_some(),
            min_free_bytes: self.min_free.unwrap_or(default.min_free_bytes),
            min_free_given: self.min_free.is_some(),
            ..default
        }
    }
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
    Yaml,
}

/// How to reach registries, with the local mirror rules.
pub fn registry_options(args: &RegistryArgs) -> Result<RegistryOptions, Failure> {
    let mirrors = args.mirror_sources().load()?;
    Ok(RegistryOptions {
        authfile: args.authfile.clone(),
        insecure_registries: args.insecure_registries.clone(),
        certs_dir: args.certs_dir.clone(),
        concurrency: args.registry_concurrency.max(1),
        mirrors,
        ..RegistryOptions::default()
    })
}

pub fn registry_client(args: &RegistryArgs) -> Result<Registry, Failure> {
    Registry::new(registry_options(args)?).map_err(|e| Failure::bad_input(e.to_string()))
}

impl CommonArgs {
    /// The nodes these arguments name, the one place that decides how they are reached: a cluster when
    /// the flags choose it ([`TargetArgs::cluster_mode`]), through the API it serves ([`Self::cluster_api`]),
    /// else direct nodes. In cluster mode `--cri` and
    /// `--nodes` name nodes only for `check --verify-cri`; a headless command that does not ask runtimes
    /// says it ignores them (the TUI does not: the terminal is its own).
    pub async fn fleet(&self, caller: Caller) -> Result<Box<dyn Fleet>, Failure> {
        let targets = &self.targets;
        let release = self.input.release.set_options();
        let Some(connect) = targets.cluster_mode() else {
            return Ok(Box::new(DirectFleet::new(DirectConfig {
                targets: targets.resolve()?,
                registry: registry_client(&self.registry)?,
                platform: targets.platform()?,
                limits: self.limits.limits(),
                timeout: targets.timeout(),
                engine: EngineConfig {
                    readonly: caller == Caller::Tui { readonly: true },
                    ..self.rollout.engine_config()
                },
                cache_dir: self.cache.dir().ok(),
                cache_options: self.cache.options(),
                fan_out_listen: self.rollout.fan_out_listen.unwrap_or(LOOPBACK),
                release_unowned: self.unpin.release_unowned,
                lazy_images: self.rollout.lazy_images(),
            })));
        };
        if self.cluster_api(&connect).await? == ClusterApi::Agents {
            return Ok(Box::new(AgentsFleet::new(AgentsSettings {
                connect,
                namespace: targets.agents_namespace.clone(),
                registry: registry_options(&self.registry)?,
                platform: targets.platform()?,
                limits: self.limits.limits(),
                cache_dir: self.cache.dir().ok(),
            })));
        }
        let named = !targets.cri.is_empty() || targets.nodes.is_some();
        let verify = caller
            == (Caller::Command {
                asks_runtimes: true,
            })
            && self.rollout.verify_cri;
        if matches!(caller, Caller::Command { .. }) && named && !verify {
            eprintln!(
                "warning: cluster mode: --cri and --nodes are ignored (only `check --verify-cri` asks the runtimes \
                 they name)"
            );
        }
        let verify = match verify {
            true => Some((runtime_targets(targets)?, targets.timeout())),
            false => None,
        };
        Ok(Box::new(MachineConfigFleet::new(MachineConfigSettings {
            connect,
            registry: RegistrySettings {
                options: registry_options(&self.registry)?,
                no_pull_secret: self.registry.no_pull_secret,
            },
            platform: targets.platform()?,
            limits: self.limits.limits(),
            cache_dir: self.cache.dir().ok(),
            verify,
            lazy_store: targets.lazy_store.clone(),
            release,
            agents_namespace: targets.agents_namespace.clone(),
        })))
    }

    /// The API to reach the cluster's nodes through: `--cluster-api`, else the one the cluster serves;
    /// agents when it serves both.
    async fn cluster_api(&self, connect: &ConnectOptions) -> Result<ClusterApi, Failure> {
        if let Some(chosen) = self.targets.cluster_api {
            return Ok(chosen);
        }
        let client = crate::backend::kube::connect(connect).await?;
        let served = served_apis(&client).await.map_err(|e| {
            Failure::unreachable(vec![format!(
                "cannot reach the API server: {e}; check the kubeconfig's server and your network"
            )])
        })?;
        match (served.agents, served.machine_config) {
            (true, _) => Ok(ClusterApi::Agents),
            (false, true) => Ok(ClusterApi::MachineConfig),
            (false, false) => Err(Failure::bad_input(
                "this cluster serves neither pinboard's agents nor OpenShift's machine-config API: \
                 install the agents with `pinboard agent manifests --image IMAGE | kubectl apply -f -` \
                 (docs/agents.md), or reach nodes directly with --cri or --nodes",
            )),
        }
    }

    /// The registry client that reads images as the nodes would: in cluster mode with the cluster's pull
    /// secret (what could not be used said on stderr), for `release`, which needs no nodes.
    pub async fn reading_registry(&self) -> Result<Registry, Failure> {
        let Some(options) = self.targets.cluster_mode() else {
            return registry_client(&self.registry);
        };
        let settings = RegistrySettings {
            options: registry_options(&self.registry)?,
            no_pull_secret: self.registry.no_pull_secret,
        };
        let client = crate::backend::openshift::connect(&options).await?;
        let (registry, warnings) = machine_config::registry::client(&settings, &client).await?;
        for warning in warnings {
            eprintln!("warning: {warning}");
        }
        Ok(registry)
    }
}

/// The nodes `--verify-cri` asks: those named by `--cri` or `--nodes` (never crictl's default endpoint).
fn runtime_targets(targets: &TargetArgs) -> Result<Vec<NodeTarget>, Failure> {
    if targets.cri.is_empty() && targets.nodes.is_none() {
        return Err(Failure::bad_input(
            "--verify-cri asks the nodes' runtimes: name their CRI endpoints with --cri NODE=ENDPOINT (one per \
             node) or --nodes FILE",
        ));
    }
    targets.resolve()
}

impl SetInput {
    /// What these flags name as sets.
    pub fn sources(&self) -> SetSources {
        SetSources {
            sets: self.sets.clone(),
            images_files: self.images_files.clone(),
            images: self.images.clone(),
            releases: self.releases.clone(),
            selector: self.selector.clone(),
            release: self.release.set_options(),
        }
    }
}

impl TargetArgs {
    /// How to reach the cluster, when the flags choose cluster mode: `--kubeconfig`, `--context` or
    /// `--cluster` (then `--cri` and `--nodes` only name the nodes `check --verify-cri` asks); or no target
    /// flag at all, no local CRI endpoint, and a kubeconfig to be found.
    pub fn cluster_mode(&self) -> Option<ConnectOptions> {
        let options = ConnectOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        };
        let explicit = self.kubeconfig.is_some() || self.context.is_some() || self.cluster;
        let direct = !self.cri.is_empty() || self.nodes.is_some();
        let implicit = !direct && targets::default_endpoint().is_none() && kubeconfig_available();
        (explicit || implicit).then_some(options)
    }

    /// The nodes named by --cri / --nodes (or crictl's default endpoint).
    pub fn resolve(&self) -> Result<Vec<NodeTarget>, Failure> {
        let defaults = NodeDefaults {
            crio_config_dir: self.crio_config_dir.clone(),
            crio_reload: self.crio_reload.clone(),
            wiring: WiringPaths {
                registry_config_dir: None,
                crio_registries_dir: self.crio_registries_dir.clone(),
            },
            lazy: LazyConfig {
                file: PathBuf::from(&self.lazy_drop_in),
                store: self.lazy_store.clone(),
                containerd_config: self.containerd_config.clone(),
                stargz_socket: self.stargz_socket.clone(),
            },
        };
        let text = self.nodes.as_deref().map(read_file).transpose()?;
        let file = self.nodes.as_deref().zip(text.as_deref());
        Ok(targets::resolve(&self.cri, file, &defaults)?)
    }

    pub fn platform(&self) -> Result<Platform, Failure> {
        self.platform.as_deref().map_or_else(
            || Ok(Platform::host()),
            |p| Platform::parse(p).map_err(Failure::from),
        )
    }

    pub fn timeout(&self) -> Duration {
        self.cri_timeout.max(Duration::from_secs(1))
    }
}

/// Whether kube's config inference would find something: KUBECONFIG, ~/.kube/config, or a pod's service
/// account.
fn kubeconfig_available() -> bool {
    let home_config = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".kube/config"))
        .is_some_and(|path| path.is_file());
    std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty())
        || home_config
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

fn read_file(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", path.display())))
}

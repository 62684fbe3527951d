//! The command line: `pinboard` alone opens the terminal UI; `pinboard plan`, `check`, `status`, `apply`
//! and `unpin` run headless. Each reads its input completely and checks it before touching anything, so bad input ends
//! with one clear message per problem, exit code 2, and nothing done.

mod apply;
mod check;
mod cluster;
mod output;
mod plan;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::backend::lazy::{LAZY_DROP_IN, LazyConfig, STARGZ_STORE, STORAGE_CONF_DIR};
use crate::backend::registry::{Registry, RegistryOptions};
use crate::cluster::ConnectOptions;
use crate::error::{Exit, Failure};
use crate::model::image::Platform;
use crate::model::plan::Limits;
use crate::model::set::{self, ImageSet};
use crate::model::units::{parse_bytes, parse_duration};
use crate::targets::{self, NodeDefaults, NodeTarget, parse_reload};

#[derive(Parser, Debug)]
#[command(
    name = "pinboard",
    version,
    about = "Pin and pre-load container images on cluster nodes, and watch those rollouts",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Without a subcommand: the terminal UI.
    #[command(flatten)]
    pub tui: TuiArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Preview what pre-loading image sets costs each node: bytes to fetch, disk after, and a verdict.
    Plan(SetsOnNodes),
    /// Exit 0 only when every image is present and pinned on every node; else exit 1 with what is missing.
    Check(check::CheckArgs),
    /// Per node and image: present, pinned, and why not (the data `check` judges, without its verdict).
    Status(SetsOnNodes),
    /// Pre-load then pin the images on every node, as the TUI does; then check (exit code as `check`'s).
    Apply(apply::ApplyArgs),
    /// Remove the pins of the images on every node (the images stay).
    Unpin(apply::UnpinArgs),
    /// The terminal UI (the same as `pinboard` without a subcommand).
    Tui(TuiArgs),
}

/// What the headless commands over sets and nodes take.
#[derive(Args, Debug)]
pub struct SetsOnNodes {
    #[command(flatten)]
    pub input: SetInput,
    #[command(flatten)]
    pub targets: TargetArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Which images: any mix of these, each set checked against the PinnedImageSet rules.
#[derive(Args, Debug, Default)]
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
}

/// Which nodes: reached directly over their CRI sockets (and how pinboard changes them), or through a
/// cluster's API server (cluster mode).
#[derive(Args, Debug, Default)]
pub struct TargetArgs {
    /// Cluster mode, with this kubeconfig.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["cri", "nodes"])]
    pub kubeconfig: Option<PathBuf>,
    /// Cluster mode, with this context of the kubeconfig.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["cri", "nodes"])]
    pub context: Option<String>,
    /// Cluster mode, with the kubeconfig from KUBECONFIG or ~/.kube/config, or the pod's service account.
    /// Without any target flag, pinboard uses the local CRI endpoint if there is one, else this.
    #[arg(long, conflicts_with_all = ["cri", "nodes"])]
    pub cluster: bool,
    /// A node's CRI endpoint: [NAME=]unix:///path or [NAME=]tcp://host:port. Repeatable. Without it or
    /// --nodes, the endpoint crictl would use (CONTAINER_RUNTIME_ENDPOINT, /etc/crictl.yaml, the CRI-O and
    /// containerd sockets).
    #[arg(long = "cri", value_name = "[NAME=]ENDPOINT")]
    pub cri: Vec<String>,
    /// YAML list of nodes: name, endpoint, and per-node pin and lazy-pull settings (README "Nodes file").
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
    /// CRI-O nodes: how CRI-O re-reads its config: signal:PIDFILE, systemctl or none. Default systemctl.
    #[arg(long, value_name = "HOW", value_parser = parse_reload)]
    pub crio_reload: Option<crate::backend::pins::Reload>,
    /// The lazy-pull storage drop-in.
    #[arg(long, value_name = "FILE", default_value_t = format!("{STORAGE_CONF_DIR}/{LAZY_DROP_IN}"))]
    pub lazy_drop_in: String,
    /// The additional layer store the lazy-pull drop-in names.
    #[arg(long, value_name = "PATH:ref", default_value = STARGZ_STORE)]
    pub lazy_store: String,
}

/// How to reach registries.
#[derive(Args, Debug, Default)]
pub struct RegistryArgs {
    /// Registry credentials (containers-auth.json / docker config format). Default: REGISTRY_AUTH_FILE,
    /// $XDG_RUNTIME_DIR/containers/auth.json, ~/.docker/config.json, /var/lib/kubelet/config.json.
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
    /// Talk plain HTTP to this registry (HOST[:PORT]). Repeatable. All others use HTTPS.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Manifest requests in flight at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub registry_concurrency: usize,
}

/// When a node counts as full.
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// Kubelet image GC high threshold, percent: a node above it after pre-loading is `tight`.
    #[arg(long, value_name = "PERCENT", default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub gc_high_percent: u8,
    /// Free space that must remain after pre-loading, e.g. 16Gi (the OpenShift daemon's floor).
    #[arg(long, value_name = "BYTES", default_value = "16Gi", value_parser = parse_bytes)]
    pub min_free: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            gc_high_percent: self.gc_high_percent,
            min_free_bytes: self.min_free,
        }
    }
}

/// The terminal UI's options.
#[derive(Args, Debug)]
pub struct TuiArgs {
    /// Sets to start with (more can be composed or imported in the UI).
    #[command(flatten)]
    pub input: SetInput,
    #[command(flatten)]
    pub targets: TargetArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Pulls at once per node.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub parallel: usize,
    /// A pull without byte progress for this long is shown as stalled.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub stall_after: u64,
    /// Change nothing: no pulls, no pins, no files written.
    #[arg(long)]
    pub readonly: bool,
    /// Color theme: dark, light or monochrome (monochrome whenever NO_COLOR is set).
    #[arg(long, value_name = "NAME")]
    pub theme: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Runs a command; returns what to print on stdout, or the failure.
pub async fn run(command: Command) -> Result<String, Failure> {
    match command {
        Command::Plan(args) => plan::run(args).await,
        Command::Check(args) => check::check(args).await,
        Command::Status(args) => check::status(args).await,
        Command::Apply(args) => apply::apply(args).await,
        Command::Unpin(args) => apply::unpin(args).await,
        Command::Tui(args) => crate::ui::live::run(args).await.map(|()| String::new()),
    }
}

pub fn registry_client(args: &RegistryArgs) -> Result<Registry, Failure> {
    Registry::new(RegistryOptions {
        authfile: args.authfile.clone(),
        insecure_registries: args.insecure_registries.clone(),
        concurrency: args.registry_concurrency.max(1),
        ..RegistryOptions::default()
    })
    .map_err(|e| Failure::bad_input(e.to_string()))
}

impl TargetArgs {
    /// How to reach the cluster, when the flags choose cluster mode: `--kubeconfig`, `--context` or
    /// `--cluster`; or no target flag at all, no local CRI endpoint, and a kubeconfig to be found.
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
            lazy: LazyConfig {
                file: PathBuf::from(&self.lazy_drop_in),
                store: self.lazy_store.clone(),
            },
        };
        let text = self.nodes.as_deref().map(read_file).transpose()?;
        let file = self.nodes.as_deref().zip(text.as_deref());
        targets::resolve(&self.cri, file, &defaults).map_err(|e| {
            // Only "no endpoint at all" means nothing could be reached; everything else is a typo.
            if e.starts_with("no CRI endpoint") {
                Failure::unreachable(vec![e])
            } else {
                Failure::bad_input(e)
            }
        })
    }

    pub fn platform(&self) -> Result<Platform, Failure> {
        self.platform.as_deref().map_or_else(
            || Ok(Platform::host()),
            |p| Platform::parse(p).map_err(Failure::bad_input),
        )
    }

    pub fn timeout(&self) -> Duration {
        self.cri_timeout.max(Duration::from_secs(1))
    }
}

/// Reads and checks every set named on the command line. All problems of all sets are reported together.
/// `required`: whether giving no images at all is an error.
pub fn read_sets(input: &SetInput, required: bool) -> Result<Vec<ImageSet>, Failure> {
    let mut sets = Vec::new();
    let mut problems = Vec::new();
    for path in &input.sets {
        match set::parse_yaml(&read_file(path)?, &path.display().to_string()) {
            Ok(found) if found.is_empty() => {
                problems.push(format!("{}: holds no PinnedImageSet", path.display()))
            }
            Ok(found) => sets.extend(found),
            Err(found) => problems.extend(found.iter().map(ToString::to_string)),
        }
    }
    for path in &input.images_files {
        let name = path
            .file_stem()
            .map_or("images".into(), |s| s.to_string_lossy().into_owned());
        sets.push(set::parse_list(
            &read_file(path)?,
            &path.display().to_string(),
            &name,
        ));
    }
    if !input.images.is_empty() {
        sets.push(set::from_flags("command-line", &input.images));
    }
    if required && sets.is_empty() && problems.is_empty() {
        return Err(Failure::bad_input(
            "no images given: pass --set FILE, --images-file FILE or --image REF",
        ));
    }
    problems.extend(
        sets.iter()
            .flat_map(|s| s.validate())
            .map(|p| p.to_string()),
    );
    if problems.is_empty() {
        Ok(sets)
    } else {
        Err(Failure {
            exit: Exit::BadInput,
            lines: problems,
        })
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

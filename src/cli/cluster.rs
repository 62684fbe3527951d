//! The headless commands in cluster mode: `check`, `status`, `apply` and `unpin` over PinnedImageSets,
//! MachineConfigNodes and Nodes read from the API server. They watch (never poll) through
//! [`crate::cluster::watch`], read each target node's kubelet configuration once (`/configz`, for how many
//! images `Node.status.images` holds at most), judge with [`crate::model::readiness::assess_cluster`], and
//! print the same tables and JSON shapes as direct mode. `check --verify-cri` also asks the runtimes of the
//! nodes named by `--cri` or `--nodes` and requires their confirmation. `apply` writes the sets with server-side apply, then waits until
//! the machine-config daemons report them done; `unpin` deletes the sets (the daemons unpin, images stay).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::check::{readiness_table, verdict, verdict_line, warn};
use super::output::{render, table};
use crate::backend::readiness::observe;
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::cluster::{Cluster, ClusterError, ConnectOptions, Watch, connect, watch};
use crate::error::{Exit, Failure};
use crate::model::cluster::{
    ClusterView, Connection, KubeletSettings, pool_warning, pools_for_set,
};
use crate::model::readiness::{NodesStatus, Readiness, WantedSet, assess, assess_cluster};
use crate::model::set::ImageSet;
use crate::options::{
    CommonArgs, SetInput, TargetArgs, cluster_registry_client, noted_sets, registry_client,
};

/// Cluster mode when the flags choose it ([`TargetArgs::cluster_mode`]). `--cri` and `--nodes` then name
/// nodes only for `check --verify-cri` (`uses_runtimes`); elsewhere they are ignored, with a warning.
pub(super) fn cluster_mode(targets: &TargetArgs, uses_runtimes: bool) -> Option<ConnectOptions> {
    let options = targets.cluster_mode()?;
    if !uses_runtimes && (!targets.cri.is_empty() || targets.nodes.is_some()) {
        eprintln!(
            "warning: cluster mode: --cri and --nodes are ignored (only `check --verify-cri` asks the runtimes \
             they name)"
        );
    }
    Some(options)
}

/// How long the first complete view of the cluster may take.
const FIRST_SYNC: Duration = Duration::from_secs(30);

impl From<ClusterError> for Failure {
    fn from(error: ClusterError) -> Failure {
        let unreachable = match &error {
            ClusterError::Api(kube::Error::Api(status)) => status.code >= 500,
            ClusterError::Api(_) => true,
            _ => false,
        };
        if unreachable {
            Failure::unreachable(vec![format!(
                "cannot reach the API server: {error}; check the kubeconfig's server and your network"
            )])
        } else {
            Failure::bad_input(error.to_string())
        }
    }
}

/// A connected cluster and its watched view.
pub(super) struct ClusterSession {
    pub(super) cluster: Cluster,
    watch: Watch,
    pub(super) view: ClusterView,
    /// Each target node's kubelet configuration, read once per node.
    kubelets: HashMap<String, KubeletSettings>,
}

impl ClusterSession {
    /// Connects, discovers the machine-config kinds and waits for the first complete view; exit 3 when the
    /// API server does not answer, naming the watch that failed.
    pub(super) async fn open(options: &ConnectOptions) -> Result<ClusterSession, Failure> {
        let cluster = Cluster::discover(connect(options).await?).await?;
        let mut session = ClusterSession {
            watch: watch(&cluster),
            cluster,
            view: ClusterView::default(),
            kubelets: HashMap::new(),
        };
        let deadline = Instant::now() + FIRST_SYNC;
        while !session.view.synced() {
            if let Connection::Reconnecting { error, .. } = session.view.connection() {
                return Err(Failure::unreachable(vec![format!(
                    "cannot watch the cluster: {error}; check the API server and that your account has \
                     the ClusterRole pinboard-viewer (deploy/rbac.yaml)"
                )]));
            }
            if !session.next_update(deadline).await {
                return Err(Failure::unreachable(vec![format!(
                    "the cluster's objects were not listed within {FIRST_SYNC:?}; the API server is too \
                     slow or unreachable"
                )]));
            }
        }
        Ok(session)
    }

    /// Applies the next update (and any already waiting) to the view; false at `deadline`.
    async fn next_update(&mut self, deadline: Instant) -> bool {
        match tokio::time::timeout_at(deadline, self.watch.updates.recv()).await {
            Ok(Some(update)) => {
                self.view.apply(update);
                while let Ok(update) = self.watch.updates.try_recv() {
                    self.view.apply(update);
                }
                true
            }
            Ok(None) | Err(_) => false,
        }
    }

    /// Reads the kubelet configuration of every node the wanted sets land on that was not read yet (a node
    /// that joins while `wait` follows the cluster is read when it appears).
    async fn read_kubelets(&mut self, wanted: &[WantedSet]) {
        let unread: BTreeSet<String> = wanted
            .iter()
            .flat_map(|w| self.view.nodes_of(w.labels(&self.view)))
            .filter(|n| self.view.node(n).is_some() && !self.kubelets.contains_key(n))
            .collect();
        if !unread.is_empty() {
            let unread: Vec<String> = unread.into_iter().collect();
            let read = self.cluster.kubelet_settings(&unread).await;
            self.kubelets.extend(read);
        }
    }

    /// The wanted sets judged on every node they land on, now.
    pub(super) async fn readiness(&mut self, wanted: &[WantedSet]) -> Readiness {
        self.read_kubelets(wanted).await;
        Readiness::of(assess_cluster(
            &self.view,
            wanted,
            &self.kubelets,
            SystemTime::now(),
        ))
    }

    /// Follows the cluster until every node is ready or `limit` has passed, one line on stderr per change.
    pub(super) async fn wait(&mut self, wanted: &[WantedSet], limit: Duration) -> Readiness {
        let deadline = Instant::now() + limit;
        let mut last_line = String::new();
        loop {
            let readiness = self.readiness(wanted).await;
            let connection = self.view.connection();
            let mut line = readiness.progress_line();
            if connection != Connection::Synced {
                line.push_str(&format!(" (API server: {connection})"));
            }
            if readiness.ready {
                return readiness;
            }
            if line != last_line {
                eprintln!("waiting: {line}");
            }
            if !self.next_update(deadline).await {
                eprintln!("waiting: timed out after {limit:?}: {line}");
                return self.readiness(wanted).await;
            }
            last_line = line;
        }
    }

    /// The sets to check: those read from files, and those `names` names on the cluster (each must be there).
    pub(super) fn wanted(
        &self,
        files: Vec<ImageSet>,
        names: Vec<String>,
    ) -> Result<Vec<WantedSet>, Failure> {
        let mut wanted: Vec<WantedSet> = files
            .into_iter()
            .map(|set| WantedSet {
                set,
                min_generation: 0,
            })
            .collect();
        let mut unknown = Vec::new();
        for name in names {
            match self.view.set(&name) {
                Some(set) => wanted.push(WantedSet {
                    set: set.to_image_set(),
                    min_generation: 0,
                }),
                None => unknown.push(name),
            }
        }
        if !unknown.is_empty() {
            let there: Vec<&str> = self.view.sets.iter().map(|s| s.name()).collect();
            return Err(Failure::bad_input(format!(
                "{} neither a file nor a PinnedImageSet on the cluster (sets there: {}); give a set's name \
                 or a PinnedImageSet YAML file",
                quoted_list(&unknown),
                if there.is_empty() {
                    "none".into()
                } else {
                    there.join(", ")
                }
            )));
        }
        Ok(wanted)
    }
}

/// `"a" is` / `"a", "b" are`.
fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!(
        "{} {}",
        quoted.join(", "),
        if items.len() == 1 { "is" } else { "are" }
    )
}

/// What the commands that read sets from the cluster say to pass.
pub(super) const NAME_OR_FILE: &str = "sets are PinnedImageSets: name them with --set NAME (a set on the \
     cluster) or --set FILE (PinnedImageSet YAML)";

/// Refuses what cluster mode cannot take, before the cluster is asked anything: no `--set`, or a bare image
/// list (`--images-file`, `--image`), which has no pool to land in. `usage` says what to pass instead.
fn pinned_image_sets_only(input: &SetInput, usage: &str) -> Result<(), Failure> {
    let nothing = input.sets.is_empty() && input.releases.is_empty();
    if !input.images_files.is_empty() || !input.images.is_empty() || nothing {
        return Err(Failure::bad_input(format!(
            "in cluster mode {usage}; --images-file and --image have no pool to land in"
        )));
    }
    Ok(())
}

/// The registry client of a cluster-mode command. Where it reads registries for the cluster — `plan`
/// (`always`), or a `--release` payload — the cluster's global pull secret comes first (see
/// [`cluster_registry_client`]), with a warning on stderr when it cannot be used; otherwise the auth files.
pub(super) async fn cluster_registry(
    args: &CommonArgs,
    options: &ConnectOptions,
    always: bool,
) -> Result<Registry, Failure> {
    if !always && args.input.releases.is_empty() {
        return registry_client(&args.registry);
    }
    let client = connect(options).await?;
    let (registry, warnings) = cluster_registry_client(&args.registry, &client).await?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    Ok(registry)
}

/// `--set`'s values in cluster mode: the sets read from the files among them and `--release`'s (through
/// `registry`), and the other values as the names of sets on the cluster.
pub(super) async fn files_and_names(
    args: &CommonArgs,
    usage: &str,
    registry: &Registry,
) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
    let input = &args.input;
    pinned_image_sets_only(input, usage)?;
    let (files, names): (Vec<_>, Vec<_>) = input.sets.iter().cloned().partition(|p| p.is_file());
    let only_files = SetInput {
        sets: files,
        ..input.clone()
    };
    let read_any = !only_files.sets.is_empty() || !only_files.releases.is_empty();
    let sets = match read_any {
        true => noted_sets(&only_files, true, registry, &args.targets.platform()?).await?,
        false => Vec::new(),
    };
    let names = names
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    Ok((sets, names))
}

pub(super) async fn check(
    options: &ConnectOptions,
    args: &CommonArgs,
    wait: Option<Duration>,
) -> Result<String, Failure> {
    let registry = cluster_registry(args, options, false).await?;
    let (files, names) = files_and_names(args, NAME_OR_FILE, &registry).await?;
    let runtimes = match args.rollout.verify_cri {
        true => Some(runtime_targets(&args.targets)?),
        false => None,
    };
    let mut session = ClusterSession::open(options).await?;
    let wanted = session.wanted(files, names)?;
    let mut readiness = match wait {
        Some(limit) => session.wait(&wanted, limit).await,
        None => session.readiness(&wanted).await,
    };
    if let Some(targets) = runtimes {
        readiness = confirmed_by_runtimes(readiness, &targets, args.targets.timeout()).await;
    }
    let text = render(&readiness, args.output(), || {
        readiness_table(&readiness.nodes) + &verdict_line(&readiness)
    })?;
    verdict(text, &readiness)
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

/// Each node of `readiness` that `targets` names, confirmed by its runtime for the same images; the others
/// keep the cluster's judgement. A target the sets do not land on is only warned about.
async fn confirmed_by_runtimes(
    readiness: Readiness,
    targets: &[NodeTarget],
    timeout: Duration,
) -> Readiness {
    for target in targets {
        if !readiness.nodes.iter().any(|n| n.node == target.node.name) {
            eprintln!(
                "warning: --verify-cri: the sets do not land on node {:?}; its runtime is not asked",
                target.node.name
            );
        }
    }
    let nodes = readiness.nodes.into_iter().map(|node| async move {
        let Some(target) = targets.iter().find(|t| t.node.name == node.node) else {
            return node;
        };
        let references: Vec<String> = node.images.iter().map(|i| i.reference.clone()).collect();
        let observed = observe(target, &references, timeout).await;
        node.confirmed_by(assess(&observed, None))
    });
    Readiness::of(futures::future::join_all(nodes).await)
}

pub(super) async fn status(options: &ConnectOptions, args: &CommonArgs) -> Result<String, Failure> {
    let output = args.output();
    let registry = cluster_registry(args, options, false).await?;
    let (files, names) = files_and_names(args, NAME_OR_FILE, &registry).await?;
    let mut session = ClusterSession::open(options).await?;
    let wanted = session.wanted(files, names)?;
    let status = NodesStatus {
        nodes: session.readiness(&wanted).await.nodes,
    };
    warn(&status.nodes);
    render(&status, output, || readiness_table(&status.nodes))
}

/// Writes every set (after checking them all), then waits up to `limit` for the nodes to report them done.
/// A set that would land in no pool is refused unless `force`; one landing in several pools is a warning.
pub(super) async fn apply(
    options: &ConnectOptions,
    args: &CommonArgs,
    force: bool,
    limit: Duration,
) -> Result<String, Failure> {
    let output = args.output();
    let usage = "apply writes PinnedImageSets: pass --set FILE (PinnedImageSet YAML with a \
                 machineconfiguration.openshift.io/role label) or --release PULLSPEC";
    pinned_image_sets_only(&args.input, usage)?;
    let registry = cluster_registry(args, options, false).await?;
    let sets = noted_sets(&args.input, true, &registry, &args.targets.platform()?).await?;
    let mut session = ClusterSession::open(options).await?;
    let mut refused = Vec::new();
    for set in &sets {
        let pools = pools_for_set(&set.labels, &session.view.pools);
        match pool_warning(&set.name, &pools) {
            Some(warning) if pools.is_empty() && !force => {
                refused.push(format!("{warning}; or pass --force to write it anyway"))
            }
            Some(warning) => eprintln!("warning: {warning}"),
            None => {}
        }
    }
    if !refused.is_empty() {
        return Err(Failure {
            exit: Exit::BadInput,
            lines: refused,
        });
    }
    let mut wanted = Vec::new();
    for set in sets {
        let stored = session.cluster.apply_set(&set).await?;
        eprintln!(
            "applied PinnedImageSet {} (generation {})",
            set.name,
            stored.generation()
        );
        wanted.push(WantedSet {
            set,
            min_generation: stored.generation(),
        });
    }
    let readiness = session.wait(&wanted, limit).await;
    let text = render(&readiness, output, || {
        readiness_table(&readiness.nodes) + &verdict_line(&readiness)
    })?;
    verdict(text, &readiness)
}

/// Deletes the named sets; a set already gone is reported, not an error.
pub(super) async fn unpin(options: &ConnectOptions, args: &CommonArgs) -> Result<String, Failure> {
    let output = args.output();
    let usage = "unpin deletes PinnedImageSets: pass --set NAME, --set FILE or --release PULLSPEC";
    let registry = cluster_registry(args, options, false).await?;
    let (files, names) = files_and_names(args, usage, &registry).await?;
    let targets = files.into_iter().map(|s| s.name).chain(names);
    let cluster = Cluster::discover(connect(options).await?).await?;
    let mut rows = Vec::new();
    for name in targets {
        let message = match cluster.delete_set(&name).await {
            Ok(()) => {
                "deleted: the machine-config daemons unpin its images; images stay on the nodes"
            }
            Err(ClusterError::NoSuchSet(_)) => "not on the cluster: nothing to unpin",
            Err(other) => return Err(other.into()),
        };
        rows.push(Deleted {
            set: name,
            message: message.into(),
        });
    }
    render(&rows, output, || {
        let headers = ["SET", "RESULT"].map(String::from);
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|r| vec![r.set.clone(), r.message.clone()])
            .collect();
        table(&headers, &body, &|_, _, text| text.to_string())
    })
}

/// What `unpin` did with one set in cluster mode.
#[derive(serde::Serialize)]
struct Deleted {
    set: String,
    message: String,
}

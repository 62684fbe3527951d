//! The headless commands in cluster mode: `check`, `status`, `apply` and `unpin` over PinnedImageSets,
//! MachineConfigNodes and Nodes read from the API server. They watch (never poll) through
//! [`crate::cluster::watch`] and judge with [`crate::model::readiness::assess_cluster`], and print the same
//! tables and JSON shapes as direct mode. `apply` writes the sets with server-side apply, then waits until
//! the machine-config daemons report them done; `unpin` deletes the sets (the daemons unpin, images stay).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::check::{readiness_table, verdict, verdict_line};
use super::output::{render, table};
use crate::cluster::{Cluster, ClusterError, ConnectOptions, Watch, connect, watch};
use crate::error::{Exit, Failure};
use crate::model::cluster::{ClusterView, Connection, pool_warning, pools_for_set};
use crate::model::readiness::{NodesStatus, Readiness, WantedSet, assess_cluster};
use crate::model::set::ImageSet;
use crate::options::{Output, SetInput, read_sets};

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

    pub(super) fn readiness(&self, wanted: &[WantedSet]) -> Readiness {
        Readiness::of(assess_cluster(&self.view, wanted, SystemTime::now()))
    }

    /// Follows the cluster until every node is ready or `limit` has passed, one line on stderr per change.
    pub(super) async fn wait(&mut self, wanted: &[WantedSet], limit: Duration) -> Readiness {
        let deadline = Instant::now() + limit;
        let mut last_line = String::new();
        loop {
            let readiness = self.readiness(wanted);
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
                return self.readiness(wanted);
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
    if !input.images_files.is_empty() || !input.images.is_empty() || input.sets.is_empty() {
        return Err(Failure::bad_input(format!(
            "in cluster mode {usage}; --images-file and --image have no pool to land in"
        )));
    }
    Ok(())
}

/// `--set`'s values in cluster mode: the sets read from the files among them, and the others as the names
/// of sets on the cluster.
pub(super) fn files_and_names(
    input: &SetInput,
    usage: &str,
) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
    pinned_image_sets_only(input, usage)?;
    let (files, names): (Vec<_>, Vec<_>) = input.sets.iter().cloned().partition(|p| p.is_file());
    let sets = match files.is_empty() {
        true => Vec::new(),
        false => read_sets(
            &SetInput {
                sets: files,
                ..SetInput::default()
            },
            true,
        )?,
    };
    let names = names
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    Ok((sets, names))
}

pub(super) async fn check(
    options: &ConnectOptions,
    input: &SetInput,
    output: Output,
    wait: Option<Duration>,
) -> Result<String, Failure> {
    let (files, names) = files_and_names(input, NAME_OR_FILE)?;
    let mut session = ClusterSession::open(options).await?;
    let wanted = session.wanted(files, names)?;
    let readiness = match wait {
        Some(limit) => session.wait(&wanted, limit).await,
        None => session.readiness(&wanted),
    };
    let text = render(&readiness, output, || {
        readiness_table(&readiness.nodes) + &verdict_line(&readiness)
    })?;
    verdict(text, &readiness)
}

pub(super) async fn status(
    options: &ConnectOptions,
    input: &SetInput,
    output: Output,
) -> Result<String, Failure> {
    let (files, names) = files_and_names(input, NAME_OR_FILE)?;
    let session = ClusterSession::open(options).await?;
    let wanted = session.wanted(files, names)?;
    let status = NodesStatus {
        nodes: session.readiness(&wanted).nodes,
    };
    render(&status, output, || readiness_table(&status.nodes))
}

/// Writes every set (after checking them all), then waits up to `limit` for the nodes to report them done.
/// A set that would land in no pool is refused unless `force`; one landing in several pools is a warning.
pub(super) async fn apply(
    options: &ConnectOptions,
    input: &SetInput,
    output: Output,
    force: bool,
    limit: Duration,
) -> Result<String, Failure> {
    let usage = "apply writes PinnedImageSets: pass --set FILE (PinnedImageSet YAML with a \
                 machineconfiguration.openshift.io/role label)";
    pinned_image_sets_only(input, usage)?;
    let sets = read_sets(input, true)?;
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
pub(super) async fn unpin(
    options: &ConnectOptions,
    input: &SetInput,
    output: Output,
) -> Result<String, Failure> {
    let usage = "unpin deletes PinnedImageSets: pass --set NAME or --set FILE";
    let (files, names) = files_and_names(input, usage)?;
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

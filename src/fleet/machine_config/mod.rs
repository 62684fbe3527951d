//! An OpenShift cluster: pinboard writes PinnedImageSets (server-side apply) and deletes them; the
//! machine-config daemons pull and pin, and report on the MachineConfigNodes, which pinboard watches (never
//! polls) and judges through [`crate::model::readiness::assess_cluster`]. Each target node's kubelet
//! configuration (`/configz`) says how many images `Node.status.images` holds at most. `check
//! --verify-cri` also asks the runtimes of the nodes named by `--cri` or `--nodes` and requires their
//! confirmation. Where pinboard's agents run on the nodes too, the plan takes what they published of
//! what their runtimes hold: exact for those nodes.

pub mod registry;
mod session;
mod tui;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::OnceCell;

use super::{
    Applied, ApplyOptions, ApplyProgress, Events, Fleet, ReadingRegistry, RolloutControl,
    SetDeleted, SetSources, Traits, UnpinOptions, Unpinned,
};
use crate::backend::openshift::{Cluster, ClusterError, ConnectOptions, connect};
use crate::backend::pinboard_api::{AgentsError, PinboardApi};
use crate::backend::readiness::observe;
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::error::{Exit, Failure};
use crate::model::image::Platform;
use crate::model::machine_config::{pool_warning, pools_for_set};
use crate::model::node_blobs::NodeBlobs;
use crate::model::plan::Limits;
use crate::model::readiness::{Readiness, WantedSet, assess};
use crate::model::set::ImageSet;
use crate::survey::{Survey, survey_cluster};

use registry::RegistrySettings;
use session::Connected;

/// What the commands that read sets from the cluster say to pass.
const NAME_OR_FILE: &str = "sets are PinnedImageSets: name them with --set NAME (a set on the \
     cluster) or --set FILE (PinnedImageSet YAML)";

/// What an OpenShift fleet is made of, as the command line gives it.
pub struct MachineConfigSettings {
    pub connect: ConnectOptions,
    pub registry: RegistrySettings,
    pub platform: Platform,
    pub limits: Limits,
    /// The blob cache whose blobs the plan's `linkBytes.fanOut` counts as fetched.
    pub cache_dir: Option<PathBuf>,
    /// `check --verify-cri`: the nodes whose runtimes must confirm (from `--cri` or `--nodes`), and each
    /// call's deadline.
    pub verify: Option<(Vec<NodeTarget>, Duration)>,
    /// The additional layer store lazy pulling configures.
    pub lazy_store: String,
    /// TUI: how a release typed at the import prompt becomes sets.
    pub release: crate::model::release_payload::SetOptions,
    /// Where pinboard's agents run, when they are installed too: their heartbeats.
    pub agents_namespace: String,
}

/// An OpenShift cluster's nodes, through its machine-config daemons.
pub struct MachineConfigFleet {
    config: MachineConfigSettings,
    /// Made at the first read of the cluster's registries (it reads the cluster's pull secret), with what
    /// could not be used.
    registry: OnceCell<(Arc<Registry>, Vec<String>)>,
    /// The TUI's connection, made when it starts watching.
    tui: tui::Live,
}

impl MachineConfigFleet {
    pub fn new(config: MachineConfigSettings) -> MachineConfigFleet {
        MachineConfigFleet {
            config,
            registry: OnceCell::new(),
            tui: tui::Live::default(),
        }
    }

    /// The client that reads the cluster's registries with its pull secret, made once, and what could not
    /// be used for it.
    async fn pull_secret_registry(&self) -> Result<&(Arc<Registry>, Vec<String>), Failure> {
        self.registry
            .get_or_try_init(|| async {
                let client = connect(&self.config.connect).await?;
                let (registry, warnings) = registry::client(&self.config.registry, &client).await?;
                Ok::<_, Failure>((Arc::new(registry), warnings))
            })
            .await
    }

    /// [`Self::pull_secret_registry`] for the headless commands: its warnings on stderr when made.
    async fn cluster_registry(&self) -> Result<Arc<Registry>, Failure> {
        let made_now = self.registry.get().is_none();
        let (registry, warnings) = self.pull_secret_registry().await?;
        if made_now {
            for warning in warnings {
                eprintln!("warning: {warning}");
            }
        }
        Ok(Arc::clone(registry))
    }

    /// The registry client of a command: where it reads registries for the cluster — `plan` (`always`), or
    /// a `--release` payload — the one with the cluster's pull secret; otherwise the auth files.
    async fn registry_for(
        &self,
        sources: &SetSources,
        always: bool,
    ) -> Result<Arc<Registry>, Failure> {
        if always || !sources.releases.is_empty() {
            return self.cluster_registry().await;
        }
        Registry::new(self.config.registry.options.clone())
            .map(Arc::new)
            .map_err(|e| Failure::bad_input(e.to_string()))
    }

    /// `--set`'s values: the sets read from the files among them and `--release`'s (through `registry`),
    /// and the other values as the names of sets on the cluster.
    async fn files_and_names(
        &self,
        sources: &SetSources,
        usage: &str,
        registry: &Registry,
    ) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
        pinned_image_sets_only(sources, usage)?;
        let (files, names) = sources.split_names();
        let read_any = !files.sets.is_empty() || !files.releases.is_empty();
        let sets = match read_any {
            true => super::sets::noted(&files, true, registry, &self.config.platform).await?,
            false => Vec::new(),
        };
        Ok((sets, names))
    }

    /// Connected, with the wanted sets of `sources`.
    async fn wanted(
        &self,
        sources: &SetSources,
        always: bool,
    ) -> Result<(Connected, Vec<WantedSet>), Failure> {
        let registry = self.registry_for(sources, always).await?;
        let (files, names) = self
            .files_and_names(sources, NAME_OR_FILE, &registry)
            .await?;
        let connected = Connected::open(&self.config.connect).await?;
        let wanted = connected.wanted(files, names)?;
        Ok((connected, wanted))
    }

    async fn plan_sets(&self, sources: &SetSources) -> Result<Survey, Failure> {
        let (connected, wanted) = self.wanted(sources, true).await?;
        let registry = self.cluster_registry().await?;
        let sets: Vec<_> = wanted.into_iter().map(|w| w.set).collect();
        survey_cluster(
            &connected.cluster,
            &connected.session.view,
            self.published(&connected.cluster).await,
            &sets,
            &registry,
            &self.config.platform,
            self.config.limits,
            self.config.cache_dir.as_deref(),
        )
        .await
        .map_err(Failure::from)
    }

    /// What pinboard's agents, where they run on the nodes too, published of what their runtimes hold, by
    /// node: only the agents whose heartbeat is fresh. Empty without them, or when they cannot be read
    /// (said): those nodes' plans are upper bounds.
    async fn published(&self, cluster: &Cluster) -> BTreeMap<String, NodeBlobs> {
        let namespace = &self.config.agents_namespace;
        let api = match PinboardApi::discover(cluster.client().clone(), namespace).await {
            Ok(api) => api,
            Err(AgentsError::NotInstalled) => return BTreeMap::new(),
            Err(e) => {
                tracing::warn!("cannot tell whether pinboard's agents run on the nodes: {e}");
                return BTreeMap::new();
            }
        };
        let (published, heartbeats) = tokio::join!(api.published_blobs(), api.heartbeats());
        match (published, heartbeats) {
            (Ok(mut published), Ok(heartbeats)) => {
                let now = SystemTime::now();
                published.retain(|node, _| heartbeats.get(node).is_some_and(|h| !h.stale(now)));
                published
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(
                    "cannot read what pinboard's agents published of the nodes' runtimes, so the plan is \
                     an upper bound: {e}"
                );
                BTreeMap::new()
            }
        }
    }

    async fn judge(
        &self,
        sources: &SetSources,
        wait: Option<Duration>,
    ) -> Result<Readiness, Failure> {
        let (mut connected, wanted) = self.wanted(sources, false).await?;
        let readiness = match wait {
            Some(limit) => connected.wait(&wanted, limit).await,
            None => connected.readiness(&wanted).await,
        };
        Ok(match &self.config.verify {
            Some((targets, timeout)) => confirmed_by_runtimes(readiness, targets, *timeout).await,
            None => readiness,
        })
    }

    /// Writes every set (after checking them all), then waits up to `limit` for the nodes to report them
    /// done. A set that would land in no pool is refused unless `force`; one landing in several pools is a
    /// warning.
    async fn write_sets(
        &self,
        sources: &SetSources,
        options: ApplyOptions,
    ) -> Result<Applied, Failure> {
        let usage = "apply writes PinnedImageSets: pass --set FILE (PinnedImageSet YAML with a \
                     machineconfiguration.openshift.io/role label) or --release PULLSPEC";
        pinned_image_sets_only(sources, usage)?;
        let registry = self.registry_for(sources, false).await?;
        let sets = super::sets::noted(sources, true, &registry, &self.config.platform).await?;
        let mut connected = Connected::open(&self.config.connect).await?;
        let mut refused = Vec::new();
        for set in &sets {
            let pools = pools_for_set(&set.labels, &connected.session.view.pools);
            match pool_warning(&set.name, &pools) {
                Some(warning) if pools.is_empty() && !options.force => {
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
            let stored = connected.cluster.apply_set(&set).await?;
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
        Ok(Applied::Written(
            connected.wait(&wanted, options.wait).await,
        ))
    }

    /// Deletes the named sets; a set already gone is reported, not an error.
    async fn delete_sets(
        &self,
        sources: &SetSources,
        options: UnpinOptions,
    ) -> Result<Unpinned, Failure> {
        if options.all_sets || options.release_unowned {
            eprintln!(
                "warning: --all-sets and --release-unowned are for direct mode; in cluster mode the \
                 machine-config daemons keep the pins of the sets left on the cluster"
            );
        }
        let usage =
            "unpin deletes PinnedImageSets: pass --set NAME, --set FILE or --release PULLSPEC";
        let registry = self.registry_for(sources, false).await?;
        let (files, names) = self.files_and_names(sources, usage, &registry).await?;
        let targets = files.into_iter().map(|s| s.name).chain(names);
        let cluster = Cluster::discover(connect(&self.config.connect).await?).await?;
        let mut deleted = Vec::new();
        for name in targets {
            let message = match cluster.delete_set(&name).await {
                Ok(()) => {
                    "deleted: the machine-config daemons unpin its images; images stay on the nodes"
                }
                Err(ClusterError::NoSuchSet(_)) => "not on the cluster: nothing to unpin",
                Err(other) => return Err(other.into()),
            };
            deleted.push(SetDeleted {
                set: name,
                message: message.into(),
            });
        }
        Ok(Unpinned::Sets(deleted))
    }
}

/// Refuses what cluster mode cannot take, before the cluster is asked anything: no `--set`, or a bare image
/// list (`--images-file`, `--image`), which has no pool to land in. `usage` says what to pass instead.
fn pinned_image_sets_only(sources: &SetSources, usage: &str) -> Result<(), Failure> {
    let nothing = sources.sets.is_empty() && sources.releases.is_empty();
    if !sources.images_files.is_empty() || !sources.images.is_empty() || nothing {
        return Err(Failure::bad_input(format!(
            "in cluster mode {usage}; --images-file and --image have no pool to land in"
        )));
    }
    Ok(())
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

impl Fleet for MachineConfigFleet {
    fn label(&self) -> String {
        let options = &self.config.connect;
        let file = options.kubeconfig.as_ref().map_or_else(
            || "kubeconfig from the environment".to_owned(),
            |p| p.display().to_string(),
        );
        match &options.context {
            Some(context) => format!("cluster: {file} (context {context})"),
            None => format!("cluster: {file}"),
        }
    }

    fn traits(&self) -> Traits {
        Traits::MACHINE_CONFIG
    }

    fn nodes(&self) -> Vec<String> {
        Vec::new()
    }

    fn registry(&self) -> BoxFuture<'_, Result<ReadingRegistry, Failure>> {
        async move {
            let (registry, warnings) = self.pull_secret_registry().await?;
            Ok((Arc::clone(registry), warnings.clone()))
        }
        .boxed()
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), Failure>> {
        self.tui.connect(&self.config.connect).boxed()
    }

    fn write_denied(&self) -> BoxFuture<'_, Option<String>> {
        self.tui.write_denied().boxed()
    }

    fn plan<'a>(&'a self, sources: &'a SetSources) -> BoxFuture<'a, Result<Survey, Failure>> {
        self.plan_sets(sources).boxed()
    }

    fn readiness<'a>(
        &'a self,
        sources: &'a SetSources,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Readiness, Failure>> {
        self.judge(sources, wait).boxed()
    }

    fn apply<'a>(
        &'a self,
        sources: &'a SetSources,
        options: ApplyOptions,
        _progress: &'a mut dyn ApplyProgress,
        _interrupt: BoxFuture<'a, &'static str>,
    ) -> BoxFuture<'a, Result<Applied, Failure>> {
        self.write_sets(sources, options).boxed()
    }

    fn unpin<'a>(
        &'a self,
        sources: &'a SetSources,
        options: UnpinOptions,
    ) -> BoxFuture<'a, Result<Unpinned, Failure>> {
        self.delete_sets(sources, options).boxed()
    }

    fn watch(&self, events: Events) {
        self.tui.watch(events)
    }

    fn refresh(&self, sets: Vec<ImageSet>, events: Events) {
        self.tui.refresh(&sets, &events)
    }

    fn survey(
        &self,
        sets: Vec<ImageSet>,
        _nodes: Vec<String>,
    ) -> BoxFuture<'_, Result<Survey, Failure>> {
        async move {
            let (registry, _) = self.pull_secret_registry().await?;
            let (cluster, view) = self.tui.snapshot()?;
            survey_cluster(
                &cluster,
                &view,
                self.published(&cluster).await,
                &sets,
                registry,
                &self.config.platform,
                self.config.limits,
                self.config.cache_dir.as_deref(),
            )
            .await
            .map_err(Failure::from)
        }
        .boxed()
    }

    fn roll_out(
        &self,
        set: ImageSet,
        _nodes: Vec<String>,
        force: bool,
        _fan_out: bool,
        events: Events,
    ) -> Option<RolloutControl> {
        self.tui.apply(set, force, events);
        None
    }

    fn release(&self, set: ImageSet, _nodes: Vec<String>, events: Events) {
        self.tui.delete(set, events)
    }

    fn set_lazy(&self, node: String, enable: bool, events: Events) {
        self.tui
            .set_lazy(node, enable, self.config.lazy_store.clone(), events)
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}

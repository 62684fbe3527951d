//! Direct nodes: reached over their CRI sockets from where pinboard runs (`--cri`, `--nodes`, or the
//! endpoint crictl would use). pinboard surveys them ([`crate::survey`]), pulls and pins through
//! [`crate::engine`] (fanned out through its blob cache if asked, [`crate::fanout`]), judges them through
//! [`crate::backend::readiness`], and reads and writes their files itself.
//!
//! Every operation first puts back fan-out files that a pinboard killed mid-rollout left on the nodes.

mod check;
mod lazy;
mod rollout;
mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;

use super::{
    Applied, ApplyOptions, ApplyProgress, Events, Fleet, FleetEvent, ReadingRegistry,
    RolloutControl, SetSources, Traits, UnpinOptions, Unpinned,
};
use crate::backend::blobs::{BlobCache, CacheOptions};
use crate::backend::lazy::{Apply, set_lazy};
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::engine::EngineConfig;
use crate::error::Failure;
use crate::model::image::Platform;
use crate::model::lazy::NodeLazy;
use crate::model::plan::Limits;
use crate::model::readiness::LazyImages;
use crate::model::set::ImageSet;
use crate::survey::{Survey, survey};

use check::Checker;

/// How long quitting the TUI waits for a cancelled rollout to put fan-out's files back.
const QUIT_GRACE: Duration = Duration::from_secs(30);
/// How often the TUI reads the nodes' lazy pulling, so that a change made elsewhere shows within a second.
const LAZY_EVERY: Duration = Duration::from_millis(300);

/// What a direct fleet is made of, as the command line gives it.
pub struct DirectConfig {
    pub targets: Vec<NodeTarget>,
    pub registry: Registry,
    pub platform: Platform,
    pub limits: Limits,
    /// Each CRI call's deadline.
    pub timeout: Duration,
    pub engine: EngineConfig,
    /// The blob cache: what plans count as fetched already, and fan-out's store. None: none can be had.
    pub cache_dir: Option<PathBuf>,
    pub cache_options: CacheOptions,
    /// Where fan-out serves the nodes.
    pub fan_out_listen: SocketAddr,
    /// TUI: unpinning a set also releases its images' unowned pins (`--release-unowned`).
    pub release_unowned: bool,
    /// Whether readiness counts an image present only lazily as there (`--allow-lazy`).
    pub lazy_images: LazyImages,
}

/// Nodes reached over their CRI sockets.
pub struct DirectFleet(Arc<Direct>);

/// What a direct fleet knows and keeps; shared with the tasks its TUI operations start.
struct Direct {
    targets: Vec<NodeTarget>,
    registry: Arc<Registry>,
    platform: Platform,
    limits: Limits,
    timeout: Duration,
    engine: EngineConfig,
    cache_dir: Option<PathBuf>,
    cache_options: CacheOptions,
    fan_out_listen: SocketAddr,
    release_unowned: bool,
    lazy_images: LazyImages,
    /// Opened at the first fan-out and kept (it holds the directory's lock).
    cache: Mutex<Option<Arc<BlobCache>>>,
    /// The TUI's rollout tasks, waited for when it quits.
    rollouts: Mutex<Vec<JoinHandle<()>>>,
}

impl DirectFleet {
    pub fn new(config: DirectConfig) -> DirectFleet {
        DirectFleet(Arc::new(Direct {
            targets: config.targets,
            registry: Arc::new(config.registry),
            platform: config.platform,
            limits: config.limits,
            timeout: config.timeout,
            engine: config.engine,
            cache_dir: config.cache_dir,
            cache_options: config.cache_options,
            fan_out_listen: config.fan_out_listen,
            release_unowned: config.release_unowned,
            lazy_images: config.lazy_images,
            cache: Mutex::default(),
            rollouts: Mutex::default(),
        }))
    }
}

impl Direct {
    /// The targets named `nodes`, in target order.
    fn chosen(&self, nodes: &[String]) -> Vec<NodeTarget> {
        self.targets
            .iter()
            .filter(|t| nodes.contains(&t.node.name))
            .cloned()
            .collect()
    }

    /// Puts back fan-out files a killed pinboard left on the nodes, with a warning on stderr for each (or
    /// for what could not be put back), naming the node.
    async fn clean_stale(&self) {
        for line in crate::fanout::clean_stale(&self.targets, self.timeout).await {
            eprintln!("warning: {line}");
        }
    }

    /// The blob cache for fan-out, opened the first time and kept.
    fn fan_out_cache(&self) -> Result<Arc<BlobCache>, Failure> {
        let mut cache = self.cache.lock().expect("cache lock");
        if let Some(cache) = &*cache {
            return Ok(Arc::clone(cache));
        }
        let dir = self.cache_dir.clone().ok_or_else(|| {
            Failure::bad_input(
                "no place for the blob cache: neither XDG_CACHE_HOME nor HOME is set; pass --cache-dir DIR",
            )
        })?;
        let opened = BlobCache::open(&dir, self.cache_options.clone(), Arc::clone(&self.registry))
            .map_err(|e| Failure::bad_input(format!("--fan-out: {e}")))?;
        *cache = Some(Arc::clone(&opened));
        Ok(opened)
    }

    async fn survey_targets(
        &self,
        targets: &[NodeTarget],
        sets: &[ImageSet],
    ) -> Result<Survey, Failure> {
        let nodes: Vec<_> = targets.iter().map(|t| t.node.clone()).collect();
        survey(
            &nodes,
            sets,
            &self.registry,
            &self.platform,
            self.limits,
            self.timeout,
            self.cache_dir.as_deref(),
        )
        .await
        .map_err(Failure::from)
    }

    /// What each node is like now, told to `events`.
    async fn send_nodes(&self, events: &Events) {
        let infos = views::node_infos(&self.targets, self.timeout).await;
        let _ = events.send(FleetEvent::Nodes(infos));
    }

    /// Reads every node's lazy pulling every [`LAZY_EVERY`] and tells `events` what the nodes are like
    /// whenever it changed (a runtime restarted, its snapshotter gone or back), until no one listens.
    async fn watch_lazy(&self, events: &Events) {
        let mut last = views::lazy_states(&self.targets, self.timeout).await;
        while !events.is_closed() {
            tokio::time::sleep(LAZY_EVERY).await;
            let now = views::lazy_states(&self.targets, self.timeout).await;
            if now != last {
                self.send_nodes(events).await;
                last = now;
            }
        }
    }

    /// The nodes, then the config views for `sets`, told to `events`.
    async fn send_views(&self, sets: &[ImageSet], events: &Events) {
        self.send_nodes(events).await;
        let views = views::config_views(&self.targets, sets, self.timeout).await;
        let _ = events.send(FleetEvent::ConfigViews(views));
    }
}

impl Fleet for DirectFleet {
    fn label(&self) -> String {
        let count = self.0.targets.len();
        format!("direct: {count} node{}", if count == 1 { "" } else { "s" })
    }

    fn traits(&self) -> Traits {
        Traits::DIRECT
    }

    fn nodes(&self) -> Vec<String> {
        self.0.targets.iter().map(|t| t.node.name.clone()).collect()
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), Failure>> {
        async { Ok(()) }.boxed()
    }

    fn write_denied(&self) -> BoxFuture<'_, Option<String>> {
        async { None }.boxed()
    }

    fn registry(&self) -> BoxFuture<'_, Result<ReadingRegistry, Failure>> {
        let registry = Arc::clone(&self.0.registry);
        async move { Ok((registry, Vec::new())) }.boxed()
    }

    fn plan<'a>(&'a self, sources: &'a SetSources) -> BoxFuture<'a, Result<Survey, Failure>> {
        async move {
            let sets =
                super::sets::noted(sources, true, &self.0.registry, &self.0.platform).await?;
            self.0.clean_stale().await;
            self.0.survey_targets(&self.0.targets, &sets).await
        }
        .boxed()
    }

    fn readiness<'a>(
        &'a self,
        sources: &'a SetSources,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<crate::model::readiness::Readiness, Failure>> {
        async move {
            let checker = Checker::new(&self.0, sources).await?;
            match wait {
                Some(limit) => checker.wait(limit).await,
                None => checker.readiness().await,
            }
        }
        .boxed()
    }

    fn apply<'a>(
        &'a self,
        sources: &'a SetSources,
        options: ApplyOptions,
        progress: &'a mut dyn ApplyProgress,
        interrupt: BoxFuture<'a, &'static str>,
    ) -> BoxFuture<'a, Result<Applied, Failure>> {
        rollout::apply(&self.0, sources, options, progress, interrupt).boxed()
    }

    fn unpin<'a>(
        &'a self,
        sources: &'a SetSources,
        options: UnpinOptions,
    ) -> BoxFuture<'a, Result<Unpinned, Failure>> {
        rollout::unpin(&self.0, sources, options).boxed()
    }

    fn watch(&self, events: Events) {
        let direct = Arc::clone(&self.0);
        let watching = events.clone();
        tokio::spawn(async move { direct.watch_lazy(&watching).await });
        if self.0.engine.readonly {
            return;
        }
        let direct = Arc::clone(&self.0);
        tokio::spawn(async move {
            for line in crate::fanout::clean_stale(&direct.targets, direct.timeout).await {
                let _ = events.send(FleetEvent::Notice(line));
            }
        });
    }

    fn refresh(&self, sets: Vec<ImageSet>, events: Events) {
        let direct = Arc::clone(&self.0);
        tokio::spawn(async move { direct.send_views(&sets, &events).await });
    }

    fn survey(
        &self,
        sets: Vec<ImageSet>,
        nodes: Vec<String>,
    ) -> BoxFuture<'_, Result<Survey, Failure>> {
        async move { self.0.survey_targets(&self.0.chosen(&nodes), &sets).await }.boxed()
    }

    fn roll_out(
        &self,
        set: ImageSet,
        nodes: Vec<String>,
        force: bool,
        fan_out: bool,
        events: Events,
    ) -> Option<RolloutControl> {
        rollout::start_in_tui(&self.0, set, nodes, force, fan_out, events)
    }

    fn release(&self, set: ImageSet, nodes: Vec<String>, events: Events) {
        rollout::release_in_tui(&self.0, set, nodes, events)
    }

    fn set_lazy(&self, node: String, enable: bool, events: Events) {
        let Some(target) = self.0.targets.iter().find(|t| t.node.name == node).cloned() else {
            return;
        };
        let direct = Arc::clone(&self.0);
        tokio::spawn(async move {
            let timeout = direct.timeout;
            let changed = set_lazy(
                &target.node.endpoint,
                &target.lazy,
                Some(enable),
                Apply::WRITE,
                timeout,
            );
            let message = match changed.await {
                Ok(outcome) => outcome.summary(),
                Err(e) => format!("lazy pulling not changed: {e}"),
            };
            let _ = events.send(FleetEvent::Notice(format!("{node}: {message}")));
            direct.send_nodes(&events).await;
        });
    }

    fn lazy(
        &self,
        wanted: Option<bool>,
        apply: Apply,
    ) -> BoxFuture<'_, Result<Vec<NodeLazy>, Failure>> {
        async move { Ok(lazy::lazy(&self.0, wanted, apply).await) }.boxed()
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        async move {
            let running = std::mem::take(&mut *self.0.rollouts.lock().expect("rollouts lock"));
            for rollout in running {
                if !rollout.is_finished() {
                    eprintln!("pinboard: cancelling the rollout and putting fan-out's files back…");
                }
                let _ = tokio::time::timeout(QUIT_GRACE, rollout).await;
            }
        }
        .boxed()
    }
}

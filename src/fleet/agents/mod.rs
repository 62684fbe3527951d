//! Any Kubernetes cluster with pinboard's agents installed: pinboard writes PinSets (server-side apply)
//! and deletes them; each node's agent (`pinboard agent`, [`crate::agent`]) pulls and pins through the
//! same engine as direct mode and reports its node in a PinboardNode, which pinboard watches (never
//! polls) and judges through [`crate::model::readiness::assess_agents`]. An agent's image list is
//! complete, so the plan knows exactly which images each node holds.

mod lazy;
mod outcome;
mod session;
mod tui;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    Applied, ApplyOptions, ApplyProgress, Events, Fleet, ReadingRegistry, Reported, RolloutControl,
    SetDeleted, SetSources, SetUsed, Traits, UnpinOptions, Unpinned,
};
use crate::backend::kube::ConnectOptions;
use crate::backend::lazy::Apply;
use crate::backend::pinboard_api::AgentsError;
use crate::backend::registry::{Registry, RegistryOptions};
use crate::error::{Exit, Failure};
use crate::fanout::FanOutReport;
use crate::model::image::Platform;
use crate::model::lazy::NodeLazy;
use crate::model::pinboard_api::PinSet;
use crate::model::plan::{Limits, Verdict};
use crate::model::readiness::{Readiness, WantedSet, count_nodes};
use crate::model::set::ImageSet;
use crate::survey::{Survey, survey_reported};

use session::Connected;

/// What a cluster of agents is, as the command line gives it.
pub struct AgentsSettings {
    pub connect: ConnectOptions,
    /// The agents' namespace: their heartbeats and the sets' pull Secrets.
    pub namespace: String,
    /// How pinboard itself reads the registries (for the plan): the auth files.
    pub registry: RegistryOptions,
    pub platform: Platform,
    pub limits: Limits,
    /// The blob cache whose blobs the plan's `linkBytes.fanOut` counts as fetched.
    pub cache_dir: Option<PathBuf>,
}

/// A cluster's nodes, through pinboard's agents.
pub struct AgentsFleet {
    config: AgentsSettings,
    /// The TUI's connection, made when it starts watching.
    tui: tui::Live,
}

impl AgentsFleet {
    pub fn new(config: AgentsSettings) -> AgentsFleet {
        AgentsFleet {
            config,
            tui: tui::Live::default(),
        }
    }

    fn reading_registry(&self) -> Result<Arc<Registry>, Failure> {
        Registry::new(self.config.registry.clone())
            .map(Arc::new)
            .map_err(|e| Failure::bad_input(e.to_string()))
    }

    async fn open(&self) -> Result<Connected, Failure> {
        Connected::open(&self.config.connect, &self.config.namespace).await
    }

    /// Connected, with the sets `sources` names: read from files, releases and flags, or named on the
    /// cluster.
    async fn wanted(
        &self,
        sources: &SetSources,
        registry: &Registry,
    ) -> Result<(Connected, Vec<WantedSet>), Failure> {
        let (files, names) = sources.split_names();
        let sets = match files.is_empty() {
            true => Vec::new(),
            false => super::sets::noted(&files, true, registry, &self.config.platform).await?,
        };
        if sets.is_empty() && names.is_empty() {
            return Err(Failure::bad_input(
                "no sets given: pass --set FILE (a PinSet or PinnedImageSet YAML), --set NAME (a PinSet \
                 on the cluster), --images-file FILE, --image REF or --release PULLSPEC",
            ));
        }
        let connected = self.open().await?;
        let wanted = connected.wanted(sets, names)?;
        Ok((connected, wanted))
    }

    async fn plan_sets(&self, sources: &SetSources) -> Result<Survey, Failure> {
        let registry = self.reading_registry()?;
        let (connected, wanted) = self.wanted(sources, &registry).await?;
        let sets: Vec<ImageSet> = wanted.into_iter().map(|w| w.set).collect();
        self.survey_view(&connected.view, &sets, &registry).await
    }

    async fn survey_view(
        &self,
        view: &crate::model::agents_view::AgentsView,
        sets: &[ImageSet],
        registry: &Registry,
    ) -> Result<Survey, Failure> {
        survey_reported(
            view,
            sets,
            registry,
            &self.config.platform,
            self.config.limits,
            self.config.cache_dir.as_deref(),
            SystemTime::now(),
        )
        .await
        .map_err(Failure::from)
    }

    async fn judge(
        &self,
        sources: &SetSources,
        wait: Option<Duration>,
    ) -> Result<Readiness, Failure> {
        let registry = self.reading_registry()?;
        let (mut connected, wanted) = self.wanted(sources, &registry).await?;
        Ok(match wait {
            Some(limit) => connected.wait(&wanted, limit).await,
            None => connected.readiness(&wanted).await,
        })
    }

    /// Checks every set, names the nodes the plan says they will not fit (their agents will not pull
    /// there), writes the sets, then waits up to `wait` for the agents to report them pinned.
    async fn write_sets(
        &self,
        sources: &SetSources,
        options: ApplyOptions,
    ) -> Result<Applied, Failure> {
        let registry = self.reading_registry()?;
        let sets = super::sets::noted(sources, true, &registry, &self.config.platform).await?;
        let mut connected = self.open().await?;
        match self.survey_view(&connected.view, &sets, &registry).await {
            Ok(survey) => {
                let full: Vec<&str> = survey
                    .nodes
                    .iter()
                    .filter(|n| n.verdict == Verdict::NoSpace)
                    .map(|n| n.node.as_str())
                    .collect();
                if !full.is_empty() && !options.force {
                    return Err(Failure {
                        exit: Exit::BadInput,
                        lines: vec![format!(
                            "the plan says the sets do not fit on {} ({}): their agents would refuse them; \
                             free space there, narrow the sets' nodeSelector (or --selector), or pass \
                             --force to write the sets anyway",
                            count_nodes(full.len()),
                            full.join(", ")
                        )],
                    });
                }
            }
            Err(failure) => {
                for line in failure.lines {
                    eprintln!("warning: no plan before writing the sets: {line}");
                }
            }
        }
        let mut wanted = Vec::new();
        let mut changed = Vec::new();
        let cache_before = connected.view.cache_bytes();
        for mut set in sets {
            // Through the agents, `--fan-out` is the set's own: its nodes pull through the in-cluster cache.
            set.fan_out |= options.fan_out;
            let before = connected.view.set(&set.name).map(PinSet::generation);
            let stored = connected.api.apply_set(&set).await?;
            eprintln!(
                "applied PinSet {} (generation {})",
                set.name,
                stored.generation()
            );
            changed.push(before != Some(stored.generation()));
            wanted.push(WantedSet {
                set,
                min_generation: stored.generation(),
            });
        }
        let readiness = connected.wait(&wanted, options.wait).await;
        let applied: Vec<outcome::Applied> = wanted
            .iter()
            .zip(changed)
            .map(|(w, changed)| outcome::Applied {
                name: &w.set.name,
                generation: w.min_generation,
                changed,
            })
            .collect();
        let fanned_out = wanted.iter().any(|w| w.set.fan_out);
        let (link, served) = connected.view.cache_bytes();
        Ok(Applied::Reported(Box::new(Reported {
            sets: wanted.iter().map(|w| SetUsed::of(&w.set)).collect(),
            outcomes: outcome::node_outcomes(&connected.view, &readiness, &applied),
            fan_out: fanned_out.then(|| FanOutReport {
                link_bytes: link.saturating_sub(cache_before.0),
                served_bytes: served.saturating_sub(cache_before.1),
            }),
            readiness,
        })))
    }

    /// Deletes the named sets; a set already gone is reported, not an error.
    async fn delete_sets(
        &self,
        sources: &SetSources,
        options: UnpinOptions,
    ) -> Result<Unpinned, Failure> {
        if options.all_sets || options.release_unowned {
            eprintln!(
                "warning: --all-sets and --release-unowned are for direct mode; on agents each node's \
                 agent keeps the pins of the sets left on the cluster"
            );
        }
        let (files, names) = sources.split_names();
        let sets = match files.is_empty() {
            true => Vec::new(),
            false => {
                let registry = self.reading_registry()?;
                super::sets::noted(&files, false, &registry, &self.config.platform).await?
            }
        };
        let targets: Vec<String> = sets.into_iter().map(|s| s.name).chain(names).collect();
        if targets.is_empty() {
            return Err(Failure::bad_input(
                "unpin deletes PinSets: pass --set NAME, --set FILE or --release PULLSPEC",
            ));
        }
        let connected = self.open().await?;
        let mut deleted = Vec::new();
        for name in targets {
            let message = match connected.api.delete_set(&name).await {
                Ok(()) => {
                    "deleted: each node's agent releases the pins no other set holds; images stay on the \
                     nodes"
                }
                Err(AgentsError::NoSuchSet(_)) => "not on the cluster: nothing to unpin",
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

impl Fleet for AgentsFleet {
    fn label(&self) -> String {
        let options = &self.config.connect;
        let file = options.kubeconfig.as_ref().map_or_else(
            || "kubeconfig from the environment".to_owned(),
            |p| p.display().to_string(),
        );
        match &options.context {
            Some(context) => format!("agents: {file} (context {context})"),
            None => format!("agents: {file}"),
        }
    }

    fn traits(&self) -> Traits {
        Traits::AGENTS
    }

    fn nodes(&self) -> Vec<String> {
        Vec::new()
    }

    fn registry(&self) -> BoxFuture<'_, Result<ReadingRegistry, Failure>> {
        async move { Ok((self.reading_registry()?, Vec::new())) }.boxed()
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), Failure>> {
        self.tui
            .connect(&self.config.connect, &self.config.namespace)
            .boxed()
    }

    fn write_denied(&self) -> BoxFuture<'_, Option<String>> {
        async { None }.boxed()
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
        nodes: Vec<String>,
    ) -> BoxFuture<'_, Result<Survey, Failure>> {
        async move {
            let registry = self.reading_registry()?;
            let view = self.tui.view_with_images().await?;
            let sets: Vec<ImageSet> = sets
                .into_iter()
                .map(|set| self.tui.targeting(set, &nodes))
                .collect();
            self.survey_view(&view, &sets, &registry).await
        }
        .boxed()
    }

    fn roll_out(
        &self,
        set: ImageSet,
        nodes: Vec<String>,
        _force: bool,
        fan_out: bool,
        events: Events,
    ) -> Option<RolloutControl> {
        // As `apply --fan-out` does ([`Self::write_sets`]).
        let set = ImageSet {
            fan_out: set.fan_out || fan_out,
            ..set
        };
        self.tui.apply(self.tui.targeting(set, &nodes), events);
        None
    }

    fn release(&self, set: ImageSet, _nodes: Vec<String>, events: Events) {
        self.tui.delete(set, events)
    }

    fn set_lazy(&self, node: String, enable: bool, events: Events) {
        self.tui.set_lazy(node, enable, events)
    }

    fn lazy(
        &self,
        wanted: Option<bool>,
        apply: Apply,
    ) -> BoxFuture<'_, Result<Vec<NodeLazy>, Failure>> {
        async move { lazy::lazy(&mut self.open().await?, wanted, apply).await }.boxed()
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}

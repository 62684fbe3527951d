//! Any Kubernetes cluster with pinboard's agents installed: pinboard writes PinSets (server-side apply)
//! and deletes them; each node's agent (`pinboard agent`, [`crate::agent`]) pulls and pins through the
//! same engine as direct mode and reports its node in a PinboardNode, which pinboard watches (never
//! polls) and judges through [`crate::model::readiness::assess_agents`]. Each agent publishes what its
//! runtime holds, so the plan knows exactly which blobs each node lacks, and reports the floor it pulls
//! by, which its node's verdict takes.

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
use crate::backend::kube::{ConnectOptions, connect};
use crate::backend::lazy::Apply;
use crate::backend::pinboard_api::{AgentsError, PinboardApi};
use crate::backend::registry::{Registry, RegistryOptions};
use crate::error::{Exit, Failure};
use crate::fanout::FanOutReport;
use crate::model::agents_view::AgentsView;
use crate::model::image::Platform;
use crate::model::lazy::NodeLazy;
use crate::model::pinboard_api::PinSet;
use crate::model::plan::{Limits, NodePlan, Verdict};
use crate::model::readiness::{Readiness, WantedSet, count_nodes};
use crate::model::reference::some_of;
use crate::model::set::ImageSet;
use crate::model::units::human;
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

    /// Connected, with every node's images watched too when `images` (what readiness judges by).
    async fn open(&self, images: bool) -> Result<Connected, Failure> {
        Connected::open(&self.config.connect, &self.config.namespace, images).await
    }

    /// The sets `sources` names: read from files, releases and flags, and the names of sets on the
    /// cluster.
    async fn named(
        &self,
        sources: &SetSources,
        registry: &Registry,
    ) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
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
        Ok((sets, names))
    }

    /// Connected, every node's images watched too, with the sets `sources` names.
    async fn wanted(
        &self,
        sources: &SetSources,
        registry: &Registry,
    ) -> Result<(Connected, Vec<WantedSet>), Failure> {
        let (sets, names) = self.named(sources, registry).await?;
        let connected = self.open(true).await?;
        let wanted = connected.wanted(sets, names)?;
        Ok((connected, wanted))
    }

    /// The sets planned on the cluster as the API server's watch cache has it now, read once: a plan
    /// watches nothing, and reads no node's image list.
    async fn plan_sets(&self, sources: &SetSources) -> Result<Survey, Failure> {
        let registry = self.reading_registry()?;
        let (sets, names) = self.named(sources, &registry).await?;
        let client = connect(&self.config.connect).await?;
        let api = PinboardApi::discover(client, &self.config.namespace).await?;
        let view = api.snapshot().await?;
        let sets: Vec<ImageSet> = session::wanted_in(&view, sets, names)?
            .into_iter()
            .map(|w| w.set)
            .collect();
        self.survey_view((&api, &view), &sets, &registry, self.config.limits)
            .await
    }

    /// The sets planned on the nodes `view` shows, by what their agents published and reported.
    async fn survey_view(
        &self,
        (api, view): (&PinboardApi, &AgentsView),
        sets: &[ImageSet],
        registry: &Registry,
        limits: Limits,
    ) -> Result<Survey, Failure> {
        survey_reported(
            api,
            view,
            sets,
            registry,
            &self.config.platform,
            limits,
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

    /// Checks every set, names the nodes the plan says they will not fit by their agents' own floors
    /// (their agents will not pull there), writes the sets, then waits up to `wait` for the agents to
    /// report them pinned.
    async fn write_sets(
        &self,
        sources: &SetSources,
        options: ApplyOptions,
    ) -> Result<Applied, Failure> {
        let registry = self.reading_registry()?;
        let sets = super::sets::noted(sources, true, &registry, &self.config.platform).await?;
        let mut connected = self.open(true).await?;
        let limits = self.config.limits;
        if let Some(line) = flags_left_aside(&limits) {
            eprintln!("warning: {line}");
        }
        let view = (&connected.api, &connected.view);
        match self
            .survey_view(view, &sets, &registry, limits.agents_decide())
            .await
        {
            Ok(survey) => {
                let full: Vec<&NodePlan> = survey
                    .nodes
                    .iter()
                    .filter(|n| n.verdict == Verdict::NoSpace)
                    .collect();
                if !full.is_empty() && !options.force {
                    return Err(Failure {
                        exit: Exit::BadInput,
                        lines: vec![format!(
                            "the plan says the sets do not fit on {} ({}): their agents would refuse them, \
                             by the floors they pull by ({}); free space there, narrow the sets' \
                             nodeSelector (or --selector), or pass --force to write the sets anyway",
                            count_nodes(full.len()),
                            some_of(&full.iter().map(|n| n.node.clone()).collect::<Vec<_>>()),
                            floors_of(&full)
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
        if fanned_out && readiness.ready && !connected.follow_cache_figures().await {
            eprintln!(
                "warning: the in-cluster cache's holder did not report its figures after the rollout in time: \
                 linkBytes and servedBytes are as of its last report"
            );
        }
        let (link, served) = connected.view.cache_bytes();
        Ok(Applied::Reported(Box::new(Reported {
            sets: wanted.iter().map(|w| SetUsed::of(&w.set)).collect(),
            outcomes: outcome::node_outcomes(&connected.view, &readiness, &applied),
            fan_out: fanned_out.then(|| FanOutReport {
                link_bytes: link.saturating_sub(cache_before.0),
                served_bytes: served.saturating_sub(cache_before.1),
                link_rate: connected.view.cache_link_rate(),
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
        let connected = self.open(false).await?;
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

/// What `apply` says of the disk-limit flags given on agents: each agent pulls by its own.
fn flags_left_aside(limits: &Limits) -> Option<String> {
    let given: Vec<String> = [
        limits
            .min_free_given
            .then(|| format!("--min-free {}", human(limits.min_free_bytes))),
        limits
            .gc_high_given
            .then(|| format!("--gc-high-percent {}", limits.gc_high_percent)),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!given.is_empty()).then(|| {
        format!(
            "{} does not apply to the agents: each node's agent pulls by its own (its --min-free and \
             --gc-high-percent, in its PinboardNode report), and only the nodes whose agents would refuse \
             are refused; `plan` takes it as a what-if",
            given.join(" and ")
        )
    })
}

/// `n3 1.00 MiB (its agent's), n4 16 GiB (--min-free)`: the floor each refused node was judged by.
fn floors_of(nodes: &[&NodePlan]) -> String {
    let each: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{} {} ({})",
                n.node,
                human(n.min_free_bytes),
                n.min_free_source.short()
            )
        })
        .collect();
    some_of(&each)
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
            let view = self.tui.listed_view().await?;
            let sets: Vec<ImageSet> = sets
                .into_iter()
                .map(|set| self.tui.targeting(set, &nodes))
                .collect();
            let api = self.tui.api()?;
            self.survey_view((&api, &view), &sets, &registry, self.config.limits)
                .await
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
        async move { lazy::lazy(&mut self.open(false).await?, wanted, apply).await }.boxed()
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}

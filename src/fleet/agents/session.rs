//! A cluster of agents connected and watched, for the headless commands: the first complete view waited
//! for, then followed (never polled) until the sets are ready or the wait ends. A heartbeat goes stale
//! without any object changing, so while waiting the view is also judged again every few seconds. A
//! verdict given (not each look while waiting) asks the API server for the agent pods of the nodes whose
//! agent does not report, so it says why.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::first_list::{FailingWatch, Watched, next_update, wait_for_first_list};
use super::super::sets::unknown_sets;
use crate::backend::agent_pods::agent_pods;
use crate::backend::kube::{ConnectOptions, connect};
use crate::backend::pinboard_api::{AgentsWatch, PinboardApi};
use crate::error::Failure;
use crate::model::agent_pods::AgentPods;
use crate::model::agents_view::AgentsView;
use crate::model::machine_config::Connection;
use crate::model::readiness::{Readiness, WantedSet, assess_agents, missing_agents, wanted_sets};
use crate::model::set::ImageSet;
use crate::model::units::human;

/// How often a wait judges the view again when nothing changed (heartbeats age).
const REJUDGE_EVERY: Duration = Duration::from_secs(5);

/// pinboard's API connected and watched.
pub(super) struct Connected {
    pub(super) api: PinboardApi,
    watch: AgentsWatch,
    pub(super) view: AgentsView,
    /// Whether every node's images are watched too.
    images: bool,
}

impl Watched for Connected {
    fn listed(&self) -> bool {
        self.view.synced() && (!self.images || self.view.images_synced())
    }

    fn failing(&self) -> Option<FailingWatch> {
        self.view.connections.iter().find_map(|(kind, c)| match c {
            Connection::Reconnecting { since, error } => Some(FailingWatch {
                what: format!("the cluster's {kind}s"),
                since: *since,
                error: error.clone(),
            }),
            _ => None,
        })
    }

    async fn next_update(&mut self, deadline: Instant) -> bool {
        next_update(&mut self.watch.updates, deadline, |u| self.view.apply(u)).await
    }
}

impl Connected {
    /// Connects, finds pinboard's API and waits for the first complete view, with every node's `images`
    /// when asked (what readiness judges by); exit 3 when the API server does not answer, naming what
    /// failed.
    pub(super) async fn open(
        options: &ConnectOptions,
        namespace: &str,
        images: bool,
    ) -> Result<Connected, Failure> {
        let api = PinboardApi::discover(connect(options).await?, namespace).await?;
        let mut connected = Connected {
            watch: api.watch_all(images),
            api,
            view: AgentsView::default(),
            images,
        };
        wait_for_first_list(
            &mut connected,
            "the ClusterRole pinboard-agents-operator (pinboard agent manifests)",
        )
        .await?;
        Ok(connected)
    }

    /// The wanted sets judged on every node they land on, now, with the pods of nodes whose agent does
    /// not report looked up.
    pub(super) async fn readiness(&self, wanted: &[WantedSet]) -> Readiness {
        let now = SystemTime::now();
        let missing = missing_agents(&self.view, wanted, now);
        let pods = agent_pods(self.api.client(), &missing).await;
        assess_agents(&self.view, wanted, now, &pods)
    }

    /// [`Self::readiness`] from the watched view alone: what a wait looks at after each change.
    fn look(&self, wanted: &[WantedSet]) -> Readiness {
        assess_agents(&self.view, wanted, SystemTime::now(), &AgentPods::new())
    }

    /// Follows the cluster until `done` says so of the view or `limit` has passed.
    pub(super) async fn follow(&mut self, limit: Duration, done: impl Fn(&AgentsView) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(&self.view) && self.next_update(deadline).await {}
    }

    /// Follows the cluster until every node is ready or `limit` has passed, one line on stderr per change.
    pub(super) async fn wait(&mut self, wanted: &[WantedSet], limit: Duration) -> Readiness {
        let deadline = Instant::now() + limit;
        let mut last_line = String::new();
        loop {
            let readiness = self.look(wanted);
            if readiness.ready {
                return readiness;
            }
            let line = self.progress_line(&readiness, wanted);
            if line != last_line {
                eprintln!("waiting: {line}");
            }
            let next = deadline.min(Instant::now() + REJUDGE_EVERY);
            if !self.next_update(next).await && Instant::now() >= deadline {
                eprintln!("waiting: timed out after {limit:?}: {line}");
                return self.readiness(wanted).await;
            }
            last_line = line;
        }
    }

    /// Readiness's line, with the bytes the nodes have fetched for the wanted sets' generations so far (not
    /// an older generation's, nor another set's), and the API server's connection when it is not synced.
    fn progress_line(&self, readiness: &Readiness, wanted: &[WantedSet]) -> String {
        let mut line = readiness.progress_line();
        let (done, total) = readiness
            .nodes
            .iter()
            .filter_map(|n| self.view.report(&n.node))
            .flat_map(|r| &r.sets)
            .filter(|s| {
                wanted
                    .iter()
                    .any(|w| w.set.name == s.name && s.observed_generation >= w.min_generation)
            })
            .fold((0, 0), |(d, t), s| (d + s.done_bytes, t + s.total_bytes));
        if total > 0 {
            line.push_str(&format!(" ({} of {} fetched)", human(done), human(total)));
        }
        if !self.view.synced() {
            line.push_str(" (API server: reconnecting)");
        }
        line
    }

    /// The sets to check: those read from files, and those `names` names on the cluster (each must be there).
    pub(super) fn wanted(
        &self,
        files: Vec<ImageSet>,
        names: Vec<String>,
    ) -> Result<Vec<WantedSet>, Failure> {
        wanted_in(&self.view, files, names)
    }
}

/// The sets `files` and `names` name in `view`: those read from files, and those named on the cluster
/// (each must be there).
pub(super) fn wanted_in(
    view: &AgentsView,
    files: Vec<ImageSet>,
    names: Vec<String>,
) -> Result<Vec<WantedSet>, Failure> {
    wanted_sets(
        files,
        names,
        |name| view.set(name).map(|s| s.to_image_set()),
        || view.sets.iter().map(|s| s.name().to_owned()).collect(),
    )
    .map_err(|sets| unknown_sets(sets, "PinSet", "a set YAML file"))
}

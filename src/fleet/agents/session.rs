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
use crate::model::readiness::{
    AskedCheck, Readiness, WantedSet, assess_agents, missing_agents, unanswered, wanted_sets,
};
use crate::model::set::ImageSet;
use crate::model::units::human;

/// How often a wait judges the view again when nothing changed (heartbeats age).
const REJUDGE_EVERY: Duration = Duration::from_secs(5);
/// How long the agents are given to answer a check (ask their runtime, write their report): one tick,
/// the runtime's answer and a write, with room for a busy API server.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);
/// A wait that looks ready asks again at most this often, so that it keeps its cadence without flooding
/// the API server: each ask costs a write per set and one per node that answers.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(15);

/// pinboard's API connected and watched.
pub(super) struct Connected {
    pub(super) api: PinboardApi,
    watch: AgentsWatch,
    pub(super) view: AgentsView,
    /// Whether every node's images are watched too.
    images: bool,
    /// The last check asked of the agents; why none could be, when so.
    asked: Option<AskedCheck>,
    not_asked: Option<String>,
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
            asked: None,
            not_asked: None,
        };
        wait_for_first_list(
            &mut connected,
            "the ClusterRole pinboard-agents-operator (pinboard agent manifests)",
        )
        .await?;
        Ok(connected)
    }

    /// The wanted sets judged on every node they land on as of now: the agents are asked to ask their
    /// runtimes and given [`ANSWER_WITHIN`] to answer; then the pods of nodes whose agent does not report
    /// are looked up.
    pub(super) async fn readiness(&mut self, wanted: &[WantedSet]) -> Readiness {
        self.ask(wanted).await;
        self.verdict(wanted).await
    }

    /// The verdict on the view as it stands, against the last check asked.
    async fn verdict(&self, wanted: &[WantedSet]) -> Readiness {
        let now = SystemTime::now();
        let missing = missing_agents(&self.view, wanted, now);
        let pods = agent_pods(self.api.client(), &missing).await;
        let mut readiness = assess_agents(&self.view, wanted, now, &pods, self.asked.as_ref());
        readiness.warnings.extend(self.not_asked.clone());
        readiness
    }

    /// [`Self::verdict`] from the watched view alone: what a wait looks at after each change.
    fn look(&self, wanted: &[WantedSet], asked: Option<&AskedCheck>) -> Readiness {
        assess_agents(
            &self.view,
            wanted,
            SystemTime::now(),
            &AgentPods::new(),
            asked,
        )
    }

    /// Asks the agents of the wanted sets' nodes to ask their runtimes now (one write per set on the
    /// cluster), and follows their reports until every node that says a set is pinned answered, or
    /// [`ANSWER_WITHIN`] passed. A user who may not annotate PinSets (a viewer) is told the verdict is as
    /// of each node's last report.
    async fn ask(&mut self, wanted: &[WantedSet]) {
        let at = SystemTime::now();
        let request = format!(
            "{}-{}",
            k8s_openapi::jiff::Timestamp::now().as_nanosecond(),
            std::process::id()
        );
        for set in wanted
            .iter()
            .filter(|w| self.view.set(&w.set.name).is_some())
        {
            if let Err(e) = self.api.ask_check(&set.set.name, &request).await {
                self.not_asked = Some(format!(
                    "the agents were not asked to check their runtimes now ({e}), so the verdict is as of \
                     each node's last report: a loss since then shows within 2 s on containerd and 30 s on \
                     CRI-O; run check as a user who may annotate PinSets (the ClusterRole \
                     pinboard-agents-operator)"
                ));
                return;
            }
        }
        let asked = AskedCheck { request, at };
        let now = || SystemTime::now();
        self.follow(ANSWER_WITHIN, |view| {
            unanswered(view, wanted, &asked, now()) == 0
        })
        .await;
        self.asked = Some(asked);
    }

    /// Follows the cluster until the in-cluster cache's holder reports figures read after the last check
    /// asked (so they cover the rollout that check followed), for up to [`ANSWER_WITHIN`]; whether it did.
    pub(super) async fn follow_cache_figures(&mut self) -> bool {
        let Some(request) = self.asked.as_ref().map(|a| a.request.clone()) else {
            return false;
        };
        self.follow(ANSWER_WITHIN, |view| view.cache_answered(&request))
            .await;
        self.view.cache_answered(&request)
    }

    /// Follows the cluster until `done` says so of the view or `limit` has passed.
    pub(super) async fn follow(&mut self, limit: Duration, done: impl Fn(&AgentsView) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(&self.view) && self.next_update(deadline).await {}
    }

    /// Follows the cluster until every node is ready or `limit` has passed, one line on stderr per change.
    /// Ready is the agents' word as of the question: when the reports look ready, the agents are asked
    /// (at most every [`ASK_AGAIN_AFTER`]) and their answers decide.
    pub(super) async fn wait(&mut self, wanted: &[WantedSet], limit: Duration) -> Readiness {
        let deadline = Instant::now() + limit;
        let mut last_line = String::new();
        let mut asked_at: Option<Instant> = None;
        loop {
            let readiness = self.look(wanted, None);
            if readiness.ready {
                if self.not_asked.is_some() {
                    return self.verdict(wanted).await;
                }
                if asked_at.is_none_or(|at| at.elapsed() >= ASK_AGAIN_AFTER) {
                    asked_at = Some(Instant::now());
                    self.ask(wanted).await;
                }
                if self.not_asked.is_some() || self.look(wanted, self.asked.as_ref()).ready {
                    return self.verdict(wanted).await;
                }
            }
            let line = self.progress_line(&readiness, wanted);
            if line != last_line {
                eprintln!("waiting: {line}");
            }
            let next = deadline.min(Instant::now() + REJUDGE_EVERY);
            if !self.next_update(next).await && Instant::now() >= deadline {
                eprintln!("waiting: timed out after {limit:?}: {line}");
                return self.verdict(wanted).await;
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

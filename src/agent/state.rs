//! The agent's decisions, pure: what it watches (the sets, its Node's labels, an administrator's lazy-pull
//! wish) and what it observes (its node's facts, its rollout's events, its checks of the runtime) go in
//! as an [`Input`]; what to do next comes out as [`Action`]s — roll a set out (or restore one), cancel the
//! running rollout, release a set's pins, read the node, check the runtime — for the shell
//! ([`super::Agent`]) to carry out and answer with more inputs. The same shape as the TUI's
//! `update(&mut State, Msg) -> Vec<Cmd>` and kube-rs's `reconcile(object, context) -> Action`; times come
//! in, so every decision is unit-tested without a cluster or a clock.
//!
//! - One rollout at a time: an edited set's rollout is cancelled and started again on the new content; a
//!   set no longer selecting the node is cancelled, then released.
//! - Nothing is released before the sets' watch has listed: no set yet is not "no set selects the node".
//! - Every set it pinned is checked against the runtime every [`Timing::verify_every`] (sooner when the
//!   runtime says an image changed): a lost image or pin makes the set `restoring` at once, naming each
//!   image with what was found, and it is rolled out again ([`super::losses`] backs off a loss that
//!   recurs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::losses::Losses;
use super::tally::SetTally;
use crate::model::agent_events::Note;
use crate::model::holders::ReleaseScope;
use crate::model::node_report::{self, lost, lost_evidence, lost_images, restoring};
use crate::model::pinboard_api::{
    CheckAnswer, DEGRADED, NodeReport, NodeSetPhase, PinSet, SetFanOut, SetReport,
};
use crate::model::readiness::ObservedNode;
use crate::model::reference::{count_images, some_of};
use crate::model::rollout::{Event, FetchedSource, NodeRollout, Rollout};
use crate::model::units::{clock, human};

/// How often the agent acts on time alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Every set it pinned is checked against the runtime this often.
    pub verify_every: Duration,
    /// The node's facts are read again this often when nothing happens (images come and go on their own).
    pub facts_every: Duration,
    /// A failed set is tried again after this long (or as soon as it changes); so is a release that failed,
    /// and a gate that did not lift.
    pub retry_after: Duration,
    /// The node gate (`--gate`): off, or on and lifted after this long at the latest (None: never).
    pub gate: Option<Option<Duration>>,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            verify_every: Duration::from_secs(30),
            facts_every: Duration::from_secs(300),
            retry_after: Duration::from_secs(60),
            gate: None,
        }
    }
}

/// A change the runtime announced is checked this soon, so that a burst of them is one check.
const VERIFY_SOON: Duration = Duration::from_secs(1);
/// A change the runtime announced is read this soon, for the plans (a pod's pull, an image removed), and
/// reads for changes are this far apart at least: a burst of pulls costs a write or two, not one each.
const FACTS_SOON: Duration = Duration::from_secs(2);
const FACTS_GAP: Duration = Duration::from_secs(10);
/// A rollout the runtime did not confirm at its end is rolled out again (nothing present is pulled again)
/// after this long, doubling, this many times; then the set fails with the runtime's silence as the reason.
const CONFIRM_AFTER: Duration = Duration::from_secs(2);
const CONFIRM_TRIES: u32 = 3;
/// The taint a new node registers with when it is gated (`NoSchedule`): its agent removes it once the
/// sets that select the node are pinned there.
pub const GATE_TAINT: &str = "pinboard.dev/preloading";

/// What the agent takes in.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The sets' watch listed or changed: every set.
    Sets(Vec<PinSet>),
    /// Its Node's labels, and whether it carries the gate's taint ([`GATE_TAINT`]), as the Node's watch
    /// has them.
    Node {
        labels: BTreeMap<String, String>,
        gated: bool,
    },
    /// Its Node object was read (its uid owns the report).
    NodeKnown,
    /// What an administrator asked of lazy pulling (its report's `spec.lazyPulling`).
    LazyWish(Option<bool>),
    /// The node's facts, read again.
    Facts(Box<NodeReport>),
    /// A second went by.
    Tick,
    /// The set [`Action::RollOut`] named started, pulling as `fan_out` says for a fan-out set.
    Started { fan_out: Option<SetFanOut> },
    /// It could not start, and why (its pull credentials, a registry client).
    NotStarted(String),
    /// A fan-out set waits for the in-cluster cache to serve its generation, since then.
    WaitingForCache(Instant),
    /// The rollout's own plan of the node: what it will fetch, and whether it fits.
    Planned { bytes: u64, no_space: bool },
    /// An event of the running rollout, and how its fan-out set pulls now.
    Rollout(Event, Option<SetFanOut>),
    /// The running rollout ended, with why it stopped early, and then the runtime asked about the set's
    /// images (None when it could not be); `relayed`: what the node's relay passed on to the runtime
    /// meanwhile, when every pull went through it.
    Ended {
        failure: Option<String>,
        observed: Option<ObservedNode>,
        fan_out: Option<SetFanOut>,
        relayed: Option<u64>,
    },
    /// What [`Action::Verify`] found.
    Verified(ObservedNode),
    /// The runtime announced that an image changed (containerd's image events).
    RuntimeChanged,
    /// The runtime announces no image changes (CRI-O has no events service): the node is read as often
    /// as it is checked, so that what it holds is published within a check's period.
    RuntimeSilent,
}

/// What the shell does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Roll set `set` out at `generation` (answered by [`Input::Started`], [`Input::NotStarted`] or
    /// [`Input::WaitingForCache`]).
    RollOut(Start),
    /// Cancel the running rollout: its set changed or no longer selects the node.
    Cancel,
    /// Release `scope` on the node (for `set`), then read the node again.
    Release { scope: ReleaseScope, set: String },
    /// Read the node's facts again (and carry out the lazy-pull wish): answered by [`Input::Facts`].
    ReadFacts,
    /// Tell an administrator, as a Kubernetes Event about the node's PinboardNode.
    Record(Note),
    /// Remove the gate's taint from the node: every set selecting it is pinned, or the deadline passed.
    LiftGate,
    /// Ask the runtime about these images: answered by [`Input::Verified`].
    Verify(Vec<String>),
}

/// A rollout to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub set: String,
    pub generation: i64,
    pub images: Vec<String>,
    /// Through the in-cluster cache (`spec.fanOut`), waiting for it since then when it waited already.
    pub fan_out: bool,
    pub waiting_since: Option<Instant>,
    /// It puts back what was lost of a pinned set.
    pub restore: bool,
}

/// The rollout under way.
#[derive(Clone, Debug)]
pub struct Running {
    pub set: String,
    pub generation: i64,
    pub images: Vec<String>,
    /// The set's images before this content, which lose its hold once the new content is pinned.
    dropped: Vec<String>,
    rollout: Rollout,
    restore: bool,
    fan_out: Option<SetFanOut>,
    planned: u64,
    /// Its plan says the node has no room.
    no_space: bool,
    /// Started for real (not waiting for the cache, not refused).
    started: bool,
    cancelling: bool,
}

impl Running {
    /// The set's report as the rollout has it on `progress`, with its fan-out and its plan's bytes.
    fn report(&self, progress: &NodeRollout, fan_out: Option<SetFanOut>) -> SetReport {
        let mut report = node_report::rolling(&self.set, self.generation, progress);
        report.fan_out = fan_out;
        if let Some(outcome) = &mut report.outcome {
            outcome.planned_bytes = self.planned;
        }
        report
    }
}

/// Everything the agent knows.
#[derive(Clone, Debug)]
pub struct AgentState {
    node: String,
    timing: Timing,
    node_known: bool,
    labels: Option<BTreeMap<String, String>>,
    /// None until the sets' watch has listed.
    sets: Option<BTreeMap<String, PinSet>>,
    lazy_wish: Option<bool>,
    facts: NodeReport,
    facts_read: Option<Instant>,
    /// A runtime change to read the node for, when; and when the last such read was.
    facts_soon: Option<Instant>,
    read_for_change: Option<Instant>,
    /// Per set that selects the node.
    reports: BTreeMap<String, SetReport>,
    running: Option<Running>,
    /// Sets that failed, at which generation and when.
    failed: BTreeMap<String, (i64, Instant)>,
    /// Sets whose rollout the runtime did not confirm at its end: at which generation, how many times,
    /// and when to roll them out again.
    unconfirmed: BTreeMap<String, (i64, u32, Instant)>,
    /// Releases tried, by set, and when: one that did not take is tried again after a while, not every
    /// second.
    releasing: BTreeMap<String, Instant>,
    /// A fan-out set waiting for the cache to serve its generation, since when.
    waiting_for_cache: Option<(String, i64, Instant)>,
    losses: BTreeMap<String, Losses>,
    /// Per set that selects the node: what its metrics count.
    tallies: BTreeMap<String, SetTally>,
    /// Checks commands asked of the sets ([`PinSet::check_request`]) not answered yet, and the last
    /// answered, by set.
    checks_asked: BTreeMap<String, String>,
    answers: BTreeMap<String, CheckAnswer>,
    next_verify: Option<Instant>,
    /// The node carries the gate's taint: since when the agent knows, and when it last asked to lift it.
    gated: Option<(Instant, Option<Instant>)>,
}

impl AgentState {
    pub fn new(node: &str, timing: Timing) -> AgentState {
        AgentState {
            node: node.to_string(),
            timing,
            node_known: false,
            labels: None,
            sets: None,
            lazy_wish: None,
            facts: NodeReport::default(),
            facts_read: None,
            facts_soon: None,
            read_for_change: None,
            reports: BTreeMap::new(),
            running: None,
            failed: BTreeMap::new(),
            unconfirmed: BTreeMap::new(),
            releasing: BTreeMap::new(),
            waiting_for_cache: None,
            losses: BTreeMap::new(),
            tallies: BTreeMap::new(),
            checks_asked: BTreeMap::new(),
            answers: BTreeMap::new(),
            next_verify: None,
            gated: None,
        }
    }

    /// Takes `input` in at `now` and says what to do.
    pub fn update(&mut self, input: Input, now: Instant) -> Vec<Action> {
        match input {
            Input::Sets(sets) => {
                self.sets = Some(sets.into_iter().map(|s| (s.name().to_owned(), s)).collect());
                self.note_checks_asked(now);
            }
            Input::Node { labels, gated } => {
                self.labels = Some(labels);
                self.note_checks_asked(now);
                self.gated = match (gated, self.gated) {
                    (false, _) => None,
                    (true, None) => Some((now, None)),
                    (true, known) => known,
                };
            }
            Input::NodeKnown => self.node_known = true,
            Input::LazyWish(wish) => {
                let changed = std::mem::replace(&mut self.lazy_wish, wish) != wish;
                // Carried out now, not at the next read.
                if changed && self.node_known {
                    return vec![Action::ReadFacts];
                }
                return Vec::new();
            }
            Input::Facts(facts) => {
                self.facts = *facts;
                self.facts_read = Some(now);
                self.facts_soon = None;
            }
            Input::Tick => {
                let mut actions = self.timed(now);
                actions.extend(self.reconcile(now));
                actions.extend(self.gate(now));
                return actions;
            }
            Input::Started { fan_out } => self.started(fan_out),
            Input::NotStarted(why) => {
                if let Some(running) = self.running.take() {
                    let note = Note::warning(
                        "PullFailed",
                        "RollOut",
                        format!("set {} could not start: {why}", running.set),
                    );
                    self.fail(&running.set, running.generation, &running.images, why, now);
                    let mut actions = vec![Action::Record(note.of_set(&running.set))];
                    actions.extend(self.reconcile(now));
                    return actions;
                }
            }
            Input::WaitingForCache(since) => {
                if let Some(running) = self.running.take() {
                    self.waiting_for_cache = Some((running.set, running.generation, since));
                }
                return Vec::new();
            }
            Input::Planned { bytes, no_space } => {
                if let Some(running) = &mut self.running {
                    running.planned = bytes;
                    running.no_space = no_space;
                }
                return Vec::new();
            }
            Input::Rollout(event, fan_out) => {
                self.fold(event, fan_out, now);
                return Vec::new();
            }
            Input::Ended {
                failure,
                observed,
                fan_out,
                relayed,
            } => return self.ended(failure, observed, (fan_out, relayed), now),
            Input::Verified(observed) => {
                let mut actions = self.verified(&observed, now);
                // A runtime that did not answer answers no check: it is asked again at the next one.
                if observed.unreachable.is_none() && observed.error.is_none() {
                    self.answer_checks();
                }
                actions.extend(self.reconcile(now));
                return actions;
            }
            Input::RuntimeChanged => {
                let soon = now + VERIFY_SOON;
                self.next_verify = Some(self.next_verify.map_or(soon, |at| at.min(soon)));
                // A rollout's own pulls change the runtime; its end reads the node.
                if self.running.is_none() {
                    let gap = self.read_for_change.map_or(now, |at| at + FACTS_GAP);
                    self.facts_soon.get_or_insert((now + FACTS_SOON).max(gap));
                }
                return Vec::new();
            }
            Input::RuntimeSilent => {
                self.timing.facts_every = self.timing.facts_every.min(self.timing.verify_every);
                return Vec::new();
            }
        }
        self.reconcile(now)
    }

    /// Every set, as the sets' watch has them (none before it listed).
    pub fn sets(&self) -> &BTreeMap<String, PinSet> {
        static NONE: BTreeMap<String, PinSet> = BTreeMap::new();
        self.sets.as_ref().unwrap_or(&NONE)
    }

    /// Whether the sets' watch has listed: before, the agent knows of no set, not of none.
    pub fn sets_listed(&self) -> bool {
        self.sets.is_some()
    }

    /// The node's facts as last read.
    pub fn facts(&self) -> &NodeReport {
        &self.facts
    }

    /// What the agent says of each set that selects the node.
    pub fn reports(&self) -> impl Iterator<Item = &SetReport> {
        self.reports.values()
    }

    /// What the agent says of each set, with its answer to the last check asked of it.
    pub fn answered_reports(&self) -> Vec<SetReport> {
        self.reports
            .values()
            .map(|report| SetReport {
                checked: self.answers.get(&report.name).cloned(),
                ..report.clone()
            })
            .collect()
    }

    /// Each set's phase at its generation, and the check it answered: a report whose phases or answers
    /// changed is news, written at once.
    pub fn phases(&self) -> Vec<(String, i64, NodeSetPhase, Option<String>)> {
        self.reports
            .values()
            .map(|r| {
                let answered = self.answers.get(&r.name).map(|a| a.request.clone());
                (r.name.clone(), r.observed_generation, r.state, answered)
            })
            .collect()
    }

    /// Notes the checks newly asked of the sets that select the node: the runtime is asked at once.
    fn note_checks_asked(&mut self, now: Instant) {
        let asked: Vec<(String, String)> = self
            .desired()
            .into_keys()
            .filter_map(|name| {
                let request = self.sets.as_ref()?.get(&name)?.check_request()?.to_owned();
                let answered = self
                    .answers
                    .get(&name)
                    .is_some_and(|a| a.request == request);
                (!answered).then_some((name, request))
            })
            .collect();
        if !asked.is_empty() {
            self.checks_asked.extend(asked);
            self.next_verify = Some(now);
        }
    }

    /// The runtime was asked after the pending checks were seen: they are answered as of now.
    fn answer_checks(&mut self) {
        let at = Time(k8s_openapi::jiff::Timestamp::now());
        for (set, request) in std::mem::take(&mut self.checks_asked) {
            let at = at.clone();
            self.answers.insert(set, CheckAnswer { request, at });
        }
    }

    /// What each set's metrics count, by set.
    pub fn tallies(&self) -> &BTreeMap<String, SetTally> {
        &self.tallies
    }

    /// The rollout under way, if one is.
    pub fn running(&self) -> Option<&Running> {
        self.running.as_ref().filter(|r| r.started)
    }

    /// What an administrator asked of lazy pulling.
    pub fn lazy_wish(&self) -> Option<bool> {
        self.lazy_wish
    }

    /// The most nodes any set lands on, as the sets' statuses say: how often a report may be written.
    pub fn widest_set(&self) -> i64 {
        self.sets
            .iter()
            .flat_map(BTreeMap::values)
            .filter_map(|s| s.status.as_ref().map(|st| st.nodes))
            .max()
            .unwrap_or(0)
    }

    /// What falls due with time: reading the node, checking the pinned sets against the runtime.
    fn timed(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.node_known {
            return actions;
        }
        let periodic = self
            .facts_read
            .is_none_or(|at| now.duration_since(at) >= self.timing.facts_every);
        let changed = self.running.is_none() && self.facts_soon.is_some_and(|at| now >= at);
        if changed {
            self.read_for_change = Some(now);
        }
        if periodic || changed {
            actions.push(Action::ReadFacts);
        }
        if self.next_verify.is_none_or(|at| now >= at) {
            self.next_verify = Some(now + self.timing.verify_every);
            let images = self.pinned_images();
            if images.is_empty() {
                // Nothing pinned to ask the runtime of: the reports' phases are the answer.
                self.answer_checks();
            } else {
                actions.push(Action::Verify(images));
            }
        }
        actions
    }

    /// Every image of the sets pinned on the node, but the running rollout's set (its end checks it).
    fn pinned_images(&self) -> Vec<String> {
        let running = self.running.as_ref().map(|r| r.set.as_str());
        let mut images: Vec<String> = self
            .reports
            .values()
            .filter(|r| r.state == NodeSetPhase::Pinned && Some(r.name.as_str()) != running)
            .flat_map(|r| r.images.iter().map(|i| i.name.clone()))
            .collect();
        images.sort();
        images.dedup();
        images
    }

    /// The sets that select this node: by name, their generation and images.
    fn desired(&self) -> BTreeMap<String, (i64, Vec<String>)> {
        let (Some(sets), Some(labels)) = (&self.sets, &self.labels) else {
            return BTreeMap::new();
        };
        sets.values()
            .filter(|s| s.selects(labels))
            .map(|s| {
                let images = s.images().map(str::to_string).collect();
                (s.name().to_string(), (s.generation(), images))
            })
            .collect()
    }

    /// What is to be done next: a running rollout whose set changed or left is cancelled; a set no longer
    /// selecting the node is released; the next set not pinned at its generation is rolled out (a lost one
    /// once its losses allow).
    fn reconcile(&mut self, now: Instant) -> Vec<Action> {
        if !self.node_known || self.sets.is_none() || self.labels.is_none() {
            return Vec::new();
        }
        let desired = self.desired();
        if let Some(running) = &mut self.running {
            let current = desired.get(&running.set).map(|(g, _)| *g);
            if current != Some(running.generation) && running.started && !running.cancelling {
                running.cancelling = true;
                return vec![Action::Cancel];
            }
            return Vec::new();
        }
        self.reports.retain(|name, _| desired.contains_key(name));
        self.losses.retain(|name, _| desired.contains_key(name));
        self.unconfirmed
            .retain(|name, _| desired.contains_key(name));
        self.tallies.retain(|name, _| desired.contains_key(name));
        self.answers.retain(|name, _| desired.contains_key(name));
        self.checks_asked
            .retain(|name, _| desired.contains_key(name));
        // Every set's counters exist from 0 before its first byte, so `increase` sees all of them.
        for name in desired.keys() {
            self.tallies.entry(name.clone()).or_default();
        }
        let retry_after = self.timing.retry_after;
        let gone = self
            .facts
            .holding_sets()
            .into_iter()
            .filter(|set| !desired.contains_key(set))
            .find(|set| {
                self.releasing
                    .get(set)
                    .is_none_or(|at| now.duration_since(*at) >= retry_after)
            });
        if let Some(gone) = gone {
            self.releasing.insert(gone.clone(), now);
            return vec![Action::Release {
                scope: ReleaseScope::of_sets(&[gone.as_str()], &[], false),
                set: gone,
            }];
        }
        let next = desired.iter().find(|(name, (generation, _))| {
            let report = self.reports.get(*name);
            let done = report.is_some_and(|r| {
                r.observed_generation == *generation && r.state == NodeSetPhase::Pinned
            });
            let failed = self
                .failed
                .get(*name)
                .is_some_and(|(g, at)| g == generation && now.duration_since(*at) < retry_after);
            let waiting = self
                .losses
                .get(*name)
                .is_some_and(|losses| !losses.may_restore(now));
            let confirming = self
                .unconfirmed
                .get(*name)
                .is_some_and(|(g, _, at)| g == generation && now < *at);
            !done && !failed && !waiting && !confirming
        });
        let Some((name, (generation, images))) = next else {
            return Vec::new();
        };
        // A restore that failed (the registry away) and is tried again is still one: its loss is counted
        // once it is put back.
        let restore = self.reports.get(name).is_some_and(|r| {
            r.observed_generation == *generation
                && (r.state == NodeSetPhase::Restoring
                    || self.losses.get(name).is_some_and(Losses::pending))
        });
        let fan_out = self
            .sets
            .as_ref()
            .and_then(|s| s.get(name))
            .is_some_and(|s| s.spec.fan_out);
        let waiting_since = match &self.waiting_for_cache {
            Some((set, g, since)) if set == name && g == generation => Some(*since),
            _ => None,
        };
        let dropped = self
            .facts
            .images
            .iter()
            .filter(|i| i.held_by.iter().any(|h| h == name))
            .flat_map(|i| i.names.first().cloned())
            .filter(|image| !images.contains(image))
            .collect();
        self.running = Some(Running {
            set: name.clone(),
            generation: *generation,
            images: images.clone(),
            dropped,
            rollout: Rollout::expecting(std::slice::from_ref(&self.node)),
            restore,
            fan_out: None,
            planned: 0,
            no_space: false,
            started: false,
            cancelling: false,
        });
        vec![Action::RollOut(Start {
            set: name.clone(),
            generation: *generation,
            images: images.clone(),
            fan_out,
            waiting_since,
            restore,
        })]
    }

    /// Lifts the node's gate once every set selecting it is pinned at its generation, or the gate's
    /// deadline passed; asks again after a while when the taint stays (a write that failed). Never before
    /// the sets are listed: no set yet is not "no set selects the node".
    fn gate(&mut self, now: Instant) -> Vec<Action> {
        let (Some(deadline), Some((since, asked))) = (self.timing.gate, self.gated) else {
            return Vec::new();
        };
        if !self.node_known || self.sets.is_none() || self.labels.is_none() {
            return Vec::new();
        }
        let desired = &self.desired();
        if asked.is_some_and(|at| now.duration_since(at) < self.timing.retry_after) {
            return Vec::new();
        }
        let waiting: Vec<&str> = desired
            .iter()
            .filter(|(name, (generation, _))| {
                !self.reports.get(*name).is_some_and(|r| {
                    r.observed_generation == *generation && r.state == NodeSetPhase::Pinned
                })
            })
            .map(|(name, _)| name.as_str())
            .collect();
        let overdue = deadline.filter(|d| now.duration_since(since) >= *d);
        let note = match (waiting.is_empty(), overdue) {
            (true, _) => Note::normal(
                "GateLifted",
                "LiftGate",
                match desired.len() {
                    0 => format!("no set selects the node: {GATE_TAINT} removed"),
                    n => format!(
                        "{} pinned here: {GATE_TAINT} removed, the node takes pods",
                        match n {
                            1 => "the set that selects the node is".to_string(),
                            n => format!("all {n} sets that select the node are"),
                        }
                    ),
                },
            ),
            (false, Some(deadline)) => Note::warning(
                "GateDeadline",
                "LiftGate",
                format!(
                    "{GATE_TAINT} removed after {} (--gate-deadline) though not every set is pinned \
                     here: {}; their pods may pull over the registry link",
                    clock(deadline),
                    some_of(&waiting)
                ),
            ),
            (false, None) => return Vec::new(),
        };
        self.gated = Some((since, Some(now)));
        vec![Action::Record(note), Action::LiftGate]
    }

    /// The rollout [`Action::RollOut`] asked for started: every image queued, the set's losses kept.
    fn started(&mut self, fan_out: Option<SetFanOut>) {
        self.waiting_for_cache = None;
        let Some(running) = &mut self.running else {
            return;
        };
        running.started = true;
        running.fan_out = fan_out.clone();
        self.tallies
            .entry(running.set.clone())
            .or_default()
            .rollout_started();
        let before = self.reports.get(&running.set);
        // A failed set tried again stays failed, its reason in view, until the new attempt says more.
        if before.is_some_and(|r| {
            r.state == NodeSetPhase::Failed && r.observed_generation == running.generation
        }) {
            return;
        }
        let mut queued = node_report::queued(&running.set, running.generation, &running.images);
        queued.fan_out = fan_out;
        if running.restore {
            // Still restoring, naming what was lost, until the images are back.
            queued.state = NodeSetPhase::Restoring;
            queued.conditions = before.map(|r| r.conditions.clone()).unwrap_or_default();
        }
        queued.restores = before.and_then(|r| r.restores.clone());
        self.reports.insert(running.set.clone(), queued);
    }

    /// Marks a set failed at `generation`, saying why.
    fn fail(&mut self, name: &str, generation: i64, images: &[String], why: String, now: Instant) {
        let mut report = node_report::queued(name, generation, images);
        report.state = NodeSetPhase::Failed;
        report.conditions = node_report::failed_conditions(&why);
        report.restores = self.reports.get(name).and_then(|r| r.restores.clone());
        self.reports.insert(name.to_string(), report);
        self.failed.insert(name.to_string(), (generation, now));
    }

    /// Folds in an event of the running rollout.
    fn fold(&mut self, event: Event, fan_out: Option<SetFanOut>, now: Instant) {
        let Some(running) = &mut self.running else {
            return;
        };
        self.tallies
            .entry(running.set.clone())
            .or_default()
            .fold(&event);
        running.rollout.apply(event);
        let Some(progress) = running.rollout.nodes().get(&self.node) else {
            return;
        };
        let mut report = running.report(progress, fan_out);
        let before = self.reports.get(&running.set);
        if running.restore && report.state == NodeSetPhase::Pulling {
            report.state = NodeSetPhase::Restoring;
            report.conditions = before.map(|r| r.conditions.clone()).unwrap_or_default();
        }
        report.restores = self
            .losses
            .get(&running.set)
            .and_then(|l| l.report(now))
            .or_else(|| before.and_then(|r| r.restores.clone()));
        self.reports.insert(running.set.clone(), report);
    }

    /// The running rollout ended: the set is pinned only where the runtime says so; what the set no
    /// longer lists is released once the new content is pinned; a restore is counted.
    fn ended(
        &mut self,
        failure: Option<String>,
        observed: Option<ObservedNode>,
        (fan_out, relayed): (Option<SetFanOut>, Option<u64>),
        now: Instant,
    ) -> Vec<Action> {
        let Some(running) = self.running.take() else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        let progress = running.rollout.nodes().get(&self.node);
        let unanswered = match (&failure, &observed) {
            (None, Some(observed)) => node_report::unanswered(observed),
            _ => None,
        };
        let tries = self
            .unconfirmed
            .remove(&running.set)
            .filter(|(g, ..)| *g == running.generation)
            .map_or(0, |(_, tries, _)| tries);
        if let (Some(why), Some(progress)) = (&unanswered, progress)
            && tries < CONFIRM_TRIES
        {
            self.unconfirmed_end(&running, progress, why, fan_out, tries, now);
            actions.push(Action::ReadFacts);
            actions.extend(self.reconcile(now));
            return actions;
        }
        match (failure, progress, observed) {
            (Some(why), progress, _) => {
                let why = progress.map_or_else(
                    || why.clone(),
                    |node| node_report::with_failed_image(&why, node),
                );
                if !running.cancelling {
                    let note = Note::warning(
                        "PullFailed",
                        "RollOut",
                        format!("set {} failed: {why}", running.set),
                    );
                    actions.push(Action::Record(note.of_set(&running.set)));
                }
                self.fail(&running.set, running.generation, &running.images, why, now);
            }
            (None, Some(progress), Some(observed)) => {
                let mut report =
                    node_report::verified(running.report(progress, fan_out), &observed);
                if let Some(outcome) = &mut report.outcome {
                    // A runtime that reports no bytes (CRI-O) fetched what its relay passed on.
                    if let (Some(FetchedSource::Plan), Some(bytes)) =
                        (outcome.fetched_source, relayed)
                    {
                        outcome.fetched_bytes = bytes;
                        outcome.fetched_source = Some(FetchedSource::Relay);
                    }
                }
                let losses = self.losses.entry(running.set.clone()).or_default();
                let tally = self.tallies.entry(running.set.clone()).or_default();
                tally.rollout_ended(report.outcome.as_ref().map_or(0, |o| o.fetched_bytes));
                report.restores = match (report.state, running.restore) {
                    (NodeSetPhase::Pinned, true) => {
                        tally.restored();
                        losses.restored(now)
                    }
                    _ => losses.report(now),
                };
                actions.push(Action::Record(ended_note(&running, &report)));
                if report.state == NodeSetPhase::Pinned {
                    tally.verified = Some(now);
                    self.failed.remove(&running.set);
                    let recent = report.restores.as_ref().map_or(0, |r| r.recent);
                    if recent > 1 {
                        mark_fought(&mut report, recent);
                    }
                    if !running.dropped.is_empty() {
                        actions.push(Action::Release {
                            scope: ReleaseScope::of_images(&running.set, &running.dropped),
                            set: running.set.clone(),
                        });
                    }
                } else if report.state == NodeSetPhase::Failed {
                    self.failed
                        .insert(running.set.clone(), (running.generation, now));
                }
                self.reports.insert(running.set.clone(), report);
            }
            (None, _, _) => {}
        }
        actions.push(Action::ReadFacts);
        actions.extend(self.reconcile(now));
        actions
    }

    /// The running rollout ended without the runtime's word on it (`why`), for the `tries`-th time: the set
    /// stays pulling (or restoring), not pinned on the rollout's word and not failed for a silence, and is
    /// rolled out again after a while.
    fn unconfirmed_end(
        &mut self,
        running: &Running,
        progress: &NodeRollout,
        why: &str,
        fan_out: Option<SetFanOut>,
        tries: u32,
        now: Instant,
    ) {
        let before = self.reports.get(&running.set);
        let mut report = running.report(progress, fan_out);
        report.state = if running.restore {
            NodeSetPhase::Restoring
        } else {
            NodeSetPhase::Pulling
        };
        report.conditions = node_report::confirming_conditions(why);
        report.restores = before.and_then(|r| r.restores.clone());
        self.reports.insert(running.set.clone(), report);
        let again = now + CONFIRM_AFTER * 2u32.pow(tries);
        self.unconfirmed
            .insert(running.set.clone(), (running.generation, tries + 1, again));
    }

    /// A check of the runtime: every pinned set with an image or pin lost is restoring, at once, and is
    /// put back as its losses allow.
    fn verified(&mut self, observed: &ObservedNode, now: Instant) -> Vec<Action> {
        let mut notes = Vec::new();
        let running = self.running.as_ref().map(|r| r.set.clone());
        for (name, report) in &mut self.reports {
            if report.state != NodeSetPhase::Pinned || Some(name) == running.as_ref() {
                continue;
            }
            let lost: Vec<_> = lost(report, observed)
                .into_iter()
                .map(|image| {
                    let evidence = lost_evidence(image.found, observed);
                    (image, evidence)
                })
                .collect();
            let tally = self.tallies.entry(name.clone()).or_default();
            if lost.is_empty() {
                tally.verified = Some(now);
                continue;
            }
            tally.lost(lost.iter().map(|(image, _)| image.found));
            let found_at = Time(k8s_openapi::jiff::Timestamp::now());
            let losses = self.losses.entry(name.clone()).or_default();
            let backing_off = losses.found(lost_images(&lost, found_at), now);
            let mut restored = restoring(report.clone(), &lost, backing_off.as_deref());
            restored.restores = losses.report(now).or_else(|| report.restores.clone());
            *report = restored;
            let lost: Vec<String> = lost
                .iter()
                .map(|(image, _)| format!("{} ({})", image.name, image.found.words()))
                .collect();
            let message = format!(
                "set {name}: {} lost since it was pinned: {}; {}",
                count_images(lost.len()),
                some_of(&lost),
                backing_off.as_deref().unwrap_or("the agent puts it back")
            );
            let note = Note::warning("ImageLost", "Restore", message).of_set(name);
            notes.push(Action::Record(note));
        }
        notes
    }
}

/// What an administrator hears of a rollout that ended with `report`: pinned (or put back), failed, or no
/// room.
fn ended_note(running: &Running, report: &SetReport) -> Note {
    let set = &running.set;
    let degraded = report
        .conditions
        .iter()
        .find(|c| c.type_ == DEGRADED && c.status == "True")
        .map_or("failed", |c| c.message.as_str());
    let note = match (report.state, running.restore, running.no_space) {
        (NodeSetPhase::Pinned, true, _) => Note::normal(
            "Restored",
            "Restore",
            format!("set {set}: every image lost since it was pinned is back and pinned"),
        ),
        (NodeSetPhase::Pinned, false, _) => {
            let outcome = report.outcome.clone().unwrap_or_default();
            Note::normal(
                "Pinned",
                "RollOut",
                format!(
                    "set {set} pinned: {} images, {} pulled, {} fetched",
                    outcome.images,
                    outcome.pulled,
                    human(outcome.fetched_bytes)
                ),
            )
        }
        (_, _, true) => Note::warning("NoSpace", "RollOut", format!("set {set}: {degraded}")),
        _ => Note::warning(
            "PullFailed",
            "RollOut",
            format!("set {set} failed: {degraded}"),
        ),
    };
    note.of_set(set)
}

/// A set pinned again after losses that recur: Degraded stays true, saying how often, so that an
/// administrator sees that something on the node fights the pins.
fn mark_fought(report: &mut SetReport, recent: u32) {
    let message = format!(
        "images of the set were lost {recent} times in the last hour and put back each time: something \
         on the node removes them (kubelet image GC, `crictl rmi`, disk pressure)"
    );
    if let Some(degraded) = report.conditions.iter_mut().find(|c| c.type_ == DEGRADED) {
        degraded.status = "True".into();
        degraded.reason = "LostRepeatedly".into();
        degraded.message = message;
    }
}

/// Whether a report that changed is written at `now`: at once when it is news (nothing rolls out, or a
/// set's phase changed: a loss found, a set pinned), else, while bytes move, at most every `interval`
/// since the last write.
pub fn write_due(
    news: bool,
    last_write: Option<Instant>,
    interval: Duration,
    now: Instant,
) -> bool {
    news || last_write.is_none_or(|at| now.duration_since(at) >= interval)
}

#[cfg(test)]
mod tests;

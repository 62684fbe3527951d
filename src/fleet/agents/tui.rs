//! The TUI on agents: the watchers ([`PinboardApi::watch_all`]) tell every change; the Nodes screen is the
//! agents' reports, the Config screen each node's pins and their holders, and the Rollout screen folds
//! the engine events each report's change stands for ([`events_between`]). Applying a set is a
//! server-side apply of its PinSet, unpinning deletes it, and `L` asks the node's agent.
//!
//! The Nodes screen needs only the reports, which are small; every node's images (the reports' detail,
//! most of their bytes) are watched from the first time a screen needs them: the Config screen, a rollout
//! to follow. So a cluster of thousands of nodes opens on the Nodes screen without listing them. The Plan
//! reads what the agents published of what their runtimes hold, once per plan, not the image lists.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::kube::{ConnectOptions, connect};
use crate::backend::pinboard_api::{AgentsWatch, PinboardApi};
use crate::error::Failure;
use crate::fanout::Update;
use crate::fleet::{Events, FleetEvent};
use crate::model::agents_view::{AgentsUpdate, AgentsView};
use crate::model::config_view::ConfigView;
use crate::model::diff::DiffKind;
use crate::model::labels::Selector;
use crate::model::node_summary::{NodeSummary, of_agents, pin_method_named};
use crate::model::pinboard_api::PinboardNode;
use crate::model::report_events::events_between;
use crate::model::rollout::{FanOutNodes, PinMethod};
use crate::model::set::ImageSet;

/// How often the Nodes screen is judged again when nothing changed: a heartbeat goes stale silently.
const REJUDGE_EVERY: Duration = Duration::from_secs(5);
/// How long the Plan waits for the watches' first lists.
const LISTED_WITHIN: Duration = Duration::from_secs(120);
/// How often the Plan looks whether they are in.
const LISTED_EVERY: Duration = Duration::from_millis(100);
/// The label every kubelet sets to its node's name: how a set aimed at chosen nodes selects them.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The TUI's connection to the cluster.
#[derive(Default)]
pub(super) struct Live {
    api: Mutex<Option<PinboardApi>>,
    /// The watched view, for the survey and the config views; the UI keeps its own summaries.
    view: Arc<Mutex<AgentsView>>,
    /// The sets applied in this session, whose progress the Rollout screen follows.
    followed: Arc<Mutex<BTreeSet<String>>>,
    watching: Mutex<Option<JoinHandle<()>>>,
    /// Asks the watching task to watch every node's images too.
    want_images: Mutex<Option<mpsc::UnboundedSender<()>>>,
    /// The fan-out set applied last in this session: the Rollout counts the cache's link bytes for it.
    fanned_out: Arc<Mutex<Option<FannedOut>>>,
}

/// A fan-out set's rollout, as the Rollout screen has been told it so far.
struct FannedOut {
    set: String,
    /// The cache's link bytes when the set was applied.
    baseline: u64,
    /// The nodes pulling (partly) from the source, and the link bytes, last told.
    told: (FanOutNodes, u64),
}

impl FannedOut {
    /// What the Rollout screen has not been told yet: the nodes that pull from the source (which starts
    /// the count again), then the bytes the cache took from the registries since the set was applied.
    fn news(&mut self, view: &AgentsView) -> Vec<Update> {
        let nodes = view.pulled_from_source(&self.set);
        let link = view.cache_link_bytes().saturating_sub(self.baseline);
        let mut news = Vec::new();
        if nodes != self.told.0 {
            news.push(Update::FanOut(nodes.clone()));
            news.push(Update::LinkBytes(link));
        } else if link != self.told.1 {
            news.push(Update::LinkBytes(link));
        }
        self.told = (nodes, link);
        news
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(task) = self.watching.lock().expect("watch lock").take() {
            task.abort();
        }
    }
}

impl Live {
    /// Connects and finds pinboard's API.
    pub(super) async fn connect(
        &self,
        options: &ConnectOptions,
        namespace: &str,
    ) -> Result<(), Failure> {
        let api = PinboardApi::discover(connect(options).await?, namespace).await?;
        *self.api.lock().expect("api lock") = Some(api);
        Ok(())
    }

    pub(super) fn api(&self) -> Result<PinboardApi, Failure> {
        self.api
            .lock()
            .expect("api lock")
            .clone()
            .ok_or_else(|| Failure::bad_input("not connected to the cluster"))
    }

    /// The view as watched now, once the watches' first lists are in (waited for the first time).
    pub(super) async fn listed_view(&self) -> Result<AgentsView, Failure> {
        self.api()?;
        let deadline = Instant::now() + LISTED_WITHIN;
        loop {
            {
                let view = self.view.lock().expect("view lock");
                if view.synced() {
                    return Ok(view.clone());
                }
            }
            if Instant::now() >= deadline {
                return Err(Failure::unreachable(vec![format!(
                    "the nodes' reports were not listed within {LISTED_WITHIN:?}; the API server is too \
                     slow or unreachable"
                )]));
            }
            tokio::time::sleep(LISTED_EVERY).await;
        }
    }

    /// Asks the watching task to watch every node's images (once; later asks change nothing).
    fn watch_images(&self) {
        if let Some(want) = self.want_images.lock().expect("want lock").as_ref() {
            let _ = want.send(());
        }
    }

    /// Watches the cluster: the Nodes screen when a node's summary changes, the Rollout screen when a
    /// followed set's report changes.
    pub(super) fn watch(&self, events: Events) {
        let Ok(api) = self.api() else {
            return;
        };
        let (view, followed) = (Arc::clone(&self.view), Arc::clone(&self.followed));
        let fanned_out = Arc::clone(&self.fanned_out);
        let (want_images, mut wanted_images) = mpsc::unbounded_channel();
        *self.want_images.lock().expect("want lock") = Some(want_images);
        let task = tokio::spawn(async move {
            let mut watch = api.watch_screens();
            let mut images: Option<AgentsWatch> = None;
            let mut shown: Vec<NodeSummary> = Vec::new();
            let mut tick = tokio::time::interval(REJUDGE_EVERY);
            loop {
                let update = tokio::select! {
                    update = watch.updates.recv() => match update {
                        Some(update) => Some(update),
                        None => return,
                    },
                    Some(update) = next_update(&mut images) => Some(update),
                    Some(()) = wanted_images.recv(), if images.is_none() => {
                        images = Some(api.watch_images());
                        continue;
                    }
                    _ = tick.tick() => None,
                };
                let summaries = {
                    let mut view = view.lock().expect("view lock");
                    let reports_changed = matches!(
                        update,
                        Some(AgentsUpdate::Reports(_) | AgentsUpdate::Images(_))
                    );
                    let before = reports_changed.then(|| view.reports.clone());
                    if let Some(update) = update {
                        view.apply(update);
                    }
                    if let Some(before) = before {
                        // The view keeps the reports that did not change: the same objects.
                        let changed: Vec<&PinboardNode> = view
                            .reports
                            .iter()
                            .filter(|(name, r)| {
                                before.get(*name).is_none_or(|old| !Arc::ptr_eq(old, r))
                            })
                            .map(|(_, r)| r.as_ref())
                            .collect();
                        let followed = followed.lock().expect("followed lock");
                        for event in rollout_events(&before, &changed, &followed) {
                            let _ = events.send(FleetEvent::Rollout(Update::Event(event)));
                        }
                        // The Config screen of the nodes whose report changed.
                        if !changed.is_empty() {
                            let _ = events.send(FleetEvent::ConfigViews(config_views(changed)));
                        }
                        if let Some(fanned) = fanned_out.lock().expect("fan-out lock").as_mut() {
                            for update in fanned.news(&view) {
                                let _ = events.send(FleetEvent::Rollout(update));
                            }
                        }
                    }
                    of_agents(&view, SystemTime::now())
                };
                if summaries != shown {
                    shown = summaries.clone();
                    if events.send(FleetEvent::Nodes(summaries)).is_err() {
                        return;
                    }
                }
            }
        });
        *self.watching.lock().expect("watch lock") = Some(task);
    }

    /// The Config screen: per node, each pinned image and who holds it, as its agent reports (once every
    /// node's images are watched: they come as they are listed).
    pub(super) fn refresh(&self, _sets: &[ImageSet], events: &Events) {
        self.watch_images();
        let view = self.view.lock().expect("view lock");
        let reports = view.reports.values().map(|r| r.as_ref());
        let _ = events.send(FleetEvent::ConfigViews(config_views(reports)));
    }

    /// `set` as written for the chosen `nodes`: its own selector when they are every node the Nodes screen
    /// shows that it selects (so a node that joins later gets it too), else the nodes by their hostname
    /// label.
    pub(super) fn targeting(&self, mut set: ImageSet, nodes: &[String]) -> ImageSet {
        let view = self.view.lock().expect("view lock");
        let choice = view.choose(set.node_selector.as_ref().map(|s| &s.0), SystemTime::now());
        // Shown: the nodes judged, and those left out whose agent reported once.
        let reported_once = choice
            .left_out
            .iter()
            .map(|(node, _)| *node)
            .filter(|node| view.report(node).is_some());
        let every: BTreeSet<&str> = choice
            .judged
            .iter()
            .map(|n| n.name.as_str())
            .chain(reported_once)
            .collect();
        let chosen: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
        if chosen != every {
            set.node_selector = Some(Selector(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: HOSTNAME_LABEL.into(),
                    operator: "In".into(),
                    values: Some(nodes.to_vec()),
                }]),
                match_labels: None,
            }));
        }
        set
    }

    /// Writes `set`'s PinSet; the Rollout screen then follows its nodes' reports, image by image.
    pub(super) fn apply(&self, set: ImageSet, events: Events) {
        self.watch_images();
        if set.fan_out {
            let baseline = self.view.lock().expect("view lock").cache_link_bytes();
            *self.fanned_out.lock().expect("fan-out lock") = Some(FannedOut {
                set: set.name.clone(),
                baseline,
                told: (FanOutNodes::default(), 0),
            });
            let _ = events.send(FleetEvent::Rollout(Update::FanOut(FanOutNodes::default())));
        }
        self.followed
            .lock()
            .expect("followed lock")
            .insert(set.name.clone());
        self.notify(events, move |api| async move {
            match api.apply_set(&set).await {
                Ok(stored) => format!(
                    "applied PinSet {} (generation {}): each node's agent pulls and pins it; the Rollout \
                     screen follows their reports",
                    set.name,
                    stored.generation()
                ),
                Err(e) => format!("not applied: {e}"),
            }
        });
    }

    /// Deletes `set`: each node's agent releases the pins no other set holds.
    pub(super) fn delete(&self, set: ImageSet, events: Events) {
        self.notify(events, move |api| async move {
            match api.delete_set(&set.name).await {
                Ok(()) => format!(
                    "deleted PinSet {}: each node's agent releases the pins no other set holds; the \
                     images stay",
                    set.name
                ),
                Err(e) => format!("not deleted: {e}"),
            }
        });
    }

    /// Asks `node`'s agent to turn lazy pulling on or off.
    pub(super) fn set_lazy(&self, node: String, enable: bool, events: Events) {
        self.notify(events, move |api| async move {
            match api.set_lazy(&node, enable).await {
                Ok(()) => format!(
                    "lazy pulling {} asked of {node}'s agent; its report says when it is in force",
                    if enable { "on" } else { "off" }
                ),
                Err(e) => format!("lazy pulling on {node} not changed: {e}"),
            }
        });
    }

    /// Runs `work` in a task and tells its outcome as a notice.
    fn notify<W, F>(&self, events: Events, work: W)
    where
        W: FnOnce(PinboardApi) -> F,
        F: Future<Output = String> + Send + 'static,
    {
        let said = match self.api() {
            Ok(api) => work(api),
            Err(e) => {
                let _ = events.send(FleetEvent::Notice(e.to_string()));
                return;
            }
        };
        tokio::spawn(async move {
            let _ = events.send(FleetEvent::Notice(said.await));
        });
    }
}

/// The next update of `watch`, when there is one; never, when there is none.
async fn next_update(watch: &mut Option<AgentsWatch>) -> Option<AgentsUpdate> {
    match watch {
        Some(watch) => watch.updates.recv().await,
        None => std::future::pending().await,
    }
}

/// The engine events the followed sets' reports stand for, from `before` to `after`.
fn rollout_events(
    before: &BTreeMap<String, Arc<PinboardNode>>,
    after: &[&PinboardNode],
    followed: &BTreeSet<String>,
) -> Vec<crate::model::rollout::Event> {
    let now = Instant::now();
    let mut events = Vec::new();
    for node in after {
        let name = &node.metadata.name;
        let Some(report) = &node.status else {
            continue;
        };
        let method = report
            .pin_method
            .as_deref()
            .and_then(pin_method_named)
            .unwrap_or(PinMethod::ContainerdLabel);
        let earlier = before.get(name).and_then(|n| n.status.as_ref());
        for set in report.sets.iter().filter(|s| followed.contains(&s.name)) {
            let was = earlier.and_then(|r| r.sets.iter().find(|s2| s2.name == set.name));
            if was != Some(set) {
                events.extend(events_between(name, was, set, method, now));
            }
        }
    }
    events
}

/// Per node of `reports`, its pins and their holders as its agent reports them, keyed
/// `PinboardNode/<name>`.
fn config_views<'a>(
    reports: impl IntoIterator<Item = &'a PinboardNode>,
) -> BTreeMap<String, ConfigView> {
    reports
        .into_iter()
        .filter_map(|node| Some((&node.metadata.name, node.status.as_ref()?)))
        .map(|(name, report)| {
            let mut lines: Vec<(DiffKind, String)> = report
                .images
                .iter()
                .filter(|i| i.pinned)
                .map(|i| {
                    // By digest where it has one: the name a set lists.
                    let image = i
                        .names
                        .iter()
                        .find(|n| n.contains('@'))
                        .or(i.names.first())
                        .map_or("?", String::as_str);
                    let holders = match i.held_by.is_empty() {
                        true => "unowned".to_owned(),
                        false => i.held_by.join(", "),
                    };
                    (DiffKind::Same, format!("{image}  held by {holders}"))
                })
                .collect();
            // The runtime lists its images in no stable order: the screen keeps one.
            lines.sort_by(|a, b| a.1.cmp(&b.1));
            let view = ConfigView {
                path: format!("pinboardnodes/{name}: pins and their holders"),
                notes: Vec::new(),
                lines,
            };
            (format!("PinboardNode/{name}"), view)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::agents_view::AgentsUpdate;
    use crate::model::pinboard_api::{CacheReport, NodeReport, SetFanOut, SetReport};

    /// How a node pulled set `web`.
    #[derive(Clone, Copy)]
    enum Pulled {
        ThroughCache,
        PartlyFromSource,
        FromSource,
    }

    fn report(node: &str, cache: Option<u64>, pulled: Pulled) -> Arc<PinboardNode> {
        let mut report = PinboardNode::default();
        report.metadata.name = node.into();
        let (through, reason) = match pulled {
            Pulled::ThroughCache => (true, None),
            Pulled::PartlyFromSource => {
                (true, Some("2 pulls went to the source, the cache away: …"))
            }
            Pulled::FromSource => (false, Some("no cache within 60 s")),
        };
        report.status = Some(NodeReport {
            cache: cache.map(|link_bytes| CacheReport {
                link_bytes,
                ..CacheReport::default()
            }),
            sets: vec![SetReport {
                name: "web".into(),
                fan_out: Some(SetFanOut {
                    cache: through.then(|| "http://10.77.1.2:5050".into()),
                    source_reason: reason.map(str::to_string),
                }),
                ..SetReport::default()
            }],
            ..NodeReport::default()
        });
        Arc::new(report)
    }

    #[test]
    fn the_rollout_hears_the_caches_bytes_since_the_apply_and_the_nodes_that_went_to_the_source() {
        let mut view = AgentsView::default();
        view.apply(AgentsUpdate::Reports(vec![report(
            "n1",
            Some(100),
            Pulled::ThroughCache,
        )]));
        let mut fanned = FannedOut {
            set: "web".into(),
            baseline: view.cache_link_bytes(),
            told: (FanOutNodes::default(), 0),
        };
        assert!(fanned.news(&view).is_empty(), "nothing new yet");
        view.apply(AgentsUpdate::Reports(vec![
            report("n1", Some(600), Pulled::ThroughCache),
            report("n2", None, Pulled::ThroughCache),
            report("n3", None, Pulled::ThroughCache),
        ]));
        assert_eq!(fanned.news(&view), [Update::LinkBytes(500)]);
        view.apply(AgentsUpdate::Reports(vec![
            report("n1", Some(700), Pulled::ThroughCache),
            report("n2", None, Pulled::FromSource),
            report("n3", None, Pulled::PartlyFromSource),
        ]));
        assert_eq!(
            fanned.news(&view),
            [
                Update::FanOut(FanOutNodes {
                    direct: vec!["n2".into()],
                    partly: vec!["n3".into()],
                    link_rate: None,
                }),
                Update::LinkBytes(600)
            ]
        );
    }

    #[test]
    fn the_config_screen_lists_a_nodes_pins_by_name_whatever_order_the_runtime_gave() {
        use crate::model::pinboard_api::ImageReport;
        let pinned = |names: &[&str]| ImageReport {
            names: names.iter().map(|n| n.to_string()).collect(),
            pinned: true,
            held_by: vec!["web".into()],
            ..ImageReport::default()
        };
        let node = |images: Vec<ImageReport>| PinboardNode {
            metadata: crate::model::pinboard_api::ObjectMeta {
                name: "n1".into(),
                ..Default::default()
            },
            status: Some(NodeReport {
                images,
                ..NodeReport::default()
            }),
            ..PinboardNode::default()
        };
        let b = pinned(&["r/b:1", "r/b@sha256:2"]);
        let a = pinned(&["r/a@sha256:1"]);
        let one = config_views([&node(vec![b.clone(), a.clone()])]);
        let other = config_views([&node(vec![a, b])]);
        assert_eq!(one, other);
        let lines: Vec<&str> = one["PinboardNode/n1"]
            .lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect();
        assert_eq!(
            lines,
            ["r/a@sha256:1  held by web", "r/b@sha256:2  held by web"]
        );
    }
}

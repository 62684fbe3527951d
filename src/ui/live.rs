//! The TUI's real backend: carries out [`Cmd`]s against the nodes and the registry — surveys through
//! [`crate::survey`], rollouts through [`crate::engine`], lazy-pull toggles through [`crate::backend::lazy`]
//! — and reports back with [`Msg`]s. Every figure and every write goes through the same code the headless
//! commands use.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::TuiArgs;
use super::msg::{Cmd, Msg};
use super::run::{UiBackend, execute_file_cmd, read_release};
use super::state::{SetDraft, State};
use super::theme::Theme;
use crate::backend::blobs::{BlobCache, CacheOptions};
use crate::backend::credentials::Credentials;
use crate::backend::cri::CriClient;
use crate::backend::lazy::{LazyState, read_lazy, set_lazy};
use crate::backend::node::observe;
use crate::backend::pins::{self, CONTAINERD_PIN_VALUE};
use crate::backend::pins::{PinTarget, connect_resolved};
use crate::backend::registry::Registry;
use crate::backend::target::NodeTarget;
use crate::engine::{self, Control, EngineConfig};
use crate::error::Failure;
use crate::fanout::{FanOutSetup, LOOPBACK, Run, Update};
use crate::model::config_view::{ConfigNote, ConfigView};
use crate::model::diff::DiffKind;
use crate::model::holders::{HeldBy, Holder, Release, UnpinReport, holders_of};
use crate::model::image::Platform;
use crate::model::node_info::NodeInfo;
use crate::model::plan::Limits;
use crate::model::reference::short_reference;
use crate::model::release::SetOptions;
use crate::model::rollout::PinMethod;
use crate::model::runtime::Runtime;
use crate::model::set::ImageSet;
use crate::options::{registry_client, resolve_sets};
use crate::survey::{Survey, survey};

/// Opens the TUI on the nodes and sets of `args`; returns when the operator quits.
pub async fn run(args: TuiArgs) -> Result<(), Failure> {
    let common = &args.common;
    if let Some(options) = common.targets.cluster_mode() {
        return super::live_cluster::run(args, options).await;
    }
    let targets = common.targets.resolve()?;
    let platform = common.targets.platform()?;
    let registry = registry_client(&common.registry)?;
    let (sets, notes) = resolve_sets(&common.input, false, &registry, &platform).await?;
    let theme = theme_of(&args)?;
    let label = format!(
        "direct: {} node{}",
        targets.len(),
        if targets.len() == 1 { "" } else { "s" }
    );
    let mut state = State::new(label, theme, args.readonly, Instant::now());
    state.stall_after = Duration::from_secs(args.stall_after.max(1));
    if !notes.is_empty() {
        state.say(notes.join("; "));
    }
    state.fan_out = common.rollout.fan_out;
    let every_node: BTreeSet<String> = targets.iter().map(|t| t.node.name.clone()).collect();
    state.sets = sets
        .into_iter()
        .map(|set| SetDraft::new(set, every_node.clone()))
        .collect();
    let rollouts = Arc::default();
    let backend = Live {
        targets: Arc::new(targets),
        credentials: registry.credentials(),
        registry: Arc::new(registry),
        platform,
        limits: common.limits.limits(),
        timeout: common.targets.timeout(),
        engine: EngineConfig {
            readonly: args.readonly,
            ..common.rollout.engine_config()
        },
        control: None,
        initial_sets: state.sets.iter().map(|d| d.set.clone()).collect(),
        release_options: common.input.release.set_options(),
        release_unowned: common.unpin.release_unowned,
        cache_dir: common.cache.dir().ok(),
        cache_options: common.cache.options(),
        cache: None,
        fan_out_listen: common.rollout.fan_out_listen.unwrap_or(LOOPBACK),
        rollouts: Arc::clone(&rollouts),
    };
    let ran = super::run::run(state, backend).await;
    // A rollout still under way was cancelled when the UI went: wait for it to put fan-out's files back.
    let running = std::mem::take(&mut *rollouts.lock().expect("rollouts lock"));
    for rollout in running {
        if !rollout.is_finished() {
            eprintln!("pinboard: cancelling the rollout and putting fan-out's files back…");
        }
        let _ = tokio::time::timeout(QUIT_GRACE, rollout).await;
    }
    ran.map_err(|e| Failure::bad_input(format!("terminal UI failed: {e:#}")))
}

/// The theme `--theme` names; monochrome whenever NO_COLOR is set.
pub(super) fn theme_of(args: &TuiArgs) -> Result<Theme, Failure> {
    match &args.theme {
        Some(name) if std::env::var_os("NO_COLOR").is_none() => {
            Theme::named(name).map_err(Failure::bad_input)
        }
        _ => Ok(Theme::from_env()),
    }
}

/// How long quitting waits for a cancelled rollout to put fan-out's files back.
const QUIT_GRACE: Duration = Duration::from_secs(30);

struct Live {
    targets: Arc<Vec<NodeTarget>>,
    registry: Arc<Registry>,
    credentials: Arc<Credentials>,
    platform: Platform,
    limits: Limits,
    timeout: Duration,
    engine: EngineConfig,
    /// The running rollout's controls; None when no rollout runs.
    control: Option<UnboundedSender<Control>>,
    initial_sets: Vec<ImageSet>,
    /// How a release typed at the import prompt becomes sets (`--pool`, `--exclude`, `--release-name`).
    release_options: SetOptions,
    /// `--release-unowned`: unpinning a set also releases its images' unowned pins.
    release_unowned: bool,
    /// The blob cache (`--cache-dir`): what plans count as cached, and fan-out's store.
    cache_dir: Option<PathBuf>,
    cache_options: CacheOptions,
    /// Opened at the first fan-out and kept (it holds the directory's lock).
    cache: Option<Arc<BlobCache>>,
    fan_out_listen: SocketAddr,
    /// Rollout tasks, for the UI to wait on when it quits.
    rollouts: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl UiBackend for Live {
    fn start(&mut self, tx: &UnboundedSender<Msg>) {
        if !self.engine.readonly {
            let (targets, timeout, tx) = (self.targets.clone(), self.timeout, tx.clone());
            tokio::spawn(async move {
                for line in crate::fanout::clean_stale(&targets, timeout).await {
                    let _ = tx.send(Msg::Notice(line));
                }
            });
        }
        self.refresh(tx, self.initial_sets.clone());
    }

    fn execute(&mut self, cmd: Cmd, tx: &UnboundedSender<Msg>) {
        let Some(cmd) = execute_file_cmd(cmd, tx) else {
            return;
        };
        match cmd {
            Cmd::Quit | Cmd::ReadFile(..) | Cmd::WriteFile(..) => {}
            Cmd::ImportRelease(pullspec) => read_release(
                self.registry.clone(),
                self.platform.clone(),
                self.release_options.clone(),
                pullspec,
                tx,
            ),
            Cmd::Survey { sets, nodes } => {
                let (targets, registry, tx) =
                    (self.chosen(&nodes), self.registry.clone(), tx.clone());
                let (platform, limits, timeout) =
                    (self.platform.clone(), self.limits, self.timeout);
                let cache = self.cache_dir.clone();
                self.refresh(&tx, sets.clone());
                tokio::spawn(async move {
                    let nodes: Vec<_> = targets.iter().map(|t| t.node.clone()).collect();
                    let cache = cache.as_deref();
                    let result =
                        survey(&nodes, &sets, &registry, &platform, limits, timeout, cache).await;
                    let _ = tx.send(Msg::SurveyDone(
                        result.map_err(|e| Failure::from(e).to_string()),
                    ));
                });
            }
            Cmd::Apply {
                set,
                nodes,
                force,
                fan_out,
            } => self.apply(set, &nodes, force, fan_out, tx),
            Cmd::Unpin { set, nodes } => {
                let (targets, tx, observer) = (self.chosen(&nodes), tx.clone(), self.snapshot());
                let images: Vec<&str> = set.references().collect();
                let release = Release::of_sets(&[set.name.as_str()], &images, self.release_unowned);
                tokio::spawn(async move {
                    let outcomes = targets.iter().map(|t| async {
                        let said = match engine::unpin(&t.node, t.pin.clone(), &release).await {
                            Ok(done) => {
                                // Without the registry: the notice is one line.
                                let short = |r: &str| {
                                    short_reference(r.split_once('/').map_or(r, |(_, rest)| rest))
                                };
                                let report = UnpinReport::of(&done.changes);
                                let said = report.sentence(short);
                                match done.note {
                                    Some(note) => Some(format!("{said} ({note})")),
                                    None if report == UnpinReport::default() => None,
                                    None => Some(said),
                                }
                            }
                            Err(e) => Some(format!("failed: {e}")),
                        };
                        (t.node.name.clone(), said)
                    });
                    let outcomes = futures::future::join_all(outcomes).await;
                    let _ = tx.send(Msg::Notice(by_outcome(outcomes)));
                    observer.send_nodes(&tx).await;
                    let _ = tx.send(Msg::ConfigViews(observer.config_views(&[set]).await));
                });
            }
            Cmd::Retry { node, image } => self.control(Control::Retry { node, image }, tx),
            Cmd::Cancel { node, image } => self.control(Control::Cancel { node, image }, tx),
            Cmd::ToggleLazy { node, enable } => {
                let Some(target) = self.targets.iter().find(|t| t.node.name == node).cloned()
                else {
                    return;
                };
                let (this, tx) = (self.snapshot(), tx.clone());
                tokio::spawn(async move {
                    let message =
                        match tokio::task::spawn_blocking(move || set_lazy(&target.lazy, enable))
                            .await
                        {
                            Ok(Ok(outcome)) => outcome.warning,
                            Ok(Err(e)) => Some(e.to_string()),
                            Err(e) => Some(e.to_string()),
                        };
                    if let Some(message) = message {
                        let _ = tx.send(Msg::Notice(format!("{node}: {message}")));
                    }
                    this.send_nodes(&tx).await;
                });
            }
        }
    }
}

/// What a background task needs to observe the nodes again.
#[derive(Clone)]
struct Observer {
    targets: Arc<Vec<NodeTarget>>,
    timeout: Duration,
}

impl Live {
    fn snapshot(&self) -> Observer {
        Observer {
            targets: self.targets.clone(),
            timeout: self.timeout,
        }
    }

    fn chosen(&self, nodes: &[String]) -> Vec<NodeTarget> {
        self.targets
            .iter()
            .filter(|t| nodes.contains(&t.node.name))
            .cloned()
            .collect()
    }

    /// Node facts and the config views for `sets`, in the background.
    fn refresh(&self, tx: &UnboundedSender<Msg>, sets: Vec<ImageSet>) {
        let (observer, tx) = (self.snapshot(), tx.clone());
        tokio::spawn(async move {
            observer.send_nodes(&tx).await;
            let _ = tx.send(Msg::ConfigViews(observer.config_views(&sets).await));
        });
    }

    fn control(&self, control: Control, tx: &UnboundedSender<Msg>) {
        let sent = self
            .control
            .as_ref()
            .is_some_and(|c| c.send(control).is_ok());
        if !sent {
            let _ = tx.send(Msg::Notice(
                "no rollout is running: apply a set first".into(),
            ));
        }
    }

    /// The blob cache for fan-out, opened the first time and kept.
    fn fan_out_cache(&mut self) -> Result<Arc<BlobCache>, String> {
        if let Some(cache) = &self.cache {
            return Ok(Arc::clone(cache));
        }
        let dir = self.cache_dir.clone().ok_or(
            "fan-out needs a blob cache: neither XDG_CACHE_HOME nor HOME is set; start with --cache-dir DIR",
        )?;
        let cache = BlobCache::open(&dir, self.cache_options.clone(), Arc::clone(&self.registry))
            .map_err(|e| format!("fan-out: {e}"))?;
        self.cache = Some(Arc::clone(&cache));
        Ok(cache)
    }

    /// Surveys the set on its nodes (fresh figures), then runs the rollout (fanned out if asked).
    fn apply(
        &mut self,
        set: ImageSet,
        nodes: &[String],
        force: bool,
        fan_out: bool,
        tx: &UnboundedSender<Msg>,
    ) {
        if self.control.as_ref().is_some_and(|c| !c.is_closed()) {
            let _ = tx.send(Msg::Notice("a rollout is already running".into()));
            return;
        }
        let fan_out = match fan_out.then(|| self.fan_out_cache()).transpose() {
            Ok(cache) => cache.map(|cache| FanOutSetup {
                cache,
                listen: self.fan_out_listen,
            }),
            Err(e) => {
                let _ = tx.send(Msg::EngineFinished(Err(e)));
                return;
            }
        };
        let targets = self.chosen(nodes);
        let (registry, credentials, tx) =
            (self.registry.clone(), self.credentials.clone(), tx.clone());
        let (platform, limits, timeout) = (self.platform.clone(), self.limits, self.timeout);
        let cache_dir = self.cache_dir.clone();
        let config = EngineConfig {
            force,
            ..self.engine.clone()
        };
        let (control_tx, mut control_rx) = tokio::sync::mpsc::unbounded_channel();
        self.control = Some(control_tx);
        let observer = self.snapshot();
        let task = tokio::spawn(async move {
            let sets = [set];
            let dnodes: Vec<_> = targets.iter().map(|t| t.node.clone()).collect();
            let cache = cache_dir.as_deref();
            let surveyed = survey(&dnodes, &sets, &registry, &platform, limits, timeout, cache);
            let planned = match surveyed.await {
                Ok(planned) => planned,
                Err(e) => {
                    let _ = tx.send(Msg::EngineFinished(Err(Failure::from(e).to_string())));
                    return;
                }
            };
            let _ = tx.send(Msg::SurveyDone(Ok(planned.clone())));
            let Survey {
                nodes: plans,
                facts,
                ..
            } = planned;
            let jobs = crate::targets::jobs(&targets, plans, &sets);
            let started = Run::start(
                &targets,
                jobs,
                facts,
                credentials,
                config,
                fan_out,
                true,
                timeout,
            );
            let mut run = match started.await {
                Ok((run, notices)) => {
                    for notice in notices {
                        let _ = tx.send(Msg::Notice(notice));
                    }
                    run
                }
                Err(e) => {
                    let _ = tx.send(Msg::EngineFinished(Err(e)));
                    return;
                }
            };
            let mut operator = true;
            loop {
                tokio::select! {
                    update = run.next() => match update {
                        Some(Update::Event(event)) => { let _ = tx.send(Msg::Rollout(event)); }
                        Some(Update::FanOut { direct }) => { let _ = tx.send(Msg::FanOut(direct)); }
                        Some(Update::LinkBytes(bytes)) => { let _ = tx.send(Msg::LinkBytes(bytes)); }
                        None => break,
                    },
                    control = control_rx.recv(), if operator => match control {
                        Some(control) => { run.control(control); }
                        // The TUI is gone: stop pulling (then fan-out's files are put back).
                        None => {
                            operator = false;
                            run.control(Control::CancelAll);
                        }
                    },
                }
            }
            let (report, problems) = run.finish().await;
            if let Some(report) = report {
                let _ = tx.send(Msg::LinkBytes(report.link_bytes));
            }
            for problem in problems {
                let _ = tx.send(Msg::Notice(problem));
            }
            let _ = tx.send(Msg::EngineFinished(Ok(())));
            observer.send_nodes(&tx).await;
            let _ = tx.send(Msg::ConfigViews(observer.config_views(&sets).await));
        });
        let mut rollouts = self.rollouts.lock().expect("rollouts lock");
        rollouts.retain(|r| !r.is_finished());
        rollouts.push(task);
    }
}

impl Observer {
    async fn send_nodes(&self, tx: &UnboundedSender<Msg>) {
        let infos =
            futures::future::join_all(self.targets.iter().map(|t| node_info(t, self.timeout)))
                .await;
        let _ = tx.send(Msg::NodesUpdated(infos));
    }

    /// Per node, what pinning the images of `sets` (each held by the sets that list it) writes there
    /// against what is there now.
    async fn config_views(&self, sets: &[ImageSet]) -> BTreeMap<String, ConfigView> {
        let holds = holders_of(sets);
        let views = self.targets.iter().map(|t| async {
            let view = match connect_resolved(&t.node.endpoint, t.pin.clone(), self.timeout).await {
                Ok((_, PinTarget::CrioDropIn { config_dir, .. })) => crio_view(&config_dir, &holds),
                Ok((client, _)) => containerd_view(&client, &holds).await,
                Err(e) => ConfigView {
                    path: format!("pin method unknown: {e}"),
                    notes: Vec::new(),
                    lines: Vec::new(),
                },
            };
            (t.node.name.clone(), view)
        });
        futures::future::join_all(views).await.into_iter().collect()
    }
}

/// `n2, n3: unpinned 3 images; e2e/y@sha256:… stays pinned for set-b`: nodes with the same outcome said
/// once, in the order given; nodes where nothing happened only when that is all there is to say.
fn by_outcome(outcomes: Vec<(String, Option<String>)>) -> String {
    let nothing = "nothing held by this set".to_string();
    let said: Vec<(String, String)> = match outcomes.iter().all(|(_, said)| said.is_none()) {
        true => outcomes
            .into_iter()
            .map(|(node, _)| (node, nothing.clone()))
            .collect(),
        false => outcomes
            .into_iter()
            .filter_map(|(node, said)| Some((node, said?)))
            .collect(),
    };
    let mut grouped: Vec<(Vec<String>, String)> = Vec::new();
    for (node, said) in said {
        match grouped.iter_mut().find(|(_, s)| *s == said) {
            Some((nodes, _)) => nodes.push(node),
            None => grouped.push((vec![node], said)),
        }
    }
    grouped
        .into_iter()
        .map(|(nodes, said)| format!("{}: {said}", nodes.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The CRI-O drop-in as it is and as holding the images of `holds` for their sets would write it (each
/// entry's mark names its sets), under what CRI-O would then have in force.
fn crio_view(config_dir: &Path, holds: &BTreeMap<String, BTreeSet<String>>) -> ConfigView {
    let path = config_dir.join(pins::CRIO_DROP_IN);
    let old = std::fs::read_to_string(&path).ok();
    let new = pins::hold_in_drop_in(old.as_deref(), holds);
    let lines = match &new {
        Ok(new) => crate::model::diff::lines(old.as_deref(), new.as_deref()),
        Err(e) => vec![(DiffKind::Removed, format!("cannot edit: {e}"))],
    };
    let written = new
        .ok()
        .flatten()
        .and_then(|text| pins::crio_entries(&text).ok())
        .unwrap_or_default();
    let wanted: Vec<String> = holds.keys().cloned().collect();
    let held = ConfigNote::held(written.iter().map(|e| &e.holders));
    let mut notes = match pins::read_crio_config(config_dir) {
        Ok(config) => {
            let patterns = written.into_iter().map(|e| e.pattern).collect();
            let written = config.with_drop_in(pins::CRIO_DROP_IN, patterns);
            ConfigNote::in_force(&written, pins::CRIO_DROP_IN, &wanted)
        }
        Err(e) => vec![ConfigNote {
            text: format!("what CRI-O has in force is unknown: {e}"),
            warning: true,
        }],
    };
    notes.extend(held);
    ConfigView {
        path: path.display().to_string(),
        notes,
        lines,
    }
}

/// containerd keeps pins as image labels: one line per image with who will hold its pin, added where
/// its sets do not hold it yet.
async fn containerd_view(
    client: &CriClient,
    holds: &BTreeMap<String, BTreeSet<String>>,
) -> ConfigView {
    let path = format!(
        "containerd image labels {}={CONTAINERD_PIN_VALUE} and {}<set> (namespace k8s.io)",
        pins::CONTAINERD_PIN_LABEL,
        pins::set_label("")
    );
    let images = pins::containerd_images(client).await.unwrap_or_default();
    let references: Vec<String> = holds.keys().cloned().collect();
    let statuses = client.image_statuses(&references).await;
    let mut held = Vec::new();
    let lines = holds
        .iter()
        .zip(statuses)
        .map(|((image, sets), status)| {
            // Not on the node yet: pinning labels it once it is pulled.
            let before = match status {
                Ok(Some(status)) => pins::image_named(&images, &pins::cri_names(image, &status))
                    .map(pins::ContainerdImage::holders),
                _ => None,
            }
            .unwrap_or_default();
            let mut after = before.clone();
            after.extend(sets.iter().map(|s| Holder::Set(s.clone())));
            let kind = if after == before {
                DiffKind::Same
            } else {
                DiffKind::Added
            };
            let line = format!("{image}  held by {}", HeldBy::from(&after).short());
            held.push(after);
            (kind, line)
        })
        .collect();
    ConfigView {
        path,
        notes: ConfigNote::held(&held).into_iter().collect(),
        lines,
    }
}

/// What the Nodes screen shows for one node. Unknown stays unknown.
async fn node_info(target: &NodeTarget, timeout: Duration) -> NodeInfo {
    let facts = observe(&target.node, &[], timeout).await.facts;
    let reachable = facts.unreachable.is_none();
    let lazy = {
        let lazy = target.lazy.clone();
        tokio::task::spawn_blocking(move || read_lazy(&lazy))
            .await
            .ok()
            .and_then(Result::ok)
    };
    let mut info = NodeInfo {
        name: target.node.name.clone(),
        runtime: facts.runtime,
        capacity_bytes: facts.capacity_bytes,
        used_bytes: facts.used_bytes,
        available_bytes: facts.available_bytes,
        images: None,
        pinned: None,
        pin_method: None,
        lazy_pulling: lazy.map(|s| s == LazyState::On),
        reachable: Some(reachable),
        warning: None,
    };
    if !reachable {
        return info;
    }
    let Ok((client, pin)) =
        connect_resolved(&target.node.endpoint, target.pin.clone(), timeout).await
    else {
        return info;
    };
    info.pin_method = Some(match pin {
        PinTarget::CrioDropIn { .. } => PinMethod::CrioDropIn,
        _ => PinMethod::ContainerdLabel,
    });
    let reports = match client.version().await {
        Ok(v) => Runtime::identify(&v.runtime_name, &v.runtime_version)
            .map(|r| r.reports_pinned())
            .unwrap_or_default(),
        Err(_) => return info,
    };
    let Ok(images) = client.list_images().await else {
        return info;
    };
    info.images = Some(images.len());
    // The runtime's word where it reports pins; otherwise the record: CRI-O's files, containerd's label.
    info.pinned = if reports.list_images {
        Some(images.iter().filter(|i| i.pinned).count())
    } else {
        match &pin {
            PinTarget::CrioDropIn { config_dir, .. } => {
                let dir = config_dir.clone();
                tokio::task::spawn_blocking(move || pins::read_crio_config(&dir))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|config| {
                        images
                            .iter()
                            .filter(|i| {
                                config.pins(&[&i.repo_tags[..], &i.repo_digests[..]].concat())
                            })
                            .count()
                    })
            }
            _ => pins::containerd_images(&client)
                .await
                .ok()
                .map(|images| images.iter().filter(|i| i.pin_labelled()).count()),
        }
    };
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each image held by the sets named beside it.
    fn holds(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(image, sets)| {
                (
                    image.to_string(),
                    sets.iter().map(|s| s.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_crio_nodes_config_view_says_who_holds_each_pin_there_and_after_the_set() {
        let digest = |c: char| c.to_string().repeat(64);
        let [w, x, y, z] =
            ['a', 'b', 'c', 'd'].map(|c| format!("quay.io/ns/{c}@sha256:{}", digest(c)));
        let dir = tempfile::tempdir().unwrap();
        // On the node: w pinned in the OpenShift daemon's shape (no holders: unowned), then y and z for set-b.
        std::fs::write(
            dir.path().join(pins::CRIO_DROP_IN),
            format!("[crio]\n  [crio.image]\n    pinned_images = [\"{w}\"]\n"),
        )
        .unwrap();
        pins::hold_crio_pins(dir.path(), &holds(&[(&y, &["set-b"]), (&z, &["set-b"])])).unwrap();

        // The Config screen for set-a, which lists x and y.
        let view = crio_view(dir.path(), &holds(&[(&x, &["set-a"]), (&y, &["set-a"])]));
        let held: Vec<&str> = view
            .notes
            .iter()
            .filter(|n| n.text.starts_with("held by"))
            .map(|n| n.text.as_str())
            .collect();
        assert_eq!(
            held,
            ["held by: set-a (2), set-b (2), unowned (1)"],
            "{:?}",
            view.notes
        );
        let line = |kind: DiffKind, image: &str, mark: &str| {
            view.lines
                .contains(&(kind, format!("      \"{image}\", # pinboard: {mark}")))
        };
        assert!(line(DiffKind::Added, &x, "set-a"), "{:?}", view.lines);
        assert!(line(DiffKind::Removed, &y, "set-b"), "{:?}", view.lines);
        assert!(
            line(DiffKind::Added, &y, "set-a, set-b"),
            "{:?}",
            view.lines
        );
        assert!(line(DiffKind::Same, &z, "set-b"), "{:?}", view.lines);
        assert!(line(DiffKind::Same, &w, "(unowned)"), "{:?}", view.lines);
        assert!(view.path.ends_with(pins::CRIO_DROP_IN), "{}", view.path);
    }
}

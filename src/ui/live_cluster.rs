//! The TUI's backend in cluster mode: the screens are the direct mode's, fed by the cluster. The watchers
//! ([`crate::cluster::watch`]) send every change as [`Msg::Cluster`]; commands become API writes:
//! applying a set is a server-side apply of its PinnedImageSet, unpinning deletes it, lazy pulling is a
//! ContainerRuntimeConfig per pool, and the Plan comes from [`crate::survey::survey_cluster`], as in
//! `pinboard plan --kubeconfig`. The machine-config daemons pull and pin; the Rollout screen follows them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::TuiArgs;
use super::live::theme_of;
use super::msg::{Cmd, Msg};
use super::run::{UiBackend, execute_file_cmd, read_release};
use super::state::{SetDraft, State};
use crate::backend::registry::Registry;
use crate::cluster::{Cluster, ConnectOptions, connect, watch};
use crate::error::Failure;
use crate::model::cluster::{ClusterUpdate, ClusterView, pool_warning, pools_for_set};
use crate::model::config_view::ConfigView;
use crate::model::diff;
use crate::model::export::pinned_image_set_yaml;
use crate::model::image::Platform;
use crate::model::plan::Limits;
use crate::model::release::SetOptions;
use crate::model::set::ImageSet;
use crate::options::{cluster_registry_client, resolve_sets};
use crate::survey::survey_cluster;

/// Opens the TUI on the cluster `options` names; returns when the operator quits.
pub async fn run(args: TuiArgs, options: ConnectOptions) -> Result<(), Failure> {
    let common = &args.common;
    let platform = common.targets.platform()?;
    let theme = theme_of(&args)?;
    let cluster = Cluster::discover(connect(&options).await?).await?;
    let (registry, warnings) = cluster_registry_client(&common.registry, cluster.client()).await?;
    let (sets, mut notes) = resolve_sets(&common.input, false, &registry, &platform).await?;
    let denied = if args.readonly {
        None
    } else {
        cluster.write_denied().await
    };
    let mut state = State::new(
        cluster_label(&options),
        theme,
        args.readonly,
        Instant::now(),
    );
    state.start_cluster(denied, std::time::SystemTime::now());
    for warning in warnings {
        tracing::warn!("{warning}");
        notes.push(warning);
    }
    if !notes.is_empty() {
        state.say(notes.join("; "));
    }
    state.sets = sets
        .into_iter()
        .map(|set| SetDraft::new(set, Default::default()))
        .collect();
    let lazy_store = common.targets.lazy_store.clone();
    let backend = ClusterUi::new(
        cluster,
        registry,
        platform,
        common.limits.limits(),
        lazy_store,
    )
    .with_release_options(common.input.release.set_options())
    .with_cache_dir(common.cache.dir().ok());
    super::run::run(state, backend)
        .await
        .map_err(|e| Failure::bad_input(format!("terminal UI failed: {e:#}")))
}

/// `cluster: ~/.kube/config (context admin)` for the status line.
fn cluster_label(options: &ConnectOptions) -> String {
    let file = options.kubeconfig.as_ref().map_or_else(
        || "kubeconfig from the environment".to_owned(),
        |p| p.display().to_string(),
    );
    match &options.context {
        Some(context) => format!("cluster: {file} (context {context})"),
        None => format!("cluster: {file}"),
    }
}

pub struct ClusterUi {
    cluster: Cluster,
    /// The watched view, for commands that need it (pools, nodes); the UI keeps its own copy.
    view: Arc<Mutex<ClusterView>>,
    registry: Arc<Registry>,
    platform: Platform,
    limits: Limits,
    lazy_store: String,
    /// The blob cache whose blobs the plan's `linkBytes.fanOut` counts as fetched (`--cache-dir`).
    cache_dir: Option<PathBuf>,
    watching: Option<JoinHandle<()>>,
    /// How a release typed at the import prompt becomes sets.
    release_options: SetOptions,
}

impl Drop for ClusterUi {
    fn drop(&mut self) {
        if let Some(task) = &self.watching {
            task.abort();
        }
    }
}

impl ClusterUi {
    /// A backend on `cluster`; it starts watching when the UI starts it. `lazy_store` is the additional
    /// layer store lazy pulling configures.
    pub fn new(
        cluster: Cluster,
        registry: Registry,
        platform: Platform,
        limits: Limits,
        lazy_store: String,
    ) -> ClusterUi {
        ClusterUi {
            cluster,
            view: Arc::default(),
            registry: Arc::new(registry),
            platform,
            limits,
            lazy_store,
            cache_dir: None,
            watching: None,
            release_options: SetOptions {
                pool: "worker".into(),
                ..SetOptions::default()
            },
        }
    }

    /// How a release imported in the UI becomes sets (the command line's `--pool`, `--exclude`...).
    pub fn with_release_options(mut self, options: SetOptions) -> ClusterUi {
        self.release_options = options;
        self
    }

    /// The blob cache the plan's `linkBytes.fanOut` counts as fetched already.
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> ClusterUi {
        self.cache_dir = dir;
        self
    }

    /// `read` of the watched view, under its lock (clone what a task needs to keep).
    fn with_view<T>(&self, read: impl FnOnce(&ClusterView) -> T) -> T {
        read(&self.view.lock().expect("view lock"))
    }

    /// Runs `work` on a task and shows its outcome as a notice.
    fn notify(
        &self,
        tx: &UnboundedSender<Msg>,
        work: impl Future<Output = String> + Send + 'static,
    ) {
        let tx = tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(Msg::Notice(work.await));
        });
    }
}

/// How long a kubelet configuration read from `/configz` stands: a KubeletConfig rolled out by the
/// machine-config operator restarts the kubelets with new settings, and a kubelet that did not answer
/// may answer later.
const KUBELET_CONFIG_MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// The nodes among `names` whose kubelet configuration is to be read now: first seen, or last read
/// [`KUBELET_CONFIG_MAX_AGE`] ago (checked when the Nodes change, so never more often). Marks them read.
fn due_for_reading<'n>(
    read_at: &mut HashMap<String, Instant>,
    names: impl Iterator<Item = &'n str>,
    now: Instant,
) -> Vec<String> {
    let mut due = Vec::new();
    for name in names {
        let stale = read_at
            .get(name)
            .is_none_or(|at| now.duration_since(*at) >= KUBELET_CONFIG_MAX_AGE);
        if stale {
            read_at.insert(name.to_owned(), now);
            due.push(name.to_owned());
        }
    }
    due
}

impl UiBackend for ClusterUi {
    fn start(&mut self, tx: &UnboundedSender<Msg>) {
        let (cluster, view, tx) = (self.cluster.clone(), self.view.clone(), tx.clone());
        self.watching = Some(tokio::spawn(async move {
            let mut watch = watch(&cluster);
            let mut read_at = HashMap::new();
            while let Some(update) = watch.updates.recv().await {
                if let ClusterUpdate::Nodes(nodes) = &update {
                    let names = nodes.iter().map(|n| n.name.as_str());
                    let due = due_for_reading(&mut read_at, names, Instant::now());
                    if !due.is_empty() {
                        let (cluster, tx) = (cluster.clone(), tx.clone());
                        tokio::spawn(async move {
                            let read = cluster.kubelet_settings(&due).await;
                            let _ = tx.send(Msg::Kubelets(read));
                        });
                    }
                }
                view.lock().expect("view lock").apply(update.clone());
                if tx.send(Msg::Cluster(update)).is_err() {
                    return;
                }
            }
        }));
    }

    fn execute(&mut self, cmd: Cmd, tx: &UnboundedSender<Msg>) {
        let Some(cmd) = execute_file_cmd(cmd, tx) else {
            return;
        };
        let cluster = self.cluster.clone();
        match cmd {
            Cmd::Quit | Cmd::ReadFile(..) | Cmd::WriteFile(..) => {}
            Cmd::ImportRelease(pullspec) => read_release(
                self.registry.clone(),
                self.platform.clone(),
                self.release_options.clone(),
                pullspec,
                tx,
            ),
            Cmd::Survey { sets, .. } => {
                let view = self.with_view(ClusterView::clone);
                let _ = tx.send(Msg::ConfigViews(config_views(&view, &sets)));
                let (registry, platform, limits, cache, tx) = (
                    self.registry.clone(),
                    self.platform.clone(),
                    self.limits,
                    self.cache_dir.clone(),
                    tx.clone(),
                );
                tokio::spawn(async move {
                    let cache = cache.as_deref();
                    let result =
                        survey_cluster(&cluster, &view, &sets, &registry, &platform, limits, cache)
                            .await;
                    let _ = tx.send(Msg::SurveyDone(
                        result.map_err(|e| Failure::from(e).to_string()),
                    ));
                });
            }
            Cmd::Apply { set, force, .. } => {
                let pools = self.with_view(|v| pools_for_set(&set.labels, &v.pools));
                let warning = pool_warning(&set.name, &pools);
                if pools.is_empty() && !force {
                    let warning = warning.unwrap_or_default();
                    let _ = tx.send(Msg::Notice(format!("not applied: {warning}")));
                    return;
                }
                self.notify(tx, async move {
                    match cluster.apply_set(&set).await {
                        Ok(stored) => format!(
                            "applied PinnedImageSet {} (generation {}){}: the machine-config daemons pull \
                             and pin it; the Rollout screen follows them",
                            set.name,
                            stored.generation(),
                            warning.map_or_else(String::new, |w| format!("; warning: {w}"))
                        ),
                        Err(e) => format!("not applied: {e}"),
                    }
                });
            }
            Cmd::Unpin { set, .. } => self.notify(tx, async move {
                match cluster.delete_set(&set.name).await {
                    Ok(()) => format!(
                        "deleted PinnedImageSet {}: the daemons unpin its images; the images stay",
                        set.name
                    ),
                    Err(e) => format!("not deleted: {e}"),
                }
            }),
            Cmd::ToggleLazy { node, enable } => {
                let Some(pool) = self.with_view(|v| v.pool_of(&node).map(str::to_owned)) else {
                    let _ = tx.send(Msg::Notice(format!(
                        "{node} is in no MachineConfigPool: lazy pulling is set per pool"
                    )));
                    return;
                };
                let store = self.lazy_store.clone();
                self.notify(tx, async move {
                    match cluster.set_lazy(&pool, &store, enable).await {
                        Ok(()) if enable => format!(
                            "lazy pulling on for pool {pool}: ContainerRuntimeConfig written with \
                             additionalLayerStores {store}; the machine-config operator rolls it out"
                        ),
                        Ok(()) => format!("lazy pulling off for pool {pool}: pinboard's config removed"),
                        Err(e) => format!("lazy pulling for pool {pool} not changed: {e}"),
                    }
                });
            }
            Cmd::Retry { .. } | Cmd::Cancel { .. } => {
                let _ = tx.send(Msg::Notice(
                    "in cluster mode the machine-config daemons pull: there is no pull to retry or \
                     cancel from here"
                        .into(),
                ));
            }
        }
    }
}

/// Per set, its PinnedImageSet as the cluster stores it against what applying the draft writes, keyed
/// `PinnedImageSet/<name>`.
fn config_views(view: &ClusterView, sets: &[ImageSet]) -> BTreeMap<String, ConfigView> {
    sets.iter()
        .map(|set| {
            let stored = view
                .set(&set.name)
                .map(|s| pinned_image_set_yaml(&s.to_image_set()));
            let wanted = pinned_image_set_yaml(set);
            let view = ConfigView {
                path: format!("pinnedimagesets/{} on the cluster", set.name),
                notes: Vec::new(),
                lines: diff::lines(stored.as_deref(), Some(&wanted)),
            };
            (format!("PinnedImageSet/{}", set.name), view)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelets_configuration_is_read_when_its_node_appears_and_again_once_it_is_old() {
        let mut read_at = HashMap::new();
        let t0 = Instant::now();
        let names = |list: &'static [&'static str]| list.iter().copied();
        assert_eq!(
            due_for_reading(&mut read_at, names(&["w1", "w2"]), t0),
            ["w1", "w2"]
        );
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            due_for_reading(&mut read_at, names(&["w1", "w2", "w3"]), later),
            ["w3"],
            "only the node that joined"
        );
        let old = t0 + KUBELET_CONFIG_MAX_AGE;
        assert_eq!(
            due_for_reading(&mut read_at, names(&["w1", "w2", "w3"]), old),
            ["w1", "w2"],
            "read again once their reading is old; w3's is not yet"
        );
        assert!(due_for_reading(&mut read_at, names(&["w1", "w2", "w3"]), old).is_empty());
    }
}

//! The TUI on an OpenShift cluster: the watchers ([`crate::backend::openshift::watch`]) tell every change; applying a
//! set is a server-side apply of its PinnedImageSet, unpinning deletes it, lazy pulling is a
//! ContainerRuntimeConfig per pool, and the Plan is [`crate::survey::survey_cluster`]'s, as in `pinboard
//! plan --kubeconfig`. The machine-config daemons pull and pin; the Rollout screen follows them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::backend::openshift::{Cluster, ConnectOptions, connect, watch};
use crate::error::Failure;
use crate::fleet::{Events, FleetEvent};
use crate::model::config_view::ConfigView;
use crate::model::diff;
use crate::model::export::{SetKind, set_yaml};
use crate::model::machine_config::{ClusterUpdate, ClusterView, pool_warning, pools_for_set};
use crate::model::set::ImageSet;

/// How long a kubelet configuration read from `/configz` stands: a KubeletConfig rolled out by the
/// machine-config operator restarts the kubelets with new settings, and a kubelet that did not answer
/// may answer later.
const KUBELET_CONFIG_MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// The TUI's connection to the cluster.
#[derive(Default)]
pub(super) struct Live {
    /// Discovered when the TUI starts.
    cluster: Mutex<Option<Cluster>>,
    /// The watched view, for commands that need it (pools, nodes); the UI keeps its own copy.
    view: Arc<Mutex<ClusterView>>,
    watching: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(task) = self.watching.lock().expect("watch lock").take() {
            task.abort();
        }
    }
}

impl Live {
    /// Connects and finds the machine-config kinds.
    pub(super) async fn connect(&self, options: &ConnectOptions) -> Result<(), Failure> {
        let cluster = Cluster::discover(connect(options).await?).await?;
        *self.cluster.lock().expect("cluster lock") = Some(cluster);
        Ok(())
    }

    /// Whether this account may write PinnedImageSets, and why not.
    pub(super) async fn write_denied(&self) -> Option<String> {
        match self.cluster() {
            Ok(cluster) => cluster.write_denied().await,
            Err(e) => Some(e.to_string()),
        }
    }

    fn cluster(&self) -> Result<Cluster, Failure> {
        self.cluster
            .lock()
            .expect("cluster lock")
            .clone()
            .ok_or_else(|| Failure::bad_input("not connected to the cluster"))
    }

    /// The cluster and its view as watched now.
    pub(super) fn snapshot(&self) -> Result<(Cluster, ClusterView), Failure> {
        let view = self.view.lock().expect("view lock").clone();
        Ok((self.cluster()?, view))
    }

    /// Watches the cluster, telling every change; reads each node's kubelet configuration when the node
    /// appears and again once that reading is old.
    pub(super) fn watch(&self, events: Events) {
        let Ok(cluster) = self.cluster() else {
            return;
        };
        let view = Arc::clone(&self.view);
        let task = tokio::spawn(async move {
            let mut watch = watch(&cluster);
            let mut read_at = HashMap::new();
            while let Some(update) = watch.updates.recv().await {
                if let ClusterUpdate::Nodes(nodes) = &update {
                    let names = nodes.iter().map(|n| n.name.as_str());
                    let due = due_for_reading(&mut read_at, names, Instant::now());
                    if !due.is_empty() {
                        let (cluster, events) = (cluster.clone(), events.clone());
                        tokio::spawn(async move {
                            let (read, space) = tokio::join!(
                                cluster.kubelet_settings(&due),
                                cluster.image_fs(&due)
                            );
                            let _ = events.send(FleetEvent::Kubelets(read));
                            let _ = events.send(FleetEvent::ImageFs(space));
                        });
                    }
                }
                view.lock().expect("view lock").apply(update.clone());
                if events.send(FleetEvent::Cluster(update)).is_err() {
                    return;
                }
            }
        });
        *self.watching.lock().expect("watch lock") = Some(task);
    }

    /// The config views for `sets`: each PinnedImageSet as the cluster stores it against what applying the
    /// draft writes; and every node's image filesystem read again.
    pub(super) fn refresh(&self, sets: &[ImageSet], events: &Events) {
        let view = self.view.lock().expect("view lock");
        let _ = events.send(FleetEvent::ConfigViews(config_views(&view, sets)));
        let nodes: Vec<String> = view.nodes().iter().map(|n| n.name.clone()).collect();
        if let Ok(cluster) = self.cluster() {
            let events = events.clone();
            tokio::spawn(async move {
                let _ = events.send(FleetEvent::ImageFs(cluster.image_fs(&nodes).await));
            });
        }
    }

    /// Writes `set`, unless it lands in no pool and `force` is not given; says how it went.
    pub(super) fn apply(&self, set: ImageSet, force: bool, events: Events) {
        let pools = pools_for_set(&set.labels, &self.view.lock().expect("view lock").pools);
        let warning = pool_warning(&set.name, &pools);
        if pools.is_empty() && !force {
            let warning = warning.unwrap_or_default();
            let _ = events.send(FleetEvent::Notice(format!("not applied: {warning}")));
            return;
        }
        self.notify(events, move |cluster| async move {
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

    /// Deletes `set`: the daemons unpin its images.
    pub(super) fn delete(&self, set: ImageSet, events: Events) {
        self.notify(events, move |cluster| async move {
            match cluster.delete_set(&set.name).await {
                Ok(()) => format!(
                    "deleted PinnedImageSet {}: the daemons unpin its images; the images stay",
                    set.name
                ),
                Err(e) => format!("not deleted: {e}"),
            }
        });
    }

    /// Lazy pulling for the pool of `node`: pinboard's ContainerRuntimeConfig written or removed.
    pub(super) fn set_lazy(&self, node: String, enable: bool, store: String, events: Events) {
        let pool = self
            .view
            .lock()
            .expect("view lock")
            .pool_of(&node)
            .map(str::to_owned);
        let Some(pool) = pool else {
            let _ = events.send(FleetEvent::Notice(format!(
                "{node} is in no MachineConfigPool: lazy pulling is set per pool"
            )));
            return;
        };
        self.notify(events, move |cluster| async move {
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

    /// Runs `work` on the cluster in a task and tells its outcome as a notice.
    fn notify<W, F>(&self, events: Events, work: W)
    where
        W: FnOnce(Cluster) -> F,
        F: Future<Output = String> + Send + 'static,
    {
        let said = match self.cluster() {
            Ok(cluster) => work(cluster),
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

/// Per set, its PinnedImageSet as the cluster stores it against what applying the draft writes, keyed
/// `PinnedImageSet/<name>`.
fn config_views(view: &ClusterView, sets: &[ImageSet]) -> BTreeMap<String, ConfigView> {
    sets.iter()
        .map(|set| {
            let stored = view
                .set(&set.name)
                .map(|s| set_yaml(&s.to_image_set(), SetKind::PinnedImageSet));
            let wanted = set_yaml(set, SetKind::PinnedImageSet);
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

//! Watching, never polling: one kube-rs watcher per kind, each feeding a reflector store, and every change
//! sent as the kind's complete current list on one channel, with each watch's connection state.
//!
//! A watch that fails reports [`Connection::Reconnecting`] (since its first failure), waits (1 s doubling
//! to 30 s), and starts over with a fresh list, which ends in [`Connection::Synced`] again: so a recovered
//! watch always says so, even when nothing changed meanwhile.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::Api;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Cluster, typed};
use crate::model::machine_config::{ClusterNode, ClusterUpdate, Connection, Kind};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// Updates waiting for the consumer; the watchers wait when it is full.
const CHANNEL: usize = 256;

/// The running watchers; dropping it stops them.
pub struct Watch {
    pub updates: mpsc::Receiver<ClusterUpdate>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts one watcher per [`Kind`] on the cluster. Needs a tokio runtime.
pub fn watch(cluster: &Cluster) -> Watch {
    let (tx, updates) = mpsc::channel(CHANNEL);
    let (client, resources) = (&cluster.client, &cluster.resources);
    let tasks = vec![
        typed_watch(
            client,
            Kind::MachineConfigPool,
            &resources.pool,
            ClusterUpdate::Pools,
            &tx,
        ),
        typed_watch(
            client,
            Kind::MachineConfigNode,
            &resources.machine_config_node,
            ClusterUpdate::MachineConfigNodes,
            &tx,
        ),
        typed_watch(
            client,
            Kind::PinnedImageSet,
            &resources.pinned_image_set,
            ClusterUpdate::Sets,
            &tx,
        ),
        typed_watch(
            client,
            Kind::ContainerRuntimeConfig,
            &resources.runtime_config,
            ClusterUpdate::RuntimeConfigs,
            &tx,
        ),
        spawn(
            Kind::Node,
            Api::<Node>::all(client.clone()),
            Writer::default(),
            |nodes: &Snapshot<Node>| {
                ClusterUpdate::Nodes(
                    nodes
                        .iter()
                        .map(|n| ClusterNode::from(n.as_ref()))
                        .collect(),
                )
            },
            tx,
        ),
    ];
    Watch { updates, tasks }
}

type Snapshot<K> = [std::sync::Arc<K>];

/// A watcher of a machine-config kind, sending its objects as typed views (`T`) in `to_update`.
fn typed_watch<T>(
    client: &kube::Client,
    kind: Kind,
    resource: &ApiResource,
    to_update: fn(Vec<T>) -> ClusterUpdate,
    tx: &mpsc::Sender<ClusterUpdate>,
) -> JoinHandle<()>
where
    T: DeserializeOwned + Clone + Send + 'static,
{
    let api = Api::all_with(client.clone(), resource);
    let mut cache = TypedCache::default();
    let update = move |objects: &Snapshot<DynamicObject>| to_update(cache.all(objects));
    spawn(kind, api, Writer::new(resource.clone()), update, tx.clone())
}

/// The typed views of a kind's objects by name, each converted again only when its resourceVersion
/// changes: after a change to one of 2,000 objects, one is converted, not 2,000.
struct TypedCache<T> {
    by_name: HashMap<String, (String, T)>,
}

impl<T> Default for TypedCache<T> {
    fn default() -> Self {
        TypedCache {
            by_name: HashMap::new(),
        }
    }
}

impl<T: DeserializeOwned + Clone> TypedCache<T> {
    /// Every object's typed view, in the order given; objects gone are forgotten.
    fn all(&mut self, objects: &Snapshot<DynamicObject>) -> Vec<T> {
        let mut kept = HashMap::with_capacity(objects.len());
        let views = objects
            .iter()
            .filter_map(|object| {
                let name = object.metadata.name.clone().unwrap_or_default();
                let version = object.metadata.resource_version.clone().unwrap_or_default();
                let view = match self.by_name.remove(&name) {
                    Some((seen, view)) if seen == version && !version.is_empty() => view,
                    _ => typed(object)?,
                };
                kept.insert(name, (version, view.clone()));
                Some(view)
            })
            .collect();
        self.by_name = kept;
        views
    }
}

/// Watches `api` for ever (until the receiver is gone), keeping `writer`'s store and sending `to_update`
/// of the store, sorted by name, after every change.
fn spawn<K>(
    kind: Kind,
    api: Api<K>,
    mut writer: Writer<K>,
    mut to_update: impl FnMut(&Snapshot<K>) -> ClusterUpdate + Send + 'static,
    tx: mpsc::Sender<ClusterUpdate>,
) -> JoinHandle<()>
where
    K: Resource + Lookup + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let store: Store<K> = writer.as_reader();
    let send = move |update: ClusterUpdate| {
        let tx = tx.clone();
        async move { tx.send(update).await.is_ok() }
    };
    tokio::spawn(async move {
        let mut retry = FIRST_RETRY;
        let mut failing_since = None;
        if !send(ClusterUpdate::Connection(kind, Connection::Connecting)).await {
            return;
        }
        loop {
            let mut events =
                std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        writer.apply_watcher_event(&event);
                        let listed = match event {
                            Event::Init | Event::InitApply(_) => continue,
                            Event::InitDone => true,
                            Event::Apply(_) | Event::Delete(_) => false,
                        };
                        let mut objects = store.state();
                        objects.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
                        if !send(to_update(&objects)).await {
                            return;
                        }
                        // Synced only after the list it is about, so a consumer that sees it has the list.
                        if listed {
                            failing_since = None;
                            retry = FIRST_RETRY;
                            if !send(ClusterUpdate::Connection(kind, Connection::Synced)).await {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        let since = *failing_since.get_or_insert_with(SystemTime::now);
                        let error = error.to_string();
                        tracing::warn!("watch of {kind:?} failed: {error}");
                        let state = Connection::Reconnecting { since, error };
                        if !send(ClusterUpdate::Connection(kind, state)).await {
                            return;
                        }
                        break;
                    }
                }
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(LAST_RETRY);
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::machine_config::PinnedImageSet;

    fn set(name: &str, version: &str, generation: i64) -> Arc<DynamicObject> {
        let object = serde_json::json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
            "metadata": {"name": name, "resourceVersion": version, "generation": generation},
        });
        Arc::new(serde_json::from_value(object).unwrap())
    }

    #[test]
    fn typed_views_are_converted_again_only_when_the_resource_version_changes() {
        let mut cache = TypedCache::<PinnedImageSet>::default();
        let generations = |views: Vec<PinnedImageSet>| -> Vec<i64> {
            views.iter().map(PinnedImageSet::generation).collect()
        };
        assert_eq!(
            generations(cache.all(&[set("a", "1", 1), set("b", "1", 1)])),
            [1, 1]
        );
        // Same version, other content: the view converted before stands (no new conversion).
        assert_eq!(
            generations(cache.all(&[set("a", "1", 7), set("b", "2", 2)])),
            [1, 2]
        );
        // Gone objects are forgotten: back with the same version, it is converted anew.
        assert_eq!(generations(cache.all(&[set("b", "2", 2)])), [2]);
        assert_eq!(generations(cache.all(&[set("a", "1", 9)])), [9]);
    }
}

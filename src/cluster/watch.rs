//! Watching, never polling: one kube-rs watcher per kind, each feeding a reflector store, and every change
//! sent as the kind's complete current list on one channel, with each watch's connection state.
//!
//! A watch that fails reports [`Connection::Reconnecting`] (since its first failure), waits (1 s doubling
//! to 30 s), and starts over with a fresh list, which ends in [`Connection::Synced`] again: so a recovered
//! watch always says so, even when nothing changed meanwhile.

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
use crate::model::cluster::{ClusterUpdate, Connection, Kind, NodeView};

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
    let client = &cluster.client;
    let dynamic =
        |kind, resource: &ApiResource, to_update: fn(&Snapshot<DynamicObject>) -> ClusterUpdate| {
            let api = Api::all_with(client.clone(), resource);
            spawn(
                kind,
                api,
                Writer::new(resource.clone()),
                to_update,
                tx.clone(),
            )
        };
    let resources = &cluster.resources;
    let tasks = vec![
        dynamic(Kind::MachineConfigPool, &resources.pool, |l| {
            ClusterUpdate::Pools(typed_all(l))
        }),
        dynamic(
            Kind::MachineConfigNode,
            &resources.machine_config_node,
            |l| ClusterUpdate::MachineConfigNodes(typed_all(l)),
        ),
        dynamic(Kind::PinnedImageSet, &resources.pinned_image_set, |l| {
            ClusterUpdate::Sets(typed_all(l))
        }),
        dynamic(
            Kind::ContainerRuntimeConfig,
            &resources.runtime_config,
            |l| ClusterUpdate::RuntimeConfigs(typed_all(l)),
        ),
        spawn(
            Kind::Node,
            Api::<Node>::all(client.clone()),
            Writer::default(),
            |nodes| {
                ClusterUpdate::Nodes(nodes.iter().map(|n| NodeView::from(n.as_ref())).collect())
            },
            tx,
        ),
    ];
    Watch { updates, tasks }
}

type Snapshot<K> = [std::sync::Arc<K>];

fn typed_all<T: DeserializeOwned>(objects: &Snapshot<DynamicObject>) -> Vec<T> {
    objects.iter().filter_map(|o| typed(o)).collect()
}

/// Watches `api` for ever (until the receiver is gone), keeping `writer`'s store and sending `to_update`
/// of the store, sorted by name, after every change.
fn spawn<K>(
    kind: Kind,
    api: Api<K>,
    mut writer: Writer<K>,
    to_update: fn(&Snapshot<K>) -> ClusterUpdate,
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

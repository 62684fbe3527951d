//! Watching the machine-config kinds and the Nodes, never polling ([`crate::backend::kube_watch`]): every
//! change sent as the kind's complete current list on one channel, with each watch's connection state.

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Cluster;
use crate::backend::kube_watch::{Snapshot, TypedCache, spawn};
use crate::model::machine_config::{ClusterNode, ClusterUpdate, Kind};
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
            watcher::Config::default(),
            Writer::default(),
            |nodes: &Snapshot<Node>| {
                ClusterUpdate::Nodes(
                    nodes
                        .iter()
                        .map(|n| ClusterNode::from(n.as_ref()))
                        .collect(),
                )
            },
            ClusterUpdate::Connection,
            tx,
        ),
    ];
    Watch { updates, tasks }
}

/// A watcher of a machine-config kind, sending its objects as typed views (`T`) in `to_update`.
fn typed_watch<T>(
    client: &kube::Client,
    kind: Kind,
    resource: &ApiResource,
    to_update: fn(Vec<T>) -> ClusterUpdate,
    tx: &mpsc::Sender<ClusterUpdate>,
) -> JoinHandle<()>
where
    T: DeserializeOwned + Clone + Send + Sync + 'static,
{
    let api = Api::all_with(client.clone(), resource);
    let mut cache = TypedCache::default();
    let update = move |objects: &Snapshot<DynamicObject>| to_update(cache.owned(objects));
    spawn(
        kind,
        api,
        watcher::Config::default(),
        Writer::new(resource.clone()),
        update,
        ClusterUpdate::Connection,
        tx.clone(),
    )
}

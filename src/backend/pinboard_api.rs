//! pinboard's own API on a Kubernetes cluster ([`crate::model::pinboard_api`]): finding it, writing sets
//! (server-side apply, field manager `pinboard`), the agents' reports, what their runtimes hold
//! ([`crate::model::node_blobs`]) and set summaries (field manager `pinboard-agent`, status
//! subresources), reading what the runtimes hold for a plan, their heartbeat Leases, the roles one agent takes through a
//! Lease (the aggregator, the in-cluster cache and its token's Secret), a node's lazy-pull wish, reading
//! pull Secrets, and watching it all, the agents' DaemonSets included (never polling:
//! [`crate::backend::kube_watch`]). An agent watches the sets and only its own Node and report, so 5,000
//! agents do not each watch 5,000 nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::error::DiscoveryError;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::{Client, discovery};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::kube_watch::{Snapshot, TypedCache, spawn, typed};
use crate::error::Failure;
use crate::model::agent_daemonsets::{AGENTS_DAEMONSET_LABEL, AgentDaemonSet, AgentDaemonSets};
use crate::model::agents_view::{AgentsUpdate, AgentsView, WATCHED_KINDS};
use crate::model::cache_token::CacheToken;
use crate::model::machine_config::{ClusterNode, Connection};
use crate::model::node_blobs::{NodeBlobs, PinboardNodeBlobs};
use crate::model::pinboard_api::{
    AGENT_MANAGER, API_VERSION, CACHE_ADDRESS_ANNOTATION, CACHE_LEASE, CACHE_SETS_ANNOTATION,
    CACHE_TOKEN_KEY, CACHE_TOKEN_SECRET, CHECK_REQUEST_ANNOTATION, GROUP, Heartbeat, IMAGES_KIND,
    IMAGES_PLURAL, NODE_KIND, NodeImages, NodeReport, PinSet, PinSetStatus, PinboardNode,
    PinboardNodeImages, SET_KIND, VERSION, lease_name,
};
use crate::model::pinboard_kinds::{BLOBS_KIND, BLOBS_PLURAL};
use crate::model::set::ImageSet;

/// The field manager of what the commands write.
pub const FIELD_MANAGER: &str = "pinboard";
/// The field manager of the checks commands ask of the agents ([`PinboardApi::ask_check`]).
const CHECK_MANAGER: &str = "pinboard-check";
/// Updates waiting for the consumer; the watchers wait when it is full.
const CHANNEL: usize = 256;

/// Why pinboard's API could not do what was asked; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error(
        "this cluster serves no {GROUP} API: pinboard's agents are not installed; install them with \
         `pinboard agent manifests --image IMAGE | kubectl apply -f -` (docs/agents.md)"
    )]
    NotInstalled,
    #[error(
        "read-only: your account may not {verb} {what} (ClusterRole pinboard-agents-operator needed): \
         {message}"
    )]
    ReadOnly {
        verb: &'static str,
        what: &'static str,
        message: String,
    },
    #[error("there is no PinSet {0:?} on the cluster")]
    NoSuchSet(String),
    #[error("set {name:?} would be refused: {}", problems.join("; "))]
    Invalid { name: String, problems: Vec<String> },
    #[error("the API server failed: {0}")]
    Api(#[from] kube::Error),
    #[error("no random bytes for the in-cluster cache's token: {0}")]
    Random(#[from] std::io::Error),
}

impl From<AgentsError> for Failure {
    /// An API server that does not answer (or fails) is unreachable (exit 3); the rest is the input's or
    /// the account's to fix (exit 2).
    fn from(error: AgentsError) -> Failure {
        let unreachable = match &error {
            AgentsError::Api(kube::Error::Api(status)) => status.code >= 500,
            AgentsError::Api(_) => true,
            _ => false,
        };
        match unreachable {
            true => Failure::unreachable(vec![format!(
                "cannot reach the API server: {error}; check the kubeconfig's server and your network"
            )]),
            false => Failure::bad_input(error.to_string()),
        }
    }
}

/// A cluster that serves pinboard's API.
#[derive(Clone)]
pub struct PinboardApi {
    client: Client,
    sets: ApiResource,
    nodes: ApiResource,
    /// The reports' detail: each node's images.
    images: ApiResource,
    /// What each node's runtime holds.
    blobs: ApiResource,
    /// Where the agents run: their Leases and the pull Secrets.
    namespace: String,
}

/// The running watchers; dropping it stops them.
pub struct AgentsWatch {
    pub updates: mpsc::Receiver<AgentsUpdate>,
    /// What more watchers send into `updates` on.
    sender: mpsc::Sender<AgentsUpdate>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for AgentsWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl PinboardApi {
    /// Finds pinboard's API on the cluster `client` reaches; `namespace` is the agents'.
    pub async fn discover(client: Client, namespace: &str) -> Result<PinboardApi, AgentsError> {
        match discovery::group(&client, GROUP).await {
            Err(kube::Error::Discovery(DiscoveryError::MissingApiGroup(_))) => {
                return Err(AgentsError::NotInstalled);
            }
            other => {
                other?;
            }
        }
        Ok(PinboardApi::new(client, namespace))
    }

    /// pinboard's API through `client`, without asking whether it is served.
    pub fn new(client: Client, namespace: &str) -> PinboardApi {
        let resource = |kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
        };
        PinboardApi {
            client,
            sets: resource(SET_KIND, crate::model::pinboard_api::SET_PLURAL),
            nodes: resource(NODE_KIND, crate::model::pinboard_api::NODE_PLURAL),
            images: resource(IMAGES_KIND, IMAGES_PLURAL),
            blobs: resource(BLOBS_KIND, BLOBS_PLURAL),
            namespace: namespace.to_string(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn sets(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.sets)
    }

    fn reports(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.nodes)
    }

    /// Creates the set or makes it exactly `set` (images, node selector, pull secrets, fan-out), after checking it
    /// as every set is checked. Returns it as stored.
    pub async fn apply_set(&self, set: &ImageSet) -> Result<PinSet, AgentsError> {
        let problems = set.validate();
        if !problems.is_empty() {
            return Err(AgentsError::Invalid {
                name: set.name.clone(),
                problems: problems.iter().map(ToString::to_string).collect(),
            });
        }
        let mut spec = json!({
            "pinnedImages": set.references().map(|name| json!({"name": name})).collect::<Vec<_>>(),
        });
        if let Some(selector) = &set.node_selector {
            spec["nodeSelector"] = serde_json::to_value(&selector.0).unwrap_or_default();
        }
        if !set.pull_secrets.is_empty() {
            spec["pullSecrets"] = set
                .pull_secrets
                .iter()
                .map(|name| json!({"name": name}))
                .collect();
        }
        if set.fan_out {
            spec["fanOut"] = json!(true);
        }
        let body = json!({
            "apiVersion": API_VERSION, "kind": SET_KIND,
            "metadata": {"name": set.name, "labels": set.labels},
            "spec": spec,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let stored = self
            .sets()
            .patch(&set.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| refused(e, "apply", "PinSets", &set.name))?;
        Ok(typed(&stored).unwrap_or_default())
    }

    /// Asks the agents of set `name`'s nodes to ask their runtimes now and answer `request` in their
    /// reports: the set's [`CHECK_REQUEST_ANNOTATION`], merged in by a field manager of its own, so that
    /// `apply` (which owns the set's spec) never takes it away and it never takes the spec.
    pub async fn ask_check(&self, name: &str, request: &str) -> Result<(), AgentsError> {
        let patch = json!({"metadata": {"annotations": {CHECK_REQUEST_ANNOTATION: request}}});
        let params = PatchParams {
            field_manager: Some(CHECK_MANAGER.into()),
            ..PatchParams::default()
        };
        self.sets()
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| refused(e, "annotate", "PinSets", name))?;
        Ok(())
    }

    /// Deletes the set: the agents release its pins; the images stay.
    pub async fn delete_set(&self, name: &str) -> Result<(), AgentsError> {
        self.sets()
            .delete(name, &DeleteParams::default())
            .await
            .map_err(|e| refused(e, "delete", "PinSets", name))?;
        Ok(())
    }

    /// Asks `node`'s agent to turn lazy pulling on or off (`spec.lazyPulling` of its report).
    pub async fn set_lazy(&self, node: &str, on: bool) -> Result<(), AgentsError> {
        let body = json!({
            "apiVersion": API_VERSION, "kind": NODE_KIND,
            "metadata": {"name": node},
            "spec": {"lazyPulling": on},
        });
        self.reports()
            .patch(
                node,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| refused(e, "write", "PinboardNodes", node))?;
        Ok(())
    }

    /// Writes `node`'s report (without its image lists: see [`Self::write_images`]). `with_object`: the
    /// object itself first (an agent's first write; after that only its status changes, so each later
    /// write is one request).
    pub async fn write_report(
        &self,
        node: &Node,
        report: &NodeReport,
        with_object: bool,
    ) -> Result<(), AgentsError> {
        let api = Api::all_with(self.client.clone(), &self.nodes);
        write_node_status(&api, NODE_KIND, node, json!(report), with_object).await
    }

    /// Writes `node`'s images, the detail of its report, as [`Self::write_report`] does the report.
    pub async fn write_images(
        &self,
        node: &Node,
        images: &NodeImages,
        with_object: bool,
    ) -> Result<(), AgentsError> {
        let api = Api::all_with(self.client.clone(), &self.images);
        write_node_status(&api, IMAGES_KIND, node, json!(images), with_object).await
    }

    /// Writes what `node`'s runtime holds, as [`Self::write_report`] does the report.
    pub async fn write_blobs(
        &self,
        node: &Node,
        blobs: &NodeBlobs,
        with_object: bool,
    ) -> Result<(), AgentsError> {
        let api = Api::all_with(self.client.clone(), &self.blobs);
        write_node_status(&api, BLOBS_KIND, node, json!(blobs), with_object).await
    }

    /// What every node's agent published of what its runtime holds, by node, listed once from the watch
    /// cache. Empty where the kind is not served (agents installed before it).
    pub async fn published_blobs(&self) -> Result<BTreeMap<String, NodeBlobs>, AgentsError> {
        match self.list_cached::<PinboardNodeBlobs>(BLOBS_PLURAL).await {
            Ok(listed) => Ok(listed
                .into_iter()
                .filter_map(|o| Some((o.metadata.name, o.status?)))
                .collect()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(BTreeMap::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// The sets, the reports (without their image lists), the Nodes and the heartbeats as the API server's
    /// watch cache has them now, each listed once: what a plan judges by, with no watch to keep.
    pub async fn snapshot(&self) -> Result<AgentsView, AgentsError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let cached = kube::api::ListParams::default().match_any();
        let (sets, reports, nodes, heartbeats) = tokio::join!(
            self.list_cached::<PinSet>(crate::model::pinboard_api::SET_PLURAL),
            self.list_cached::<PinboardNode>(crate::model::pinboard_api::NODE_PLURAL),
            nodes.list(&cached),
            self.heartbeats(),
        );
        let mut view = AgentsView::default();
        view.apply(AgentsUpdate::Sets(sets?));
        view.apply(AgentsUpdate::Reports(
            reports?.into_iter().map(Arc::new).collect(),
        ));
        let nodes = nodes?.items.iter().map(ClusterNode::from).collect();
        view.apply(AgentsUpdate::Nodes(nodes));
        view.apply(AgentsUpdate::Heartbeats(heartbeats?));
        for kind in WATCHED_KINDS {
            view.apply(AgentsUpdate::Connection(kind, Connection::Synced));
        }
        Ok(view)
    }

    /// Every `plural` object of pinboard's API, listed from the API server's watch cache (one request,
    /// not paged through etcd; a moment behind it at most), each read on its own: one that cannot be read
    /// is left out, and said.
    async fn list_cached<T: DeserializeOwned>(&self, plural: &str) -> Result<Vec<T>, kube::Error> {
        #[derive(serde::Deserialize)]
        struct Listed {
            items: Vec<serde_json::Value>,
        }
        let url = format!("/apis/{GROUP}/{VERSION}/{plural}");
        let request = kube::core::Request::new(url)
            .list(&kube::api::ListParams::default().match_any())
            .map_err(kube::Error::BuildRequest)?;
        let listed: Listed = self.client.request(request).await?;
        Ok(listed
            .items
            .into_iter()
            .filter_map(|item| {
                let name = item["metadata"]["name"].as_str().unwrap_or("?").to_owned();
                serde_json::from_value(item)
                    .inspect_err(|e| tracing::warn!("cannot read {plural}/{name}: {e}"))
                    .ok()
            })
            .collect())
    }

    /// `node`'s images, the detail of its report; None when its agent wrote none.
    pub async fn node_images(&self, node: &str) -> Result<Option<NodeImages>, AgentsError> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.images);
        Ok(api
            .get_opt(node)
            .await?
            .and_then(|o| typed::<PinboardNodeImages>(&o)?.status))
    }

    /// Each node's agent's last heartbeat, by node, listed once from the watch cache.
    pub async fn heartbeats(&self) -> Result<BTreeMap<String, Heartbeat>, AgentsError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let listed = leases
            .list(&kube::api::ListParams::default().match_any())
            .await?;
        let shared: Vec<Arc<Lease>> = listed.items.into_iter().map(Arc::new).collect();
        Ok(heartbeats_of(&shared))
    }

    /// Writes a set's summary over its nodes (the aggregating agent).
    pub async fn write_set_status(
        &self,
        name: &str,
        status: &PinSetStatus,
    ) -> Result<(), AgentsError> {
        let body = json!({
            "apiVersion": API_VERSION, "kind": SET_KIND,
            "metadata": {"name": name},
            "status": status,
        });
        let params = PatchParams::apply(AGENT_MANAGER).force();
        self.sets()
            .patch_status(name, &params, &Patch::Apply(&body))
            .await?;
        Ok(())
    }

    /// Renews `node`'s heartbeat Lease (made the first time), valid for `valid_for`.
    pub async fn renew(&self, node: &str, valid_for: Duration) -> Result<(), AgentsError> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(node), "namespace": self.namespace},
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": valid_for.as_secs().max(1),
                "renewTime": now,
            },
        });
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        leases
            .patch(
                &lease_name(node),
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        Ok(())
    }

    /// The registry credentials of pull Secret `name` in the agents' namespace (docker config JSON); None
    /// when there is no such Secret or it holds none.
    pub async fn pull_secret(&self, name: &str) -> Result<Option<String>, AgentsError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(secret) = secrets.get_opt(name).await? else {
            return Ok(None);
        };
        let data = secret.data.unwrap_or_default();
        Ok([".dockerconfigjson", ".dockercfg"]
            .iter()
            .find_map(|key| data.get(*key))
            .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned()))
    }

    /// Node `name`, as the API server has it.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, AgentsError> {
        Ok(Api::<Node>::all(self.client.clone()).get_opt(name).await?)
    }

    /// Removes the taints with `key` from Node `name`, and only those: a patch of the taints it read, at the
    /// resourceVersion it read them at, so a taint another writer changed meanwhile is never lost (the write
    /// fails with a conflict instead, and is tried again). Nothing is written when there is no such taint.
    pub async fn remove_taint(&self, name: &str, key: &str) -> Result<(), AgentsError> {
        let nodes = Api::<Node>::all(self.client.clone());
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(());
        };
        let version = node.metadata.resource_version.clone();
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        if !taints.iter().any(|t| t.key == key) {
            return Ok(());
        }
        let kept: Vec<_> = taints.iter().filter(|t| t.key != key).collect();
        let patch = json!({
            "metadata": {"resourceVersion": version},
            "spec": {"taints": kept},
        });
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Watches every set, report, Node, heartbeat and agents' DaemonSet: what the aggregating agent
    /// follows; with `images`, the reports' detail too (every node's images: what the commands judge and
    /// plan by). Each list is read from etcd, so a command judges what was written before it started.
    pub fn watch_all(&self, images: bool) -> AgentsWatch {
        let mut watch = self.watch(watcher::Config::default(), None);
        if images {
            watch
                .tasks
                .push(self.spawn_images(watch.sender.clone(), watcher::Config::default()));
        }
        watch
    }

    /// [`Self::watch_all`] without the images, for the screens: each first list from the API server's
    /// watch cache (`resourceVersion=0`, not paged through etcd: 2.7 times faster for 5,000 reports in
    /// the lab), a moment behind etcd at most, which the watch then catches up on.
    pub fn watch_screens(&self) -> AgentsWatch {
        self.watch(watcher::Config::default().any_semantic(), None)
    }

    /// Watches the reports' detail only, first listed from the watch cache: what the TUI adds once a
    /// screen needs every node's images.
    pub fn watch_images(&self) -> AgentsWatch {
        let (sender, updates) = mpsc::channel(CHANNEL);
        let from_cache = watcher::Config::default().any_semantic();
        AgentsWatch {
            tasks: vec![self.spawn_images(sender.clone(), from_cache)],
            sender,
            updates,
        }
    }

    fn spawn_images(
        &self,
        tx: mpsc::Sender<AgentsUpdate>,
        config: watcher::Config,
    ) -> JoinHandle<()> {
        let mut views = TypedCache::<PinboardNodeImages>::default();
        spawn(
            IMAGES_KIND,
            Api::all_with(self.client.clone(), &self.images),
            config,
            Writer::new(self.images.clone()),
            move |objects: &Snapshot<DynamicObject>| AgentsUpdate::Images(views.all(objects)),
            AgentsUpdate::Connection,
            tx,
        )
    }

    /// Watches every set, and only `node`'s Node and report: what one agent follows.
    pub fn watch_node(&self, node: &str) -> AgentsWatch {
        self.watch(watcher::Config::default(), Some(node))
    }

    /// Watches with `config` every set, and every report and Node (only `node`'s, when named) and, when
    /// no node is named, every heartbeat and the agents' DaemonSets.
    fn watch(&self, config: watcher::Config, node: Option<&str>) -> AgentsWatch {
        let nodes = match node {
            Some(node) => config.clone().fields(&format!("metadata.name={node}")),
            None => config.clone(),
        };
        let (tx, updates) = mpsc::channel(CHANNEL);
        let client = &self.client;
        let mut set_views = TypedCache::<PinSet>::default();
        let mut report_views = TypedCache::<PinboardNode>::default();
        let [set_kind, report_kind, node_kind, lease_kind, daemonset_kind] = WATCHED_KINDS;
        let mut tasks = vec![
            spawn(
                set_kind,
                Api::all_with(client.clone(), &self.sets),
                config.clone(),
                Writer::new(self.sets.clone()),
                move |objects: &Snapshot<DynamicObject>| {
                    AgentsUpdate::Sets(set_views.owned(objects))
                },
                AgentsUpdate::Connection,
                tx.clone(),
            ),
            spawn(
                report_kind,
                Api::all_with(client.clone(), &self.nodes),
                nodes.clone(),
                Writer::new(self.nodes.clone()),
                move |objects: &Snapshot<DynamicObject>| {
                    AgentsUpdate::Reports(report_views.all(objects))
                },
                AgentsUpdate::Connection,
                tx.clone(),
            ),
            spawn(
                node_kind,
                Api::<Node>::all(client.clone()),
                nodes,
                Writer::default(),
                |nodes: &Snapshot<Node>| {
                    AgentsUpdate::Nodes(
                        nodes
                            .iter()
                            .map(|n| ClusterNode::from(n.as_ref()))
                            .collect(),
                    )
                },
                AgentsUpdate::Connection,
                tx.clone(),
            ),
        ];
        if node.is_none() {
            tasks.push(spawn(
                lease_kind,
                Api::<Lease>::namespaced(client.clone(), &self.namespace),
                config.clone(),
                Writer::default(),
                |leases: &Snapshot<Lease>| AgentsUpdate::Heartbeats(heartbeats_of(leases)),
                AgentsUpdate::Connection,
                tx.clone(),
            ));
            let namespace = self.namespace.clone();
            tasks.push(spawn(
                daemonset_kind,
                Api::<DaemonSet>::namespaced(client.clone(), &self.namespace),
                config.labels(AGENTS_DAEMONSET_LABEL),
                Writer::default(),
                move |daemonsets: &Snapshot<DaemonSet>| {
                    AgentsUpdate::DaemonSets(AgentDaemonSets {
                        namespace: namespace.clone(),
                        listed: daemonsets
                            .iter()
                            .map(|d| AgentDaemonSet::from(d.as_ref()))
                            .collect(),
                    })
                },
                AgentsUpdate::Connection,
                tx.clone(),
            ));
        }
        AgentsWatch {
            updates,
            sender: tx,
            tasks,
        }
    }
}

/// Writes `status` into `node`'s object of `kind`: with `with_object`, the object first (owned by its Node,
/// so it goes with it).
async fn write_node_status(
    api: &Api<DynamicObject>,
    kind: &str,
    node: &Node,
    status: serde_json::Value,
    with_object: bool,
) -> Result<(), AgentsError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let params = PatchParams::apply(AGENT_MANAGER).force();
    if with_object {
        let owner = json!({
            "apiVersion": "v1", "kind": "Node", "name": name,
            "uid": node.metadata.uid.clone().unwrap_or_default(),
        });
        let object = json!({
            "apiVersion": API_VERSION, "kind": kind,
            "metadata": {"name": name, "ownerReferences": [owner]},
        });
        api.patch(&name, &params, &Patch::Apply(&object)).await?;
    }
    let status = json!({
        "apiVersion": API_VERSION, "kind": kind,
        "metadata": {"name": name},
        "status": status,
    });
    api.patch_status(&name, &params, &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// Each node's agent's last heartbeat, by node (its Lease's `holderIdentity`).
fn heartbeats_of(leases: &Snapshot<Lease>) -> BTreeMap<String, Heartbeat> {
    leases
        .iter()
        .filter(|lease| {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            spec_node(lease).is_some_and(|node| lease_name(node) == name)
        })
        .filter_map(|lease| {
            let spec = lease.spec.as_ref()?;
            let renewed = spec.renew_time.as_ref()?.0;
            let heartbeat = Heartbeat {
                renewed: SystemTime::UNIX_EPOCH
                    + Duration::from_nanos(u64::try_from(renewed.as_nanosecond()).ok()?),
                valid_for: Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?),
            };
            Some((spec_node(lease)?.to_owned(), heartbeat))
        })
        .collect()
}

fn spec_node(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// A write's error, with 403 and 404 told plainly.
fn refused(error: kube::Error, verb: &'static str, what: &'static str, name: &str) -> AgentsError {
    match &error {
        kube::Error::Api(status) if status.code == 403 => AgentsError::ReadOnly {
            verb,
            what,
            message: status.message.clone(),
        },
        kube::Error::Api(status) if status.code == 404 => AgentsError::NoSuchSet(name.to_owned()),
        _ => AgentsError::Api(error),
    }
}

/// The Lease whose holder sums the sets up.
const AGGREGATOR_LEASE: &str = "pinboard-aggregator";

/// The in-cluster cache as its Lease publishes it, while its holder's heartbeat is fresh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheLease {
    /// `http://NODE-IP:PORT`
    pub address: String,
    /// The fan-out sets it serves, with their generation.
    pub sets: BTreeMap<String, i64>,
}

impl PinboardApi {
    /// Takes or keeps the aggregator's Lease for `holder`: true when `holder` holds it now.
    pub async fn lead(&self, holder: &str) -> Result<bool, AgentsError> {
        self.hold(AGGREGATOR_LEASE, holder, BTreeMap::new()).await
    }

    /// Takes or keeps the in-cluster cache's Lease for `holder`, publishing where it serves and which sets'
    /// generations: true when `holder` holds it now.
    pub async fn lead_cache(
        &self,
        holder: &str,
        published: &CacheLease,
    ) -> Result<bool, AgentsError> {
        let sets: Vec<String> = published
            .sets
            .iter()
            .map(|(name, generation)| format!("{name}={generation}"))
            .collect();
        let annotations = BTreeMap::from([
            (
                CACHE_ADDRESS_ANNOTATION.to_string(),
                published.address.clone(),
            ),
            (CACHE_SETS_ANNOTATION.to_string(), sets.join(",")),
        ]);
        self.hold(CACHE_LEASE, holder, annotations).await
    }

    /// The in-cluster cache, when some agent holds its Lease and renews it.
    pub async fn cache_lease(&self) -> Result<Option<CacheLease>, AgentsError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(lease) = leases.get_opt(CACHE_LEASE).await? else {
            return Ok(None);
        };
        let fresh = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .is_some_and(|at| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(at.0)
                    .as_secs_f64()
                    <= crate::model::pinboard_api::STALE_AFTER.as_secs_f64()
            });
        let annotations = lease.metadata.annotations.unwrap_or_default();
        let Some(address) = annotations.get(CACHE_ADDRESS_ANNOTATION).filter(|_| fresh) else {
            return Ok(None);
        };
        let sets = annotations
            .get(CACHE_SETS_ANNOTATION)
            .into_iter()
            .flat_map(|sets| sets.split(','))
            .filter_map(|entry| entry.split_once('='))
            .filter_map(|(name, generation)| Some((name.to_string(), generation.parse().ok()?)))
            .collect();
        Ok(Some(CacheLease {
            address: address.clone(),
            sets,
        }))
    }

    /// The in-cluster cache's token, from its Secret; with `create`, a new random one is stored first when
    /// there is none (the first holder does this). None when there is none and `create` is false.
    pub async fn cache_token(&self, create: bool) -> Result<Option<CacheToken>, AgentsError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let stored = |secret: &Secret| {
            let value = secret.data.as_ref()?.get(CACHE_TOKEN_KEY)?;
            CacheToken::new(String::from_utf8_lossy(&value.0))
        };
        if let Some(secret) = secrets.get_opt(CACHE_TOKEN_SECRET).await? {
            return Ok(stored(&secret));
        }
        if !create {
            return Ok(None);
        }
        let mut random = [0u8; 32];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut random)?;
        let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let mut secret = Secret::default();
        secret.metadata.name = Some(CACHE_TOKEN_SECRET.into());
        secret.metadata.namespace = Some(self.namespace.clone());
        secret.string_data = Some(BTreeMap::from([(CACHE_TOKEN_KEY.to_string(), token)]));
        match secrets.create(&Default::default(), &secret).await {
            Ok(created) => Ok(stored(&created)),
            // Another holder made it first: theirs is the one.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(secrets
                .get_opt(CACHE_TOKEN_SECRET)
                .await?
                .as_ref()
                .and_then(stored)),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes or keeps Lease `name` for `holder`, with `annotations` set: true when `holder` holds it now.
    /// It is taken when nobody holds it or its holder let it lapse
    /// ([`crate::model::pinboard_api::STALE_AFTER`]); two agents racing for it are told apart by the API
    /// server's resource version.
    async fn hold(
        &self,
        name: &str,
        holder: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<bool, AgentsError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut lease = match leases.get_opt(name).await? {
            Some(lease) => lease,
            None => {
                let mut lease = Lease::default();
                lease.metadata.name = Some(name.into());
                lease.metadata.namespace = Some(self.namespace.clone());
                match leases.create(&Default::default(), &lease).await {
                    Ok(created) => created,
                    Err(kube::Error::Api(status)) if status.code == 409 => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let spec = lease.spec.get_or_insert_default();
        let mine = spec.holder_identity.as_deref() == Some(holder);
        let lapsed = spec.renew_time.as_ref().is_none_or(|at| {
            now.duration_since(at.0).as_secs_f64()
                > crate::model::pinboard_api::STALE_AFTER.as_secs_f64()
        });
        if !mine && !lapsed {
            return Ok(false);
        }
        spec.holder_identity = Some(holder.to_string());
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds =
            Some(crate::model::pinboard_api::STALE_AFTER.as_secs() as i32);
        if !annotations.is_empty() {
            lease
                .metadata
                .annotations
                .get_or_insert_default()
                .extend(annotations);
        }
        match leases.replace(name, &Default::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

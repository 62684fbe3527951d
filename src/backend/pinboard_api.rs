//! pinboard's own API on a Kubernetes cluster ([`crate::model::pinboard_api`]): finding it, writing sets
//! (server-side apply, field manager `pinboard`), the agents' reports and set summaries (field manager
//! `pinboard-agent`, status subresources), their heartbeat Leases, a node's lazy-pull wish, reading pull
//! Secrets, and watching it all (never polling: [`crate::backend::kube_watch`]). An agent watches the sets
//! and only its own Node and report, so 5,000 agents do not each watch 5,000 nodes.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::error::DiscoveryError;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::{Client, discovery};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::kube_watch::{Snapshot, TypedCache, spawn, typed};
use crate::error::Failure;
use crate::model::agents_view::AgentsUpdate;
use crate::model::machine_config::ClusterNode;
use crate::model::pinboard_api::{
    AGENT_MANAGER, API_VERSION, GROUP, Heartbeat, NODE_KIND, NodeReport, PinSet, PinSetStatus,
    PinboardNode, SET_KIND, VERSION, lease_name,
};
use crate::model::set::ImageSet;

/// The field manager of what the commands write.
pub const FIELD_MANAGER: &str = "pinboard";
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
    /// Where the agents run: their Leases and the pull Secrets.
    namespace: String,
}

/// The running watchers; dropping it stops them.
pub struct AgentsWatch {
    pub updates: mpsc::Receiver<AgentsUpdate>,
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

    /// Creates the set or makes it exactly `set` (images, node selector, pull secrets), after checking it
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

    /// Writes `node`'s report: the object (owned by its Node, so it goes with it), then its status.
    /// `with_object`: the object itself first (an agent's first write; after that only its status changes,
    /// so each later write is one request).
    pub async fn write_report(
        &self,
        node: &Node,
        report: &NodeReport,
        with_object: bool,
    ) -> Result<(), AgentsError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(AGENT_MANAGER).force();
        let reports = self.reports();
        if with_object {
            let owner = json!({
                "apiVersion": "v1", "kind": "Node", "name": name,
                "uid": node.metadata.uid.clone().unwrap_or_default(),
            });
            let object = json!({
                "apiVersion": API_VERSION, "kind": NODE_KIND,
                "metadata": {"name": name, "ownerReferences": [owner]},
            });
            reports
                .patch(&name, &params, &Patch::Apply(&object))
                .await?;
        }
        let status = json!({
            "apiVersion": API_VERSION, "kind": NODE_KIND,
            "metadata": {"name": name},
            "status": report,
        });
        reports
            .patch_status(&name, &params, &Patch::Apply(&status))
            .await?;
        Ok(())
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

    /// Watches every set, report, Node and heartbeat: what the commands, the TUI and the aggregating
    /// agent follow.
    pub fn watch_all(&self) -> AgentsWatch {
        self.watch(watcher::Config::default(), true)
    }

    /// Watches every set, and only `node`'s Node and report: what one agent follows.
    pub fn watch_node(&self, node: &str) -> AgentsWatch {
        let named = watcher::Config::default().fields(&format!("metadata.name={node}"));
        self.watch(named, false)
    }

    fn watch(&self, nodes: watcher::Config, heartbeats: bool) -> AgentsWatch {
        let (tx, updates) = mpsc::channel(CHANNEL);
        let client = &self.client;
        let mut set_views = TypedCache::<PinSet>::default();
        let mut report_views = TypedCache::<PinboardNode>::default();
        let mut tasks = vec![
            spawn(
                "PinSet",
                Api::all_with(client.clone(), &self.sets),
                watcher::Config::default(),
                Writer::new(self.sets.clone()),
                move |objects: &Snapshot<DynamicObject>| {
                    AgentsUpdate::Sets(set_views.owned(objects))
                },
                AgentsUpdate::Connection,
                tx.clone(),
            ),
            spawn(
                "PinboardNode",
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
                "Node",
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
        if heartbeats {
            tasks.push(spawn(
                "Lease",
                Api::<Lease>::namespaced(client.clone(), &self.namespace),
                watcher::Config::default(),
                Writer::default(),
                |leases: &Snapshot<Lease>| AgentsUpdate::Heartbeats(heartbeats_of(leases)),
                AgentsUpdate::Connection,
                tx,
            ));
        }
        AgentsWatch { updates, tasks }
    }
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

impl PinboardApi {
    /// Takes or keeps the aggregator's Lease for `holder`: true when `holder` holds it now. It is taken
    /// when nobody holds it or its holder let it lapse ([`crate::model::pinboard_api::STALE_AFTER`]); two
    /// agents racing for it are told apart by the API server's resource version.
    pub async fn lead(&self, holder: &str) -> Result<bool, AgentsError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut lease = match leases.get_opt(AGGREGATOR_LEASE).await? {
            Some(lease) => lease,
            None => {
                let mut lease = Lease::default();
                lease.metadata.name = Some(AGGREGATOR_LEASE.into());
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
        match leases
            .replace(AGGREGATOR_LEASE, &Default::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

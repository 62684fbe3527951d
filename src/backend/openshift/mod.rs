//! OpenShift's API: its machine-config objects, its pull secret and its mirror sets, reached through a
//! kubeconfig.
//!
//! [`connect`] builds a client (`--kubeconfig`, `--context`, `KUBECONFIG`, `~/.kube/config`, or in-cluster),
//! [`Cluster::discover`] finds which versions of the machine-config kinds the cluster serves (`v1`, else
//! `v1alpha1`) and tells a plain Kubernetes cluster plainly, [`watch`] keeps a
//! [`ClusterView`](crate::model::machine_config::ClusterView) current without polling, and [`Cluster::apply_set`] /
//! [`Cluster::delete_set`] write PinnedImageSets with server-side apply (field manager `pinboard`),
//! [`Cluster::observe`] gathers what the planner needs about nodes, and [`Cluster::pull_secret`] reads the
//! registry credentials the nodes pull with.

use crate::backend::kube_watch::typed;

mod facts;
pub mod mirror_sets;
pub mod pull_secret;
mod sets;
mod watch;

use kube::core::ApiResource;
use kube::error::DiscoveryError;
use kube::{Client, discovery};

use crate::error::Failure;
use crate::model::set::{API_GROUP, Problem};

pub use watch::{Watch, watch};

use crate::backend::kube::ConnectError;
pub use crate::backend::kube::{ConnectOptions, connect};

/// Why cluster mode could not do what was asked; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConnectError),
    #[error(
        "this cluster serves no {API_GROUP} API: it is plain Kubernetes, not OpenShift, so it has no \
         PinnedImageSets; use direct mode instead: --cri NODE=unix:///run/containerd/containerd.sock \
         (one --cri per node)"
    )]
    NotOpenShift,
    #[error(
        "this cluster serves {API_GROUP} but not {0} (PinnedImageSets need OpenShift 4.19, or 4.16+ with \
         TechPreviewNoUpgrade); use direct mode (--cri) instead"
    )]
    MissingKind(&'static str),
    #[error(
        "read-only: your account may not {verb} PinnedImageSets (ClusterRole pinboard-operator needed): \
         {message}"
    )]
    ReadOnly { verb: &'static str, message: String },
    #[error("there is no PinnedImageSet {0:?} on the cluster")]
    NoSuchSet(String),
    #[error("set {name:?} would be refused: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid {
        name: String,
        problems: Vec<Problem>,
    },
    #[error("the API server failed: {0}")]
    Api(#[from] kube::Error),
}

impl From<ClusterError> for Failure {
    /// An API server that does not answer (or fails) is unreachable (exit 3); everything else is the
    /// input's or the account's to fix (exit 2).
    fn from(error: ClusterError) -> Failure {
        let unreachable = match &error {
            ClusterError::Api(kube::Error::Api(status)) => status.code >= 500,
            ClusterError::Api(_) => true,
            _ => false,
        };
        if unreachable {
            Failure::unreachable(vec![format!(
                "cannot reach the API server: {error}; check the kubeconfig's server and your network"
            )])
        } else {
            Failure::bad_input(error.to_string())
        }
    }
}

/// The API resources of the machine-config kinds, as this cluster serves them.
#[derive(Clone, Debug)]
pub struct Resources {
    pub pinned_image_set: ApiResource,
    pub pool: ApiResource,
    pub machine_config_node: ApiResource,
    pub runtime_config: ApiResource,
}

/// A connected cluster whose machine-config kinds are known.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    resources: Resources,
}

impl Cluster {
    /// Finds the machine-config kinds, each at `v1` if served, else `v1alpha1`.
    pub async fn discover(client: Client) -> Result<Cluster, ClusterError> {
        let group = match discovery::group(&client, API_GROUP).await {
            Err(kube::Error::Discovery(DiscoveryError::MissingApiGroup(_))) => {
                return Err(ClusterError::NotOpenShift);
            }
            other => other?,
        };
        let find = |kind: &'static str| {
            ["v1", "v1alpha1"]
                .iter()
                .find_map(|version| {
                    group
                        .versioned_resources(version)
                        .into_iter()
                        .find(|(resource, _)| resource.kind == kind)
                })
                .map(|(resource, _)| resource)
                .ok_or(ClusterError::MissingKind(kind))
        };
        let resources = Resources {
            pinned_image_set: find("PinnedImageSet")?,
            pool: find("MachineConfigPool")?,
            machine_config_node: find("MachineConfigNode")?,
            runtime_config: find("ContainerRuntimeConfig")?,
        };
        Ok(Cluster { client, resources })
    }

    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

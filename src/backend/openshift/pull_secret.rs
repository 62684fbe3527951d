//! The cluster's global pull secret, `openshift-config/pull-secret`: the registry credentials every node of
//! an OpenShift cluster pulls with (the machine-config operator writes it to the nodes'
//! `/var/lib/kubelet/config.json`), so a plan in cluster mode can read what the nodes will be able to pull.
//! Reading it needs `get` on that one Secret (the Role `pinboard-pull-secret` in deploy/rbac.yaml); without
//! it, the caller is told what to grant. The secret's content never reaches a log or a message.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use super::{Cluster, ClusterError};

pub const PULL_SECRET_NAMESPACE: &str = "openshift-config";
pub const PULL_SECRET_NAME: &str = "pull-secret";
/// The secret's key holding a docker config (`{"auths": {...}}`).
const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// What reading the pull secret found.
pub enum PullSecret {
    /// The docker config JSON.
    Found(String),
    /// This account may not read it: the API server's message.
    Forbidden(String),
    /// The cluster has no such secret, or it holds no docker config.
    Missing(String),
}

impl Cluster {
    /// [`read`] with this cluster's client.
    pub async fn pull_secret(&self) -> Result<PullSecret, ClusterError> {
        read(&self.client).await
    }
}

/// Reads `openshift-config/pull-secret`. Only errors other than "forbidden" and "not found" fail.
pub async fn read(client: &Client) -> Result<PullSecret, ClusterError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), PULL_SECRET_NAMESPACE);
    let secret = match secrets.get_opt(PULL_SECRET_NAME).await {
        Ok(Some(secret)) => secret,
        Ok(None) => return Ok(PullSecret::Missing("the cluster has none".into())),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Ok(PullSecret::Forbidden(status.message));
        }
        Err(e) => return Err(ClusterError::Api(e)),
    };
    let config = secret
        .data
        .and_then(|mut data| data.remove(DOCKER_CONFIG_KEY))
        .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned());
    Ok(match config {
        Some(config) => PullSecret::Found(config),
        None => PullSecret::Missing(format!("it has no {DOCKER_CONFIG_KEY} key")),
    })
}

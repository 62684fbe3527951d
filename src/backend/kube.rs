//! Reaching a Kubernetes API server: a client from `--kubeconfig` and `--context`, else from the
//! environment (`KUBECONFIG`, `~/.kube/config`, or the pod's service account, in-cluster).

use std::path::PathBuf;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where the kubeconfig comes from: `--kubeconfig` and `--context`; both `None` means `KUBECONFIG`, then
/// `~/.kube/config`, then the pod's service account.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "cannot load a kubeconfig: {0}; pass --kubeconfig FILE (and --context NAME) or set KUBECONFIG"
    )]
    Config(String),
}

/// A client from the kubeconfig `options` name, else from the environment (kubeconfig, then in-cluster).
pub async fn connect(options: &ConnectOptions) -> Result<Client, ConnectError> {
    let config_error = |e: &dyn std::error::Error| ConnectError::Config(e.to_string());
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&options.kubeconfig, &options.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| config_error(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                .await
                .map_err(|e| config_error(&e))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&kube_options)
            .await
            .map_err(|e| config_error(&e))?,
        (None, None) => kube::Config::infer().await.map_err(|e| config_error(&e))?,
    };
    if config.accept_invalid_certs {
        tracing::warn!(
            "the kubeconfig turns off TLS verification of the API server {} (insecure-skip-tls-verify)",
            config.cluster_url
        );
    }
    Client::try_from(config).map_err(|e| ConnectError::Config(e.to_string()))
}

impl From<ConnectError> for crate::error::Failure {
    /// A kubeconfig that cannot be loaded is the input's to fix (exit 2).
    fn from(error: ConnectError) -> crate::error::Failure {
        crate::error::Failure::bad_input(error.to_string())
    }
}

//! The registry client of an OpenShift fleet: without `--authfile` or `--no-pull-secret`, the cluster's
//! global pull secret comes first (what the nodes pull with), then the default auth files; the cluster's
//! ImageDigestMirrorSets and ImageContentSourcePolicies are followed as well as the local mirror rules.

use crate::backend::credentials::{AuthFiles, Credentials};
use crate::backend::openshift::pull_secret::{
    self, PULL_SECRET_NAME, PULL_SECRET_NAMESPACE, PullSecret,
};
use crate::backend::registry::{Registry, RegistryOptions};
use crate::error::Failure;

/// How the registry client is made, as the command line says.
#[derive(Clone, Debug, Default)]
pub struct RegistrySettings {
    /// With the local mirror rules; the cluster's mirror sets are added to them.
    pub options: RegistryOptions,
    /// `--no-pull-secret`.
    pub no_pull_secret: bool,
}

/// The client, and warnings that say what could not be used, why, and what to grant.
pub async fn client(
    settings: &RegistrySettings,
    cluster: &kube::Client,
) -> Result<(Registry, Vec<String>), Failure> {
    let bad_input = |e: &dyn std::fmt::Display| Failure::bad_input(e.to_string());
    let authfile = settings.options.authfile.clone();
    let files =
        Credentials::load(&AuthFiles::from_env(authfile.clone())).map_err(|e| bad_input(&e))?;
    let (credentials, warning) = if authfile.is_some() || settings.no_pull_secret {
        (files, None)
    } else {
        let secret = format!("{PULL_SECRET_NAMESPACE}/{PULL_SECRET_NAME}");
        let cannot = |why: String| {
            format!(
                "cannot use the cluster's pull secret {secret}: {why}; images that need its credentials \
                 will be refused. Grant `get` on it with the Role pinboard-pull-secret in deploy/rbac.yaml \
                 (bound in {PULL_SECRET_NAMESPACE}), or pass --authfile FILE (--no-pull-secret stops this \
                 warning)"
            )
        };
        match pull_secret::read(cluster).await {
            Ok(PullSecret::Found(text)) => {
                match Credentials::from_text(format!("secret {secret}"), &text) {
                    Ok(from_secret) => (from_secret.then(files), None),
                    Err(e) => (files, Some(cannot(e.to_string()))),
                }
            }
            Ok(PullSecret::Forbidden(message)) => {
                (files, Some(cannot(format!("forbidden ({message})"))))
            }
            Ok(PullSecret::Missing(why)) => {
                tracing::debug!(secret, why, "no cluster pull secret");
                (files, None)
            }
            Err(e) => (files, Some(cannot(e.to_string()))),
        }
    };
    let mirror_sets = crate::backend::openshift::mirror_sets::read(cluster).await;
    let mut options = settings.options.clone();
    for documents in &mirror_sets.documents {
        options
            .mirrors
            .add_mirror_sets(documents, "the cluster's mirror sets")?;
    }
    let registry = Registry::with_credentials(options, credentials).map_err(|e| bad_input(&e))?;
    let warnings = warning.into_iter().chain(mirror_sets.warnings).collect();
    Ok((registry, warnings))
}

//! Reaching a registry: its client (its `/v2/` asked once), the access to a repository (the credential
//! looked up and exchanged for a token once per repository), failures logged, and registries that could
//! not be reached remembered for a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Registry;
use super::error::{Context, RegistryError, map_error, timeout_error};
use crate::backend::credentials::Credential;
use crate::backend::distribution::{Access, Host};
use crate::model::reference::ImageRef;

/// How long an unreachable registry is answered from memory before it is tried again.
const DOWN_FOR: Duration = Duration::from_secs(10);

/// The access to one repository, and how to describe its credential in messages.
pub(super) struct AuthState {
    pub(super) access: Access,
    pub(super) described: String,
    /// Where the credential came from; None when none was found.
    pub(super) source: Option<String>,
}

impl Registry {
    /// The registry's client, its `/v2/` asked once.
    pub(super) async fn host(
        &self,
        registry: &str,
        label: &str,
    ) -> Result<Arc<Host>, RegistryError> {
        self.check_down(registry, label)?;
        let context = self.context(label, registry, "", None);
        let started = Instant::now();
        let outcome = {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            tokio::time::timeout(self.timeout, self.distribution.host(registry)).await
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(Ok(host)) => Ok(host),
            Ok(Err(e)) => Err(self.failed(map_error(e, &context), elapsed_ms)),
            Err(_) => Err(self.failed(timeout_error(&context), elapsed_ms)),
        }
    }

    /// The access to the reference's repository: its credential looked up and (if the registry wants
    /// tokens) exchanged once per repository, again when the token runs out.
    pub(super) async fn auth(
        &self,
        host: &Host,
        reference: &ImageRef,
        label: &str,
    ) -> Result<Arc<AuthState>, RegistryError> {
        let registry = reference.registry.as_str();
        let key = format!("{registry}/{}", reference.repository);
        let cell = {
            let mut auths = self.auths.lock().expect("auth lock");
            let cell = auths.entry(key).or_default();
            if cell.get().is_some_and(|state| state.access.expired()) {
                *cell = Arc::default();
            }
            cell.clone()
        };
        cell.get_or_try_init(|| async {
            let credentials = Arc::clone(&self.credentials);
            let (lookup_registry, repository) =
                (registry.to_string(), reference.repository.clone());
            let found = tokio::task::spawn_blocking(move || {
                credentials.lookup(&lookup_registry, &repository)
            })
            .await
            .map_err(|e| RegistryError::Setup {
                cause: format!("credential lookup failed: {e}"),
            })??;
            let source = found.as_ref().map(|found| found.source.to_string());
            let (credential, described) = match found {
                Some(found) => (
                    found.credential,
                    format!("with the credentials from {}", found.source),
                ),
                None => (Credential::Anonymous, self.no_credentials()),
            };
            let context = self.context(label, registry, &described, Some(host));
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let started = Instant::now();
            let outcome = tokio::time::timeout(
                self.timeout,
                self.distribution
                    .access(host, &reference.repository, &credential),
            )
            .await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let access = match outcome {
                // The token itself is never logged.
                Ok(Ok(access)) => access,
                Ok(Err(e)) => return Err(self.failed(map_error(e, &context), elapsed_ms)),
                Err(_) => return Err(self.failed(timeout_error(&context), elapsed_ms)),
            };
            tracing::debug!(
                registry,
                repository = reference.repository,
                elapsed_ms,
                credential = %credential,
                authorized = access.authorized(),
                "repository access"
            );
            Ok(Arc::new(AuthState {
                access,
                described,
                source,
            }))
        })
        .await
        .cloned()
    }

    /// "no credentials found for it", and in which files none was.
    fn no_credentials(&self) -> String {
        let files = self.credentials.files();
        if files.is_empty() {
            "no credentials found for it: no auth file was found".into()
        } else {
            let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            format!("no credentials found for it in {}", files.join(", "))
        }
    }

    /// Drops what authorizes the reference's repository, so the next request asks again.
    pub(super) fn forget_auth(&self, reference: &ImageRef) {
        let key = format!("{}/{}", reference.registry, reference.repository);
        self.auths.lock().expect("auth lock").remove(&key);
    }

    pub(super) fn context<'a>(
        &'a self,
        label: &'a str,
        registry: &'a str,
        credentials: &'a str,
        host: Option<&'a Host>,
    ) -> Context<'a> {
        Context {
            label,
            registry,
            insecure: self.distribution.is_insecure(registry),
            credentials,
            timeout: self.timeout,
            certs: self.distribution.certs(),
            host,
        }
    }

    /// Logs a failed request, and remembers a registry that could not be reached.
    pub(super) fn failed(&self, error: RegistryError, elapsed_ms: u64) -> RegistryError {
        tracing::debug!(elapsed_ms, error = %error, "registry request failed");
        if let RegistryError::Unreachable { registry, .. }
        | RegistryError::Timeout { registry, .. } = &error
        {
            self.down
                .lock()
                .expect("down lock")
                .insert(registry.clone(), (error.clone(), Instant::now()));
        }
        error
    }

    pub(super) fn check_down(&self, registry: &str, label: &str) -> Result<(), RegistryError> {
        let mut down = self.down.lock().expect("down lock");
        match down.get(registry) {
            Some((error, since)) if since.elapsed() < DOWN_FOR => {
                Err(error.clone().for_reference(label))
            }
            Some(_) => {
                down.remove(registry);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

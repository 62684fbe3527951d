//! Which credential goes to the runtime with a pull, and what to tell the operator when the registry
//! refuses it.

use crate::backend::credentials::{Credential, Credentials, CredentialsError, Found};
use crate::model::reference::{ImageRef, ReferenceError};
use crate::model::runtime::RuntimeKind;

/// Why the credential for an image could not be known.
#[derive(Debug, thiserror::Error)]
pub(super) enum CredentialError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// The credential for the image's registry and repository (None: anonymous).
pub(super) fn find_credential(
    credentials: &Credentials,
    image: &str,
) -> Result<Option<Found>, CredentialError> {
    let reference = ImageRef::parse(image)?;
    Ok(credentials.lookup(&reference.registry, &reference.repository)?)
}

/// For a refused pull: which credential went to the node, and what its runtime (None: one pinboard does
/// not know) does with that kind.
pub(super) fn sent_credential(runtime: Option<RuntimeKind>, found: Option<&Found>) -> String {
    let Some(found) = found.filter(|f| f.credential != Credential::Anonymous) else {
        return "pinboard found no credentials for it in the auth files and pulled anonymously; \
                pass --authfile or log in with podman login"
            .into();
    };
    let sent = format!(
        "pinboard sent the {} from {}",
        found.credential, found.source
    );
    let ignored = match (&found.credential, runtime) {
        (Credential::IdentityToken(_), Some(RuntimeKind::Crio)) => {
            Some("CRI-O takes only a user name and password")
        }
        (Credential::RegistryToken(_), _) => Some("runtimes do not use registry tokens yet"),
        _ => None,
    };
    match ignored {
        Some(why) => format!(
            "{sent}, but {why} from CRI: put a user name and password for the registry in the auth file, \
             or in the node's own (/var/lib/kubelet/config.json)"
        ),
        None => format!("{sent}; the registry refused it: log in again or check its access"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_pull_says_which_credential_went_and_what_the_runtime_makes_of_it() {
        let credentials = Credentials::from_text(
            "/auth.json",
            r#"{"auths": {"quay.io": {"auth": "dTpw"}, "ghcr.io": {"identitytoken": "tok"},
                          "reg.example.com": {"registrytoken": "rt"}}}"#,
        )
        .unwrap();
        let note = |runtime: RuntimeKind, image: &str| {
            let found = find_credential(&credentials, image).unwrap();
            sent_credential(Some(runtime), found.as_ref())
        };
        assert_eq!(
            note(RuntimeKind::Containerd, "quay.io/org/app@sha256:1"),
            "pinboard sent the user \"u\" from entry \"quay.io\" of /auth.json; the registry refused it: \
             log in again or check its access"
        );
        assert!(
            note(RuntimeKind::Containerd, "ghcr.io/org/app:1")
                .ends_with("the registry refused it: log in again or check its access")
        );
        assert!(
            note(RuntimeKind::Crio, "ghcr.io/org/app:1")
                .contains("identity token from entry \"ghcr.io\" of /auth.json, but CRI-O takes only a user name and password")
        );
        assert!(
            note(RuntimeKind::Containerd, "reg.example.com/app:1")
                .contains("runtimes do not use registry tokens yet")
        );
        assert!(
            note(RuntimeKind::Containerd, "other.example.com/app:1")
                .starts_with("pinboard found no credentials")
        );
    }
}

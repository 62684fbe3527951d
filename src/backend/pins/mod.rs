//! Writing pins on a node, the two ways runtimes enforce them, each with a record of which sets hold each
//! pin ([`crate::model::holders`]) kept on the node itself, so any pinboard on any machine sees the same:
//!
//! - [`crio`]: CRI-O's `pinned_images` in the one drop-in `50-pinned-images`, each entry marked with the
//!   sets holding it, then a reload or a restart.
//! - [`containerd`]: the label `io.cri-containerd.pinned=pinned` on every image record of the image, and
//!   one label per holding set, through containerd's images service on the CRI socket.
//!
//! Here: which of the two a node uses ([`PinTarget`], [`resolve`]), and what goes wrong with either.

use std::path::PathBuf;
use std::time::Duration;

use super::cri::{CriClient, CriEndpoint, CriError};
use super::files::FileError;
use crate::model::runtime::RuntimeKind;

pub mod containerd;
pub mod crio;

// Callers name these through `pins::`, whichever runtime they belong to.
pub use containerd::{
    CONTAINERD_NAMESPACE, CONTAINERD_PIN_LABEL, CONTAINERD_PIN_VALUE, ContainerdImage,
    containerd_images, cri_names, hold_containerd, image_named, record_labels, release_containerd,
    set_label,
};
pub use crio::{
    CRIO_CONFIG_DIR, CRIO_DROP_IN, Reload, crio_config_files, crio_entries, drop_in_text,
    hold_crio_pins, hold_in_drop_in, put_back_drop_in, read_crio_config, read_crio_pins,
    read_drop_in, release_crio_pins, reload_crio,
};

/// Why pins could not be read or written, or a node cannot be pinned on at all.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(transparent)]
    File(#[from] FileError),
    /// A file of CRI-O's configuration that CRI-O could not load either ([`read_crio_config`]).
    #[error(transparent)]
    CrioConfig(FileError),
    #[error("reloading CRI-O: {0}")]
    Reload(String),
    #[error("containerd images service: {0}")]
    Containerd(String),
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("CRI-O at {endpoint}: its pin drop-in can only be written on the node itself")]
    RemoteCrio { endpoint: CriEndpoint },
    #[error("runtime {runtime:?}: pinboard pins only on containerd and CRI-O")]
    UnknownRuntime { runtime: String },
}

/// How a node's pins are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinTarget {
    /// From the runtime's name: containerd -> label, cri-o -> the drop-in in /etc/crio/crio.conf.d and
    /// `systemctl reload crio`.
    Detect,
    /// The drop-in in `config_dir` on the machine pinboard runs on (the node itself), then `reload`. The
    /// plan's images are added to the pins the file lists already.
    CrioDropIn {
        config_dir: PathBuf,
        reload: Reload,
    },
    ContainerdLabel,
}

/// Connects to the node at `endpoint` and decides how it pins ([`resolve`]): the client and the decided
/// target.
pub async fn connect_resolved(
    endpoint: &CriEndpoint,
    target: PinTarget,
    timeout: Duration,
) -> Result<(CriClient, PinTarget), PinError> {
    let client = CriClient::connect(endpoint, timeout).await?;
    let runtime = client.version().await?.runtime_name;
    let pin = resolve(target, &runtime, &client)?;
    Ok((client, pin))
}

/// The target with `Detect` decided from the runtime CRI Version names `runtime` (named in the refusal of
/// one pinboard does not pin on).
pub fn resolve(
    target: PinTarget,
    runtime: &str,
    client: &CriClient,
) -> Result<PinTarget, PinError> {
    if target != PinTarget::Detect {
        return Ok(target);
    }
    match RuntimeKind::of_cri_name(runtime) {
        Some(RuntimeKind::Containerd) => Ok(PinTarget::ContainerdLabel),
        // The drop-in is a file on the node: only writable when pinboard runs there.
        Some(RuntimeKind::Crio) if !client.endpoint().is_local() => Err(PinError::RemoteCrio {
            endpoint: client.endpoint().clone(),
        }),
        Some(RuntimeKind::Crio) => Ok(PinTarget::CrioDropIn {
            config_dir: CRIO_CONFIG_DIR.into(),
            reload: Reload::Systemctl,
        }),
        None => Err(PinError::UnknownRuntime {
            runtime: runtime.to_owned(),
        }),
    }
}

//! Undoing pins on one node (`pinboard unpin`, and the TUI's): releasing sets' holds on its pins, and
//! which sets hold any pin there now.

use std::collections::BTreeSet;

use tokio::task::JoinError;

use crate::backend::cri::{CriError, DEFAULT_TIMEOUT};
use crate::backend::pins::{self, PinError, PinTarget, Reload, connect_resolved};
use crate::backend::target::DirectNode;
use crate::model::crio::ReloadPins;
use crate::model::holders::{Holder, Holders, PinChange, ReleaseScope};
use crate::model::runtime::Runtime;

/// Why unpinning on one node, or asking which sets hold its pins, failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpinError {
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("rewriting the CRI-O drop-in: {0}")]
    Rewriting(JoinError),
    #[error("reading the CRI-O drop-in: {0}")]
    Reading(JoinError),
    /// Nothing was kept: the labels changed before the failure were put back.
    #[error("{runtime}: {error}; no pin label was changed")]
    Unlabelling { runtime: String, error: PinError },
}

impl UnpinError {
    /// Whether the node's runtime did not answer at all: nothing was tried there.
    pub fn unreachable(&self) -> bool {
        match self {
            UnpinError::Cri(e) | UnpinError::Pin(PinError::Cri(e)) => e.unreachable,
            _ => false,
        }
    }
}

/// What unpinning did on one node: each pin it released a holder of or was asked about, and, on a CRI-O
/// whose reload ignores removals, that the pins stay until it restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnpinChanges {
    pub changes: Vec<PinChange>,
    pub note: Option<String>,
}

/// Unpins on one node what `release` releases: CRI-O's drop-in entries lose those holders and an entry
/// goes with its last one (rewritten only if it changes, then CRI-O is reloaded; no entry left removes the
/// key, and the file when nothing else is in it), containerd's records lose those holder labels and the
/// pin label with the last one. An administrator's entries stay; images are never deleted.
pub async fn unpin(
    node: &DirectNode,
    target: PinTarget,
    release: &ReleaseScope,
) -> Result<UnpinChanges, UnpinError> {
    let (client, pin) = connect_resolved(&node.endpoint, target, DEFAULT_TIMEOUT).await?;
    match pin {
        PinTarget::CrioDropIn { config_dir, reload } => {
            // A reload that ignores removals leaves them pinned until CRI-O restarts: say so.
            let version = client.version().await?;
            let kept_until_restart =
                Runtime::identify(&version.runtime_name, &version.runtime_version)
                    .and_then(|r| r.crio_version())
                    .and_then(|v| ReloadPins::of(v).removal_note())
                    .filter(|_| reload != Reload::Restart);
            let release = release.clone();
            let changes = tokio::task::spawn_blocking(move || {
                let before = pins::drop_in_text(&config_dir)?;
                let (changed, changes) = pins::release_crio_pins(&config_dir, &release)?;
                // CRI-O not told: the drop-in goes back as it was, rather than half unpinned.
                if changed && let Err(e) = pins::reload_crio(&reload) {
                    pins::put_back_drop_in(&config_dir, before.as_deref())?;
                    return Err(e);
                }
                Ok::<_, PinError>(changes)
            })
            .await
            .map_err(UnpinError::Rewriting)??;
            let removed = changes.iter().any(PinChange::removed);
            Ok(UnpinChanges {
                changes,
                note: kept_until_restart.filter(|_| removed).map(str::to_string),
            })
        }
        _ => {
            let version = client.version().await?;
            let runtime = format!("{} {}", version.runtime_name, version.runtime_version);
            Ok(UnpinChanges {
                changes: pins::release_containerd(&client, release)
                    .await
                    .map_err(|error| UnpinError::Unlabelling { runtime, error })?,
                note: None,
            })
        }
    }
}

/// The sets that hold some pin on one node, as its record says (drop-in marks, holder labels).
pub async fn sets_holding(
    node: &DirectNode,
    target: PinTarget,
) -> Result<BTreeSet<String>, UnpinError> {
    let (client, pin) = connect_resolved(&node.endpoint, target, DEFAULT_TIMEOUT).await?;
    let holders: Vec<Holders> = match pin {
        PinTarget::CrioDropIn { config_dir, .. } => {
            tokio::task::spawn_blocking(move || pins::read_drop_in(&config_dir))
                .await
                .map_err(UnpinError::Reading)??
                .into_iter()
                .map(|e| e.holders)
                .collect()
        }
        _ => pins::containerd_images(&client)
            .await?
            .iter()
            .map(pins::ContainerdImage::holders)
            .collect(),
    };
    Ok(holders
        .into_iter()
        .flatten()
        .filter_map(|h| match h {
            Holder::Set(name) => Some(name),
            _ => None,
        })
        .collect())
}

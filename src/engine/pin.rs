//! Pinning one node's images once every pull succeeded, and confirming it through the runtime where it
//! reports pins (CRI `pinned`, [`crate::model::runtime`]): containerd's pin labels, or CRI-O's drop-in and a
//! reload. A CRI-O that does not pin what its drop-in now lists fails with the cause and the fix
//! ([`explain_unpinned`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::task::JoinError;

use crate::backend::cri::CriClient;
use crate::backend::pins::{self, PinError, PinTarget, Reload, resolve};
use crate::model::crio::{NotPinned, broken_config, explain_unpinned};
use crate::model::holders::Holder;
use crate::model::rollout::PinMethod;
use crate::model::runtime::{PinReports, Runtime};

/// How long the runtime gets to show written pins as pinned (CRI-O applies a reload asynchronously), and
/// how often it is asked meanwhile.
const CONFIRM_WITHIN: Duration = Duration::from_secs(5);
const CONFIRM_EVERY: Duration = Duration::from_millis(250);

/// Why a node's pins could not be written, or are not in force once written.
#[derive(Debug, thiserror::Error)]
pub(super) enum PinningError {
    #[error(transparent)]
    Pin(#[from] PinError),
    /// Nothing was kept: the labels written before the failure were put back.
    #[error("{runtime}: {error}; no pin label was kept")]
    Labelling { runtime: String, error: PinError },
    #[error("writing the CRI-O drop-in: {0}")]
    Writing(JoinError),
    #[error(
        "the CRI-O drop-in does not list {} for its sets after writing it",
        .missing.join(", ")
    )]
    NotListed { missing: Vec<String> },
    #[error("reloading CRI-O: {0}")]
    Reloading(JoinError),
    /// CRI-O could not be reloaded: the drop-in was put back as it was (unless `put_back` is false).
    #[error("{error}; {}", if *.put_back {
        "the drop-in was put back as it was"
    } else {
        "the drop-in could not be put back: it lists the set, and CRI-O's next reload applies it"
    })]
    NotReloaded { error: PinError, put_back: bool },
    /// The runtime does not report them pinned: the causes and fixes its files and version explain.
    #[error("{}", .reasons.join("; "))]
    NotPinned { reasons: Vec<String> },
}

/// An image the runtime does not report pinned: the names it knows it by, its tags apart.
#[derive(Default)]
struct Unpinned {
    reference: String,
    tags: Vec<String>,
    names: Vec<String>,
}

/// A node's runtime, as pinning needs it.
pub(super) struct Pinning<'a> {
    pub(super) client: &'a CriClient,
    /// As CRI Version names it: [`resolve`] picks how the node pins from it, and it names a runtime
    /// pinboard does not know.
    pub(super) runtime_name: &'a str,
    /// None for a runtime pinboard does not know: nothing is assumed about what it reports.
    pub(super) runtime: Option<&'a Runtime>,
}

impl Pinning<'_> {
    /// Writes and verifies the pins for every image of the plan (all present now), each held by its sets:
    /// how they were written, and whether the runtime confirmed them.
    pub(super) async fn pin(
        &self,
        target: PinTarget,
        holds: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<(PinMethod, bool), PinningError> {
        match resolve(target, self.runtime_name, self.client) {
            Ok(PinTarget::CrioDropIn { config_dir, reload }) => self
                .drop_in(config_dir, reload, holds)
                .await
                .map(|confirmed| (PinMethod::CrioDropIn, confirmed)),
            Ok(_) => pins::hold_containerd(self.client, &holds)
                .await
                .map(|held| (PinMethod::ContainerdLabel, held.confirmed))
                .map_err(|error| PinningError::Labelling {
                    runtime: self.runtime_label(),
                    error,
                }),
            Err(e) => Err(e.into()),
        }
    }

    /// Holds the images in the drop-in for their sets, reloads CRI-O, and asks the runtime whether they are
    /// pinned now: true when it confirms, false when it cannot say; an error naming the cause and the fix
    /// when it reports them not pinned.
    async fn drop_in(
        &self,
        dir: PathBuf,
        reload: Reload,
        holds: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<bool, PinningError> {
        let images: Vec<String> = holds.keys().cloned().collect();
        let images = images.as_slice();
        let config_dir = dir.clone();
        let changed = tokio::task::spawn_blocking(move || {
            let before = pins::drop_in_text(&config_dir)?;
            // Added to what holds them already: applying one set must not unpin another.
            let changed = pins::hold_crio_pins(&config_dir, &holds)?;
            let back = pins::read_drop_in(&config_dir)?;
            let missing: Vec<String> = holds
                .into_iter()
                .filter(|(image, sets)| {
                    !back.iter().any(|e| {
                        e.pattern == *image
                            && sets
                                .iter()
                                .all(|s| e.holders.contains(&Holder::Set(s.clone())))
                    })
                })
                .map(|(image, _)| image)
                .collect();
            Ok::<_, PinError>((changed, missing, before))
        })
        .await
        .map_err(PinningError::Writing)?;
        let (changed, missing, before) = changed.map_err(|e| match e {
            PinError::CrioConfig(_) => PinningError::NotPinned {
                reasons: vec![broken_config(&self.runtime_label(), &e.to_string())],
            },
            e => e.into(),
        })?;
        if !missing.is_empty() {
            return Err(PinningError::NotListed { missing });
        }
        let reports = self.reports();
        // Also when the file is as wanted but CRI-O does not pin it yet: a reload that did not take
        // before, or the restart asked for now.
        if changed || (reports.any() && !self.not_pinned(images).await.is_empty()) {
            let how = reload.clone();
            let reloaded = tokio::task::spawn_blocking(move || pins::reload_crio(&how))
                .await
                .map_err(PinningError::Reloading)?;
            // CRI-O was not told: the drop-in goes back as it was, rather than waiting for whatever
            // reloads CRI-O next.
            if let Err(e) = reloaded {
                let dir = dir.clone();
                let put_back = tokio::task::spawn_blocking(move || {
                    pins::put_back_drop_in(&dir, before.as_deref())
                })
                .await;
                return Err(PinningError::NotReloaded {
                    error: e,
                    put_back: matches!(put_back, Ok(Ok(()))),
                });
            }
        }
        if !reports.any() {
            return Ok(false);
        }
        let unpinned = self.confirm(images).await;
        if unpinned.is_empty() {
            return Ok(true);
        }
        Err(PinningError::NotPinned {
            reasons: self.why_not_pinned(dir, &unpinned).await,
        })
    }

    /// `CRI-O 1.33.13`, or the name CRI Version gave a runtime pinboard does not know.
    fn runtime_label(&self) -> String {
        self.runtime
            .map_or_else(|| self.runtime_name.to_string(), Runtime::to_string)
    }

    /// Which CRI calls carry this runtime's word on pins.
    fn reports(&self) -> PinReports {
        self.runtime
            .map(Runtime::reports_pinned)
            .unwrap_or_default()
    }

    /// The images the runtime does not report pinned, each with the names it knows it by (one it could not
    /// be asked about counts as not pinned, with none).
    async fn not_pinned(&self, images: &[String]) -> Vec<Unpinned> {
        let records = self
            .client
            .image_records(images, self.reports().list_images)
            .await;
        images
            .iter()
            .zip(records)
            .filter_map(|(image, record)| match record {
                Ok(Some(i)) if i.pinned => None,
                Ok(Some(i)) => Some(Unpinned {
                    reference: image.clone(),
                    names: [i.repo_tags.clone(), i.repo_digests].concat(),
                    tags: i.repo_tags,
                }),
                _ => Some(Unpinned {
                    reference: image.clone(),
                    ..Unpinned::default()
                }),
            })
            .collect()
    }

    /// What is still not pinned once the runtime had time to apply a reload (asynchronous in CRI-O) or to
    /// come back from a restart.
    async fn confirm(&self, images: &[String]) -> Vec<Unpinned> {
        let deadline = Instant::now() + CONFIRM_WITHIN;
        loop {
            let unpinned = self.not_pinned(images).await;
            if unpinned.is_empty() || Instant::now() >= deadline {
                return unpinned;
            }
            tokio::time::sleep(CONFIRM_EVERY).await;
        }
    }

    /// Why CRI-O does not pin `unpinned` after the drop-in in `dir` listed them and it was reloaded: its
    /// files and version explain it as `check` does (a file it cannot load fails its reload as a whole);
    /// what they do not explain is listed.
    async fn why_not_pinned(&self, dir: PathBuf, unpinned: &[Unpinned]) -> Vec<String> {
        let runtime = self.runtime_label();
        let version = self.runtime.and_then(Runtime::crio_version);
        let config = match version {
            Some(_) => tokio::task::spawn_blocking(move || pins::read_crio_config(&dir))
                .await
                .map_err(|e| PinError::Reload(e.to_string()))
                .and_then(|read| read),
            None => Err(PinError::Reload("not CRI-O".into())),
        };
        let images = unpinned.iter().map(|u| NotPinned {
            reference: &u.reference,
            tags: &u.tags,
            names: &u.names,
        });
        let (mut reasons, rest) = match &config {
            Ok(config) => explain_unpinned(&runtime, version, config, images),
            Err(e @ PinError::CrioConfig(_)) => {
                (vec![broken_config(&runtime, &e.to_string())], Vec::new())
            }
            Err(_) => (Vec::new(), images.map(|i| i.reference).collect()),
        };
        if !rest.is_empty() {
            reasons.push(format!(
                "{runtime} does not report {} image(s) pinned after writing the drop-in and reloading: {}",
                rest.len(),
                rest.join(", ")
            ));
        }
        reasons
    }
}

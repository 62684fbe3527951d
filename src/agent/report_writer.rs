//! What the agent writes of its node, each only when it changed: what its runtime holds (its
//! `PinboardNodeBlobs`), the report's detail (`PinboardNodeImages`) and the report (`PinboardNode`). A set's
//! new phase is written at once; its bytes at most every write interval ([`write_due`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use super::blobs;
use super::metrics::IoStats;
use super::state::write_due;
use crate::backend::pinboard_api::PinboardApi;
use crate::model::pinboard_api::{NodeImages, NodeReport, NodeSetPhase};

/// Each set's phase: which set, of which generation, in what phase, and the check it answered last.
pub type Phases = Vec<(String, i64, NodeSetPhase, Option<String>)>;

/// What was last written, to write only what changed.
#[derive(Default)]
pub struct ReportWriter {
    /// The report as sent (without its image lists), and its detail.
    written: Option<serde_json::Value>,
    written_images: Option<NodeImages>,
    /// Each set's phase as last written.
    written_phases: Phases,
    last_write: Option<Instant>,
    /// What the runtime holds, published for the plans.
    pub blobs: blobs::Publisher,
}

/// What is to be written now, and how urgently.
pub struct Due {
    pub report: NodeReport,
    pub phases: Phases,
    /// No rollout runs: whatever changed is written at once.
    pub settled: bool,
    pub interval: Duration,
}

impl ReportWriter {
    /// The report was deleted (its detail with it, as both go with the Node): the next write makes them
    /// again, whole.
    pub fn forget_report(&mut self) {
        self.written = None;
        self.written_images = None;
    }

    /// Publishes what the runtime holds, then writes the detail and the report where they changed and a
    /// write is due.
    pub async fn write(&mut self, api: &PinboardApi, node: &Node, due: Due, io: &mut IoStats) {
        self.blobs.publish(api, node).await;
        let Due {
            report,
            phases,
            settled,
            interval,
        } = due;
        let sent = serde_json::to_value(&report).unwrap_or_default();
        let detail = report.image_detail();
        let report_due = self.written.as_ref() != Some(&sent);
        let detail_due = self.written_images.as_ref() != Some(&detail);
        if !report_due && !detail_due {
            return;
        }
        let news = settled || self.written_phases != phases;
        if !write_due(news, self.last_write, interval, Instant::now()) {
            return;
        }
        self.last_write = Some(Instant::now());
        // The detail first: a reader that sees the report's new phase finds the images it rests on.
        if detail_due {
            let first = self.written_images.is_none();
            let written = api.write_images(node, &detail, first).await;
            io.wrote("images", written.is_ok());
            match written {
                Ok(()) => self.written_images = Some(detail),
                Err(e) => {
                    tracing::warn!("cannot write the report's images: {e}");
                    // Perhaps the object is gone: the next write makes it again.
                    self.written_images = None;
                    return;
                }
            }
        }
        if report_due {
            let first = self.written.is_none();
            let written = api.write_report(node, &report, first).await;
            io.wrote("report", written.is_ok());
            match written {
                Ok(()) => {
                    self.written = Some(sent);
                    self.written_phases = phases;
                }
                Err(e) => {
                    tracing::warn!("cannot write the report: {e}");
                    self.written = None;
                }
            }
        }
    }
}

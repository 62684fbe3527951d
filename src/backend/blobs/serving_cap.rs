//! A node's serving cap (`--serve-rate`): one rate that every byte the node sends to other nodes books
//! against, whether its cache's endpoint or its peer side sends it, so that its NIC keeps room for its own
//! pods' traffic.

use std::sync::{Arc, Mutex};

use crate::model::pacing::Pace;

/// Shared by everything that sends from the node; clones share one rate.
#[derive(Clone, Debug)]
pub struct ServingCap(Arc<Mutex<Pace>>);

impl ServingCap {
    /// `rate` bytes per second.
    pub fn new(rate: u64) -> ServingCap {
        ServingCap(Arc::new(Mutex::new(Pace::new(rate))))
    }

    pub fn rate(&self) -> u64 {
        self.lock().rate()
    }

    /// Waits until `bytes` more fit under the cap.
    pub async fn wait_to_send(&self, bytes: u64) {
        // Tokio's clock: the simulation at scale runs the cap in virtual time.
        let now = tokio::time::Instant::now();
        let at = self.lock().book(bytes, now.into_std());
        tokio::time::sleep_until(at.into()).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

//! What every node of one rollout shares: the images' facts, the registry client (and its credentials),
//! the configuration, and the channel its events go out on.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use super::config::EngineConfig;
use crate::backend::credentials::Credentials;
use crate::backend::registry::Registry;
use crate::model::image::ImageFacts;
use crate::model::rollout::Event;

pub(super) struct Shared {
    pub(super) images: Arc<HashMap<String, ImageFacts>>,
    /// For whole pulls on nodes that pull lazily.
    pub(super) registry: Arc<Registry>,
    pub(super) credentials: Arc<Credentials>,
    pub(super) config: EngineConfig,
    events: UnboundedSender<Event>,
}

impl Shared {
    /// The shared part of a rollout, and the receiving end of its events.
    pub(super) fn new(
        images: Arc<HashMap<String, ImageFacts>>,
        registry: Arc<Registry>,
        config: EngineConfig,
    ) -> (Shared, UnboundedReceiver<Event>) {
        let (events, events_rx) = mpsc::unbounded_channel();
        let shared = Shared {
            images,
            credentials: registry.credentials(),
            registry,
            config,
            events,
        };
        (shared, events_rx)
    }

    pub(super) fn emit(&self, event: Event) {
        // The receiver gone means no one is watching; the rollout itself carries on.
        let _ = self.events.send(event);
    }
}

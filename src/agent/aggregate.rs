//! The one agent that holds the Lease `pinboard-aggregator` sums each set up over its nodes into the set's
//! status (nodes, ready, pulling, failed, restoring), so `kubectl get pinsets` shows them; written only when
//! a figure changed, with an Event on the PinSet when that is news ([`set_news`]: ready everywhere, nodes
//! failed or restoring). While it holds the Lease it follows every report and Node; when it loses it, it
//! stops.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::backend::events::{self, Recorder};
use crate::backend::pinboard_api::{AgentsWatch, PinboardApi};
use crate::model::agent_events::set_news;
use crate::model::agents_view::AgentsView;
use crate::model::pinboard_api::{PinSetStatus, SET_KIND};

pub struct Aggregator {
    api: PinboardApi,
    holder: String,
    /// The watches and the view, while this agent holds the Lease.
    leading: Option<(AgentsWatch, AgentsView)>,
    written: BTreeMap<String, PinSetStatus>,
    recorder: Recorder,
}

impl Aggregator {
    pub fn new(api: PinboardApi, holder: &str) -> Aggregator {
        Aggregator {
            recorder: Recorder::new(api.client().clone(), holder),
            api,
            holder: holder.to_string(),
            leading: None,
            written: BTreeMap::new(),
        }
    }

    /// Takes or keeps the Lease, and when held, writes the sets' summaries that changed.
    pub async fn turn(&mut self) {
        match self.api.lead(&self.holder).await {
            Ok(true) => {}
            Ok(false) => {
                self.leading = None;
                return;
            }
            Err(e) => {
                tracing::warn!("cannot take the aggregator's Lease: {e}");
                return;
            }
        }
        let (watch, view) = self
            .leading
            .get_or_insert_with(|| (self.api.watch_all(false), AgentsView::default()));
        while let Ok(update) = watch.updates.try_recv() {
            view.apply(update);
        }
        if !view.synced() {
            return;
        }
        let now = SystemTime::now();
        for set in &view.sets {
            let summary = view.summary(set, now);
            let current = set.status.as_ref();
            if current == Some(&summary) || self.written.get(set.name()) == Some(&summary) {
                continue;
            }
            match self.api.write_set_status(set.name(), &summary).await {
                Ok(()) => {
                    let before = self.written.get(set.name()).or(current);
                    let regarding =
                        events::reference(SET_KIND, set.name(), set.metadata.uid.as_deref());
                    for note in set_news(before, &summary) {
                        if let Err(e) = self.recorder.record(&note, &regarding, None).await {
                            tracing::warn!(set = set.name(), "cannot record an Event: {e}");
                        }
                    }
                    self.written.insert(set.name().to_string(), summary);
                }
                Err(e) => tracing::warn!(set = set.name(), "cannot write the set's status: {e}"),
            }
        }
        if let Err(e) = self.recorder.flush().await {
            tracing::warn!("cannot write an Event's series: {e}");
        }
    }
}

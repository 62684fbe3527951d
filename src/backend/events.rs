//! Kubernetes Events (`events.k8s.io/v1`) as the agents record them: what an administrator must hear about
//! a node's PinboardNode or a PinSet, shown by `kubectl describe` and `kubectl get events`. Repeats of the
//! same event (the same object, reason and type, within [`SERIES_TTL`]) go into one event's `series`, and
//! a series is written at most every [`SERIES_EVERY`]: a failure retried every minute on 5,000 nodes costs
//! one write per node and minute at most, not one per retry. Cluster-scoped objects' Events go in the
//! `default` namespace, as Kubernetes puts them; an older API server that accepts them only in
//! `kube-system` (1.20 refuses `default` for them) gets them there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::model::agent_events::{Kind, Note};

/// Repeats this close to the last one join its series; later, a new event starts.
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// A series' count is written at most this often.
pub const SERIES_EVERY: Duration = Duration::from_secs(60);
/// Where cluster-scoped objects' Events go, and where an older API server wants them.
const NAMESPACE: &str = "default";
const OLDER_NAMESPACE: &str = "kube-system";
/// The reporting controller of every agent's Events.
const CONTROLLER: &str = "pinboard.dev/agent";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    /// Kind, name and uid: an object created anew (a new uid) starts new series, as `kubectl describe`
    /// shows only its own.
    regarding: (String, String, Option<String>),
    reason: &'static str,
    kind: Kind,
}

/// An event written, and its repeats since.
struct Series {
    name: String,
    count: i32,
    last_observed: Instant,
    last_observed_at: k8s_openapi::jiff::Timestamp,
    /// The count as last written.
    written: i32,
    written_at: Instant,
}

/// Records one agent's Events.
pub struct Recorder {
    client: Client,
    /// The agent's node: its Events' reporting instance.
    instance: String,
    series: HashMap<Key, Series>,
    /// Where this API server takes the Events of cluster-scoped objects.
    namespace: &'static str,
}

impl Recorder {
    pub fn new(client: Client, instance: &str) -> Recorder {
        Recorder {
            client,
            instance: instance.to_owned(),
            series: HashMap::new(),
            namespace: NAMESPACE,
        }
    }

    fn events(&self) -> Api<Event> {
        Api::namespaced(self.client.clone(), self.namespace)
    }

    /// Records `note` regarding `regarding` (and `related`): a new Event, or one more of its series.
    pub async fn record(
        &mut self,
        note: &Note,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
    ) -> Result<(), kube::Error> {
        let now = Instant::now();
        self.series
            .retain(|_, s| now.duration_since(s.last_observed) < SERIES_TTL);
        let key = Key {
            regarding: (
                regarding.kind.clone().unwrap_or_default(),
                regarding.name.clone().unwrap_or_default(),
                regarding.uid.clone(),
            ),
            reason: note.reason,
            kind: note.kind,
        };
        if let Some(series) = self.series.get_mut(&key) {
            series.count += 1;
            series.last_observed = now;
            series.last_observed_at = k8s_openapi::jiff::Timestamp::now();
            return self.flush().await;
        }
        let stamp = k8s_openapi::jiff::Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or("pinboard"),
            stamp.as_nanosecond()
        );
        let mut event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.into()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(stamp)),
            action: Some(note.action.into()),
            reason: Some(note.reason.into()),
            note: Some(truncated(&note.message)),
            type_: Some(
                match note.kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .into(),
            ),
            regarding: Some(regarding.clone()),
            related: related.cloned(),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        match self.events().create(&PostParams::default(), &event).await {
            // An older API server: cluster-scoped objects' Events only in kube-system.
            Err(kube::Error::Api(status))
                if self.namespace == NAMESPACE && refuses_namespace(&status) =>
            {
                self.namespace = OLDER_NAMESPACE;
                event.metadata.namespace = Some(self.namespace.into());
                self.events().create(&PostParams::default(), &event).await?;
            }
            created => {
                created?;
            }
        }
        self.series.insert(
            key,
            Series {
                name,
                count: 1,
                last_observed: now,
                last_observed_at: stamp,
                written: 1,
                written_at: now,
            },
        );
        Ok(())
    }

    /// Writes the count of every series that grew, at most every [`SERIES_EVERY`] each.
    pub async fn flush(&mut self) -> Result<(), kube::Error> {
        let now = Instant::now();
        let events = self.events();
        for series in self.series.values_mut() {
            if series.count == series.written
                || now.duration_since(series.written_at) < SERIES_EVERY
            {
                continue;
            }
            let patch = json!({"series": EventSeries {
                count: series.count,
                last_observed_time: MicroTime(series.last_observed_at),
            }});
            events
                .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            (series.written, series.written_at) = (series.count, now);
        }
        Ok(())
    }
}

/// Whether the API server refused an Event for its namespace (`involvedObject.namespace`).
fn refuses_namespace(status: &kube::core::Status) -> bool {
    let causes = status.details.iter().flat_map(|d| &d.causes);
    status.code == 422
        && causes
            .into_iter()
            .any(|c| c.field == "involvedObject.namespace")
}

/// A note within the API's 1 kB.
fn truncated(message: &str) -> String {
    const LIMIT: usize = 1024;
    if message.len() <= LIMIT {
        return message.to_owned();
    }
    let mut end = LIMIT - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// A reference to one of pinboard's cluster-scoped objects (`kind` `name`, with its `uid` when known, as
/// `kubectl describe` matches Events by it).
pub fn reference(kind: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(crate::model::pinboard_api::API_VERSION.into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

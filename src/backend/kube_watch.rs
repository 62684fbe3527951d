//! Watching, never polling, for any kind: one kube-rs watcher feeding a reflector store, and every change
//! sent as the kind's complete current list (or what the caller makes of it), with the watch's connection
//! state.
//!
//! A watch that fails reports [`Connection::Reconnecting`] (since its first failure), waits (1 s doubling
//! to 30 s), and starts over with a fresh list, which ends in [`Connection::Synced`] again: so a recovered
//! watch always says so, even when nothing changed meanwhile.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use kube::Resource;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::model::machine_config::Connection;

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// A kind's objects as the store holds them.
pub type Snapshot<K> = [std::sync::Arc<K>];

/// The typed view of a dynamic object; `None` (and a log line) when even the tolerant view cannot read it.
pub fn typed<T: DeserializeOwned>(object: &DynamicObject) -> Option<T> {
    let parsed = serde_json::to_value(object).and_then(serde_json::from_value);
    parsed
        .inspect_err(|e| {
            let name = object.metadata.name.as_deref().unwrap_or("?");
            tracing::warn!("cannot read {name}: {e}");
        })
        .ok()
}

/// The typed views of a kind's objects by name, each converted again only when its resourceVersion
/// changes: after a change to one of 2,000 objects, one is converted, not 2,000.
pub struct TypedCache<T> {
    by_name: HashMap<String, (String, Arc<T>)>,
}

impl<T> Default for TypedCache<T> {
    fn default() -> Self {
        TypedCache {
            by_name: HashMap::new(),
        }
    }
}

impl<T: DeserializeOwned> TypedCache<T> {
    /// Every object's typed view, in the order given, shared (a change to one of thousands of objects
    /// copies pointers, not objects); objects gone are forgotten.
    pub fn all(&mut self, objects: &Snapshot<DynamicObject>) -> Vec<Arc<T>> {
        let mut kept = HashMap::with_capacity(objects.len());
        let views = objects
            .iter()
            .filter_map(|object| {
                let name = object.metadata.name.clone().unwrap_or_default();
                let version = object.metadata.resource_version.clone().unwrap_or_default();
                let view = match self.by_name.remove(&name) {
                    Some((seen, view)) if seen == version && !version.is_empty() => view,
                    _ => Arc::new(typed(object)?),
                };
                kept.insert(name, (version, Arc::clone(&view)));
                Some(view)
            })
            .collect();
        self.by_name = kept;
        views
    }

    /// [`Self::all`], each view a copy of its own: for kinds of few objects.
    pub fn owned(&mut self, objects: &Snapshot<DynamicObject>) -> Vec<T>
    where
        T: Clone,
    {
        self.all(objects)
            .into_iter()
            .map(Arc::unwrap_or_clone)
            .collect()
    }
}

/// Watches `api` (with `config`: e.g. one object by its name) for ever, until the receiver is gone,
/// keeping `writer`'s store and sending `to_update` of the store, sorted by name, after every change;
/// and `connection(kind, state)` when the watch's state changes.
pub fn spawn<K, U, W>(
    kind: W,
    api: Api<K>,
    config: watcher::Config,
    mut writer: Writer<K>,
    mut to_update: impl FnMut(&Snapshot<K>) -> U + Send + 'static,
    connection: fn(W, Connection) -> U,
    tx: mpsc::Sender<U>,
) -> JoinHandle<()>
where
    K: Resource + Lookup + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Send + Sync,
    U: Send + 'static,
    W: Copy + Debug + Send + 'static,
{
    let store: Store<K> = writer.as_reader();
    let send = move |update: U| {
        let tx = tx.clone();
        async move { tx.send(update).await.is_ok() }
    };
    tokio::spawn(async move {
        let mut retry = FIRST_RETRY;
        let mut failing_since = None;
        if !send(connection(kind, Connection::Connecting)).await {
            return;
        }
        loop {
            let mut events = std::pin::pin!(watcher::watcher(api.clone(), config.clone()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        writer.apply_watcher_event(&event);
                        let listed = match event {
                            Event::Init | Event::InitApply(_) => continue,
                            Event::InitDone => true,
                            Event::Apply(_) | Event::Delete(_) => false,
                        };
                        let mut objects = store.state();
                        objects.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
                        if !send(to_update(&objects)).await {
                            return;
                        }
                        // Synced only after the list it is about, so a consumer that sees it has the list.
                        if listed {
                            failing_since = None;
                            retry = FIRST_RETRY;
                            if !send(connection(kind, Connection::Synced)).await {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        let since = *failing_since.get_or_insert_with(SystemTime::now);
                        let error = error.to_string();
                        tracing::warn!("watch of {kind:?} failed: {error}");
                        let state = Connection::Reconnecting { since, error };
                        if !send(connection(kind, state)).await {
                            return;
                        }
                        break;
                    }
                }
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(LAST_RETRY);
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::machine_config::PinnedImageSet;

    fn set(name: &str, version: &str, generation: i64) -> Arc<DynamicObject> {
        let object = serde_json::json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
            "metadata": {"name": name, "resourceVersion": version, "generation": generation},
        });
        Arc::new(serde_json::from_value(object).unwrap())
    }

    #[test]
    fn typed_views_are_converted_again_only_when_the_resource_version_changes() {
        let mut cache = TypedCache::<PinnedImageSet>::default();
        let generations = |views: Vec<Arc<PinnedImageSet>>| -> Vec<i64> {
            views.iter().map(|v| v.generation()).collect()
        };
        assert_eq!(
            generations(cache.all(&[set("a", "1", 1), set("b", "1", 1)])),
            [1, 1]
        );
        // Same version, other content: the view converted before stands (no new conversion).
        assert_eq!(
            generations(cache.all(&[set("a", "1", 7), set("b", "2", 2)])),
            [1, 2]
        );
        // Gone objects are forgotten: back with the same version, it is converted anew.
        assert_eq!(generations(cache.all(&[set("b", "2", 2)])), [2]);
        assert_eq!(generations(cache.all(&[set("a", "1", 9)])), [9]);
    }
}

//! The rollout engine: pre-load a plan's images on every node, then pin them, reporting each step as a
//! [`model::rollout::Event`](crate::model::rollout::Event) for the TUI and the headless commands to fold.
//!
//! Per node, as the OpenShift daemon does but faster and watchable: nodes run independently; a node whose
//! plan says no-space is refused unless forced; images already present are skipped; pulls run `parallel`
//! at a time through CRI PullImage with the image's registry credential, retried with exponential backoff
//! (never a fixed sleep after a pull) unless the error is permanent, and each is confirmed with ImageStatus.
//! A pull whose bytes stop moving for `pull_progress_timeout` is cancelled and retried like a failure.
//! "No space left on device" stops the node's remaining pulls. Pins are written only after every pull of
//! the node succeeded, so that image GC can still reclaim space if something fails, then verified
//! through the runtime where it reports pins (CRI `pinned`, [`crate::model::runtime`]): a CRI-O that does
//! not pin what its drop-in now lists ends the node `pin-failed`, with the cause and the fix
//! ([`crate::model::crio::explain_unpinned`]), e.g. a reload known not to apply pins (`--crio-reload
//! restart` then).
//! Operators can cancel and retry single pulls while it runs ([`Control`]).

mod config;
mod credentials;
mod job;
mod node;
mod pin;
mod pull;
mod route;
mod shared;
mod unpin;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::task::{JoinHandle, JoinSet};

pub use config::EngineConfig;
pub use job::{Control, NodeJob};
use node::run_node;
use shared::Shared;
pub use unpin::{UnpinChanges, UnpinError, sets_holding, unpin};

use crate::backend::registry::Registry;
use crate::model::image::ImageFacts;
use crate::model::rollout::{Event, Rollout};

/// A running rollout. Events end (the receiver yields None) when every node is done; keep `control` open
/// to be able to retry failed pulls after a node settles, drop it to let nodes with failures finish.
pub struct Engine {
    pub events: UnboundedReceiver<Event>,
    pub control: UnboundedSender<Control>,
    task: JoinHandle<()>,
}

/// Starts rolling out `jobs` on the current tokio runtime. `images` has each reference's facts (blobs and
/// sizes, for byte progress); an image without facts is pulled without progress. `registry` gives the
/// credentials sent with each pull, and fetches the blobs of whole pulls.
pub fn start(
    jobs: Vec<NodeJob>,
    images: Arc<HashMap<String, ImageFacts>>,
    registry: Arc<Registry>,
    config: EngineConfig,
) -> Engine {
    let (shared, events) = Shared::new(images, registry, config);
    let (control, control_rx) = mpsc::unbounded_channel();
    Engine {
        events,
        control,
        task: tokio::spawn(supervise(jobs, Arc::new(shared), control_rx)),
    }
}

/// Runs the engine to its end without an operator (the headless `apply`), folding every event.
pub async fn run_to_end(engine: Engine) -> Rollout {
    let Engine {
        mut events,
        control,
        task,
    } = engine;
    // No one will retry: nodes with failures finish instead of waiting.
    drop(control);
    let mut rollout = Rollout::default();
    while let Some(event) = events.recv().await {
        rollout.apply(event);
    }
    let _ = task.await;
    rollout
}

/// Starts every node and routes operator controls to them until all are done.
async fn supervise(
    jobs: Vec<NodeJob>,
    shared: Arc<Shared>,
    mut control: UnboundedReceiver<Control>,
) {
    if shared.config.readonly {
        for job in jobs {
            shared.emit(Event::NodeRefused {
                node: job.node.name,
                reason: "read-only mode: nothing is pulled or pinned (started with --readonly)"
                    .into(),
            });
        }
        return;
    }
    let mut nodes = JoinSet::new();
    let mut names = HashMap::new();
    let mut routes = HashMap::new();
    for job in jobs {
        let (tx, rx) = mpsc::unbounded_channel();
        let name = job.node.name.clone();
        routes.insert(name.clone(), tx);
        let handle = nodes.spawn(run_node(job, Arc::clone(&shared), rx));
        names.insert(handle.id(), name);
    }
    let mut open = true;
    loop {
        tokio::select! {
            joined = nodes.join_next_with_id() => match joined {
                None => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let node = names.get(&e.id()).cloned().unwrap_or_default();
                    tracing::error!(node, error = %e, "node task failed");
                    let reason = format!("internal error: {e}");
                    shared.emit(Event::NodeStopped { node, reason, at: Instant::now() });
                }
            },
            message = control.recv(), if open => match message {
                // Nodes waiting for a retry now finish.
                None => {
                    open = false;
                    routes.clear();
                }
                Some(m) => route(&routes, &m),
            },
        }
    }
}

fn route(routes: &HashMap<String, UnboundedSender<Control>>, message: &Control) {
    for (node, tx) in routes {
        if message.node().is_none_or(|n| n == node) {
            // A node already done has dropped its receiver: nothing left to control there.
            let _ = tx.send(message.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::lazy::LazyConfig;
    use crate::backend::pins::PinTarget;
    use crate::backend::registry::RegistryOptions;
    use crate::backend::target::DirectNode;
    use crate::model::rollout::NodeState;

    fn job(name: &str, endpoint: &str, verdict: &str) -> NodeJob {
        let plan = serde_json::from_value(serde_json::json!({
            "node": name, "runtime": null, "capacityBytes": null, "usedBytes": null, "availableBytes": null,
            "fetchBytes": 0, "estimatedDiskBytes": 0, "estimateBasis": "nothing", "availableAfterBytes": null,
            "verdict": verdict, "reasons": ["needs 1 GiB more"], "images": []
        }))
        .unwrap();
        let endpoint = endpoint.parse().unwrap();
        NodeJob {
            node: DirectNode {
                name: name.into(),
                endpoint,
            },
            plan,
            pin: PinTarget::Detect,
            holders: Arc::default(),
            lazy: LazyConfig::default(),
        }
    }

    async fn refusals(jobs: Vec<NodeJob>, config: EngineConfig) -> Vec<(String, String)> {
        let registry = Registry::new(RegistryOptions::default()).unwrap();
        let rollout = run_to_end(start(jobs, Arc::default(), Arc::new(registry), config)).await;
        rollout
            .nodes()
            .iter()
            .map(|(node, n)| match &n.state {
                NodeState::Refused { reason } => (node.clone(), reason.clone()),
                other => panic!("{node}: {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn nodes_are_refused_when_readonly_full_or_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let socket = format!("{}/none.sock", dir.path().display());
        let jobs = || {
            vec![
                job("full", &socket, "no-space"),
                job("gone", &socket, "unknown"),
            ]
        };
        let readonly = EngineConfig {
            readonly: true,
            ..EngineConfig::default()
        };
        for (_, reason) in refusals(jobs(), readonly).await {
            assert!(reason.starts_with("read-only mode"), "{reason}");
        }
        let refused = refusals(jobs(), EngineConfig::default()).await;
        assert_eq!(
            refused[0].1,
            "plan verdict no-space: needs 1 GiB more (force to pull anyway)"
        );
        assert!(
            refused[1].1.contains("connect") && refused[1].1.contains("none.sock"),
            "{}",
            refused[1].1
        );
        let forced = refusals(
            jobs(),
            EngineConfig {
                force: true,
                ..EngineConfig::default()
            },
        )
        .await;
        assert!(
            forced.iter().all(|(_, r)| r.contains("connect")),
            "{forced:?}"
        );
    }
}

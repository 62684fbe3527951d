//! An agents' DaemonSet's pod on a node whose agent does not report, as the API server has it, and why it
//! runs no agent in words: not scheduled (and why), its container waiting (pulling its image, the image
//! failing to pull, crash-looping) with its restarts and how its last run ended. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// What pinboard reads of one agent pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentPod {
    pub name: String,
    /// The node it runs on or, not scheduled yet, the one its DaemonSet made it for.
    pub node: Option<String>,
    /// `Pending`, `Running`, `Failed`…
    pub phase: String,
    pub deleting: bool,
    /// Why it is not scheduled (its `PodScheduled` condition, when false): `Unschedulable: 0/4 nodes…`.
    pub unscheduled: Option<String>,
    /// Why its agent container waits: `ImagePullBackOff: Back-off pulling image …`, `CrashLoopBackOff: …`.
    pub waiting: Option<String>,
    pub restarts: i32,
    /// How the container's last run ended: `Error, exit code 1`.
    pub last_ended: Option<String>,
    /// The pod's own reason and message, when it has ended (`Evicted: …`).
    pub ended: Option<String>,
}

/// What a look at a node's agent pods found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodsOnNode {
    /// Its DaemonSet's pods there (none: it has made none yet).
    Found(Vec<AgentPod>),
    /// Why they could not be read: what to grant, or the API server's error.
    Unreadable(String),
}

/// Each node looked at, by name.
pub type AgentPods = BTreeMap<String, PodsOnNode>;

/// `reason: message`, or whichever of them there is.
fn reason_message(reason: Option<&String>, message: Option<&String>) -> Option<String> {
    let (reason, message) = (reason.map(|r| r.trim()), message.map(|m| m.trim()));
    match (
        reason.filter(|r| !r.is_empty()),
        message.filter(|m| !m.is_empty()),
    ) {
        (Some(reason), Some(message)) => Some(format!("{reason}: {message}")),
        (one, other) => one.or(other).map(str::to_owned),
    }
}

impl From<&Pod> for AgentPod {
    fn from(pod: &Pod) -> AgentPod {
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        // A daemon pod not scheduled yet names its node in the affinity its DaemonSet gave it.
        let meant_for = spec
            .and_then(|s| s.affinity.as_ref()?.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flat_map(|required| &required.node_selector_terms)
            .flat_map(|term| term.match_fields.iter().flatten())
            .find(|field| field.key == "metadata.name" && field.operator == "In")
            .and_then(|field| field.values.as_ref()?.first().cloned());
        let unscheduled = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .and_then(|c| reason_message(c.reason.as_ref(), c.message.as_ref()));
        let container = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|statuses| statuses.first());
        let waiting = container
            .and_then(|c| c.state.as_ref()?.waiting.as_ref())
            .and_then(|w| reason_message(w.reason.as_ref(), w.message.as_ref()));
        let last_ended = container
            .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
            .map(|t| match &t.reason {
                Some(reason) => format!("{reason}, exit code {}", t.exit_code),
                None => format!("exit code {}", t.exit_code),
            });
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
        AgentPod {
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty())
                .or(meant_for),
            ended: matches!(phase.as_str(), "Failed" | "Succeeded")
                .then(|| reason_message(status?.reason.as_ref(), status?.message.as_ref()))
                .flatten(),
            phase: match phase.is_empty() {
                true => "Pending".into(),
                false => phase,
            },
            deleting: pod.metadata.deletion_timestamp.is_some(),
            unscheduled,
            waiting,
            restarts: container.map_or(0, |c| c.restart_count),
            last_ended,
        }
    }
}

impl AgentPod {
    /// Its state in a word or two, for a table cell: `pod ImagePullBackOff`, `pod Unschedulable`,
    /// `pod Running`.
    pub fn short(&self) -> String {
        let reason = |why: &String| why.split(':').next().unwrap_or_default().to_owned();
        let word = (self.waiting.as_ref().or(self.unscheduled.as_ref()))
            .map(reason)
            .unwrap_or_else(|| self.phase.clone());
        format!("pod {word}")
    }

    /// The pod's state in a clause: `its pod pinboard-agent-containerd-7xk2p is Pending, its agent waiting:
    /// ImagePullBackOff: Back-off pulling image "…"`.
    pub fn words(&self) -> String {
        let mut words = format!("its pod {} is {}", self.name, self.phase);
        if self.deleting {
            words.push_str(" and being deleted");
        }
        if let Some(why) = &self.unscheduled {
            words.push_str(&format!(", not scheduled: {why}"));
        }
        if let Some(why) = &self.ended {
            words.push_str(&format!(": {why}"));
        }
        if let Some(why) = &self.waiting {
            words.push_str(&format!(", its agent waiting: {why}"));
        }
        if self.restarts > 0 {
            let times = match self.restarts {
                1 => "1 restart".to_string(),
                n => format!("{n} restarts"),
            };
            words.push_str(&match &self.last_ended {
                Some(how) => format!(" ({times}, the last run ended: {how})"),
                None => format!(" ({times})"),
            });
        }
        words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> AgentPod {
        AgentPod::from(&serde_json::from_value::<Pod>(value).unwrap())
    }

    #[test]
    fn a_pod_pulling_its_image_in_vain_is_pending_with_the_kubelets_reason() {
        let pending = pod(serde_json::json!({
            "metadata": {"name": "pinboard-agent-containerd-7xk2p"},
            "spec": {"nodeName": "n4", "containers": [{"name": "agent"}]},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "agent", "image": "unused.invalid/pinboard:none", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                    "message": "Back-off pulling image \"unused.invalid/pinboard:none\""}},
            }]},
        }));
        assert_eq!(pending.node.as_deref(), Some("n4"));
        assert_eq!(pending.short(), "pod ImagePullBackOff");
        assert_eq!(
            pending.words(),
            "its pod pinboard-agent-containerd-7xk2p is Pending, its agent waiting: ImagePullBackOff: \
             Back-off pulling image \"unused.invalid/pinboard:none\""
        );
    }

    #[test]
    fn a_crash_looping_pod_says_how_often_and_how_its_last_run_ended() {
        let looping = pod(serde_json::json!({
            "metadata": {"name": "pinboard-agent-containerd-q9"},
            "spec": {"nodeName": "n4", "containers": [{"name": "agent"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": "back-off 2m40s restarting failed container=agent"}},
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
            }]},
        }));
        assert_eq!(
            looping.words(),
            "its pod pinboard-agent-containerd-q9 is Running, its agent waiting: CrashLoopBackOff: \
             back-off 2m40s restarting failed container=agent (5 restarts, the last run ended: Error, \
             exit code 2)"
        );
    }

    #[test]
    fn an_unscheduled_pod_names_the_node_it_was_made_for_and_the_schedulers_reason() {
        let unscheduled = pod(serde_json::json!({
            "metadata": {"name": "pinboard-agent-containerd-zz"},
            "spec": {"containers": [{"name": "agent"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n4"]}]}
                ]}
            }}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match node selector.",
            }]},
        }));
        assert_eq!(unscheduled.node.as_deref(), Some("n4"));
        assert_eq!(unscheduled.short(), "pod Unschedulable");
        assert_eq!(
            unscheduled.words(),
            "its pod pinboard-agent-containerd-zz is Pending, not scheduled: Unschedulable: 0/4 nodes are \
             available: 1 Insufficient cpu, 3 node(s) didn't match node selector."
        );
    }

    #[test]
    fn an_evicted_pod_and_one_without_status_yet() {
        let evicted = pod(serde_json::json!({
            "metadata": {"name": "p", "deletionTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"nodeName": "n4", "containers": [{"name": "agent"}]},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
        }));
        assert_eq!(
            evicted.words(),
            "its pod p is Failed and being deleted: Evicted: The node was low on resource: memory."
        );
        let fresh = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "agent"}]},
        }));
        assert_eq!(fresh.words(), "its pod p is Pending");
        assert_eq!(fresh.short(), "pod Pending");
        assert_eq!(fresh.node, None);
    }
}

//! What an agent tells an administrator through Kubernetes Events: a set pinned on its node, a pull
//! failed for good, no space, an image or pin lost and put back, the gate lifted, the cache role taken;
//! and, from the aggregating agent, a set's news over all its nodes ([`set_news`]). Pure: the agent's state
//! decides which [`Note`] to record; the backend writes it ([`crate::backend::events`]).

use super::pinboard_api::PinSetStatus;

/// Whether an Event is news or a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Normal,
    Warning,
}

/// One Event to record about the node's PinboardNode (related to `set`'s PinSet when it names one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub kind: Kind,
    /// CamelCase: `Pinned`, `PullFailed`, `NoSpace`, `ImageLost`, `Restored`, `GateLifted`…
    pub reason: &'static str,
    /// What the agent did: `RollOut`, `Restore`, `LiftGate`, `ServeCache`.
    pub action: &'static str,
    pub message: String,
    pub set: Option<String>,
}

impl Note {
    pub fn normal(reason: &'static str, action: &'static str, message: String) -> Note {
        Note {
            kind: Kind::Normal,
            reason,
            action,
            message,
            set: None,
        }
    }

    pub fn warning(reason: &'static str, action: &'static str, message: String) -> Note {
        Note {
            kind: Kind::Warning,
            ..Note::normal(reason, action, message)
        }
    }

    /// About set `name`.
    pub fn of_set(self, name: &str) -> Note {
        Note {
            set: Some(name.to_owned()),
            ..self
        }
    }
}

/// What a set's summary changing from `before` (None: never summed up) to `after` tells an administrator
/// about the set as a whole: ready on every node it lands on, nodes newly failed, nodes restoring what was
/// lost. A node's own Events say which and why.
pub fn set_news(before: Option<&PinSetStatus>, after: &PinSetStatus) -> Vec<Note> {
    let was = before.cloned().unwrap_or_default();
    let mut news = Vec::new();
    let ready = |s: &PinSetStatus| s.nodes > 0 && s.ready == s.nodes;
    let generation_changed =
        before.is_some_and(|b| b.observed_generation != after.observed_generation);
    if ready(after) && (!ready(&was) || generation_changed) {
        news.push(Note::normal(
            "Ready",
            "RollOut",
            format!(
                "pinned on all {} nodes it lands on (generation {})",
                after.nodes, after.observed_generation
            ),
        ));
    }
    let more = |now: i64, then: i64, what: &str, reason: &'static str| {
        (now > then).then(|| {
            Note::warning(
                reason,
                "RollOut",
                format!(
                    "{now} of {} nodes {what}; `pinboard status --set NAME` names them and why",
                    after.nodes
                ),
            )
        })
    };
    news.extend(more(after.failed, was.failed, "failed", "NodesFailed"));
    news.extend(more(
        after.restoring,
        was.restoring,
        "restoring images or pins lost since they were pinned",
        "NodesRestoring",
    ));
    news
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(nodes: i64, ready: i64, failed: i64, restoring: i64) -> PinSetStatus {
        PinSetStatus {
            observed_generation: 1,
            nodes,
            ready,
            failed,
            restoring,
            ..PinSetStatus::default()
        }
    }

    #[test]
    fn a_sets_news_is_said_once_when_it_happens() {
        let reasons = |before: Option<&PinSetStatus>, after| -> Vec<&str> {
            set_news(before, &after).iter().map(|n| n.reason).collect()
        };
        assert_eq!(reasons(None, status(3, 1, 0, 0)), Vec::<&str>::new());
        assert_eq!(
            reasons(Some(&status(3, 1, 0, 0)), status(3, 3, 0, 0)),
            ["Ready"]
        );
        assert_eq!(
            reasons(Some(&status(3, 3, 0, 0)), status(3, 3, 0, 0)),
            Vec::<&str>::new(),
            "nothing new"
        );
        assert_eq!(
            reasons(Some(&status(3, 3, 0, 0)), status(3, 2, 1, 0)),
            ["NodesFailed"]
        );
        assert_eq!(
            reasons(Some(&status(3, 2, 1, 0)), status(3, 2, 1, 0)),
            Vec::<&str>::new()
        );
        assert_eq!(
            reasons(Some(&status(3, 3, 0, 0)), status(3, 2, 0, 1)),
            ["NodesRestoring"]
        );
        let failed = &set_news(Some(&status(3, 3, 0, 0)), &status(3, 1, 2, 0))[0];
        assert!(
            failed.message.starts_with("2 of 3 nodes failed"),
            "{}",
            failed.message
        );
    }
}

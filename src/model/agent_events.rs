//! What an agent tells an administrator through Kubernetes Events: a set pinned on its node, a pull
//! failed for good, no space, an image or pin lost and put back, the gate lifted, the cache role taken.
//! Pure: the agent's state decides which [`Note`] to record; the backend writes it
//! ([`crate::backend::events`]).

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

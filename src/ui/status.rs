//! Glyph and word for every status pinboard shows; the tone picks the theme color.

use crate::model::machine_config::SetProgress;
use crate::model::plan::Verdict;
use crate::model::rollout::{ImageState, NodeState, PinMethod};

/// `✓ fits`, `! tight`, `✗ no-space`, `? unknown`.
pub fn verdict_label(verdict: Verdict) -> String {
    let glyph = match verdict {
        Verdict::Fits => "✓",
        Verdict::Tight => "!",
        Verdict::NoSpace => "✗",
        Verdict::Unknown => "?",
    };
    format!("{glyph} {}", verdict.as_str())
}

/// Which theme color a rollout status takes (`[status]` keys in themes/*.toml).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Ok,
    Active,
    Warn,
    Error,
    Idle,
}

impl Tone {
    pub const ALL: [Tone; 5] = [Tone::Ok, Tone::Active, Tone::Warn, Tone::Error, Tone::Idle];

    pub fn key(self) -> &'static str {
        match self {
            Tone::Ok => "ok",
            Tone::Active => "active",
            Tone::Warn => "warn",
            Tone::Error => "error",
            Tone::Idle => "idle",
        }
    }
}

/// A status as shown: glyph, word and tone, never the color alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub glyph: &'static str,
    pub word: &'static str,
    pub tone: Tone,
}

const fn status(glyph: &'static str, word: &'static str, tone: Tone) -> Status {
    Status { glyph, word, tone }
}

/// An image on a node; `stalled` (no byte progress for a while) only matters while pulling.
pub fn image_status(state: &ImageState, stalled: bool) -> Status {
    match state {
        ImageState::Pulling { .. } if stalled => status("‖", "stalled", Tone::Warn),
        ImageState::Queued => status("·", "queued", Tone::Idle),
        ImageState::Present => status("=", "present", Tone::Ok),
        // How many layers are remote: the detail line says.
        ImageState::Lazy { .. } => status("~", "lazy", Tone::Warn),
        ImageState::Pulling { .. } => status("↓", "pulling", Tone::Active),
        ImageState::Retrying { .. } => status("↻", "retrying", Tone::Active),
        ImageState::Pulled { .. } => status("●", "pulled", Tone::Ok),
        ImageState::Pinned { confirmed: true } => status("✓", "pinned", Tone::Ok),
        // Written, but the runtime does not report pins (containerd < 1.7): the detail line says so.
        ImageState::Pinned { confirmed: false } => status("✓", "pinned*", Tone::Ok),
        ImageState::Failed { .. } => status("✗", "failed", Tone::Error),
        ImageState::Cancelled => status("⊘", "cancelled", Tone::Idle),
        ImageState::Skipped => status("-", "skipped", Tone::Idle),
        // Pinned once, then gone from the node or unpinned: the detail line says which.
        ImageState::Lost { .. } => status("!", "lost", Tone::Error),
    }
}

/// A node's rollout; `stalled` when any of its pulls is.
pub fn node_status(state: &NodeState, stalled: bool) -> Status {
    match state {
        NodeState::Pulling { .. } if stalled => status("‖", "stalled", Tone::Warn),
        NodeState::Waiting => status("·", "waiting", Tone::Idle),
        NodeState::Refused { .. } => status("⊘", "refused", Tone::Warn),
        NodeState::Pulling { .. } => status("↓", "pulling", Tone::Active),
        NodeState::Stopped { .. } => status("■", "stopped", Tone::Error),
        NodeState::Pinned {
            confirmed: true, ..
        } => status("✓", "pinned", Tone::Ok),
        NodeState::Pinned {
            confirmed: false, ..
        } => status("✓", "pinned*", Tone::Ok),
        NodeState::PinFailed { .. } => status("✗", "pin-failed", Tone::Error),
        NodeState::Restoring { .. } => status("↺", "restoring", Tone::Warn),
    }
}

/// How a node enforces pins, as the Nodes screen names it.
pub fn pin_method_label(method: Option<PinMethod>) -> &'static str {
    match method {
        Some(PinMethod::CrioDropIn) => "CRI-O drop-in",
        Some(PinMethod::ContainerdLabel) => "containerd label",
        None => "unknown",
    }
}

/// Where a node is with a set, in cluster mode. `slow` is the daemon's sync window ending while it still
/// pulls: a warning, not a failure.
pub fn set_state_status(state: &SetProgress) -> Status {
    match state {
        SetProgress::Done => status("✓", "done", Tone::Ok),
        SetProgress::Progressing { .. } => status("↓", "pulling", Tone::Active),
        SetProgress::Waiting => status("·", "waiting", Tone::Idle),
        SetProgress::SlowButWorking { .. } => status("↻", "slow", Tone::Warn),
        SetProgress::Failed { .. } => status("✗", "failed", Tone::Error),
        SetProgress::Unknown => status("?", "unknown", Tone::Idle),
    }
}

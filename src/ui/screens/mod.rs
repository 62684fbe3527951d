//! The five screens, a module each; the Rollout screen has two, direct mode's engine rollout and cluster
//! mode's. Each reads the state and draws into its area with [`super::widgets`]; tables build rows for
//! the visible window only.

pub(super) mod config;
pub(super) mod nodes;
pub(super) mod plan;
pub(super) mod rollout;
pub(super) mod rollout_cluster;
pub(super) mod sets;

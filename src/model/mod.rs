//! Pure domain logic: no I/O, no async. Everything here is unit-tested on its own.

pub mod agents_view;
pub mod cluster_session;
pub mod config_view;
pub mod crio;
pub mod diff;
pub mod export;
pub mod holders;
pub mod image;
pub mod labels;
pub mod lazy;
pub mod machine_config;
pub mod mirror_rules;
pub mod node_report;
pub mod node_summary;
pub mod pinboard_api;
pub mod plan;
pub mod readiness;
pub mod reference;
pub mod release_payload;
pub mod rollout;
pub mod runtime;
pub mod served;
pub mod set;
pub mod units;
pub mod wiring;

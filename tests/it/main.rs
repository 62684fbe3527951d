//! The integration tests, one binary: each suite is a module here, all sharing the lab (`support`), which
//! is compiled and linked once. A suite is selected by its module path: `cargo test --test it apply::`.
//!
//! The suites run side by side in this one process, so none may change what the process shares: its
//! environment, current directory, signal dispositions or global `tracing` subscriber (`support::logs`
//! captures logs); child processes get their settings through `Command`.

mod agents;
mod agents_fanout;
mod agents_losses;
mod agents_operations;
mod agents_peers;
mod agents_plan;
mod agents_rbac;
mod support;

mod alert_rules;
mod apply;
mod blob_cache;
mod check;
mod cli;
mod cluster;
mod cluster_cli;
mod cluster_pull_secret;
mod crio;
mod crio_versions;
mod engine;
mod fanout;
mod kube_cluster;
mod kustomize;
mod lab_smoke;
mod lazy;
mod measured;
mod mirror;
mod pins;
mod plan;
mod plan_errors;
mod private_registry;
mod rbac;
mod registry;
mod registry_mirrors;
mod release;
mod runtimes;
mod site_tls;
mod stargz;
mod tui_cluster;
mod tui_e2e;
mod tui_panic;

/// The CRI-O stand-in's process: `support::crio` runs this binary again with only this test.
#[test]
#[ignore = "the CRI-O stand-in's process, started by support::crio"]
fn crio_stand_in() {
    support::crio::serve();
}

//! The lab: real containerd nodes, a real docker-registry behind a controllable TCP proxy (optionally behind
//! a token service, over TLS with a site CA, or asking for client certificates), and (optionally) a real
//! etcd + kube-apiserver, or a whole plain Kubernetes cluster with real kubelets, controller manager and
//! scheduler, all started as local processes for integration tests and the `lab` example; stand-ins,
//! speaking the real formats, for what cannot run here (CRI-O, and the kubelet of an OpenShift lab).
//!
//! The test binary (tests/it/main.rs) declares it with `mod support;`; the benches and the example include
//! it with `#[path = "../tests/it/support/mod.rs"] mod support;`, allowing what only the tests use to be
//! unused there.
//! Start with [`Lab::start`]; everything it starts is stopped when the [`Lab`] is dropped. How the pieces are
//! run on this machine is described in docs/lab.md.

pub mod agents;
mod apiserver;
mod binary_image;
pub mod cluster;
mod cri;
pub mod crio;
pub mod crio_node;
pub mod estargz;
pub mod fan_out;
mod figures;
pub mod http;
pub mod hup;
mod images;
pub mod kube_cluster;
pub mod kube_objects;
pub mod kubelet;
pub mod lab;
pub mod link;
pub mod logs;
pub mod network;
mod node;
mod node_sandbox;
mod pki;
pub mod private;
mod process;
pub mod prometheus;
mod proxy;
mod registry;
pub mod release;
mod run;
pub mod runtime;
pub mod stargz;
pub mod tmux;
mod token;
pub mod unit;

pub use apiserver::cached_binary;
pub use figures::assert_within;
pub use images::{ImageSpec, LayerFormat, LayerSpec, Platform, PushedImage, unique_bytes};
pub use kube_cluster::ClusterConfig;
pub use lab::{Lab, LabConfig};
pub use node::{Node, NodeSpec};
pub use process::free_port;
pub use registry::{RegistrySetup, RegistryTls};
pub use run::{Run, binary, isolated, pinboard, pinboard_with};
pub use runtime::Runtime;
pub use token::{TokenConfig, TokenUser};

//! The lab: real containerd nodes, a real docker-registry behind a controllable TCP proxy (optionally behind
//! a token service, over TLS with a site CA, or asking for client certificates), and (optionally) a real
//! etcd + kube-apiserver, all started as local processes for integration tests and the `lab` example;
//! stand-ins, speaking the real formats, for what cannot run here (kubelet, machine-config daemon, CRI-O).
//!
//! Tests include it with `mod support;`, the example with `#[path = "../tests/support/mod.rs"] mod support;`.
//! Start with [`Lab::start`]; everything it starts is stopped when the [`Lab`] is dropped. How the pieces are
//! run on this machine is described in shared/notes/lab.md.

// Every test binary and the example compile this module separately and each uses only part of it, so an
// item used by one of them is "dead" in the others. Every item here is used by at least one of them.
#![allow(dead_code)]

mod apiserver;
pub mod cluster;
mod cri;
pub mod crio;
pub mod daemon;
pub mod http;
pub mod hup;
mod images;
pub mod kubelet;
mod lab;
mod node;
mod pki;
pub mod private;
mod process;
mod proxy;
mod registry;
pub mod release;
mod run;
pub mod tmux;
mod token;

// Each including crate uses some of these re-exports, none uses all (see `dead_code` above).
#[allow(unused_imports)]
pub use apiserver::ApiServer;
#[allow(unused_imports)]
pub use images::{
    ImageSpec, LayerFormat, LayerSpec, Platform, PushedImage, PushedIndex, PushedLayer,
};
#[allow(unused_imports)]
pub use lab::{Lab, LabConfig, target_dir};
#[allow(unused_imports)]
pub use node::{Node, NodeSpec};
#[allow(unused_imports)]
pub use pki::SitePki;
#[allow(unused_imports)]
pub use process::free_port;
#[allow(unused_imports)]
pub use proxy::ProxyControl;
#[allow(unused_imports)]
pub use registry::{RegistrySetup, RegistryTls};
#[allow(unused_imports)]
pub use run::{Run, isolated, pinboard, pinboard_with};
#[allow(unused_imports)]
pub use token::{TokenConfig, TokenRequest, TokenService, TokenUser};

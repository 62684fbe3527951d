//! The outside world: CRI and containerd sockets, registries and their credentials.

pub mod credentials;
pub mod cri;
pub mod node;
pub mod proto;
pub mod registry;

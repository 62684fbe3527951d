//! The nodes pinboard works on directly: where each is reached (its CRI endpoint), and how pinboard changes
//! it (pins, lazy pulling, fan-out's files).

use super::cri::CriEndpoint;
use super::lazy::LazyConfig;
use super::pins::PinTarget;
use super::wiring::WiringPaths;

/// A node named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectNode {
    pub name: String,
    pub endpoint: CriEndpoint,
}

/// A node and how pinboard changes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTarget {
    pub node: DirectNode,
    pub pin: PinTarget,
    pub lazy: LazyConfig,
    /// Where fan-out points the node's runtime at pinboard.
    pub wiring: WiringPaths,
}

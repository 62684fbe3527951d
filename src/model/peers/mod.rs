//! Nodes serving each other a fan-out set's blobs, so that a set reaches thousands of nodes in about the
//! time it reaches one while each blob still crosses the registry link once, into the cache's holder.
//!
//! - [`pieces`]: a blob cut into pieces, each verified on its own against the hash the holder publishes,
//!   dealt into stripes.
//! - [`swarm`]: the tracker the holder runs per blob: which node takes which stripe from whom (a forest of
//!   stripe trees), and who is dropped for serving corrupt pieces.
//! - [`fetch`]: one node taking one blob in: which pieces it holds, what to ask for next, the verified
//!   prefix the runtime reads.
//! - [`wire`]: what nodes and the tracker say to each other, and a piece checked against its hash.
//!
//! Pure: the holder's tracker and every node's relay run it, and so does the simulation
//! (`benches/fan_out_scale.rs`).

pub mod fetch;
pub mod pieces;
pub mod swarm;
pub mod wire;

pub use fetch::Fetch;
pub use pieces::Geometry;
pub use swarm::{Loss, Parent, Placement, Swarm};
pub use wire::{Answer, Cut, Cutter, ParentAt};

//! Fetch once, fan out: a blob cache filled from the source registries, and a read-only registry endpoint
//! over it, so that every blob of a set crosses the registry link once however many nodes pull it.
//!
//! - [`cache`]: [`BlobCache`], content-addressed on disk; one download per digest shared by every reader,
//!   resumed with `Range` after a drop, verified before it counts as complete, bounded by `--cache-max`.
//! - [`endpoint`]: [`Endpoint`], the pull side of the OCI distribution API over the cache, for the digests
//!   of the sets only ([`crate::model::served::ServedDigests`]).
//! - [`tracker`]: [`Tracker`], the holder's who-takes-what-from-whom for nodes serving each other.
//! - [`peers`]: [`Peers`], a node serving the pieces it took to other nodes, and taking each blob from
//!   the parents the tracker names, every piece checked against the holder's hash.
//! - [`cluster_client`]: the plain-HTTP client agents reach the cache and each other with.
//! - [`relay`]: [`Relay`], a node's own mirror passing its pulls on to the in-cluster cache's endpoint,
//!   riding out the cache's restarts.
//!
//! `pinboard mirror` serves the endpoint on its own; nodes reach it as a registry mirror.

pub mod cache;
pub mod cluster_client;
pub mod endpoint;
pub mod peers;
pub mod relay;
pub mod serving_cap;
pub mod tracker;
pub mod upstream;

pub use cache::{Blob, BlobCache, BlobError, CacheOptions};
pub use endpoint::{Endpoint, EndpointStats};
pub use peers::{PeerSetup, Peers};
pub use relay::Relay;
pub use serving_cap::ServingCap;
pub use tracker::Tracker;
pub use upstream::{Locate, Upstream};

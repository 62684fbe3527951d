//! Fetch once, fan out: a blob cache filled from the source registries, and a read-only registry endpoint
//! over it, so that every blob of a set crosses the registry link once however many nodes pull it.
//!
//! - [`cache`]: [`BlobCache`], content-addressed on disk; one download per digest shared by every reader,
//!   resumed with `Range` after a drop, verified before it counts as complete, bounded by `--cache-max`.
//! - [`endpoint`]: [`Endpoint`], the pull side of the OCI distribution API over the cache, for the digests
//!   of the sets only ([`crate::model::served::ServedDigests`]).
//! - [`relay`]: [`Relay`], a node's own mirror passing its pulls on to the in-cluster cache's endpoint,
//!   riding out the cache's restarts.
//!
//! `pinboard mirror` serves the endpoint on its own; nodes reach it as a registry mirror.

pub mod cache;
pub mod endpoint;
pub mod relay;

pub use cache::{Blob, BlobCache, BlobError, CacheOptions};
pub use endpoint::{Endpoint, EndpointStats};
pub use relay::{Locate, Relay, Upstream};

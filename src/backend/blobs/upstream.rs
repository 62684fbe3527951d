//! Where a node finds the in-cluster cache: the address its holder serves at and the cache's token, as
//! the cache's Lease and Secret say now (the holder may move). The relay and the node's peers follow it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::model::cache_token::CacheToken;

/// Where the cache is: its address (`http://IP:PORT`) and its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub address: String,
    pub token: CacheToken,
}

/// Finds the cache (its holder may have moved); None while no one serves it.
pub type Locate =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<Upstream>> + Send>> + Send + Sync>;

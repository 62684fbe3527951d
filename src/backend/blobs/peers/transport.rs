//! How a node's peer side reaches the holder's tracker and its parents: over HTTP in the product
//! ([`super::http::Http`]), in process in the simulation at scale (`benches/fan_out_scale`), so both run
//! the same joining, taking and replacing code.

use std::ops::Range;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::backend::blobs::upstream::Upstream;
use crate::model::peers::wire::{Answer, Cut, ParentAt};

/// Why the tracker gave no answer.
#[derive(Debug)]
pub enum Unanswered {
    /// It does not know the node in this blob's swarm (the holder restarted or moved): join again.
    NotPlaced,
    /// It cannot be reached, or refused, with why.
    Failed(String),
}

/// Why a piece (or a cut) did not come from a parent.
#[derive(Debug)]
pub enum Missed {
    /// The parent holds it not yet: ask again.
    NotYet,
    Gone(String),
}

/// A request of the tracker, as one node sends it.
pub struct Ask<'a> {
    pub upstream: &'a Upstream,
    /// The node asking.
    pub node: &'a str,
}

/// What a node's peer side sends to the tracker and to its parents.
pub trait Transport: Send + Sync {
    /// The node's parents for the blob the runtime asked for at `target` (`/v2/<name>/blobs/<digest>?ns=…`),
    /// the node serving its pieces at `address`.
    fn join<'a>(
        &'a self,
        ask: Ask<'a>,
        target: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>>;

    /// Another parent for stripe `stripe_of.1` of blob `stripe_of.0`, the node having lost `from` (a
    /// node's name or `holder`), corrupt with why or gone.
    fn lost<'a>(
        &'a self,
        ask: Ask<'a>,
        stripe_of: (&'a str, usize),
        from: &'a str,
        corrupt: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Answer, Unanswered>>;

    /// The node holds the whole of `digest`.
    fn done<'a>(&'a self, ask: Ask<'a>, digest: &'a str) -> BoxFuture<'a, ()>;

    /// Bytes `range` (one piece) of the blob `(target, digest)` from `parent` (the runtime asked for it
    /// at `target`, `/v2/<name>/blobs/<digest>?ns=…`).
    fn piece<'a>(
        &'a self,
        upstream: &'a Upstream,
        parent: &'a ParentAt,
        blob: (&'a str, &'a str),
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, Missed>>;

    /// The cut of `digest` as `parent` took it (checked by the caller against the digest the tracker
    /// named).
    fn cut<'a>(
        &'a self,
        upstream: &'a Upstream,
        parent: &'a ParentAt,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Cut, Missed>>;
}

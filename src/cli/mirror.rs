//! `pinboard mirror --listen ADDR`: the blob cache's read-only registry endpoint on its own, for nodes that
//! pinboard does not wire itself (an OpenShift ImageDigestMirrorSet, a hosts.toml or registries.conf written
//! by hand). It surveys the sets' images in their registries (no node needed), serves their digests until
//! SIGINT or SIGTERM, then prints the bytes fetched over the link and the bytes served.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use serde::Serialize;

use super::output;
use crate::backend::blobs::{BlobCache, Endpoint, EndpointStats};
use crate::error::Failure;
use crate::model::units::human;
use crate::options::{CommonArgs, registry_client};
use crate::survey::served_digests;

/// `mirror`'s arguments: the common list, and where to listen.
#[derive(Args, Debug)]
pub struct MirrorArgs {
    /// Address to serve the registry endpoint on, e.g. 0.0.0.0:5050 (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What `mirror` prints on exit.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    images: usize,
    #[serde(flatten)]
    stats: EndpointStats,
}

pub async fn run(args: MirrorArgs) -> Result<String, Failure> {
    let common = &args.common;
    let sources = common.input.sources();
    let sets = crate::fleet::sets::read(&sources, true)?;
    let platform = common.targets.platform()?;
    let cache_dir = common.cache.dir()?;
    let registry = Arc::new(registry_client(&common.registry)?);
    // The cache first: a directory that cannot be used is known before any registry is asked.
    let cache = BlobCache::open(&cache_dir, common.cache.options(), Arc::clone(&registry))
        .map_err(|e| Failure::bad_input(e.to_string()))?;
    let (releases, notes) = crate::fleet::sets::releases(&sources, &registry, &platform).await?;
    for note in notes {
        eprintln!("{note}");
    }
    let sets = [sets, releases].concat();
    let (facts, allowed) = served_digests(&sets, &registry, &platform)
        .await
        .map_err(Failure::from)?;
    let blobs = allowed.blobs();
    let serving = format!(
        "{} images ({} manifests, {} blobs of {}, {} of them cached) of {}",
        facts.len(),
        allowed.manifest_count(),
        blobs.len(),
        human(blobs.iter().map(|(_, _, size)| size).sum()),
        blobs
            .iter()
            .filter(|(_, digest, _)| cache.has(digest))
            .count(),
        allowed
            .registries()
            .into_iter()
            .collect::<Vec<_>>()
            .join(", "),
    );
    let endpoint = Endpoint::start(args.listen, Arc::clone(&cache), allowed, None)
        .await
        .map_err(|e| {
            Failure::bad_input(format!(
                "cannot listen on {}: {e}; pass another --listen",
                args.listen
            ))
        })?;
    let mut signals = super::Interrupts::new()?;
    eprintln!(
        "pinboard mirror: serving {serving} at {} (cache {}, {} stored); Ctrl-C stops",
        endpoint.url(),
        cache.dir().display(),
        human(cache.stored_bytes()),
    );
    signals.recv().await;
    let summary = Summary {
        images: facts.len(),
        stats: endpoint.stop().await,
    };
    output::render(&summary, common.output(), || {
        format!(
            "fetched from the link: {} ({} bytes)\nserved: {} ({} bytes) in {} requests, {} refused\n",
            human(summary.stats.link_bytes),
            summary.stats.link_bytes,
            human(summary.stats.served_bytes),
            summary.stats.served_bytes,
            summary.stats.requests,
            summary.stats.refused,
        )
    })
}

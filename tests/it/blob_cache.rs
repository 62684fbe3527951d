//! The blob cache against the lab registry, through the lab proxy and its faults: resets, a registry that
//! ignores `Range`, 503 and 429 with `Retry-After`, stalls, a trickle, a restart of the cache, concurrent
//! readers, eviction, and a blob corrupted in the registry's storage. The bytes the proxy forwarded are the
//! bytes that crossed the link.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use pinboard::backend::blobs::{BlobCache, BlobError, CacheOptions, Endpoint};
use pinboard::backend::registry::Registry;
use pinboard::model::served::{ServedDigests, Source};
use sha2::Digest as _;
use support::logs::LogCapture;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, PushedImage};

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
/// Response headers and error bodies on top of the blob bytes, per request, generously.
const OVERHEAD_PER_REQUEST: u64 = 2 * KI;

/// A lab registry (no nodes), one pushed image with layers of these sizes, and a registry client that
/// reaches the registry through the proxy.
struct Setup {
    lab: Lab,
    image: PushedImage,
    source: Source,
    registry: Arc<Registry>,
    dir: tempfile::TempDir,
}

fn setup(name: &str, layers: &[u64]) -> Setup {
    let lab = Lab::start(name, LabConfig::default()).expect("lab starts");
    let spec = ImageSpec {
        layers: layers
            .iter()
            .enumerate()
            .map(|(i, &bytes)| LayerSpec {
                seed: 5000 + i as u64,
                bytes: bytes as usize,
                format: LayerFormat::Gzip,
            })
            .collect(),
        ..ImageSpec::default()
    };
    let image = lab.push_image("cache/app", &spec).expect("push");
    let registry = lab.registry_client();
    Setup {
        source: Source {
            registry: lab.proxy_host(),
            repository: "cache/app".into(),
        },
        image,
        registry: Arc::new(registry),
        dir: tempfile::tempdir().expect("temp dir"),
        lab,
    }
}

impl Setup {
    fn cache(&self, options: CacheOptions) -> Arc<BlobCache> {
        BlobCache::open(self.dir.path(), options, Arc::clone(&self.registry)).expect("cache opens")
    }

    /// (digest, size) of layer `i`.
    fn layer(&self, i: usize) -> (String, u64) {
        let layer = &self.image.layers[i];
        (layer.digest.clone(), layer.size)
    }

    /// Heads of the GETs of `digest` the registry was asked for, lower-cased.
    fn gets_of(&self, digest: &str) -> Vec<String> {
        self.lab
            .proxy()
            .request_heads()
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .filter(|h| h.starts_with("get ") && h.contains(&format!("/blobs/{digest}")))
            .collect()
    }

    /// The cached file of a complete blob.
    fn cached(&self, digest: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("sha256")
            .join(digest.trim_start_matches("sha256:"))
    }

    fn partial(&self, digest: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("partial")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// Asserts that the blob is complete, its file hashes to its digest, and what crossed the link stays
    /// within `extra` bytes plus the overhead of the requests made.
    fn assert_fetched_once(&self, cache: &BlobCache, digest: &str, size: u64, extra: u64) {
        assert!(cache.has(digest), "{digest} complete");
        let bytes = std::fs::read(self.cached(digest)).expect("cached file");
        assert_eq!(sha256(&bytes), digest);
        let requests = self.lab.proxy().requests();
        let down = self.lab.proxy().bytes_down();
        let bound = size + extra + requests * OVERHEAD_PER_REQUEST;
        assert!(
            down <= bound,
            "the link carried {down} bytes for a blob of {size} (+{extra}, {requests} requests); lab: {}",
            self.lab.dir().display()
        );
        assert!(!self.partial(digest).exists(), "no partial file left");
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn options(stall_after: Duration) -> CacheOptions {
    CacheOptions {
        stall_after,
        ..CacheOptions::default()
    }
}

#[test]
fn a_reset_connection_is_resumed_with_range_and_the_blob_crosses_the_link_once() {
    let setup = setup("cache-reset", &[4 * MI]);
    let (digest, size) = setup.layer(0);
    setup.lab.proxy().reset_after(MI, None);
    let cache = setup.cache(CacheOptions::default());
    runtime()
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect("fetched despite the resets");

    let gets = setup.gets_of(&digest);
    assert!(
        gets.len() >= 4,
        "a 4 MiB blob through 1 MiB connections: {gets:?}"
    );
    assert!(!gets[0].contains("range:"), "{}", gets[0]);
    assert!(
        gets[1..].iter().all(|h| h.contains("range: bytes=")),
        "every later request resumes: {gets:?}"
    );
    setup.assert_fetched_once(&cache, &digest, size, 0);
    assert_eq!(cache.link_bytes(), size, "each byte taken once");
}

#[test]
fn a_registry_that_answers_200_to_a_range_is_restarted_from_zero_and_the_log_says_so() {
    let logs = LogCapture::start();
    let setup = setup("cache-no-range", &[3 * MI]);
    let (digest, size) = setup.layer(0);
    // The first connection breaks after 1 MiB; then the registry no longer sees the Range header.
    setup.lab.proxy().reset_after(MI, Some(1));
    setup.lab.proxy().set_ignore_range(true);
    let cache = setup.cache(CacheOptions::default());
    runtime()
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect("fetched");

    let gets = setup.gets_of(&digest);
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert!(
        gets[1].contains("range: bytes="),
        "asked to resume: {}",
        gets[1]
    );
    let logged = logs.text();
    let restart = logged
        .lines()
        .find(|l| l.contains(&digest) && l.contains("200, not 206"))
        .unwrap_or_else(|| panic!("no log line about the restart:\n{logged}"));
    assert!(restart.contains("WARN"), "{restart}");
    assert!(restart.contains("restarting it from byte 0"), "{restart}");
    // The first megabyte crossed twice; nothing else did.
    setup.assert_fetched_once(&cache, &digest, size, MI);
}

#[test]
fn answers_503_and_429_are_retried_after_their_retry_after_and_bounded() {
    let setup = setup("cache-503", &[256 * KI, 256 * KI, 256 * KI, 16 * KI]);
    let rt = runtime();
    // Two failures in a row are within the bound; a third is not.
    let cache = setup.cache(CacheOptions {
        retries: 2,
        ..CacheOptions::default()
    });
    // A first blob without faults: the registry's /v2/ ping for credentials is behind us.
    let (warm, size) = setup.layer(3);
    rt.block_on(cache.fetch(&setup.source, &warm, size))
        .expect("fetched");

    let (first, size) = setup.layer(0);
    setup.lab.proxy().fail_requests(503, 2, Some(1));
    let started = Instant::now();
    rt.block_on(cache.fetch(&setup.source, &first, size))
        .expect("fetched after two 503s");
    // Two waits of Retry-After: 1 (the backoff alone would wait 0.5 s, then 1 s).
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(setup.gets_of(&first).len(), 3);

    let (second, size) = setup.layer(1);
    setup.lab.proxy().fail_requests(429, 2, Some(0));
    rt.block_on(cache.fetch(&setup.source, &second, size))
        .expect("fetched after two 429s");
    assert_eq!(setup.gets_of(&second).len(), 3);

    // A registry that keeps failing: 1 + retries attempts, then the reason.
    let (third, size) = setup.layer(2);
    setup.lab.proxy().fail_requests(503, 100, Some(0));
    let error = rt
        .block_on(cache.fetch(&setup.source, &third, size))
        .expect_err("gives up");
    assert!(
        matches!(error, BlobError::GaveUp { attempts: 3, .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&third) && message.contains("HTTP 503"),
        "{message}"
    );
    assert_eq!(setup.gets_of(&third).len(), 3);
    assert!(!cache.has(&third));
}

#[test]
fn a_stalled_connection_is_dropped_and_resumed() {
    let setup = setup("cache-stall", &[2 * MI]);
    let (digest, size) = setup.layer(0);
    setup.lab.proxy().stall_after(512 * KI, None);
    let cache = setup.cache(options(Duration::from_secs(1)));
    runtime()
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect("fetched despite the stalls");
    let gets = setup.gets_of(&digest);
    assert!(gets.len() >= 4, "{gets:?}");
    assert!(
        gets[1..].iter().all(|h| h.contains("range: bytes=")),
        "{gets:?}"
    );
    setup.assert_fetched_once(&cache, &digest, size, 0);
}

#[test]
fn a_trickle_is_slow_but_not_a_stall() {
    let setup = setup("cache-trickle", &[160 * KI]);
    let (digest, size) = setup.layer(0);
    // 8 KiB every 50 ms: about a second for the blob, never a second without a byte.
    setup
        .lab
        .proxy()
        .set_trickle(Some((8 * KI as usize, Duration::from_millis(50))));
    let cache = setup.cache(options(Duration::from_secs(1)));
    runtime()
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect("fetched");
    assert_eq!(
        setup.gets_of(&digest).len(),
        1,
        "one request, never resumed"
    );
    setup.assert_fetched_once(&cache, &digest, size, 0);
}

#[test]
fn a_partial_download_outlives_the_cache_and_is_resumed_after_a_restart() {
    let setup = setup("cache-restart", &[4 * MI]);
    let (digest, size) = setup.layer(0);
    setup.lab.proxy().set_bandwidth(Some(2 * MI));
    {
        // pinboard runs, and goes away mid-download: its runtime and every task with it.
        let first_run = runtime();
        let cache = setup.cache(CacheOptions::default());
        let source = setup.source.clone();
        let downloading = Arc::clone(&cache);
        let digest = digest.clone();
        first_run.spawn(async move { downloading.fetch(&source, &digest, size).await });
        drop(cache);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::metadata(setup.partial(&setup.layer(0).0)).map_or(0, |m| m.len()) < MI {
            assert!(Instant::now() < deadline, "the download did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        first_run.shutdown_background();
    }
    // The download task may finish dropping a moment after the runtime is told to stop.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cache = loop {
        match BlobCache::open(
            setup.dir.path(),
            CacheOptions::default(),
            Arc::clone(&setup.registry),
        ) {
            Ok(cache) => break cache,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let kept = std::fs::metadata(setup.partial(&digest)).unwrap().len();
    assert!(kept >= MI && kept < size, "{kept}");
    // The first run's connection is gone; wait until the proxy has noticed and sends nothing more.
    let mut before = setup.lab.proxy().bytes_down();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = setup.lab.proxy().bytes_down();
        if now == before {
            break;
        }
        before = now;
    }
    setup.lab.proxy().set_bandwidth(None);
    let requests_before = setup.lab.proxy().requests();
    runtime()
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect("resumed");
    let gets = setup.gets_of(&digest);
    let last = gets.last().unwrap();
    let resumed_at: u64 = last
        .split("range: bytes=")
        .nth(1)
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the second run asks for the rest: {last}"));
    assert!(resumed_at >= kept, "{resumed_at} < {kept}");
    let second_run = setup.lab.proxy().bytes_down() - before;
    let requests = setup.lab.proxy().requests() - requests_before;
    assert!(
        second_run <= size - resumed_at + requests * OVERHEAD_PER_REQUEST,
        "the second run took {second_run} bytes in {requests} requests"
    );
    // What was in flight when the first run died was lost with it (at most a few chunks of the cap).
    setup.assert_fetched_once(&cache, &digest, size, 256 * KI);
}

#[test]
fn concurrent_readers_share_one_download_and_get_bytes_as_they_arrive() {
    let setup = setup("cache-readers", &[3 * MI]);
    let (digest, size) = setup.layer(0);
    setup.lab.proxy().set_bandwidth(Some(2 * MI));
    let cache = setup.cache(CacheOptions::default());
    let rt = runtime();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let cache = Arc::clone(&cache);
            let (source, digest) = (setup.source.clone(), digest.clone());
            rt.spawn(async move {
                let blob = cache.blob(&source, &digest, size).expect("reader");
                let mut stream = blob.stream(0..size);
                let mut bytes = Vec::new();
                let mut complete_at_first_byte = None;
                while let Some(chunk) = stream.next().await {
                    complete_at_first_byte.get_or_insert_with(|| cache.has(&digest));
                    bytes.extend_from_slice(&chunk.expect("no error"));
                }
                (bytes, complete_at_first_byte)
            })
        })
        .collect();
    for reader in readers {
        let (bytes, complete_at_first_byte) = rt.block_on(reader).unwrap();
        assert_eq!(sha256(&bytes), digest, "every reader gets the blob");
        assert_eq!(
            complete_at_first_byte,
            Some(false),
            "the first bytes came while the download was under way"
        );
    }
    assert_eq!(setup.gets_of(&digest).len(), 1, "one upstream download");
    setup.assert_fetched_once(&cache, &digest, size, 0);
}

#[test]
fn eviction_removes_the_least_recently_used_blobs_that_no_reader_holds() {
    let setup = setup("cache-evict", &[MI, MI, MI, MI]);
    let layers: Vec<(String, u64)> = (0..4).map(|i| setup.layer(i)).collect();
    let largest = layers.iter().map(|(_, size)| *size).max().unwrap();
    let cache = setup.cache(CacheOptions {
        max_bytes: 3 * largest,
        ..CacheOptions::default()
    });
    let rt = runtime();
    let fetch = |i: usize| {
        rt.block_on(cache.fetch(&setup.source, &layers[i].0, layers[i].1))
            .expect("fetched")
    };
    let present = || -> Vec<bool> { layers.iter().map(|(d, _)| cache.has(d)).collect() };
    for i in 0..3 {
        fetch(i);
    }
    // Use A again, and hold B open: C is now the least recently used that is free.
    let _ = rt.block_on(async {
        let a = cache
            .blob(&setup.source, &layers[0].0, layers[0].1)
            .unwrap();
        a.stream(0..1).collect::<Vec<_>>().await
    });
    let held_b = {
        let _guard = rt.enter();
        cache
            .blob(&setup.source, &layers[1].0, layers[1].1)
            .unwrap()
    };
    fetch(3);
    assert_eq!(present(), [true, true, false, true], "C went, B was held");
    assert!(cache.stored_bytes() <= 3 * largest);
    assert!(!setup.cached(&layers[2].0).exists());

    // B is let go; C comes back, and A (used before B was opened) is now the oldest.
    drop(held_b);
    fetch(2);
    assert_eq!(present(), [false, true, true, true]);
    assert_eq!(setup.gets_of(&layers[2].0).len(), 2, "C was fetched again");
}

#[test]
fn a_blob_corrupted_in_the_registry_is_refused_fetched_once_more_and_never_kept() {
    let setup = setup("cache-corrupt", &[2 * MI, 64 * KI]);
    let (digest, size) = setup.layer(0);
    let stored = setup.lab.registry_blob_file(&digest);
    let mut bytes = std::fs::read(&stored).expect("the registry's copy");
    bytes[size as usize / 2] ^= 0xff;
    std::fs::write(&stored, &bytes).expect("corrupt it");
    let corrupt = sha256(&bytes);
    setup.lab.proxy().set_bandwidth(Some(4 * MI));
    let cache = setup.cache(CacheOptions::default());
    let rt = runtime();

    // A reader streaming the blob as it lands sees bytes, then an error instead of a clean end.
    let reader = {
        let cache = Arc::clone(&cache);
        let (source, digest) = (setup.source.clone(), digest.clone());
        rt.spawn(async move {
            let stream = cache.blob(&source, &digest, size).unwrap().stream(0..size);
            stream.collect::<Vec<_>>().await
        })
    };
    let error = rt
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect_err("refused");
    let chunks = rt.block_on(reader).unwrap();
    let (last, sent) = chunks.split_last().expect("something came");
    assert!(
        !sent.is_empty() && sent.iter().all(Result::is_ok),
        "bytes came first"
    );
    assert!(last.is_err(), "the stream ends in an error: {last:?}");
    let received: u64 = sent.iter().map(|c| c.as_ref().unwrap().len() as u64).sum();
    assert!(received < size, "the last byte was never sent");

    assert_eq!(
        error,
        BlobError::DigestMismatch {
            digest: digest.clone(),
            repository: setup.source.to_string(),
            actual: corrupt.clone(),
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("digest mismatch")
            && message.contains(&digest)
            && message.contains(&corrupt)
    );
    assert_eq!(
        setup.gets_of(&digest).len(),
        2,
        "discarded, fetched once more, failed"
    );
    assert!(!cache.has(&digest));
    assert!(
        !setup.cached(&digest).exists() && !setup.partial(&digest).exists(),
        "nothing corrupt kept"
    );

    // Asked again, the cache answers with the same error at once: the corrupt bytes do not cross again.
    let again = rt
        .block_on(cache.fetch(&setup.source, &digest, size))
        .expect_err("still refused");
    assert_eq!(again, error);
    assert_eq!(setup.gets_of(&digest).len(), 2);

    // Through the endpoint, a client gets an error status naming the mismatch, and 404 for a digest that is
    // not the image's; the intact layer is served.
    setup.lab.proxy().set_bandwidth(None);
    let facts = rt
        .block_on(setup.registry.inspect(
            &format!("{}@{}", setup.source, setup.image.manifest_digest),
            &[],
        ))
        .expect("inspect");
    let reference = format!("{}@{}", setup.source, setup.image.manifest_digest);
    let allowed = ServedDigests::from_facts([(reference.as_str(), &facts[0].1)]);
    let endpoint = rt
        .block_on(Endpoint::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&cache),
            allowed,
            None,
        ))
        .expect("endpoint");
    let agent = support::http::agent();
    let url = |digest: &str| {
        format!(
            "{}/v2/{}/blobs/{digest}?ns={}",
            endpoint.url(),
            setup.source.repository,
            setup.source.registry
        )
    };
    let mut refused = agent.get(url(&digest)).call().unwrap();
    assert_eq!(refused.status(), 502);
    let body = refused.body_mut().read_to_string().unwrap();
    assert!(
        body.contains("digest mismatch") && body.contains(&digest),
        "{body}"
    );
    let (good, good_size) = setup.layer(1);
    let mut served = agent.get(url(&good)).call().unwrap();
    assert_eq!(served.status(), 200);
    let served = served.body_mut().read_to_vec().unwrap();
    assert_eq!(
        (sha256(&served), served.len() as u64),
        (good.clone(), good_size)
    );
    let elsewhere = format!("sha256:{}", "0".repeat(64));
    assert_eq!(agent.get(url(&elsewhere)).call().unwrap().status(), 404);
    let stats = rt.block_on(endpoint.stop());
    assert_eq!(
        (stats.requests, stats.refused, stats.served_bytes),
        (3, 1, good_size)
    );
    assert!(!setup.cached(&digest).exists() && !setup.partial(&digest).exists());
}

#[test]
fn manifests_are_stored_with_their_media_type_once_however_many_ask_at_once() {
    let setup = setup("cache-manifests", &[16 * KI]);
    let digest = setup.image.manifest_digest.clone();
    let rt = runtime();
    {
        let cache = setup.cache(CacheOptions::default());
        let asks: Vec<_> = (0..8)
            .map(|_| {
                let (cache, source, digest) =
                    (Arc::clone(&cache), setup.source.clone(), digest.clone());
                rt.spawn(async move { cache.manifest(&source, &digest).await })
            })
            .collect();
        for ask in asks {
            let manifest = rt.block_on(ask).unwrap().expect("served");
            assert_eq!(sha256(&manifest.body), digest);
            assert_eq!(
                manifest.media_type,
                "application/vnd.oci.image.manifest.v1+json"
            );
        }
        assert_eq!(
            cache.link_bytes(),
            setup.image.manifest_size,
            "counted once"
        );
        assert!(cache.has(&digest));
    }
    // Reopened: from disk, media type included, without asking the registry.
    let requests = setup.lab.proxy().requests();
    let cache = setup.cache(CacheOptions::default());
    let manifest = rt
        .block_on(cache.manifest(&setup.source, &digest))
        .expect("served");
    assert_eq!(sha256(&manifest.body), digest);
    assert_eq!(
        manifest.media_type,
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(setup.lab.proxy().requests(), requests);
    assert_eq!(cache.link_bytes(), 0);
}

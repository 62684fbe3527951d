//! Benchmark: pre-loading a 40-image set (about 1 GB of unique compressed blobs: three 24 MiB base layers,
//! each shared by a third of the images, and one 10–35 MiB layer per image) onto 3 lab containerd nodes
//! through the lab's registry proxy capped at a fixed bandwidth (16 MiB/s by default: the link, not the
//! machine's 2 cores, is then the bottleneck).
//!
//! Contenders, each on a fresh lab (new nodes, new registry, same deterministic images), in every run:
//! - pinboard fan-out: `survey`, then [`pinboard::fanout::Run`] with fan-out (an empty blob cache, the
//!   endpoint on loopback, every node's hosts.toml wired) and the default `EngineConfig` (5 pulls at once
//!   per node, then pins), as `apply --fan-out` does; timed from the survey's start.
//! - pinboard direct: the same without fan-out: every node pulls from the registry.
//! - a sequential `ctr --address SOCK -n k8s.io images pull --plain-http --snapshotter native REF` loop per
//!   node, the three node loops running at the same time.
//! - pinboard's agents with the in-cluster cache (issue 21): a cluster lab (the same three nodes with
//!   kubelets, an agent on each, every agent eligible for the cache's role); once one holds it, `pinboard
//!   apply --fan-out` writes the set as one PinSet with `spec.fanOut` and waits for every node's report to
//!   say it is pinned; timed from the apply's start to its end.
//!
//! Figures: bytes through the proxy against the set's unique bytes (layers, configs, manifests once), and
//! time against two ideals: the contender's own bytes at the cap, and the unique bytes at the cap (what
//! fan-out aims for). Goals: fan-out and the agents with the cache ≤ 1.05 × unique bytes and ≤ 1.3 ×
//! unique/cap in time. Before the runs,
//! the proxy's throttle is checked on its own: one blob downloaded over 1 connection and over 8 at once.
//! Prints every run, then the median (min–max) of the runs, and the load average before, during and after.
//!
//!     cargo bench --bench preload      # PINBOARD_BENCH_MIBPS=16 PINBOARD_BENCH_RUNS=3
//!                                      # PINBOARD_BENCH_IMAGEFS_MIB=3328 by default
//!
//! Needs root (the lab mounts tmpfs). The image filesystems are tmpfs: 3 × PINBOARD_BENCH_IMAGEFS_MIB of
//! RAM at most (native snapshots copy their parent, so a node needs about 3 × the compressed bytes). Prints
//! one line per figure; results go in BENCHMARKS.md.

mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use common::{env_number, load_average, spread};
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pinboard::backend::blobs::{BlobCache, CacheOptions};
use pinboard::backend::credentials::Credentials;
use pinboard::backend::lazy::LazyConfig;
use pinboard::backend::pins::PinTarget;
use pinboard::backend::target::{DirectNode, NodeTarget};
use pinboard::backend::wiring::WiringPaths;
use pinboard::engine::EngineConfig;
use pinboard::fanout::{FanOutSetup, LOOPBACK, Update};
use pinboard::model::image::Platform;
use pinboard::model::plan::Limits;
use pinboard::model::rollout::{NodeState, Rollout};
use pinboard::model::set;
use pinboard::survey::survey;
use support::agents::{AgentsLab, AgentsSetup};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, PushedImage, unique_bytes,
};

const MIB: u64 = 1 << 20;
const IMAGES: u64 = 40;
const NODES: [&str; 3] = ["n1", "n2", "n3"];

fn layer(seed: u64, mib: u64) -> LayerSpec {
    LayerSpec {
        seed,
        bytes: (mib * MIB) as usize,
        format: LayerFormat::Gzip,
    }
}

/// The three nodes, each with an image filesystem of `imagefs` bytes.
fn node_specs(imagefs: u64) -> Vec<NodeSpec> {
    NODES.iter().map(|n| NodeSpec::new(n, imagefs)).collect()
}

/// Starts a lab with three nodes of `imagefs` bytes and pushes the set; returns the references (through
/// the proxy) and the images as pushed.
fn lab_with_images(name: &str, imagefs: u64) -> (Lab, Vec<String>, Vec<PushedImage>) {
    let lab = Lab::start(
        name,
        LabConfig {
            nodes: node_specs(imagefs),
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let (references, pushed) = push_set(&lab, name);
    (lab, references, pushed)
}

/// Pushes the set to `lab`'s registry; returns the references (through the proxy) and the images as
/// pushed.
fn push_set(lab: &Lab, name: &str) -> (Vec<String>, Vec<PushedImage>) {
    let pushing = Instant::now();
    let pushed: Vec<PushedImage> = (0..IMAGES)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![layer(1 + i % 3, 24), layer(100 + i, 10 + (i * 7) % 26)],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("bench/app{i}"), &spec)
                .expect("push")
        })
        .collect();
    let references = pushed
        .iter()
        .map(|p| p.reference(&lab.proxy_host()))
        .collect();
    eprintln!(
        "{name}: pushed {IMAGES} images in {:.1?}",
        pushing.elapsed()
    );
    (references, pushed)
}

/// Bytes used on each node's image filesystem.
fn used(lab: &Lab) -> String {
    let per_node: Vec<String> = lab
        .nodes()
        .iter()
        .map(|n| {
            let fs = nix::sys::statvfs::statvfs(&n.root).expect("statvfs");
            let used = (fs.blocks() - fs.blocks_free()) * fs.fragment_size();
            format!("{} {:.0} MiB", n.name, used as f64 / MIB as f64)
        })
        .collect();
    per_node.join(", ")
}

/// Downloads `blob` through the proxy over `connections` connections at once (each the whole blob);
/// returns the rate in bytes/s.
fn download_rate(lab: &Lab, repo: &str, blob: &str, connections: usize) -> f64 {
    let url = format!("http://{}/v2/{repo}/blobs/{blob}", lab.proxy_host());
    let before = lab.proxy().bytes_down();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..connections {
            scope.spawn(|| {
                let mut response = support::http::agent().get(&url).call().expect("GET blob");
                assert_eq!(response.status().as_u16(), 200, "GET {url}");
                let mut reader = response.body_mut().as_reader();
                let mut buffer = vec![0u8; 1 << 16];
                while reader.read(&mut buffer).expect("reading the blob") > 0 {}
            });
        }
    });
    (lab.proxy().bytes_down() - before) as f64 / started.elapsed().as_secs_f64()
}

/// (busy, total) CPU time of the whole machine so far, in clock ticks, from /proc/stat.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .expect("cpu line")
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().expect("a tick count"))
        .collect();
    let total: u64 = ticks.iter().sum();
    // idle and iowait
    (total - ticks[3] - ticks[4], total)
}

/// Runs `run` while sampling the proxy's byte counter every 5 s and the machine's CPU time; prints the
/// throughput of each 5 s window and how busy the CPUs were, to show where time goes.
fn watched<T>(lab: &Lab, name: &str, run: impl FnOnce() -> T) -> T {
    const WINDOW: Duration = Duration::from_secs(5);
    let proxy = lab.proxy().clone();
    let done = AtomicBool::new(false);
    let (busy, total) = cpu_ticks();
    let (result, rates) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut rates = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let (start, bytes) = (Instant::now(), proxy.bytes_down());
                while start.elapsed() < WINDOW && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let moved = (proxy.bytes_down() - bytes) as f64 / MIB as f64;
                rates.push(format!("{:.0}", moved / start.elapsed().as_secs_f64()));
            }
            rates
        });
        let result = run();
        done.store(true, Ordering::Relaxed);
        (result, sampler.join().expect("sampler"))
    });
    let (busy_after, total_after) = cpu_ticks();
    println!(
        "{name}: MiB/s through the proxy per 5 s: {}; CPU busy {:.0}% of all cores",
        rates.join(" "),
        (busy_after - busy) as f64 * 100.0 / (total_after - total) as f64
    );
    result
}

/// What one contender did: time, bytes through the proxy.
struct Run {
    time: Duration,
    bytes: u64,
}

impl Run {
    /// Its time and bytes, against the bytes it moved at the cap and against `ideal`: the unique bytes at
    /// the cap, what fan-out aims for.
    fn print(&self, name: &str, cap: u64, unique: u64, ideal: f64) {
        let secs = self.time.as_secs_f64();
        println!(
            "{name:<26} {secs:>7.1} s  {:>7.1} MiB through the proxy ({:.3} x unique)  time/(its bytes/cap) {:.2}  \
             time/(unique/cap {ideal:.1} s) {:.2}  achieved {:.1} MiB/s",
            self.bytes as f64 / MIB as f64,
            self.bytes as f64 / unique as f64,
            secs / (self.bytes as f64 / cap as f64),
            secs / ideal,
            self.bytes as f64 / secs / MIB as f64,
        );
    }
}

/// pinboard's rollout as `apply` runs it ([`pinboard::fanout::Run`]): a survey, then the engine, with
/// fan-out (a fresh blob cache in `cache`) or without; timed from the survey's start.
fn pinboard_run(lab: &Lab, references: &[String], cache: Option<&std::path::Path>) -> Run {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let before = lab.proxy().bytes_down();
    let (time, rollout) = runtime.block_on(async {
        let registry = Arc::new(lab.registry_client());
        let targets: Vec<NodeTarget> = lab
            .nodes()
            .iter()
            .map(|n| NodeTarget {
                node: DirectNode {
                    name: n.name.clone(),
                    endpoint: n.endpoint().parse().expect("endpoint"),
                },
                pin: PinTarget::ContainerdLabel,
                lazy: LazyConfig::default(),
                wiring: WiringPaths::default(),
            })
            .collect();
        let nodes: Vec<DirectNode> = targets.iter().map(|t| t.node.clone()).collect();
        let sets = [set::from_flags("bench", references)];
        let limits = Limits {
            gc_high_percent: 100,
            gc_high_given: true,
            min_free_bytes: 0,
            min_free_given: true,
            flags_over_agents: true,
        };
        let timeout = Duration::from_secs(30);
        let fan_out = cache.map(|dir| FanOutSetup {
            cache: BlobCache::open(dir, CacheOptions::default(), Arc::clone(&registry))
                .expect("the blob cache opens"),
            listen: LOOPBACK,
        });
        let started = Instant::now();
        let planned = survey(
            &nodes,
            &sets,
            &registry,
            &Platform::host(),
            limits,
            timeout,
            cache,
        )
        .await
        .unwrap_or_else(|e| panic!("survey: {}", pinboard::error::Failure::from(e)));
        let jobs = pinboard::targets::jobs(&targets, planned.nodes, &sets);
        let (mut run, notices) = pinboard::fanout::Run::start(
            &targets,
            jobs,
            planned.facts,
            Arc::new(Credentials::none()),
            EngineConfig::default(),
            fan_out,
            false,
            timeout,
        )
        .await
        .expect("the rollout starts");
        assert!(
            notices.is_empty(),
            "every node is fanned out to: {notices:?}"
        );
        let mut rollout =
            Rollout::expecting(&nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>());
        while let Some(update) = run.next().await {
            if let Update::Event(event) = update {
                rollout.apply(event);
            }
        }
        let (_, problems) = run.finish().await;
        assert!(problems.is_empty(), "{problems:?}");
        (started.elapsed(), rollout)
    });
    for (name, node) in rollout.nodes() {
        assert!(
            matches!(node.state, NodeState::Pinned { .. }),
            "{name} did not finish: {:?}",
            node.state
        );
    }
    Run {
        time,
        bytes: lab.proxy().bytes_down() - before,
    }
}

fn ctr_run(lab: &Lab, references: &[String]) -> Run {
    let before = lab.proxy().bytes_down();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for node in lab.nodes() {
            scope.spawn(move || {
                for reference in references {
                    let status = Command::new("ctr")
                        .arg("--address")
                        .arg(&node.socket)
                        .args(["-n", "k8s.io", "images", "pull", "--plain-http"])
                        .args(["--snapshotter", "native", reference])
                        .stdout(Stdio::null())
                        .status()
                        .expect("ctr runs");
                    assert!(status.success(), "ctr pull {reference} on {}", node.name);
                }
            });
        }
    });
    Run {
        time: started.elapsed(),
        bytes: lab.proxy().bytes_down() - before,
    }
}

/// pinboard's agents on a cluster lab's nodes, every one eligible for the in-cluster cache's role (as
/// tests/it/agents_fanout.rs starts them): once one holds it, `pinboard apply --fan-out` writes the set
/// with `spec.fanOut` and waits for every node's report to say it is pinned. Timed from the apply's start
/// to its end; bytes counted at the proxy from the apply on. Returns the run and the set's unique bytes.
fn agents_cache_run(cap: u64, imagefs: u64) -> (Run, u64) {
    const NAME: &str = "agents-cache";
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let setup = AgentsSetup {
        agent_args: vec![
            "--insecure-registry={proxy}".into(),
            "--cache-port=5050".into(),
            "--cache-dir={lab}/cache-{node}".into(),
        ],
        ..AgentsSetup::default()
    };
    let agents = runtime.block_on(AgentsLab::start_with(
        &format!("bench-preload-{NAME}"),
        node_specs(imagefs),
        None,
        setup,
    ));
    let lab = &agents.lab;
    let (references, pushed) = push_set(lab, NAME);
    let (holder, address) = runtime.block_on(agents.cache_holder());
    println!("{NAME}: the cache is {holder}'s agent at {address}");
    let listed: Vec<&str> = references.iter().map(String::as_str).collect();
    let file = agents.set_file("bench", &listed, "");
    let proxy = lab.proxy_host();
    lab.proxy().set_bandwidth(Some(cap));
    let run = watched(lab, NAME, || {
        let before = lab.proxy().bytes_down();
        let started = Instant::now();
        let applied = agents.pinboard(&[
            "apply",
            "--insecure-registry",
            &proxy,
            "--set",
            file.to_str().expect("a UTF-8 path"),
            "--fan-out",
            "--timeout",
            "30m",
        ]);
        let time = started.elapsed();
        assert_eq!(applied.code, 0, "{}\n{}", applied.stdout, applied.stderr);
        Run {
            time,
            bytes: lab.proxy().bytes_down() - before,
        }
    });
    for node in lab.nodes() {
        node.assert_pinned(&references);
    }
    println!("{NAME}: image filesystem used: {}", used(lab));
    (run, unique_bytes(&pushed))
}

/// The contenders, in the order [`round`] runs them.
const CONTENDERS: [&str; 4] = [
    "agents + in-cluster cache",
    "pinboard fan-out",
    "pinboard direct",
    "sequential ctr pull loops",
];

/// One run of every contender, each on a fresh lab (new nodes, registry and cache, the same images), in
/// [`CONTENDERS`] order; and the set's unique bytes.
fn round(cap: u64, imagefs: u64) -> ([Run; 4], u64) {
    let contender = |name: &str, run: &dyn Fn(&Lab, &[String]) -> Run| {
        let (lab, references, pushed) = lab_with_images(&format!("bench-preload-{name}"), imagefs);
        lab.proxy().set_bandwidth(Some(cap));
        let result = watched(&lab, name, || run(&lab, &references));
        println!("{name}: image filesystem used: {}", used(&lab));
        (result, unique_bytes(&pushed))
    };
    let (agents_cache, unique) = agents_cache_run(cap, imagefs);
    let (fan_out, fan_out_unique) = contender("fan-out", &|lab, references| {
        let cache = tempfile::tempdir().expect("a cache dir");
        pinboard_run(lab, references, Some(cache.path()))
    });
    let (direct, _) = contender("direct", &|lab, references| {
        pinboard_run(lab, references, None)
    });
    let (ctr, _) = contender("ctr", &ctr_run);
    assert_eq!(
        fan_out_unique, unique,
        "every contender pushes the same set"
    );
    ([agents_cache, fan_out, direct, ctr], unique)
}

fn main() {
    let cap = env_number("PINBOARD_BENCH_MIBPS", 16) * MIB;
    let imagefs = env_number("PINBOARD_BENCH_IMAGEFS_MIB", 3328) * MIB;
    let runs = env_number("PINBOARD_BENCH_RUNS", 3usize).max(1);
    println!("load before: {}", load_average());
    {
        // The proxy's throttle on its own, against the cap.
        let (lab, _, pushed) = lab_with_images("bench-preload-calibration", imagefs);
        lab.proxy().set_bandwidth(Some(cap));
        let (repo, blob) = (&pushed[0].repo, &pushed[0].layers[0].digest);
        let one = download_rate(&lab, repo, blob, 1);
        let eight = download_rate(&lab, repo, blob, 8);
        println!(
            "proxy throttle at {:.0} MiB/s, one 24 MiB blob: 1 connection {:.1} MiB/s ({:.0}% of the cap), \
             8 connections {:.1} MiB/s ({:.0}%)",
            cap as f64 / MIB as f64,
            one / MIB as f64,
            one * 100.0 / cap as f64,
            eight / MIB as f64,
            eight * 100.0 / cap as f64,
        );
    }
    let mut rounds = Vec::new();
    let mut unique = 0;
    for n in 1..=runs {
        println!("--- run {n} of {runs} (load {})", load_average());
        let (round, bytes) = round(cap, imagefs);
        unique = bytes;
        let ideal = unique as f64 / cap as f64;
        for (name, run) in CONTENDERS.iter().zip(&round) {
            run.print(name, cap, unique, ideal);
        }
        rounds.push(round);
    }
    let ideal = unique as f64 / cap as f64;
    println!(
        "set: {IMAGES} images, {:.1} MiB ({:.2} GB) unique compressed (layers, configs, manifests), {} nodes; \
         cap {:.0} MiB/s; fan-out's ideal (unique / cap) {ideal:.1} s; load after: {}",
        unique as f64 / MIB as f64,
        unique as f64 / 1e9,
        NODES.len(),
        cap as f64 / MIB as f64,
        load_average(),
    );
    println!("median (min–max) of {runs} runs:");
    for (i, name) in CONTENDERS.iter().enumerate() {
        let times: Vec<f64> = rounds.iter().map(|r| r[i].time.as_secs_f64()).collect();
        let links: Vec<f64> = rounds
            .iter()
            .map(|r| r[i].bytes as f64 / unique as f64)
            .collect();
        println!(
            "{name:<26} {}  time/(unique/cap) {}  link bytes/unique {}",
            spread(times.clone(), |t| format!("{t:.1} s")),
            spread(times.iter().map(|t| t / ideal).collect(), |x| format!(
                "{x:.2}"
            )),
            spread(links, |x| format!("{x:.3}")),
        );
    }
}

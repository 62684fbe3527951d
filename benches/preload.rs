//! Benchmark: pre-loading a 40-image set (about 1 GB of unique compressed blobs: three 24 MiB base layers,
//! each shared by a third of the images, and one 10–35 MiB layer per image) onto 3 lab containerd nodes
//! through the lab's registry proxy capped at a fixed bandwidth (64 MiB/s by default).
//!
//! Contenders, each on a fresh lab (new nodes, new registry, same deterministic images):
//! - pinboard: `survey` then `engine::start` + `engine::run_to_end` with the default `EngineConfig`
//!   (5 pulls at once per node, then pins), as the TUI's apply does; timed from the survey's start.
//! - a sequential `ctr --address SOCK -n k8s.io images pull --plain-http --snapshotter native REF` loop per
//!   node, the three node loops running at the same time.
//!
//! Each is compared with the bandwidth cap itself: ideal time = bytes that crossed the proxy / cap. Goal:
//! pinboard ≤ 1.15 × ideal. Before the contenders run, the proxy's throttle is checked on its own: one blob
//! downloaded over 1 connection and over 8 at once, bytes/time against the cap.
//!
//!     cargo bench --bench preload      # PINBOARD_BENCH_MIBPS=64 PINBOARD_BENCH_IMAGEFS_MIB=3328 by default
//!
//! Needs root (the lab mounts tmpfs). The image filesystems are tmpfs: 3 × PINBOARD_BENCH_IMAGEFS_MIB of
//! RAM at most (native snapshots copy their parent, so a node needs about 3 × the compressed bytes). Prints
//! one line per figure; results go in BENCHMARKS.md.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::env_number;
use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pinboard::backend::credentials::Credentials;
use pinboard::backend::node::DirectNode;
use pinboard::backend::pins::PinTarget;
use pinboard::engine::{self, EngineConfig, NodeJob};
use pinboard::model::holders::holders_of;
use pinboard::model::image::Platform;
use pinboard::model::plan::Limits;
use pinboard::model::rollout::NodeState;
use pinboard::model::set;
use pinboard::survey::survey;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, PushedImage};

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

/// Starts a lab with three nodes of `imagefs` bytes and pushes the set; returns the references (through
/// the proxy) and the images as pushed.
fn lab_with_images(name: &str, imagefs: u64) -> (Lab, Vec<String>, Vec<PushedImage>) {
    let lab = Lab::start(
        name,
        LabConfig {
            nodes: NODES.iter().map(|n| NodeSpec::new(n, imagefs)).collect(),
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
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
    (lab, references, pushed)
}

/// Unique compressed bytes (layers and configs) of the set: what each node must fetch.
fn unique_bytes(pushed: &[PushedImage]) -> u64 {
    let mut blobs = BTreeMap::new();
    for image in pushed {
        blobs.insert(image.config_digest.clone(), image.config_size);
        for l in &image.layers {
            blobs.insert(l.digest.clone(), l.size);
        }
    }
    blobs.values().sum::<u64>() + pushed.iter().map(|p| p.manifest_size).sum::<u64>()
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
    fn print(&self, name: &str, cap: u64) {
        let ideal = self.bytes as f64 / cap as f64;
        let secs = self.time.as_secs_f64();
        println!(
            "{name:<26} {secs:>7.1} s  {:>7.1} MiB through the proxy  ideal {ideal:>5.1} s  \
             time/ideal {:.2}  achieved {:.1} MiB/s",
            self.bytes as f64 / MIB as f64,
            secs / ideal,
            self.bytes as f64 / secs / MIB as f64,
        );
    }
}

fn pinboard_run(lab: &Lab, references: &[String]) -> Run {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let before = lab.proxy().bytes_down();
    let (time, rollout) = runtime.block_on(async {
        let registry = lab.registry_client();
        let nodes: Vec<DirectNode> = lab
            .nodes()
            .iter()
            .map(|n| DirectNode {
                name: n.name.clone(),
                endpoint: n.endpoint().parse().expect("endpoint"),
            })
            .collect();
        let sets = [set::from_flags("bench", references)];
        let limits = Limits {
            gc_high_percent: 100,
            gc_high_given: true,
            min_free_bytes: 0,
        };
        let started = Instant::now();
        let planned = survey(
            &nodes,
            &sets,
            &registry,
            &Platform::host(),
            limits,
            Duration::from_secs(30),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("survey: {}", pinboard::error::Failure::from(e)));
        let holders = Arc::new(holders_of(&sets));
        let jobs = nodes
            .into_iter()
            .zip(planned.nodes)
            .map(|(node, plan)| NodeJob {
                node,
                plan,
                pin: PinTarget::ContainerdLabel,
                holders: Arc::clone(&holders),
            })
            .collect();
        let engine = engine::start(
            jobs,
            Arc::new(planned.facts),
            Arc::new(Credentials::none()),
            EngineConfig::default(),
        );
        let rollout = engine::run_to_end(engine).await;
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

fn main() {
    let cap = env_number("PINBOARD_BENCH_MIBPS", 64) * MIB;
    let imagefs = env_number("PINBOARD_BENCH_IMAGEFS_MIB", 3328) * MIB;

    let (pinboard, unique) = {
        let (lab, references, pushed) = lab_with_images("bench-preload-pinboard", imagefs);
        lab.proxy().set_bandwidth(Some(cap));
        let base = &pushed[0];
        let (repo, blob) = (&base.repo, &base.layers[0].digest);
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
        let run = watched(&lab, "pinboard", || pinboard_run(&lab, &references));
        println!("pinboard: image filesystem used: {}", used(&lab));
        (run, unique_bytes(&pushed))
    };
    let ctr = {
        let (lab, references, _) = lab_with_images("bench-preload-ctr", imagefs);
        lab.proxy().set_bandwidth(Some(cap));
        let run = watched(&lab, "ctr", || ctr_run(&lab, &references));
        println!("ctr: image filesystem used: {}", used(&lab));
        run
    };

    println!(
        "set: {IMAGES} images, {:.1} MiB ({:.2} GB) unique compressed per node, {} nodes; cap {:.0} MiB/s",
        unique as f64 / MIB as f64,
        unique as f64 / 1e9,
        NODES.len(),
        cap as f64 / MIB as f64
    );
    pinboard.print("pinboard (survey+engine)", cap);
    ctr.print("sequential ctr pull loops", cap);
    println!(
        "pinboard vs ctr: {:.2}x faster",
        ctr.time.as_secs_f64() / pinboard.time.as_secs_f64()
    );
}

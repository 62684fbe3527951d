//! Benchmark: `pinboard plan` against the lab registry behind a proxy adding 20 ms to every request, against
//! a sequential `skopeo inspect --raw` loop over the same references (the per-image inspect the OpenShift
//! daemon runs before it pulls). Goal: pinboard at least 60x faster for 200 images (a release's size).
//!
//!     cargo bench --bench plan_registry   # PINBOARD_BENCH_IMAGES=200, PINBOARD_BENCH_DELAY_MS=20,
//!                                         # PINBOARD_BENCH_RUNS=3
//!
//! Each contender runs PINBOARD_BENCH_RUNS times, interleaved, in one lab: pinboard with each number of
//! manifests in flight of PINBOARD_BENCH_IN_FLIGHT (default 64,32), and the skopeo loop. Prints each one's median and spread, the ratios of the medians
//! and the machine's load; results go in BENCHMARKS.md.

mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use common::env_number;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec};

fn main() {
    let count: usize = env_number("PINBOARD_BENCH_IMAGES", 200);
    let delay = Duration::from_millis(env_number("PINBOARD_BENCH_DELAY_MS", 20));
    let lab = Lab::start(
        "bench-plan",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");

    let pushing = Instant::now();
    let base = LayerSpec {
        seed: 1,
        bytes: 64 << 10,
        format: LayerFormat::Gzip,
    };
    let references: Vec<String> = (0..count as u64)
        .map(|i| {
            let own = LayerSpec {
                seed: 1000 + i,
                bytes: 4 << 10,
                format: LayerFormat::Gzip,
            };
            let spec = ImageSpec {
                layers: vec![base.clone(), own],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("bench/app{i}"), &spec)
                .expect("push")
                .reference(&lab.proxy_host())
        })
        .collect();
    eprintln!("pushed {count} images in {:.1?}", pushing.elapsed());
    let list = lab.dir().join("bench-images.txt");
    std::fs::write(&list, references.join("\n")).unwrap();
    lab.proxy().set_delay(delay);

    let runs: usize = env_number("PINBOARD_BENCH_RUNS", 3);
    let node = format!("n1={}", lab.node("n1").endpoint());
    let plan = |concurrency: &str| {
        let before = lab.proxy().requests();
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
            .args(["plan", "--images-file", &list.display().to_string()])
            .args(["--insecure-registry", &lab.proxy_host(), "--cri", &node])
            .args([
                "--min-free",
                "1Mi",
                "-o",
                "json",
                "--registry-concurrency",
                concurrency,
            ])
            .output()
            .expect("pinboard runs");
        let elapsed = started.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (elapsed, lab.proxy().requests() - before)
    };
    let skopeo = || {
        let before = lab.proxy().requests();
        let started = Instant::now();
        for reference in &references {
            let status = Command::new("skopeo")
                .args([
                    "inspect",
                    "--raw",
                    "--tls-verify=false",
                    &format!("docker://{reference}"),
                ])
                .stdout(std::process::Stdio::null())
                .status()
                .expect("skopeo runs");
            assert!(status.success(), "skopeo inspect {reference}");
        }
        (started.elapsed(), lab.proxy().requests() - before)
    };
    let in_flight: Vec<String> = std::env::var("PINBOARD_BENCH_IN_FLIGHT")
        .unwrap_or_else(|_| "64,32".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    println!(
        "images: {count}, proxy delay per request: {delay:?}, {runs} runs each, contenders interleaved"
    );
    // None: the skopeo loop; Some(n): pinboard with n manifest requests in flight.
    let contenders: Vec<Option<&str>> = in_flight
        .iter()
        .map(|n| Some(n.as_str()))
        .chain([None])
        .collect();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); contenders.len()];
    let mut requests = vec![0; contenders.len()];
    let mut loads = Vec::new();
    // Interleaved, so that a change in the machine's load weighs on every contender alike.
    for _ in 0..runs {
        loads.push(load_average());
        for (i, contender) in contenders.iter().enumerate() {
            let (elapsed, asked) = match contender {
                Some(n) => plan(n),
                None => skopeo(),
            };
            times[i].push(elapsed);
            requests[i] = asked;
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let skopeo_median = median(times.last_mut().expect("skopeo")).as_secs_f64();
    for (i, contender) in contenders.iter().enumerate() {
        let name = contender.map_or("sequential skopeo inspect".to_owned(), |n| {
            format!("pinboard plan ({n} in flight)")
        });
        let m = median(&mut times[i]);
        let ratio = match contender {
            Some(_) => format!("  speed-up {:.1}x", skopeo_median / m.as_secs_f64()),
            None => String::new(),
        };
        println!(
            "{name:<32} median {m:>9.2?}  (min {:.2?}, max {:.2?}; {} registry requests){ratio}",
            times[i][0],
            times[i][times[i].len() - 1],
            requests[i],
        );
    }
    println!("load average (1 min) before each round: {loads:?}");
}

/// The 1-minute load average, from /proc/loadavg.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

//! Benchmark: nodes serving each other (issue 32) in the lab, against today's one holder. A fan-out set
//! (an 8 MiB base layer shared by 3 images, and a 8 MiB layer of each: 32 MiB unique) is pinned on N
//! containerd nodes with real kubelets and an agent on each (processes started as their pods would run,
//! every agent eligible for the in-cluster cache's role), the registry behind the lab's proxy capped at
//! the link's rate, and each node's sending capped with `--serve-rate` to emulate its NIC.
//!
//! Contenders, each on a fresh lab (same deterministic images), in every run and for every N:
//! - **peers**: the agents with `--peer-port`: the nodes take each blob from each other as the holder's
//!   tracker says.
//! - **one holder**: the agents without it: every node takes every blob from the cache's holder.
//!
//! Timed from the PinSet's creation (with `spec.fanOut`) until every node's report says it is pinned
//! (reports polled every 100 ms); bytes over the link counted at the proxy; what the holder's cache
//! served and what the nodes served each other, from their reports.
//!
//!     cargo bench --bench peers_lab    # PINBOARD_BENCH_NODES=4,8 PINBOARD_BENCH_RUNS=3
//!                                      # PINBOARD_BENCH_LINK_MIBPS=16 PINBOARD_BENCH_NIC_MIBPS=8
//!
//! Needs root (the lab mounts tmpfs and runs kubelets). Prints every run, then the median (min–max) of
//! the runs, and the load average before, during and after. Results go in BENCHMARKS.md.

mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{env_number, load_average, spread};
use support::agents::AgentsLab;
use support::fan_out::{apply_fan_out_set, cache_lab, reports};
use support::{ImageSpec, LayerFormat, LayerSpec, RegistrySetup, unique_bytes};

const MIB: u64 = 1 << 20;

/// The contenders, in the order each run takes them.
const DESIGNS: [&str; 2] = ["peers", "one holder"];

struct Run {
    time: Duration,
    link_bytes: u64,
    holder_served: u64,
    peers_served: u64,
}

/// The set: an 8 MiB base layer and one 8 MiB layer per image, 3 images.
fn push_set(lab: &AgentsLab) -> (Vec<String>, u64) {
    let layer = |seed, bytes| LayerSpec {
        seed,
        bytes,
        format: LayerFormat::Gzip,
    };
    let pushed: Vec<_> = (0..3)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![
                    layer(7100, 8 * MIB as usize),
                    layer(7200 + i, 8 * MIB as usize),
                ],
                ..ImageSpec::default()
            };
            lab.lab
                .push_image(&format!("bench/peers{i}"), &spec)
                .expect("push")
        })
        .collect();
    let references = pushed
        .iter()
        .map(|i| i.reference(&lab.lab.proxy_host()))
        .collect();
    (references, unique_bytes(&pushed))
}

/// One run of `design` on `nodes` nodes, on a fresh lab.
fn run(design: &str, nodes: usize, link: u64, nic: u64) -> (Run, u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let names: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let serve = format!("--serve-rate={nic}");
    let mut args = vec![serve.as_str()];
    if design == "peers" {
        args.extend(["--peer-port=5051", "--peer-dir={lab}/peers-{node}"]);
    }
    let lab_name = format!("bench-peers-{nodes}-{}", design.replace(' ', "-"));
    let lab = runtime.block_on(cache_lab(
        &lab_name,
        &names,
        RegistrySetup::default(),
        &args,
    ));
    let (references, unique) = push_set(&lab);
    runtime.block_on(lab.cache_holder());
    lab.lab.proxy().set_bandwidth(Some(link));
    let before = lab.lab.proxy().bytes_down();
    let started = Instant::now();
    runtime.block_on(apply_fan_out_set(&lab, "bench", &references, ""));
    runtime.block_on(async {
        loop {
            let reports = reports(&lab).await;
            if names.iter().all(|n| pinned(&reports, n)) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "not pinned in 15 minutes"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let time = started.elapsed();
    let link_bytes = lab.lab.proxy().bytes_down() - before;
    for node in &names {
        lab.lab.node(node).assert_pinned(&references);
    }
    // The figures come with the reports written after the rollout: wait for the holder's to count it all.
    std::thread::sleep(Duration::from_secs(6));
    let reports = runtime.block_on(reports(&lab));
    let sum = |field: &str, part: &str| -> u64 {
        reports
            .values()
            .filter_map(|r| r["status"][part][field].as_u64())
            .sum()
    };
    let result = Run {
        time,
        link_bytes,
        holder_served: sum("servedBytes", "cache"),
        peers_served: sum("servedBytes", "peers"),
    };
    (result, unique)
}

fn pinned(reports: &BTreeMap<String, serde_json::Value>, node: &str) -> bool {
    reports.get(node).is_some_and(|r| {
        r["status"]["sets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == "bench" && s["state"] == "pinned")
    })
}

fn main() {
    let link = env_number("PINBOARD_BENCH_LINK_MIBPS", 16) * MIB;
    let nic = env_number("PINBOARD_BENCH_NIC_MIBPS", 8) * MIB;
    let runs = env_number("PINBOARD_BENCH_RUNS", 3usize).max(1);
    let sizes: Vec<usize> = std::env::var("PINBOARD_BENCH_NODES")
        .unwrap_or_else(|_| "4,8".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    println!(
        "link {} MiB/s, each node's NIC {} MiB/s; load before: {}",
        link / MIB,
        nic / MIB,
        load_average()
    );
    let mut results: BTreeMap<(usize, &str), Vec<Run>> = BTreeMap::new();
    let mut unique = 0;
    for r in 1..=runs {
        for &nodes in &sizes {
            for design in DESIGNS {
                let (result, bytes) = run(design, nodes, link, nic);
                unique = bytes;
                println!(
                    "run {r}, {nodes} nodes, {design}: pinned everywhere in {:.2} s; link {:.3}x the unique \
                     bytes; the holder served {:.1} MiB, the nodes each other {:.1} MiB (load {})",
                    result.time.as_secs_f64(),
                    result.link_bytes as f64 / bytes as f64,
                    result.holder_served as f64 / MIB as f64,
                    result.peers_served as f64 / MIB as f64,
                    load_average()
                );
                results.entry((nodes, design)).or_default().push(result);
            }
        }
    }
    println!(
        "\nmedian (min–max) of {runs} runs, {:.1} MiB unique; the link alone would take {:.1} s:",
        unique as f64 / MIB as f64,
        unique as f64 / link as f64
    );
    println!(
        "| nodes | design | pinned everywhere | link / unique | holder served | nodes served each other |"
    );
    println!("|---|---|---|---|---|---|");
    for ((nodes, design), runs) in &results {
        let of = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        println!(
            "| {nodes} | {design} | {} | {} | {} | {} |",
            spread(of(&|r| r.time.as_secs_f64()), |v| format!("{v:.2} s")),
            spread(of(&|r| r.link_bytes as f64 / unique as f64), |v| format!(
                "{v:.3}x"
            )),
            spread(of(&|r| r.holder_served as f64 / MIB as f64), |v| format!(
                "{v:.0} MiB"
            )),
            spread(of(&|r| r.peers_served as f64 / MIB as f64), |v| format!(
                "{v:.0} MiB"
            )),
        );
    }
    println!("load after: {}", load_average());
}

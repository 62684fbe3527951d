//! Benchmark: fan-out at the scale of the largest clusters, run on pinboard's own code: N virtual nodes,
//! each with the product's peer side (joining, taking the cut, stripe tasks, verifying, serving pieces),
//! and the holder's own tracker, in tokio's virtual time with HTTP replaced by an in-process transport
//! (`fan_out_scale/sim.rs`). 100, 1,000, 2,600 and 5,000 nodes (`PINBOARD_BENCH_NODES`). As in Kraken's
//! published test: a 3 GB set of two 1.5 GB layers, every node (the holder too) capped at 300 MB/s out and
//! 300 MB/s in; here the holder also fetches the set over its registry link (300 MB/s) and cuts it first,
//! and one node in 100 is lost mid-transfer. Beside it, in the same run, the design without peers: every
//! node takes every blob from the holder, whose 300 MB/s it shares.
//!
//! Measures per node (lost ones aside) the time from its agent's start until its runtime read the whole
//! set (p50, p99, max) and the bytes it sent to other nodes; the holder's pieces sent, the tracker's
//! requests, the bytes of its answers and the memory it holds; the cuts nodes took from each other.
//! Each setting runs `PINBOARD_BENCH_RUNS` times (3) with other start times and losses; the median
//! (min–max) of the runs is printed, and the load average before and after.
//!
//!     cargo bench --bench fan_out_scale     # PINBOARD_BENCH_NODES=100,1000,2600,5000 PINBOARD_BENCH_RUNS=3
//!                                           # PINBOARD_BENCH_SPREAD_MS=500 PINBOARD_BENCH_TRACKER_US=100
//!                                           # PINBOARD_BENCH_ONE_HOLDER=1 (0: peers only)
//!                                           # PINBOARD_BENCH_LOST_EVERY=100 (0: no node lost)
//!
//! No lab, no network: virtual time, the nodes' pieces in a temporary directory (under /dev/shm when
//! there is one). Prints one line per run and a table; results go in BENCHMARKS.md.

mod common;
mod counting;
#[path = "fan_out_scale/sim.rs"]
mod sim;

use std::time::{Duration, Instant};

use common::{env_number, load_average, spread};
use sim::{Outcome, Setup, run};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// Kraken's README: 2,600 hosts, p50 and p99.
const KRAKEN: (f64, f64) = (10.0, 18.0);

/// Nearest-rank percentile `p` of `values`, sorted.
fn percentile(values: &[f64], p: usize) -> f64 {
    let n = values.len();
    values[(n * p).div_ceil(100).clamp(1, n) - 1]
}

/// The figures of one run, by name.
struct Figures {
    p50: f64,
    p99: f64,
    max: f64,
    served_median: f64,
    outcome: Outcome,
}

fn figures(outcome: Outcome) -> Figures {
    let mut times: Vec<f64> = outcome.times.iter().map(Duration::as_secs_f64).collect();
    times.sort_by(f64::total_cmp);
    let mut served: Vec<f64> = outcome.served.iter().map(|&b| b as f64).collect();
    served.sort_by(f64::total_cmp);
    Figures {
        p50: percentile(&times, 50),
        p99: percentile(&times, 99),
        max: times[times.len() - 1],
        served_median: percentile(&served, 50),
        outcome,
    }
}

fn main() {
    let nodes: Vec<usize> = std::env::var("PINBOARD_BENCH_NODES")
        .unwrap_or_else(|_| "100,1000,2600,5000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let runs = env_number("PINBOARD_BENCH_RUNS", 3usize).max(1);
    let spread_ms = env_number("PINBOARD_BENCH_SPREAD_MS", 500u64);
    let tracker_us = env_number("PINBOARD_BENCH_TRACKER_US", 100u64);
    let one_holder = env_number("PINBOARD_BENCH_ONE_HOLDER", 1u8) == 1;
    let lost_every = env_number("PINBOARD_BENCH_LOST_EVERY", 100usize);
    let shm = std::path::Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => tempfile::tempdir_in(shm),
        false => tempfile::tempdir(),
    }
    .expect("a directory for the nodes' pieces");
    println!("load average before: {}", load_average());
    let base = Setup {
        nodes: 0,
        blobs: vec![1_500_000_000, 1_500_000_000],
        cap: 300e6,
        link: 300e6,
        start_spread: Duration::from_millis(spread_ms),
        rtt: Duration::from_micros(500),
        tracker_cost: Duration::from_micros(tracker_us),
        hash_rate: 1e9,
        lost_every,
        peers: true,
        seed: 0,
    };
    println!(
        "set: 2 layers of 1.5 GB over a 300 MB/s registry link; every node capped at 300 MB/s each way; \
         starts spread over {spread_ms} ms; {tracker_us} µs a tracker request; rtt 0.5 ms per request; \
         verification at 1 GB/s; one node in {lost_every} lost mid-transfer (0: none)"
    );
    let mut rows = Vec::new();
    for &n in &nodes {
        let designs: &[bool] = if one_holder { &[true, false] } else { &[true] };
        for &peers in designs {
            let mut per_run = Vec::new();
            for r in 0..runs {
                let setup = Setup {
                    nodes: n,
                    peers,
                    seed: 1 + r as u64,
                    ..base.clone()
                };
                let began = Instant::now();
                let f = figures(run(&setup, dir.path()));
                let o = &f.outcome;
                println!(
                    "{n} nodes, {}, run {}: first placed at {:.2} s; p50 {:.2} s, p99 {:.2} s, max {:.2} s; \
                     served per node median {:.2} GB; holder pieces {:.2} GB; tracker {} requests, {:.2} MB answered, holds {:.2} MB; \
                     cuts from peers {:.2} MB; lost {}, fell back to the holder {}, refused pieces {}; \
                     simulated in {:.1} s (load {})",
                    if peers { "peers" } else { "one holder" },
                    r + 1,
                    o.first_placed.as_secs_f64(),
                    f.p50,
                    f.p99,
                    f.max,
                    f.served_median / 1e9,
                    o.holder_pieces as f64 / 1e9,
                    o.tracker_requests,
                    o.tracker_bytes as f64 / 1e6,
                    o.tracker_memory as f64 / 1e6,
                    o.cuts_from_peers as f64 / 1e6,
                    o.lost,
                    o.fell_back,
                    o.refused_pieces,
                    began.elapsed().as_secs_f64(),
                    load_average(),
                );
                per_run.push(f);
            }
            rows.push((n, peers, per_run));
        }
    }
    println!("\nmedian (min–max) of {runs} runs:");
    println!(
        "| nodes | design | first placed | p50 | p99 | max | served per node (median) | holder: pieces sent | tracker: answers sent | the same with the cut in every answer | tracker: memory | lost / fell back |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let secs = |v: f64| format!("{v:.2} s");
    let gb = |v: f64| format!("{:.2} GB", v / 1e9);
    let mb = |v: f64| format!("{:.2} MB", v / 1e6);
    let whole_cuts = |f: &Figures| (f.outcome.tracker_bytes + f.outcome.cuts_from_peers) as f64;
    for (n, peers, per_run) in &rows {
        let column = |get: &dyn Fn(&Figures) -> f64| per_run.iter().map(get).collect::<Vec<f64>>();
        let lost = per_run.iter().map(|f| f.outcome.lost).max().unwrap_or(0);
        let fell_back = per_run
            .iter()
            .map(|f| f.outcome.fell_back)
            .max()
            .unwrap_or(0);
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {lost} / {fell_back} |",
            if *peers { "peers" } else { "one holder" },
            match peers {
                true => spread(column(&|f| f.outcome.first_placed.as_secs_f64()), secs),
                false => "–".into(),
            },
            spread(column(&|f| f.p50), secs),
            spread(column(&|f| f.p99), secs),
            spread(column(&|f| f.max), secs),
            spread(column(&|f| f.served_median), gb),
            spread(column(&|f| f.outcome.holder_pieces as f64), gb),
            spread(column(&|f| f.outcome.tracker_bytes as f64), mb),
            spread(column(&whole_cuts), mb),
            spread(column(&|f| f.outcome.tracker_memory as f64), mb),
        );
        if *n == 2600 && *peers {
            println!(
                "| 2600 | Kraken (README) | | {:.0} s | {:.0} s | | | | | | | |",
                KRAKEN.0, KRAKEN.1
            );
        }
    }
    println!("load average after: {}", load_average());
}

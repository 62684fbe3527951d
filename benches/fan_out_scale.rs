//! Benchmark: fan-out at the scale of the largest clusters, simulated with pinboard's own peer choice and
//! scheduling (`model::peers`: the tracker's [`Swarm`] and each node's [`Fetch`]) driving N virtual nodes:
//! 100, 1,000, 2,600 and 5,000 (`PINBOARD_BENCH_NODES`). As in Kraken's published test: a 3 GB set of two
//! 1.5 GB layers, already in the cache holder's blob cache, every node (the holder too) capped at 300 MB/s
//! out and 300 MB/s in. Beside it, in the same run, the one-holder design of today: every node takes every
//! blob from the holder, whose 300 MB/s it shares.
//!
//! Measures per node the time from its agent's start until it holds the whole set (p50, p99, max) and the
//! bytes it sent to other nodes (median, max), the holder's bytes sent, the tracker's requests and busy
//! time, and the deepest stripe. Goals (issue 32), at 2,600 nodes: p50 ≤ 12 s, p99 ≤ 20 s (Kraken: 10 s and
//! 18 s). Each setting runs `PINBOARD_BENCH_RUNS` times (3) with other start times; the median (min–max)
//! of the runs is printed, and the load average before and after.
//!
//!     cargo bench --bench fan_out_scale     # PINBOARD_BENCH_NODES=100,1000,2600,5000 PINBOARD_BENCH_RUNS=3
//!                                           # PINBOARD_BENCH_SPREAD_MS=500 PINBOARD_BENCH_TRACKER_US=100
//!                                           # PINBOARD_BENCH_ONE_HOLDER=1 (0: peers only)
//!
//! No lab, no I/O: virtual time. Prints one line per figure; results go in BENCHMARKS.md.

mod common;
#[path = "fan_out_scale/sim.rs"]
mod sim;

use std::time::{Duration, Instant};

use common::{env_number, load_average, spread};
use sim::{Outcome, Setup, run};

/// Kraken's README: 2,600 hosts, p50 and p99.
const KRAKEN: (f64, f64) = (10.0, 18.0);

/// Nearest-rank percentile `p` of `values`, sorted.
fn percentile(values: &[f64], p: usize) -> f64 {
    let n = values.len();
    values[(n * p).div_ceil(100).clamp(1, n) - 1]
}

/// p50, p99 and max seconds per node, median and max bytes served per node.
fn figures(outcome: &Outcome) -> [f64; 5] {
    let mut times: Vec<f64> = outcome.times.iter().map(Duration::as_secs_f64).collect();
    times.sort_by(f64::total_cmp);
    let mut served: Vec<f64> = outcome.served.iter().map(|&b| b as f64).collect();
    served.sort_by(f64::total_cmp);
    [
        percentile(&times, 50),
        percentile(&times, 99),
        times[times.len() - 1],
        percentile(&served, 50),
        served[served.len() - 1],
    ]
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
    println!("load average before: {}", load_average());
    let base = Setup {
        nodes: 0,
        blobs: vec![1_500_000_000, 1_500_000_000],
        cap: 300e6,
        start_spread: Duration::from_millis(spread_ms),
        rtt: Duration::from_micros(500),
        tracker_cost: Duration::from_micros(tracker_us),
        hash_rate: 1e9,
        peers: true,
        seed: 0,
    };
    println!(
        "set: 2 layers of 1.5 GB; every node capped at 300 MB/s each way; starts spread over {spread_ms} ms; \
         {} µs a tracker request; rtt 0.5 ms; verification at 1 GB/s",
        tracker_us
    );
    let mut rows = Vec::new();
    for &n in &nodes {
        let designs: &[bool] = if one_holder { &[true, false] } else { &[true] };
        for &peers in designs {
            let mut per_run: Vec<[f64; 5]> = Vec::new();
            let mut extra = Vec::new();
            for r in 0..runs {
                let setup = Setup {
                    nodes: n,
                    peers,
                    seed: 1 + r as u64,
                    ..base.clone()
                };
                let began = Instant::now();
                let outcome = run(&setup);
                let wall = began.elapsed();
                let f = figures(&outcome);
                println!(
                    "{n} nodes, {}, run {}: p50 {:.2} s, p99 {:.2} s, max {:.2} s; served per node median {:.2} GB, \
                     max {:.2} GB; holder {:.2} GB; tracker {} requests, busy {:.2} s; deepest stripe {} hops; \
                     simulated in {:.1} s (load {})",
                    if peers { "peers" } else { "one holder" },
                    r + 1,
                    f[0],
                    f[1],
                    f[2],
                    f[3] / 1e9,
                    f[4] / 1e9,
                    outcome.holder_served as f64 / 1e9,
                    outcome.tracker_requests,
                    outcome.tracker_busy.as_secs_f64(),
                    outcome.max_depth,
                    wall.as_secs_f64(),
                    load_average(),
                );
                extra.push((outcome.holder_served as f64 / 1e9, outcome.max_depth));
                per_run.push(f);
            }
            rows.push((n, peers, per_run, extra));
        }
    }
    println!("\nmedian (min–max) of {runs} runs:");
    println!(
        "| nodes | design | p50 | p99 | max | served per node, median / max | holder served | deepest stripe |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let secs = |v: f64| format!("{v:.2} s");
    let gb = |v: f64| format!("{:.2} GB", v / 1e9);
    for (n, peers, per_run, extra) in &rows {
        let column = |i: usize| per_run.iter().map(|f| f[i]).collect::<Vec<f64>>();
        let holder: Vec<f64> = extra.iter().map(|e| e.0 * 1e9).collect();
        let depth = extra.iter().map(|e| e.1).max().unwrap_or(0);
        println!(
            "| {n} | {} | {} | {} | {} | {} / {} | {} | {depth} |",
            if *peers { "peers" } else { "one holder" },
            spread(column(0), secs),
            spread(column(1), secs),
            spread(column(2), secs),
            spread(column(3), gb),
            spread(column(4), gb),
            spread(holder, gb),
        );
        if *n == 2600 && *peers {
            println!(
                "| 2600 | Kraken (README) | {:.0} s | {:.0} s | | | | |",
                KRAKEN.0, KRAKEN.1
            );
        }
    }
    println!("load average after: {}", load_average());
}

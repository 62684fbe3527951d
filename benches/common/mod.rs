//! What every benchmark needs: its parameters from the environment, resident memory, and frame or latency
//! statistics. Each bench includes it with `mod common;`.

// Each bench compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::str::FromStr;
use std::time::Duration;

/// The number in environment variable `name`, else `default`.
pub fn env_number<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of this process, from /proc/self/status, in bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

/// (median, p95, max) of `times`, nearest rank.
pub fn stats(times: &mut [Duration]) -> (Duration, Duration, Duration) {
    times.sort();
    let n = times.len();
    let rank = |p: usize| times[(n * p).div_ceil(100).clamp(1, n) - 1];
    (rank(50), rank(95), times[n - 1])
}

/// [`rss_bytes`] once the allocator has given its free memory back to the system.
pub fn trimmed_rss() -> u64 {
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe { libc::malloc_trim(0) };
    rss_bytes()
}

/// `uptime`'s load averages (1, 5, 15 minutes).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// `median (min–max)` of `values`, formatted by `show`.
pub fn spread(mut values: Vec<f64>, show: impl Fn(f64) -> String) -> String {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    format!(
        "{} ({}–{})",
        show(median),
        show(values[0]),
        show(values[values.len() - 1])
    )
}

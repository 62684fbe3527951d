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

/// The highest resident memory of this process since it started or since [`reset_peak_rss`] (VmHWM), in
/// bytes.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmHWM value");
    kib * 1024
}

/// Starts [`peak_rss_bytes`] again from the memory resident now.
pub fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("/proc/self/clear_refs");
}

/// The API server's requests so far, by `VERB resource[/subresource]` (summed over codes and clients).
pub type Counts = std::collections::BTreeMap<String, f64>;

/// `apiserver_request_total` from the API server's `/metrics`, as [`Counts`].
pub async fn apiserver_requests(admin: &kube::Client) -> Counts {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.expect("/metrics");
    let mut counts = Counts::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').expect("a sample");
        let label = |name: &str| {
            let key = format!("{name}=\"");
            labels
                .split(&key)
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let subresource = label("subresource");
        let resource = match subresource.is_empty() {
            true => label("resource"),
            false => format!("{}/{subresource}", label("resource")),
        };
        let key = format!("{} {resource}", label("verb"));
        *counts.entry(key).or_default() += value.parse::<f64>().unwrap();
    }
    counts
}

/// Whether a [`Counts`] key is a write. Server-side apply is counted as APPLY, not PATCH.
pub fn is_write(key: &str) -> bool {
    ["POST ", "PUT ", "PATCH ", "APPLY ", "DELETE "]
        .iter()
        .any(|verb| key.starts_with(verb))
}

/// What changed between two [`apiserver_requests`].
pub fn since(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

//! What the lab's link carries over time: the proxy's bytes sampled every 50 ms while a rollout runs, and
//! the rates they give, over the whole transfer and in each second of it.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Lab;

/// Samples `(when, bytes the link carried since the start)`, on a thread of its own until stopped.
pub struct LinkSampler {
    stop: mpsc::Sender<()>,
    sampler: JoinHandle<Vec<(Instant, u64)>>,
}

impl LinkSampler {
    pub fn start(lab: &Lab) -> LinkSampler {
        let proxy = lab.proxy().clone();
        let before = proxy.bytes_down();
        let (stop, stopped) = mpsc::channel::<()>();
        let sampler = std::thread::spawn(move || {
            let mut samples = Vec::new();
            loop {
                samples.push((Instant::now(), proxy.bytes_down() - before));
                match stopped.recv_timeout(Duration::from_millis(50)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return samples,
                }
            }
        });
        LinkSampler { stop, sampler }
    }

    pub fn stop(self) -> Vec<(Instant, u64)> {
        self.stop.send(()).expect("the sampler runs");
        self.sampler.join().expect("the sampler")
    }
}

/// The samples of the middle of a transfer, from when 5% of its bytes had crossed to when 95% had (so the
/// survey before it and the last manifests after it do not count).
fn middle(samples: &[(Instant, u64)]) -> &[(Instant, u64)] {
    let total = samples.last().expect("samples").1 as f64;
    let when = |share: f64| {
        samples
            .iter()
            .position(|(_, bytes)| *bytes as f64 >= share * total)
            .expect("a sample past it")
    };
    &samples[when(0.05)..=when(0.95)]
}

fn rate(from: &(Instant, u64), to: &(Instant, u64)) -> f64 {
    (to.1 - from.1) as f64 / to.0.duration_since(from.0).as_secs_f64()
}

/// Bytes per second over the middle of a transfer: over all of it, and in each whole second of it.
pub fn middle_rates(samples: &[(Instant, u64)]) -> (f64, Vec<f64>) {
    let middle = middle(samples);
    let seconds = middle
        .chunks_exact(21)
        .map(|c| rate(&c[0], &c[20]))
        .collect();
    (rate(&middle[0], &middle[middle.len() - 1]), seconds)
}

/// Bytes per second over the middle of a transfer while the link was in use: quarter seconds in which not
/// a byte crossed are left out (no blob was asked for then: the runtimes were unpacking or between images,
/// which no budget decides), and the share of time they took.
fn busy_rate(samples: &[(Instant, u64)]) -> (f64, f64) {
    let middle = middle(samples);
    let (mut bytes, mut busy, mut idle) = (0u64, 0f64, 0f64);
    for quarter in middle.windows(6).step_by(5) {
        let (from, to) = (&quarter[0], &quarter[5]);
        let took = to.0.duration_since(from.0).as_secs_f64();
        match to.1 - from.1 {
            0 => idle += took,
            moved => (bytes, busy) = (bytes + moved, busy + took),
        }
    }
    (bytes as f64 / busy, idle / (busy + idle))
}

/// Rates in MiB/s, one decimal each, for a message.
fn mib_per_second(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|r| format!("{:.1}", r / (1u64 << 20) as f64))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Asserts that the link kept to `budget` bytes per second over the middle of the transfer `samples` show:
/// within 10 % of it while in use, and in no second 10 % over it (what sits in the sockets' buffers is the
/// link's too); says the rates on stderr for `what`.
pub fn assert_kept_to(samples: &[(Instant, u64)], budget: u64, what: &str) {
    let (overall, seconds) = middle_rates(samples);
    let (busy, idle) = busy_rate(samples);
    let mib = |bytes: f64| bytes / (1u64 << 20) as f64;
    eprintln!(
        "{what}, budget {:.1} MiB/s: {:.2} MiB/s while in use ({:.0} % of the time idle; {:.2} MiB/s over \
         the rollout); each second: {}",
        mib(budget as f64),
        mib(busy),
        idle * 100.0,
        mib(overall),
        mib_per_second(&seconds)
    );
    assert!(
        (busy - budget as f64).abs() <= 0.10 * budget as f64,
        "{what}: {:.2} MiB/s while in use under a budget of {:.1} MiB/s",
        mib(busy),
        mib(budget as f64)
    );
    assert!(
        seconds.iter().all(|&r| r <= 1.10 * budget as f64),
        "{what}: MiB/s in each second under a budget of {:.1} MiB/s: {}",
        mib(budget as f64),
        mib_per_second(&seconds)
    );
}

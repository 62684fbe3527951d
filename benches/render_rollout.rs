//! Benchmark: the TUI's Rollout screen for a large rollout, 2,000 nodes × 500 images (a realistic mix:
//! pinned nodes, nodes pulling with byte progress, a stalled pull, retries, failures after retries, nodes
//! stopped out of space, refused and waiting nodes), without a terminal or a cluster.
//!
//! Measures: building the rollout by folding the engine's `Event`s into a `Rollout` (and the resident
//! memory, VmRSS, afterwards); then, on the Rollout screen, `render_to_buffer` at 120×40 and 200×60,
//! 200 frames each, the selection moved between frames with key events through `update` so that every
//! frame differs (median / p95 / max); then, to explain the frame time, the per-frame model queries the
//! screen makes (totals, rates, ETAs, stalls over every node) timed on their own, the same screen for the
//! 3-node demo state, and the cost per event of the TUI's own fold (`update(Msg::Rollout)`), which also
//! keeps the node order. Goals: median frame ≤ 2 ms; resident memory ≤ 120 MB.
//!
//!     cargo bench --bench render_rollout     # PINBOARD_BENCH_NODES=2000 PINBOARD_BENCH_IMAGES=500 FRAMES=200
//!
//! Prints one line per figure; results go in BENCHMARKS.md.

mod common;
use common::{env_number, rss_bytes, stats};
use std::hint::black_box;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent};
use pinboard::model::rollout::{Event, PinMethod, Rollout};
use pinboard::ui::demo::demo_state;
use pinboard::ui::msg::Msg;
use pinboard::ui::render::render_to_buffer;
use pinboard::ui::state::{Screen, State};
use pinboard::ui::theme::Theme;
use pinboard::ui::update::update;
use sha2::{Digest as _, Sha256};

const MI: u64 = 1 << 20;

/// Digest references as an OpenShift release lists them (every payload image in one repository).
fn image_names(count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let digest = Sha256::digest(format!("image {i}").as_bytes());
            format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{digest:x}")
        })
        .collect()
}

/// The events the engine would have sent for node number `n` by `t0 + 600 s`. Nodes differ by `n % 20`:
/// 1 refused, 1 stopped out of space, 2 pulling with a failure after retries, 8 pulling (one pull stalled,
/// one waiting to retry), 7 pinned, 1 not heard from yet (waiting).
fn node_events(n: usize, images: &[String], t0: Instant) -> Vec<Event> {
    let node = format!("worker-{n:04}");
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    let size = |j: usize| (20 + (j as u64 * 7919) % 300) * MI;
    let mut events = Vec::new();
    let class = n % 20;
    if class == 19 {
        return events;
    }
    if class == 0 {
        events.push(Event::NodeRefused {
            node,
            reason: "plan verdict no-space: would leave 10 GiB free, below the 16 GiB floor".into(),
        });
        return events;
    }
    events.push(Event::NodeStarted {
        node: node.clone(),
        images: images.to_vec(),
        at: at(0),
    });
    let present = 20.min(images.len());
    for image in &images[..present] {
        events.push(Event::ImagePresent {
            node: node.clone(),
            image: image.clone(),
        });
    }
    let pulled = match class {
        1 => 100,
        2 | 3 => 200,
        4..=11 => 20 + (n * 37) % 400,
        _ => images.len(),
    }
    .clamp(present, images.len());
    // Four progress reports per pull, as the engine's 500 ms poll sends for a pull of about two seconds.
    for (j, image) in images.iter().enumerate().take(pulled).skip(present) {
        let (start, total) = (j as u64, size(j));
        events.push(Event::PullStarted {
            node: node.clone(),
            image: image.clone(),
            attempt: 1,
            at: at(start),
        });
        for quarter in 1..=4 {
            events.push(Event::PullProgress {
                node: node.clone(),
                image: image.clone(),
                done: total * quarter / 4,
                total,
                at: at(start + quarter / 2),
            });
        }
        events.push(Event::PullDone {
            node: node.clone(),
            image: image.clone(),
            at: at(start + 2),
        });
    }
    let rest = &images[pulled..];
    match class {
        1 => {
            if let Some(image) = rest.first() {
                events.extend([
                    Event::PullStarted {
                        node: node.clone(),
                        image: image.clone(),
                        attempt: 1,
                        at: at(500),
                    },
                    Event::PullFailed {
                        node: node.clone(),
                        image: image.clone(),
                        reason: "no space left on device".into(),
                        at: at(510),
                    },
                ]);
            }
            events.push(Event::NodeStopped {
                node,
                reason: "out of space: no space left on device".into(),
                at: at(510),
            });
        }
        2..=11 => {
            // Up to five pulls in flight; on pulling nodes one of them has not moved for two minutes.
            for (k, image) in rest.iter().take(5).enumerate() {
                let total = size(pulled + k);
                events.push(Event::PullStarted {
                    node: node.clone(),
                    image: image.clone(),
                    attempt: 1,
                    at: at(540),
                });
                let last = if k == 4 && class >= 4 { 480 } else { 598 };
                events.push(Event::PullProgress {
                    node: node.clone(),
                    image: image.clone(),
                    done: total * (k as u64 + 1) / 7,
                    total,
                    at: at(last),
                });
            }
            if let Some(image) = rest.get(5) {
                let retry = |attempt, reason: &str, secs| Event::PullRetry {
                    node: node.clone(),
                    image: image.clone(),
                    attempt,
                    reason: reason.into(),
                    backoff: Duration::from_secs(2 * u64::from(attempt)),
                    at: at(secs),
                };
                let pull = |attempt, secs| Event::PullStarted {
                    node: node.clone(),
                    image: image.clone(),
                    attempt,
                    at: at(secs),
                };
                events.extend([
                    pull(1, 560),
                    retry(1, "connection reset by peer", 570),
                    pull(2, 572),
                    retry(2, "registry returned 503 Service Unavailable", 590),
                ]);
                if class <= 3 {
                    events.extend([
                        pull(3, 594),
                        Event::PullFailed {
                            node: node.clone(),
                            image: image.clone(),
                            reason: "registry returned 503 Service Unavailable".into(),
                            at: at(596),
                        },
                    ]);
                }
            }
        }
        _ => events.push(Event::Pinned {
            node,
            method: PinMethod::ContainerdLabel,
            confirmed: true,
            at: at(pulled as u64 + 5),
        }),
    }
    events
}

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::from(code))
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Renders `frames` frames at `width`×`height`, moving the selection down a row before each (a page
/// every tenth frame), and prints the frame-time figures.
fn frames(state: &mut State, width: u16, height: u16, frames: usize) {
    update(state, Msg::Resize { width, height });
    for _ in 0..5 {
        black_box(render_to_buffer(state, width, height));
    }
    let mut times = Vec::with_capacity(frames);
    let mut updates = Duration::ZERO;
    for frame in 0..frames {
        let started = Instant::now();
        let code = if frame % 10 == 9 {
            KeyCode::PageDown
        } else {
            KeyCode::Down
        };
        update(state, key(code));
        updates += started.elapsed();
        let started = Instant::now();
        black_box(render_to_buffer(state, width, height));
        times.push(started.elapsed());
    }
    let (median, p95, max) = stats(&mut times);
    println!(
        "render {width}x{height}, {frames} frames: median {}  p95 {}  max {}  (key update: {} per frame)",
        ms(median),
        ms(p95),
        ms(max),
        ms(updates / frames as u32),
    );
}

fn main() {
    let node_count = env_number("PINBOARD_BENCH_NODES", 2000);
    let image_count = env_number("PINBOARD_BENCH_IMAGES", 500);
    let frame_count = env_number("FRAMES", 200);
    let t0 = Instant::now();
    let now = t0 + Duration::from_secs(600);
    let images = image_names(image_count);
    let names: Vec<String> = (0..node_count).map(|n| format!("worker-{n:04}")).collect();

    let rss_before = rss_bytes();
    let (mut generating, mut folding, mut event_count) = (Duration::ZERO, Duration::ZERO, 0);
    let mut rollout = Rollout::expecting(&names);
    for n in 0..node_count {
        let started = Instant::now();
        let events = node_events(n, &images, t0);
        generating += started.elapsed();
        event_count += events.len();
        let started = Instant::now();
        for event in events {
            rollout.apply(event);
        }
        folding += started.elapsed();
    }
    let rss_after = rss_bytes();
    let mut state = State::new(
        format!("direct: {node_count} nodes"),
        Theme::named("dark").expect("the dark theme exists"),
        false,
        now,
    );
    let started = Instant::now();
    state.set_rollout(rollout);
    let ordering = started.elapsed();
    update(&mut state, key(KeyCode::Char('4')));
    assert_eq!(
        state.screen(),
        Screen::Rollout,
        "4 opens the Rollout screen"
    );
    println!("rollout: {node_count} nodes x {image_count} images, {event_count} events");
    println!(
        "build: events generated in {:.2?}, folded into a Rollout in {:.2?} ({:.0} ns/event), set_rollout {:.2?}",
        generating,
        folding,
        folding.as_nanos() as f64 / event_count as f64,
        ordering
    );
    println!(
        "resident memory (VmRSS): {:.1} MB before, {:.1} MB after building (+{:.1} MB)",
        rss_before as f64 / 1e6,
        rss_after as f64 / 1e6,
        (rss_after - rss_before) as f64 / 1e6
    );

    frames(&mut state, 120, 40, frame_count);
    frames(&mut state, 200, 60, frame_count);

    // Where a frame goes: the model queries the summary line and the counts make, over every node.
    let rounds = 20;
    let started = Instant::now();
    for _ in 0..rounds {
        black_box(state.rollout.bytes());
    }
    let bytes = started.elapsed() / rounds;
    let started = Instant::now();
    for _ in 0..rounds {
        for node in state.rollout.nodes().values() {
            black_box((node.throughput(now), node.eta(now)));
        }
    }
    let rates = started.elapsed() / rounds;
    let started = Instant::now();
    for _ in 0..rounds {
        for node in state.rollout.nodes().values() {
            black_box(node.stalled(now, state.stall_after).next());
        }
    }
    let stalls = started.elapsed() / rounds;
    println!(
        "per-frame model queries over all nodes: Rollout::bytes {}, throughput+eta per node {}, first stall per node {}",
        ms(bytes),
        ms(rates),
        ms(stalls)
    );

    let mut demo = demo_state(now, Theme::named("dark").expect("the dark theme exists"));
    update(&mut demo, key(KeyCode::Char('4')));
    let mut times: Vec<Duration> = (0..frame_count)
        .map(|_| {
            let started = Instant::now();
            black_box(render_to_buffer(&demo, 120, 40));
            started.elapsed()
        })
        .collect();
    let (median, _, _) = stats(&mut times);
    println!(
        "demo state (3 nodes, 5 images) render 120x40: median {}",
        ms(median)
    );

    // The live TUI folds each event through `update`, which also re-places the node in the sorted order.
    let extra = 20.min(node_count);
    let started = Instant::now();
    let mut extra_events = 0;
    for n in 0..extra {
        for event in node_events(n, &images, t0) {
            extra_events += 1;
            update(&mut state, Msg::Rollout(event));
        }
    }
    let per_event = started.elapsed() / extra_events;
    println!(
        "TUI fold, update(Msg::Rollout) into the full state: {:.1} µs/event ({extra_events} events of {extra} nodes)",
        per_event.as_nanos() as f64 / 1e3
    );
}

//! The rollout engine against the lab: real containerd nodes and a real registry behind a throttling proxy.
//! What the engine reports is checked against the nodes themselves (`ctr`, the pin files, a process that
//! records SIGHUP), not against the engine's own view.

use crate::support;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinboard::backend::lazy::LazyConfig;
use pinboard::backend::node::survey_node;
use pinboard::backend::pins::PinTarget;
use pinboard::backend::pins::{CRIO_DROP_IN, Reload};
use pinboard::backend::registry::{Registry, RegistryOptions};
use pinboard::backend::target::DirectNode;
use pinboard::engine::{self, Control, EngineConfig, NodeJob};
use pinboard::model::holders::holders_of;
use pinboard::model::image::{ImageFacts, Layer};
use pinboard::model::plan::{Limits, PlannedImage, Verdict, plan_node};
use pinboard::model::rollout::{Event, ImageState, NodeState, PinMethod, Rollout};
use pinboard::model::set::from_flags;
use support::hup::HupRecorder;
use support::{ImageSpec, Lab, LayerFormat, LayerSpec, NodeSpec, PushedImage, Runtime};

const MI: u64 = 1 << 20;
/// Limits under which every lab node fits.
const NO_FLOOR: Limits = Limits {
    gc_high_percent: 100,
    gc_high_given: true,
    min_free_bytes: 0,
    min_free_given: true,
    flags_over_agents: true,
};

fn lab(name: &str, nodes: &[(&str, u64)]) -> Lab {
    lab_on(name, nodes, None)
}

/// [`lab`], every node on `runtime` rather than the lab's default.
fn lab_on(name: &str, nodes: &[(&str, u64)], runtime: Option<Runtime>) -> Lab {
    let nodes = nodes
        .iter()
        .map(|&(n, bytes)| {
            let spec = NodeSpec::new(n, bytes);
            match runtime {
                Some(runtime) => spec.on(runtime),
                None => spec,
            }
        })
        .collect();
    Lab::with_nodes(name, nodes)
}

/// Pushes images made of `layers` (seed, bytes) each; returns them with their facts, by reference on `host`.
fn push(
    lab: &Lab,
    host: &str,
    images: &[(&str, Vec<(u64, usize)>)],
) -> (Vec<String>, HashMap<String, ImageFacts>) {
    let mut facts = HashMap::new();
    let references = images
        .iter()
        .map(|(repo, layers)| {
            let spec = ImageSpec {
                layers: layers
                    .iter()
                    .map(|&(seed, bytes)| LayerSpec {
                        seed,
                        bytes,
                        format: LayerFormat::Gzip,
                    })
                    .collect(),
                ..ImageSpec::default()
            };
            let pushed = lab.push_image(repo, &spec).expect("push");
            let reference = pushed.reference(host);
            facts.insert(reference.clone(), facts_of(&pushed));
            reference
        })
        .collect();
    (references, facts)
}

fn facts_of(p: &PushedImage) -> ImageFacts {
    ImageFacts {
        manifest_digest: p.manifest_digest.clone(),
        manifest_size: p.manifest_size,
        index_digest: None,
        platform: None,
        config_digest: p.config_digest.clone(),
        config_size: p.config_size,
        layers: p
            .layers
            .iter()
            .map(|l| Layer {
                digest: l.digest.clone(),
                media_type: l.media_type.clone(),
                size: l.size,
                annotations: Default::default(),
                diff_id: None,
            })
            .collect(),
        annotations: Default::default(),
        mirror: None,
    }
}

/// One job per lab node, planned the way `pinboard plan` plans it (observe, then plan_node).
async fn jobs(
    lab: &Lab,
    references: &[String],
    facts: &HashMap<String, ImageFacts>,
    limits: Limits,
    pin: impl Fn(&str) -> PinTarget,
) -> Vec<NodeJob> {
    let mut jobs = Vec::new();
    for node in lab.nodes() {
        let direct = DirectNode {
            name: node.name.clone(),
            endpoint: node.endpoint().parse().unwrap(),
        };
        let seen = survey_node(&direct, references, Duration::from_secs(10)).await;
        let planned: Vec<PlannedImage> = references
            .iter()
            .map(|r| PlannedImage {
                reference: r.as_str().into(),
                facts: &facts[r],
                present: seen.presence[r],
                lazy: None,
            })
            .collect();
        let plan = plan_node(&seen.facts, &planned, &limits);
        jobs.push(NodeJob {
            node: direct,
            plan,
            pin: pin(&node.name),
            holders: Arc::new(holders_of(&[from_flags("engine", references)])),
            lazy: LazyConfig::default(),
        });
    }
    jobs
}

fn start(
    jobs: Vec<NodeJob>,
    facts: HashMap<String, ImageFacts>,
    config: EngineConfig,
) -> engine::Engine {
    let registry = Registry::new(RegistryOptions::default()).expect("a registry client");
    engine::start(jobs, Arc::new(facts), Arc::new(registry), config)
}

fn record<'a>(listing: &'a str, name: &str) -> Option<&'a str> {
    listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

#[tokio::test(flavor = "multi_thread")]
async fn pulls_skip_what_is_present_pin_both_ways_and_refuse_a_full_node() {
    // "small" cannot hold the set with the free-space floor below: its plan verdict is no-space. On
    // containerd 1.6.20, which reports no pins, n2 pins through a CRI-O drop-in judged by the record (the
    // real CRI-O is tests/it/crio.rs).
    let lab = lab_on(
        "engine-apply",
        &[("n1", 200 * MI), ("n2", 200 * MI), ("small", 16 * MI)],
        Some(Runtime::Containerd16),
    );
    let host = lab.registry_host();
    let base = (1, 2 * MI as usize);
    let (refs, facts) = push(
        &lab,
        &host,
        &[
            ("engine/a", vec![base, (11, 256 << 10)]),
            ("engine/b", vec![base, (12, 256 << 10)]),
            ("engine/c", vec![base, (13, 256 << 10)]),
            ("engine/d", vec![(2, MI as usize), (14, 128 << 10)]),
        ],
    );
    lab.node("n1").pull(&refs[0]).expect("preload");
    let crio = tempfile::tempdir().unwrap();
    let drop_in = crio.path().join(CRIO_DROP_IN);
    let admin = "# pinned for the 4.19 upgrade, see OPS-123\n[crio]\n  [crio.image]\n    pinned_images = [\"old@sha256:0\"]\n";
    std::fs::write(&drop_in, admin).unwrap();
    // Its pidfile outside the drop-in directory: CRI-O would read any file there as its configuration.
    let recorder = HupRecorder::start(&lab.dir().join("crio"));
    let pidfile = recorder.pidfile.clone();
    let pin = |node: &str| match node {
        "n2" => PinTarget::CrioDropIn {
            config_dir: crio.path().into(),
            reload: Reload::Signal {
                pidfile: pidfile.clone(),
            },
        },
        _ => PinTarget::Detect,
    };
    let limits = Limits {
        min_free_bytes: 12 * MI,
        ..Limits::default()
    };

    let started = Instant::now();
    let planned = jobs(&lab, &refs, &facts, limits, pin).await;
    assert_eq!(planned[2].plan.verdict, Verdict::NoSpace);
    let rollout = engine::run_to_end(start(planned, facts.clone(), EngineConfig::default())).await;
    eprintln!("first apply: {:.2} s", started.elapsed().as_secs_f64());

    let n1 = &rollout.nodes()["n1"];
    assert!(matches!(
        n1.state,
        NodeState::Pinned {
            method: PinMethod::ContainerdLabel,
            confirmed: false,
            ..
        }
    ));
    assert_eq!(n1.images().map(|(r, _)| r).collect::<Vec<_>>(), refs);
    let present = n1.image(&refs[0]).unwrap();
    assert_eq!(
        present.state,
        ImageState::Pinned { confirmed: false },
        "present, then pinned"
    );
    assert!(
        present.retries().is_empty() && present.total_bytes == 0,
        "never pulled"
    );
    assert!(matches!(
        rollout.nodes()["n2"].state,
        NodeState::Pinned {
            method: PinMethod::CrioDropIn,
            ..
        }
    ));
    let NodeState::Refused { reason } = &rollout.nodes()["small"].state else {
        panic!("{:?}", rollout.nodes()["small"].state)
    };
    assert!(reason.starts_with("plan verdict no-space: "), "{reason}");
    // Byte figures: what each pull fetched adds up to the plan's fetch bytes.
    let plan_fetch: u64 =
        facts[&refs[3]].layers.iter().map(|l| l.size).sum::<u64>() + facts[&refs[3]].config_size;
    assert_eq!(
        rollout.nodes()["n2"].image(&refs[3]).unwrap().done_bytes,
        plan_fetch
    );

    // Every image is on n1 and n2 and on neither runtime twice; nothing reached the refused node.
    for node in ["n1", "n2"] {
        let listing = lab.node(node).images_ls();
        for (r, f) in refs.iter().map(|r| (r, &facts[r])) {
            let line =
                record(&listing, r).unwrap_or_else(|| panic!("{node} lacks {r}:\n{listing}"));
            // CRI pulls also name the image by its id; `ctr pull` (the preload) does not.
            let id = record(&listing, &f.config_digest);
            assert!(
                id.is_some() || r == &refs[0],
                "{node}: no id record for {r}"
            );
            // Only the containerd-label node carries the labels, on every record of the image.
            let labelled = node == "n1";
            for l in std::iter::once(line).chain(id) {
                assert_eq!(
                    l.contains("io.cri-containerd.pinned=pinned"),
                    labelled,
                    "{node}: {l}"
                );
                assert_eq!(
                    l.contains("pinboard.dev/set.engine=engine"),
                    labelled,
                    "{node}: held by the set: {l}"
                );
            }
        }
    }
    assert!(!lab.node("small").images_ls().contains("engine/"));

    // The drop-in: sorted, one entry per line marked with the set holding it; the pin that was there
    // before holders were recorded adopted as unowned, the administrator's comment kept; CRI-O told once.
    let mut sorted = refs.clone();
    sorted.push("old@sha256:0".into());
    sorted.sort();
    let expected = format!(
        "# pinned for the 4.19 upgrade, see OPS-123\n[crio]\n  [crio.image]\n    pinned_images = [\n{}    ]\n",
        sorted
            .iter()
            .map(|r| match r.as_str() {
                "old@sha256:0" => format!("      \"{r}\", # pinboard: (unowned)\n"),
                _ => format!("      \"{r}\", # pinboard: engine\n"),
            })
            .collect::<String>()
    );
    let written = std::fs::read_to_string(&drop_in).unwrap();
    assert!(
        written.starts_with("# pinboard marks each entry it pinned")
            && written.ends_with(&expected),
        "{written}"
    );
    assert_eq!(
        recorder.settled_hups(1),
        1,
        "one SIGHUP to the pid in the pidfile"
    );
    let before = std::fs::metadata(&drop_in).unwrap();

    // Again: everything is present, nothing is pulled, the drop-in is not rewritten, no reload.
    let requests = lab.proxy().requests();
    let planned = jobs(&lab, &refs, &facts, limits, pin).await;
    let again = engine::run_to_end(start(planned, facts, EngineConfig::default())).await;
    for node in ["n1", "n2"] {
        let n = &again.nodes()[node];
        assert!(
            matches!(n.state, NodeState::Pinned { .. }),
            "{node}: {:?}",
            n.state
        );
        assert!(
            n.images()
                .all(|(_, i)| i.total_bytes == 0 && i.retries().is_empty())
        );
    }
    assert_eq!(lab.proxy().requests(), requests);
    let after = std::fs::metadata(&drop_in).unwrap();
    assert_eq!(
        (after.ino(), after.mtime(), after.mtime_nsec()),
        (before.ino(), before.mtime(), before.mtime_nsec())
    );
    assert_eq!(
        recorder.settled_hups(2),
        1,
        "no reload when nothing changed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_fills_up_mid_pull_stops_with_the_reason() {
    let lab = lab("engine-enospc", &[("tiny", 6 * MI)]);
    let (mut refs, mut facts) = push(
        &lab,
        &lab.registry_host(),
        &[
            ("enospc/big", vec![(21, 8 * MI as usize)]),
            ("enospc/next", vec![(22, 64 << 10)]),
        ],
    );
    // First in line: an image the registry does not have, a permanent error.
    let missing = format!(
        "{}/enospc/missing@sha256:{}",
        lab.registry_host(),
        "0".repeat(64)
    );
    facts.insert(missing.clone(), facts[&refs[1]].clone());
    refs.insert(0, missing);
    let limits = Limits::default();
    let planned = jobs(&lab, &refs, &facts, limits, |_| PinTarget::ContainerdLabel).await;
    assert_eq!(planned[0].plan.verdict, Verdict::NoSpace);
    let config = EngineConfig {
        force: true,
        parallel: 1,
        ..EngineConfig::default()
    };
    let rollout = engine::run_to_end(start(planned, facts, config)).await;
    let tiny = &rollout.nodes()["tiny"];
    let NodeState::Stopped { reason } = &tiny.state else {
        panic!("{:?}", tiny.state)
    };
    assert!(
        reason.starts_with("node tiny: the image filesystem is full (no space left on device)"),
        "{reason}"
    );
    eprintln!("ENOSPC reason: {reason}");
    let missing = &tiny.image(&refs[0]).unwrap();
    assert!(
        matches!(&missing.state, ImageState::Failed { reason } if reason.contains("not found")),
        "{:?}",
        missing.state
    );
    let big = &tiny.image(&refs[1]).unwrap();
    assert!(
        matches!(&big.state, ImageState::Failed { reason } if reason.contains("no space left on device"))
    );
    assert!(
        missing.retries().is_empty() && big.retries().is_empty(),
        "neither is retried"
    );
    assert_eq!(tiny.image(&refs[2]).unwrap().state, ImageState::Skipped);
}

#[tokio::test(flavor = "multi_thread")]
async fn byte_progress_arrives_and_pulls_can_be_cancelled_and_retried() {
    let lab = lab("engine-progress", &[("n1", 100 * MI)]);
    // Through the proxy, capped at 4 MiB/s: an 8 MiB image takes about 2 s.
    let host = lab.proxy_host();
    let (refs, facts) = push(
        &lab,
        &host,
        &[
            ("progress/big", vec![(31, 8 * MI as usize)]),
            ("progress/other", vec![(32, 8 * MI as usize)]),
        ],
    );
    let planned = jobs(&lab, &refs, &facts, NO_FLOOR, |_| {
        PinTarget::ContainerdLabel
    })
    .await;
    lab.proxy().set_bandwidth(Some(4 * MI));
    let config = EngineConfig {
        parallel: 1,
        progress_interval: Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let mut engine = start(planned, facts.clone(), config);
    let (mut rollout, mut progress) = (Rollout::default(), Vec::new());
    let mut started = HashMap::new();
    let mut took = HashMap::new();
    let mut cancelled = false;
    while let Some(event) = engine.events.recv().await {
        match &event {
            Event::PullStarted { image, at, .. } => {
                started.insert(image.clone(), *at);
            }
            Event::PullProgress {
                image, done, total, ..
            } => {
                progress.push((image.clone(), *done, *total));
                // Cancel the second pull once it moves, then retry it.
                if *image == refs[1] && !cancelled && *done > 0 {
                    cancelled = true;
                    engine
                        .control
                        .send(Control::Cancel {
                            node: "n1".into(),
                            image: image.clone(),
                        })
                        .unwrap();
                }
            }
            Event::PullCancelled { image, .. } => {
                engine
                    .control
                    .send(Control::Retry {
                        node: "n1".into(),
                        image: image.clone(),
                    })
                    .unwrap();
            }
            Event::PullDone { image, at, .. } => {
                took.insert(image.clone(), at.duration_since(started[image]));
            }
            _ => {}
        }
        let finished = matches!(event, Event::Pinned { .. } | Event::PinFailed { .. });
        rollout.apply(event);
        if finished {
            break;
        }
    }
    eprintln!(
        "8 MiB at 4 MiB/s: {:?}; progress events: {}",
        took[&refs[0]],
        progress.len()
    );
    let n1 = &rollout.nodes()["n1"];
    assert!(
        matches!(n1.state, NodeState::Pinned { .. }),
        "{:?}",
        n1.state
    );
    let total = facts[&refs[0]].layers[0].size + facts[&refs[0]].config_size;
    let big: Vec<_> = progress.iter().filter(|(i, _, _)| *i == refs[0]).collect();
    assert!(big.len() >= 4, "progress every 200 ms over ~2 s: {big:?}");
    assert!(big.iter().all(|(_, _, t)| *t == total), "{big:?}");
    assert!(
        big.windows(2).all(|w| w[0].1 <= w[1].1),
        "never backwards: {big:?}"
    );
    assert!(
        big.iter().any(|(_, d, _)| *d > 0 && *d < total),
        "partial figures seen: {big:?}"
    );
    assert_eq!(big.last().unwrap().1, total);
    assert!(
        took[&refs[0]] >= Duration::from_millis(1500),
        "the cap applies: {:?}",
        took[&refs[0]]
    );
    assert!(cancelled, "the second pull was cancelled");
    assert_eq!(
        n1.image(&refs[1]).unwrap().state,
        ImageState::Pinned {
            confirmed: lab.node("n1").runtime.reports_pinned()
        },
        "retried after the cancel"
    );
    assert!(lab.node("n1").images_ls().contains(&refs[1]));
    drop(engine);

    // Without the cap, for comparison.
    lab.proxy().set_bandwidth(None);
    let (fast, fast_facts) = push(
        &lab,
        &host,
        &[("progress/fast", vec![(33, 8 * MI as usize)])],
    );
    let planned = jobs(&lab, &fast, &fast_facts, NO_FLOOR, |_| {
        PinTarget::ContainerdLabel
    })
    .await;
    let t0 = Instant::now();
    let done = engine::run_to_end(start(planned, fast_facts, EngineConfig::default())).await;
    assert!(matches!(done.nodes()["n1"].state, NodeState::Pinned { .. }));
    eprintln!("8 MiB uncapped, pull and pin: {:?}", t0.elapsed());
}

/// A lab whose n1 runs the real CRI-O with its pull bytes counted (`pinboard crio-progress on --crio-timeout
/// 10s`: progress every second, and CRI-O restarted, as it reads the setting only at start), and the job
/// that pins through its drop-in.
async fn counting_crio(name: &str) -> Lab {
    let mut lab = lab_on(name, &[("n1", 256 * MI)], Some(Runtime::Crio133));
    let on = lab.pinboard("crio-progress", &["on", "--crio-timeout", "10s"]);
    assert_eq!(on.code, 0, "{}\n{}", on.stdout, on.stderr);
    assert!(on.stdout.contains("written"), "{}", on.stdout);
    lab.restart_node("n1").unwrap();
    let status = lab.pinboard("crio-progress", &["status"]);
    assert!(
        status.stdout.contains("counted: every 1s") && status.stdout.contains("its metrics answer"),
        "{}",
        status.stdout
    );
    lab
}

/// How the lab's CRI-O node pins: its drop-in, reloaded through its pidfile.
fn crio_pin(lab: &Lab) -> impl Fn(&str) -> PinTarget + '_ {
    |_| {
        let crio = lab.node("n1").crio();
        PinTarget::CrioDropIn {
            config_dir: crio.config_dir.clone(),
            reload: Reload::Signal {
                pidfile: crio.pidfile.clone(),
            },
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn crio_1_33_pull_bytes_rise_as_they_arrive_and_the_total_is_what_the_link_carried() {
    let lab = counting_crio("engine-crio-bytes").await;
    let host = lab.proxy_host();
    let (refs, facts) = push(
        &lab,
        &host,
        &[(
            "crio-progress/big",
            vec![
                (41, 2 * MI as usize),
                (42, 2 * MI as usize),
                (43, 2 * MI as usize),
            ],
        )],
    );
    let planned = jobs(&lab, &refs, &facts, NO_FLOOR, crio_pin(&lab)).await;
    // 6 MiB at 1 MiB/s: six seconds of pulling.
    lab.proxy().set_bandwidth(Some(MI));
    let before = lab.proxy().bytes_down();
    let config = EngineConfig {
        progress_interval: Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let mut engine = start(planned, facts.clone(), config);
    let mut rollout = Rollout::default();
    let (mut started, mut first_bytes, mut live) = (None, None, None);
    let mut note = None;
    while let Some(event) = engine.events.recv().await {
        match &event {
            Event::NodeBytes {
                counted, note: n, ..
            } => note = Some((*counted, n.clone())),
            Event::PullStarted { at, .. } => started = Some(*at),
            Event::PullProgress { done, at, .. } if *done > 0 && first_bytes.is_none() => {
                first_bytes = Some(*at);
            }
            _ => {}
        }
        let finished = matches!(event, Event::Pinned { .. } | Event::PinFailed { .. });
        rollout.apply(event);
        let n1 = &rollout.nodes()["n1"];
        if first_bytes.is_some() && live.is_none() && n1.done_bytes() < n1.total_bytes() {
            let now = Instant::now();
            live = Some((n1.done_bytes(), n1.throughput(now), n1.eta(now)));
        }
        if finished {
            break;
        }
    }
    let moved = lab.proxy().bytes_down() - before;
    let (counted, note) = note.expect("the node says how its bytes are known");
    assert!(counted && note.contains("CRI-O's counters"), "{note}");
    let rose = first_bytes
        .expect("bytes rose")
        .duration_since(started.expect("a pull"));
    eprintln!("CRI-O: first bytes {rose:?} after the pull started");
    assert!(rose <= Duration::from_secs(2), "bytes rose after {rose:?}");
    let (done, rate, eta) = live.expect("seen mid-pull");
    assert!(
        done > 0 && rate.is_some() && eta.is_some(),
        "{done} {rate:?} {eta:?}"
    );
    let n1 = &rollout.nodes()["n1"];
    assert!(
        matches!(n1.state, NodeState::Pinned { .. }),
        "{:?}",
        n1.state
    );
    let (fetched, source) = n1.fetched().expect("what the node fetched");
    assert_eq!(
        source,
        pinboard::model::rollout::FetchedSource::RuntimeCounters
    );
    support::assert_within(
        "CRI-O's counted bytes, against the link's",
        fetched,
        moved,
        0.05,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn crio_1_33_a_stalled_pull_is_flagged_by_its_bytes_and_retried_with_the_reason() {
    let lab = counting_crio("engine-crio-stall").await;
    let host = lab.proxy_host();
    let (refs, facts) = push(
        &lab,
        &host,
        &[("crio-progress/stall", vec![(44, 4 * MI as usize)])],
    );
    let planned = jobs(&lab, &refs, &facts, NO_FLOOR, crio_pin(&lab)).await;
    // The first connection to carry 1 MiB stalls there: CRI-O's bytes stop.
    lab.proxy().set_bandwidth(Some(2 * MI));
    lab.proxy().stall_after(MI, Some(1));
    let config = EngineConfig {
        progress_interval: Duration::from_millis(200),
        pull_progress_timeout: Duration::from_secs(3),
        ..EngineConfig::default()
    };
    let mut engine = start(planned, facts, config);
    let mut rollout = Rollout::default();
    let (mut last_moved, mut stalled_after, mut retried) = (None, None, None);
    while let Some(event) = engine.events.recv().await {
        match &event {
            // The first attempt's start counts as its bytes' last move: CRI-O reports a read only once
            // a read ends past its interval, so a connection that stalls early reports nothing.
            Event::PullStarted { at, attempt: 1, .. } => last_moved = Some(*at),
            Event::PullProgress { done, at, .. } if *done > 0 => last_moved = Some(*at),
            Event::PullStalled { at, .. } => {
                stalled_after = last_moved.map(|moved| at.duration_since(moved));
            }
            Event::PullRetry { reason, .. } => retried = Some(reason.clone()),
            _ => {}
        }
        let finished = matches!(
            event,
            Event::Pinned { .. } | Event::PinFailed { .. } | Event::NodeStopped { .. }
        );
        rollout.apply(event);
        if finished {
            break;
        }
    }
    let stalled_after = stalled_after.expect("the pull was flagged stalled");
    eprintln!("CRI-O: stalled {stalled_after:?} after its bytes last moved");
    assert!(
        stalled_after <= Duration::from_secs(5),
        "flagged {stalled_after:?} after the bytes stopped (threshold 3 s)"
    );
    let reason = retried.expect("retried");
    assert!(
        reason.contains("no byte") || reason.contains("stall"),
        "{reason}"
    );
    assert!(
        matches!(rollout.nodes()["n1"].state, NodeState::Pinned { .. }),
        "the stall cleared and the retry pinned: {:?}",
        rollout.nodes()["n1"].state
    );
}

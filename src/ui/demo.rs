//! A fixed, realistic state for snapshot tests, screenshots and benchmarks: three nodes (one without
//! room, one tight, one that fits), two sets (one entry breaking a rule), a survey, a rollout half-way
//! (pulling, stalled, failed after retries, pinned) and config diffs. Times are relative to `now`, so
//! everything drawn from it is the same on every run. [`cluster_state`] is the same for cluster mode.
//! [`screens`] puts each screen on them, for the snapshot tests and the screenshots alike.

use crate::fleet::Traits;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::msg::Msg;
use super::state::{Pane, SetDraft, State};
use super::theme::Theme;
use super::update::update;
use crate::backend::pins;
use crate::model::config_view::{ConfigNote, ConfigView};
use crate::model::crio::{CrioConfig, PinnedImagesSetting};
use crate::model::diff::DiffKind;
use crate::model::holders::{Holder, Holders};
use crate::model::image::LazyFormat;
use crate::model::lazy::{LazyPulling, LazyState};
use crate::model::node_summary::NodeSummary;
use crate::model::plan::{
    EstimateBasis, FetchBasis, FloorSource, GcSource, ImagePlan, LinkBytes, NodePlan, Verdict,
};
use crate::model::rollout::{Event, PinMethod, Rollout};
use crate::model::set::{self, ImageSet};
use crate::survey::{SetSummary, Survey};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

pub const RELEASE: &str = "quay.io/openshift-release-dev/ocp-release@sha256:a4d451ec23463726f72c43d64c710968f6b602cd653b4de8adee1b556240a829";
pub const ART: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:d3cec99112255db9bf4963f7798562b6a36f1bd0b2016918629e007d474deb70";
pub const UBI: &str = "registry.redhat.io/ubi9/ubi-minimal@sha256:b7b4fe78377ca0959f88a01e2d2cc73d9f9fa9e3cf37b419edafabcb65d7120f";
pub const PROMETHEUS: &str = "registry.redhat.io/openshift4/ose-prometheus@sha256:3feb00294c5cb577d5679b958fcea898e0e7383fd7565096826c8d1ba55f11f8";
pub const EXPORTER: &str = "quay.io/prometheus/node-exporter@sha256:2303824a4e3dc61fe3195d1a6e978029d4774876cc9aba9d2c60ef85eb96a845";
/// Breaks a rule: a tag, not a digest.
pub const TAGGED: &str = "quay.io/openshift-release-dev/ocp-release:4.19.2-x86_64";

/// In the order the engine pulls them; UBI is already on every node.
const ROLLOUT: [&str; 5] = [RELEASE, ART, UBI, PROMETHEUS, EXPORTER];

fn node_info(
    name: &str,
    runtime: &str,
    (capacity, used): (u64, u64),
    (images, pinned): (usize, Option<usize>),
    pin_method: PinMethod,
    lazy: Option<LazyPulling>,
) -> NodeSummary {
    NodeSummary {
        name: name.into(),
        runtime: Some(runtime.into()),
        capacity_bytes: Some(capacity),
        used_bytes: Some(used),
        available_bytes: Some(capacity - used),
        images: Some(images),
        pinned,
        pin_method: Some(pin_method),
        lazy_pulling: lazy,
        reachable: Some(true),
        warning: None,
        cache: None,
    }
}

/// (reference, fetch bytes) of the images planned for a node; UBI is present everywhere.
fn node_plan(
    info: &NodeSummary,
    images: &[(&str, u64)],
    verdict: Verdict,
    reason: Option<&str>,
) -> NodePlan {
    let fetch: u64 = images.iter().map(|(_, bytes)| bytes).sum();
    let available = info.available_bytes.unwrap_or(0);
    NodePlan {
        node: info.name.clone(),
        runtime: info.runtime.clone(),
        capacity_bytes: info.capacity_bytes,
        used_bytes: info.used_bytes,
        available_bytes: info.available_bytes,
        space_source: None,
        fetch_bytes: fetch,
        estimated_disk_bytes: 2 * fetch,
        fetch_basis: FetchBasis::Exact,
        estimate_basis: EstimateBasis::TwiceCompressed,
        available_after_bytes: Some(available as i64 - 2 * fetch as i64),
        gc_high_percent: 85,
        gc_high_source: GcSource::Default,
        min_free_bytes: 16 * GI,
        min_free_source: FloorSource::Default,
        agent_min_free_bytes: None,
        verdict,
        reasons: reason.into_iter().map(str::to_string).collect(),
        images: images
            .iter()
            .map(|(reference, bytes)| ImagePlan {
                reference: (*reference).into(),
                present: Some(*bytes == 0),
                fetch_bytes: *bytes,
                estimated_disk_bytes: 2 * bytes,
                lazy_format: LazyFormat::None,
                lazy: None,
                mirror: None,
            })
            .collect(),
    }
}

fn sets(nodes: &[NodeSummary]) -> Vec<SetDraft> {
    let all: BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let upgrade = ImageSet {
        name: "upgrade-4.19".into(),
        ..set::parse_list(
            &format!("{RELEASE}\n{ART}\n{UBI}\n{TAGGED}\n"),
            "upgrade-4.19.txt",
        )
    };
    let monitoring = ImageSet {
        labels: BTreeMap::from([(
            "machineconfiguration.openshift.io/role".to_string(),
            "worker".to_string(),
        )]),
        ..set::from_flags("monitoring", &[PROMETHEUS.into(), EXPORTER.into()])
    };
    let some: BTreeSet<String> = all.iter().skip(1).cloned().collect();
    vec![SetDraft::new(upgrade, all), SetDraft::new(monitoring, some)]
}

fn rollout_events(t0: Instant) -> Vec<Event> {
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    let s = |text: &str| text.to_string();
    let images: Vec<String> = ROLLOUT.iter().map(|r| r.to_string()).collect();
    let (w1, w2) = (s("worker-1"), s("worker-2"));
    let mut events = vec![
        Event::NodeRefused {
            node: s("worker-0"),
            reason: s("plan verdict no-space: would leave 10 GiB free, below the 16 GiB floor"),
        },
        Event::NodeStarted {
            node: w1.clone(),
            images: images.clone(),
            at: at(0),
        },
        Event::NodeStarted {
            node: w2.clone(),
            images,
            at: at(0),
        },
    ];
    for node in [&w1, &w2] {
        events.push(Event::ImagePresent {
            node: node.clone(),
            image: s(UBI),
        });
    }
    // worker-2: everything pulled and pinned.
    for (image, bytes, done) in [
        (RELEASE, 2 * GI, 60),
        (ART, 7 * GI, 200),
        (PROMETHEUS, 768 * MI, 220),
        (EXPORTER, 256 * MI, 230),
    ] {
        let start = done - 30;
        events.extend([
            Event::PullStarted {
                node: w2.clone(),
                image: s(image),
                attempt: 1,
                at: at(start),
            },
            Event::PullProgress {
                node: w2.clone(),
                image: s(image),
                done: bytes,
                total: bytes,
                at: at(done),
            },
            Event::PullDone {
                node: w2.clone(),
                image: s(image),
                at: at(done),
            },
        ]);
    }
    events.push(Event::Pinned {
        node: w2,
        method: PinMethod::ContainerdLabel,
        confirmed: true,
        at: at(240),
    });
    // worker-1: one pulled, one pulling, one stalled, one failed after two retries.
    let pull = |image: &str, attempt, secs| Event::PullStarted {
        node: w1.clone(),
        image: s(image),
        attempt,
        at: at(secs),
    };
    let progress = |image: &str, done, total, secs| Event::PullProgress {
        node: w1.clone(),
        image: s(image),
        done,
        total,
        at: at(secs),
    };
    let retry = |attempt, reason: &str, secs| Event::PullRetry {
        node: w1.clone(),
        image: s(EXPORTER),
        attempt,
        reason: s(reason),
        backoff: Duration::from_secs(2 * u64::from(attempt)),
        at: at(secs),
    };
    events.extend([
        pull(RELEASE, 1, 0),
        progress(RELEASE, 2 * GI, 2 * GI, 100),
        Event::PullDone {
            node: w1.clone(),
            image: s(RELEASE),
            at: at(100),
        },
        pull(ART, 1, 100),
        progress(ART, 3 * GI + 200 * MI, 7 * GI, 298),
        pull(PROMETHEUS, 1, 100),
        progress(PROMETHEUS, 120 * MI, 768 * MI, 130),
        pull(EXPORTER, 1, 10),
        progress(EXPORTER, 64 * MI, 256 * MI, 30),
        retry(1, "connection reset by peer", 40),
        pull(EXPORTER, 2, 42),
        retry(2, "registry returned 503 Service Unavailable", 60),
        pull(EXPORTER, 3, 64),
        Event::PullFailed {
            node: w1.clone(),
            image: s(EXPORTER),
            reason: s("registry returned 503 Service Unavailable"),
            at: at(90),
        },
    ]);
    events
}

/// The demo set that holds an image of the rollout.
fn holder_of(image: &str) -> &'static str {
    if [PROMETHEUS, EXPORTER].contains(&image) {
        "monitoring"
    } else {
        "upgrade-4.19"
    }
}

fn config_views() -> BTreeMap<String, ConfigView> {
    let line = |kind, text: String| (kind, text);
    let wanted: Vec<String> = ROLLOUT.iter().map(|r| r.to_string()).collect();
    let holds: BTreeMap<String, BTreeSet<String>> = ROLLOUT
        .iter()
        .map(|r| (r.to_string(), BTreeSet::from([holder_of(r).to_string()])))
        .collect();
    // An earlier pinboard's drop-in, without holder marks: its pin is adopted as unowned.
    let old = "[crio]\n  [crio.image]\n    pinned_images = [\"registry.redhat.io/ubi9/ubi-minimal@sha256:cba06b5736faf67e54b07b561eae94395e774c517a7d910a54369e1263ccfbd4\"]\n";
    let new =
        pins::hold_in_drop_in(Some(old), &holds, None).expect("the demo's drop-in is valid TOML");
    let entries =
        pins::crio_entries(new.as_deref().unwrap_or_default()).expect("written by pinboard");
    let held = ConfigNote::held(entries.iter().map(|e| &e.holders));
    let written = entries.into_iter().map(|e| e.pattern).collect();
    let site = CrioConfig {
        settings: vec![PinnedImagesSetting {
            file: "10-site.conf".into(),
            patterns: vec!["registry.redhat.io/ubi9/*".into()],
        }],
    };
    let crio = ConfigView {
        path: format!("/etc/crio/crio.conf.d/{}", pins::CRIO_DROP_IN),
        notes: ConfigNote::in_force(
            &site.with_drop_in(pins::CRIO_DROP_IN, written),
            pins::CRIO_DROP_IN,
            &wanted,
        )
        .into_iter()
        .chain(held)
        .collect(),
        lines: crate::model::diff::lines(Some(old), new.as_deref()),
    };
    let held: Vec<Holders> = ROLLOUT
        .iter()
        .map(|r| Holders::from([Holder::Set(holder_of(r).into())]))
        .collect();
    let containerd = ConfigView {
        path: "containerd image labels io.cri-containerd.pinned=pinned and pinboard.dev/set.<set> (namespace k8s.io)".into(),
        notes: ConfigNote::held(&held).into_iter().collect(),
        lines: ROLLOUT
            .iter()
            .map(|r| {
                let kind = if *r == UBI {
                    DiffKind::Same
                } else {
                    DiffKind::Added
                };
                line(kind, format!("{r}  held by {}", holder_of(r)))
            })
            .collect(),
    };
    BTreeMap::from([
        ("worker-1".to_string(), crio),
        ("worker-2".to_string(), containerd),
    ])
}

/// The demo state at `now`: the rollout started five minutes before.
pub fn demo_state(now: Instant, theme: Theme) -> State {
    let nodes = vec![
        node_info(
            "worker-0",
            "containerd 1.7.24",
            (60 * GI, 32 * GI),
            (48, Some(12)),
            PinMethod::ContainerdLabel,
            Some(LazyPulling::new(LazyState::Off, None, None, None)),
        ),
        node_info(
            "worker-1",
            "cri-o 1.31.3",
            (200 * GI, 152 * GI),
            (131, Some(40)),
            PinMethod::CrioDropIn,
            None,
        ),
        node_info(
            "worker-2",
            "containerd 2.0.4",
            (200 * GI, 50 * GI),
            (37, None),
            PinMethod::ContainerdLabel,
            Some(LazyPulling::new(
                LazyState::On,
                Some("stargz"),
                Some(true),
                None,
            )),
        ),
    ];
    let full = [
        (RELEASE, 2 * GI),
        (ART, 7 * GI),
        (UBI, 0),
        (PROMETHEUS, 768 * MI),
        (EXPORTER, 256 * MI),
    ];
    let plans = vec![
        node_plan(
            &nodes[0],
            &full[..3],
            Verdict::NoSpace,
            Some("would leave 10 GiB free, below the 16 GiB floor (--min-free)"),
        ),
        node_plan(
            &nodes[1],
            &full,
            Verdict::Tight,
            Some(
                "would fill the image filesystem to 86%, above the image GC high threshold of 85% (--gc-high-percent): the kubelet would start removing unpinned images",
            ),
        ),
        node_plan(&nodes[2], &full, Verdict::Fits, None),
    ];
    // Every image some node lacks, once, against each node fetching its own (nothing cached yet).
    let link_bytes = LinkBytes {
        fan_out: full.iter().map(|(_, bytes)| bytes).sum(),
        direct: plans.iter().map(|p| p.fetch_bytes).sum(),
        ..LinkBytes::default()
    };
    let survey = Survey {
        sets: vec![
            SetSummary {
                name: "upgrade-4.19".into(),
                images: 3,
            },
            SetSummary {
                name: "monitoring".into(),
                images: 2,
            },
        ],
        gc_high_percent: 85,
        min_free_bytes: 16 * GI,
        nodes: plans,
        link_bytes,
        facts: Default::default(),
    };
    let mut state = State::new("direct: 3 nodes", theme, false, now);
    state.sets = sets(&nodes);
    state.nodes = nodes;
    state.survey = Some(survey);
    state.config = config_views();
    let names: Vec<String> = state.nodes.iter().map(|n| n.name.clone()).collect();
    state.set_rollout(Rollout::expecting(&names));
    for event in rollout_events(now - Duration::from_secs(300)) {
        update(&mut state, Msg::Rollout(event));
    }
    // Selections that show the interesting parts: the broken entry's rule, the failed image's retries.
    state.select(Pane::Entries, TAGGED);
    state.select(Pane::RolloutNodes, "worker-1");
    state.select(Pane::RolloutImages, EXPORTER);
    state
}

/// Cluster mode, as the watchers would feed it: a worker pool of five nodes rolling out generation 2 of
/// a release set (one done, one pulling, one slow past the daemon's sync window, one failed out of space,
/// one that has not seen generation 2), lazy pulling on for the pool, the pool's rollup at 1/5. Wall-clock
/// times are fixed, so it draws the same on every run.
pub fn cluster_state(now: Instant, theme: Theme) -> State {
    use serde_json::json;

    use crate::model::machine_config::{
        ClusterUpdate, Connection, DEGRADED, Kind, PROGRESSING, REQUEUE_TIMEOUT, ROLE_LABEL,
    };

    let wall = std::time::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let at = |ago: u64| {
        k8s_openapi::jiff::Timestamp::try_from(wall - Duration::from_secs(ago))
            .expect("a valid time")
            .to_string()
    };
    fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).expect("a valid object")
    }
    let mut state = State::new("cluster: lab.kubeconfig", theme, false, now);
    state.join_fleet(Traits::MACHINE_CONFIG, None, wall);
    let pool = json!({"metadata": {"name": "worker", "labels": {"pools.operator.machineconfiguration.openshift.io/worker": ""}},
        "spec": {"machineConfigSelector": {"matchLabels": {ROLE_LABEL: "worker"}},
                 "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}}},
        "status": {"poolSynchronizersStatus": [{"poolSynchronizerType": "PinnedImageSets", "machineCount": 5, "updatedMachineCount": 1}]}});
    let names = ["worker-0", "worker-1", "worker-2", "worker-3", "worker-4"];
    let nodes: Vec<k8s_openapi::api::core::v1::Node> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            // What each kubelet lists: worker-0 holds the whole set, worker-1 its first image so far; the rest
            // of each list is other images.
            let held: &[&str] = [&[RELEASE, ART, UBI][..], &[RELEASE], &[], &[], &[]][i];
            let others = (held.len()..[12, 50, 31, 8, 27][i])
                .map(|n| format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{n:064x}"));
            let images: Vec<_> = held
                .iter()
                .map(|r| r.to_string())
                .chain(others)
                .map(|name| json!({"names": [name], "sizeBytes": 1}))
                .collect();
            from(json!({"metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
                "status": {"conditions": [{"type": "Ready", "status": if i == 3 { "False" } else { "True" }}],
                           "capacity": {"ephemeral-storage": format!("{}Gi", [120, 120, 240, 120, 120][i])},
                           "allocatable": {"ephemeral-storage": format!("{}Gi", [108, 108, 216, 108, 108][i])},
                           "nodeInfo": {"containerRuntimeVersion": "cri-o://1.33.2", "architecture": "amd64",
                                        "bootID": "", "kernelVersion": "", "kubeProxyVersion": "",
                                        // worker-4's kubelet is older than pinned-image support in image GC.
                                        "kubeletVersion": if i == 4 { "v1.27.4" } else { "v1.33.2" },
                                        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
                           "images": images}}))
        })
        .collect();
    let condition = |type_: &str, on: bool, reason: &str, message: &str, ago: u64| {
        json!({"type": type_, "status": if on { "True" } else { "False" }, "reason": reason,
               "message": message, "lastTransitionTime": at(ago)})
    };
    let requeue = format!("{REQUEUE_TIMEOUT}: 14 of 121 images left");
    let no_space = "failed to pull quay.io/openshift-release-dev/ocp-v4.0-art-dev: writing blob: no space left on device";
    let daemon: [(serde_json::Value, bool, Option<&str>, u64); 5] = [
        (
            json!({"desiredGeneration": 2, "currentGeneration": 2}),
            false,
            None,
            900,
        ),
        (
            json!({"desiredGeneration": 2, "currentGeneration": 1}),
            true,
            None,
            185,
        ),
        (
            json!({"desiredGeneration": 2, "currentGeneration": 1, "lastFailedGeneration": 2,
                "lastFailedGenerationError": requeue}),
            true,
            Some(&requeue),
            420,
        ),
        (
            json!({"desiredGeneration": 2, "currentGeneration": 1, "lastFailedGeneration": 2,
                "lastFailedGenerationError": no_space}),
            false,
            Some("One or more PinnedImageSet is experiencing an error"),
            60,
        ),
        (
            json!({"desiredGeneration": 1, "currentGeneration": 1}),
            false,
            None,
            86_400,
        ),
    ];
    let mcns = names
        .iter()
        .zip(daemon)
        .map(|(name, (mut entry, progressing, degraded, ago))| {
            entry["name"] = json!("ocp-4.19-release");
            from(json!({"metadata": {"name": name}, "spec": {"node": {"name": name}, "pool": {"name": "worker"}},
                "status": {"pinnedImageSets": [entry], "conditions": [
                    condition(PROGRESSING, progressing, "ImagePrefetch", &format!("node is prefetching images: {name}"), ago),
                    condition(DEGRADED, degraded.is_some(), "PrefetchFailed", degraded.unwrap_or(""), ago),
                ]}}))
        })
        .collect();
    let set = json!({"metadata": {"name": "ocp-4.19-release", "generation": 2, "labels": {ROLE_LABEL: "worker"}},
        "spec": {"pinnedImages": [{"name": RELEASE}, {"name": ART}, {"name": UBI}]}});
    let lazy = json!({"metadata": {"name": "pinboard-lazy-worker"}, "spec": {
        "machineConfigPoolSelector": {"matchLabels": {"pools.operator.machineconfiguration.openshift.io/worker": ""}},
        "containerRuntimeConfig": {"additionalLayerStores": [{"path": "/var/lib/stargz-store/store:ref"}]}}});
    let updates = [
        ClusterUpdate::Pools(vec![from(pool)]),
        ClusterUpdate::Nodes(nodes.iter().map(Into::into).collect()),
        ClusterUpdate::MachineConfigNodes(mcns),
        ClusterUpdate::Sets(vec![from(set)]),
        ClusterUpdate::RuntimeConfigs(vec![from(lazy)]),
    ];
    for update in updates {
        super::update::update(&mut state, Msg::Cluster(update));
    }
    for kind in Kind::ALL {
        super::update::update(
            &mut state,
            Msg::Cluster(ClusterUpdate::Connection(kind, Connection::Synced)),
        );
    }
    state.select(Pane::RolloutNodes, "worker-2");
    state
}

/// Every screen as the snapshot tests and the screenshots show it: a name and the demo state after the keys
/// that put that screen on.
pub fn screens(now: Instant, theme: &Theme) -> Vec<(&'static str, State)> {
    use KeyCode::{Char, Tab};
    let screens: [(&str, &[KeyCode]); 10] = [
        ("nodes", &[Char('1')]),
        ("sets", &[Char('2')]),
        ("plan", &[Char('3')]),
        ("rollout", &[Char('4')]),
        ("config", &[Char('5')]),
        ("help", &[Char('4'), Char('?')]),
        // The monitoring set (the one without a broken entry), asking before it applies.
        ("apply", &[Char('2'), Tab, Tab, Char('j'), Char('a')]),
        ("cluster-nodes", &[Char('1')]),
        ("cluster-sets", &[Char('2')]),
        ("cluster-rollout", &[Char('4')]),
    ];
    screens
        .into_iter()
        .map(|(name, keys)| {
            let mut state = if name.starts_with("cluster-") {
                cluster_state(now, theme.clone())
            } else {
                demo_state(now, theme.clone())
            };
            for code in keys {
                update(
                    &mut state,
                    Msg::Key(KeyEvent::new(*code, KeyModifiers::NONE)),
                );
            }
            (name, state)
        })
        .collect()
}

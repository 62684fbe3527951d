//! Benchmark: what one `pinboard agent` writes to the API server while it pre-loads and pins a set of 200
//! images (`PINBOARD_BENCH_IMAGES`) on its node: a real agent process, started as the DaemonSet's pod
//! runs it (`NODE_NAME=n1 pinboard agent …`: default write interval and 30 s heartbeat), against the
//! lab's kube-apiserver (with the manifests `pinboard agent manifests` prints) and one lab containerd
//! node, pulling real images (each one 512 KiB layer, `PINBOARD_BENCH_LAYER_KIB`) through the lab proxy
//! capped at `PINBOARD_BENCH_KIBPS` (1024 KiB/s), so that the rollout lasts long enough (about 100 s) for
//! the agent's write interval to decide how often it writes.
//!
//! Then, the set pinned and nothing changing, the steady cost of the agent's checking its node against
//! the set (`--verify-every`, 30 s by default) over `PINBOARD_BENCH_IDLE_SECONDS` (120): the agent's CPU
//! time (`/proc/PID/stat`), containerd's gRPC calls by method (its own counters, `[metrics] address`),
//! and the API writes meanwhile.
//!
//! Counted from the applied PinSet to the report saying `pinned` (and 10 s more): the API server's own
//! request counters (`apiserver_request_total` on `/metrics`, every write request by resource and verb:
//! only the agent writes then) and, from watches, how often the node's PinboardNode, its
//! PinboardNodeImages, its PinboardNodeBlobs (what its runtime holds, for the plans) and its Lease really
//! changed (a new resourceVersion: a write to etcd). Each run is
//! a fresh lab; the medians of `PINBOARD_BENCH_RUNS` (3) runs are printed, and the load average before
//! each.
//!
//!     cargo bench --bench agent_writes     # PINBOARD_BENCH_IMAGES=200 PINBOARD_BENCH_KIBPS=1024 PINBOARD_BENCH_RUNS=3
//!                                          # PINBOARD_BENCH_IDLE_SECONDS=120
//!
//! Needs root (the lab mounts tmpfs). Prints one line per figure; results go in BENCHMARKS.md.

mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{env_number, load_average, since, spread};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use pinboard::backend::pinboard_api::PinboardApi;
use pinboard::model::pinboard_api::{
    DEFAULT_NAMESPACE, GROUP, IMAGES_KIND, IMAGES_PLURAL, NODE_KIND, NODE_PLURAL, NodeSetPhase,
    PinboardNode, VERSION, lease_name,
};
use pinboard::model::pinboard_kinds::{BLOBS_KIND, BLOBS_PLURAL};
use pinboard::model::set::from_flags;
use support::cluster::client;
use support::kube_objects::apply_yaml;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec};

const NODE: &str = "n1";
const SET: &str = "release";
/// How long the agent gets to start, and the rollout to end.
const WAIT: Duration = Duration::from_secs(900);

/// New resourceVersions, by `KIND name`, as watches tell them.
type Counts = common::Counts;

/// The API server's write requests so far, by verb and resource.
async fn write_requests(admin: &kube::Client) -> Counts {
    let mut counts = common::apiserver_requests(admin).await;
    counts.retain(|key, _| common::is_write(key));
    counts
}

/// Counts every new resourceVersion `api`'s watch sees, by `KIND name`, from when it is listed.
fn count_versions<K>(
    kind: &'static str,
    api: Api<K>,
    counts: Arc<Mutex<Counts>>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        let mut listed = false;
        while let Some(Ok(event)) = events.next().await {
            match event {
                Event::InitDone => listed = true,
                Event::Apply(object) if listed => {
                    let name = object.meta().name.clone().unwrap_or_default();
                    *counts
                        .lock()
                        .unwrap()
                        .entry(format!("{kind} {name}"))
                        .or_default() += 1.0;
                }
                _ => {}
            }
        }
    })
}

/// containerd's gRPC calls served so far, by `service/method`, whatever their answer.
fn runtime_calls(node: &support::Node) -> Counts {
    let mut counts = Counts::new();
    for ((call, _code), n) in node.grpc_calls() {
        *counts.entry(call).or_default() += n;
    }
    counts
}

/// CPU seconds process `pid` has used (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the agent runs");
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th of the line.
    let after = stat.rsplit_once(") ").expect("a stat line").1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The lab (one node, the API server), the set's images pushed, the manifests applied and `n1`'s Node.
fn lab_with_images(images: usize, layer_bytes: usize, metrics: &str) -> (Lab, Vec<String>) {
    let lab = Lab::start(
        "bench-agent-writes",
        LabConfig {
            nodes: vec![NodeSpec::new(NODE, 4 << 30).serving_metrics(metrics)],
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let pushing = Instant::now();
    let references = (0..images)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 1000 + i as u64,
                    bytes: layer_bytes,
                    format: LayerFormat::Gzip,
                }],
                ..ImageSpec::default()
            };
            let pushed = lab.push_image(&format!("bench/agent{i}"), &spec);
            pushed.expect("push").reference(&lab.proxy_host())
        })
        .collect();
    eprintln!("pushed {images} images in {:.1?}", pushing.elapsed());
    (lab, references)
}

/// `pinboard agent` for node `n1`, as its pod runs it, with the admin's kubeconfig.
fn start_agent(lab: &Lab, kubeconfig: &std::path::Path) -> Child {
    let node = lab.node(NODE);
    let certs = node
        .hosts_toml("x")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let log = std::fs::File::create(lab.dir().join("agent.log")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(["agent", "--cri", &node.endpoint(), "--registry-config-dir"])
        .arg(certs)
        // The lab node's 4 GiB image filesystem is below the default 16 GiB floor.
        .args([
            "--insecure-registry",
            &lab.proxy_host(),
            "--min-free",
            "64Mi",
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("NODE_NAME", NODE)
        .env("POD_NAMESPACE", DEFAULT_NAMESPACE)
        .env("PINBOARD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the agent starts")
}

/// What one rollout cost.
struct Run {
    /// From applying the set to its report saying pinned.
    rollout: Duration,
    /// Write requests by verb and resource.
    requests: Counts,
    /// New resourceVersions of the node's report, its detail, what its runtime holds, its Lease and the
    /// aggregator's Lease.
    report_versions: f64,
    images_versions: f64,
    blobs_versions: f64,
    lease_versions: f64,
    aggregator_versions: f64,
    /// Then, the set pinned and nothing changing: the agent's CPU share of one core, containerd's gRPC
    /// calls per minute by method, and the API writes per minute.
    idle_cpu: f64,
    idle_calls: Counts,
    idle_writes: Counts,
}

/// Waits until `n1`'s report has the set in `phase` (any phase: `None`); returns when that was seen.
async fn wait_for_report(reports: &Api<DynamicObject>, phase: Option<NodeSetPhase>) -> Instant {
    let deadline = Instant::now() + WAIT;
    loop {
        let report = reports.get_opt(NODE).await.unwrap();
        let typed: Option<PinboardNode> =
            report.and_then(|r| serde_json::from_value(serde_json::to_value(r).ok()?).ok());
        let state = typed.as_ref().and_then(|t| t.status.as_ref()).map(|s| {
            s.sets
                .iter()
                .find(|set| set.name == SET)
                .map(|set| set.state)
        });
        let done = match phase {
            None => state.is_some(),
            Some(phase) => state.flatten() == Some(phase),
        };
        if done {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the agent's report never said {phase:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn one_run(
    runtime: &tokio::runtime::Runtime,
    images: usize,
    layer_bytes: usize,
    bps: u64,
    idle: Duration,
) -> Run {
    let metrics = format!("127.0.0.1:{}", support::free_port().expect("a free port"));
    let (lab, references) = lab_with_images(images, layer_bytes, &metrics);
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let mut agent = None;
    let run = runtime.block_on(async {
        let admin = client(&kubeconfig, None).await;
        let manifests = Command::new(env!("CARGO_BIN_EXE_pinboard"))
            .args(["agent", "manifests"])
            .output()
            .expect("pinboard agent manifests runs");
        apply_yaml(&admin, &String::from_utf8_lossy(&manifests.stdout)).await;
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
        Api::<Node>::all(admin.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, VERSION, NODE_KIND),
            NODE_PLURAL,
        );
        let reports: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
        let of_kind = |kind: &str, plural: &str| -> Api<DynamicObject> {
            let gvk = GroupVersionKind::gvk(GROUP, VERSION, kind);
            Api::all_with(
                admin.clone(),
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            )
        };
        let details = of_kind(IMAGES_KIND, IMAGES_PLURAL);
        let blobs = of_kind(BLOBS_KIND, BLOBS_PLURAL);
        agent = Some(start_agent(&lab, &kubeconfig));
        // The agent's first report (its node's facts) comes before the set.
        let deadline = Instant::now() + WAIT;
        while reports.get_opt(NODE).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "the agent never reported");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let versions = Arc::new(Mutex::new(Counts::new()));
        let leases: Api<Lease> = Api::namespaced(admin.clone(), DEFAULT_NAMESPACE);
        let watches = [
            count_versions(NODE_KIND, reports.clone(), Arc::clone(&versions)),
            count_versions(IMAGES_KIND, details, Arc::clone(&versions)),
            count_versions(BLOBS_KIND, blobs, Arc::clone(&versions)),
            count_versions("Lease", leases, Arc::clone(&versions)),
        ];
        tokio::time::sleep(Duration::from_secs(2)).await;
        lab.proxy().set_bandwidth(Some(bps));
        let before = write_requests(&admin).await;
        let counted_from = versions.lock().unwrap().clone();
        let api = PinboardApi::new(admin.clone(), DEFAULT_NAMESPACE);
        let applied = Instant::now();
        api.apply_set(&from_flags(SET, &references))
            .await
            .expect("the set is applied");
        let pinned = wait_for_report(&reports, Some(NodeSetPhase::Pinned)).await;
        // What the agent writes once it is done (the settled report, its facts read again).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let mut requests = since(&before, &write_requests(&admin).await);
        // The set itself is the bench's, and the API server's own endpoints are no agent's.
        requests.remove("APPLY pinsets");
        requests.remove("POST endpoints");
        let versions = since(&counted_from, &versions.lock().unwrap());
        for watch in watches {
            watch.abort();
        }
        // Nothing changes from here: what checking costs.
        let pid = agent.as_ref().expect("started").id();
        let (cpu, calls, writes, from) = (
            cpu_seconds(pid),
            runtime_calls(lab.node(NODE)),
            write_requests(&admin).await,
            Instant::now(),
        );
        tokio::time::sleep(idle).await;
        let minutes = from.elapsed().as_secs_f64() / 60.0;
        let per_minute = |counts: Counts| -> Counts {
            counts.into_iter().map(|(k, v)| (k, v / minutes)).collect()
        };
        let idle_cpu = (cpu_seconds(pid) - cpu) / from.elapsed().as_secs_f64();
        let idle_calls = per_minute(since(&calls, &runtime_calls(lab.node(NODE))));
        let idle_writes = per_minute(since(&writes, &write_requests(&admin).await));
        let of = |name: &str| versions.get(name).copied().unwrap_or(0.0);
        Run {
            idle_cpu,
            idle_calls,
            idle_writes,
            rollout: pinned - applied,
            requests,
            report_versions: of(&format!("{NODE_KIND} {NODE}")),
            images_versions: of(&format!("{IMAGES_KIND} {NODE}")),
            blobs_versions: of(&format!("{BLOBS_KIND} {NODE}")),
            lease_versions: of(&format!("Lease {}", lease_name(NODE))),
            aggregator_versions: of("Lease pinboard-aggregator"),
        }
    });
    if let Some(mut agent) = agent {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    run
}

fn main() {
    let images = env_number("PINBOARD_BENCH_IMAGES", 200usize);
    let layer_bytes = env_number("PINBOARD_BENCH_LAYER_KIB", 512usize) * 1024;
    let bps = env_number("PINBOARD_BENCH_KIBPS", 1024u64) * 1024;
    let runs = env_number("PINBOARD_BENCH_RUNS", 3usize).max(1);
    let idle = Duration::from_secs(env_number("PINBOARD_BENCH_IDLE_SECONDS", 120u64));
    pinboard::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut done = Vec::new();
    let mut loads = Vec::new();
    for n in 1..=runs {
        let load = load_average();
        println!("--- run {n} of {runs} (load {load})");
        loads.push(load);
        let run = one_run(&runtime, images, layer_bytes, bps, idle);
        println!(
            "rollout {:.1} s; write requests {:?}; new resourceVersions: report {}, its images {}, what \
             its runtime holds {}, its Lease {}, the aggregator's Lease {}",
            run.rollout.as_secs_f64(),
            run.requests,
            run.report_versions,
            run.images_versions,
            run.blobs_versions,
            run.lease_versions,
            run.aggregator_versions
        );
        println!(
            "idle: CPU {:.2} % of a core; runtime calls per minute {:.1} {:?}; API writes per minute {:?}",
            run.idle_cpu * 100.0,
            run.idle_calls.values().sum::<f64>(),
            run.idle_calls,
            run.idle_writes
        );
        done.push(run);
    }
    println!(
        "{images} images of {} KiB at {} KiB/s, median (min–max) of {runs} runs; load (1, 5, 15 min) \
         before each: {}; after: {}",
        layer_bytes / 1024,
        bps / 1024,
        loads.join(" | "),
        load_average()
    );
    let of = |f: &dyn Fn(&Run) -> f64| done.iter().map(f).collect::<Vec<f64>>();
    let count = |v: f64| format!("{v:.0}");
    println!(
        "rollout {}",
        spread(of(&|r| r.rollout.as_secs_f64()), |v| format!("{v:.1} s"))
    );
    let kinds: std::collections::BTreeSet<&String> =
        done.iter().flat_map(|r| r.requests.keys()).collect();
    for kind in kinds {
        println!(
            "{kind:<36} {}",
            spread(of(&|r| r.requests.get(kind).copied().unwrap_or(0.0)), count)
        );
    }
    println!(
        "new resourceVersions: report {}, its images {}, what its runtime holds {}, its Lease {}, the \
         aggregator's Lease {}",
        spread(of(&|r| r.report_versions), count),
        spread(of(&|r| r.images_versions), count),
        spread(of(&|r| r.blobs_versions), count),
        spread(of(&|r| r.lease_versions), count),
        spread(of(&|r| r.aggregator_versions), count),
    );
    println!(
        "idle {} s: agent CPU {} of a core; runtime calls per minute {}; API writes per minute {}",
        idle.as_secs(),
        spread(of(&|r| r.idle_cpu * 100.0), |v| format!("{v:.2} %")),
        spread(of(&|r| r.idle_calls.values().sum()), |v| format!("{v:.1}")),
        spread(of(&|r| r.idle_writes.values().sum()), |v| format!("{v:.1}")),
    );
    let methods: std::collections::BTreeSet<&String> =
        done.iter().flat_map(|r| r.idle_calls.keys()).collect();
    for method in methods {
        println!(
            "  {method:<44} {} per minute",
            spread(
                of(&|r| r.idle_calls.get(method).copied().unwrap_or(0.0)),
                |v| format!("{v:.1}")
            )
        );
    }
}

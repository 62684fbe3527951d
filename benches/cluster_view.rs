//! Benchmark: cluster mode's watched view of a large cluster, in the lab's etcd + kube-apiserver: 2,000 Nodes
//! (worker role, Ready, 100Gi allocatable ephemeral storage, 30 `status.images` entries each), 2,000
//! MachineConfigNodes (one per node, pool worker, a `status.pinnedImageSets` entry per set and both
//! conditions), 20 PinnedImageSets labelled for the worker pool (40 digest references each) and the worker
//! MachineConfigPool. Objects are created 32 requests at a time, untimed (the time is printed).
//!
//! Measures: (a) from `cluster::connect` through `Cluster::discover` and `watch` to the first complete view
//! (synced, every Node, MachineConfigNode and set in it, folded into the TUI's state and its Rollout screen
//! drawn); (b) from patching one MachineConfigNode's status (one set failed, Degraded) to the TUI's Rollout
//! screen, following that set, drawn with it (120×40), `PINBOARD_BENCH_CHANGES` times (median / p95 /
//! max), with where that time goes; (c) resident memory (VmRSS) before watching and after the first complete
//! view (also once malloc_trim has returned free heap). Then the lists, decoding and conversion behind (a)
//! and (b), each timed on its own. Goals: (a) ≤ 3 s; (b) ≤ 250 ms for every change.
//!
//! The agents contender (benches/cluster_view/agents.rs) measures the same on pinboard's agents: 5,000
//! Nodes with one PinboardNode report of 200 images each (`PINBOARD_BENCH_AGENT_NODES`,
//! `PINBOARD_BENCH_AGENT_IMAGES`), then the plan of a set of those 200 images on every node, by what each
//! node's agent published of what its runtime holds, `PINBOARD_BENCH_PLANS` times each way
//! (benches/cluster_view/agents_plan.rs). Every contender (`PINBOARD_BENCH_CONTENDERS`, by default both) runs
//! `PINBOARD_BENCH_RUNS` times, interleaved, each on a fresh lab; the medians (min–max) and the load average
//! before each run are printed at the end.
//!
//!     cargo bench --bench cluster_view     # PINBOARD_BENCH_NODES=2000 PINBOARD_BENCH_SETS=20 PINBOARD_BENCH_CHANGES=20
//!                                          # PINBOARD_BENCH_AGENT_NODES=5000 PINBOARD_BENCH_AGENT_IMAGES=200
//!                                          # PINBOARD_BENCH_RUNS=3 PINBOARD_BENCH_CONTENDERS=openshift,agents
//!                                          # PINBOARD_BENCH_PLANS=3
//!
//! Prints one line per figure; results go in BENCHMARKS.md.

#[path = "cluster_view/agents.rs"]
mod agents;
#[path = "cluster_view/agents_plan.rs"]
mod agents_plan;
mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use common::{env_number, load_average, rss_bytes, spread, stats, trimmed_rss};
use pinboard::fleet::Traits;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject};
use pinboard::backend::openshift::{Cluster, ClusterError, ConnectOptions, Watch, connect, watch};
use pinboard::model::machine_config::{
    ClusterUpdate, ClusterView, MachineConfigNode, ROLE_LABEL, SetProgress,
};
use pinboard::model::set::from_flags;
use pinboard::ui;
use pinboard::ui::msg::Msg;
use pinboard::ui::render::render_to_buffer;
use pinboard::ui::state::{Pane, State};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use support::cluster::{discover, install_crds};
use support::{Lab, LabConfig};

/// Requests in flight while creating the objects.
const IN_FLIGHT: usize = 32;
const IMAGES_PER_SET: usize = 40;
const IMAGES_PER_NODE: usize = 30;
/// How long any wait may take before the bench gives up.
const WAIT: Duration = Duration::from_secs(120);
const MANAGER: &str = "pinboard-bench";

/// The TUI's state in cluster mode, on the Rollout screen.
fn cluster_tui() -> State {
    let theme = ui::theme::Theme::named("monochrome").expect("a built-in theme");
    let mut state = State::new("cluster: bench", theme, false, Instant::now());
    state.join_fleet(Traits::MACHINE_CONFIG, None, SystemTime::now());
    let key = KeyEvent::new(KeyCode::Char('4'), KeyModifiers::NONE);
    ui::update::update(&mut state, Msg::Key(key));
    state
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Digest reference number `i`, as an OpenShift release lists its images.
fn image(i: usize) -> String {
    let digest = Sha256::digest(format!("image {i}").as_bytes());
    format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{digest:x}")
}

fn node_name(n: usize) -> String {
    format!("worker-{n:04}")
}

fn set_name(s: usize) -> String {
    format!("set-{s:02}")
}

/// Runs `tasks`, [`IN_FLIGHT`] at a time.
async fn all<F: Future<Output = ()>>(tasks: impl Iterator<Item = F>) {
    futures::stream::iter(tasks)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// A MachineConfigNode's status as the daemon writes it: every set done at generation 1, except `failed`
/// (set, error), which failed and leaves the node Degraded.
fn mcn_status(sets: usize, failed: Option<(&str, &str)>) -> Value {
    let since = "2026-11-21T08:00:00Z";
    let entries: Vec<Value> = (0..sets)
        .map(|s| {
            let name = set_name(s);
            let mut entry = json!({"name": name, "desiredGeneration": 1, "currentGeneration": 1});
            if let Some((_, error)) = failed.filter(|(set, _)| *set == name) {
                entry["lastFailedGeneration"] = json!(1);
                entry["lastFailedGenerationError"] = json!(error);
            }
            entry
        })
        .collect();
    let degraded = failed.is_some();
    json!({"status": {
        "pinnedImageSets": entries,
        "conditions": [
            {"type": "PinnedImageSetsProgressing", "status": "False", "reason": "AsExpected",
             "message": "all pinned image sets complete", "lastTransitionTime": since},
            {"type": "PinnedImageSetsDegraded", "status": if degraded { "True" } else { "False" },
             "reason": if degraded { "PrefetchFailed" } else { "AsExpected" },
             "message": if degraded { "One or more PinnedImageSet is experiencing an error" } else { "no errors" },
             "lastTransitionTime": since},
        ],
    }})
}

/// Creates the pool, the sets, the Nodes (with status) and their MachineConfigNodes (with status).
async fn create_objects(cluster: &Cluster, nodes: usize, sets: usize) {
    let client = cluster.client();
    let resources = cluster.resources();
    let apply = |resource: &ApiResource, name: &str, rest: Value| {
        let mut body = json!({"apiVersion": resource.api_version, "kind": resource.kind,
                              "metadata": {"name": name}});
        body.as_object_mut()
            .unwrap()
            .extend(rest.as_object().unwrap().clone());
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        let name = name.to_owned();
        async move {
            api.patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
        }
    };
    let selector = json!({"matchLabels": {ROLE_LABEL: "worker"}});
    let node_selector = json!({"matchLabels": {"node-role.kubernetes.io/worker": ""}});
    apply(
        &resources.pool,
        "worker",
        json!({"spec": {"machineConfigSelector": selector, "nodeSelector": node_selector}}),
    )
    .await;

    all((0..sets).map(|s| async move {
        let images: Vec<String> = (0..IMAGES_PER_SET)
            .map(|k| image(s * IMAGES_PER_SET + k))
            .collect();
        let mut set = from_flags(&set_name(s), &images);
        set.labels = [(ROLE_LABEL.to_owned(), "worker".to_owned())].into();
        cluster.apply_set(&set).await.expect("set applied");
    }))
    .await;

    create_nodes(client, nodes, sets.max(1) * IMAGES_PER_SET).await;

    let mcn_api: Api<DynamicObject> = Api::all_with(client.clone(), &resources.machine_config_node);
    all((0..nodes).map(|n| {
        let mcn_api = mcn_api.clone();
        let create = apply(
            &resources.machine_config_node,
            &node_name(n),
            json!({"spec": {"node": {"name": node_name(n)}, "pool": {"name": "worker"}}}),
        );
        async move {
            create.await;
            let status = mcn_status(sets, None);
            mcn_api
                .patch_status(
                    &node_name(n),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .unwrap_or_else(|e| panic!("status of MachineConfigNode {}: {e}", node_name(n)));
        }
    }))
    .await;
}

/// Creates `nodes` worker Nodes, each with its status (Ready, 100Gi allocatable ephemeral storage,
/// [`IMAGES_PER_NODE`] images out of the first `pool_images`); returns them as created (with their uids).
async fn create_nodes(client: &kube::Client, nodes: usize, pool_images: usize) -> Vec<Node> {
    let node_api: Api<Node> = Api::all(client.clone());
    futures::stream::iter((0..nodes).map(|n| {
        let node_api = node_api.clone();
        async move {
            let name = node_name(n);
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
            }))
            .unwrap();
            let created = node_api
                .create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("node {name}: {e}"));
            let images: Vec<Value> = (0..IMAGES_PER_NODE)
                .map(|k| {
                    let size = 20_000_000 + 1_000_000 * k;
                    json!({"names": [image((n * 13 + k) % pool_images)], "sizeBytes": size})
                })
                .collect();
            let status = json!({"status": {
                "conditions": [{"type": "Ready", "status": "True"},
                               {"type": "DiskPressure", "status": "False"}],
                "allocatable": {"ephemeral-storage": "100Gi"},
                "images": images,
            }});
            node_api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap_or_else(|e| panic!("status of node {name}: {e}"));
            created
        }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect()
    .await
}

type Rows = Vec<(String, SetProgress)>;

/// What the TUI does with each update: fold it into the state (cluster mode, Rollout screen, following
/// `set`) and draw the frame at 120×40; the rows of `set`'s rollout are returned for the bench's checks.
fn show(state: &mut State, update: ClusterUpdate, set: &str) -> Rows {
    ui::update::update(state, Msg::Cluster(update));
    state.select(Pane::Sets, set);
    std::hint::black_box(render_to_buffer(state, 120, 40));
    view(state).rollout(set, SystemTime::now())
}

fn view(state: &State) -> &ClusterView {
    &state.machine_config.as_ref().expect("OpenShift").view
}

/// What reading updates until a condition held cost on this side of the channel.
#[derive(Default)]
struct Consumed {
    /// Time spent in [`show`].
    showing: Duration,
    /// When each update arrived, and what it was.
    arrivals: Vec<(Instant, &'static str)>,
}

fn kind_of(update: &ClusterUpdate) -> &'static str {
    match update {
        ClusterUpdate::Nodes(_) => "Nodes",
        ClusterUpdate::Pools(_) => "pools",
        ClusterUpdate::MachineConfigNodes(_) => "MachineConfigNodes",
        ClusterUpdate::Sets(_) => "sets",
        ClusterUpdate::RuntimeConfigs(_) => "runtime configs",
        ClusterUpdate::Connection(..) => "connection",
    }
}

/// Feeds updates through [`show`] until `done` holds for the view and the rows shown; panics after [`WAIT`].
async fn until(
    watch: &mut Watch,
    state: &mut State,
    set: &str,
    what: &str,
    done: impl Fn(&ClusterView, &Rows) -> bool,
) -> Consumed {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut consumed = Consumed::default();
    loop {
        let update = match tokio::time::timeout_at(deadline, watch.updates.recv()).await {
            Ok(Some(update)) => update,
            Ok(None) => panic!("the watchers stopped before: {what}"),
            Err(_) => panic!(
                "timed out waiting for: {what} (connection: {})",
                view(state).connection()
            ),
        };
        let arrived = Instant::now();
        consumed.arrivals.push((arrived, kind_of(&update)));
        let rows = show(state, update, set);
        consumed.showing += arrived.elapsed();
        if done(view(state), &rows) {
            return consumed;
        }
    }
}

/// Lists `api` as kube's watcher does its first list (pages of 500): the objects and the time taken.
async fn list_paged<K>(api: &Api<K>) -> (Vec<K>, Duration)
where
    K: Clone + DeserializeOwned + Debug,
{
    let started = Instant::now();
    let mut objects = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.unwrap();
        objects.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return (objects, started.elapsed()),
        }
    }
}

/// Where the time of (a) and (b) goes, each step timed on its own: the first lists of Nodes and
/// MachineConfigNodes; the MachineConfigNode list decoded alone, and served from the API server's watch
/// cache (`resourceVersion=0`) instead of etcd; and what the MachineConfigNode watcher does with its store
/// after every change (every object to JSON and back into the typed view; median of 5).
async fn breakdown(cluster: &Cluster) {
    let client = cluster.client();
    let (nodes, node_list) = list_paged(&Api::<Node>::all(client.clone())).await;
    let mcn_api = Api::all_with(client.clone(), &cluster.resources().machine_config_node);
    let (mcns, mcn_list) = list_paged::<DynamicObject>(&mcn_api).await;
    let json = serde_json::to_vec(&mcns).unwrap();
    let started = Instant::now();
    let decoded: Vec<DynamicObject> = serde_json::from_slice(&json).unwrap();
    let decoding = started.elapsed();
    assert_eq!(decoded.len(), mcns.len());
    let started = Instant::now();
    let cached = mcn_api
        .list(&ListParams::default().match_any())
        .await
        .unwrap();
    let cached_list = started.elapsed();
    assert_eq!(cached.items.len(), mcns.len());
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let typed: Vec<MachineConfigNode> = mcns
                .iter()
                .map(|o| serde_json::from_value(serde_json::to_value(o).unwrap()).unwrap())
                .collect();
            assert_eq!(typed.len(), mcns.len());
            started.elapsed()
        })
        .collect();
    println!(
        "timed apart: list {} Nodes {}; list {} MachineConfigNodes {} ({:.1} KB each as JSON, \
         decoding them {}), from the watch cache {}; convert every MachineConfigNode (the watcher's \
         first list; later changes convert only the changed object) {}",
        nodes.len(),
        ms(node_list),
        mcns.len(),
        ms(mcn_list),
        json.len() as f64 / mcns.len().max(1) as f64 / 1e3,
        ms(decoding),
        ms(cached_list),
        ms(stats(&mut times).0)
    );
}

/// The OpenShift contender: `nodes` Nodes and MachineConfigNodes, `sets` PinnedImageSets, `changes`
/// status changes; a fresh lab.
fn openshift(
    runtime: &tokio::runtime::Runtime,
    nodes: usize,
    sets: usize,
    changes: usize,
) -> Figures {
    let lab = Lab::start(
        "bench-cluster",
        LabConfig {
            nodes: Vec::new(),
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let options = ConnectOptions {
        kubeconfig: Some(lab.apiserver().unwrap().kubeconfig().to_owned()),
        context: None,
    };
    runtime.block_on(async {
        let admin = Cluster::discover(connect(&options).await.unwrap()).await;
        assert!(matches!(admin, Err(ClusterError::NotOpenShift)));
        let client = connect(&options).await.unwrap();
        install_crds(&client).await;
        let admin = discover(&client).await;
        let creating = Instant::now();
        create_objects(&admin, nodes, sets).await;
        println!(
            "created {nodes} Nodes + status, {nodes} MachineConfigNodes + status, {sets} sets, 1 pool \
             ({IN_FLIGHT} requests in flight): {:.1} s",
            creating.elapsed().as_secs_f64()
        );
        // The allocator keeps what creating the objects used; give it back so the figure is the view's.
        let rss_before = trimmed_rss();

        // (a) First complete view.
        let first_set = set_name(0);
        let started = Instant::now();
        let cluster = Cluster::discover(connect(&options).await.unwrap())
            .await
            .unwrap();
        let discovered = started.elapsed();
        let mut watch = watch(&cluster);
        let mut state = cluster_tui();
        let consumed = until(&mut watch, &mut state, &first_set, "the first complete view", |v, rows| {
            v.synced()
                && v.nodes().len() == nodes
                && v.machine_config_nodes().len() == nodes
                && v.sets.len() == sets
                && rows.len() == nodes
                && rows.iter().all(|(_, s)| *s == SetProgress::Done)
        })
        .await;
        let first_view = started.elapsed();
        let rss_after = rss_bytes();
        println!(
            "(a) first complete view: {}  (connect + discover {}, {} updates shown in {})",
            ms(first_view),
            ms(discovered),
            consumed.arrivals.len(),
            ms(consumed.showing)
        );
        let lists: Vec<String> = consumed
            .arrivals
            .iter()
            .filter(|(_, what)| *what != "connection")
            .map(|(at, what)| format!("{what} {}", ms(*at - started)))
            .collect();
        println!("    lists arrived: {}", lists.join(", "));
        println!(
            "(c) VmRSS: {} before watching, {} after the first complete view (+{}), {} after \
             malloc_trim (what is still in use)",
            mb(rss_before),
            mb(rss_after),
            mb(rss_after.saturating_sub(rss_before)),
            mb(trimmed_rss())
        );

        // (b) One status change at a time, each on another node and set.
        let mcn_api: Api<DynamicObject> =
            Api::all_with(admin.client().clone(), &admin.resources().machine_config_node);
        let (mut latencies, mut patches, mut arrivals, mut showing) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut updates = 0;
        for i in 0..changes {
            let node = node_name((i * 101 + 7) % nodes);
            let set = set_name(i % sets);
            let error = format!("change {i}: exit status 125: no space left on device");
            let status = mcn_status(sets, Some((&set, &error)));
            let started = Instant::now();
            mcn_api
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
            patches.push(started.elapsed());
            let expected = SetProgress::Failed {
                generation: 1,
                error: error.clone(),
            };
            let consumed = until(&mut watch, &mut state, &set, "the change shown", |_, rows| {
                rows.binary_search_by(|(name, _)| name.cmp(&node))
                    .is_ok_and(|at| rows[at].1 == expected)
            })
            .await;
            latencies.push(started.elapsed());
            arrivals.push(consumed.arrivals.last().unwrap().0 - started);
            showing.push(consumed.showing);
            updates += consumed.arrivals.len();
        }
        println!("(b) {changes} status changes, {updates} updates read:");
        print_line("    patch sent → shown in the rollout", &mut latencies);
        print_line("      patch request round trip       ", &mut patches);
        print_line("      patch sent → update arrived    ", &mut arrivals);
        print_line("      update + draw (show)           ", &mut showing);
        breakdown(&admin).await;
        let (change_median, _, change_max) = stats(&mut latencies);
        Figures {
            first_view,
            change_median,
            change_max,
            rss_before,
            rss_after,
            plan: None,
        }
    })
}

/// `what: median … p95 … max …` of `times`.
fn print_line(what: &str, times: &mut [Duration]) {
    let (median, p95, max) = stats(times);
    println!(
        "{what}: median {}  p95 {}  max {}",
        ms(median),
        ms(p95),
        ms(max)
    );
}

/// What one run of a contender measured.
struct Figures {
    /// (a) From connecting to the first complete view.
    first_view: Duration,
    /// (b) A change in the API server until it is on the screen: median and max.
    change_median: Duration,
    change_max: Duration,
    /// (c) VmRSS before watching and after the first complete view.
    rss_before: u64,
    rss_after: u64,
    /// The agents contender's plans.
    plan: Option<agents_plan::PlanFigures>,
}

fn main() {
    if let Ok(kubeconfig) = std::env::var(agents_plan::CHILD) {
        return agents_plan::child(&kubeconfig);
    }
    let nodes = env_number("PINBOARD_BENCH_NODES", 2000);
    let sets = env_number("PINBOARD_BENCH_SETS", 20).max(1);
    let changes = env_number("PINBOARD_BENCH_CHANGES", 20);
    let agent_nodes = env_number("PINBOARD_BENCH_AGENT_NODES", 5000);
    let agent_images = env_number("PINBOARD_BENCH_AGENT_IMAGES", 200);
    let runs = env_number("PINBOARD_BENCH_RUNS", 3usize).max(1);
    let plans = env_number("PINBOARD_BENCH_PLANS", 3usize).max(1);
    let contenders: Vec<String> = std::env::var("PINBOARD_BENCH_CONTENDERS")
        .unwrap_or_else(|_| "openshift,agents".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    pinboard::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut results: Vec<Vec<Figures>> = contenders.iter().map(|_| Vec::new()).collect();
    let mut loads = Vec::new();
    // Interleaved, so that a change in the machine's load weighs on every contender alike.
    for n in 1..=runs {
        for (contender, figures) in contenders.iter().zip(&mut results) {
            let load = load_average();
            println!("--- run {n} of {runs}: {contender} (load {load})");
            loads.push(load);
            figures.push(match contender.as_str() {
                "openshift" => openshift(&runtime, nodes, sets, changes),
                "agents" => agents::run(&runtime, agent_nodes, agent_images, changes, plans),
                other => panic!("unknown contender {other:?}: openshift or agents"),
            });
        }
    }
    println!(
        "median (min–max) of {runs} runs; load (1, 5, 15 min) before each: {}; after: {}",
        loads.join(" | "),
        load_average()
    );
    let millis = |d: Duration| d.as_secs_f64() * 1e3;
    for (contender, figures) in contenders.iter().zip(&results) {
        let of = |f: &dyn Fn(&Figures) -> f64| figures.iter().map(f).collect::<Vec<f64>>();
        println!(
            "{contender:<9} (a) first view {}  (b) change shown, median {} / max {}  (c) VmRSS after \
             the first view {} (before watching {})",
            spread(of(&|f| millis(f.first_view)), |v| format!("{v:.0} ms")),
            spread(of(&|f| millis(f.change_median)), |v| format!("{v:.1} ms")),
            spread(of(&|f| millis(f.change_max)), |v| format!("{v:.1} ms")),
            spread(of(&|f| f.rss_after as f64), |v| mb(v as u64)),
            spread(of(&|f| f.rss_before as f64), |v| mb(v as u64)),
        );
        let plans: Vec<&agents_plan::PlanFigures> =
            figures.iter().filter_map(|f| f.plan.as_ref()).collect();
        if plans.is_empty() {
            continue;
        }
        let every = |f: &dyn Fn(&agents_plan::PlanFigures) -> Vec<f64>| -> Vec<f64> {
            plans.iter().flat_map(|p| f(p)).collect()
        };
        let each = |f: &dyn Fn(&agents_plan::PlanFigures) -> f64| -> Vec<f64> {
            plans.iter().map(|p| f(p)).collect()
        };
        let millis_of = |times: &[Duration]| times.iter().map(|t| millis(*t)).collect();
        println!(
            "{contender:<9} (d) the TUI's Plan {}, its peak {} over what it used before (process VmHWM \
             {}); (e) `pinboard plan` {}, VmHWM {}; API writes during the plans {}",
            spread(every(&|p| millis_of(&p.tui)), |v| format!("{v:.0} ms")),
            spread(each(&|p| p.tui_peak_over as f64), |v| mb(v as u64)),
            spread(each(&|p| p.tui_peak as f64), |v| mb(v as u64)),
            spread(every(&|p| millis_of(&p.command)), |v| format!("{v:.0} ms")),
            spread(each(&|p| p.command_peak as f64), |v| mb(v as u64)),
            spread(each(&|p| p.writes), |v| format!("{v:.0}")),
        );
    }
}

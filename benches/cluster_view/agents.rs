//! The agents contender: the TUI's cluster view on pinboard's agents, in the lab's etcd + kube-apiserver
//! with the manifests `pinboard agent manifests` prints (CRDs, namespace, RBAC, DaemonSet): `nodes` Nodes
//! (as the OpenShift contender's), one PinSet of `images` digest references, and per node the report its
//! agent writes once the set is pinned (`images` images, every one pinned and held by the set, and the set's
//! `images` image states: the report's detail, in its PinboardNodeImages; the report itself carries the
//! counts and the set's phase) and its heartbeat Lease, each written through the agent's own calls
//! ([`PinboardApi::write_images`], [`PinboardApi::write_report`], [`PinboardApi::renew`]).
//!
//! The set's images are in the lab registry, and each node's agent has also published what its runtime holds
//! (its PinboardNodeBlobs, [`super::agents_plan`]), which the Nodes screen does not watch.
//!
//! Measures, through the TUI's own fleet ([`AgentsFleet::watch`]: `watch_all` and `node_summary::of_agents`)
//! and its `update` and Nodes screen drawn at 120×40 for every summary it sends: (a) from connecting to the
//! first complete view (a summary for every node, each reachable, its heartbeat fresh); (b) from one agent's
//! report write (new free space on its image filesystem) to the Nodes screen showing it; (c) VmRSS; then
//! the plan of the set on every node ([`super::agents_plan::measure`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use pinboard::backend::kube_watch::TypedCache;
use pinboard::backend::pinboard_api::PinboardApi;
use pinboard::fleet::{Fleet, FleetEvent, Traits};
use pinboard::model::agents_view::{AgentsUpdate, AgentsView};
use pinboard::model::lazy::{LazyPulling, LazyState};
use pinboard::model::node_report;
use pinboard::model::node_summary::of_agents;
use pinboard::model::pinboard_api::{
    DEFAULT_NAMESPACE, DEGRADED, FilesystemReport, GROUP, ImagePhase, ImageReport,
    KubeletThresholds, NODE_KIND, NODE_PLURAL, NodeReport, NodeSetPhase, PROGRESSING, PinboardNode,
    RuntimeReport, VERSION,
};
use pinboard::model::plan::{AgentLimits, Limits};
use pinboard::model::set::from_flags;
use pinboard::ui;
use pinboard::ui::msg::Msg;
use pinboard::ui::render::render_to_buffer;
use pinboard::ui::state::State;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::agents_plan::{OtherPool, PushedSet, fleet as plan_fleet, measure, published, push_set};
use super::common::{rss_bytes, trimmed_rss};
use super::support::cluster::client;
use super::support::kube_objects::apply_yaml;
use super::support::{Lab, LabConfig};
use super::{Figures, IN_FLIGHT, WAIT, create_nodes, list_paged, mb, ms, print_line};

const SET: &str = "release";
/// How long the bench's heartbeats stand: every agent stays fresh for the whole run.
const HEARTBEAT_VALID: Duration = Duration::from_secs(3600);
const GIB: u64 = 1 << 30;

/// The TUI's state on agents, on the Nodes screen.
fn agents_tui() -> State {
    let theme = ui::theme::Theme::named("monochrome").expect("a built-in theme");
    let mut state = State::new("agents: bench", theme, false, Instant::now());
    state.join_fleet(Traits::AGENTS, None, SystemTime::now());
    let key = KeyEvent::new(KeyCode::Char('1'), KeyModifiers::NONE);
    ui::update::update(&mut state, Msg::Key(key));
    state
}

/// The report a node's agent writes once `images` are pulled and pinned for the set: the node's facts,
/// every image pinned and held by the set, and the set pinned, each image's pin resting on the runtime.
fn pinned_report(images: &[String]) -> NodeReport {
    let mut set = node_report::queued(SET, 1, images);
    set.state = NodeSetPhase::Pinned;
    for state in &mut set.images {
        state.state = ImagePhase::Pinned;
        state.evidence = Some("runtime".into());
    }
    let image_bytes = 120_000_000;
    set.done_bytes = image_bytes * images.len() as u64;
    set.total_bytes = set.done_bytes;
    let condition = |kind: &str, reason: &str, message: &str| Condition {
        type_: kind.into(),
        status: "False".into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: Some(1),
    };
    set.conditions = vec![
        condition(PROGRESSING, "Pinned", "every image is pulled and pinned"),
        condition(DEGRADED, "AsExpected", "no errors"),
    ];
    NodeReport {
        agent_version: env!("CARGO_PKG_VERSION").into(),
        runtime: Some(RuntimeReport {
            name: "containerd".into(),
            version: "1.7.24".into(),
        }),
        runtime_error: None,
        image_filesystem: Some(FilesystemReport {
            mountpoint: "/var/lib/containerd".into(),
            capacity_bytes: 100 * GIB,
            available_bytes: 60 * GIB,
            used_bytes: 40 * GIB,
            available: "60.00 GiB".into(),
        }),
        images: images
            .iter()
            .enumerate()
            .map(|(k, reference)| ImageReport {
                names: vec![
                    reference.clone(),
                    format!("quay.io/openshift-release-dev/component-{k:03}:4.19.3"),
                ],
                size_bytes: image_bytes,
                pinned: true,
                held_by: vec![SET.into()],
                lazy: None,
            })
            .collect(),
        image_count: images.len(),
        pinned_count: images.len(),
        pin_method: Some("containerd-label".into()),
        lazy_pulling: Some(LazyPulling::new(LazyState::Off, None, Some(true), None)),
        lazy_pulling_error: None,
        lazy_pulling_wish: None,
        registry_config_dir: Some("/etc/containerd/certs.d".into()),
        kubelet: Some(KubeletThresholds {
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            source: "kubelet-config".into(),
        }),
        limits: Some(AgentLimits::of(&Limits::default())),
        sets: vec![set],
        cache: None,
        peers: None,
    }
}

/// Installs the agents' manifests and creates the set, the Nodes, each node's report, what its runtime
/// holds and its heartbeat, as their agents would write them; returns the Nodes and the report.
async fn create_objects(
    admin: &kube::Client,
    api: &PinboardApi,
    nodes: usize,
    pushed: &PushedSet,
) -> (Vec<Node>, NodeReport) {
    let manifests = std::process::Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(["agent", "manifests"])
        .output()
        .expect("pinboard agent manifests runs");
    assert!(manifests.status.success(), "pinboard agent manifests");
    apply_yaml(admin, &String::from_utf8_lossy(&manifests.stdout)).await;
    let references = &pushed.references;
    let images = references.len();
    let set = from_flags(SET, references);
    // The PinSet kind is served a moment after its CRD is.
    let deadline = Instant::now() + WAIT;
    while let Err(e) = api.apply_set(&set).await {
        assert!(Instant::now() < deadline, "the PinSet is refused: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let created = create_nodes(admin, nodes, images).await;
    let report = pinned_report(references);
    let detail = report.image_detail();
    let pool = OtherPool::new();
    futures::stream::iter(created.iter().enumerate().map(|(n, node)| {
        let (report, detail, pool) = (&report, &detail, &pool);
        async move {
            let name = node.metadata.name.as_deref().expect("a named Node");
            api.write_images(node, detail, true)
                .await
                .unwrap_or_else(|e| panic!("images of {name}: {e}"));
            api.write_blobs(node, &published(n, pushed, pool), true)
                .await
                .unwrap_or_else(|e| panic!("blobs of {name}: {e}"));
            api.write_report(node, report, true)
                .await
                .unwrap_or_else(|e| panic!("report of {name}: {e}"));
            api.renew(name, HEARTBEAT_VALID)
                .await
                .unwrap_or_else(|e| panic!("heartbeat of {name}: {e}"));
        }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect::<Vec<()>>()
    .await;
    (created, report)
}

/// Folds every event the fleet sends into the TUI and draws the Nodes screen after each summary, until
/// `done` holds for the nodes shown; returns the time spent folding and drawing, and the events read.
async fn until(
    events: &mut UnboundedReceiver<FleetEvent>,
    state: &mut State,
    what: &str,
    done: impl Fn(&State) -> bool,
) -> (Duration, usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let (mut showing, mut read) = (Duration::ZERO, 0);
    loop {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("the fleet stopped watching before: {what}"),
            Err(_) => panic!("timed out waiting for: {what}"),
        };
        read += 1;
        let FleetEvent::Nodes(nodes) = event else {
            continue;
        };
        let started = Instant::now();
        ui::update::update(state, Msg::NodesUpdated(nodes));
        std::hint::black_box(render_to_buffer(state, 120, 40));
        showing += started.elapsed();
        if done(state) {
            return (showing, read);
        }
    }
}

/// The PinboardNode list on its own, as the watcher's first list asks it (pages of 500): its size as JSON
/// and what decoding it into the watcher's dynamic objects and the typed reports costs.
async fn breakdown(admin: &kube::Client) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, NODE_KIND),
        NODE_PLURAL,
    );
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    let (reports, listing) = list_paged(&api).await;
    let json = serde_json::to_vec(&reports).unwrap();
    let started = Instant::now();
    let decoded: Vec<DynamicObject> = serde_json::from_slice(&json).unwrap();
    let decoding = started.elapsed();
    let mut snapshot: Vec<Arc<DynamicObject>> = decoded.into_iter().map(Arc::new).collect();
    let mut cache = TypedCache::<PinboardNode>::default();
    let started = Instant::now();
    let typed = cache.all(&snapshot);
    let converting = started.elapsed();
    // What one changed report costs between the watch and the Nodes screen's summaries.
    let mut view = AgentsView::default();
    view.apply(AgentsUpdate::Reports(typed.clone()));
    let mut changed = (*snapshot[0]).clone();
    changed.metadata.resource_version = Some("changed".into());
    snapshot[0] = Arc::new(changed);
    let started = Instant::now();
    let reports = cache.all(&snapshot);
    let watcher_side = started.elapsed();
    let started = Instant::now();
    view.apply(AgentsUpdate::Reports(reports));
    let summaries = of_agents(&view, SystemTime::now());
    let fold = started.elapsed();
    assert_eq!(summaries.len(), typed.len());
    let started = Instant::now();
    let cached = api.list(&ListParams::default().match_any()).await.unwrap();
    let cached_list = started.elapsed();
    assert_eq!(cached.items.len(), typed.len());
    println!(
        "timed apart: list {} PinboardNodes {} ({:.1} KB each as JSON, {:.0} MB in all), from the watch \
         cache {}; decoding them {}, converting them to reports {}; after one report changed: the \
         watcher's list of reports {}, the view's fold and summaries {}",
        typed.len(),
        ms(listing),
        json.len() as f64 / typed.len().max(1) as f64 / 1e3,
        json.len() as f64 / 1e6,
        ms(cached_list),
        ms(decoding),
        ms(converting),
        ms(watcher_side),
        ms(fold),
    );
}

/// One run of the agents contender, on a fresh lab.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    nodes: usize,
    images: usize,
    changes: usize,
    plans: usize,
) -> Figures {
    let lab = Lab::start(
        "bench-agents",
        LabConfig {
            nodes: Vec::new(),
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let pushed = push_set(&lab, images);
    runtime.block_on(async {
        let admin = client(&kubeconfig, None).await;
        let api = PinboardApi::new(admin.clone(), DEFAULT_NAMESPACE);
        let creating = Instant::now();
        let (created, report) = create_objects(&admin, &api, nodes, &pushed).await;
        println!(
            "created 1 PinSet of {images} images, {nodes} Nodes + status, {nodes} PinboardNodes + status, \
             {nodes} PinboardNodeImages + status (the report's detail: {images} images, the set's \
             {images} image states), {nodes} PinboardNodeBlobs + status (what each runtime holds) and \
             {nodes} Leases ({IN_FLIGHT} requests in flight): {:.1} s",
            creating.elapsed().as_secs_f64()
        );
        let rss_before = trimmed_rss();

        // (a) First complete view.
        let started = Instant::now();
        let fleet = plan_fleet(kubeconfig.clone(), lab.registry_host());
        fleet.connect().await.expect("the fleet connects");
        let connected = started.elapsed();
        let (events, mut received) = unbounded_channel();
        fleet.watch(events);
        let mut state = agents_tui();
        let (showing, read) = until(&mut received, &mut state, "the first complete view", |s| {
            s.nodes.len() == nodes
                && s.nodes
                    .iter()
                    .all(|n| n.reachable == Some(true) && n.images == Some(images))
        })
        .await;
        let first_view = started.elapsed();
        let rss_after = rss_bytes();
        println!(
            "(a) first complete view: {}  (connect + discover {}, {read} events read, the Nodes screen \
             updated and drawn in {})",
            ms(first_view),
            ms(connected),
            ms(showing)
        );
        println!(
            "(c) VmRSS: {} before watching, {} after the first complete view (+{}), {} after \
             malloc_trim (what is still in use)",
            mb(rss_before),
            mb(rss_after),
            mb(rss_after.saturating_sub(rss_before)),
            mb(trimmed_rss())
        );

        // (b) One agent's report write at a time, each on another node: new free space.
        let (mut latencies, mut writes, mut showings) = (Vec::new(), Vec::new(), Vec::new());
        let mut events_read = 0;
        for i in 0..changes {
            let node = &created[(i * 101 + 7) % nodes];
            let name = node.metadata.name.clone().expect("a named Node");
            let available = 50 * GIB + i as u64 * 1_000_000;
            let mut changed = report.clone();
            if let Some(fs) = changed.image_filesystem.as_mut() {
                fs.available_bytes = available;
            }
            let started = Instant::now();
            api.write_report(node, &changed, false).await.unwrap();
            writes.push(started.elapsed());
            let (showing, read) = until(&mut received, &mut state, "the change shown", |s| {
                s.nodes
                    .binary_search_by(|n| n.name.cmp(&name))
                    .is_ok_and(|at| s.nodes[at].available_bytes == Some(available))
            })
            .await;
            latencies.push(started.elapsed());
            showings.push(showing);
            events_read += read;
        }
        println!("(b) {changes} report writes, {events_read} events read:");
        print_line("    write sent → shown on the Nodes screen", &mut latencies);
        print_line("      write (the agent's status apply)   ", &mut writes);
        print_line("      update + draw                       ", &mut showings);
        breakdown(&admin).await;
        let plan = measure(&fleet, &admin, &kubeconfig, &pushed, &created, plans).await;
        drop(fleet);
        let (change_median, _, change_max) = super::stats(&mut latencies);
        Figures {
            first_view,
            change_median,
            change_max,
            rss_before,
            rss_after,
            plan: Some(plan),
        }
    })
}

//! The Plan on agents at scale (issue 29), in the agents contender's lab: the set's images pushed to the
//! lab registry (each one of [`BASES`] base layers, one of [`MIDDLES`] middle layers and a layer of its
//! own), and per node what its agent publishes of what its runtime holds (its `PinboardNodeBlobs`,
//! written through the agent's own call): a quarter of the set's images present (which quarter depends on
//! the node), every base, and [`OTHERS_PER_NODE`] images outside the set from a pool of [`OTHER_POOL`]
//! (each a base of [`OTHER_BASES`] and four layers of its own): 200 image records and about 1,000
//! distinct blobs a node.
//!
//! Measures the plan of the set on every node, `PINBOARD_BENCH_PLANS` times each way, with the API
//! server's requests meanwhile (writes: none; lists and reads of the published holdings and of the image
//! lists):
//! - (d) the TUI's Plan: `Fleet::survey` on the watched view, from asking to exact figures for every node,
//!   and the process's memory peak (VmHWM) during it, over what it used before;
//! - (e) `pinboard plan`'s: `AgentsFleet::plan` (connect, the first lists, the survey) in a process of its
//!   own (this bench run again with [`CHILD`] set), its time and its VmHWM; rendering the table or JSON is
//!   left out (timed apart). `PINBOARD_BENCH_PLAN_WRAPPER="heaptrack -o FILE"` (or `perf record -g -o
//!   FILE`) runs that process under a profiler.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use pinboard::backend::kube::ConnectOptions;
use pinboard::backend::pinboard_api::PinboardApi;
use pinboard::backend::registry::{Registry, RegistryOptions};
use pinboard::fleet::agents::{AgentsFleet, AgentsSettings};
use pinboard::fleet::{Fleet, SetSources};
use pinboard::model::image::Platform;
use pinboard::model::node_blobs::NodeBlobs;
use pinboard::model::pinboard_api::DEFAULT_NAMESPACE;
use pinboard::model::plan::{FetchBasis, HeldBlobs, Limits};
use pinboard::model::set::from_flags;
use pinboard::survey::Survey;
use sha2::{Digest as _, Sha256};

use super::common::{
    Counts, apiserver_requests, is_write, peak_rss_bytes, reset_peak_rss, rss_bytes, since,
};
use super::support::{ImageSpec, Lab, LayerFormat, LayerSpec, PushedImage};
use super::{mb, ms};

/// Set in the environment of this bench run again as `pinboard plan`: the kubeconfig.
pub const CHILD: &str = "PINBOARD_BENCH_PLAN_CHILD";
/// A profiler's command line to run that process under (`perf record -g -o FILE`, `heaptrack -o FILE`).
const WRAPPER: &str = "PINBOARD_BENCH_PLAN_WRAPPER";
/// The lab registry's host, for that run.
const CHILD_REGISTRY: &str = "PINBOARD_BENCH_PLAN_REGISTRY";
const SET: &str = "release";
const BASES: usize = 20;
const MIDDLES: usize = 40;
const OTHER_POOL: usize = 1000;
const OTHER_BASES: usize = 50;
const OTHERS_PER_NODE: usize = 150;

/// The set's images as pushed, by digest reference.
pub struct PushedSet {
    pub references: Vec<String>,
    images: Vec<PushedImage>,
    registry_host: String,
}

/// Pushes the set's `count` images.
pub fn push_set(lab: &Lab, count: usize) -> PushedSet {
    let layer = |seed: u64, bytes: usize| LayerSpec {
        seed,
        bytes,
        format: LayerFormat::Gzip,
    };
    let pushing = Instant::now();
    let images: Vec<PushedImage> = (0..count)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![
                    layer(29_000 + (i % BASES) as u64, 256 << 10),
                    layer(29_100 + (i % MIDDLES) as u64, 64 << 10),
                    layer(29_200 + i as u64, 8 << 10),
                ],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("bench/app-{i:03}"), &spec)
                .expect("push")
        })
        .collect();
    let registry_host = lab.registry_host();
    println!(
        "pushed {count} images ({BASES} bases, {MIDDLES} middle layers) in {:.1} s",
        pushing.elapsed().as_secs_f64()
    );
    PushedSet {
        references: images.iter().map(|i| i.reference(&registry_host)).collect(),
        images,
        registry_host,
    }
}

/// Digest `i` of image `k` of the pool outside the set (0: its config).
fn other_digest(k: usize, i: usize) -> String {
    format!("sha256:{:x}", Sha256::digest(format!("other {k} blob {i}")))
}

/// The pool's images outside the set: (repo digest, blobs).
pub struct OtherPool(Vec<(String, Vec<String>)>);

impl OtherPool {
    pub fn new() -> OtherPool {
        OtherPool(
            (0..OTHER_POOL)
                .map(|k| {
                    let base = format!(
                        "sha256:{:x}",
                        Sha256::digest(format!("other base {}", k % OTHER_BASES))
                    );
                    let blobs = std::iter::once(base)
                        .chain((0..5).map(|i| other_digest(k, i)))
                        .collect();
                    let name = format!(
                        "registry.example.com/team/other-{k}@{}",
                        other_digest(k, 99)
                    );
                    (name, blobs)
                })
                .collect(),
        )
    }
}

/// Whether node `n` holds image `i` of the set.
fn present(n: usize, i: usize) -> bool {
    (i + n).is_multiple_of(4)
}

/// What node `n`'s agent publishes.
pub fn published(n: usize, set: &PushedSet, pool: &OtherPool) -> NodeBlobs {
    let mut held: HashSet<String> = HashSet::new();
    let mut names: Vec<Vec<String>> = Vec::new();
    for (i, image) in set.images.iter().enumerate() {
        if i < BASES {
            // Every base, brought by images outside the set.
            held.insert(image.layers[0].digest.clone());
        }
        if present(n, i) {
            held.insert(image.config_digest.clone());
            held.extend(image.layers.iter().map(|l| l.digest.clone()));
            names.push(vec![image.reference(&set.registry_host)]);
        }
    }
    for k in 0..OTHERS_PER_NODE {
        let (name, blobs) = &pool.0[(n * 7 + k) % OTHER_POOL];
        held.extend(blobs.iter().cloned());
        names.push(vec![name.clone()]);
    }
    NodeBlobs::published(
        &HeldBlobs::Digests(held),
        names.iter().map(|n| (n.as_slice(), None)),
    )
}

/// The fleet `pinboard plan` and the TUI use on the lab's cluster.
pub fn fleet(kubeconfig: PathBuf, registry_host: String) -> AgentsFleet {
    AgentsFleet::new(AgentsSettings {
        connect: ConnectOptions {
            kubeconfig: Some(kubeconfig),
            context: None,
        },
        namespace: DEFAULT_NAMESPACE.into(),
        registry: RegistryOptions {
            insecure_registries: vec![registry_host],
            ..RegistryOptions::default()
        },
        platform: Platform::host(),
        limits: Limits::default(),
        cache_dir: None,
    })
}

/// Checks that `survey` has exact figures for every one of `nodes` nodes, a quarter of the set present on
/// each; returns the bytes all of them fetch.
fn exact(survey: &Survey, nodes: usize) -> u64 {
    assert_eq!(survey.nodes.len(), nodes, "a plan for every node");
    for plan in &survey.nodes {
        assert_eq!(plan.fetch_basis, FetchBasis::Exact, "{}", plan.node);
        assert!(plan.runtime.is_some(), "{}: {:?}", plan.node, plan.reasons);
        let present = plan.images.iter().filter(|i| i.present == Some(true));
        assert_eq!(present.count(), plan.images.len() / 4, "{}", plan.node);
    }
    survey.nodes.iter().map(|n| n.fetch_bytes).sum()
}

/// The set, named on the cluster, as `pinboard plan --set release` names it.
fn named_set() -> SetSources {
    SetSources {
        sets: vec![PathBuf::from(SET)],
        ..SetSources::default()
    }
}

/// This bench run again as `pinboard plan`: plans the set, prints its time and VmHWM, and exits.
pub fn child(kubeconfig: &str) {
    pinboard::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let registry = std::env::var(CHILD_REGISTRY).expect("the registry's host");
    let nodes: usize = std::env::var("PINBOARD_BENCH_AGENT_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .expect("the number of nodes");
    let started = Instant::now();
    let survey = runtime.block_on(async {
        let fleet = fleet(PathBuf::from(kubeconfig), registry);
        fleet.plan(&named_set()).await.expect("the plan")
    });
    let took = started.elapsed();
    // The plan's own peak, before `-o json` renders it (the table is smaller; JSON is the largest output).
    let planned_peak = peak_rss_bytes();
    let fetched = exact(&survey, nodes);
    // `plan -o json` as it writes now, streamed (to a sink that counts), then as it did before: built in
    // memory first. VmHWM only rises, so the streamed peak is taken first.
    let rendering = Instant::now();
    let mut counted = Counted(0);
    serde_json::to_writer_pretty(&mut counted, &survey).unwrap();
    let (streaming, streamed_peak) = (rendering.elapsed(), peak_rss_bytes());
    let json = serde_json::to_string_pretty(&survey).unwrap().len();
    assert_eq!(json, counted.0, "the same JSON both ways");
    println!(
        "child: {} {planned_peak} {fetched} {json} {} {streamed_peak} {}",
        took.as_micros(),
        streaming.as_micros(),
        peak_rss_bytes()
    );
}

/// A writer that only counts what it is given.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// This bench run again, under the profiler [`WRAPPER`] names if set.
fn child_command() -> std::process::Command {
    let bench = std::env::current_exe().unwrap();
    let wrapper = std::env::var(WRAPPER).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut command = std::process::Command::new(program);
            command.args(words).arg(bench);
            command
        }
        None => std::process::Command::new(bench),
    }
}

/// What planning the set cost, each way.
pub struct PlanFigures {
    pub tui: Vec<Duration>,
    /// The TUI's memory peak during its plans over what it used before, and the process's peak.
    pub tui_peak_over: u64,
    pub tui_peak: u64,
    pub command: Vec<Duration>,
    pub command_peak: u64,
    /// API writes during all the plans, and requests for the published holdings and the image lists.
    pub writes: f64,
}

/// (d) and (e), `plans` times each.
pub async fn measure(
    tui: &AgentsFleet,
    admin: &kube::Client,
    kubeconfig: &std::path::Path,
    set: &PushedSet,
    nodes: &[Node],
    plans: usize,
) -> PlanFigures {
    let names: Vec<String> = nodes
        .iter()
        .map(|n| n.metadata.name.clone().expect("a named Node"))
        .collect();
    let image_set = from_flags(SET, &set.references);
    let before = apiserver_requests(admin).await;
    let (mut times, mut fetched) = (Vec::new(), 0);
    let rss_before = rss_bytes();
    reset_peak_rss();
    for _ in 0..plans {
        let started = Instant::now();
        let survey = tui
            .survey(vec![image_set.clone()], names.clone())
            .await
            .expect("the TUI's plan");
        times.push(started.elapsed());
        fetched = exact(&survey, nodes.len());
    }
    let tui_peak = peak_rss_bytes();
    let tui_requests = since(&before, &apiserver_requests(admin).await);
    println!(
        "(d) the TUI's Plan (Fleet::survey), {plans} times: {}; {} over the {} used before \
         (VmHWM {}); every node exact, {} to fetch in all; API requests: {}",
        times.iter().map(|t| ms(*t)).collect::<Vec<_>>().join(", "),
        mb(tui_peak.saturating_sub(rss_before)),
        mb(rss_before),
        mb(tui_peak),
        mb(fetched),
        show(&tui_requests),
    );

    let before = apiserver_requests(admin).await;
    let (mut command, mut command_peak) = (Vec::new(), 0);
    for _ in 0..plans {
        let out = child_command()
            .env(CHILD, kubeconfig)
            .env(CHILD_REGISTRY, &set.registry_host)
            .env("PINBOARD_BENCH_AGENT_NODES", nodes.len().to_string())
            .output()
            .expect("the bench runs again");
        let said = String::from_utf8_lossy(&out.stdout);
        let line = said
            .lines()
            .find_map(|l| l.strip_prefix("child: "))
            .unwrap_or_else(|| panic!("no plan: {said}\n{}", String::from_utf8_lossy(&out.stderr)));
        let figures: Vec<u64> = line.split(' ').map(|f| f.parse().unwrap()).collect();
        let [
            micros,
            peak,
            fetched,
            json,
            streaming,
            streamed_peak,
            built_peak,
        ] = figures[..]
        else {
            panic!("{line}");
        };
        command.push(Duration::from_micros(micros));
        command_peak = command_peak.max(peak);
        println!(
            "(e) `pinboard plan` (AgentsFleet::plan, a process of its own): {}, VmHWM {}; every node \
             exact, {} to fetch in all; `-o json` (left out): {} bytes streamed in {}, VmHWM {} then; \
             built in memory first (as plan did before it streamed), VmHWM {}",
            ms(Duration::from_micros(micros)),
            mb(peak),
            mb(fetched),
            json,
            ms(Duration::from_micros(streaming)),
            mb(streamed_peak),
            mb(built_peak),
        );
    }
    let command_requests = since(&before, &apiserver_requests(admin).await);
    println!(
        "(e) API requests, {plans} plans: {}",
        show(&command_requests)
    );
    let writes = [&tui_requests, &command_requests]
        .iter()
        .flat_map(|c| c.iter())
        .filter(|(k, _)| is_write(k))
        .fold(0.0, |sum, (_, v)| sum + v);
    breakdown(admin, set).await;
    PlanFigures {
        tui: times,
        tui_peak_over: tui_peak.saturating_sub(rss_before),
        tui_peak,
        command,
        command_peak,
        writes,
    }
}

/// Where a plan's time goes, each step timed on its own: listing every node's published holdings from the
/// watch cache, and resolving the set's manifests.
async fn breakdown(admin: &kube::Client, set: &PushedSet) {
    let api = PinboardApi::new(admin.clone(), DEFAULT_NAMESPACE);
    let started = Instant::now();
    let published = api.published_blobs().await.expect("the published holdings");
    let listing = started.elapsed();
    let bytes: usize = published
        .values()
        .map(|b| serde_json::to_vec(b).unwrap().len())
        .sum();
    let registry = Registry::new(RegistryOptions {
        insecure_registries: vec![set.registry_host.clone()],
        ..RegistryOptions::default()
    })
    .unwrap();
    let started = Instant::now();
    let resolved = registry
        .inspect_all(&set.references, &[Platform::host()])
        .await;
    let resolving = started.elapsed();
    assert!(resolved.iter().all(Result::is_ok));
    println!(
        "timed apart: list {} PinboardNodeBlobs from the watch cache {} ({:.1} KB each as JSON, their \
         status), resolve the set's {} manifests {}",
        published.len(),
        ms(listing),
        bytes as f64 / published.len().max(1) as f64 / 1e3,
        set.references.len(),
        ms(resolving),
    );
}

/// Every request counted, `VERB resource N`.
fn show(counts: &Counts) -> String {
    let shown: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
    match shown.is_empty() {
        true => "none".into(),
        false => shown.join(", "),
    }
}

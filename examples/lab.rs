//! The lab demo: three real containerd nodes with image filesystems of different sizes, a real registry
//! (behind the lab proxy and the lab's token service) holding a dozen sample images, a few of them
//! pre-loaded on some nodes, and then pinboard run against it all. The `shop/*` images are private: pulling
//! them takes the demo user's password, which `<lab>/auth.json` holds (and, with `--cluster`, the cluster's
//! pull secret). Once the samples are in place the proxy, the nodes' link to the registry, is capped at
//! [`LINK_MIBPS`], so a rollout takes long enough to watch, and fan-out (`f` on the Plan screen) visibly
//! moves fewer bytes over it.
//!
//! ```text
//! cargo run --example lab -- [--hold] [-- [SUBCOMMAND] PINBOARD_ARGS...]
//! ```
//! Without `--hold`, runs `$PINBOARD_BIN` (default `target/debug/pinboard`) — the TUI, or SUBCOMMAND
//! (e.g. `plan`) — with `--images-file <lab>/images.txt --authfile <lab>/auth.json --insecure-registry
//! <proxy> --min-free 32Mi --nodes <lab>/nodes.yaml --cache-dir <lab>/cache` and then PINBOARD_ARGS, stops
//! the lab and exits with pinboard's exit code.
//! The nodes file keeps every write inside the lab dir: n1 pins through a CRI-O drop-in there, n2 and n3
//! with containerd labels, and each node's lazy-pull drop-in lives there too. With `--hold`, prints the
//! endpoints and waits for Ctrl-C instead. Needs root and the packages of scripts/setup.
//!
//! With `--cluster`, the same nodes also stand in an OpenShift cluster: the lab's etcd + kube-apiserver with
//! the machine-config CRDs, a worker pool, a Node and a MachineConfigNode per node, a stand-in kubelet per
//! node (its real image filesystem, through the node proxy) and a stand-in machine-config daemon that
//! pre-loads every set labelled for the worker pool through the node's containerd and reports as the daemon
//! does. pinboard then runs in cluster mode (`--kubeconfig`) with `<lab>/release.yaml`, a PinnedImageSet of
//! the samples for the worker pool, which n1 has no room for (unless PINBOARD_ARGS name a `--set`). For
//! `check`, `status` and `unpin`, which read a set from the cluster, the demo first applies that set as an
//! administrator would and lets the stand-in daemons finish with it. The demo user's credentials are the
//! cluster's pull secret (`openshift-config/pull-secret`), which both pinboard and the stand-in daemon read.

#[path = "lab/daemon.rs"]
mod daemon;
#[allow(
    dead_code,
    unused_imports,
    reason = "the example runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::{Value, json};
use support::kubelet::{FakeKubelet, ImageFs, KubeletConfig};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Platform, RegistrySetup,
    TokenConfig, TokenUser, cluster,
};
use tokio::signal::unix::{SignalKind, signal};

const MIB: usize = 1 << 20;
/// The lab's one registry user, who may pull everything; a lab password, not a secret.
const DEMO_USER: &str = "demo";
const DEMO_PASSWORD: &str = "pinboard-demo";
/// Sample repositories under this prefix are private: pulling them takes the demo user's credentials.
const PRIVATE: &str = "shop/";
/// The registry link's bandwidth in the demo, MiB/s.
const LINK_MIBPS: u64 = 8;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let (mut hold, mut cluster) = (false, false);
    let mut args = std::env::args().skip(1);
    let mut pinboard_args = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--hold" => hold = true,
            "--cluster" => cluster = true,
            "--" => pinboard_args.extend(args.by_ref()),
            _ => bail!(
                "usage: cargo run --example lab -- [--hold] [--cluster] [-- PINBOARD_ARGS...]"
            ),
        }
    }

    // Ctrl-C must not kill this process before the lab is stopped and its tmpfs unmounted. The handler
    // only records the signal; children get default handling back when they exec.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut interrupt = runtime.block_on(async { signal(SignalKind::interrupt()) })?;

    let public = samples()
        .iter()
        .filter(|s| !s.repo.starts_with(PRIVATE))
        .map(|s| s.repo.to_owned())
        .collect();
    let lab = Lab::start(
        "demo",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", 160 << 20),
                NodeSpec::new("n2", 400 << 20),
                NodeSpec::new("n3", 1 << 30),
            ],
            apiserver: cluster,
            registry: RegistrySetup {
                tokens: Some(TokenConfig {
                    users: vec![TokenUser::new(DEMO_USER, DEMO_PASSWORD, &["*"])],
                    public,
                }),
                ..RegistrySetup::default()
            },
        },
    )?;
    let images_file = push_samples(&lab)?;
    let auth = auth_config(&lab);
    let auth_file = lab.dir().join("auth.json");
    std::fs::write(&auth_file, auth.to_string())?;
    lab.proxy().set_bandwidth(Some(LINK_MIBPS << 20));
    let stand_ins = match cluster {
        true => Some(runtime.block_on(play_cluster(&lab, &images_file, &auth))?),
        false => None,
    };

    if hold {
        println!("lab dir:     {}", lab.dir().display());
        println!("registry:    {}", lab.registry_host());
        println!(
            "proxy:       {} (the registry link, capped at {LINK_MIBPS} MiB/s)",
            lab.proxy_host()
        );
        println!("images file: {}", images_file.display());
        println!(
            "auth file:   {} (the shop/* images are private)",
            auth_file.display()
        );
        for node in lab.nodes() {
            println!("node {}:     {}", node.name, node.endpoint());
        }
        if let Some(stand_ins) = &stand_ins {
            println!(
                "kubeconfig:  {}",
                lab.apiserver().expect("cluster lab").kubeconfig().display()
            );
            println!("set:         {}", stand_ins.set_file.display());
        }
        println!("Ctrl-C stops the lab.");
        runtime.block_on(interrupt.recv());
        return Ok(ExitCode::SUCCESS);
    }

    let binary = std::env::var_os("PINBOARD_BIN").map_or_else(
        || support::lab::target_dir().join("debug/pinboard"),
        PathBuf::from,
    );
    let nodes_file = write_nodes_file(&lab)?;
    let mut command = Command::new(&binary);
    // A leading word that is not a flag is pinboard's subcommand; none opens the TUI.
    let (subcommand, rest) = match pinboard_args.split_first() {
        Some((first, rest)) if !first.starts_with('-') => (Some(first), rest),
        _ => (None, pinboard_args.as_slice()),
    };
    command
        .args(subcommand)
        .args([
            "--insecure-registry",
            &lab.proxy_host(),
            "--min-free",
            "32Mi",
        ])
        .arg("--cache-dir")
        .arg(lab.dir().join("cache"));
    let names_a_set = rest.iter().any(|a| a == "--set");
    match &stand_ins {
        Some(stand_ins) => {
            if subcommand.is_some_and(|s| ["check", "status", "unpin"].contains(&s.as_str())) {
                runtime.block_on(stand_ins.apply_and_settle())?;
            }
            command
                .arg("--kubeconfig")
                .arg(lab.apiserver().expect("cluster lab").kubeconfig());
            if !names_a_set {
                command.arg("--set").arg(&stand_ins.set_file);
            }
            &mut command
        }
        None => command
            .arg("--images-file")
            .arg(&images_file)
            .arg("--authfile")
            .arg(&auth_file)
            .arg("--nodes")
            .arg(&nodes_file),
    };
    let status = command
        .args(rest)
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    drop(stand_ins);
    drop(lab);
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .map_or(ExitCode::FAILURE, ExitCode::from))
}

/// One sample image: where it goes, what it is made of, and which nodes have it already.
struct Sample {
    repo: &'static str,
    image: SampleImage,
    preloaded_on: &'static [&'static str],
}

enum SampleImage {
    Single(Vec<LayerSpec>),
    /// One image per platform, under an OCI index.
    MultiPlatform(Vec<(Platform, Vec<LayerSpec>)>),
}

fn gzip(seed: u64, mib: usize) -> LayerSpec {
    LayerSpec {
        seed,
        bytes: mib * MIB,
        format: LayerFormat::Gzip,
    }
}

/// A dozen images of 1-20 MiB: most share one or two base layers, one is eStargz, one zstd:chunked, and
/// one is a multi-platform index.
fn samples() -> Vec<Sample> {
    let os = gzip(1, 3);
    let runtime = gzip(2, 5);
    let single = |repo, layers, preloaded_on| Sample {
        repo,
        image: SampleImage::Single(layers),
        preloaded_on,
    };
    vec![
        single(
            "shop/frontend",
            vec![os.clone(), gzip(10, 2)],
            &["n1", "n2"],
        ),
        single(
            "shop/backend",
            vec![os.clone(), runtime.clone(), gzip(11, 4)],
            &["n2"],
        ),
        single(
            "shop/worker",
            vec![os.clone(), runtime.clone(), gzip(12, 8)],
            &["n2"],
        ),
        single("ops/metrics-agent", vec![os.clone(), gzip(13, 1)], &[]),
        single("ops/log-shipper", vec![gzip(14, 1)], &["n1", "n3"]),
        single(
            "ml/model-server",
            vec![os.clone(), runtime.clone(), gzip(15, 12)],
            &[],
        ),
        single("shop/db-migrate", vec![os.clone(), gzip(16, 6)], &[]),
        single("infra/cache", vec![gzip(17, 9)], &[]),
        single(
            "batch/report",
            vec![os.clone(), runtime, gzip(18, 10), gzip(19, 2)],
            &[],
        ),
        single(
            "lazy/estargz-app",
            vec![
                os,
                LayerSpec {
                    seed: 20,
                    bytes: 6 * MIB,
                    format: LayerFormat::Estargz,
                },
            ],
            &["n3"],
        ),
        single(
            "lazy/zstd-chunked-app",
            vec![
                LayerSpec {
                    seed: 21,
                    bytes: 3 * MIB,
                    format: LayerFormat::ZstdChunked,
                },
                LayerSpec {
                    seed: 22,
                    bytes: 4 * MIB,
                    format: LayerFormat::ZstdChunked,
                },
            ],
            &[],
        ),
        Sample {
            repo: "tools/multiarch",
            image: SampleImage::MultiPlatform(vec![
                (Platform::linux_amd64(), vec![gzip(30, 3)]),
                (
                    Platform::new("linux", "arm64", Some("v8")),
                    vec![gzip(31, 3)],
                ),
                (Platform::new("linux", "arm", Some("v7")), vec![gzip(32, 2)]),
            ]),
            preloaded_on: &["n3"],
        },
    ]
}

/// The demo user's credentials for the registry (through the proxy), as `podman login` writes them.
fn auth_config(lab: &Lab) -> Value {
    let login =
        base64::engine::general_purpose::STANDARD.encode(format!("{DEMO_USER}:{DEMO_PASSWORD}"));
    json!({"auths": {(lab.proxy_host()): {"auth": login}}})
}

/// Pushes the samples, pre-loads them where the sample says (private ones with the demo login), and writes
/// their references (through the proxy) to `<lab>/images.txt`, which it returns.
fn push_samples(lab: &Lab) -> Result<PathBuf> {
    let proxy = lab.proxy_host();
    let login = format!("{DEMO_USER}:{DEMO_PASSWORD}");
    let mut text = format!(
        "# pinboard lab sample images, pushed to the registry at {} and referenced through the lab proxy;\n\
         # the {PRIVATE}* ones are private (auth.json holds the login)\n",
        lab.registry_host()
    );
    for sample in samples() {
        let title = sample.repo.rsplit('/').next().unwrap_or(sample.repo);
        let annotations = BTreeMap::from([(
            "org.opencontainers.image.title".to_owned(),
            title.to_owned(),
        )]);
        let spec = |layers: Vec<LayerSpec>| ImageSpec {
            layers,
            annotations: annotations.clone(),
        };
        let (reference, bytes) = match sample.image {
            SampleImage::Single(layers) => {
                let pushed = lab.push_image(sample.repo, &spec(layers))?;
                let bytes: u64 = pushed.layers.iter().map(|l| l.size).sum();
                (pushed.reference(&proxy), bytes)
            }
            SampleImage::MultiPlatform(platforms) => {
                let images: Vec<_> = platforms
                    .into_iter()
                    .map(|(p, layers)| (p, spec(layers)))
                    .collect();
                let pushed = lab.push_index(sample.repo, &images)?;
                let bytes = pushed.manifests[0].1.layers.iter().map(|l| l.size).sum();
                (pushed.reference(&proxy), bytes)
            }
        };
        let private = sample.repo.starts_with(PRIVATE);
        for node in sample.preloaded_on {
            lab.node(node)
                .pull_as(&reference, private.then_some(login.as_str()))?;
        }
        let preloaded = match sample.preloaded_on {
            [] => String::new(),
            nodes => format!(", pre-loaded on {}", nodes.join(", ")),
        };
        let preloaded = if private {
            format!("{preloaded}, private")
        } else {
            preloaded
        };
        let mib = bytes as f64 / MIB as f64;
        writeln!(
            text,
            "# {}: {mib:.1} MiB compressed{preloaded}\n{reference}",
            sample.repo
        )?;
    }
    let path = lab.dir().join("images.txt");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// `<lab>/nodes.yaml`: n1 pins through a CRI-O drop-in in the lab dir (reload: none, containerd ignores
/// it), the others with containerd labels; every node's lazy-pull drop-in is in the lab dir.
fn write_nodes_file(lab: &Lab) -> Result<PathBuf> {
    let mut text =
        String::from("# written by examples/lab.rs: every write stays inside the lab dir\n");
    for (i, node) in lab.nodes().iter().enumerate() {
        let dir = lab.dir().join("nodes").join(&node.name);
        let _ = writeln!(
            text,
            "- name: {}\n  endpoint: {}",
            node.name,
            node.endpoint()
        );
        if i == 0 {
            let _ = writeln!(
                text,
                "  pin: crio-drop-in\n  crioConfigDir: {}/crio.conf.d\n  crioReload: none",
                dir.display()
            );
            std::fs::create_dir_all(dir.join("crio.conf.d"))?;
        } else {
            let _ = writeln!(text, "  pin: containerd-label");
        }
        let _ = writeln!(
            text,
            "  lazyDropIn: {}/storage.conf.d/lazy-image-pull.conf",
            dir.display()
        );
    }
    let path = lab.dir().join("nodes.yaml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The cluster's stand-ins; dropping them stops them.
struct StandIns {
    set_file: PathBuf,
    writer: cluster::Writer,
    _daemon: daemon::Daemon,
    _kubelets: Vec<FakeKubelet>,
}

/// How long the stand-in daemons get to pre-load the demo's set.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(180);

impl StandIns {
    /// Writes the demo's set to the cluster, then waits until every node's daemon has finished with it
    /// (done or failed), so that a headless command run next shows an outcome rather than a start.
    async fn apply_and_settle(&self) -> Result<()> {
        let text = std::fs::read_to_string(&self.set_file)?;
        let sets = pinboard::model::set::parse_yaml(&text, "release.yaml")
            .map_err(|problems| anyhow::anyhow!("{problems:?}"))?;
        let cluster = &self.writer.cluster;
        let mut generation = 0;
        for set in &sets {
            generation = cluster.apply_set(set).await?.generation();
        }
        eprintln!(
            "demo: applied PinnedImageSet release (generation {generation}); the stand-in daemons pull it"
        );
        let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(
            cluster.client().clone(),
            &cluster.resources().machine_config_node,
        );
        let deadline = std::time::Instant::now() + SETTLE;
        loop {
            let mcns: Vec<pinboard::model::machine_config::MachineConfigNode> = api
                .list(&Default::default())
                .await?
                .items
                .iter()
                .filter_map(|o| serde_json::from_value(serde_json::to_value(o).ok()?).ok())
                .collect();
            let settled = |m: &pinboard::model::machine_config::MachineConfigNode| {
                m.set_status("release").is_some_and(|e| {
                    e.current_generation == Some(generation)
                        || e.last_failed_generation == Some(generation)
                })
            };
            if !mcns.is_empty() && mcns.iter().all(settled) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("the stand-in daemons did not finish the demo's set within {SETTLE:?}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
}

/// Plays an OpenShift cluster on the lab's API server and nodes (see the top of this file), with `auth` as
/// its global pull secret, and writes `<lab>/release.yaml`: every single-platform sample, for the worker
/// pool.
async fn play_cluster(lab: &Lab, images_file: &Path, auth: &Value) -> Result<StandIns> {
    let kubeconfig = lab
        .apiserver()
        .context("the lab runs no API server")?
        .kubeconfig();
    let names: Vec<&str> = lab.nodes().iter().map(|n| n.name.as_str()).collect();
    let (admin, writer) = cluster::openshift(lab, &["worker"], &names).await;
    cluster::pull_secret(&admin, auth).await;
    let mut kubelets = Vec::new();
    for node in lab.nodes() {
        let root = node.root.clone();
        let image_fs = move || {
            let stat = nix::sys::statvfs::statvfs(&root).expect("the node's tmpfs");
            let block = stat.fragment_size();
            ImageFs {
                capacity: stat.blocks() * block,
                available: stat.blocks_available() * block,
                used: (stat.blocks() - stat.blocks_free()) * block,
            }
        };
        let dir = lab.dir().join("kubelets").join(&node.name);
        let kubelet =
            FakeKubelet::configured(&dir, &node.name, image_fs, KubeletConfig::default())?;
        writer.kubelet(&node.name, kubelet.port()).await;
        kubelets.push(kubelet);
    }
    let nodes = lab
        .nodes()
        .iter()
        .map(|n| (n.name.clone(), n.endpoint()))
        .collect();
    let daemon = daemon::start(kubeconfig.to_owned(), nodes);

    let references: Vec<String> = std::fs::read_to_string(images_file)?
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("multiarch"))
        .map(|l| format!("    - name: {l}\n"))
        .collect();
    let set_file = lab.dir().join("release.yaml");
    std::fs::write(
        &set_file,
        format!(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: release\n  \
             labels:\n    machineconfiguration.openshift.io/role: worker\nspec:\n  pinnedImages:\n{}",
            references.concat()
        ),
    )?;
    Ok(StandIns {
        set_file,
        writer,
        _daemon: daemon,
        _kubelets: kubelets,
    })
}

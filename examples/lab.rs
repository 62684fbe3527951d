//! The lab demo: three nodes with image filesystems of different sizes (n1 a CRI-O node, n2 and n3 real
//! containerd nodes; with `--cluster`, all three CRI-O), a real registry (behind the lab proxy and the lab's
//! token service) holding a dozen sample images, a few of them pre-loaded on some nodes, and then pinboard
//! run against it all. The `shop/*` images are private: pulling them takes the demo user's password, which
//! `<lab>/auth.json` holds (and, with `--cluster`, the cluster's pull secret). Once the samples are in place
//! the proxy, the nodes' link to the registry, is capped at [`LINK_MIBPS`], so a rollout takes long enough
//! to watch, and fan-out (`f` on the Plan screen) visibly moves fewer bytes over it.
//!
//! ```text
//! cargo run --example lab -- [--hold] [--cluster | --agents] [-- [SUBCOMMAND] PINBOARD_ARGS...]
//! ```
//! Without `--hold`, runs `$PINBOARD_BIN` (default `target/debug/pinboard`) — the TUI, or SUBCOMMAND
//! (e.g. `plan`) — with [`pinboard_args`] (`--nodes <lab>/nodes.yaml --images-file <lab>/images.txt
//! --authfile <lab>/auth.json --insecure-registry <proxy> --min-free 32Mi --cache-dir <lab>/cache`) and then
//! PINBOARD_ARGS, stops the lab and exits with pinboard's exit code. With `--hold`, prints the endpoints
//! and that argument line and waits for Ctrl-C instead. Needs root and the packages of scripts/setup.
//!
//! n1 runs the real CRI-O 1.33 that scripts/setup builds (a lab node: `support::crio_node`), n2 and n3
//! containerd 2.1, each on a tmpfs of the node's size. Where the real CRI-O is not built (its source tarball
//! missing), and in the cluster demo, whose stand-in daemon drives it, a CRI-O node is the tests' stand-in
//! (`support::crio`, CRI-O [`CRIO_VERSION`]), a real CRI server that pulls for real: this binary run again,
//! `main` serving it when the stand-in's variable is set. Each node pins the way its runtime enforces: n1
//! through the CRI-O drop-in in its `crio.conf.d`, reloaded through its pidfile; n2 and n3 with containerd
//! labels. The nodes file keeps every write in `target/lab`: the containerd nodes' configs import their own
//! `conf.d` in the lab dir, where `L` writes their lazy-pull file; n1's drop-ins (pins, lazy pulling,
//! fan-out's registries.conf.d) are in its directory.
//!
//! With `--cluster`, the nodes stand in an OpenShift cluster's workers: the lab's etcd + kube-apiserver with
//! the machine-config CRDs, a worker pool, a Node (ephemeral storage: the node's image filesystem) and a
//! MachineConfigNode per node, a stand-in kubelet per node (the image filesystem its CRI-O names, through
//! the node proxy) and a stand-in machine-config daemon (examples/lab/daemon.rs) that pre-loads every set
//! labelled for the worker pool through the node's CRI-O, pins it with the daemon's drop-in and reports as
//! the daemon does. pinboard then runs in cluster mode (`--kubeconfig`) with `<lab>/release.yaml`, a
//! PinnedImageSet of the samples for the worker pool, which n1 has no room for (unless PINBOARD_ARGS name a
//! `--set`). For `check`, `status` and `unpin`, which read a set from the cluster, the demo first applies
//! that set as an administrator would and lets the stand-in daemons finish with it. The demo user's
//! credentials are the cluster's pull secret (`openshift-config/pull-secret`), which both pinboard and the
//! stand-in daemon read.
//!
//! With `--agents`, a plain Kubernetes cluster with pinboard's agents instead (examples/lab/agents.rs).

#[path = "lab/agents.rs"]
mod agents;
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
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, Patch, PatchParams};
use pinboard::backend::cri::{CriClient, CriEndpoint};
use pinboard::backend::proto::cri::AuthConfig;
use serde_json::{Value, json};
use support::crio::CrioStandIn;
use support::kubelet::{FakeKubelet, ImageFs, KubeletConfig};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Platform, RegistrySetup,
    TokenConfig, TokenUser, cluster,
};
use tokio::runtime::Runtime;
use tokio::signal::unix::{SignalKind, signal};

const MIB: usize = 1 << 20;
/// The lab's one registry user, who may pull everything; a lab password, not a secret.
const DEMO_USER: &str = "demo";
const DEMO_PASSWORD: &str = "pinboard-demo";
/// Sample repositories under this prefix are private: pulling them takes the demo user's credentials.
const PRIVATE: &str = "shop/";
/// The registry link's bandwidth in the demo, MiB/s.
const LINK_MIBPS: u64 = 8;
/// The demo's nodes and the sizes of their image filesystems: n1 too small for the samples.
const NODES: [(&str, u64); 3] = [("n1", 160 << 20), ("n2", 400 << 20), ("n3", 1 << 30)];
/// The CRI-O the stand-ins play: its reload applies `pinned_images`, ListImages and ImageStatus report pins.
const CRIO_VERSION: &str = "1.31.0";
/// What the demo keeps free on every node (pinboard's `--min-free`, the stand-in daemon's floor): the
/// nodes are small, where real ones keep 16 GiB.
const MIN_FREE: &str = "32Mi";
/// [`MIN_FREE`] in bytes.
const MIN_FREE_BYTES: u64 = 32 << 20;
const CRI_TIMEOUT: Duration = Duration::from_secs(10);
const PULL_TIMEOUT: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    // A CRI-O stand-in is this binary run again (support::crio): it only serves.
    if std::env::var_os(support::crio::ENV).is_some() {
        support::crio::serve();
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let (mut hold, mut cluster, mut on_agents) = (false, false, false);
    let mut args = std::env::args().skip(1);
    let mut pinboard_args_given = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--hold" => hold = true,
            "--cluster" => cluster = true,
            "--agents" => on_agents = true,
            "--" => pinboard_args_given.extend(args.by_ref()),
            _ => bail!(
                "usage: cargo run --example lab -- [--hold] [--cluster | --agents] [-- PINBOARD_ARGS...]"
            ),
        }
    }

    // Ctrl-C must not kill this process before the lab is stopped and its tmpfs unmounted. The handler
    // only records the signal; children get default handling back when they exec.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut interrupt = runtime.block_on(async { signal(SignalKind::interrupt()) })?;
    if on_agents {
        return agents::run(&runtime, hold, &pinboard_args_given, &mut interrupt);
    }

    let public = samples()
        .iter()
        .filter(|s| !s.repo.starts_with(PRIVATE))
        .map(|s| s.repo.to_owned())
        .collect();
    let lab = Lab::start(
        "demo",
        LabConfig {
            nodes: NODES
                .iter()
                .filter(|(name, _)| !stand_in(name, cluster))
                .map(|&(name, bytes)| match runs_crio(name, cluster) {
                    true => NodeSpec::new(name, bytes).on(support::Runtime::Crio133),
                    false => NodeSpec::new(name, bytes).importing_conf_d(),
                })
                .collect(),
            apiserver: cluster,
            registry: RegistrySetup {
                tokens: Some(TokenConfig {
                    users: vec![TokenUser::new(DEMO_USER, DEMO_PASSWORD, &["*"])],
                    public,
                }),
                ..RegistrySetup::default()
            },
            ..LabConfig::default()
        },
    )?;
    let nodes = start_nodes(&lab, cluster)?;
    let samples = push_samples(&lab, &nodes, &runtime)?;
    let auth = auth_config(&lab);
    let auth_file = lab.dir().join("auth.json");
    std::fs::write(&auth_file, auth.to_string())?;
    lab.proxy().set_bandwidth(Some(LINK_MIBPS << 20));
    let (target, stand_ins) = if cluster {
        let stand_ins = runtime.block_on(play_cluster(&lab, &nodes, &samples, &auth))?;
        let target = Target::Cluster {
            kubeconfig: lab
                .apiserver()
                .expect("cluster lab")
                .kubeconfig()
                .to_owned(),
            set_file: stand_ins.set_file.clone(),
        };
        (target, Some(stand_ins))
    } else {
        let target = Target::Direct {
            nodes_file: write_nodes_file(&lab, &nodes)?,
            images_file: samples.images_file.clone(),
            auth_file: auth_file.clone(),
        };
        (target, None)
    };
    let binary = std::env::var_os("PINBOARD_BIN").map_or_else(
        || support::lab::target_dir().join("debug/pinboard"),
        PathBuf::from,
    );

    if hold {
        println!("lab dir:     {}", lab.dir().display());
        println!("registry:    {}", lab.registry_host());
        println!(
            "proxy:       {} (the registry link, capped at {LINK_MIBPS} MiB/s)",
            lab.proxy_host()
        );
        println!("images file: {}", samples.images_file.display());
        println!(
            "auth file:   {} (the shop/* images are private)",
            auth_file.display()
        );
        for node in &nodes {
            println!("node {}:     {}", node.name, node.describe(&lab));
        }
        if let Target::Cluster {
            kubeconfig,
            set_file,
        } = &target
        {
            println!("kubeconfig:  {}", kubeconfig.display());
            println!("set:         {}", set_file.display());
        }
        println!(
            "pinboard by hand (a command such as `plan` goes right after the binary; none opens the TUI):"
        );
        let mut line = vec![binary.into_os_string()];
        line.extend(pinboard_args(&lab, &target, true));
        println!("  {}", shell_line(&line));
        println!("Ctrl-C stops the lab.");
        runtime.block_on(interrupt.recv());
        return Ok(ExitCode::SUCCESS);
    }

    let mut command = Command::new(&binary);
    // A leading word that is not a flag is pinboard's subcommand; none opens the TUI.
    let (subcommand, rest) = match pinboard_args_given.split_first() {
        Some((first, rest)) if !first.starts_with('-') => (Some(first), rest),
        _ => (None, pinboard_args_given.as_slice()),
    };
    if let Some(stand_ins) = &stand_ins
        && subcommand.is_some_and(|s| ["check", "status", "unpin"].contains(&s.as_str()))
    {
        runtime.block_on(stand_ins.apply_and_settle())?;
    }
    let names_a_set = rest.iter().any(|a| a == "--set");
    let status = command
        .args(subcommand)
        .args(pinboard_args(&lab, &target, !names_a_set))
        .args(rest)
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    drop(stand_ins);
    drop(nodes);
    drop(lab);
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .map_or(ExitCode::FAILURE, ExitCode::from))
}

/// Whether node `name` is a CRI-O node: n1 always, every node in the cluster demo.
fn runs_crio(name: &str, cluster: bool) -> bool {
    cluster || name == "n1"
}

/// Whether node `name` is the CRI-O stand-in rather than a node of the lab: in the cluster demo, and where
/// the real CRI-O is not built.
fn stand_in(name: &str, cluster: bool) -> bool {
    runs_crio(name, cluster) && (cluster || support::Runtime::Crio133.bin_dir().is_err())
}

/// One of the demo's nodes: a containerd node of the lab, or a CRI-O stand-in of its own.
struct DemoNode {
    name: &'static str,
    imagefs_bytes: u64,
    crio: Option<CrioStandIn>,
}

impl DemoNode {
    fn endpoint(&self, lab: &Lab) -> String {
        match &self.crio {
            Some(crio) => crio.endpoint(),
            None => lab.node(self.name).endpoint(),
        }
    }

    /// Its endpoint and runtime, for `--hold`.
    fn describe(&self, lab: &Lab) -> String {
        match &self.crio {
            Some(crio) => format!(
                "{} (CRI-O {CRIO_VERSION} stand-in, drop-ins in {})",
                crio.endpoint(),
                crio.config_dir().display()
            ),
            None => format!(
                "{} ({})",
                self.endpoint(lab),
                lab.node(self.name).runtime_version()
            ),
        }
    }

    /// Pre-loads `reference` as an administrator would (`ctr images pull` on containerd, a CRI pull as
    /// `crictl pull` does on CRI-O), with the demo login when `private`.
    fn preload(&self, lab: &Lab, runtime: &Runtime, reference: &str, private: bool) -> Result<()> {
        let Some(crio) = &self.crio else {
            let login = format!("{DEMO_USER}:{DEMO_PASSWORD}");
            return lab
                .node(self.name)
                .pull_as(reference, private.then_some(login.as_str()));
        };
        let auth = private.then(|| AuthConfig {
            username: DEMO_USER.to_owned(),
            password: DEMO_PASSWORD.to_owned(),
            ..AuthConfig::default()
        });
        runtime
            .block_on(async {
                let client = connect(crio).await?;
                Ok::<_, anyhow::Error>(client.pull_image(reference, auth, PULL_TIMEOUT).await?)
            })
            .map(drop)
            .with_context(|| format!("node {}: pulling {reference}", self.name))
    }
}

/// A CRI client of a CRI-O stand-in.
async fn connect(crio: &CrioStandIn) -> Result<CriClient> {
    let endpoint: CriEndpoint = crio.endpoint().parse().map_err(anyhow::Error::msg)?;
    Ok(CriClient::connect(&endpoint, CRI_TIMEOUT).await?)
}

/// The demo's nodes, in [`NODES`] order: the lab's nodes and a CRI-O stand-in, its storage on a tmpfs of
/// the node's size, for each [`stand_in`].
fn start_nodes(lab: &Lab, cluster: bool) -> Result<Vec<DemoNode>> {
    let registries = [lab.proxy_host(), lab.registry_host()];
    if runs_crio("n1", cluster) && stand_in("n1", cluster) && !cluster {
        eprintln!(
            "lab: the real CRI-O is not built (scripts/setup builds it from \
             ../shared/vendor/cri-o-v1.33.13.tar.xz): n1 is the CRI-O stand-in"
        );
    }
    NODES
        .iter()
        .map(|&(name, bytes)| {
            let crio = if stand_in(name, cluster) {
                let stand_in = CrioStandIn::start_on_tmpfs(
                    &format!("demo-{name}"),
                    CRIO_VERSION,
                    &registries,
                    bytes,
                )?;
                Some(stand_in)
            } else {
                None
            };
            Ok(DemoNode {
                name,
                imagefs_bytes: bytes,
                crio,
            })
        })
        .collect()
}

/// Where pinboard finds the demo's nodes and images.
enum Target {
    /// The nodes file, the sample list and the demo login.
    Direct {
        nodes_file: PathBuf,
        images_file: PathBuf,
        auth_file: PathBuf,
    },
    /// The lab's API server and the demo's set.
    Cluster {
        kubeconfig: PathBuf,
        set_file: PathBuf,
    },
}

/// pinboard's arguments for the lab, after any subcommand: the target (in the cluster, the demo's set too
/// when `with_set`), the proxy as a plain-HTTP registry, the demo's floor ([`MIN_FREE`]; the default 16 GiB
/// would refuse every node) and a blob cache in the lab dir.
fn pinboard_args(lab: &Lab, target: &Target, with_set: bool) -> Vec<OsString> {
    let flag = |name: &str, value: &Path| vec![OsString::from(name), value.into()];
    let mut args = match target {
        Target::Direct {
            nodes_file,
            images_file,
            auth_file,
        } => [
            flag("--nodes", nodes_file),
            flag("--images-file", images_file),
            flag("--authfile", auth_file),
        ]
        .concat(),
        Target::Cluster {
            kubeconfig,
            set_file,
        } => {
            let mut args = flag("--kubeconfig", kubeconfig);
            if with_set {
                args.extend(flag("--set", set_file));
            }
            args
        }
    };
    args.extend(
        [
            "--insecure-registry",
            &lab.proxy_host(),
            "--min-free",
            MIN_FREE,
        ]
        .map(OsString::from),
    );
    args.extend(flag("--cache-dir", &lab.dir().join("cache")));
    args
}

/// `words` as one shell line to paste: each word as it is when the shell would read it unchanged, else
/// in single quotes.
fn shell_line(words: &[OsString]) -> String {
    let quoted: Vec<String> = words
        .iter()
        .map(|word| {
            let word = word.to_string_lossy();
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-:=@%+,".contains(c));
            if plain {
                word.into_owned()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect();
    quoted.join(" ")
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

/// The samples once pushed.
struct Samples {
    /// `<lab>/images.txt`: their references, through the proxy.
    images_file: PathBuf,
    /// Each reference's layers, as its manifest lists them, for the stand-in daemon.
    layers: daemon::Layers,
}

/// Pushes the samples, pre-loads them on the `nodes` the sample names (private ones with the demo login),
/// and writes their references (through the proxy) to `<lab>/images.txt`.
fn push_samples(lab: &Lab, nodes: &[DemoNode], runtime: &Runtime) -> Result<Samples> {
    let proxy = lab.proxy_host();
    let mut text = format!(
        "# pinboard lab sample images, pushed to the registry at {} and referenced through the lab proxy;\n\
         # the {PRIVATE}* ones are private (auth.json holds the login)\n",
        lab.registry_host()
    );
    let mut layers = daemon::Layers::new();
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
        let (reference, bytes, listed) = match sample.image {
            SampleImage::Single(layers) => {
                let pushed = lab.push_image(sample.repo, &spec(layers))?;
                let listed: Vec<(String, u64)> = pushed
                    .layers
                    .iter()
                    .map(|l| (l.digest.clone(), l.size))
                    .collect();
                let bytes: u64 = listed.iter().map(|(_, size)| size).sum();
                (pushed.reference(&proxy), bytes, listed)
            }
            SampleImage::MultiPlatform(platforms) => {
                let images: Vec<_> = platforms
                    .into_iter()
                    .map(|(p, layers)| (p, spec(layers)))
                    .collect();
                let pushed = lab.push_index(sample.repo, &images)?;
                let bytes = pushed.manifests[0].1.layers.iter().map(|l| l.size).sum();
                // An index lists manifests, not layers.
                (pushed.reference(&proxy), bytes, Vec::new())
            }
        };
        layers.insert(reference.clone(), listed);
        let private = sample.repo.starts_with(PRIVATE);
        for name in sample.preloaded_on {
            let node = nodes
                .iter()
                .find(|n| n.name == *name)
                .with_context(|| format!("sample {} names no node {name}", sample.repo))?;
            node.preload(lab, runtime, &reference, private)?;
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
    let images_file = lab.dir().join("images.txt");
    std::fs::write(&images_file, text)?;
    Ok(Samples {
        images_file,
        layers,
    })
}

/// `<lab>/nodes.yaml`: each node pins the way its runtime enforces. A CRI-O node's drop-ins (the pins,
/// applied by a SIGHUP through its pidfile; lazy pulling; fan-out's registries, which the same reload
/// re-reads) are where it reads them, in its directory; a containerd node pins with labels and its
/// lazy-pull file goes in the `conf.d` its config in the lab dir imports.
fn write_nodes_file(lab: &Lab, nodes: &[DemoNode]) -> Result<PathBuf> {
    let mut text = String::from("# written by examples/lab.rs: every write stays in target/lab\n");
    for node in nodes {
        let Some(crio) = &node.crio else {
            text.push_str(&lab.node(node.name).nodes_file_entry());
            continue;
        };
        writeln!(
            text,
            "- name: {}\n  endpoint: {}\n  pin: crio-drop-in\n  crioConfigDir: {}\n  crioReload: signal:{}\n  \
             crioRegistriesDir: {}\n  lazyDropIn: {}",
            node.name,
            node.endpoint(lab),
            crio.config_dir().display(),
            crio.pidfile().display(),
            crio.registries_dir().display(),
            crio.registries_dir()
                .with_file_name("storage.conf.d")
                .join("lazy-image-pull.conf")
                .display()
        )?;
    }
    let path = lab.dir().join("nodes.yaml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The cluster's stand-ins; dropping them stops them.
struct ClusterStandIns {
    set_file: PathBuf,
    writer: cluster::Writer,
    _daemon: daemon::Daemon,
    _kubelets: Vec<FakeKubelet>,
}

/// How long the stand-in daemons get to pre-load the demo's set.
const SETTLE: Duration = Duration::from_secs(180);

impl ClusterStandIns {
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
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Plays an OpenShift cluster on the lab's API server and the CRI-O `nodes` (see the top of this file),
/// with `auth` as its global pull secret, and writes `<lab>/release.yaml`: every single-platform sample,
/// for the worker pool.
async fn play_cluster(
    lab: &Lab,
    nodes: &[DemoNode],
    samples: &Samples,
    auth: &Value,
) -> Result<ClusterStandIns> {
    let kubeconfig = lab
        .apiserver()
        .context("the lab runs no API server")?
        .kubeconfig();
    let names: Vec<&str> = nodes.iter().map(|n| n.name).collect();
    let (admin, writer) = cluster::openshift(lab, &["worker"], &names).await;
    cluster::pull_secret(&admin, auth).await;
    let mut kubelets = Vec::new();
    let mut daemon_nodes = Vec::new();
    for node in nodes {
        let crio = node
            .crio
            .as_ref()
            .context("the cluster's nodes are CRI-O nodes")?;
        ephemeral_storage(&writer, node).await?;
        // What a kubelet measures: the image filesystem its runtime names.
        let client = connect(crio).await?;
        let mountpoint = client
            .image_fs_info()
            .await?
            .image_filesystems
            .first()
            .and_then(|fs| fs.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint))
            .with_context(|| format!("node {}: CRI-O names no image filesystem", node.name))?;
        let image_fs = move || {
            let stat = nix::sys::statvfs::statvfs(&mountpoint).expect("the node's tmpfs");
            let block = stat.fragment_size();
            ImageFs {
                capacity: stat.blocks() * block,
                available: stat.blocks_available() * block,
                used: (stat.blocks() - stat.blocks_free()) * block,
            }
        };
        let dir = lab.dir().join("kubelets").join(node.name);
        let kubelet = FakeKubelet::configured(&dir, node.name, image_fs, KubeletConfig::default())?;
        writer.kubelet(node.name, kubelet.port()).await;
        kubelets.push(kubelet);
        daemon_nodes.push(daemon::Node {
            name: node.name.to_owned(),
            endpoint: crio.endpoint(),
            crio_config_dir: crio.config_dir().to_owned(),
            crio_pidfile: crio.pidfile().to_owned(),
        });
    }
    let daemon = daemon::start(
        kubeconfig.to_owned(),
        daemon_nodes,
        samples.layers.clone(),
        MIN_FREE_BYTES,
    );

    let references: Vec<String> = std::fs::read_to_string(&samples.images_file)?
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
    Ok(ClusterStandIns {
        set_file,
        writer,
        _daemon: daemon,
        _kubelets: kubelets,
    })
}

/// Writes Node `node`'s ephemeral storage as its kubelet reports it: capacity, the node's one filesystem
/// (its image filesystem), and allocatable, that less the kubelet's default hard eviction threshold
/// (`nodefs.available<10%`). The stand-in daemon checks a set's size against the allocatable, as the
/// daemon does.
async fn ephemeral_storage(writer: &cluster::Writer, node: &DemoNode) -> Result<()> {
    let capacity = node.imagefs_bytes;
    let body = json!({"status": {
        "capacity": {"ephemeral-storage": capacity.to_string()},
        "allocatable": {"ephemeral-storage": (capacity - capacity / 10).to_string()},
    }});
    Api::<KubeNode>::all(writer.cluster.client().clone())
        .patch_status(node.name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .with_context(|| format!("ephemeral storage of Node {}", node.name))?;
    Ok(())
}

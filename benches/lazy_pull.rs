//! Benchmark (issue 31): time from `pinboard apply` to a running container that reads one small file, for
//! an eStargz image of PINBOARD_BENCH_MIB MiB (200 by default: busybox and the file in one layer, then four
//! layers of incompressible bytes), made by `ctr-remote image convert --estargz`, through the lab's proxy
//! capped at PINBOARD_BENCH_MIBPS MiB/s (16 by default), and the bytes that crossed the link.
//!
//! Contenders, each on a fresh lab (one containerd node, new registry, the same image pushed), in every run:
//! - lazy: the node with the real stargz-snapshotter, `pinboard lazy on --restart`, then `pinboard apply
//!   --allow-lazy` (its layers mounted from the registry) and `ctr run --snapshotter stargz`;
//! - whole on the lazy node: the same node, `pinboard apply` without `--allow-lazy` (pre-loading: every
//!   layer made local), then `ctr run --snapshotter stargz`;
//! - full pull: a node without stargz (containerd's own native snapshotter), `pinboard apply`, then
//!   `ctr run --snapshotter native`.
//!
//! The container is `busybox cat /data/small.txt`; its output is checked. Prints every run, then each
//! contender's median (min–max) of time and bytes, and the load average before each run.
//!
//!     cargo bench --bench lazy_pull    # PINBOARD_BENCH_MIB=200 PINBOARD_BENCH_MIBPS=16 PINBOARD_BENCH_RUNS=3
//!
//! Needs root (the lab mounts tmpfs and the snapshotter FUSE). Results go in BENCHMARKS.md and
//! docs/lazy-pulling.md.

mod common;
#[allow(
    dead_code,
    unused_imports,
    reason = "the bench runs the lab; what only the tests use is unused here"
)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{env_number, load_average, spread};
use support::estargz::EstargzSpec;
use support::{Lab, Node, NodeSpec, binary};

const MIB: u64 = 1 << 20;
/// The file the container reads.
const SMALL: &str = "read by the benchmark's container\n";

/// How a contender pulls and runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    Lazy,
    WholeOnLazyNode,
    FullPull,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Lazy => "lazy (apply --allow-lazy)",
            Contender::WholeOnLazyNode => "whole on the lazy node (apply)",
            Contender::FullPull => "full pull (native snapshotter)",
        }
    }

    fn stargz(self) -> bool {
        self != Contender::FullPull
    }
}

/// One run's figures: time from apply to the container's exit, and bytes through the proxy.
struct Figures {
    took: Duration,
    bytes: u64,
}

/// `pinboard ARGS` on `node` (its `systemctl` first on PATH where it has one); panics unless it exits 0.
fn pinboard(node: &Node, args: &[String]) {
    let mut command = Command::new(binary());
    command.args(args);
    if node.stargz_socket().is_some() {
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{path}", node.unit().bin.display()));
    }
    let out = command.output().expect("pinboard runs");
    assert!(
        out.status.success(),
        "pinboard {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How pinboard names `node`.
fn node_args(node: &Node) -> Vec<String> {
    let mut args = vec!["--cri".into(), format!("{}={}", node.name, node.endpoint())];
    if let Some(socket) = node.stargz_socket() {
        args.extend([
            "--containerd-config".into(),
            node.config_file().display().to_string(),
            "--stargz-socket".into(),
            socket.display().to_string(),
        ]);
    }
    args
}

/// One run of `contender` on a fresh lab with `archive` (the eStargz image) pushed, the link at `cap`.
fn run(contender: Contender, archive: &[u8], cap: u64, round: usize) -> Figures {
    let spec = NodeSpec::new("n1", 2048 * MIB);
    let spec = match contender.stargz() {
        true => spec.with_stargz(),
        false => spec,
    };
    let lab = Lab::with_nodes("lazy-bench", vec![spec]);
    let node = lab.node("n1");
    let pushed = lab
        .push_estargz_archive("bench/big", archive)
        .expect("push");
    let image = pushed.reference(&lab.proxy_host());
    if contender.stargz() {
        let mut on = vec!["lazy".into(), "on".into(), "--restart".into()];
        on.extend(node_args(node));
        pinboard(node, &on);
    }
    let mut apply = vec!["apply".to_string()];
    apply.extend(node_args(node));
    apply.extend(["--image".into(), image.clone()]);
    apply.extend(["--insecure-registry".into(), lab.proxy_host()]);
    apply.extend(["--min-free".into(), "1Mi".into()]);
    if contender == Contender::Lazy {
        apply.push("--allow-lazy".into());
    }
    let snapshotter = match contender.stargz() {
        true => "stargz",
        false => "native",
    };
    let container = format!("bench-{round}");

    lab.proxy().set_bandwidth(Some(cap));
    let (before, started) = (lab.proxy().bytes_down(), Instant::now());
    pinboard(node, &apply);
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&node.socket)
        .args(["--namespace", "k8s.io", "run", "--rm", "--snapshotter"])
        .args([
            snapshotter,
            &image,
            &container,
            "/bin/busybox",
            "cat",
            "/data/small.txt",
        ])
        .output()
        .expect("ctr runs");
    let figures = Figures {
        took: started.elapsed(),
        bytes: lab.proxy().bytes_down() - before,
    };
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        SMALL,
        "the container's output; ctr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    figures
}

fn main() {
    let mib: usize = env_number("PINBOARD_BENCH_MIB", 200);
    let cap = env_number("PINBOARD_BENCH_MIBPS", 16) * MIB;
    let runs: usize = env_number("PINBOARD_BENCH_RUNS", 3);
    let layers = [mib / 4 * MIB as usize; 4];
    let spec = EstargzSpec::with_busybox(SMALL, 3700, &layers);
    let making = Instant::now();
    let archive = Lab::with_nodes("lazy-bench-image", Vec::new())
        .estargz_archive(&spec)
        .expect("the eStargz image");
    eprintln!(
        "eStargz image of {mib} MiB made in {:.1?} ({} MiB archive)",
        making.elapsed(),
        archive.len() as u64 / MIB
    );
    let contenders = [
        Contender::Lazy,
        Contender::WholeOnLazyNode,
        Contender::FullPull,
    ];
    let mut figures: Vec<Vec<Figures>> = contenders.iter().map(|_| Vec::new()).collect();
    for round in 0..runs {
        for (at, &contender) in contenders.iter().enumerate() {
            let load = load_average();
            let f = run(contender, &archive, cap, round);
            println!(
                "run {}: {}: {:.2} s, {:.1} MiB over the link (load {load})",
                round + 1,
                contender.name(),
                f.took.as_secs_f64(),
                f.bytes as f64 / MIB as f64
            );
            figures[at].push(f);
        }
    }
    println!(
        "{mib} MiB eStargz image, link capped at {} MiB/s, median (min–max) of {runs} runs; load now {}",
        cap / MIB,
        load_average()
    );
    for (contender, figures) in contenders.iter().zip(&figures) {
        let secs = spread(
            figures.iter().map(|f| f.took.as_secs_f64()).collect(),
            |s| format!("{s:.2} s"),
        );
        let bytes = spread(
            figures
                .iter()
                .map(|f| f.bytes as f64 / MIB as f64)
                .collect(),
            |m| format!("{m:.1} MiB"),
        );
        println!("{}: {secs}, {bytes} over the link", contender.name());
    }
}

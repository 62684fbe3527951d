//! `--agents`: the demo on a plain Kubernetes cluster with pinboard's agents. Three containerd nodes under
//! real kubelets (n1's image filesystem too small for the samples), the manifests `pinboard agent
//! manifests` prints applied to the lab's API server, n3's agent a real pod of the DaemonSet (from an image
//! of this build) and the others processes started as their pods would run (and eligible to serve the
//! in-cluster cache, as `--cache` installs them), and `<lab>/demo.yaml`, a
//! PinSet of six sample images sharing a base layer. pinboard then runs with `--kubeconfig`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use tokio::runtime::Runtime;
use tokio::signal::unix::Signal;

use crate::support::agents::{AgentsLab, AgentsSetup};
use crate::support::{ImageSpec, LayerFormat, LayerSpec, NodeSpec, binary};

/// The nodes and their image filesystems: n1 has no room for the samples.
const NODES: [(&str, u64); 3] = [("n1", 48 << 20), ("n2", 400 << 20), ("n3", 1 << 30)];
/// The node whose agent runs as a pod: the agent's image needs room.
const POD_NODE: &str = "n3";
/// The demo's floor on these small nodes (a real node keeps 16 GiB).
const MIN_FREE: &str = "4Mi";

/// Sample `i`: a 5 MiB base shared by all, and 8 MiB of its own.
fn sample(i: u64) -> ImageSpec {
    let layer = |seed, mib: usize| LayerSpec {
        seed,
        bytes: mib << 20,
        format: LayerFormat::Gzip,
    };
    ImageSpec {
        layers: vec![layer(9000, 5), layer(9100 + i, 8)],
        ..ImageSpec::default()
    }
}

/// Starts the cluster, then runs pinboard with `given` (a leading subcommand, then its arguments) or, with
/// `hold`, prints its argument line and waits for `interrupt`.
pub fn run(
    runtime: &Runtime,
    hold: bool,
    given: &[String],
    interrupt: &mut Signal,
) -> Result<ExitCode> {
    let nodes = NODES
        .iter()
        .map(|&(name, bytes)| NodeSpec::new(name, bytes))
        .collect();
    // The agents started as processes may serve the in-cluster cache, so `f` (fan-out) works as on a
    // cluster installed with `pinboard agent manifests --cache`.
    let setup = AgentsSetup {
        agent_args: vec![
            "--cache-port=5050".into(),
            "--cache-dir={lab}/cache-{node}".into(),
        ],
        ..AgentsSetup::default()
    };
    let lab = runtime.block_on(AgentsLab::start_with(
        "demo-agents",
        nodes,
        Some(POD_NODE),
        setup,
    ));
    let host = lab.lab.registry_host();
    let images = (0..6)
        .map(|i| {
            let pushed = lab.lab.push_image(&format!("demo/app{i}"), &sample(i))?;
            Ok(pushed.reference(&host))
        })
        .collect::<Result<Vec<String>>>()?;
    let listed: Vec<&str> = images.iter().map(String::as_str).collect();
    let set_file = lab.set_file("demo", &listed, "");
    let kubeconfig = lab
        .lab
        .cluster()
        .expect("a cluster lab")
        .kubeconfig()
        .to_owned();
    let common = |with_set: bool| {
        let mut args: Vec<OsString> = vec![
            "--kubeconfig".into(),
            kubeconfig.clone().into(),
            "--insecure-registry".into(),
            host.clone().into(),
            "--min-free".into(),
            MIN_FREE.into(),
        ];
        if with_set {
            args.extend(["--set".into(), set_file.clone().into()]);
        }
        args
    };
    let pinboard = binary();

    if hold {
        println!("lab dir:     {}", lab.lab.dir().display());
        println!("registry:    {host}");
        println!("kubeconfig:  {}", kubeconfig.display());
        println!(
            "set:         {} (n1 has no room for it)",
            set_file.display()
        );
        println!(
            "pinboard by hand (a command such as `plan` goes right after the binary; none opens the TUI):"
        );
        let mut line = vec![pinboard.into_os_string()];
        line.extend(common(true));
        println!("  {}", crate::shell_line(&line));
        println!("Ctrl-C stops the lab.");
        runtime.block_on(interrupt.recv());
        return Ok(ExitCode::SUCCESS);
    }

    let (subcommand, rest) = match given.split_first() {
        Some((first, rest)) if !first.starts_with('-') => (Some(first), rest),
        _ => (None, given),
    };
    // `check`, `status` and `unpin` read the set from the cluster: apply it first, as an administrator
    // would (n1 fails for want of room, which is what the demo shows).
    if subcommand.is_some_and(|s| ["check", "status", "unpin"].contains(&s.as_str())) {
        let mut apply = Command::new(&pinboard);
        apply.arg("apply").args(common(true));
        apply.args(["--force", "--timeout", "120s"]);
        apply.status().context("applying the demo's set")?;
    }
    let names_a_set = rest.iter().any(|a| a == "--set");
    let status = Command::new(&pinboard)
        .args(subcommand)
        .args(common(!names_a_set))
        .args(rest)
        .status()
        .with_context(|| format!("running {}", PathBuf::from(&pinboard).display()))?;
    drop(lab);
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .map_or(ExitCode::FAILURE, ExitCode::from))
}

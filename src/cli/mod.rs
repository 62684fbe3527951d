//! The command line: `pinboard` alone opens the terminal UI; `pinboard plan`, `check`, `status`, `apply`,
//! `unpin` and `lazy` run headless; `pinboard mirror` serves the sets' images as a registry mirror. Every command
//! takes the same argument list ([`CommonArgs`]; `mirror` also needs `--listen`), its help showing the flags
//! it uses (`help`). Each reads its input completely and checks it before touching anything, so bad input
//! ends with one clear message per problem, exit code 2, and nothing done.

mod apply;
mod check;
mod crio_progress;
mod help;
mod lazy;
mod mirror;
mod output;
mod plan;
mod release;
pub mod stderr_log;
mod unpin;

use clap::{Args, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;

use crate::agent::AgentArgs;
use crate::agent::manifests::ManifestArgs;
use crate::error::Failure;
use crate::options::CommonArgs;
use crate::ui::TuiArgs;

#[derive(Parser, Debug)]
#[command(
    name = "pinboard",
    version,
    about = "Pin and pre-load container images on cluster nodes, and watch those rollouts",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Without a subcommand: the terminal UI.
    #[command(flatten)]
    pub tui: TuiArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Preview what pre-loading image sets costs each node: bytes to fetch, disk after, and a verdict.
    Plan(CommonArgs),
    /// Exit 0 only when every image is present and pinned on every node; else exit 1 with what is missing.
    Check(CommonArgs),
    /// Per node and image: present, pinned, and why not, as `check` shows them; exit 0 whether or not they are
    /// ready.
    Status(CommonArgs),
    /// Pre-load then pin the images on every node, as the TUI does; then check (exit code as `check`'s).
    Apply(CommonArgs),
    /// Release the sets' holds on every node: a pin goes with its last holder (the images stay).
    Unpin(CommonArgs),
    /// Lazy pulling on every node, the way its runtime does it: `on`, `off`, or its `status`.
    Lazy(lazy::LazyArgs),
    /// Whether each CRI-O node counts its pull bytes as they arrive (its metrics and
    /// pull_progress_timeout, in pinboard's drop-in): `on`, `off`, or its `status`.
    CrioProgress(crio_progress::CrioProgressArgs),
    /// Serve the sets' images as a read-only registry mirror (digests of the sets only) until interrupted;
    /// every blob is fetched from its registry once, into the blob cache.
    Mirror(mirror::MirrorArgs),
    /// An OpenShift release as PinnedImageSets: its components and the release image, by digest.
    Release(release::ReleaseCommand),
    /// Prints the shell completion script: `source <(pinboard completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// The terminal UI (the same as `pinboard` without a subcommand).
    Tui(TuiArgs),
    /// pinboard's agent, on one node of any Kubernetes cluster (run by its DaemonSet); `agent manifests`
    /// prints what installs it.
    Agent(AgentCommand),
}

/// `pinboard agent`: the agent itself, or `pinboard agent manifests`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct AgentCommand {
    #[command(subcommand)]
    pub manifests: Option<AgentSubcommand>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

#[derive(Subcommand, Debug)]
pub enum AgentSubcommand {
    /// Prints the namespace, CRDs, RBAC and DaemonSet that install the agent: `pinboard agent manifests
    /// --image REF | kubectl apply -f -`.
    Manifests(ManifestArgs),
}

/// How the program was invoked: `kubectl pinboard` or `oc pinboard` when run as a kubectl/oc plugin (a binary
/// or symlink named `kubectl-pinboard` / `oc-pinboard` on PATH), else `pinboard`.
pub fn program_name() -> String {
    let invoked = std::env::args_os()
        .next()
        .and_then(|arg| {
            std::path::Path::new(&arg)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    match invoked.as_str() {
        "kubectl-pinboard" => "kubectl pinboard".into(),
        "oc-pinboard" => "oc pinboard".into(),
        _ => "pinboard".into(),
    }
}

/// The command line, parsed with usage and help naming the program as it was invoked.
pub fn parse() -> Cli {
    let matches = help::command().bin_name(program_name()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The completion script for `shell`, completing `name`'s subcommands and flags.
fn completion(shell: Shell, name: &str) -> String {
    let mut script = Vec::new();
    // Completion scripts complete one word: a plugin's is registered for its binary name.
    let binary = name.replace(' ', "-");
    clap_complete::generate(shell, &mut help::command(), binary, &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from when this is made: a command that must clean up before it
/// exits waits for them.
struct Interrupts {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> Result<Interrupts, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let cannot = |e: std::io::Error| Failure::bad_input(format!("cannot catch signals: {e}"));
        Ok(Interrupts {
            interrupt: signal(SignalKind::interrupt()).map_err(cannot)?,
            terminate: signal(SignalKind::terminate()).map_err(cannot)?,
        })
    }

    /// The next one, by name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// Runs a command; returns what to print on stdout, or the failure.
pub async fn run(command: Command) -> Result<String, Failure> {
    match command {
        Command::Plan(args) => plan::run(args).await,
        Command::Check(args) => check::check(args).await,
        Command::Status(args) => check::status(args).await,
        Command::Apply(args) => apply::apply(args).await,
        Command::Unpin(args) => unpin::unpin(args).await,
        Command::Lazy(args) => lazy::run(args).await,
        Command::CrioProgress(args) => crio_progress::run(args).await,
        Command::Mirror(args) => mirror::run(args).await,
        Command::Release(args) => release::run(args).await,
        Command::Completion { shell } => Ok(completion(shell, &program_name())),
        Command::Tui(args) => crate::ui::live::run(args).await.map(|()| String::new()),
        Command::Agent(AgentCommand {
            manifests: Some(AgentSubcommand::Manifests(args)),
            ..
        }) => crate::agent::manifests::render(&args).map_err(|e| Failure::bad_input(e.to_string())),
        Command::Agent(AgentCommand {
            manifests: None,
            agent,
        }) => crate::agent::run(agent).await.map(|()| String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What an operator's script passes to `apply`, reused for every other command.
    const APPLY_ARGS: &[&str] = &[
        "--set",
        "a.yaml",
        "--images-file",
        "list.txt",
        "--image",
        "quay.io/a/b@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        "--cri",
        "n1=unix:///run/containerd/containerd.sock",
        "--platform",
        "linux/amd64",
        "--cri-timeout",
        "20s",
        "--crio-config-dir",
        "/etc/crio/crio.conf.d",
        "--crio-reload",
        "none",
        "--authfile",
        "auth.json",
        "--certs-dir",
        "/etc/pinboard/certs.d",
        "--no-pull-secret",
        "--insecure-registry",
        "127.0.0.1:5000",
        "--registry-concurrency",
        "8",
        "--cache-dir",
        "/var/cache/pinboard",
        "--cache-max",
        "100Gi",
        "--pull-progress-timeout",
        "90s",
        "--gc-high-percent",
        "80",
        "--min-free",
        "1Gi",
        "--parallel",
        "3",
        "--force",
        "--timeout",
        "20m",
        "--wait",
        "--all-sets",
        "--release-unowned",
        "--fan-out",
        "--fan-out-listen",
        "10.0.0.5:5050",
        "--crio-registries-dir",
        "/etc/containers/registries.conf.d",
        "-o",
        "json",
    ];

    #[test]
    fn every_command_takes_the_same_argument_list() {
        let commands = [
            "plan", "check", "status", "apply", "unpin", "mirror", "release", "tui",
        ];
        for command in commands {
            // What a command takes besides the list: mirror's address, release's pull spec.
            let own: &[&str] = match command {
                "mirror" => &["--listen", "127.0.0.1:5050"],
                "release" => &["quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64"],
                _ => &[],
            };
            let start: Vec<&str> = ["pinboard", command].iter().chain(own).copied().collect();
            let line = start.iter().chain(APPLY_ARGS);
            // As `parse` parses it: flags hidden from a command's help are accepted all the same.
            let matches = help::command()
                .try_get_matches_from(line)
                .unwrap_or_else(|e| panic!("{command}: {e}"));
            let parsed = Cli::from_arg_matches(&matches).unwrap();
            let common = match parsed.command.expect("a subcommand") {
                Command::Plan(c)
                | Command::Check(c)
                | Command::Status(c)
                | Command::Apply(c)
                | Command::Unpin(c) => c,
                Command::Mirror(m) => m.common,
                Command::Release(r) => r.common,
                Command::Tui(t) => t.common,
                other => panic!("{other:?} takes no argument list"),
            };
            assert_eq!(common.rollout.parallel, 3, "{command}");
            assert_eq!(
                common.rollout.engine_config().pull_progress_timeout,
                Duration::from_secs(90),
                "{command}"
            );
            assert_eq!(common.limits.min_free, Some(1 << 30), "{command}");
            assert_eq!(common.registry.insecure_registries, ["127.0.0.1:5000"]);
            assert_eq!(
                common.registry.certs_dir.as_deref(),
                Some(std::path::Path::new("/etc/pinboard/certs.d"))
            );
            assert!(common.registry.no_pull_secret);
            assert_eq!(common.cache.cache_max, 100 << 30, "{command}");
            assert!(
                common.unpin.all_sets && common.unpin.release_unowned,
                "{command}"
            );
            assert!(common.rollout.fan_out, "{command}");
            assert_eq!(
                common.rollout.fan_out_listen,
                Some("10.0.0.5:5050".parse().unwrap()),
                "{command}"
            );
        }
        // The TUI without a subcommand takes it too.
        let line = ["pinboard"].iter().chain(APPLY_ARGS);
        let parsed = Cli::try_parse_from(line).unwrap();
        assert!(parsed.command.is_none());
        assert!(parsed.tui.common.rollout.force);
    }

    #[test]
    fn the_cache_bound_defaults_to_the_documented_size() {
        let parsed = Cli::try_parse_from(["pinboard", "plan"]).unwrap();
        let Some(Command::Plan(common)) = parsed.command else {
            panic!("plan")
        };
        assert_eq!(
            common.cache.cache_max,
            crate::backend::blobs::cache::DEFAULT_MAX_BYTES
        );
        assert_eq!(common.cache.cache_dir, None);
    }

    #[test]
    fn fan_out_listen_refuses_an_address_nodes_cannot_be_pointed_at() {
        for unspecified in ["0.0.0.0:5050", "[::]:5050"] {
            let err = Cli::try_parse_from(["pinboard", "apply", "--fan-out-listen", unspecified])
                .unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
            assert_eq!(err.exit_code(), 2, "bad input");
            let text = err.to_string();
            assert!(
                text.contains("not an address nodes can be pointed at")
                    && text.contains("e.g. 10.0.0.5:5050"),
                "{text}"
            );
        }
        let err =
            Cli::try_parse_from(["pinboard", "apply", "--fan-out-listen", "nodes"]).unwrap_err();
        assert!(err.to_string().contains("is not IP:PORT"), "{err}");
    }

    #[test]
    fn link_rate_takes_a_rate_and_says_how_to_write_one() {
        for command in ["plan", "apply", "mirror", "tui"] {
            let parsed = Cli::try_parse_from(["pinboard", command, "--link-rate", "6MiB/s"]);
            let common = match parsed.map(|p| p.command) {
                Ok(Some(Command::Plan(c) | Command::Apply(c))) => c,
                Ok(Some(Command::Tui(t))) => t.common,
                // mirror needs --listen: what matters is that the rate was read.
                Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => continue,
                other => panic!("{command}: {other:?}"),
            };
            assert_eq!(common.cache.link_rate, Some(6 << 20), "{command}");
            assert_eq!(common.cache.options().link_rate, Some(6 << 20));
        }
        for command in ["apply", "agent"] {
            let err = Cli::try_parse_from(["pinboard", command, "--link-rate", "6 potatoes"])
                .unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
            assert_eq!(err.exit_code(), 2, "bad input");
            let text = err.to_string();
            assert!(
                text.contains("--link-rate")
                    && text.contains("\"6 potatoes\" is not a rate")
                    && text.contains("write e.g. 6MiB/s"),
                "{text}"
            );
        }
    }

    #[test]
    fn mirror_needs_an_address_to_listen_on() {
        let err = Cli::try_parse_from(["pinboard", "mirror", "--image", "quay.io/a/b@sha256:0"])
            .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--listen"), "{err}");
        let err = Cli::try_parse_from(["pinboard", "mirror", "--listen", "localhost"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn a_mistyped_flag_is_still_an_error() {
        let err = Cli::try_parse_from(["pinboard", "unpin", "--sett", "a.yaml"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
    }
}

//! Which flags of the shared argument list ([`CommonArgs`]) each command uses, read from what its code
//! reads: a command's `--help` and completions show those, and hide the rest, which it still accepts and
//! ignores (one argument list serves every command).

use clap::{Args, CommandFactory};

use super::Cli;
use crate::options::CommonArgs;

/// Which images, and on agents which nodes: every command that reads sets (`release` takes only how its
/// sets are made).
const SETS: &[&str] = &["sets", "images_files", "images", "releases", "selector"];
/// How a release becomes sets.
const RELEASES: &[&str] = &["pool", "exclude", "release_name"];
/// Cluster mode, the API it goes through, and the cluster's pull secret for reading images as its nodes do.
const CLUSTER: &[&str] = &[
    "kubeconfig",
    "context",
    "cluster",
    "cluster_api",
    "agents_namespace",
    "no_pull_secret",
];
/// Direct nodes: how they are reached, and where their CRI-O pins and fan-out's files are (every command
/// that asks nodes first puts back fan-out files a killed pinboard left).
const NODES: &[&str] = &[
    "cri",
    "nodes",
    "platform",
    "cri_timeout",
    "crio_config_dir",
    "crio_reload",
    "crio_registries_dir",
];
/// Where each runtime's lazy-pull settings are: what `lazy` and the TUI write, and what the commands that
/// say a node's lazy pulling read.
const LAZY: &[&str] = &[
    "lazy_drop_in",
    "lazy_store",
    "containerd_config",
    "stargz_socket",
];
/// How pinboard itself reaches registries.
const REGISTRY: &[&str] = &[
    "authfile",
    "insecure_registries",
    "certs_dir",
    "registry_concurrency",
    "registries_conf",
    "registries_conf_dir",
    "mirror_sets",
];
/// When a node counts as full.
const LIMITS: &[&str] = &["gc_high_percent", "min_free"];
/// What the blob cache holds is not fetched again (plan's link bytes), and how long they take at the
/// link's budget.
const CACHE_DIR: &[&str] = &["cache_dir", "link_rate"];
/// Filling the blob cache: fan-out and `mirror`.
const CACHE: &[&str] = &["cache_dir", "cache_max", "link_rate"];
/// How pinboard pulls.
const PULLS: &[&str] = &[
    "parallel",
    "force",
    "pull_progress_timeout",
    "fan_out",
    "fan_out_listen",
];
/// `check --wait`; `--timeout` also bounds cluster-mode `apply`.
const WAIT: &[&str] = &["wait", "timeout"];
const UNPIN: &[&str] = &["all_sets", "release_unowned"];
const OUTPUT: &[&str] = &["output"];

/// The flags of the shared list `command` uses (`tui` also for `pinboard` alone); None for a command
/// without the list.
fn used_by(command: &str) -> Option<Vec<&'static str>> {
    let groups: &[&[&str]] = match command {
        "plan" => &[
            SETS, RELEASES, CLUSTER, NODES, REGISTRY, LIMITS, CACHE_DIR, OUTPUT,
        ],
        "check" => &[
            SETS,
            RELEASES,
            CLUSTER,
            NODES,
            LAZY,
            REGISTRY,
            LIMITS,
            WAIT,
            &["verify_cri", "allow_lazy"],
            OUTPUT,
        ],
        "status" => &[
            SETS,
            RELEASES,
            CLUSTER,
            NODES,
            LAZY,
            REGISTRY,
            LIMITS,
            &["allow_lazy"],
            OUTPUT,
        ],
        "apply" => &[
            SETS,
            RELEASES,
            CLUSTER,
            NODES,
            LAZY,
            REGISTRY,
            LIMITS,
            CACHE,
            PULLS,
            &["timeout", "allow_lazy"],
            OUTPUT,
        ],
        // On a cluster, lazy pulling goes through pinboard's agents (OpenShift's is MachineConfig's).
        "lazy" => &[
            &[
                "kubeconfig",
                "context",
                "cluster",
                "cluster_api",
                "agents_namespace",
            ],
            NODES,
            LAZY,
            OUTPUT,
        ],
        "unpin" => &[SETS, RELEASES, CLUSTER, NODES, REGISTRY, UNPIN, OUTPUT],
        "mirror" => &[SETS, RELEASES, &["platform"], REGISTRY, CACHE, OUTPUT],
        "release" => &[RELEASES, CLUSTER, &["platform"], REGISTRY, OUTPUT],
        "tui" => &[
            SETS,
            RELEASES,
            CLUSTER,
            NODES,
            LAZY,
            REGISTRY,
            LIMITS,
            CACHE,
            PULLS,
            &["release_unowned"],
        ],
        _ => return None,
    };
    Some(groups.concat())
}

/// The ids of the shared list's flags.
fn shared() -> Vec<String> {
    CommonArgs::augment_args(clap::Command::new("shared"))
        .get_arguments()
        .map(|arg| arg.get_id().to_string())
        .collect()
}

/// The command line, each command's unused flags of the shared list hidden from its help.
pub(super) fn command() -> clap::Command {
    let shared = shared();
    let hide_unused = |mut command: clap::Command, used: &[&str]| {
        for id in shared.iter().filter(|id| !used.contains(&id.as_str())) {
            command = command.mut_arg(id, |arg| arg.hide(true));
        }
        command
    };
    let mut cli = Cli::command();
    let names: Vec<String> = cli
        .get_subcommands()
        .map(|sub| sub.get_name().to_string())
        .collect();
    for name in names {
        if let Some(used) = used_by(&name) {
            cli = cli.mut_subcommand(&name, |sub| hide_unused(sub, &used));
        }
    }
    // `pinboard` alone is the TUI.
    hide_unused(cli, &used_by("tui").expect("the TUI's flags"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pinboard COMMAND --help`.
    fn help(command: &str) -> String {
        let line: &[&str] = match command {
            "" => &["pinboard", "--help"],
            _ => &["pinboard", command, "--help"],
        };
        let err = super::command()
            .try_get_matches_from(line)
            .expect_err("help exits");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        err.to_string()
    }

    fn flag_in(help: &str, flag: &str) -> bool {
        help.lines().any(|l| {
            l.trim_start()
                .split([',', ' ', '='])
                .any(|word| word == flag)
        })
    }

    #[test]
    fn each_commands_help_shows_the_flags_it_uses_and_hides_the_others() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "plan",
                &[
                    "--set",
                    "--cri",
                    "--kubeconfig",
                    "--insecure-registry",
                    "--min-free",
                    "--cache-dir",
                    "--output",
                ],
                &[
                    "--fan-out",
                    "--parallel",
                    "--wait",
                    "--verify-cri",
                    "--all-sets",
                    "--cache-max",
                    "--lazy-store",
                    "--allow-lazy",
                ],
            ),
            (
                "check",
                &[
                    "--set",
                    "--cri",
                    "--wait",
                    "--timeout",
                    "--verify-cri",
                    "--allow-lazy",
                    "--containerd-config",
                    "--min-free",
                    "--output",
                ],
                &[
                    "--fan-out",
                    "--parallel",
                    "--force",
                    "--all-sets",
                    "--cache-dir",
                ],
            ),
            (
                "status",
                &["--set", "--nodes", "--authfile", "--allow-lazy", "--output"],
                &["--wait", "--verify-cri", "--fan-out", "--release-unowned"],
            ),
            (
                "apply",
                &[
                    "--set",
                    "--cri",
                    "--fan-out",
                    "--fan-out-listen",
                    "--parallel",
                    "--force",
                    "--cache-max",
                    "--timeout",
                    "--allow-lazy",
                    "--lazy-drop-in",
                ],
                &["--wait", "--verify-cri", "--all-sets", "--release-unowned"],
            ),
            (
                "lazy",
                &[
                    "--cri",
                    "--nodes",
                    "--containerd-config",
                    "--stargz-socket",
                    "--lazy-drop-in",
                    "--readonly",
                    "--restart",
                    "--output",
                    "--kubeconfig",
                    "--agents-namespace",
                ],
                &[
                    "--set",
                    "--no-pull-secret",
                    "--fan-out",
                    "--allow-lazy",
                    "--wait",
                ],
            ),
            (
                "unpin",
                &[
                    "--set",
                    "--cri",
                    "--crio-reload",
                    "--all-sets",
                    "--release-unowned",
                    "--output",
                ],
                &[
                    "--fan-out",
                    "--min-free",
                    "--wait",
                    "--cache-dir",
                    "--parallel",
                ],
            ),
            (
                "mirror",
                &[
                    "--listen",
                    "--image",
                    "--platform",
                    "--authfile",
                    "--cache-dir",
                    "--cache-max",
                ],
                &[
                    "--cri",
                    "--nodes",
                    "--kubeconfig",
                    "--no-pull-secret",
                    "--min-free",
                    "--fan-out",
                ],
            ),
            (
                "release",
                &[
                    "--pool",
                    "--exclude",
                    "--release-name",
                    "--kubeconfig",
                    "--no-pull-secret",
                    "--platform",
                    "--output",
                ],
                &[
                    "--set",
                    "--image",
                    "--cri",
                    "--nodes",
                    "--crio-config-dir",
                    "--min-free",
                    "--fan-out",
                ],
            ),
            (
                "tui",
                &[
                    "--set",
                    "--cri",
                    "--fan-out",
                    "--lazy-store",
                    "--release-unowned",
                    "--readonly",
                    "--theme",
                ],
                &[
                    "--output",
                    "--wait",
                    "--timeout",
                    "--verify-cri",
                    "--all-sets",
                ],
            ),
            (
                "",
                &["--set", "--cri", "--fan-out", "--lazy-store", "--readonly"],
                &["--output", "--wait", "--verify-cri", "--all-sets"],
            ),
        ];
        for (command, shown, hidden) in cases {
            let help = help(command);
            for flag in *shown {
                assert!(
                    flag_in(&help, flag),
                    "`{command} --help` lacks {flag}:\n{help}"
                );
            }
            for flag in *hidden {
                assert!(
                    !flag_in(&help, flag),
                    "`{command} --help` shows {flag}:\n{help}"
                );
            }
        }
    }

    #[test]
    fn every_flag_named_here_is_in_the_shared_list() {
        let shared = shared();
        for command in [
            "plan", "check", "status", "apply", "unpin", "lazy", "mirror", "release", "tui",
        ] {
            for id in used_by(command).expect("a command with the shared list") {
                assert!(shared.iter().any(|s| s == id), "{command}: no flag {id:?}");
            }
        }
    }
}

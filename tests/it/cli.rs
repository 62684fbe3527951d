//! The command line where administrators look for it: shell completions, and pinboard as a kubectl or oc
//! plugin (a binary or symlink named `kubectl-pinboard` / `oc-pinboard` on PATH), which must behave as
//! `pinboard` does and name itself as the plugin in usage.

use crate::support;

use std::process::Command;

use support::{Run, pinboard};

fn run_as(name: &str, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join(name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pinboard"), &link).unwrap();
    let out = Command::new(&link).args(args).output().unwrap();
    Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn completions_cover_every_subcommand() {
    let bash = pinboard(["completion", "bash"]);
    assert_eq!(bash.code, 0, "{}", bash.stderr);
    assert!(bash.stdout.contains("_pinboard()"), "{}", bash.stdout);
    for word in [
        "plan",
        "check",
        "release",
        "mirror",
        "--release",
        "--set",
        "--kubeconfig",
    ] {
        assert!(bash.stdout.contains(word), "bash completion lacks {word}");
    }
    let zsh = pinboard(["completion", "zsh"]);
    assert!(
        zsh.stdout.starts_with("#compdef pinboard"),
        "{}",
        zsh.stdout
    );
    let fish = pinboard(["completion", "fish"]);
    assert!(
        fish.stdout.contains("complete -c pinboard"),
        "{}",
        fish.stdout
    );
    let unknown = pinboard(["completion", "tcsh"]);
    assert_eq!(unknown.code, 2);
    assert!(
        unknown.stderr.contains("possible values: bash"),
        "{}",
        unknown.stderr
    );
}

#[test]
fn as_a_kubectl_or_oc_plugin_it_behaves_the_same_and_names_itself_so() {
    for (binary, shown) in [
        ("kubectl-pinboard", "kubectl pinboard"),
        ("oc-pinboard", "oc pinboard"),
    ] {
        let help = run_as(binary, &["plan", "--help"]);
        assert_eq!(help.code, 0, "{}", help.stderr);
        assert!(
            help.stdout.contains(&format!("Usage: {shown} plan")),
            "{}",
            help.stdout
        );
        // The same input gets the same answer and exit code.
        let args = [
            "plan",
            "--image",
            "quay.io/a/b:latest",
            "--cri",
            "unix:///nonexistent.sock",
        ];
        let plugin = run_as(binary, &args);
        let direct = pinboard(args);
        assert_eq!((plugin.code, &plugin.stderr), (direct.code, &direct.stderr));
        assert_eq!(plugin.code, 2, "a tag is refused: {}", plugin.stderr);
        let completion = run_as(binary, &["completion", "bash"]);
        assert!(
            completion
                .stdout
                .contains(&format!("_{}()", binary.replace('-', "__"))),
            "{}",
            &completion.stdout[..200.min(completion.stdout.len())]
        );
    }
}

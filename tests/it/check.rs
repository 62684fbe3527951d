//! `pinboard check` and `status` against the lab: the cases a pre-upgrade pipeline must never get wrong,
//! each built for real on containerd nodes (an image removed through CRI, an image pulled with `ctr`
//! without the pin label, a socket nothing listens on), and the exit code and reason checked.

use crate::support;

use std::time::{Duration, Instant};

use pinboard::backend::cri::{CriClient, DEFAULT_TIMEOUT};
use pinboard::model::readiness::{ImageReason, NodesStatus, Readiness};
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Run, pinboard};

const MI: u64 = 1 << 20;
const NO_NODE: &str = "n9=unix:///nonexistent/pinboard-check.sock";

/// A lab of `nodes` (32 MiB each) and `count` small images; returns their references.
fn lab(name: &str, nodes: &[&str], count: u64) -> (Lab, Vec<String>) {
    let lab = Lab::start(
        name,
        LabConfig {
            nodes: nodes.iter().map(|n| NodeSpec::new(n, 32 * MI)).collect(),
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let references = (0..count)
        .map(|i| {
            let spec = ImageSpec::small(700 + i);
            lab.push_image(&format!("check/app{i}"), &spec)
                .expect("push")
                .reference(&lab.registry_host())
        })
        .collect();
    (lab, references)
}

/// `COMMAND --image R… --insecure-registry HOST --min-free 1Mi --cri NAME=ENDPOINT… EXTRA…`
fn args(command: &str, lab: &Lab, images: &[String], extra: &[&str]) -> Vec<String> {
    let mut args = vec![command.to_string()];
    for image in images {
        args.extend(["--image".into(), image.clone()]);
    }
    args.extend(["--insecure-registry".into(), lab.registry_host()]);
    args.extend(["--min-free".into(), "1Mi".into()]);
    for node in lab.nodes() {
        args.extend(["--cri".into(), format!("{}={}", node.name, node.endpoint())]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn check_json(lab: &Lab, images: &[String], extra: &[&str]) -> (Run, Readiness) {
    let mut extra = extra.to_vec();
    extra.extend(["-o", "json"]);
    let run = pinboard(args("check", lab, images, &extra));
    let readiness = serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
        panic!(
            "check -o json prints the readiness ({e}): {}\n{}",
            run.stdout, run.stderr
        )
    });
    (run, readiness)
}

fn remove_through_cri(lab: &Lab, node: &str, image: &str) {
    let endpoint = lab.node(node).endpoint().parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = CriClient::connect(&endpoint, DEFAULT_TIMEOUT)
            .await
            .unwrap();
        client.remove_image(image).await.unwrap();
    });
}

#[test]
fn check_is_ready_after_apply_and_names_the_node_missing_an_image() {
    let (lab, images) = lab("check-missing", &["n1", "n2", "n3"], 2);
    let applied = pinboard(args("apply", &lab, &images, &[]));
    assert_eq!(
        applied.code,
        0,
        "apply: {}\n{}\nlab: {}",
        applied.stdout,
        applied.stderr,
        lab.dir().display()
    );

    let (run, ready) = check_json(&lab, &images, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(ready.ready && ready.ready_nodes == 3, "{ready:?}");
    for node in &ready.nodes {
        assert_eq!(node.pin_method.as_deref(), Some("containerd-label"));
        assert!(
            node.images
                .iter()
                .all(|i| i.present == Some(true) && i.pinned == Some(true)),
            "{node:?}"
        );
    }

    // status: the same per-node data, parsed back into the model.
    let status = pinboard(args("status", &lab, &images, &["-o", "json"]));
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status: NodesStatus = serde_json::from_str(&status.stdout).expect("status -o json parses");
    assert_eq!(status.nodes, ready.nodes);

    remove_through_cri(&lab, "n2", &images[1]);
    let (run, report) = check_json(&lab, &images, &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(!report.ready);
    assert_eq!(report.ready_nodes, 2);
    let n2 = report.nodes.iter().find(|n| n.node == "n2").unwrap();
    assert!(!n2.ready);
    assert_eq!(n2.images[1].reason, Some(ImageReason::Missing));
    assert_eq!(n2.images[0].reason, None);
    let line = format!("error: n2: 1 image missing: {}", images[1]);
    assert!(run.stderr.contains(&line), "{line:?} not in {}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);

    // The table says it too.
    let table = pinboard(args("check", &lab, &images, &[]));
    assert_eq!(table.code, 1);
    assert!(
        table.stdout.contains("✗ 1 image missing"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("✗ not ready: 2/3 nodes ready"),
        "{}",
        table.stdout
    );
}

#[test]
fn an_image_pulled_without_the_pin_label_is_present_but_not_pinned() {
    let (lab, images) = lab("check-unpinned", &["n1"], 1);
    lab.node("n1").pull(&images[0]).expect("ctr pull");
    let (run, report) = check_json(&lab, &images, &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let image = &report.nodes[0].images[0];
    assert_eq!(
        (image.present, image.pinned, image.reason),
        (Some(true), Some(false), Some(ImageReason::NotPinned))
    );
    assert!(
        run.stderr.contains("n1: 1 image present but not pinned: "),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("`pinboard apply` pins them"));
}

#[test]
fn unreachable_nodes_are_named_by_every_command_and_none_reachable_exits_3() {
    let (lab, images) = lab("check-unreachable", &["n1"], 1);
    let run = pinboard(args("check", &lab, &images, &["--cri", NO_NODE]));
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("error: n9: unreachable: ")
            && run.stderr.contains("check that the runtime is running"),
        "{}",
        run.stderr
    );

    let mut only_gone: Vec<String> = ["check", "--image", &images[0], "--cri", NO_NODE]
        .map(String::from)
        .to_vec();
    only_gone.extend(["--insecure-registry".into(), lab.registry_host()]);
    let run = pinboard(&only_gone);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stdout.is_empty());
    assert!(run.stderr.contains("n9: unreachable"), "{}", run.stderr);
    // Every command says which node it could not reach, in check's words.
    let said = "error: n9: unreachable: CRI endpoint unix:///nonexistent/";
    for command in ["status", "plan", "apply", "unpin"] {
        only_gone[0] = command.into();
        let run = pinboard(&only_gone);
        assert_eq!(run.code, 3, "{command}: {}", run.stderr);
        assert!(
            run.stderr.lines().any(|l| l.starts_with(said)),
            "{command}: {said:?} not in {}",
            run.stderr
        );
    }
}

/// `check` with stderr in a file, a warning logged on the way (an auth file that cannot be read): plain
/// text, each problem one line, `warning:` or `error:` first; with `PINBOARD_LOG=debug` the lines below
/// warning have their timestamp and module path, still without colour.
#[test]
fn check_says_each_problem_on_one_plain_line_when_stderr_is_a_file() {
    let (lab, images) = lab("check-stderr", &["n1"], 2);
    let home = tempfile::tempdir().unwrap();
    let unreadable = home.path().join(".docker/config.json");
    std::fs::create_dir_all(&unreadable).unwrap();
    let logged = |level: Option<&str>| {
        let file = home.path().join("stderr.txt");
        let stderr = std::fs::File::create(&file).unwrap();
        let run = support::pinboard_with(args("check", &lab, &images, &["--cri", NO_NODE]), |c| {
            support::isolated(home.path())(c);
            match level {
                Some(level) => c.env("PINBOARD_LOG", level),
                None => c.env_remove("PINBOARD_LOG"),
            };
            c.stderr(stderr);
        });
        assert_eq!(run.code, 1, "{}", run.stdout);
        std::fs::read_to_string(&file).unwrap()
    };

    let stderr = logged(None);
    assert!(!stderr.contains('\x1b'), "no colour in a file: {stderr:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "a warning and two problems: {stderr}");
    assert!(
        lines[0].starts_with(&format!("warning: {}: ", unreadable.display())),
        "the warning names the file: {stderr}"
    );
    assert!(lines[0].contains("--authfile"), "and the fix: {stderr}");
    assert!(
        lines[1].starts_with("error: n1: 2 images missing: ")
            && lines[2].starts_with("error: n9: unreachable: "),
        "{stderr}"
    );

    let stderr = logged(Some("debug"));
    assert!(!stderr.contains('\x1b'), "no colour in a file: {stderr:?}");
    let debug: Vec<&str> = stderr.lines().filter(|l| l.contains(" DEBUG ")).collect();
    assert!(
        debug.iter().any(|l| l.contains(" DEBUG pinboard::")),
        "debug lines name their module: {stderr}"
    );
    assert!(
        debug
            .iter()
            .all(|l| l.starts_with(|c: char| c.is_ascii_digit())),
        "and start with their time: {stderr}"
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_bad_set_exits_2_before_any_node_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("set.yaml");
    std::fs::write(
        &set,
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: s\n\
         spec:\n  pinnedImages:\n  - name: quay.io/org/app:v1\n",
    )
    .unwrap();
    let run = pinboard(&[
        "check".into(),
        "--set".into(),
        set.display().to_string(),
        "--cri".into(),
        NO_NODE.into(),
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("uses a tag, not a digest"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
}

#[test]
fn waiting_for_a_set_that_never_gets_ready_times_out_with_exit_1() {
    let (lab, images) = lab("check-wait", &["n1"], 1);
    let started = Instant::now();
    let run = pinboard(args("check", &lab, &images, &["--wait", "--timeout", "2s"]));
    let took = started.elapsed();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(
        run.stderr
            .contains("waiting: 0/1 nodes ready; n1: 1 image missing"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("waiting: timed out after 2s"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("error: n1: 1 image missing"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_pull_in_flight_is_reported_with_its_progress_not_as_plainly_missing() {
    let lab = Lab::start(
        "check-pulling",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 * MI)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed: 900,
            bytes: 4 * MI as usize,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    // Through the proxy, slowed down: the pull is still running while check looks.
    let image = lab
        .push_image("check/big", &spec)
        .expect("push")
        .reference(&lab.proxy_host());
    lab.proxy().set_bandwidth(Some(64 * 1024));
    let check = || {
        let node = format!("n1={}", lab.node("n1").endpoint());
        let args = [
            "check",
            "--image",
            &image,
            "--insecure-registry",
            &lab.proxy_host(),
        ];
        let rest = ["--cri", &node, "--min-free", "1Mi", "-o", "json"];
        let run = pinboard(args.into_iter().chain(rest));
        let report: Readiness = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", run.stdout, run.stderr));
        (run, report)
    };
    let endpoint: pinboard::backend::cri::CriEndpoint = lab.node("n1").endpoint().parse().unwrap();
    std::thread::scope(|scope| {
        let pulling = scope.spawn(|| lab.node("n1").pull(&image));
        // Wait until containerd is writing the layer.
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ingests = runtime.block_on(async {
                let client = CriClient::connect(&endpoint, DEFAULT_TIMEOUT)
                    .await
                    .unwrap();
                pinboard::backend::progress::list_ingests(client.channel())
                    .await
                    .unwrap()
            });
            if ingests.iter().any(|i| i.offset > 0) {
                break;
            }
            assert!(Instant::now() < deadline, "the pull never started writing");
            std::thread::sleep(Duration::from_millis(100));
        }
        let (run, report) = check();
        lab.proxy().set_bandwidth(None);
        pulling
            .join()
            .unwrap()
            .expect("the pull finishes once the link is fast");

        assert_eq!(run.code, 1, "{}", run.stderr);
        let seen = &report.nodes[0].images[0];
        assert_eq!(seen.reason, Some(ImageReason::Pulling), "{}", run.stdout);
        let pull = seen.pulling.as_ref().unwrap();
        assert!(
            pull.done_bytes > 0 && pull.done_bytes < pull.total_bytes,
            "{pull:?}"
        );
        assert!(pull.total_bytes >= 4 * MI, "{pull:?}");
        assert!(
            run.stderr.contains("n1: 1 image pulling now: ") && run.stderr.contains(" in 1 blob, "),
            "{}",
            run.stderr
        );
    });
    // And once it is there, it is only not pinned (ctr does not pin).
    let (run, report) = check();
    assert_eq!(run.code, 1);
    assert_eq!(
        report.nodes[0].images[0].reason,
        Some(ImageReason::NotPinned)
    );
}

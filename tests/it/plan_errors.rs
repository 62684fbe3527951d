//! Bad input to `pinboard plan`: one clear message naming the problem, exit 2 for bad input and 3 for
//! unreachable targets, and nothing on stdout.

use crate::support;

use std::time::{Duration, Instant};

use pinboard::model::reference::short_reference;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Run, pinboard};

const D: &str = "sha256:4198606580b69c8335ad7ae531c3a74e51aee25db5faaf368234e8c8dae5cbea";
/// Nothing listens here: input checks must fail before pinboard ever connects.
const NO_NODE: &str = "unix:///nonexistent/pinboard-test.sock";

fn plan(args: &[&str]) -> Run {
    pinboard(std::iter::once("plan").chain(args.iter().copied()))
}

fn assert_refused(run: &Run, code: i32, needles: &[&str]) {
    assert_eq!(run.code, code, "stderr: {}", run.stderr);
    assert!(
        run.stdout.is_empty(),
        "nothing on stdout, got: {}",
        run.stdout
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "{needle:?} not in: {}",
            run.stderr
        );
    }
    assert!(
        run.stderr.lines().all(|l| l.starts_with("error: ")),
        "one error line per problem: {}",
        run.stderr
    );
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn a_tag_is_refused_with_the_way_to_get_the_digest() {
    let run = plan(&["--image", "quay.io/org/app:v1.2", "--cri", NO_NODE]);
    assert_refused(
        &run,
        2,
        &[
            "--image #1: quay.io/org/app:v1.2: uses a tag, not a digest",
            "docker://quay.io/org/app:v1.2",
        ],
    );
    assert_eq!(run.stderr.lines().count(), 1);
}

#[test]
fn localhost_registry_is_refused() {
    let run = plan(&[
        "--image",
        &format!("localhost:5000/app@{D}"),
        "--cri",
        NO_NODE,
    ]);
    assert_refused(
        &run,
        2,
        &[
            "registry host \"localhost:5000\" has no dot",
            "127.0.0.1:5000",
        ],
    );
}

#[test]
fn two_namespace_segments_are_refused_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let list = write(
        &dir,
        "images.txt",
        &format!("# ok\nquay.io/ns/app@{D}\nquay.io/a/b/c@{D}\n"),
    );
    let run = plan(&["--images-file", &list, "--cri", NO_NODE]);
    assert_refused(
        &run,
        2,
        &[
            &format!("{list}:3: quay.io/a/b/c@{D}"),
            "more than one namespace segment",
        ],
    );
}

#[test]
fn a_duplicate_names_both_places() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: s\nspec:\n  \
         pinnedImages:\n  - name: quay.io/app@{D}\n  - name: quay.io/app@{D}\n"
    );
    let set = write(&dir, "set.yaml", &yaml);
    let run = plan(&["--set", &set, "--cri", NO_NODE]);
    assert_refused(
        &run,
        2,
        &[&format!(
            "{set}:8: quay.io/app@{D}: duplicate of the entry at {set}:7"
        )],
    );
}

#[test]
fn more_than_500_entries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..501).map(|i| format!("quay.io/app{i}@{D}")).collect();
    let list = write(&dir, "big.txt", &lines.join("\n"));
    let run = plan(&["--images-file", &list, "--cri", NO_NODE]);
    assert_refused(
        &run,
        2,
        &[
            "has 501 images, over the PinnedImageSet limit of 500",
            "split it into several sets",
        ],
    );
}

#[test]
fn malformed_yaml_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let set = write(
        &dir,
        "bad.yaml",
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nspec:\n  pinnedImages: [\n",
    );
    let run = plan(&["--set", &set, "--cri", NO_NODE]);
    assert_refused(
        &run,
        2,
        &[&format!("{set}:"), "not a valid PinnedImageSet YAML"],
    );
    assert_eq!(run.stderr.lines().count(), 1);
}

#[test]
fn a_missing_file_is_refused() {
    let run = plan(&["--set", "/nonexistent/set.yaml", "--cri", NO_NODE]);
    assert_refused(&run, 2, &["cannot read /nonexistent/set.yaml"]);
}

#[test]
fn an_unreachable_cri_endpoint_exits_3() {
    let run = plan(&[
        "--image",
        &format!("quay.io/app@{D}"),
        "--cri",
        &format!("n1={NO_NODE}"),
    ]);
    assert_refused(
        &run,
        3,
        &[
            &format!("error: n1: unreachable: CRI endpoint {NO_NODE}: connect:"),
            "No such file or directory",
            "check that the runtime is running",
        ],
    );
}

#[test]
fn a_bad_endpoint_or_limit_is_bad_input() {
    assert_refused(
        &plan(&[
            "--image",
            &format!("quay.io/app@{D}"),
            "--cri",
            "n1=http://x",
        ]),
        2,
        &["is not unix:///"],
    );
    let run = plan(&[
        "--image",
        &format!("quay.io/app@{D}"),
        "--cri",
        NO_NODE,
        "--min-free",
        "16GB",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("16Gi"), "{}", run.stderr);
}

#[test]
fn unknown_registries_and_missing_manifests_are_bad_input() {
    let lab = Lab::start(
        "plan-errors",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 32 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let image = lab
        .push_image(
            "errors/app",
            &ImageSpec {
                layers: vec![LayerSpec {
                    seed: 9,
                    bytes: 1000,
                    format: LayerFormat::Gzip,
                }],
                ..Default::default()
            },
        )
        .unwrap();
    let host = lab.registry_host();
    let node = format!("n1={}", lab.node("n1").endpoint());
    let base = |image: &str| {
        plan(&[
            "--image",
            image,
            "--cri",
            &node,
            "--insecure-registry",
            &host,
            "--min-free",
            "1Mi",
        ])
    };

    let unknown = base(&format!("registry.does-not-exist.invalid/app@{D}"));
    assert_refused(&unknown, 2, &["registry.does-not-exist.invalid"]);

    let missing = base(&format!("{host}/errors/app@{D}"));
    assert_refused(
        &missing,
        2,
        &[&format!("{host}/errors/app@{D}"), "does not exist"],
    );

    // The image that exists plans fine on the same node: the failures above were about the references.
    let ok = base(&image.reference(&host));
    assert_eq!(ok.code, 0, "{}", ok.stderr);

    // A plain-HTTP registry without --insecure-registry, for 12 images: one line, with the count and the
    // first few, and the fix.
    let mut args = vec![
        "--cri".to_string(),
        node.clone(),
        "--min-free".into(),
        "1Mi".into(),
    ];
    for i in 0..12 {
        args.extend(["--image".into(), format!("{host}/errors/app{i}@{D}")]);
    }
    let plain = pinboard(std::iter::once("plan".to_string()).chain(args));
    assert_refused(
        &plain,
        2,
        &[
            &format!("registry {host} for {host}/errors/app0@{D}"),
            &format!("pass --insecure-registry {host}"),
            &format!("(12 images: {host}/errors/app0@sha256:419860658"),
            " and 7 more)",
        ],
    );
    assert_eq!(plain.stderr.lines().count(), 1, "{}", plain.stderr);
}

#[test]
fn a_busy_registry_is_asked_again_and_named_with_its_status_when_it_stays_busy() {
    let lab = Lab::with_nodes("plan-busy", vec![NodeSpec::new("n1", 32 << 20)]);
    let proxy = lab.proxy_host();
    let references: Vec<String> = (0..3u64)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 20 + i,
                    bytes: 1000,
                    format: LayerFormat::Gzip,
                }],
                ..Default::default()
            };
            lab.push_image(&format!("busy/app{i}"), &spec)
                .unwrap()
                .reference(&proxy)
        })
        .collect();
    let node = format!("n1={}", lab.node("n1").endpoint());
    let mut args = vec![
        "--cri",
        &node,
        "--insecure-registry",
        &proxy,
        "--min-free",
        "1Mi",
    ];
    for reference in &references {
        args.extend(["--image", reference]);
    }
    let manifest_gets = |from: usize| {
        lab.proxy().request_heads()[from..]
            .iter()
            .filter(|h| h.starts_with("GET ") && h.contains("/manifests/"))
            .count()
    };
    let timed_plan = || {
        let (from, started) = (lab.proxy().request_heads().len(), Instant::now());
        let run = plan(&args);
        (run, manifest_gets(from), started.elapsed())
    };

    // 503 to the next five manifest reads: each asked again (after 0.5 s, 1 s, ...), and planned.
    lab.proxy().fail_requests_for("/manifests/", 503, 5, None);
    let (run, gets, _) = timed_plan();
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(lab.proxy().pending_errors(), 0, "every 503 was answered");
    assert_eq!(gets, 3 + 5, "each refused read asked again once");

    // 429 with Retry-After: 2: waited for.
    lab.proxy()
        .fail_requests_for("/manifests/", 429, 3, Some(2));
    let (run, gets, took) = timed_plan();
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(gets, 3 + 3);
    assert!(
        took >= Duration::from_secs(2),
        "Retry-After was honoured: {took:?}"
    );

    // A registry that stays unavailable: four tries per image, then the plan fails naming it and the status.
    lab.proxy()
        .fail_requests_for("/manifests/", 503, 1000, None);
    let (run, gets, took) = timed_plan();
    eprintln!(
        "503 throughout: exit {} after {took:?}:\n{}",
        run.code, run.stderr
    );
    assert_ne!(run.code, 0);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    // The same problem for every image: one line, naming the first image and then all three.
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].contains(&format!("registry {proxy} failed for {}", references[0]))
            && lines[0].contains("HTTP 503")
            && lines[0].contains("(3 images: "),
        "{}",
        run.stderr
    );
    for reference in &references {
        assert!(
            lines[0].contains(&short_reference(reference)),
            "{}",
            lines[0]
        );
    }
    assert_eq!(gets, 3 * 4, "four tries per image");
    assert!(took < Duration::from_secs(15), "bounded: {took:?}");

    // Asked to wait longer than pinboard waits (an hour): refused at once, saying the registry rate-limits.
    lab.proxy().clear_faults();
    lab.proxy()
        .fail_requests_for("/manifests/", 429, 1000, Some(3600));
    let (run, gets, took) = timed_plan();
    eprintln!(
        "429 for an hour: exit {} after {took:?}:\n{}",
        run.code, run.stderr
    );
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains(&format!("registry {proxy} is rate-limiting requests for")),
        "{}",
        run.stderr
    );
    assert_eq!(gets, 3, "not asked again");
    lab.proxy().clear_faults();
}

//! What CRI-O versions before the lab's real 1.33 do with pins, against the CRI-O stand-in
//! (`tests/it/support/crio.rs`), which plays their documented behaviour by version (docs/runtimes.md):
//! what pinboard must catch on them and how it recovers. What CRI-O 1.33 does is tested on the real
//! CRI-O (`crio.rs`, `runtimes.rs`).
//!
//! - A reload CRI-O 1.29.2 ignores (cri-o #7954): the drop-in lists the images, CRI-O does not pin them,
//!   `check` says so with the fix; after a restart it is ready, though 1.29.2's ImageStatus never reports
//!   pins (the word comes from one ListImages).
//! - `apply` on 1.29.2 ends not pinned, with the fix; with `--crio-reload restart` (`systemctl restart
//!   crio`, a `systemctl` that restarts the stand-in first on PATH) it ends pinned, CRI-O restarted once,
//!   confirmed across the dropped CRI connection, also when `systemctl` returns before CRI-O serves again.

use crate::support;

use std::path::Path;
use std::time::Duration;

use pinboard::backend::cri::CriClient;
use pinboard::backend::pins::{CRIO_DROP_IN, read_crio_pins};
use pinboard::model::readiness::{ImageReason, PinnedBy, Readiness};
use support::crio::CrioStandIn;
use support::{ImageSpec, Lab, LabConfig, Run, pinboard, pinboard_with};

/// `registry.example.com/ns/appN@sha256:…`: names only the stand-in's storage holds.
fn example_images(count: u64) -> Vec<String> {
    (0..count)
        .map(|i| format!("registry.example.com/ns/app{i}@sha256:{:064x}", 0xc0de + i))
        .collect()
}

/// `check -o json` on the stand-in as node n1, its drop-ins in its config dir.
fn check(crio: &CrioStandIn, images: &[String]) -> (Run, Readiness) {
    let mut args = vec![
        "check".to_string(),
        "--cri".into(),
        format!("n1={}", crio.endpoint()),
        "--crio-config-dir".into(),
        crio.config_dir().display().to_string(),
        "-o".into(),
        "json".into(),
    ];
    for image in images {
        args.extend(["--image".into(), image.clone()]);
    }
    let run = pinboard(&args);
    let readiness = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("check -o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run, readiness)
}

/// Writes `file` in the config dir setting `pinned_images` to `patterns`, in the daemon's shape.
fn set_pins(dir: &Path, file: &str, patterns: &[&str]) {
    let quoted: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        dir.join(file),
        format!(
            "[crio]\n  [crio.image]\n    pinned_images = [{}]\n",
            quoted.join(", ")
        ),
    )
    .unwrap();
}

/// Per image, `pinned` as ListImages and as ImageStatus report it.
fn reported(crio: &CrioStandIn, images: &[String]) -> Vec<(bool, bool)> {
    let endpoint = crio.endpoint().parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = CriClient::connect(&endpoint, Duration::from_secs(10))
            .await
            .unwrap();
        let listed = client.list_images().await.unwrap();
        let mut both = Vec::new();
        for image in images {
            let in_list = listed
                .iter()
                .find(|i| i.repo_digests.contains(image))
                .unwrap_or_else(|| panic!("{image} is listed"));
            let status = client.image_status(image).await.unwrap().unwrap();
            both.push((in_list.pinned, status.pinned));
        }
        both
    })
}

#[test]
fn a_reload_crio_1_29_2_ignores_is_caught_and_a_restart_makes_it_ready() {
    let mut crio = CrioStandIn::start("crio-reload-ignored", "1.29.2", &[]).expect("stand-in");
    let images = example_images(3);
    for image in &images {
        crio.store(&[image]).unwrap();
    }
    // What the OpenShift daemon does: the drop-in, then `systemctl reload crio` (SIGHUP).
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    set_pins(crio.config_dir(), CRIO_DROP_IN, &refs);
    crio.reload().unwrap();

    let (run, report) = check(&crio, &images);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let line = "error: n1: 3 images listed in 50-pinned-images are not pinned by CRI-O 1.29.2: its reload \
                did not apply pinned_images (cri-o #7954, fixed in 1.29.4); restart CRI-O \
                (`systemctl restart crio` keeps running containers";
    assert!(run.stderr.contains(line), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    let n1 = &report.nodes[0];
    assert_eq!(n1.pinned_by, Some(PinnedBy::Runtime));
    assert!(
        n1.images.iter().all(|i| i.present == Some(true)
            && i.pinned == Some(false)
            && i.reason == Some(ImageReason::NotPinned)),
        "{n1:?}"
    );
    // Presence and pins of the whole set came from one ListImages, not one ImageStatus per image.
    let calls = crio.counts().calls;
    assert_eq!(calls.get("ListImages"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("ImageStatus"), None, "{calls:?}");

    // A restart reads the files again: pinned, though 1.29.2's ImageStatus still never says so.
    crio.restart().unwrap();
    assert!(
        reported(&crio, &images)
            .iter()
            .all(|&both| both == (true, false)),
        "ListImages pinned, ImageStatus not"
    );
    let (run, report) = check(&crio, &images);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        report.ready
            && report.nodes[0]
                .images
                .iter()
                .all(|i| i.pinned == Some(true))
    );
}

/// A lab with only its registry, `count` small images pushed to it, and a stand-in of `version` that
/// pulls from it.
fn pull_lab(name: &str, version: &str, count: u64) -> (Lab, CrioStandIn, Vec<String>) {
    let lab = Lab::start(name, LabConfig::default()).expect("lab starts");
    let images = (0..count)
        .map(|i| {
            let spec = ImageSpec::small(1300 + i);
            lab.push_image(&format!("crio/app{i}"), &spec)
                .expect("push")
                .reference(&lab.registry_host())
        })
        .collect();
    let crio = CrioStandIn::start(name, version, &[lab.registry_host()]).expect("stand-in");
    (lab, crio, images)
}

/// `apply -o json` onto the stand-in, reloading it through its pidfile.
fn apply(lab: &Lab, crio: &CrioStandIn, images: &[String]) -> (Run, serde_json::Value) {
    run_json("apply", lab, crio, images)
}

/// `COMMAND -o json` onto the stand-in with apply's argument list, reloading it through its pidfile.
fn run_json(
    command: &str,
    lab: &Lab,
    crio: &CrioStandIn,
    images: &[String],
) -> (Run, serde_json::Value) {
    run_json_with(command, lab, crio.node_args("n1"), images, |_| {})
}

/// [`run_json`] with the node given by `node` (pinboard's arguments for it) and pinboard's command adjusted
/// by `adjust`.
fn run_json_with(
    command: &str,
    lab: &Lab,
    node: Vec<String>,
    images: &[String],
    adjust: impl FnOnce(&mut std::process::Command),
) -> (Run, serde_json::Value) {
    let mut args = vec![command.to_string()];
    args.extend(node);
    args.extend([
        "--insecure-registry".into(),
        lab.registry_host(),
        "--min-free".into(),
        "1Mi".into(),
        "-o".into(),
        "json".into(),
    ]);
    for image in images {
        args.extend(["--image".into(), image.clone()]);
    }
    let run = pinboard_with(&args, adjust);
    let report = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{command} -o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run, report)
}

#[test]
fn apply_onto_crio_1_29_2_ends_not_pinned_with_the_restart_as_the_fix() {
    let (lab, crio, images) = pull_lab("crio-apply-1-29-2", "1.29.2", 2);
    let (run, report) = apply(&lab, &crio, &images);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let n1 = &report["rollout"][0];
    assert_eq!(n1["state"], "pin-failed", "{n1}");
    let reason = n1["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "2 images listed in 50-pinned-images are not pinned by CRI-O 1.29.2: its reload did not apply \
             pinned_images (cri-o #7954, fixed in 1.29.4); restart CRI-O"
        ) && reason.contains("--crio-reload restart"),
        "{reason}"
    );
    assert!(
        run.stderr
            .contains("n1: pinning failed: 2 images listed in 50-pinned-images are not pinned"),
        "{}",
        run.stderr
    );
    assert_eq!(
        read_crio_pins(crio.config_dir()).unwrap().len(),
        2,
        "written"
    );
    assert_eq!(crio.counts().reloads, 1, "signalled through the pidfile");
    assert_eq!(report["readiness"]["ready"], false);

    // The file is as wanted now, but CRI-O still does not pin it: apply reloads again rather than
    // trusting the file.
    let (run, _) = apply(&lab, &crio, &images);
    assert_eq!(run.code, 1);
    assert_eq!(crio.counts().reloads, 2);
}

/// `apply -o json` onto the stand-in with `--crio-reload restart`, the stand-in's `systemctl` first on
/// pinboard's PATH (returning once CRI-O serves again when `waits`, at once otherwise).
fn apply_restarting(
    lab: &Lab,
    crio: &CrioStandIn,
    images: &[String],
    waits: bool,
) -> (Run, serde_json::Value) {
    let bin = crio.systemctl(waits).expect("systemctl");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let node = crio.node_args_reloading("n1", "restart");
    run_json_with("apply", lab, node, images, |command| {
        command.env("PATH", path);
    })
}

#[test]
fn apply_with_crio_reload_restart_onto_crio_1_29_2_restarts_it_once_and_ends_pinned_as_crio_confirms()
 {
    let (lab, crio, images) = pull_lab("crio-apply-restart", "1.29.2", 2);
    let (run, report) = apply_restarting(&lab, &crio, &images, true);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &report["rollout"][0];
    assert_eq!(n1["state"], "pinned", "{n1}");
    // The engine's CRI connection died with the process it reached; it asked the new one.
    assert_eq!(
        n1["confirmed"], true,
        "confirmed by CRI-O after its restart: {n1}"
    );
    assert_eq!(report["readiness"]["ready"], true, "{report}");
    assert_eq!(crio.systemctl_calls(), ["restart crio"]);
    let counts = crio.counts();
    assert_eq!(counts.starts, 2, "started, then restarted once");
    assert_eq!(counts.reloads, 0, "no SIGHUP, which 1.29.2 would ignore");
    assert_eq!(
        counts.calls.get("PullImage"),
        Some(&2),
        "{:?}",
        counts.calls
    );
    let mut listed = read_crio_pins(crio.config_dir()).unwrap();
    listed.sort();
    let mut wanted = images.clone();
    wanted.sort();
    assert_eq!(listed, wanted, "the drop-in lists the set");
    assert!(
        reported(&crio, &images)
            .iter()
            .all(|&both| both == (true, false)),
        "ListImages pinned (1.29.2's ImageStatus never says)"
    );

    // Applied again: pinned as CRI-O reports, nothing to write, no second restart.
    let (run, report) = apply_restarting(&lab, &crio, &images, true);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(report["rollout"][0]["confirmed"], true, "{report}");
    assert_eq!(crio.systemctl_calls(), ["restart crio"]);
    assert_eq!(crio.counts().starts, 2);
}

#[test]
fn apply_with_crio_reload_restart_confirms_the_pins_through_a_restart_still_under_way() {
    let (lab, crio, images) = pull_lab("crio-apply-restart-async", "1.29.2", 2);
    // systemctl returns while CRI-O is still starting: the first confirmations find the connection gone
    // and the socket refusing, and pinboard keeps asking until CRI-O answers.
    let (run, report) = apply_restarting(&lab, &crio, &images, false);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &report["rollout"][0];
    assert_eq!(n1["state"], "pinned", "{n1}");
    assert_eq!(n1["confirmed"], true, "{n1}");
    assert_eq!(crio.systemctl_calls(), ["restart crio"]);
    assert_eq!(crio.counts().starts, 2, "restarted once");
}

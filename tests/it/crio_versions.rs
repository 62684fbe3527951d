//! Pins on CRI-O as CRI-O enforces them, through the real `pinboard` binary against the CRI-O stand-in
//! (`tests/it/support/crio.rs`, as CRI-O cannot run here): its version decides which calls report `pinned`
//! and whether a reload applies pin changes, and it reads its drop-ins as CRI-O does.
//!
//! - A reload CRI-O 1.29.2 ignores (cri-o #7954): the drop-in lists the images, CRI-O does not pin them,
//!   `check` says so with the fix; after a restart it is ready, though 1.29.2's ImageStatus never reports
//!   pins (the word comes from one ListImages).
//! - An administrator's glob pins the set; a later drop-in replaces it, and `check` names that file.
//! - `apply` writes the drop-in, signals the pidfile's process and ends pinned as the runtime confirms; on
//!   1.29.2 it ends not pinned, with the fix; with `--crio-reload restart` (`systemctl restart crio`, a
//!   `systemctl` that restarts the stand-in first on PATH) it ends pinned, CRI-O restarted once, confirmed
//!   across the dropped CRI connection.
//! - Unpinning one of two sets keeps, as CRI-O itself reports, the pins the other set holds.
//! - `plan` measures the image filesystem ImageFsInfo names (the stand-in's tmpfs) and refuses a set that
//!   does not fit; forced, the pull fills it and fails with `no space left on device`.
//! - Fan-out writes a registries.conf.d drop-in that keeps the administrator's mirrors and removes it;
//!   one left by a killed pinboard does not stop CRI-O pulling, and the next command removes it.

use crate::support;

use std::path::Path;
use std::time::Duration;

use pinboard::backend::cri::CriClient;
use pinboard::backend::pins::{CRIO_DROP_IN, read_crio_pins};
use pinboard::backend::wiring::CRIO_DROP_IN as WIRING_DROP_IN;
use pinboard::model::readiness::{ImageReason, PinnedBy, Readiness};
use support::crio::CrioStandIn;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, Run, pinboard, pinboard_with};

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

#[test]
fn an_admin_glob_pins_the_set_and_a_later_drop_in_that_replaces_it_is_named() {
    let crio = CrioStandIn::start("crio-admin-glob", "1.31.0", &[]).expect("stand-in");
    let images = example_images(2);
    for image in &images {
        crio.store(&[image]).unwrap();
    }
    // Another image the glob does not reach, pinned by nothing: not in the set, not judged.
    crio.store(&["quay.io/other/tool@sha256:0000000000000000000000000000000000000000000000000000000000000001"])
        .unwrap();
    set_pins(
        crio.config_dir(),
        "10-site.conf",
        &["registry.example.com/ns/*"],
    );
    crio.reload().unwrap();

    let (run, report) = check(&crio, &images);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(report.nodes[0].pinned_by, Some(PinnedBy::Runtime));
    assert!(
        !crio.config_dir().join(CRIO_DROP_IN).exists(),
        "check writes nothing"
    );

    // A later file that sets pinned_images replaces the array: nothing merged.
    set_pins(crio.config_dir(), "99-override.conf", &["quay.io/other/*"]);
    crio.reload().unwrap();
    let (run, report) = check(&crio, &images);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(
            "error: n1: 2 images listed in 10-site.conf are not pinned by CRI-O 1.31.0: 99-override.conf \
             replaces pinned_images; add them to 99-override.conf or remove pinned_images from it"
        ),
        "{}",
        run.stderr
    );
    assert!(!report.ready);
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

#[test]
fn plan_measures_the_image_filesystem_crio_names_and_a_forced_pull_that_fills_it_fails_for_no_space()
 {
    let name = "crio-imagefs-full";
    let lab = Lab::start(name, LabConfig::default()).expect("lab starts");
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed: 1500,
            bytes: 5 << 20,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let image = lab
        .push_image("crio/big", &spec)
        .expect("push")
        .reference(&lab.registry_host());
    let crio = CrioStandIn::start_on_tmpfs(name, "1.31.0", &[lab.registry_host()], 4 << 20)
        .expect("stand-in");
    let images = [image];
    let (run, plan) = run_json("plan", &lab, &crio, &images);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &plan["nodes"][0];
    // statvfs of the storage ImageFsInfo names: the stand-in's tmpfs, not the disk under it.
    assert_eq!(n1["capacityBytes"], 4 << 20, "{n1}");
    assert_eq!(n1["verdict"], "no-space", "{n1}");

    // Forced, the pull runs and fills the image filesystem, as on a real CRI-O.
    let node = crio.node_args("n1");
    let (run, report) = run_json_with("apply", &lab, node, &images, |command| {
        command.arg("--force");
    });
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let n1 = &report["rollout"][0];
    assert!(
        n1["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no space left on device")),
        "{n1}"
    );
    assert_eq!(crio.counts().calls.get("PullImage"), Some(&1));
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
fn apply_onto_crio_1_31_writes_the_drop_in_signals_it_and_ends_pinned_as_crio_confirms() {
    let (lab, crio, images) = pull_lab("crio-apply-1-31", "1.31.0", 2);
    let (run, report) = apply(&lab, &crio, &images);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &report["rollout"][0];
    assert_eq!(n1["state"], "pinned", "{n1}");
    assert_eq!(n1["confirmed"], true, "confirmed by the runtime: {n1}");
    assert_eq!(
        crio.counts().calls.get("PullImage"),
        Some(&2),
        "pulled through the stand-in"
    );
    assert_eq!(report["readiness"]["ready"], true);
    let mut listed = read_crio_pins(crio.config_dir()).unwrap();
    listed.sort();
    let mut wanted = images.clone();
    wanted.sort();
    assert_eq!(listed, wanted, "the drop-in lists the set");
    assert_eq!(crio.counts().reloads, 1, "one SIGHUP, through the pidfile");
    assert!(reported(&crio, &images).iter().all(|&b| b == (true, true)));

    // A second apply changes nothing: no write, no reload.
    let (run, _) = apply(&lab, &crio, &images);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(crio.counts().reloads, 1);
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

#[test]
fn unpinning_one_set_on_crio_1_31_keeps_what_crio_pins_for_the_other() {
    let (lab, crio, images) = pull_lab("crio-unpin-holders", "1.31.0", 3);
    // Two sets without a name, from --image flags: x, y and y, z.
    let (a, b) = (&images[..2], &images[1..]);
    for set in [a, b] {
        let (run, report) = apply(&lab, &crio, set);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        assert_eq!(report["rollout"][0]["confirmed"], true, "{report}");
    }
    assert!(reported(&crio, &images).iter().all(|&b| b == (true, true)));

    // Unpinning the first, with the argument list that applied it: CRI-O itself still pins y and z.
    let (run, report) = run_json("unpin", &lab, &crio, a);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        report["nodes"][0]["unpinned"],
        serde_json::json!([images[0]])
    );
    let b_name = &report["nodes"][0]["kept"][0]["heldBy"]["sets"][0];
    assert_eq!(report["nodes"][0]["kept"][0]["ref"], images[1].as_str());
    assert!(b_name.as_str().unwrap().starts_with("images-"), "{report}");
    // unpin signals CRI-O and returns: its reload may still be under way.
    crio.wait_reloads(3)
        .expect("CRI-O reloaded after the unpin");
    assert_eq!(
        crio.counts().reloads,
        3,
        "two applies and one unpin, one SIGHUP each"
    );
    assert_eq!(
        reported(&crio, &images),
        [(false, false), (true, true), (true, true)],
        "as CRI-O reports them after the reload"
    );
    let (run, _) = run_json("check", &lab, &crio, b);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// A CRI-O node (1.31) with an administrator's mirror for the lab registry, and three images there that
/// share a base layer, to fan out.
struct FanOutOnCrio {
    lab: Lab,
    proxy: String,
    images: Vec<String>,
    crio: CrioStandIn,
    site: std::path::PathBuf,
    site_text: String,
    /// The rules in force with the administrator's file alone.
    admins: Vec<String>,
    cache: tempfile::TempDir,
}

impl FanOutOnCrio {
    fn start(name: &str) -> FanOutOnCrio {
        let lab = Lab::start(name, LabConfig::default()).expect("lab starts");
        let proxy = lab.proxy_host();
        let images: Vec<String> = (0..3u64)
            .map(|i| {
                let spec = ImageSpec {
                    layers: [1400, 1410 + i]
                        .map(|seed| LayerSpec {
                            seed,
                            bytes: 256 * 1024,
                            format: LayerFormat::Gzip,
                        })
                        .to_vec(),
                    ..ImageSpec::default()
                };
                lab.push_image(&format!("crio/fan{i}"), &spec)
                    .expect("push")
                    .reference(&proxy)
            })
            .collect();
        let crio =
            CrioStandIn::start(name, "1.31.0", std::slice::from_ref(&proxy)).expect("stand-in");
        // The administrator's own mirror for the registry, which fan-out's drop-in must not drop.
        let site = crio.registries_dir().join("10-site.conf");
        let site_text = format!(
            "[[registry]]\nprefix = \"{proxy}\"\nlocation = \"{proxy}\"\n\n[[registry.mirror]]\n\
             location = \"127.0.0.1:9/site-mirror\"\ninsecure = true\npull-from-mirror = \"digest-only\"\n"
        );
        std::fs::write(&site, &site_text).unwrap();
        crio.reload().expect("reload");
        let admins = vec![format!("{proxy} -> 127.0.0.1:9/site-mirror")];
        assert_eq!(crio.counts().registries.last(), Some(&admins));
        FanOutOnCrio {
            lab,
            proxy,
            images,
            crio,
            site,
            site_text,
            admins,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    /// `COMMAND` for node n1 with apply's fan-out arguments and the images.
    fn args(&self, command: &str) -> Vec<String> {
        let mut args = vec![
            command.to_string(),
            "--fan-out".into(),
            "--cache-dir".into(),
            self.cache.path().display().to_string(),
            "--crio-registries-dir".into(),
            self.crio.registries_dir().display().to_string(),
            "--insecure-registry".into(),
            self.proxy.clone(),
            "--min-free".into(),
            "1Mi".into(),
            "-o".into(),
            "json".into(),
        ];
        args.extend(self.crio.node_args("n1"));
        for image in &self.images {
            args.extend(["--image".into(), image.clone()]);
        }
        args
    }

    /// The files in CRI-O's registries.conf.d, by name.
    fn registries_files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.crio.registries_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

#[test]
fn fan_out_to_crio_writes_a_registries_drop_in_carrying_the_administrators_mirrors_and_removes_it()
{
    let setup = FanOutOnCrio::start("crio-fan-out");
    let (lab, proxy, crio) = (&setup.lab, &setup.proxy, &setup.crio);
    let from = lab.proxy().request_heads().len();
    let run = pinboard(setup.args("apply"));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["rollout"][0]["state"], "pinned", "{report}");

    // CRI-O pulled every image from pinboard's endpoint, which the drop-in named before the site mirror.
    let counts = crio.counts();
    let endpoints: Vec<(&String, &u64)> = counts.pulled_from.iter().collect();
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    let endpoint = endpoints[0].0;
    assert_ne!(endpoint, proxy, "not from the registry itself");
    assert_eq!(*endpoints[0].1, 3);
    let wired = vec![format!(
        "{proxy} -> {endpoint}/{proxy}, 127.0.0.1:9/site-mirror"
    )];
    assert!(
        counts.registries.contains(&wired),
        "CRI-O had the endpoint first, then the site's mirror: {:?}",
        counts.registries
    );
    let heads: Vec<String> = lab.proxy().request_heads()[from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    assert!(
        heads
            .iter()
            .filter(|h| h.contains("/blobs/"))
            .all(|h| h.contains("user-agent: pinboard/")),
        "only pinboard fetched blobs from the registry: {heads:?}"
    );
    let shared = heads
        .iter()
        .filter(|h| h.starts_with("get ") && h.contains("/blobs/"))
        .count();
    // The survey reads the 3 configs too, for their layers' uncompressed digests: CRI-O matches the layers
    // it holds by them.
    assert_eq!(
        shared,
        3 + 3 + 1 + 3,
        "3 configs, 3 own layers, the shared base once, and the configs the survey read"
    );

    // Afterwards: the drop-in gone, CRI-O reloaded onto the administrator's rules alone.
    assert_eq!(setup.registries_files(), ["10-site.conf"]);
    assert_eq!(
        std::fs::read_to_string(&setup.site).unwrap(),
        setup.site_text
    );
    assert_eq!(
        counts.registries.last(),
        Some(&setup.admins),
        "in force again after the last reload"
    );
    assert_eq!(
        counts.reloads,
        1 + 3,
        "the test's, then fan-out's drop-in, the pins, the drop-in's removal"
    );
}

#[test]
fn a_fan_out_drop_in_left_by_a_killed_pinboard_does_not_stop_crio_pulling_and_the_next_command_removes_it()
 {
    let setup = FanOutOnCrio::start("crio-fan-out-killed");
    let (lab, proxy, crio) = (&setup.lab, &setup.proxy, &setup.crio);
    let left = crio.registries_dir().join(WIRING_DROP_IN);
    // Slow enough that pinboard is killed while CRI-O pulls through its endpoint.
    lab.proxy().set_bandwidth(Some(64 * 1024));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(setup.args("apply"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pinboard starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(left.exists() && crio.counts().registries.last() != Some(&setup.admins)) {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the drop-in was never in force"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    lab.proxy().set_bandwidth(None);
    assert!(left.exists(), "a killed pinboard cleans nothing up");

    // Its endpoint is gone, and so is the site's mirror: CRI-O goes on to the registry.
    let before = crio.counts().pulled_from.get(proxy).copied().unwrap_or(0);
    let image = setup.images[2].clone();
    let pulled = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let endpoint = crio.endpoint().parse().expect("an endpoint");
        let client = CriClient::connect(&endpoint, Duration::from_secs(10)).await?;
        client
            .pull_image(&image, None, Duration::from_secs(60))
            .await
    });
    assert!(pulled.is_ok(), "{pulled:?}");
    assert_eq!(crio.counts().pulled_from.get(proxy), Some(&(before + 1)));

    // The next command that touches the node removes the drop-in and reloads CRI-O onto the
    // administrator's rules.
    let reloads = crio.counts().reloads;
    let status = pinboard(setup.args("status"));
    let restored: Vec<&str> = status
        .stderr
        .lines()
        .filter(|l| l.contains("restored, left by pinboard pid"))
        .collect();
    assert_eq!(restored.len(), 1, "{}", status.stderr);
    assert!(restored[0].contains(WIRING_DROP_IN), "{}", restored[0]);
    assert_eq!(setup.registries_files(), ["10-site.conf"]);
    assert_eq!(
        std::fs::read_to_string(&setup.site).unwrap(),
        setup.site_text
    );
    crio.wait_reloads(reloads + 1).expect("CRI-O reloaded");
    assert_eq!(crio.counts().registries.last(), Some(&setup.admins));
}

//! Pins on the real CRI-O 1.33 (built by scripts/setup; a lab node of `Runtime::Crio133`), as CRI-O itself
//! enforces them, through the real `pinboard` binary: at every step CRI-O's own ListImages and `check`
//! agree on each image.
//!
//! - An image a pod pulled by tag, in a set that names it by digest: CRI-O matches `pinned_images` against
//!   the names it stored, so `apply` pulls it by its digest (nothing is downloaded) and it is pinned.
//! - An administrator's earlier glob (`10-site.conf`) still pins its images after `apply` of another set:
//!   the drop-in carries its entries forward.
//! - A later file that replaces `pinned_images` is named by `check`, with the fix.
//! - A drop-in CRI-O cannot parse: `apply` refuses before writing anything, and `check` names the file and
//!   the parse error, where CRI-O's own reload fails.
//! - `unpin` gives back what only the set held; the administrator's pins stay.
//! - A restart of CRI-O keeps every pin the files hold.
//! - Fan-out writes a registries.conf.d drop-in that keeps the administrator's mirrors (CRI-O's log shows
//!   what it applied) and removes it; one left by a killed pinboard does not stop CRI-O pulling from the
//!   source, and the next command removes it.
//! - `plan` measures the image filesystem CRI-O names (its storage on the node's tmpfs) and refuses a set
//!   that does not fit; forced, CRI-O's pull fills it and fails with `no space left on device`.

use crate::support;

use std::time::{Duration, Instant};

use pinboard::backend::pins::CRIO_DROP_IN;
use pinboard::backend::wiring::CRIO_DROP_IN as WIRING_DROP_IN;
use pinboard::model::readiness::Readiness;
use support::{ImageSpec, Lab, LayerFormat, LayerSpec, Node, NodeSpec, Run, Runtime};

const MIB: u64 = 1 << 20;

/// A lab whose one node, n1, runs the real CRI-O on an image filesystem of `imagefs` bytes.
fn crio_lab(name: &str, imagefs: u64) -> Lab {
    let lab = Lab::with_nodes(
        name,
        vec![NodeSpec::new("n1", imagefs).on(Runtime::Crio133)],
    );
    eprintln!("n1 runs {}", lab.node("n1").runtime_version());
    lab
}

/// `check -o json` for the set file `set`.
fn check(lab: &Lab, set: &str) -> (Run, Readiness) {
    let run = lab.pinboard("check", &["--set", set, "-o", "json"]);
    let readiness = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("check -o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run, readiness)
}

/// Waits until CRI-O's ListImages reports each of `images` pinned as `wanted` says (a reload applies
/// asynchronously), then asserts that `check` on `set` says the same of each, and that its exit code is
/// 0 exactly when all are pinned. Returns check's run.
fn agree(lab: &Lab, set: &str, images: &[(&str, bool)]) -> Run {
    lab.node("n1").wait_cri_pinned(images);
    let (run, report) = check(lab, set);
    for (image, pinned) in images {
        let judged = report.nodes[0]
            .images
            .iter()
            .find(|i| i.reference == *image)
            .unwrap_or_else(|| panic!("check judged {image}: {}", run.stdout));
        assert_eq!(
            judged.pinned,
            Some(*pinned),
            "check and CRI-O disagree on {image}:\n{}\n{}",
            run.stdout,
            run.stderr
        );
    }
    let ready = images.iter().all(|(_, pinned)| *pinned);
    assert_eq!(
        run.code,
        i32::from(!ready),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    run
}

/// Writes `file` in CRI-O's drop-in directory with `pinned_images` set to `patterns`, as an administrator
/// writes one.
fn drop_in(node: &Node, file: &str, patterns: &[&str]) {
    let quoted: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        node.crio().config_dir.join(file),
        format!("[crio.image]\npinned_images = [{}]\n", quoted.join(", ")),
    )
    .unwrap();
}

#[test]
fn crio_1_33_and_check_agree_through_tags_an_admins_glob_an_override_a_broken_file_unpin_and_a_restart()
 {
    let mut lab = crio_lab("crio-steps", 256 * MIB);
    // Through the proxy, which counts what CRI-O fetches.
    let host = lab.proxy_host();
    let push = |repo: &str, seed: u64| {
        lab.push_image(repo, &ImageSpec::small(seed))
            .unwrap()
            .reference(&host)
    };
    let site = push("site/db", 7201);
    let extra = push("app/extra", 7202);
    let late = push("app/late", 7203);
    let web = lab
        .push_tagged("app/web", &ImageSpec::small(7204), "1.0")
        .unwrap();
    let tagged = web.reference(&host);
    let node = lab.node("n1");
    // What a cluster already has: the administrator's glob for the site's images, one pulled by a pod,
    // and the web image a pod pulled by its tag.
    drop_in(node, "10-site.conf", &[&format!("{host}/site/*")]);
    node.reload_crio();
    node.pull(&site).unwrap();
    node.pull(&format!("{host}/app/web:1.0")).unwrap();
    let site_set = lab.set_file("site", &[&site]);
    agree(&lab, &site_set, &[(&site, true)]);

    // apply pulls by digest the image CRI-O knows only by its tag: pinned, nothing downloaded.
    let app = lab.set_file("app", &[&tagged, &extra]);
    let blobs_before = lab.proxy().request_heads().len();
    let run = lab.pinboard("apply", &["--set", &app]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let drop_in_text = std::fs::read_to_string(node.crio().config_dir.join(CRIO_DROP_IN)).unwrap();
    assert!(
        drop_in_text.contains(&format!(
            "\"{host}/site/*\", # pinboard: kept from 10-site.conf"
        )),
        "the site's glob is carried forward:\n{drop_in_text}"
    );
    agree(&lab, &app, &[(&tagged, true), (&extra, true)]);
    // The administrator's pins are still CRI-O's.
    agree(&lab, &site_set, &[(&site, true)]);
    let layers_fetched = lab.proxy().request_heads()[blobs_before..]
        .iter()
        .filter(|h| web.layers.iter().any(|l| h.contains(&l.digest)))
        .count();
    assert_eq!(
        layers_fetched, 0,
        "the web image's layers were on the node already"
    );

    // A later file that sets pinned_images replaces the array: check names it, with the fix.
    drop_in(node, "99-override.conf", &[&format!("{host}/other/*")]);
    node.reload_crio();
    let run = agree(&lab, &app, &[(&tagged, false), (&extra, false)]);
    assert!(
        run.stderr.contains(
            "99-override.conf replaces pinned_images; add them to 99-override.conf or remove \
             pinned_images from it"
        ),
        "{}",
        run.stderr
    );
    std::fs::remove_file(node.crio().config_dir.join("99-override.conf")).unwrap();
    node.reload_crio();
    agree(&lab, &app, &[(&tagged, true), (&extra, true)]);

    // A drop-in CRI-O cannot parse: its reloads fail, so apply writes nothing and names it.
    let broken = node.crio().config_dir.join("20-broken.conf");
    std::fs::write(&broken, "[crio.image\npinned_images = [\n").unwrap();
    let late_set = lab.set_file("late", &[&late]);
    let run = lab.pinboard("apply", &["--set", &late_set]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("CRI-O 1.33.13 cannot load its configuration")
            && run.stderr.contains("20-broken.conf: not valid TOML"),
        "{}",
        run.stderr
    );
    assert_eq!(
        std::fs::read_to_string(node.crio().config_dir.join(CRIO_DROP_IN)).unwrap(),
        drop_in_text,
        "nothing written"
    );
    let run = agree(&lab, &late_set, &[(&late, false)]);
    assert!(
        run.stderr.contains("20-broken.conf: not valid TOML"),
        "{}",
        run.stderr
    );
    // CRI-O's own reload fails on it the same way.
    node.reload_crio();
    wait_for_log(node, "Unable to reload configuration");
    std::fs::remove_file(&broken).unwrap();
    let run = lab.pinboard("apply", &["--set", &late_set]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    agree(&lab, &late_set, &[(&late, true)]);

    // unpin gives back what only the set held; the administrator's glob still pins the site image.
    let run = lab.pinboard("unpin", &["--set", &app]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    agree(&lab, &app, &[(&tagged, false), (&extra, false)]);
    agree(&lab, &site_set, &[(&site, true)]);
    agree(&lab, &late_set, &[(&late, true)]);

    // A restart reads the files anew: the same pins.
    lab.restart_node("n1").unwrap();
    agree(&lab, &site_set, &[(&site, true)]);
    agree(&lab, &late_set, &[(&late, true)]);
    agree(&lab, &app, &[(&tagged, false), (&extra, false)]);
}

/// CRI-O's log.
fn crio_log(node: &Node) -> String {
    std::fs::read_to_string(node.dir().join("crio.log")).unwrap_or_default()
}

/// Waits until CRI-O's log has a line containing `text`.
fn wait_for_log(node: &Node, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !crio_log(node).contains(text) {
        assert!(Instant::now() < deadline, "CRI-O never logged {text:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The mirrors of each registry configuration CRI-O applied, as its log says them
/// (`Applied new registry configuration: …`), oldest first: one `Location:` list per reload.
fn applied_mirrors(node: &Node) -> Vec<Vec<String>> {
    crio_log(node)
        .lines()
        .filter(|l| l.contains("Applied new registry configuration"))
        .map(|line| {
            line.split("Mirrors:[")
                .skip(1)
                .flat_map(|mirrors| {
                    let mirrors = mirrors.split(']').next().unwrap_or_default();
                    mirrors
                        .split("{Location:")
                        .skip(1)
                        .map(|m| m.split_whitespace().next().unwrap_or_default().to_string())
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

/// A CRI-O node with an administrator's mirror for the lab's registry (a dead one, so a pull that would
/// use it goes on to the source), and three images there that share a base layer, to fan out.
struct FanOutOnCrio {
    lab: Lab,
    images: Vec<String>,
    site: std::path::PathBuf,
    site_text: String,
    cache: tempfile::TempDir,
}

/// The administrator's dead mirror, as CRI-O's log names it.
const SITE_MIRROR: &str = "127.0.0.1:9/site-mirror";

impl FanOutOnCrio {
    fn start(name: &str) -> FanOutOnCrio {
        let lab = crio_lab(name, 256 * MIB);
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
                    .unwrap()
                    .reference(&proxy)
            })
            .collect();
        let node = lab.node("n1");
        let site = node.crio().registries_dir.join("10-site.conf");
        let site_text = format!(
            "[[registry]]\nprefix = \"{proxy}\"\nlocation = \"{proxy}\"\n\n[[registry.mirror]]\n\
             location = \"{SITE_MIRROR}\"\ninsecure = true\npull-from-mirror = \"digest-only\"\n"
        );
        std::fs::write(&site, &site_text).unwrap();
        node.reload_crio();
        wait_for_log(node, SITE_MIRROR);
        FanOutOnCrio {
            lab,
            images,
            site,
            site_text,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    /// `COMMAND -o json` with apply's fan-out arguments and the images, on the lab's nodes file.
    fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--fan-out".to_string(),
            "--cache-dir".into(),
            self.cache.path().display().to_string(),
            "-o".into(),
            "json".into(),
        ];
        for image in &self.images {
            args.extend(["--image".into(), image.clone()]);
        }
        args
    }

    fn run(&self, command: &str) -> Run {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.lab.pinboard(command, &args)
    }

    /// The files in CRI-O's registries.conf.d, by name.
    fn registries_files(&self) -> Vec<String> {
        let dir = &self.lab.node("n1").crio().registries_dir;
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Asserts the administrator's file is as it was, alone, and what CRI-O applied last.
    fn assert_put_back(&self) {
        assert_eq!(self.registries_files(), ["10-site.conf"]);
        assert_eq!(std::fs::read_to_string(&self.site).unwrap(), self.site_text);
        let node = self.lab.node("n1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while applied_mirrors(node).last() != Some(&vec![SITE_MIRROR.to_string()]) {
            assert!(
                Instant::now() < deadline,
                "CRI-O applied {:?} last",
                applied_mirrors(node).last()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn crio_1_33_fan_out_writes_a_registries_drop_in_carrying_the_administrators_mirrors_and_removes_it()
 {
    let setup = FanOutOnCrio::start("crio-fan-out");
    let lab = &setup.lab;
    let from = lab.proxy().request_heads().len();
    let run = setup.run("apply");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["rollout"][0]["state"], "pinned", "{report}");
    lab.node("n1").assert_pinned(&setup.images);

    // CRI-O had pinboard's endpoint first, then the administrator's mirror.
    let proxy = lab.proxy_host().replace(':', "_");
    let wired = applied_mirrors(lab.node("n1"))
        .into_iter()
        .find(|mirrors| mirrors.len() == 2)
        .unwrap_or_else(|| panic!("{:?}", applied_mirrors(lab.node("n1"))));
    assert!(
        wired[0].starts_with("127.0.0.1:") && wired[0].ends_with(&format!("/{proxy}")),
        "{wired:?}"
    );
    assert_eq!(wired[1], SITE_MIRROR);
    // Only pinboard fetched blobs from the registry: CRI-O took them all from its endpoint.
    let heads: Vec<String> = lab.proxy().request_heads()[from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    assert!(
        heads
            .iter()
            .filter(|h| h.contains("/blobs/"))
            .all(|h| h.contains("user-agent: pinboard/")),
        "{heads:?}"
    );
    let gets = heads
        .iter()
        .filter(|h| h.starts_with("get ") && h.contains("/blobs/"))
        .count();
    // The survey reads the 3 configs too, for their layers' uncompressed digests: CRI-O matches the layers
    // it holds by them.
    assert_eq!(
        gets,
        3 + 3 + 1 + 3,
        "3 configs, 3 own layers, the shared base once, and the configs the survey read"
    );
    // Afterwards: the drop-in gone, CRI-O reloaded onto the administrator's rules alone.
    setup.assert_put_back();
}

#[test]
fn crio_1_33_a_fan_out_drop_in_left_by_a_killed_pinboard_does_not_stop_pulls_and_the_next_command_removes_it()
 {
    let setup = FanOutOnCrio::start("crio-fan-out-killed");
    let lab = &setup.lab;
    let node = lab.node("n1");
    let left = node.crio().registries_dir.join(WIRING_DROP_IN);
    // Slow enough that pinboard is killed while CRI-O pulls through its endpoint.
    lab.proxy().set_bandwidth(Some(64 * 1024));
    let mut args = vec!["apply".to_string(), "--nodes".into()];
    args.push(lab.nodes_file().display().to_string());
    for host in [lab.registry_host(), lab.proxy_host()] {
        args.extend(["--insecure-registry".into(), host]);
    }
    args.extend(["--min-free".into(), "1Mi".into()]);
    args.extend(setup.args());
    let mut child = std::process::Command::new(support::binary())
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pinboard starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(left.exists() && applied_mirrors(node).last().is_some_and(|m| m.len() == 2)) {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the drop-in was never in force"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    lab.proxy().set_bandwidth(None);
    assert!(left.exists(), "a killed pinboard cleans nothing up");

    // Its endpoint is gone, and so is the site's mirror: CRI-O goes on to the registry. (An image of the
    // set may still be in a pull CRI-O started for pinboard, which a second pull of it would join.)
    let after = lab
        .push_image("crio/after", &ImageSpec::small(1420))
        .unwrap()
        .reference(&lab.proxy_host());
    let from = lab.proxy().request_heads().len();
    node.pull(&after).expect("CRI-O pulls from the source");
    assert!(
        lab.proxy().request_heads()[from..]
            .iter()
            .any(|h| h.to_ascii_lowercase().contains("user-agent: cri-o")),
        "CRI-O itself reached the registry"
    );

    // The next command that touches the node removes the drop-in and reloads CRI-O onto the
    // administrator's rules.
    let status = setup.run("status");
    let restored: Vec<&str> = status
        .stderr
        .lines()
        .filter(|l| l.contains("restored, left by pinboard pid"))
        .collect();
    assert_eq!(restored.len(), 1, "{}", status.stderr);
    assert!(restored[0].contains(WIRING_DROP_IN), "{}", restored[0]);
    setup.assert_put_back();
}

#[test]
fn crio_1_33_plan_measures_its_image_filesystem_and_a_forced_pull_that_fills_it_fails_for_no_space()
{
    let lab = crio_lab("crio-imagefs-full", 8 * MIB);
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed: 1500,
            bytes: 12 << 20,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let image = lab
        .push_image("crio/big", &spec)
        .unwrap()
        .reference(&lab.registry_host());
    let run = lab.pinboard("plan", &["--image", &image, "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let plan: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let n1 = &plan["nodes"][0];
    // statvfs of the storage ImageFsInfo names: the node's tmpfs, not the disk under it.
    assert_eq!(n1["capacityBytes"], 8 * MIB, "{n1}");
    assert_eq!(n1["verdict"], "no-space", "{n1}");

    // Forced, CRI-O pulls until its image filesystem is full, and the pull fails for it.
    let run = lab.pinboard("apply", &["--image", &image, "--force", "-o", "json"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let n1 = &report["rollout"][0];
    assert!(
        n1["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no space left on device")),
        "{n1}"
    );
}

#[test]
fn crio_1_33_with_its_defaults_counts_no_pull_bytes_and_apply_says_so_once_with_the_fix() {
    let lab = crio_lab("crio-no-bytes", 256 * MIB);
    let image = lab
        .push_image("crio/uncounted", &ImageSpec::small(7301))
        .unwrap()
        .reference(&lab.proxy_host());
    let run = lab.pinboard("apply", &["--image", &image, "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let said: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("CRI-O reports no pull bytes"))
        .collect();
    assert_eq!(said.len(), 1, "once: {}", run.stderr);
    assert!(
        said[0].contains("its metrics are off and pull_progress_timeout is 0")
            || said[0].contains("pull_progress_timeout is 0"),
        "{}",
        said[0]
    );
    assert!(
        said[0].contains("pinboard crio-progress on --restart"),
        "{}",
        said[0]
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["rollout"][0]["fetchedSource"], "plan", "{report}");
    let status = lab.pinboard("crio-progress", &["status"]);
    assert_eq!(status.code, 0, "{}\n{}", status.stdout, status.stderr);
    assert!(
        status.stdout.contains("not counted")
            && status.stdout.contains("pinboard crio-progress on"),
        "{}",
        status.stdout
    );
}

#[test]
fn crio_1_33_counting_its_pull_bytes_apply_reports_crios_own_figure() {
    let mut lab = crio_lab("crio-counted", 256 * MIB);
    let on = lab.pinboard("crio-progress", &["on", "--crio-timeout", "10s"]);
    assert_eq!(on.code, 0, "{}\n{}", on.stdout, on.stderr);
    let file = lab
        .node("n1")
        .crio()
        .config_dir
        .join("40-pinboard-pull-progress.conf");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("enable_metrics = true") && text.contains("pull_progress_timeout = \"10s\""),
        "{text}"
    );
    // Read at start only: written, and said so, until CRI-O restarts.
    assert!(
        on.stdout.contains("CRI-O reads it when it restarts"),
        "{}",
        on.stdout
    );
    lab.restart_node("n1").unwrap();
    let image = lab
        .push_image("crio/counted", &ImageSpec::gzip_layers(7302, &[3 << 20]))
        .unwrap()
        .reference(&lab.proxy_host());
    let before = lab.proxy().bytes_down();
    let run = lab.pinboard("apply", &["--image", &image, "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let moved = lab.proxy().bytes_down() - before;
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let n1 = &report["rollout"][0];
    assert_eq!(n1["fetchedSource"], "runtime-counters", "{n1}");
    let fetched = n1["fetchedBytes"].as_u64().unwrap();
    // pinboard's own survey reads the manifest and config from the registry too: the link carries a
    // little more than CRI-O fetched.
    support::assert_within(
        "CRI-O's counted bytes, against the link's",
        fetched,
        moved,
        0.05,
    );
    assert!(
        run.stderr.contains("bytes from CRI-O's counters"),
        "{}",
        run.stderr
    );
    // Off again: the file goes, and CRI-O's own default is back once it restarts.
    let off = lab.pinboard("crio-progress", &["off"]);
    assert_eq!(off.code, 0, "{}\n{}", off.stdout, off.stderr);
    assert!(!file.exists());
}

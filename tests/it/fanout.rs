//! `pinboard apply --fan-out` on real containerd nodes, the lab registry behind the lab proxy: every byte that
//! crosses the registry link is counted at the proxy. The base case, a link that resets every connection
//! after 1 MiB, containerd killed and restarted mid-rollout, 503 / 429 / a stall / a missing blob on the
//! link, a blob corrupted in the registry, a pinboard killed mid-rollout whose files the next command puts
//! back, `--fan-out-listen`, and private images behind the lab's token registry (the cache fetches with
//! pinboard's credentials, which appear in no output).

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::Digest as _;
use support::link::{LinkSampler, assert_kept_to, middle_rates};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, Node, NodeSpec, PushedImage, unique_bytes,
};

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;

/// A lab of containerd nodes called `nodes`, each with an image filesystem of `imagefs` bytes.
fn lab(name: &str, nodes: &[&str], imagefs: u64) -> Lab {
    Lab::with_nodes(
        name,
        nodes.iter().map(|n| NodeSpec::new(n, imagefs)).collect(),
    )
}

fn layer(seed: u64, bytes: u64) -> LayerSpec {
    LayerSpec {
        seed,
        bytes: bytes as usize,
        format: LayerFormat::Gzip,
    }
}

/// `count` images in `repo-N`: each one of three shared base layers of `base` bytes and a layer of its own
/// of `own` bytes (plus a little per image, so no two are alike).
fn push_images(
    lab: &Lab,
    repo: &str,
    seed: u64,
    count: u64,
    base: u64,
    own: u64,
) -> Vec<PushedImage> {
    (0..count)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![
                    layer(seed + i % 3, base),
                    layer(seed + 100 + i, own + i * 16 * KI),
                ],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("{repo}{i}"), &spec).expect("push")
        })
        .collect()
}

/// `pinboard ARGS --nodes FILE --image REF… --insecure-registry PROXY --min-free 1Mi`, the nodes file
/// naming `nodes` as an administrator lists them (each containerd's config, where containerd 2 says where
/// its hosts.toml go).
fn args(
    lab: &Lab,
    command: &str,
    nodes: &[&Node],
    images: &[PushedImage],
    extra: &[&str],
) -> Vec<String> {
    let mut args = vec![
        command.to_string(),
        "--nodes".into(),
        lab.nodes_file_of(nodes).display().to_string(),
    ];
    for image in images {
        args.extend(["--image".into(), image.reference(&lab.proxy_host())]);
    }
    args.extend([
        "--insecure-registry".into(),
        lab.proxy_host(),
        "--min-free".into(),
        "1Mi".into(),
    ]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn fan_out(cache: &tempfile::TempDir) -> [&str; 3] {
    [
        "--fan-out",
        "--cache-dir",
        cache.path().to_str().expect("utf-8 path"),
    ]
}

/// `pinboard apply --fan-out -o json` of `images` onto `nodes`, the cache in `cache`.
fn apply_fan_out_json(
    lab: &Lab,
    nodes: &[&Node],
    images: &[PushedImage],
    cache: &tempfile::TempDir,
) -> support::Run {
    support::pinboard(args(
        lab,
        "apply",
        nodes,
        images,
        &[&fan_out(cache)[..], &["-o", "json"]].concat(),
    ))
}

/// Asserts that no blob was asked of the registry since the proxy had seen `from` requests.
fn assert_no_blob_fetched_since(lab: &Lab, from: usize) {
    let heads = heads_since(lab, from);
    assert!(
        !heads.iter().any(|h| h.contains("/blobs/")),
        "no blob asked for: {heads:?}"
    );
}

/// The request heads the proxy saw from `from` on, lower-cased.
fn heads_since(lab: &Lab, from: usize) -> Vec<String> {
    lab.proxy().request_heads()[from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect()
}

/// For each blob (config and layers) of `images`: its digest and the GET request heads of `heads` for it.
fn blob_gets<'a>(heads: &'a [String], images: &[PushedImage]) -> Vec<(String, Vec<&'a String>)> {
    images
        .iter()
        .flat_map(|i| std::iter::once(&i.config_digest).chain(i.layers.iter().map(|l| &l.digest)))
        .map(|digest| {
            let path = format!("/blobs/{digest}");
            let gets = heads
                .iter()
                .filter(|h| h.starts_with("get ") && h.contains(&path))
                .collect();
            (digest.clone(), gets)
        })
        .collect()
}

/// Every node's hosts.toml for the proxy, as it is now (None: no file).
fn hosts_files(lab: &Lab, nodes: &[&Node]) -> Vec<Option<String>> {
    nodes
        .iter()
        .map(|n| std::fs::read_to_string(n.hosts_toml(&lab.proxy_host())).ok())
        .collect()
}

/// Asserts that every one of `nodes` holds every one of `images`, pinned.
fn assert_pinned_everywhere(lab: &Lab, nodes: &[&Node], images: &[PushedImage]) {
    let references: Vec<String> = images
        .iter()
        .map(|i| i.reference(&lab.proxy_host()))
        .collect();
    for node in nodes {
        node.assert_pinned(&references);
    }
}

/// Every file in the cache's `sha256/` hashes to its name: nothing unverified was kept as complete.
fn assert_cache_verified(cache: &tempfile::TempDir) {
    let dir = cache.path().join("sha256");
    for entry in std::fs::read_dir(&dir).expect("the cache's sha256/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".media-type") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("cached file");
        assert_eq!(
            format!("{:x}", sha2::Sha256::digest(&bytes)),
            name,
            "{} does not hash to its name",
            path.display()
        );
    }
}

fn assert_ok(run: &support::Run, lab: &Lab) {
    assert_eq!(
        run.code,
        0,
        "stdout:\n{}\nstderr:\n{}\nlab: {}",
        run.stdout,
        run.stderr,
        lab.dir().display()
    );
}

/// `apply -o json`'s report, once it says every node is ready and the cache counted `unique` bytes taken
/// over the link (give or take the manifests it had from the survey).
fn ready_with_link_bytes(run: &support::Run, unique: u64) -> serde_json::Value {
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("apply JSON");
    assert_eq!(report["readiness"]["ready"], true, "{report}");
    let link = report["fanOut"]["linkBytes"].as_u64().unwrap();
    assert!(
        link >= unique - 4 * KI && link <= unique,
        "the cache's count: {link} of {unique}"
    );
    report
}

/// Asserts that the link carried at most `slack` times `unique` bytes since the proxy had sent `before`;
/// the bytes it carried.
fn assert_moved_about_once(lab: &Lab, before: u64, unique: u64, slack: f64) -> u64 {
    let moved = lab.proxy().bytes_down() - before;
    assert!(
        moved as f64 <= slack * unique as f64,
        "{moved} bytes crossed the link for {unique} unique bytes"
    );
    moved
}

#[test]
fn fan_out_moves_each_blob_over_the_link_once_and_puts_every_hosts_toml_back() {
    let lab = lab(
        "fanout-base",
        &["n1", "n2", "n3", "m1", "m2", "m3"],
        96 * MI,
    );
    let images = push_images(&lab, "fan/app", 7000, 12, 2 * MI, 256 * KI);
    let unique = unique_bytes(&images);
    let (first, second): (Vec<&Node>, Vec<&Node>) =
        lab.nodes().iter().partition(|n| n.name.starts_with('n'));
    // n3 and m3 have no hosts.toml for the registry (containerd's defaults); the others an administrator's.
    for node in [first[2], second[2]] {
        std::fs::remove_file(node.hosts_toml(&lab.proxy_host())).expect("remove hosts.toml");
    }
    let before = hosts_files(&lab, &first);
    let cache = tempfile::tempdir().unwrap();

    let plan = support::pinboard(args(
        &lab,
        "plan",
        &first,
        &images,
        &["-o", "json", "--cache-dir", cache.path().to_str().unwrap()],
    ));
    assert_ok(&plan, &lab);
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).expect("plan JSON");
    assert_eq!(plan["linkBytes"]["fanOut"], unique, "{}", plan["linkBytes"]);
    assert_eq!(
        plan["linkBytes"]["direct"],
        3 * unique,
        "{}",
        plan["linkBytes"]
    );

    let (from, bytes_before) = (lab.proxy().request_heads().len(), lab.proxy().bytes_down());
    let run = apply_fan_out_json(&lab, &first, &images, &cache);
    assert_ok(&run, &lab);
    assert_moved_about_once(&lab, bytes_before, unique, 1.05);
    let report = ready_with_link_bytes(&run, unique);
    // stderr is not a terminal here: one line per event, each with what the link carried so far.
    let pulled: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(": pulled "))
        .collect();
    assert_eq!(pulled.len(), 3 * images.len(), "{}", run.stderr);
    assert!(
        pulled.iter().all(|l| l.contains(" (link so far: ")),
        "{}",
        run.stderr
    );
    let served = report["fanOut"]["servedBytes"].as_u64().unwrap();
    assert!(
        served >= 3 * (unique - 4 * KI),
        "three nodes were served everything: {served}"
    );
    // The nodes pulled through pinboard: containerd never asked the registry, every blob was asked once.
    let heads = heads_since(&lab, from);
    assert!(
        !heads.iter().any(|h| h.contains("user-agent: containerd")),
        "{heads:?}"
    );
    for (digest, gets) in blob_gets(&heads, &images) {
        assert_eq!(gets.len(), 1, "{digest}");
    }
    assert_eq!(
        hosts_files(&lab, &first),
        before,
        "every hosts.toml back byte for byte, n3's gone again"
    );
    assert!(
        !first[2]
            .hosts_toml(&lab.proxy_host())
            .parent()
            .unwrap()
            .exists()
    );
    assert_cache_verified(&cache);
    let check = support::pinboard(args(&lab, "check", &first, &images, &[]));
    assert_ok(&check, &lab);

    // Fresh nodes, the same cache: everything is there, so no blob crosses the link.
    let plan = support::pinboard(args(
        &lab,
        "plan",
        &second,
        &images,
        &["-o", "json", "--cache-dir", cache.path().to_str().unwrap()],
    ));
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).expect("plan JSON");
    assert_eq!(plan["linkBytes"]["fanOut"], 0, "{}", plan["linkBytes"]);
    assert_eq!(plan["linkBytes"]["direct"], 3 * unique);
    let before = hosts_files(&lab, &second);
    let from = lab.proxy().request_heads().len();
    let run = apply_fan_out_json(&lab, &second, &images, &cache);
    assert_ok(&run, &lab);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("apply JSON");
    assert_eq!(report["fanOut"]["linkBytes"], 0, "{report}");
    assert_no_blob_fetched_since(&lab, from);
    assert_eq!(hosts_files(&lab, &second), before);
    let check = support::pinboard(args(&lab, "check", &second, &images, &[]));
    assert_ok(&check, &lab);
}

#[test]
fn a_link_that_resets_every_connection_after_one_mib_still_moves_each_blob_about_once() {
    let lab = lab("fanout-resets", &["n1", "n2", "n3"], 128 * MI);
    let images = push_images(&lab, "reset/app", 7100, 10, 3 * MI, 768 * KI);
    let unique = unique_bytes(&images);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let before = hosts_files(&lab, &nodes);
    let cache = tempfile::tempdir().unwrap();
    lab.proxy().reset_after(MI, None);
    let (from, bytes_before) = (lab.proxy().request_heads().len(), lab.proxy().bytes_down());
    let run = support::pinboard(args(&lab, "apply", &nodes, &images, &fan_out(&cache)));
    assert_ok(&run, &lab);
    assert_moved_about_once(&lab, bytes_before, unique, 1.10);
    let resumed = heads_since(&lab, from)
        .iter()
        .filter(|h| h.contains("/blobs/") && h.contains("range: bytes="))
        .count();
    assert!(
        resumed >= 10,
        "downloads resumed where they broke off: {resumed} ranged requests"
    );
    assert_eq!(hosts_files(&lab, &nodes), before);
    assert_cache_verified(&cache);
}

#[test]
fn containerd_killed_and_restarted_mid_rollout_ends_pinned_with_the_retries_saying_why() {
    let mut lab = lab("fanout-restart", &["n1", "n2"], 128 * MI);
    let images = push_images(&lab, "restart/app", 7200, 8, 2 * MI, 2 * MI);
    let unique = unique_bytes(&images);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let cache = tempfile::tempdir().unwrap();
    // Slow enough to be mid-rollout when containerd goes.
    lab.proxy().set_bandwidth(Some(2 * MI));
    let child = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(args(&lab, "apply", &nodes, &images, &fan_out(&cache)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pinboard starts");
    let bytes_before = lab.proxy().bytes_down();
    let deadline = Instant::now() + Duration::from_secs(60);
    while lab.proxy().bytes_down() - bytes_before < unique / 4 {
        assert!(Instant::now() < deadline, "the rollout never got going");
        std::thread::sleep(Duration::from_millis(50));
    }
    lab.restart_node("n2").expect("containerd comes back");
    lab.proxy().set_bandwidth(None);
    let out = child.wait_with_output().expect("pinboard ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{stderr}\nlab: {}",
        lab.dir().display()
    );
    assert!(stdout.contains("2/2 nodes ready"), "{stdout}");
    let retries: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("n2: ") && l.contains("failed, retrying in"))
        .collect();
    assert!(!retries.is_empty(), "{stderr}");
    eprintln!("n2's retries:\n{}", retries.join("\n"));
    assert!(
        retries
            .iter()
            .all(|l| l.contains("PullImage") && l.contains("connect")),
        "each retry says the connection to containerd broke: {retries:?}"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.starts_with("n1: ") && l.contains("failed")),
        "n1 was not disturbed: {stderr}"
    );
}

#[test]
fn faults_on_the_link_end_every_pull_pulled_or_failed_with_its_reason_and_nothing_unverified_is_kept()
 {
    faults_on_the_link(true);
}

#[test]
fn faults_on_the_link_end_every_direct_pull_pulled_or_failed_with_its_reason() {
    faults_on_the_link(false);
}

/// 503, 429, a stall, a trickle and a missing blob on the link, under `apply` with fan-out (the cache
/// fetches each blob once, resuming what broke off) or without (each node's runtime pulls for itself).
fn faults_on_the_link(fanned_out: bool) {
    let name = if fanned_out {
        "fanout-faults"
    } else {
        "direct-faults"
    };
    let lab = lab(name, &["n1", "n2"], 128 * MI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let cache = tempfile::tempdir().unwrap();
    // Direct pulls: a stalled one is cancelled after 3 s without a byte (5 minutes by default).
    let extra: Vec<&str> = match fanned_out {
        true => fan_out(&cache).to_vec(),
        false => vec!["--pull-progress-timeout", "3s"],
    };
    let apply =
        |images: &[PushedImage]| support::pinboard(args(&lab, "apply", &nodes, images, &extra));
    // Each fault's images are pulled and pinned everywhere; with fan-out, their blobs crossed the link
    // about once (the faults' own answers and a resumed stretch on top), else once per node.
    // `refetched`: bytes a pull cancelled mid-way may take again on top (containerd does not resume a
    // cancelled pull's downloads).
    let applied_through = |fault: &str, images: &[PushedImage], refetched: u64| {
        let (from, before) = (lab.proxy().request_heads().len(), lab.proxy().bytes_down());
        let run = apply(images);
        assert_ok(&run, &lab);
        assert_pinned_everywhere(&lab, &nodes, images);
        let unique = unique_bytes(images);
        let copies = if fanned_out { 1 } else { nodes.len() as u64 };
        let moved = assert_moved_about_once(&lab, before, copies * unique + refetched, 1.05);
        eprintln!(
            "{fault}: {moved} bytes over the link for {unique} unique bytes ({copies}x expected)"
        );
        (from, run.stderr)
    };
    // 503 for the next requests: retried, then served.
    let unavailable = push_images(&lab, "fault/unavailable", 7300, 3, MI, 256 * KI);
    // Any request: the survey's manifest reads before the rollout are asked again too.
    lab.proxy().fail_requests(503, 6, None);
    applied_through("503", &unavailable, 0);
    assert_eq!(lab.proxy().pending_errors(), 0, "every 503 was answered");

    // 429 with Retry-After: waited for, then served.
    let limited = push_images(&lab, "fault/limited", 7400, 3, MI, 256 * KI);
    lab.proxy().fail_requests(429, 4, Some(1));
    applied_through("429", &limited, 0);
    assert_eq!(lab.proxy().pending_errors(), 0, "every 429 was answered");

    // A connection that stalls after 256 KiB. With fan-out, the cache drops it after 30 s without a byte
    // and resumes. Directly, containerd 1.6 would wait on it for as long as the PullImage call may last
    // (30 min): pinboard cancels the pull once its bytes stop moving, and pulls again.
    let stalled = push_images(&lab, "fault/stalled", 7500, 2, MI, 256 * KI);
    lab.proxy().stall_after(256 * KI, Some(1));
    // Directly, the stalled pull is cancelled and its image's bytes fetched so far are fetched again.
    let largest = stalled
        .iter()
        .map(|i| unique_bytes(std::slice::from_ref(i)))
        .max();
    let refetched = if fanned_out { 0 } else { largest.unwrap() };
    let (from, said) = applied_through("stall", &stalled, refetched);
    if fanned_out {
        assert!(
            heads_since(&lab, from)
                .iter()
                .any(|h| h.contains("range: bytes=")),
            "the stalled download was resumed"
        );
    } else {
        let retried: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("failed, retrying"))
            .collect();
        assert_eq!(retried.len(), 1, "one pull stalled: {said}");
        assert!(
            retried[0].contains("no bytes arrived for 3s") && retried[0].contains("attempt 1"),
            "the stalled pull was cancelled and pulled again, saying why: {said}"
        );
    }
    lab.proxy().clear_faults();

    // A link that trickles (8 KiB every 50 ms): slow, never stalled, nothing dropped.
    let trickled = push_images(&lab, "fault/trickled", 7550, 1, 256 * KI, 64 * KI);
    lab.proxy()
        .set_trickle(Some((8 * KI as usize, Duration::from_millis(50))));
    let (from, _) = applied_through("trickle", &trickled, 0);
    assert!(
        !heads_since(&lab, from)
            .iter()
            .any(|h| h.contains("range: bytes=")),
        "nothing was dropped and resumed"
    );
    lab.proxy().clear_faults();

    // A blob missing from the registry: that pull fails naming it; the other image is pulled, and pinned
    // once applied without the broken one (pins wait for every pull of a node).
    let mut gone = push_images(&lab, "fault/gone", 7600, 2, MI, 256 * KI);
    let missing = gone[1].layers[1].digest.clone();
    std::fs::remove_file(lab.registry_blob_file(&missing)).expect("remove the blob");
    let run = apply(&gone);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let failed: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(" failed: "))
        .collect();
    eprintln!("the failed pulls:\n{}", failed.join("\n"));
    assert_eq!(failed.len(), 2, "one per node: {}", run.stderr);
    assert!(
        failed
            .iter()
            .all(|l| l.contains(&gone[1].repo) && l.contains(&missing)),
        "the pull of the image with the missing blob fails naming the blob: {failed:?}"
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    gone.truncate(1);
    let from = lab.proxy().request_heads().len();
    let run = apply(&gone);
    assert_ok(&run, &lab);
    // Already on the nodes: nothing fetched.
    assert_no_blob_fetched_since(&lab, from);
    if !fanned_out {
        return;
    }
    assert_cache_verified(&cache);
    assert!(
        !cache
            .path()
            .join("sha256")
            .join(missing.trim_start_matches("sha256:"))
            .exists(),
        "nothing stored for the missing blob"
    );
}

#[test]
fn a_containerd_without_config_path_is_told_why_and_pulls_directly_while_the_others_fan_out() {
    let lab = Lab::start(
        "fanout-legacy",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", 64 * MI).without_config_path(),
                NodeSpec::new("n2", 64 * MI),
            ],
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let images = push_images(&lab, "legacy/app", 7900, 3, MI, 256 * KI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let cache = tempfile::tempdir().unwrap();
    let from = lab.proxy().request_heads().len();
    let run = support::pinboard(args(&lab, "apply", &nodes, &images, &fan_out(&cache)));
    assert_ok(&run, &lab);
    let warning = run
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: n1: pulls directly, without fan-out"))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    assert!(
        warning.contains("containerd has no registry config_path")
            && warning.contains("registryConfigDir"),
        "{warning}"
    );
    assert!(!run.stderr.contains("warning: n2"), "{}", run.stderr);
    // n1's containerd fetched every blob from the registry itself; n2 got them from pinboard.
    let heads = heads_since(&lab, from);
    for image in &images {
        let digest = &image.layers[1].digest;
        let gets: Vec<&String> = heads
            .iter()
            .filter(|h| h.starts_with("get ") && h.contains(&format!("/blobs/{digest}")))
            .collect();
        assert_eq!(gets.len(), 2, "{digest}: {gets:?}");
        assert!(gets.iter().any(|h| h.contains("user-agent: containerd")));
        assert!(gets.iter().any(|h| h.contains("user-agent: pinboard")));
    }
}

#[test]
fn a_cache_that_cannot_be_used_stops_apply_fan_out_before_anything_is_pulled() {
    let lab = lab("fanout-bad-cache", &["n1"], 32 * MI);
    let images = push_images(&lab, "badcache/app", 8000, 1, 256 * KI, 64 * KI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let before = hosts_files(&lab, &nodes);
    let file = tempfile::NamedTempFile::new().unwrap();
    let inside_a_file = file.path().join("cache");
    let run = support::pinboard(args(
        &lab,
        "apply",
        &nodes,
        &images,
        &["--fan-out", "--cache-dir", inside_a_file.to_str().unwrap()],
    ));
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("--fan-out: ") && run.stderr.contains("pass another --cache-dir"),
        "{}",
        run.stderr
    );
    assert_eq!(hosts_files(&lab, &nodes), before);
    assert!(
        !nodes[0].images_ls().contains("badcache/app0"),
        "nothing was pulled"
    );
}

/// The hosts.toml files of `nodes` for the proxy, by path, when they carry fan-out's marker.
fn marked(lab: &Lab, nodes: &[&Node]) -> Vec<PathBuf> {
    nodes
        .iter()
        .map(|n| n.hosts_toml(&lab.proxy_host()))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.starts_with("# pinboard-fan-out: ")))
        .collect()
}

/// Starts pinboard with `args` (its output piped, or dropped when `piped` is false) and waits until every
/// one of `nodes` carries its fan-out files: their paths.
fn start_and_wait_until_wired(
    lab: &Lab,
    nodes: &[&Node],
    args: Vec<String>,
    piped: bool,
) -> (std::process::Child, Vec<PathBuf>) {
    let output = || match piped {
        true => Stdio::piped(),
        false => Stdio::null(),
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(args)
        .stdout(output())
        .stderr(output())
        .spawn()
        .expect("pinboard starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let wired = marked(lab, nodes);
        if wired.len() == nodes.len() {
            return (child, wired);
        }
        if Instant::now() > deadline || child.try_wait().is_ok_and(|s| s.is_some()) {
            let _ = child.kill();
            let status = child.wait();
            panic!("the nodes were never wired; pinboard: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn files_of_a_pinboard_killed_mid_rollout_do_not_stop_pulls_and_the_next_command_puts_them_back() {
    let lab = lab("fanout-killed", &["n1", "n2"], 96 * MI);
    let images = push_images(&lab, "killed/app", 7700, 4, 2 * MI, MI);
    let other = push_images(&lab, "killed/other", 7800, 1, 512 * KI, 64 * KI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    std::fs::remove_file(nodes[1].hosts_toml(&lab.proxy_host())).expect("n2 without hosts.toml");
    let before = hosts_files(&lab, &nodes);
    let cache = tempfile::tempdir().unwrap();
    lab.proxy().set_bandwidth(Some(512 * KI));
    let (mut child, _) = start_and_wait_until_wired(
        &lab,
        &nodes,
        args(&lab, "apply", &nodes, &images, &fan_out(&cache)),
        false,
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    lab.proxy().set_bandwidth(None);
    assert_eq!(
        marked(&lab, &nodes).len(),
        2,
        "a killed pinboard cleans nothing up"
    );

    // Its endpoint is gone, yet n1 still pulls: containerd goes on to the registry.
    let reference = other[0].reference(&lab.proxy_host());
    let pulled = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let endpoint = nodes[0].endpoint().parse().unwrap();
        let client =
            pinboard::backend::cri::CriClient::connect(&endpoint, Duration::from_secs(10)).await?;
        client
            .pull_image(&reference, None, Duration::from_secs(60))
            .await
    });
    assert!(pulled.is_ok(), "{pulled:?}");
    assert_eq!(marked(&lab, &nodes).len(), 2);

    // The next command that touches the nodes puts everything back.
    let status = support::pinboard(args(&lab, "status", &nodes, &images, &[]));
    assert_ok(&status, &lab);
    let restored: Vec<&str> = status
        .stderr
        .lines()
        .filter(|l| l.contains("restored, left by pinboard pid"))
        .collect();
    assert_eq!(restored.len(), 2, "{}", status.stderr);
    assert_eq!(
        hosts_files(&lab, &nodes),
        before,
        "back byte for byte, n2's gone"
    );
}

#[test]
fn private_images_fan_out_with_the_auth_file_each_blob_crossing_once_and_no_secret_in_the_output() {
    let nodes = ["n1", "n2", "n3"].map(|n| NodeSpec::new(n, 64 * MI));
    let lab = support::private::token_lab("fanout-private", nodes.to_vec());
    let images = push_images(&lab, "private/app", 8100, 4, MI, 256 * KI);
    let unique = unique_bytes(&images);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let home = tempfile::tempdir().unwrap();
    let authfile = support::private::auth_file(home.path(), &lab.proxy_host());
    let cache = tempfile::tempdir().unwrap();
    let (from, bytes_before) = (lab.proxy().request_heads().len(), lab.proxy().bytes_down());
    let run = support::pinboard_with(
        args(
            &lab,
            "apply",
            &nodes,
            &images,
            &[
                &fan_out(&cache)[..],
                &["--authfile", &authfile, "-o", "json"],
            ]
            .concat(),
        ),
        |command| {
            support::isolated(home.path())(command);
            command.env("PINBOARD_LOG", "debug");
        },
    );
    assert_ok(&run, &lab);
    assert!(run.stderr.contains("DEBUG"), "debug logging was on");
    let report = ready_with_link_bytes(&run, unique);
    let link = report["fanOut"]["linkBytes"].as_u64().unwrap();
    // The proxy also carries the registry's 401 challenges: a few KiB.
    let moved = assert_moved_about_once(&lab, bytes_before, unique, 1.05);
    eprintln!("{moved} bytes over the link for {unique} unique, {link} counted by the cache");
    // Every blob was fetched once, with pinboard's credentials; containerd never went to the registry.
    let heads = heads_since(&lab, from);
    assert!(
        !heads.iter().any(|h| h.contains("user-agent: containerd")),
        "{heads:?}"
    );
    for (digest, gets) in blob_gets(&heads, &images) {
        let authorized = gets
            .iter()
            .filter(|h| h.contains("authorization: bearer "))
            .count();
        assert_eq!(authorized, 1, "{digest}: {gets:?}");
    }
    assert_pinned_everywhere(&lab, &nodes, &images);
    assert_cache_verified(&cache);
    support::private::assert_no_secret(&lab, &[("apply --fan-out", &run)]);
}

#[test]
fn fan_out_listen_serves_the_nodes_on_the_address_given() {
    let lab = lab("fanout-listen", &["n1", "n2"], 64 * MI);
    let images = push_images(&lab, "listen/app", 8200, 3, MI, 256 * KI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let before = hosts_files(&lab, &nodes);
    let cache = tempfile::tempdir().unwrap();
    let port = support::free_port().expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    // Slow enough to look at the nodes' files and the endpoint mid-rollout.
    lab.proxy().set_bandwidth(Some(MI));
    let from = lab.proxy().request_heads().len();
    let (child, wired) = start_and_wait_until_wired(
        &lab,
        &nodes,
        args(
            &lab,
            "apply",
            &nodes,
            &images,
            &[&fan_out(&cache)[..], &["--fan-out-listen", &listen]].concat(),
        ),
        true,
    );
    for path in wired {
        let wired = std::fs::read_to_string(&path).expect("hosts.toml");
        assert!(
            wired.contains(&format!("endpoint=http://{listen}"))
                && wired.contains(&format!("[host.\"http://{listen}\"]")),
            "{}:\n{wired}",
            path.display()
        );
    }
    let answer = support::http::agent()
        .get(format!("http://{listen}/v2/"))
        .call()
        .expect("the endpoint listens where it was told");
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(
        answer
            .headers()
            .get("docker-distribution-api-version")
            .and_then(|v| v.to_str().ok()),
        Some("registry/2.0")
    );
    lab.proxy().set_bandwidth(None);
    let out = child.wait_with_output().expect("pinboard ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("2/2 nodes ready"), "{stdout}");
    assert!(
        !heads_since(&lab, from)
            .iter()
            .any(|h| h.contains("user-agent: containerd")),
        "the nodes pulled through the endpoint"
    );
    assert_pinned_everywhere(&lab, &nodes, &images);
    assert_eq!(hosts_files(&lab, &nodes), before);
    assert!(
        std::net::TcpStream::connect(&listen).is_err(),
        "the endpoint stopped with the rollout"
    );
}

#[test]
fn a_blob_corrupted_in_the_registry_fails_its_image_naming_the_mismatch_and_the_others_are_pulled()
{
    let lab = lab("fanout-corrupt", &["n1", "n2"], 64 * MI);
    let mut images = push_images(&lab, "corrupt/app", 8300, 3, MI, 256 * KI);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();
    let bad = images[1].layers[1].digest.clone();
    let stored = lab.registry_blob_file(&bad);
    let mut bytes = std::fs::read(&stored).expect("the registry's copy");
    bytes[1000] ^= 0x55;
    std::fs::write(&stored, &bytes).expect("corrupt it");
    let cache = tempfile::tempdir().unwrap();
    let from = lab.proxy().request_heads().len();
    let run = apply_fan_out_json(&lab, &nodes, &images, &cache);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("apply JSON");
    let broken = images[1].reference(&lab.proxy_host());
    for node in report["rollout"].as_array().unwrap() {
        assert_eq!(node["pulled"], 2, "{node}");
        let failed = node["failed"].as_array().unwrap();
        assert_eq!(failed.len(), 1, "{node}");
        let reason = failed[0].as_str().unwrap();
        assert!(
            reason.starts_with(&broken) && reason.contains("digest") && reason.contains(&bad),
            "the image fails naming the digest that did not match: {reason}"
        );
    }
    // pinboard says why its cache refused the blob (its first check says so; the second fetch's refusal
    // may come after containerd, falling back to the registry, already failed the pull).
    let refused = run
        .stderr
        .lines()
        .find(|l| l.contains("blob failed verification") || l.contains("digest mismatch"))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    assert!(refused.contains(&bad), "{refused}");
    // The broken image is on no node; the others were pulled (and wait for their pins: pins are written
    // only once every pull of a node succeeded).
    for node in &nodes {
        let listed = node.images_ls();
        assert!(!listed.contains(&broken), "{}: {listed}", node.name);
        for image in [&images[0], &images[2]] {
            let reference = image.reference(&lab.proxy_host());
            assert!(listed.contains(&reference), "{}: {listed}", node.name);
        }
    }
    let hex = bad.trim_start_matches("sha256:");
    for place in ["sha256", "partial"] {
        assert!(
            !cache.path().join(place).join(hex).exists(),
            "nothing of the corrupt blob stays in {place}/"
        );
    }
    assert_cache_verified(&cache);
    // The cache fetched the corrupt blob at most twice, then refused it without asking again.
    let heads = heads_since(&lab, from);
    let fetched_by = |agent: &str| {
        heads
            .iter()
            .filter(|h| {
                h.starts_with("get ")
                    && h.contains(&format!("/blobs/{bad}"))
                    && h.contains(&format!("user-agent: {agent}"))
            })
            .count()
    };
    eprintln!(
        "the corrupt blob was fetched {} time(s) by pinboard, {} by containerd (going on to the registry)",
        fetched_by("pinboard"),
        fetched_by("containerd")
    );
    // Fetched once more after the first mismatch, never a third time.
    assert!((1..=2).contains(&fetched_by("pinboard")));
    // A mismatch is not retried: asking again would download the same corrupt bytes again.
    assert!(fetched_by("containerd") <= nodes.len(), "one try per node");
    assert!(
        !run.stderr
            .lines()
            .any(|l| l.contains(&format!("{}@", images[1].repo)) && l.contains("retrying")),
        "{}",
        run.stderr
    );

    // Applied without the broken image: pinned everywhere, nothing fetched again.
    images.remove(1);
    let from = lab.proxy().request_heads().len();
    let run = support::pinboard(args(&lab, "apply", &nodes, &images, &fan_out(&cache)));
    assert_ok(&run, &lab);
    assert_no_blob_fetched_since(&lab, from);
    assert_pinned_everywhere(&lab, &nodes, &images);
}

/// `run`'s result, and what the link carried every 50 ms while it ran.
fn sampling_the_link<T>(lab: &Lab, run: impl FnOnce() -> T) -> (T, Vec<(Instant, u64)>) {
    let sampler = LinkSampler::start(lab);
    let result = run();
    (result, sampler.stop())
}

#[test]
fn a_link_budget_holds_the_registry_link_to_it_and_without_one_the_rollout_runs_at_the_links_speed()
{
    const LINK: u64 = 8 * MI;
    const BUDGET: u64 = 4 * MI;
    let lab = lab("fanout-budget", &["n1", "n2"], 512 * MI);
    lab.proxy().set_bandwidth(Some(LINK));
    // 60 MiB: 15 s at the budget, so what sits in the sockets' buffers at either end of the measure (a few
    // MiB over the connections under way) moves the rate by a few percent only.
    let budgeted = push_images(&lab, "budget/app", 7300, 6, 12 * MI, 4 * MI);
    let free = push_images(&lab, "free/app", 7400, 6, 6 * MI, 2 * MI);
    let unique = unique_bytes(&budgeted);
    let nodes: Vec<&Node> = lab.nodes().iter().collect();

    // The plan says what the budget implies.
    let plan = support::pinboard(args(
        &lab,
        "plan",
        &nodes,
        &budgeted,
        &["-o", "json", "--link-rate", "4MiB/s"],
    ));
    assert_ok(&plan, &lab);
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).expect("plan JSON");
    assert_eq!(plan["linkBytes"]["rate"], BUDGET, "{}", plan["linkBytes"]);
    assert_eq!(
        plan["linkBytes"]["fanOutSeconds"],
        unique.div_ceil(BUDGET),
        "{}",
        plan["linkBytes"]
    );

    let cache = tempfile::tempdir().unwrap();
    let budget = [
        &fan_out(&cache)[..],
        &["--link-rate", "4MiB/s", "-o", "json"],
    ]
    .concat();
    let before = lab.proxy().bytes_down();
    let (run, samples) = sampling_the_link(&lab, || {
        support::pinboard(args(&lab, "apply", &nodes, &budgeted, &budget))
    });
    assert_ok(&run, &lab);
    let report = ready_with_link_bytes(&run, unique);
    assert_eq!(report["fanOut"]["linkRate"], BUDGET, "{}", report["fanOut"]);
    assert_moved_about_once(&lab, before, unique, 1.05);
    assert_pinned_everywhere(&lab, &nodes, &budgeted);
    assert_kept_to(&samples, BUDGET, "fan-out on a link of 8 MiB/s");

    let cache = tempfile::tempdir().unwrap();
    let (run, samples) =
        sampling_the_link(&lab, || apply_fan_out_json(&lab, &nodes, &free, &cache));
    assert_ok(&run, &lab);
    let report = ready_with_link_bytes(&run, unique_bytes(&free));
    assert!(
        report["fanOut"].get("linkRate").is_none(),
        "{}",
        report["fanOut"]
    );
    let (rate, _) = middle_rates(&samples);
    eprintln!(
        "no budget on a link of 8 MiB/s: {:.2} MiB/s over the rollout",
        rate / MI as f64
    );
    // The link's own speed, give or take the moments between containerd's requests when no blob is under
    // way (measured 6.9-7.8 MiB/s on 2 busy cores): far above what the budget allowed.
    assert!(
        rate >= 0.80 * LINK as f64,
        "{:.2} MiB/s on a link of 8 MiB/s without a budget",
        rate / MI as f64
    );
}

//! Lazy pulling with the real stargz-snapshotter beside each node's containerd (issue 31), through the real
//! `pinboard` binary, with eStargz images made by `ctr-remote image convert --estargz`:
//!
//! - `lazy on --restart` writes the snapshotter's proxy plugin into the directory containerd imports and
//!   restarts containerd (`systemctl restart containerd`, as the lab's unit runs it), which then reports
//!   the snapshotter in force; an image pulled lazily (`apply --allow-lazy`) crosses the link only in
//!   part, its layers mounted from the registry: `status` shows it lazy with how much stargz fetched,
//!   `check` exits 1 naming it, `plan` counts its layers as still to fetch and to write; `apply` makes it
//!   whole (its blobs in the content store, its snapshots local), after which `check` exits 0 without
//!   --allow-lazy, even with the registry link cut and the snapshotter restarted; `lazy off --restart`
//!   returns the node to full pulls.
//! - A private eStargz image is pulled lazily with the credentials pinboard passes (through the
//!   snapshotter's CRI keychain); killed and started again, the snapshotter cannot mount its layers (the
//!   keychain kept them in memory) and exits: pinboard names the image unreadable and the node's store not
//!   serving, with the fix; with the credentials in its docker config it starts, and `apply` makes the
//!   image whole. Through an agent, the set's pull secret reaches the snapshotter the same way.
//! - A snapshotter killed mid-pull and started again: every pull ends pulled; one left down: every pull
//!   ends failed with its reason, within the retries.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinboard::backend::cri::{CriClient, DEFAULT_TIMEOUT};
use serde_json::Value;
use support::agents::{AgentsLab, AgentsSetup};
use support::estargz::EstargzSpec;
use support::kube_objects::{apply_yaml, wait_for};
use support::private::{assert_no_secret, auth_file, token_lab};
use support::tmux::Tmux;
use support::{Lab, Node, NodeSpec, PushedImage, Run, binary, pinboard_with};

const MI: u64 = 1 << 20;
const MIB: usize = 1 << 20;
/// How long an agent may take to report a change.
const AGENT_WAIT: Duration = Duration::from_secs(120);

/// `pinboard ARGS` with `node`'s `systemctl` first on `PATH`, as on the node itself.
fn pinboard_on<S: AsRef<std::ffi::OsStr>>(node: &Node, args: &[S]) -> Run {
    pinboard_with(args, |command| {
        command.env("PATH", path_with_systemctl(node));
    })
}

fn path_with_systemctl(node: &Node) -> String {
    format!(
        "{}:{}",
        node.unit().bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn json(run: Run) -> (Run, Value) {
    let value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("-o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run, value)
}

/// How pinboard names `node`: its CRI socket, containerd's config and the snapshotter's socket.
fn node_args(node: &Node) -> Vec<String> {
    vec![
        "--cri".into(),
        format!("{}={}", node.name, node.endpoint()),
        "--containerd-config".into(),
        node.config_file().display().to_string(),
        "--stargz-socket".into(),
        node.stargz().socket_in_node.display().to_string(),
    ]
}

/// `lazy ACTION -o json EXTRA…` on `node`.
fn lazy(node: &Node, action: &str, extra: &[&str]) -> (Run, Value) {
    let mut args = vec![
        "lazy".to_string(),
        action.into(),
        "-o".into(),
        "json".into(),
    ];
    args.extend(node_args(node));
    args.extend(extra.iter().map(|s| s.to_string()));
    json(pinboard_on(node, &args))
}

/// `COMMAND NODE… --image R… --insecure-registry HOSTS --min-free 1Mi EXTRA…`.
fn command<S: AsRef<str>>(
    command: &str,
    lab: &Lab,
    node: &Node,
    images: &[&str],
    extra: &[S],
) -> Vec<String> {
    let mut args = vec![command.to_string()];
    args.extend(node_args(node));
    for image in images {
        args.extend(["--image".into(), image.to_string()]);
    }
    for host in [lab.registry_host(), lab.proxy_host()] {
        args.extend(["--insecure-registry".into(), host]);
    }
    args.extend(["--min-free".into(), "1Mi".into()]);
    args.extend(extra.iter().map(|s| s.as_ref().to_string()));
    args
}

/// The snapshotter containerd's CRI plugin reports in force on `node`.
fn in_force(node: &Node) -> Option<String> {
    let endpoint = node.endpoint().parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = CriClient::connect(&endpoint, DEFAULT_TIMEOUT)
            .await
            .unwrap();
        client.cri_snapshotter().await.unwrap()
    })
}

/// The snapshots of `node`'s stargz snapshotter labelled remote (`ctr snapshots info`).
fn remote_snapshots(node: &Node) -> usize {
    let listed = node
        .ctr(&["snapshots", "--snapshotter", "stargz", "ls"])
        .unwrap();
    listed
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .filter(|key| {
            node.ctr(&["snapshots", "--snapshotter", "stargz", "info", key])
                .unwrap()
                .contains("containerd.io/snapshot/remote")
        })
        .count()
}

/// Whether `node`'s content store holds every layer blob of `image`.
fn blobs_held(node: &Node, image: &PushedImage) -> bool {
    let listed = node.ctr(&["content", "ls", "-q"]).unwrap();
    image.layers.iter().all(|l| listed.contains(&l.digest))
}

/// busybox and a small file, then two layers of 3 MiB of incompressible bytes from `seed`.
fn app(seed: u64) -> EstargzSpec {
    EstargzSpec::with_busybox("read from a lazy layer\n", seed, &[3 * MIB, 3 * MIB])
}

crate::on_runtimes! {
    /// On each containerd of the matrix: the lazy-pulling file in its config's version (2 repeats the CRI
    /// section, 3 sets only the keys), the snapshotter in force as containerd says it (containerd 2 through
    /// the image filesystem it names), and the whole pull through its content, leases, snapshots and diff
    /// services.
    [containerd_1_6, containerd_1_7, containerd_2_1]
    fn lazy_on_pulls_lazily_through_the_real_snapshotter_and_apply_makes_the_image_whole(runtime) {
        let metrics = format!("127.0.0.1:{}", support::free_port().unwrap());
        let mut lab = Lab::with_nodes(
            "stargz-whole",
            vec![
                NodeSpec::new("n1", 256 * MI)
                    .with_stargz()
                    .serving_metrics(&metrics)
                    .on(runtime),
            ],
        );
        let node = lab.node("n1");
        let pushed = lab.push_estargz("stargz/app", &app(3100)).unwrap();
        let image = pushed.reference(&lab.proxy_host());
        let layer_bytes: u64 = pushed.layers.iter().map(|l| l.size).sum();

        let (_, off) = lazy(node, "status", &[]);
        assert_eq!(off["nodes"][0]["lazyPulling"]["text"], "off", "{off}");

        // On, and containerd restarted with the snapshotter in force.
        let (run, on) = lazy(node, "on", &["--restart"]);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        let n1 = &on["nodes"][0];
        assert_eq!(n1["change"], "written", "{n1}");
        assert_eq!(n1["restarted"], "systemctl restart containerd", "{n1}");
        assert_eq!(n1["lazyPulling"]["text"], "on (stargz, in force)", "{n1}");
        assert_eq!(n1["lazyPulling"]["storeServing"], true, "{n1}");
        assert_eq!(node.unit().systemctl_calls(), ["restart containerd"]);
        assert_eq!(in_force(node).as_deref(), Some("stargz"));
        let written: toml_edit::DocumentMut =
            std::fs::read_to_string(node.dir().join("conf.d/zz-pinboard-lazy-pulling.toml"))
                .unwrap()
                .parse()
                .unwrap();
        assert_eq!(
            written["proxy_plugins"]["stargz"]["address"].as_str(),
            node.stargz().socket_in_node.to_str()
        );
        match runtime.containerd_config_version() {
            3 => {
                let images = &written["plugins"]["io.containerd.cri.v1.images"];
                assert_eq!(images["snapshotter"].as_str(), Some("stargz"));
                assert_eq!(images["disable_snapshot_annotations"].as_bool(), Some(false));
                assert!(
                    written["plugins"].get("io.containerd.grpc.v1.cri").is_none(),
                    "version 3 merges key by key: nothing repeated"
                );
            }
            _ => {
                let certs = node.dir().join("certs.d").display().to_string();
                assert_eq!(
                    written["plugins"]["io.containerd.grpc.v1.cri"]["registry"]["config_path"].as_str(),
                    Some(certs.as_str()),
                    "the CRI section in force, repeated"
                );
            }
        }

        // Pulled lazily over a slow link: a small part of its layers crosses it, each layer is mounted.
        lab.proxy().set_bandwidth(Some(256 * 1024));
        let before = lab.proxy().bytes_down();
        let run = pinboard_on(
            node,
            &command("apply", &lab, node, &[&image], &["--allow-lazy"]),
        );
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        let lazily = lab.proxy().bytes_down() - before;
        assert!(
            lazily < layer_bytes / 5,
            "{lazily} bytes crossed the link for {layer_bytes} bytes of layers"
        );
        assert_eq!(node.stargz_mounts().len(), 3, "each layer mounted");
        assert_eq!(remote_snapshots(node), 3);
        assert!(!blobs_held(node, &pushed));

        let (run, status) = json(pinboard_on(
            node,
            &command("status", &lab, node, &[&image], &["-o", "json"]),
        ));
        assert_eq!(run.code, 0, "{}", run.stderr);
        let said = &status["nodes"][0]["images"][0]["lazy"];
        assert_eq!(
            said["remoteLayers"],
            serde_json::json!([0, 1, 2]),
            "{status}"
        );
        let (fetched, of) = (
            said["fetched"]["bytes"].as_u64().unwrap(),
            said["fetched"]["of"].as_u64().unwrap(),
        );
        assert_eq!(of, layer_bytes, "stargz's sizes are the layers'");
        assert!(fetched < of, "{said}");
        let run = pinboard_on(
            node,
            &command("status", &lab, node, &[&image], &[] as &[&str]),
        );
        assert!(
            run.stdout.contains("~ lazy (3 of 3 layers remote, ") && run.stdout.contains("% fetched)"),
            "{}",
            run.stdout
        );

        let run = pinboard_on(
            node,
            &command("check", &lab, node, &[&image], &[] as &[&str]),
        );
        assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
        assert!(
            run.stderr
                .contains(&format!("{image} (3 of 3 layers remote, "))
                && run
                    .stderr
                    .contains("`pinboard apply` makes them whole: it fetches their layers"),
            "{}",
            run.stderr
        );
        // Unpinned, still lazy, as a kubelet's lazy pull leaves an image: named lazily present first, with
        // the bytes still only in the registry; the JSON reason is `lazy`, not `not-pinned`.
        node.clear_label(&image, "io.cri-containerd.pinned");
        let (run, judged) = json(pinboard_on(
            node,
            &command("check", &lab, node, &[&image], &["-o", "json"]),
        ));
        assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
        let n1 = &judged["nodes"][0];
        assert_eq!(n1["images"][0]["reason"], "lazy", "{n1}");
        assert_eq!(n1["images"][0]["pinned"], false, "{n1}");
        let reasons = n1["reasons"].to_string();
        assert!(
            reasons.contains("1 image present only lazily, and not pinned")
                && reasons.contains("only in the registry"),
            "{reasons}"
        );
        let (run, plan) = json(pinboard_on(
            node,
            &command("plan", &lab, node, &[&image], &["-o", "json"]),
        ));
        assert_eq!(run.code, 0, "{}", run.stderr);
        let planned = &plan["nodes"][0]["images"][0];
        assert_eq!(planned["fetchBytes"], layer_bytes, "{planned}");
        assert!(
            planned["estimatedDiskBytes"].as_u64().unwrap() >= layer_bytes,
            "written whole: {planned}"
        );

        // apply makes it whole: every blob in the content store, every snapshot local, nothing mounted.
        lab.proxy().set_bandwidth(None);
        let (before, started) = (lab.proxy().bytes_down(), Instant::now());
        let (run, applied) = json(pinboard_on(
            node,
            &command("apply", &lab, node, &[&image], &["-o", "json"]),
        ));
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        let (moved, took) = (lab.proxy().bytes_down() - before, started.elapsed());
        eprintln!(
            "made whole: {moved} bytes over the link in {took:?}, for {layer_bytes} bytes of layers \
             ({lazily} bytes crossed it for the lazy pull)"
        );
        assert!(
            (layer_bytes..layer_bytes + layer_bytes / 10).contains(&moved),
            "each layer fetched once, whole: {moved} bytes for {layer_bytes}"
        );
        let n1 = &applied["rollout"][0];
        assert_eq!([&n1["lazy"], &n1["pulled"]], [0, 1], "{n1}");
        assert!(n1["fetchedBytes"].as_u64().unwrap() >= layer_bytes, "{n1}");
        assert!(blobs_held(node, &pushed));
        assert_eq!(remote_snapshots(node), 0);
        // The snapshotter unmounts a removed remote layer in the background.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !node.stargz_mounts().is_empty() {
            assert!(
                Instant::now() < deadline,
                "still mounted: {:?}",
                node.stargz_mounts()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let run = pinboard_on(
            node,
            &command("check", &lab, node, &[&image], &[] as &[&str]),
        );
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

        // containerd's counts of the calls it answered go with its restart: what it counted so far, before
        // the snapshotter is killed (containerd 1.6 answers Unknown for a snapshotter that is gone).
        let mut answered = lab.node("n1").grpc_calls();

        // Pre-loaded for real: with the link cut, the snapshotter restarts and the image stays ready.
        lab.proxy().fail_requests(503, u64::MAX, None);
        lab.kill_stargz("n1").unwrap();
        lab.start_stargz("n1")
            .expect("nothing to mount from the registry");
        let node = lab.node("n1");
        let run = pinboard_on(
            node,
            &command("check", &lab, node, &[&image], &[] as &[&str]),
        );
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        lab.proxy().clear_faults();

        // Off: containerd restarted with its own snapshotter; a new image is pulled whole by it.
        let (run, off) = lazy(node, "off", &["--restart"]);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        assert_eq!(off["nodes"][0]["lazyPulling"]["text"], "off", "{off}");
        assert_eq!(in_force(node).as_deref(), Some("native"));
        let other = lab.push_estargz("stargz/other", &app(3200)).unwrap();
        let reference = other.reference(&lab.proxy_host());
        let run = pinboard_on(
            node,
            &command("apply", &lab, node, &[&reference], &[] as &[&str]),
        );
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        assert!(blobs_held(node, &other));
        for (call, count) in node.grpc_calls() {
            *answered.entry(call).or_default() += count;
        }
        support::runtime::assert_answered(runtime, &PINBOARD_CALLS, &answered);
    }
}

/// Every call pinboard makes to containerd, over CRI and to its own services (pins, progress, the
/// content it holds, remote layers, whole pulls), as the flow above makes them.
const PINBOARD_CALLS: [&str; 20] = [
    "RuntimeService/Version",
    "RuntimeService/Status",
    "ImageService/ListImages",
    "ImageService/ImageStatus",
    "ImageService/PullImage",
    "ImageService/ImageFsInfo",
    "Images/List",
    "Images/Get",
    "Images/Update",
    "Content/Info",
    "Content/List",
    "Content/ListStatuses",
    "Content/Read",
    "Content/Write",
    "Leases/Create",
    "Leases/Delete",
    "Snapshots/List",
    "Snapshots/Prepare",
    "Snapshots/Commit",
    "Diff/Apply",
];

#[test]
fn a_private_estargz_image_is_pulled_lazily_with_pinboards_credentials_and_a_lost_one_is_named() {
    let mut lab = token_lab(
        "stargz-private",
        vec![NodeSpec::new("n1", 256 * MI).with_stargz()],
    );
    let pushed = lab.push_estargz("private/lazy", &app(3300)).unwrap();
    let image = pushed.reference(&lab.registry_host());
    let authfile = auth_file(lab.dir(), &lab.registry_host());
    let with_auth = |extra: &[&'static str]| -> Vec<String> {
        let mut args = vec!["--authfile".to_string(), authfile.clone()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let node = lab.node("n1");
    let (run, _) = lazy(node, "on", &["--restart"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // Lazily: the snapshotter mounted the private layers with the credentials pinboard sent.
    let lazily = pinboard_on(
        node,
        &command(
            "apply",
            &lab,
            node,
            &[&image],
            &with_auth(&["--allow-lazy"]),
        ),
    );
    assert_eq!(lazily.code, 0, "{}\n{}", lazily.stdout, lazily.stderr);
    assert_eq!(remote_snapshots(node), 3, "mounted from the registry");
    assert!(!blobs_held(node, &pushed));

    // Restarted, the snapshotter has lost them (its CRI keychain keeps them in memory): it cannot mount
    // the layers from the registry and exits.
    lab.kill_stargz("n1").unwrap();
    let refused = lab.start_stargz("n1").unwrap_err();
    assert!(
        format!("{refused:#}").contains("failed to restore remote snapshot"),
        "{refused:#}"
    );
    let node = lab.node("n1");
    let broken = pinboard_on(
        node,
        &command("check", &lab, node, &[&image], &with_auth(&[])),
    );
    assert_eq!(broken.code, 1, "{}\n{}", broken.stdout, broken.stderr);
    assert!(
        broken.stderr.contains(&format!(
            "1 image unreadable, its snapshotter not serving: {image} (3 of 3 layers remote, not \
             served): the snapshotter stargz does not answer"
        )) && broken
            .stderr
            .contains("$DOCKER_CONFIG/config.json: those it took from CRI pulls are lost"),
        "{}",
        broken.stderr
    );
    let (_, status) = lazy(node, "status", &[]);
    assert_eq!(
        status["nodes"][0]["lazyPulling"]["text"], "configured but store not serving",
        "{status}"
    );
    // Its pulls end failed with the reason, not hung.
    let started = Instant::now();
    let (failed, report) = json(pinboard_on(
        node,
        &command("apply", &lab, node, &[&image], &with_auth(&["-o", "json"])),
    ));
    assert_eq!(failed.code, 1, "{}\n{}", failed.stdout, failed.stderr);
    assert!(
        report["rollout"][0]["failed"][0]
            .as_str()
            .is_some_and(|f| f.contains("the snapshotter stargz does not answer")),
        "{report}"
    );
    assert!(started.elapsed() < Duration::from_secs(120));

    // The fix: the credentials where its docker-config keychain reads them.
    let docker = &node.stargz().docker_config;
    std::fs::copy(&authfile, docker.join("config.json")).unwrap();
    lab.start_stargz("n1")
        .expect("it mounts the layers with the docker config's credentials");
    let node = lab.node("n1");
    let whole = pinboard_on(
        node,
        &command("apply", &lab, node, &[&image], &with_auth(&[])),
    );
    assert_eq!(whole.code, 0, "{}\n{}", whole.stdout, whole.stderr);
    assert!(blobs_held(node, &pushed));
    assert_eq!(remote_snapshots(node), 0);
    assert_no_secret(
        &lab,
        &[
            ("lazy apply", &lazily),
            ("check", &broken),
            ("failed apply", &failed),
            ("whole apply", &whole),
        ],
    );
}

/// Polls `probe` every 20 ms until it gives a value, and returns it with how long that took; fails when
/// `limit` passes first, with what `said` says then.
fn polled<T>(
    limit: Duration,
    mut probe: impl FnMut() -> Option<T>,
    said: impl Fn() -> String,
) -> (T, Duration) {
    let started = Instant::now();
    loop {
        if let Some(value) = probe() {
            return (value, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "not within {limit:?}: {}",
            said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pinboard running in the background, its stderr read as it comes.
struct Background {
    child: std::process::Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// `apply -o json` of `images` on `node`.
    fn apply(lab: &Lab, node: &Node, images: &[&str], extra: &[&str]) -> Background {
        let mut child = Command::new(binary())
            .args(command(
                "apply",
                lab,
                node,
                images,
                &[&["-o", "json"][..], extra].concat(),
            ))
            .env("PATH", path_with_systemctl(node))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pinboard starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped");
        let filling = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut chunk) {
                let text = String::from_utf8_lossy(&chunk[..n]).into_owned();
                filling.lock().unwrap().push_str(&text);
            }
        });
        Background {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    /// What it wrote to stderr so far.
    fn said(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until its stderr says `text`.
    fn wait_for(&self, text: &str, limit: Duration) {
        polled(
            limit,
            || self.said().contains(text).then_some(()),
            || format!("{text:?}:\n{}", self.said()),
        );
    }

    /// Waits for it to end within `limit`: its exit code, JSON and stderr.
    fn finish(mut self, limit: Duration) -> (i32, Value, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < limit,
                "pinboard still running after {limit:?}: a pull hangs"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut stdout = String::new();
        let mut pipe = self.child.stdout.take().expect("piped");
        std::io::Read::read_to_string(&mut pipe, &mut stdout).unwrap();
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let stderr = self.stderr.lock().unwrap().clone();
        let value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("-o json ({e}): {stdout}\n{stderr}"));
        (status.code().unwrap(), value, stderr)
    }
}

/// Waits until `node`'s snapshotter logs, after its first `from` bytes, that it mounts a layer from the
/// registry.
fn wait_mounting(node: &Node, from: usize) {
    let mounting = || {
        let log = std::fs::read_to_string(&node.stargz().log).unwrap_or_default();
        log.get(from..)
            .is_some_and(|l| l.contains("preparing filesystem mount"))
            .then_some(())
    };
    polled(Duration::from_secs(60), mounting, || {
        "the snapshotter mounted nothing".into()
    });
}

#[test]
fn a_snapshotter_killed_mid_pull_leaves_every_pull_pulled_or_failed_with_its_reason() {
    let mut lab = Lab::with_nodes(
        "stargz-killed",
        vec![NodeSpec::new("n1", 256 * MI).with_stargz()],
    );
    let (run, _) = lazy(lab.node("n1"), "on", &["--restart"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let images: Vec<String> = (0..4)
        .map(|i| {
            lab.push_estargz(&format!("stargz/k{i}"), &app(3400 + 10 * i))
                .unwrap()
                .reference(&lab.proxy_host())
        })
        .collect();
    let reason = |report: &Value| {
        report["rollout"][0]["failed"][0]
            .as_str()
            .map(str::to_string)
    };

    // Killed while it mounts a layer for a lazy pull (the registry slow to answer), then started again:
    // the pull fails, is tried again, and is pulled.
    let log_before = std::fs::read_to_string(&lab.node("n1").stargz().log)
        .unwrap()
        .len();
    lab.proxy().set_delay(Duration::from_millis(1500));
    let lazily = Background::apply(&lab, lab.node("n1"), &[&images[0]], &["--allow-lazy"]);
    wait_mounting(lab.node("n1"), log_before);
    lab.kill_stargz("n1").unwrap();
    lab.proxy().set_delay(Duration::ZERO);
    lab.start_stargz("n1").unwrap();
    let (code, report, stderr) = lazily.finish(Duration::from_secs(120));
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["rollout"][0]["pulled"], 1, "{report}");
    assert!(stderr.contains("attempt 1 failed, retrying"), "{stderr}");

    // Down when a whole pull's blobs are in: its swap fails and is tried again until it serves again.
    lab.kill_stargz("n1").unwrap();
    let whole = Background::apply(&lab, lab.node("n1"), &[&images[1]], &[]);
    whole.wait_for(
        "the snapshotter stargz does not answer",
        Duration::from_secs(60),
    );
    lab.start_stargz("n1").unwrap();
    let (code, report, stderr) = whole.finish(Duration::from_secs(120));
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["rollout"][0]["pulled"], 1, "{report}");

    // Left down: lazy and whole pulls alike end failed, each with the reason, within their retries.
    lab.kill_stargz("n1").unwrap();
    let node = lab.node("n1");
    for (image, extra, why) in [
        (
            &images[2],
            &["--allow-lazy"][..],
            "stargz.sock: connect: connection refused",
        ),
        (
            &images[3],
            &[][..],
            "the snapshotter stargz does not answer",
        ),
    ] {
        let (code, report, stderr) =
            Background::apply(&lab, node, &[image], extra).finish(Duration::from_secs(120));
        assert_eq!(code, 1, "{report}\n{stderr}");
        let failed = reason(&report).unwrap_or_default();
        assert!(
            failed.starts_with(&format!("{image}: ")) && failed.contains(why),
            "{report}"
        );
    }
}

/// Waits until the lab's link carried `bytes` since `before`.
fn wait_link(lab: &Lab, before: u64, bytes: u64) {
    polled(
        Duration::from_secs(60),
        || (lab.proxy().bytes_down() - before >= bytes).then_some(()),
        || format!("{bytes} bytes over the link"),
    );
}

/// An eStargz image of three 4 MiB layers per seed, pushed as `REPO<seed>`: their references through the
/// lab's proxy, and their unique bytes.
fn push_through_proxy(lab: &Lab, repo: &str, seeds: std::ops::Range<u64>) -> (Vec<String>, u64) {
    let images: Vec<PushedImage> = seeds
        .map(|seed| {
            let spec = EstargzSpec::with_busybox("resumed\n", seed, &[4 * MIB, 4 * MIB, 4 * MIB]);
            lab.push_estargz(&format!("{repo}{seed}"), &spec).unwrap()
        })
        .collect();
    let references = images
        .iter()
        .map(|i| i.reference(&lab.proxy_host()))
        .collect();
    (references, support::unique_bytes(&images))
}

/// A whole pull interrupted (the snapshotter killed for longer than a swap waits for it; containerd
/// killed and started again mid-download) goes on from what reached the content store: the set ends
/// pinned and its bytes cross the throttled link about once.
#[test]
fn whole_pulls_interrupted_by_the_snapshotter_or_containerd_resume_and_cross_the_link_once() {
    let mut lab = Lab::with_nodes(
        "stargz-resume",
        vec![NodeSpec::new("n1", 512 * MI).with_stargz()],
    );
    let (run, _) = lazy(lab.node("n1"), "on", &["--restart"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    lab.proxy().set_bandwidth(Some(4 * MI));
    // The snapshotter killed a quarter into the set and kept down past two attempts' patience: they fail,
    // and the next one finds every blob still there.
    let (references, unique) = push_through_proxy(&lab, "resume/s", 3500..3504);
    let refs: Vec<&str> = references.iter().map(String::as_str).collect();
    let before = lab.proxy().bytes_down();
    let apply = Background::apply(&lab, lab.node("n1"), &refs, &[]);
    wait_link(&lab, before, unique / 4);
    lab.kill_stargz("n1").unwrap();
    apply.wait_for("attempt 2 failed", Duration::from_secs(120));
    assert!(
        apply
            .said()
            .contains("the snapshotter stargz does not answer"),
        "{}",
        apply.said()
    );
    lab.start_stargz("n1").unwrap();
    let (code, report, stderr) = apply.finish(Duration::from_secs(180));
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["rollout"][0]["pulled"], 4, "{report}");
    lab.node("n1").assert_pinned(&references);
    lab.assert_moved_at_most("snapshotter killed mid-apply", before, unique, 1.3);

    // containerd killed a third into another set and started again: the ingests keep what was written.
    let (references, unique) = push_through_proxy(&lab, "resume/c", 3600..3603);
    let refs: Vec<&str> = references.iter().map(String::as_str).collect();
    let before = lab.proxy().bytes_down();
    let apply = Background::apply(&lab, lab.node("n1"), &refs, &[]);
    wait_link(&lab, before, unique / 3);
    lab.restart_node("n1").unwrap();
    let (code, report, stderr) = apply.finish(Duration::from_secs(180));
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["rollout"][0]["pulled"], 3, "{report}");
    assert!(stderr.contains("retrying"), "an attempt failed: {stderr}");
    lab.node("n1").assert_pinned(&references);
    lab.assert_moved_at_most("containerd killed mid-apply", before, unique, 1.3);
}

/// What `pinboard lazy status` says of the lab's one node, through its agent.
fn lazy_text(lab: &AgentsLab) -> String {
    let run = lab.pinboard(&["lazy", "status", "-o", "json"]);
    let said: Value = serde_json::from_str(&run.stdout).unwrap_or_default();
    said["nodes"][0]["lazyPulling"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Lazy pulling on through n1's agent (started with its containerd's config and `agent_args`), containerd
/// restarted by the node's administrator and the agent with it (it reads its node's facts at its start,
/// else every five minutes); returns once the agent reports stargz in force, with the config's path.
async fn lazy_on_through_the_agent(lab: &mut AgentsLab, agent_args: &[&str]) -> String {
    let config = lab.lab.node("n1").config_file().display().to_string();
    let args = [&["--containerd-config", config.as_str()][..], agent_args].concat();
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &args);
    // The agent started without the config reported that it could not read lazy pulling: `lazy on` would
    // take that report, not yet the new agent's, for its answer.
    wait_for("the agent reading lazy pulling", AGENT_WAIT, || async {
        let report = lab.reports().await.into_iter().next().unwrap_or_default();
        let status = &report["status"];
        (status["lazyPulling"].is_object() && status.get("lazyPullingError").is_none())
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    let run = lab.pinboard(&["lazy", "on", "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    lab.lab.restart_node("n1").unwrap();
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &args);
    wait_for(
        "the agent reporting stargz in force",
        AGENT_WAIT,
        || async {
            let text = lazy_text(lab);
            (text == "on (stargz, in force)").then_some(()).ok_or(text)
        },
    )
    .await;
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn through_an_agent_a_lazily_pulled_image_is_named_then_made_whole() {
    let mut lab = AgentsLab::start(
        "stargz-agents",
        vec![NodeSpec::new("n1", 256 * MI).with_stargz()],
        None,
    )
    .await;
    // A node whose sets are for a fast start: its agent pulls lazily.
    let config = lazy_on_through_the_agent(&mut lab, &["--allow-lazy"]).await;

    let pushed = lab.lab.push_estargz("stargz/agent", &app(3600)).unwrap();
    let image = pushed.reference(&lab.lab.registry_host());
    let set = lab.set_file("lazy-app", &[&image], "");
    let set = set.to_str().unwrap();
    let run = lab.pinboard(&["apply", "--set", set, "--timeout", "1s"]);
    assert_ne!(run.code, 2, "{}", run.stderr);
    let n1 = wait_for("n1 judged lazily present", AGENT_WAIT, || async {
        let (code, judged, stderr) = lab.check(&["--set", "lazy-app"]);
        let n1 = judged.nodes.into_iter().next().ok_or(stderr.clone())?;
        let named = n1.reasons.iter().any(|r| {
            r.contains("present only lazily")
                && r.contains(&format!("{image} (3 of 3 layers remote, "))
                && r.contains("% fetched)")
        });
        (code == 1 && named).then_some(n1).ok_or(stderr)
    })
    .await;
    assert!(!n1.ready);
    let node = lab.lab.node("n1");
    assert!(!blobs_held(node, &pushed));
    assert_eq!(remote_snapshots(node), 3);

    // Its agent for pre-loading (the default) puts the image back whole.
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--containerd-config", &config]);
    wait_for("n1 ready", AGENT_WAIT, || async {
        let (code, _, stderr) = lab.check(&["--set", "lazy-app"]);
        (code == 0).then_some(()).ok_or(stderr)
    })
    .await;
    let node = lab.lab.node("n1");
    assert!(blobs_held(node, &pushed));
    assert_eq!(remote_snapshots(node), 0);

    // Off through the agent, containerd restarted: off.
    let run = lab.pinboard(&["lazy", "off", "-o", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    lab.lab.restart_node("n1").unwrap();
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--containerd-config", &config]);
    wait_for("the agent reporting it off", AGENT_WAIT, || async {
        let text = lazy_text(&lab);
        (text == "off").then_some(()).ok_or(text)
    })
    .await;
}

/// A private eStargz image through an agent: the set's pull secret reaches the snapshotter through the
/// agent's CRI pull, which mounts the layers from the token registry; the agent for pre-loading then makes
/// the image whole; no secret reaches the agent's log or pinboard's output.
#[tokio::test(flavor = "multi_thread")]
async fn through_an_agent_a_private_estargz_image_is_pulled_lazily_with_the_sets_pull_secret() {
    let setup = AgentsSetup {
        agent_args: vec!["--insecure-registry={proxy}".into()],
        registry: support::private::token_registry(),
        ..AgentsSetup::default()
    };
    let mut lab = AgentsLab::start_with(
        "stargz-agents-private",
        vec![NodeSpec::new("n1", 256 * MI).with_stargz()],
        None,
        setup,
    )
    .await;
    let config = lazy_on_through_the_agent(&mut lab, &["--allow-lazy"]).await;

    let registry = lab.lab.registry_host();
    let pushed = lab.lab.push_estargz("private/lazy", &app(3700)).unwrap();
    let image = pushed.reference(&registry);
    let auth =
        serde_json::json!({"auths": {&registry: {"auth": support::private::encoded_login()}}});
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: registry-login\n  namespace: {}\n\
         type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{auth}'\n",
        support::agents::NAMESPACE
    );
    apply_yaml(&lab.admin, &secret).await;
    let set = lab.set_file(
        "private-lazy",
        &[&image],
        "  pullSecrets:\n  - name: registry-login\n",
    );
    let applied = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "1s"]);
    assert_ne!(applied.code, 2, "{}", applied.stderr);
    let lazily = wait_for("n1 judged lazily present", AGENT_WAIT, || async {
        let (code, judged, stderr) = lab.check(&["--set", "private-lazy"]);
        let n1 = judged.nodes.into_iter().next().ok_or(stderr.clone())?;
        let named = n1.reasons.iter().any(|r| {
            r.contains("present only lazily")
                && r.contains(&format!("{image} (3 of 3 layers remote, "))
        });
        (code == 1 && named).then_some(stderr.clone()).ok_or(stderr)
    })
    .await;
    let node = lab.lab.node("n1");
    assert_eq!(remote_snapshots(node), 3, "mounted from the token registry");
    assert!(!blobs_held(node, &pushed));

    // The agent for pre-loading makes it whole, with the same secret.
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--containerd-config", &config]);
    wait_for("n1 ready", AGENT_WAIT, || async {
        let (code, _, stderr) = lab.check(&["--set", "private-lazy"]);
        (code == 0).then_some(()).ok_or(stderr)
    })
    .await;
    let node = lab.lab.node("n1");
    assert!(blobs_held(node, &pushed));
    assert_eq!(remote_snapshots(node), 0);
    let log = std::fs::read_to_string(lab.lab.dir().join("agent-n1.log")).unwrap();
    for secret in [
        support::private::PASSWORD.to_string(),
        support::private::encoded_login(),
    ] {
        assert!(!log.contains(&secret), "the agent logged a registry secret");
        assert!(!lazily.contains(&secret), "check printed a registry secret");
        assert!(!applied.stdout.contains(&secret) && !applied.stderr.contains(&secret));
    }
}

/// A snapshotter down while an agent pulls a set whole: the set ends failed on that node with the reason,
/// within the pull's retries (never hung), and once the snapshotter serves again the agent's next try pins
/// it.
#[tokio::test(flavor = "multi_thread")]
async fn through_an_agent_a_snapshotter_down_fails_the_set_with_the_reason_and_its_return_pins_it()
{
    let mut lab = AgentsLab::start(
        "stargz-agents-down",
        vec![NodeSpec::new("n1", 256 * MI).with_stargz()],
        None,
    )
    .await;
    lazy_on_through_the_agent(&mut lab, &[]).await;

    let pushed = lab.lab.push_estargz("stargz/down", &app(3800)).unwrap();
    let image = pushed.reference(&lab.lab.registry_host());
    lab.lab.kill_stargz("n1").unwrap();
    let set = lab.set_file("down", &[&image], "");
    let started = Instant::now();
    let run = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "1s"]);
    assert_ne!(run.code, 2, "{}", run.stderr);
    // Its Degraded condition leads with the image's own reason, not only a count of failures.
    let failed = wait_for("n1's set failed with the reason", AGENT_WAIT, || async {
        let report = lab.reports().await.into_iter().next().unwrap_or_default();
        let set = &report["status"]["sets"][0];
        let degraded = set["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Degraded")
            .cloned()
            .unwrap_or_default();
        let named = degraded["message"].as_str().is_some_and(|m| {
            m.starts_with(&format!("{image}: whole pull: "))
                && m.contains("containerd-stargz-grpc.sock: connect: connection refused")
        });
        (set["state"] == "failed" && named)
            .then_some(started.elapsed())
            .ok_or(set.to_string())
    })
    .await;
    eprintln!("failed with the reason after {:.1} s", failed.as_secs_f64());
    let (code, judged, stderr) = lab.check(&["--set", "down"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        judged.nodes[0]
            .reasons
            .iter()
            .any(|r| r.contains(&format!("{image}: whole pull: "))),
        "check names the image and why: {:?}",
        judged.nodes[0].reasons
    );

    lab.lab.start_stargz("n1").unwrap();
    wait_for("n1 ready once stargz serves", AGENT_WAIT, || async {
        let (code, _, stderr) = lab.check(&["--set", "down"]);
        (code == 0).then_some(()).ok_or(stderr)
    })
    .await;
    let node = lab.lab.node("n1");
    assert!(blobs_held(node, &pushed), "pulled whole");
}

/// Waits for `node`'s row of the Nodes screen to say `state`, and says how long it took.
fn row_says(tmux: &Tmux, node: &str, state: &str, limit: Duration) -> Duration {
    let says = || {
        let screen = tmux.screen();
        let row = screen
            .lines()
            .find(|l| l.contains(&format!("│{node} ")) && l.contains("containerd"));
        row.is_some_and(|r| r.contains(state)).then_some(())
    };
    let screen = || format!("{node} not {state:?}:\n{}", tmux.screen());
    polled(limit, says, screen).1
}

#[test]
fn the_tui_shows_each_lazy_pulling_change_l_and_the_snapshotter_make_within_a_second() {
    let mut lab = Lab::with_nodes(
        "stargz-tui",
        vec![NodeSpec::new("n1", 64 * MI).with_stargz()],
    );
    let node = lab.node("n1");
    let command = format!(
        "XDG_STATE_HOME={state} {bin} {node}; echo EXITED $?; sleep 60",
        state = lab.dir().join("tui-state").display(),
        bin = env!("CARGO_BIN_EXE_pinboard"),
        node = node_args(node).join(" "),
    );
    let tmux = Tmux::start("stargz-tui", 120, 30, &command);
    tmux.wait_for("1/1 reachable", Duration::from_secs(20));
    tmux.keys(&["1"]);
    row_says(&tmux, "n1", " off ", Duration::from_secs(10));
    let second = Duration::from_secs(1);
    let systemctl = |lab: &Lab| {
        let node = lab.node("n1");
        let restarted = Command::new(node.unit().bin.join("systemctl"))
            .args(["restart", "containerd"])
            .status()
            .unwrap();
        assert!(restarted.success());
    };
    // After a key, the TUI's own redraw comes first.
    let key = second + Duration::from_millis(150);
    let steps = [
        ("L", "on after restart", key),
        (
            "systemctl restart containerd",
            "on (stargz, in force)",
            second,
        ),
        ("snapshotter killed", "store not serving", second),
        ("snapshotter started", "on (stargz, in force)", second),
        ("L", "off after restart", key),
        ("systemctl restart containerd", " off ", second),
    ];
    let mut took = Vec::new();
    for (step, state, limit) in steps {
        match step {
            "L" => tmux.keys(&["L"]),
            "snapshotter killed" => lab.kill_stargz("n1").unwrap(),
            "snapshotter started" => lab.start_stargz("n1").unwrap(),
            _ => systemctl(&lab),
        }
        took.push((step, row_says(&tmux, "n1", state, limit)));
    }
    eprintln!("each change shown after {took:?}");
}

//! Lazy pulling as each runtime does it, through the real `pinboard` binary against the lab (issue 22; the
//! real stargz-snapshotter's lazy pulls and whole pulls are tests/it/stargz.rs):
//!
//! - A containerd node whose config imports a directory, with stargz-snapshotter beside it: `pinboard lazy
//!   on` writes the snapshotter's proxy plugin and the CRI plugin's snapshotter there, repeating the CRI
//!   section in force (containerd 1.x replaces it whole), and nothing under containers-storage, warning
//!   while the snapshotter is down; containerd restarted on that config starts, keeps its registry
//!   `config_path`, and reports the snapshotter; `status` and `lazy status` say what it reports
//!   (`configured but store not serving` while the snapshotter is down, `on (stargz, in force)` once it
//!   serves); `lazy off` then a restart, `off`.
//! - A node whose config imports nothing: the line to add is shown, with where, and nothing is written.
//! - A CRI-O stand-in image whose layers are additional-layer-store layers (played: CRI-O and stargz-store
//!   cannot run here) is judged lazily present: `check` exits 1 naming it with its remote layer count,
//!   `check --allow-lazy` exits 0, `plan` counts its layers' bytes as still to fetch (for the link: CRI-O's
//!   stays lazy), `status` shows `lazy (3 of 3 layers remote)`; `lazy on --restart` writes CRI-O's storage
//!   drop-in and restarts CRI-O.
//! - A node reached over TCP has its lazy pulling said unknown, with why, not read from this machine's
//!   files.

use crate::support;

use std::path::{Path, PathBuf};

use pinboard::backend::cri::{CriClient, DEFAULT_TIMEOUT};
use serde_json::Value;
use support::crio::CrioStandIn;
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, PushedImage, Run, Runtime,
    pinboard, pinboard_with,
};

const MI: u64 = 1 << 20;

/// An image of three gzip layers of 128 KiB from `seed`.
fn three_layers(seed: u64) -> ImageSpec {
    ImageSpec {
        layers: (0..3)
            .map(|i| LayerSpec {
                seed: seed + i,
                bytes: 128 * 1024,
                format: LayerFormat::Gzip,
            })
            .collect(),
        ..ImageSpec::default()
    }
}

/// `lazy ACTION -o json` on node n1 of `lab`, its containerd config and stargz socket named, and a
/// containers-storage drop-in path in the lab dir that must stay unwritten.
fn lazy(lab: &Lab, action: &str, extra: &[&str]) -> (Run, Value) {
    let node = lab.node("n1");
    let mut args: Vec<String> = vec![
        "lazy".into(),
        action.into(),
        "--cri".into(),
        format!("n1={}", node.endpoint()),
        "--containerd-config".into(),
        node.config_file().display().to_string(),
        "--stargz-socket".into(),
        stargz_socket(lab).display().to_string(),
        "--lazy-drop-in".into(),
        storage_drop_in(lab).display().to_string(),
        "-o".into(),
        "json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    json(pinboard(&args))
}

fn json(run: Run) -> (Run, Value) {
    let value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("-o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run, value)
}

/// n1's snapshotter's socket; a path where none serves when it runs none.
fn stargz_socket(lab: &Lab) -> PathBuf {
    lab.node("n1")
        .stargz_socket()
        .map_or_else(|| lab.dir().join("stargz.sock"), Path::to_path_buf)
}

/// Where a containers-storage drop-in would go if pinboard wrote one for this node: it must not.
fn storage_drop_in(lab: &Lab) -> PathBuf {
    lab.dir().join("storage.conf.d/lazy-image-pull.conf")
}

/// What containerd's CRI plugin reports: its snapshotter and its registry `config_path`.
fn reported(lab: &Lab) -> (Option<String>, Option<PathBuf>) {
    let endpoint = lab.node("n1").endpoint().parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = CriClient::connect(&endpoint, DEFAULT_TIMEOUT)
            .await
            .unwrap();
        (
            client.cri_snapshotter().await.unwrap(),
            client.registry_config_path().await.unwrap(),
        )
    })
}

#[test]
fn containerd_lazy_pulling_goes_in_the_imported_directory_and_status_says_what_containerd_reports()
{
    // containerd 1.7, whose version 2 config replaces a plugin's section whole: the file repeats the CRI
    // section in force (version 3 on containerd 2 is tests/it/stargz.rs).
    let mut lab = Lab::start(
        "lazy-imports",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", 32 * MI)
                    .with_stargz()
                    .on(Runtime::Containerd17),
            ],
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let node_dir = lab.node("n1").dir().to_path_buf();
    let ours = node_dir.join("conf.d/zz-pinboard-lazy-pulling.toml");
    let socket = lab.node("n1").stargz().socket_in_node.clone();
    lab.kill_stargz("n1").unwrap();

    let (run, on) = lazy(&lab, "on", &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &on["nodes"][0];
    assert_eq!(n1["change"], "written", "{n1}");
    assert_eq!(n1["lazyPulling"]["storeServing"], false, "{n1}");
    assert!(
        run.stderr.lines().any(
            |l| l.starts_with("warning: n1: lazy pulling on after restart: ")
                && l.contains("stargz's socket is not live")
        ),
        "the snapshotter down warned of: {}",
        run.stderr
    );
    assert_eq!(n1["file"], ours.display().to_string());
    assert_eq!(n1["lazyPulling"]["text"], "on after restart", "{n1}");
    assert!(
        n1["lazyPulling"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("`systemctl restart containerd`")),
        "the restart, with its command: {n1}"
    );
    let written: toml_edit::DocumentMut = std::fs::read_to_string(&ours).unwrap().parse().unwrap();
    let address = written["proxy_plugins"]["stargz"]["address"].as_str();
    assert_eq!(address, Some(socket.to_str().unwrap()));
    assert_eq!(
        written["proxy_plugins"]["stargz"]["type"].as_str(),
        Some("snapshot")
    );
    let cri = &written["plugins"]["io.containerd.grpc.v1.cri"];
    assert_eq!(cri["containerd"]["snapshotter"].as_str(), Some("stargz"));
    assert_eq!(
        cri["containerd"]["disable_snapshot_annotations"].as_bool(),
        Some(false)
    );
    let certs = node_dir.join("certs.d").display().to_string();
    assert_eq!(
        cri["registry"]["config_path"].as_str(),
        Some(certs.as_str()),
        "the CRI section in force, repeated"
    );
    assert!(
        !storage_drop_in(&lab).parent().unwrap().exists(),
        "nothing under containers-storage on a containerd node"
    );
    let (run, again) = lazy(&lab, "on", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(again["nodes"][0]["change"], "unchanged");

    // containerd restarted on that config starts, keeps its other CRI settings, and reports stargz.
    lab.restart_node("n1")
        .expect("containerd starts on the imported file");
    let certs_dir = node_dir.join("certs.d");
    assert_eq!(reported(&lab), (Some("stargz".into()), Some(certs_dir)));

    // `status` says what containerd reports: in force, but the snapshotter is down.
    let image = lab
        .push_image("lazy/absent", &ImageSpec::small(2200))
        .unwrap()
        .reference(&lab.registry_host());
    let node = lab.node("n1");
    let (run, status) = json(pinboard([
        "status",
        "--image",
        &image,
        "--insecure-registry",
        &lab.registry_host(),
        "--cri",
        &format!("n1={}", node.endpoint()),
        "--containerd-config",
        node.config_file().to_str().unwrap(),
        "-o",
        "json",
    ]));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let lazy_pulling = &status["nodes"][0]["lazyPulling"];
    assert_eq!(
        lazy_pulling["text"], "configured but store not serving",
        "{status}"
    );
    assert_eq!(lazy_pulling["inForce"], true, "{status}");

    // The snapshotter serving: on, in force.
    lab.start_stargz("n1").unwrap();
    let (run, now) = lazy(&lab, "status", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        now["nodes"][0]["lazyPulling"]["text"],
        "on (stargz, in force)"
    );
    assert_eq!(now["nodes"][0]["lazyPulling"]["storeServing"], true);
    assert!(!run.stderr.contains("warning:"), "{}", run.stderr);
    assert!(
        now["nodes"][0].get("change").is_none(),
        "status changes nothing"
    );

    // Off: the file goes; containerd keeps stargz until it restarts, then it is off.
    let (run, off) = lazy(&lab, "off", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(off["nodes"][0]["lazyPulling"]["text"], "off after restart");
    assert!(!ours.exists());
    lab.restart_node("n1").expect("containerd starts");
    let (_, off) = lazy(&lab, "status", &[]);
    assert_eq!(off["nodes"][0]["lazyPulling"]["text"], "off");
    assert_eq!(reported(&lab).0.as_deref(), Some("native"));
}

/// Forwards TCP connections on a loopback port to a unix socket: a node's runtime reached over TCP, whose
/// files are not this machine's to read. Stops with the test process.
fn tcp_to_unix(socket: &Path) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(unix) = std::os::unix::net::UnixStream::connect(&socket) else {
                continue;
            };
            let (mut tcp_in, mut unix_out) = (tcp.try_clone().unwrap(), unix.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut tcp_in, &mut unix_out));
            let (mut unix_in, mut tcp_out) = (unix, tcp);
            std::thread::spawn(move || std::io::copy(&mut unix_in, &mut tcp_out));
        }
    });
    format!("tcp://{address}")
}

#[test]
fn a_node_over_tcp_has_its_lazy_pulling_said_unknown_not_read_from_this_machine() {
    let lab = Lab::with_nodes(
        "lazy-tcp",
        vec![NodeSpec::new("n1", 32 * MI).importing_conf_d()],
    );
    // This machine's files say lazy pulling is configured for n1 ...
    let (run, on) = lazy(&lab, "on", &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(on["nodes"][0]["change"], "written");
    // ... which says nothing of a node reached over TCP, whose files are on that node.
    let node = lab.node("n1");
    let socket = node.endpoint().trim_start_matches("unix://").to_string();
    let tcp = tcp_to_unix(Path::new(&socket));
    let (run, status) = json(pinboard([
        "lazy",
        "status",
        "--cri",
        &format!("n1={tcp}"),
        "--containerd-config",
        node.config_file().to_str().unwrap(),
        "-o",
        "json",
    ]));
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let n1 = &status["nodes"][0];
    assert_eq!(n1["reachable"], true, "the runtime answered over TCP: {n1}");
    assert_eq!(n1["lazyPulling"], Value::Null, "{n1}");
    assert_eq!(
        run.stderr.trim(),
        format!(
            "error: n1: CRI endpoint {tcp}: lazy pulling's files are on the node, and pinboard reads and \
             writes them only where it runs; run it on the node"
        )
    );
}

#[test]
fn without_imports_the_line_to_add_and_where_are_shown_and_nothing_is_written() {
    let lab = Lab::with_nodes("lazy-no-imports", vec![NodeSpec::new("n1", 32 * MI)]);
    let node = lab.node("n1");
    let config = std::fs::read_to_string(node.config_file()).unwrap();
    let grpc = config.lines().position(|l| l == "[grpc]").unwrap() + 1;
    let pattern = node.dir().join("conf.d/*.toml");

    let mut args = vec![
        "lazy".to_string(),
        "on".into(),
        "--cri".into(),
        format!("n1={}", node.endpoint()),
        "--containerd-config".into(),
        node.config_file().display().to_string(),
        "--lazy-drop-in".into(),
        storage_drop_in(&lab).display().to_string(),
    ];
    let run = pinboard(&args);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let line = format!("imports = [\"{}\"]", pattern.display());
    let place = format!(
        "before line {grpc} (`[grpc]`) of {}",
        node.config_file().display()
    );
    assert!(
        run.stdout
            .contains(&format!("  add {place}:\n      {line}\n")),
        "the exact line, and where: {}",
        run.stdout
    );
    assert!(
        run.stderr.starts_with("error: n1: nothing written: "),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&line) && run.stderr.contains(&place),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stdout.contains("n1    containerd"),
        "the node's runtime and state still said: {}",
        run.stdout
    );

    assert_eq!(
        std::fs::read_to_string(node.config_file()).unwrap(),
        config,
        "config untouched"
    );
    assert!(!node.dir().join("conf.d").exists());
    assert!(!storage_drop_in(&lab).parent().unwrap().exists());

    // JSON says the same lines.
    args.extend(["-o".into(), "json".into()]);
    let (run, json) = json(pinboard(&args));
    assert_eq!(run.code, 1);
    assert_eq!(json["nodes"][0]["change"], "not-written");
    assert_eq!(json["nodes"][0]["add"]["lines"][0], line);
    assert_eq!(json["nodes"][0]["add"]["place"], place);
    assert_eq!(json["nodes"][0]["lazyPulling"]["text"], "off");
}

/// `COMMAND --image R… --insecure-registry HOST --min-free 1Mi NODE… EXTRA…`.
fn command(
    command: &str,
    lab: &Lab,
    node: &[String],
    images: &[String],
    extra: &[&str],
) -> Vec<String> {
    let mut args = vec![command.to_string()];
    args.extend(node.iter().cloned());
    for image in images {
        args.extend(["--image".into(), image.clone()]);
    }
    args.extend([
        "--insecure-registry".into(),
        lab.registry_host(),
        "--min-free".into(),
        "1Mi".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// What `check`, `check --allow-lazy`, `status` and `plan` say of `node` holding `lazy` (3 layers, all
/// remote) and `whole`, both pinned.
fn judged_as_lazily_present(lab: &Lab, node: &[String], lazy: &PushedImage, whole: &str) {
    let lazy_ref = lazy.reference(&lab.registry_host());
    let images = [lazy_ref.clone(), whole.to_string()];
    let run = pinboard(command("check", lab, node, &images, &[]));
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "n1: 1 image present only lazily, the registry link still needed for their layers: {lazy_ref} (3 \
             of 3 layers remote); to make them local"
        )),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--allow-lazy"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);

    let (run, check) = json(pinboard(command(
        "check",
        lab,
        node,
        &images,
        &["-o", "json"],
    )));
    assert_eq!(run.code, 1);
    let image = &check["nodes"][0]["images"][0];
    assert_eq!(image["reason"], "lazy", "{image}");
    assert_eq!(image["lazy"]["remoteLayers"], serde_json::json!([0, 1, 2]));
    assert_eq!(check["nodes"][0]["images"][1]["reason"], Value::Null);

    let run = pinboard(command("check", lab, node, &images, &["--allow-lazy"]));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    let run = pinboard(command("status", lab, node, &images, &[]));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("~ lazy (3 of 3 layers remote)"),
        "{}",
        run.stdout
    );

    let (run, plan) = json(pinboard(command(
        "plan",
        lab,
        node,
        &images,
        &["-o", "json"],
    )));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let layers: u64 = lazy.layers.iter().map(|l| l.size).sum();
    let planned = &plan["nodes"][0]["images"][0];
    assert_eq!(planned["present"], true, "{planned}");
    assert_eq!(
        planned["fetchBytes"], layers,
        "its layers, still to fetch: {planned}"
    );
    assert_eq!(
        planned["estimatedDiskBytes"], 0,
        "CRI-O's stays lazy: for the link, not the disk: {planned}"
    );
    assert_eq!(planned["lazy"]["layers"], 3);
    assert_eq!(plan["nodes"][0]["images"][1]["fetchBytes"], 0);
    assert_eq!(plan["nodes"][0]["fetchBytes"], layers);
    assert_eq!(plan["linkBytes"]["direct"], layers);
}

#[test]
fn a_crio_image_on_an_additional_layer_store_is_judged_the_same_and_lazy_on_restarts_crio() {
    let name = "lazy-crio";
    let lab = Lab::start(name, LabConfig::default()).expect("lab starts");
    let lazy = lab
        .push_image("lazy/crio-app", &three_layers(2400))
        .unwrap();
    let whole = lab
        .push_image("lazy/crio-whole", &ImageSpec::small(2410))
        .unwrap()
        .reference(&lab.registry_host());
    let crio = CrioStandIn::start_on_tmpfs(name, "1.31.0", &[lab.registry_host()], 16 * MI)
        .expect("stand-in");
    let drop_in = crio
        .registries_dir()
        .with_file_name("storage.conf.d")
        .join("lazy-image-pull.conf");
    let mut node = crio.node_args("n1");
    node.extend(["--lazy-drop-in".into(), drop_in.display().to_string()]);
    let images = [lazy.reference(&lab.registry_host()), whole.clone()];
    let run = pinboard(command("apply", &lab, &node, &images, &[]));
    assert_eq!(
        run.code, 0,
        "pulled and pinned: {}\n{}",
        run.stdout, run.stderr
    );

    // As CRI-O with stargz-store leaves an image: its layers are additional-layer-store layers.
    assert_eq!(crio.make_lazy(&images[0]).unwrap(), 3);

    judged_as_lazily_present(&lab, &node, &lazy, &whole);

    // `lazy on --restart`: CRI-O's storage drop-in, then `systemctl restart crio`; the store is not mounted.
    let bin = crio.systemctl(true).expect("systemctl");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut args = vec![
        "lazy".to_string(),
        "on".into(),
        "--restart".into(),
        "-o".into(),
        "json".into(),
    ];
    args.extend(node.iter().cloned());
    let (run, on) = json(pinboard_with(&args, |c| {
        c.env("PATH", &path);
    }));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let n1 = &on["nodes"][0];
    assert_eq!(n1["change"], "written", "{n1}");
    assert_eq!(n1["restarted"], "systemctl restart crio", "{n1}");
    assert_eq!(
        n1["lazyPulling"]["text"], "configured but store not serving",
        "{n1}"
    );
    assert_eq!(crio.systemctl_calls(), ["restart crio"]);
    assert_eq!(crio.counts().starts, 2, "restarted once");
    let text = std::fs::read_to_string(&drop_in).unwrap();
    assert!(
        text.contains("additionallayerstores = [\"/var/lib/stargz-store/store:ref\"]"),
        "{text}"
    );
}

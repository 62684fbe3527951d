//! End to end: the real `pinboard` binary in tmux against the lab (a containerd 2.1 node too small for the
//! set, the real CRI-O 1.33, and containerd 1.6.20, which reports no pins). The test composes a set by
//! keystrokes, applies it, and watches the rollout end with the small node refused and the other two
//! pulled and pinned: one through CRI-O's drop-in and a reload by signal, which CRI-O confirms, one through
//! containerd's label, written but not confirmed. Then another set holds one of the images, and unpinning
//! the first set in the TUI keeps that pin and says so.

use crate::support;

use std::time::{Duration, Instant};

use support::tmux::Tmux;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Runtime};

const MI: u64 = 1 << 20;

/// `count` images `REPO0…`, each a shared base layer of `base` bytes (from `seed`) and half a MiB of its
/// own; their references through the proxy.
fn push_sharing_a_base(lab: &Lab, repo: &str, seed: u64, base: u64, count: u64) -> Vec<String> {
    let layer = |seed, bytes: u64| LayerSpec {
        seed,
        bytes: bytes as usize,
        format: LayerFormat::Gzip,
    };
    (0..count)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![layer(seed, base), layer(seed * 10 + i, MI / 2)],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("{repo}{i}"), &spec)
                .unwrap()
                .reference(&lab.proxy_host())
        })
        .collect()
}

#[test]
fn compose_apply_and_watch_a_rollout_on_containerd_and_crio_1_33_in_the_terminal() {
    let lab = Lab::start(
        "tui-e2e",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", 12 * MI),
                NodeSpec::new("n2", 256 * MI).on(Runtime::Crio133),
                NodeSpec::new("n3", 256 * MI).on(Runtime::Containerd16),
            ],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let references = push_sharing_a_base(&lab, "e2e/app", 7, 6 * MI, 4);

    let work = lab.dir().join("e2e");
    std::fs::create_dir_all(&work).unwrap();
    let nodes_file = lab.nodes_file();
    let crio_dir = lab.node("n2").crio().config_dir.clone();
    let n1_before = lab.node("n1").images_ls();

    let command = format!(
        "XDG_STATE_HOME={state} {bin} --nodes {nodes} --insecure-registry {registry} --min-free 4Mi; echo EXITED $?; sleep 60",
        state = work.join("state").display(),
        bin = env!("CARGO_BIN_EXE_pinboard"),
        nodes = nodes_file.display(),
        registry = lab.proxy_host(),
    );
    let tmux = Tmux::start("e2e", 120, 40, &command);
    tmux.wait_for("3/3 reachable", Duration::from_secs(20));

    // Compose: Sets screen, new set, paste the references, apply, confirm.
    tmux.keys(&["2", "n"]);
    tmux.literal("upgrade");
    tmux.keys(&["Enter", "i"]);
    tmux.literal(&references.join(" "));
    tmux.keys(&["Enter"]);
    let sets = tmux.wait_for("upgrade [1/4]", Duration::from_secs(20));
    assert!(
        !sets.contains('✗'),
        "every entry passes validation:\n{sets}"
    );
    tmux.keys(&["a"]);
    tmux.wait_for("apply set upgrade", Duration::from_secs(5));
    tmux.keys(&["y"]);

    let done = tmux.wait_for("rollout finished", Duration::from_secs(60));
    let row = |name: &str| {
        done.lines()
            .find(|l| l.contains(&format!("│{name} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(row("n1").contains("refused"), "n1 is refused:\n{done}");
    assert!(row("n2").contains("pinned"), "n2 is pinned:\n{done}");
    assert!(row("n3").contains("pinned"), "n3 is pinned:\n{done}");
    assert!(done.contains("no-space"), "the refusal says why:\n{done}");
    // containerd 1.6 does not report pins: selecting its node, n3, says so; CRI-O confirmed n2's.
    let rows: Vec<String> = ["n1", "n2", "n3"].map(row).to_vec();
    let n3_at = done
        .lines()
        .filter(|l| rows.iter().any(|r| r == *l))
        .position(|l| *l == rows[2])
        .expect("n3's row");
    let down = vec!["j"; n3_at];
    tmux.keys(&down);
    tmux.wait_for("pinned (not confirmed by runtime)", Duration::from_secs(5));

    // What the nodes say, independently of pinboard.
    assert_eq!(
        lab.node("n1").images_ls(),
        n1_before,
        "nothing was pulled on the refused node"
    );
    let n3 = lab.node("n3").images_ls();
    for reference in &references {
        let line = n3
            .lines()
            .find(|l| l.starts_with(reference.as_str()))
            .unwrap_or_else(|| panic!("{reference} not on n3:\n{n3}"));
        assert!(line.contains("io.cri-containerd.pinned=pinned"), "{line}");
    }
    let mut sorted = references.clone();
    sorted.sort();
    let entries: String = sorted
        .iter()
        .map(|r| format!("      \"{r}\", # pinboard: upgrade\n"))
        .collect();
    let expected = format!("[crio]\n  [crio.image]\n    pinned_images = [\n{entries}    ]\n");
    let written = std::fs::read_to_string(crio_dir.join("50-pinned-images")).unwrap();
    assert!(
        written.starts_with("# pinboard marks each entry") && written.ends_with(&expected),
        "{written}"
    );
    // CRI-O itself pins what the drop-in lists: pinboard reloaded it.
    lab.node("n2").assert_pinned(&references);

    // Another set holds the first image too (applied headlessly, from anywhere): unpinning `upgrade` in
    // the TUI keeps that pin, and says so.
    let keep = work.join("keep.txt");
    std::fs::write(&keep, format!("{}\n", references[0])).unwrap();
    let applied = support::pinboard([
        "apply",
        "--nodes",
        &nodes_file.display().to_string(),
        "--insecure-registry",
        &lab.proxy_host(),
        "--min-free",
        "4Mi",
        "--images-file",
        &keep.display().to_string(),
    ]);
    assert_eq!(applied.code, 1, "n1 is refused again:\n{}", applied.stdout);
    let keep_name = applied
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("the set's name")
        .to_string();
    assert!(keep_name.starts_with("images-"), "{}", applied.stdout);
    tmux.keys(&["2", "U"]);
    tmux.wait_for("unpin set upgrade", Duration::from_secs(5));
    tmux.keys(&["y"]);
    let said = tmux.wait_for(
        &format!("stays pinned for {keep_name}"),
        Duration::from_secs(20),
    );
    assert!(
        said.contains("n2, n3: unpinned 3 images; e2e/app0@sha256:"),
        "{said}"
    );
    let n3 = lab.node("n3").images_ls();
    for (i, reference) in references.iter().enumerate() {
        let line = n3
            .lines()
            .find(|l| l.starts_with(reference.as_str()))
            .unwrap();
        assert_eq!(
            line.contains("io.cri-containerd.pinned=pinned"),
            i == 0,
            "only the image the other set holds stays pinned: {line}"
        );
    }
    let written = std::fs::read_to_string(crio_dir.join("50-pinned-images")).unwrap();
    assert!(
        written.contains(&format!("\"{}\", # pinboard: {keep_name}\n", references[0]))
            && !written.contains("upgrade"),
        "{written}"
    );
    // Config, n3: what applying `upgrade` again would label, under who holds those pins, the other
    // set's hold read from containerd's labels.
    tmux.keys(&["5", "j", "j"]);
    let config = tmux.wait_for(
        &format!("held by: {keep_name} (1), upgrade (4)"),
        Duration::from_secs(10),
    );
    assert!(
        config.contains("containerd image labels io.cri-containerd.pinned=pinned"),
        "n3's labels:\n{config}"
    );

    // Quitting restores the terminal and exits 0; the log went to a file, not the screen.
    tmux.keys(&["q"]);
    let after = tmux.wait_for("EXITED", Duration::from_secs(10));
    assert!(after.contains("EXITED 0"), "{after}");
    assert!(
        !after.contains("pinboard  1 Nodes"),
        "the alternate screen is gone:\n{after}"
    );
    assert!(
        work.join("state/pinboard/pinboard.log").exists(),
        "the TUI logs to its file"
    );
}

#[test]
fn fan_out_toggled_with_f_on_the_plan_screen_serves_the_nodes_from_pinboard() {
    let lab = Lab::start(
        "tui-fan-out",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 96 * MI), NodeSpec::new("n2", 96 * MI)],
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let references = push_sharing_a_base(&lab, "e2e/fan", 8, 4 * MI, 3);
    let hosts: Vec<String> = lab
        .nodes()
        .iter()
        .map(|n| std::fs::read_to_string(n.hosts_toml(&lab.proxy_host())).unwrap())
        .collect();
    let work = lab.dir().join("e2e");
    let list = work.join("images.txt");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(&list, references.join("\n")).unwrap();
    let command = format!(
        "XDG_STATE_HOME={state} {bin} --nodes {nodes} --images-file {list} --cache-dir {cache} \
         --insecure-registry {registry} --min-free 4Mi; echo EXITED $?; sleep 60",
        state = work.join("state").display(),
        bin = env!("CARGO_BIN_EXE_pinboard"),
        nodes = lab.nodes_file().display(),
        list = list.display(),
        cache = work.join("cache").display(),
        registry = lab.proxy_host(),
    );
    let tmux = Tmux::start("fan-out", 120, 40, &command);
    tmux.wait_for("2/2 reachable", Duration::from_secs(20));

    tmux.keys(&["3", "p"]);
    let plan = tmux.wait_for("with fan-out (f: off)", Duration::from_secs(20));
    assert!(plan.contains("link: "), "{plan}");
    tmux.keys(&["f"]);
    tmux.wait_for("with fan-out (f: on)", Duration::from_secs(5));
    tmux.keys(&["a"]);
    tmux.wait_for(
        "fan-out on: every blob crosses the registry link once",
        Duration::from_secs(5),
    );
    let from = lab.proxy().request_heads().len();
    tmux.keys(&["y"]);
    let done = tmux.wait_for("rollout finished: 2 pinned", Duration::from_secs(60));
    assert!(
        done.contains("(fan-out)"),
        "the summary counts the link:\n{done}"
    );

    let heads: Vec<String> = lab.proxy().request_heads()[from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let blob_gets: Vec<&String> = heads
        .iter()
        .filter(|h| h.starts_with("get ") && h.contains("/blobs/"))
        .collect();
    assert_eq!(
        blob_gets.len(),
        3 + 3 + 1,
        "configs, own layers, the base once: {blob_gets:?}"
    );
    assert!(
        blob_gets
            .iter()
            .all(|h| h.contains("user-agent: pinboard/"))
    );
    let restored = || {
        for (node, before) in lab.nodes().iter().zip(&hosts) {
            assert_eq!(
                &std::fs::read_to_string(node.hosts_toml(&lab.proxy_host())).unwrap(),
                before,
                "{}'s hosts.toml is back",
                node.name
            );
        }
    };
    // The screen says the rollout finished once every node's events are in; the engine puts fan-out's
    // files back as it ends, a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab.nodes().iter().zip(&hosts).any(|(node, before)| {
        std::fs::read_to_string(node.hosts_toml(&lab.proxy_host()))
            .ok()
            .as_ref()
            != Some(before)
    }) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    restored();

    // Quitting in the middle of a fanned-out rollout cancels it and puts the files back before exiting.
    let more = push_sharing_a_base(&lab, "e2e/more", 9, 4 * MI, 2);
    lab.proxy().set_bandwidth(Some(MI / 4));
    tmux.keys(&["2", "i"]);
    tmux.literal(&more.join(" "));
    tmux.keys(&["Enter", "a"]);
    tmux.wait_for("fan-out on: every blob crosses", Duration::from_secs(5));
    tmux.keys(&["y"]);
    let wired = |node: &support::Node| {
        std::fs::read_to_string(node.hosts_toml(&lab.proxy_host()))
            .is_ok_and(|t| t.starts_with("# pinboard-fan-out: "))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lab.nodes().iter().all(wired) {
        assert!(Instant::now() < deadline, "the nodes were never wired");
        std::thread::sleep(Duration::from_millis(50));
    }
    tmux.keys(&["q"]);
    let after = tmux.wait_for("EXITED", Duration::from_secs(40));
    assert!(after.contains("EXITED 0"), "{after}");
    restored();
}

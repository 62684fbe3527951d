//! Headless `apply` and `unpin` against the lab, judged by `check`: a node that pins through a CRI-O
//! drop-in (a nodes file with `pin: crio-drop-in`, a temporary config dir, no reload) next to one that pins
//! with the containerd label. Both nodes run containerd 1.6.20, which cannot report pins, so on the drop-in
//! node the record decides: CRI-O's effective `pinned_images`, so an image is pinned there only when the
//! files list it, an administrator's glob included (the real CRI-O's drop-in is tests/it/crio.rs).
//! Unpinning keeps the images, and releases only the named sets' holds: a pin another set holds stays, and
//! so does an administrator's entry. A pin set by hand
//! with `ctr` (no holder) stays through `unpin` as unowned, until `--release-unowned` names its image.

use crate::support;

use pinboard::backend::pins::{CRIO_DROP_IN, read_crio_pins};
use pinboard::model::readiness::{ImageReason, NodesStatus, PinnedBy, Readiness};
use support::{ImageSpec, Lab, LabConfig, NodeSpec, Runtime};

const MI: u64 = 1 << 20;

fn pinboard(command: &str, common: &[String], extra: &[&str]) -> (i32, String, String) {
    let args = [command]
        .into_iter()
        .chain(common.iter().map(String::as_str))
        .chain(extra.iter().copied());
    let run = support::pinboard(args);
    (run.code, run.stdout, run.stderr)
}

fn readiness(common: &[String]) -> (i32, Readiness, String) {
    let (code, stdout, stderr) = pinboard("check", common, &["-o", "json"]);
    let parsed = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("check -o json ({e}): {stdout}\n{stderr}"));
    (code, parsed, stderr)
}

/// A lab whose n1 pins with the containerd label and n2 through a CRI-O drop-in (a nodes file with
/// `pin: crio-drop-in`, a temporary config dir, no reload), and a small image pushed for each repository.
struct TwoNodes {
    lab: Lab,
    crio: tempfile::TempDir,
    nodes_file: std::path::PathBuf,
    images: Vec<String>,
}

fn two_nodes(name: &str, repositories: &[&str]) -> TwoNodes {
    let lab = two_containerd_nodes(name);
    let images = push_small(&lab, repositories, 800);
    let crio = tempfile::tempdir().unwrap();
    let nodes_file = lab.dir().join("nodes.yaml");
    std::fs::write(
        &nodes_file,
        format!(
            "- name: n1\n  endpoint: {}\n- name: n2\n  endpoint: {}\n  pin: crio-drop-in\n  \
             crioConfigDir: {}\n  crioReload: none\n",
            lab.node("n1").endpoint(),
            lab.node("n2").endpoint(),
            crio.path().display()
        ),
    )
    .unwrap();
    TwoNodes {
        lab,
        crio,
        nodes_file,
        images,
    }
}

#[test]
fn apply_pins_through_the_drop_in_and_the_label_and_unpin_keeps_the_images() {
    let TwoNodes {
        lab,
        crio,
        nodes_file,
        images,
    } = two_nodes("apply-crio", &["apply/app0", "apply/app1"]);
    let mut common: Vec<String> = vec!["--nodes".into(), nodes_file.display().to_string()];
    for image in &images {
        common.extend(["--image".into(), image.clone()]);
    }
    // unpin asks no registry and plans nothing: only nodes and images.
    let unpin_args = common.clone();
    common.extend(["--insecure-registry".into(), lab.registry_host()]);
    common.extend(["--min-free".into(), "1Mi".into()]);

    // On n2 the images are there (ctr, no label) but the drop-in does not list them: not pinned.
    for image in &images {
        lab.node("n2").pull(image).expect("ctr pull");
    }
    let (code, before, _) = readiness(&common);
    assert_eq!(code, 1);
    let n2 = &before.nodes[1];
    assert_eq!(n2.pin_method.as_deref(), Some("crio-drop-in"));
    assert!(
        n2.images
            .iter()
            .all(|i| i.reason == Some(ImageReason::NotPinned)),
        "{n2:?}"
    );
    assert!(
        before.nodes[0]
            .images
            .iter()
            .all(|i| i.reason == Some(ImageReason::Missing))
    );

    // apply: plain progress lines on stderr (not a terminal), the outcome on stdout, exit 0 when ready.
    let (code, stdout, stderr) = pinboard("apply", &common, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}\nlab: {}", lab.dir().display());
    assert!(stderr.contains("n1: pinned (containerd label)"), "{stderr}");
    assert!(stderr.contains("n2: pinned (CRI-O drop-in)"), "{stderr}");
    assert!(stderr.contains("n1: pulled "), "{stderr}");
    assert!(!stderr.contains('\r'), "no bar redrawn off a terminal");
    assert!(stdout.contains("✓ ready: 2/2 nodes ready"), "{stdout}");
    let mut listed = read_crio_pins(crio.path()).unwrap();
    listed.sort();
    let mut wanted = images.clone();
    wanted.sort();
    assert_eq!(listed, wanted, "the drop-in lists both images");
    let (code, after, stderr) = readiness(&common);
    assert_eq!(code, 0, "{stderr}");
    assert!(after.ready);

    // The drop-in alone decides on n2: take one image's line out of it by hand.
    let drop_in = crio.path().join(CRIO_DROP_IN);
    let text = std::fs::read_to_string(&drop_in).unwrap();
    let edited: String = text
        .lines()
        .filter(|l| !l.contains(&images[1]))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(edited.lines().count() + 1, text.lines().count(), "{text}");
    std::fs::write(&drop_in, edited).unwrap();
    let (code, edited, stderr) = readiness(&common);
    assert_eq!(code, 1);
    assert_eq!(edited.nodes[1].images[0].reason, None);
    assert_eq!(
        edited.nodes[1].images[1].reason,
        Some(ImageReason::NotPinned)
    );
    assert!(
        stderr.contains("n2: 1 image present but not pinned"),
        "{stderr}"
    );

    // unpin: every node loses its pins, keeps its images. The set from --image flags has the same
    // name as when it was applied: named after its images.
    let (code, stdout, stderr) = pinboard("unpin", &unpin_args, &["-o", "json"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let unpinned: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        unpinned["sets"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("images-"),
        "{unpinned}"
    );
    assert_eq!(
        unpinned["nodes"][0]["unpinned"].as_array().unwrap().len(),
        2
    );
    assert_eq!(
        unpinned["nodes"][1]["unpinned"].as_array().unwrap().len(),
        1,
        "the entry taken out by hand was not there"
    );
    assert!(
        !crio.path().join(CRIO_DROP_IN).exists(),
        "no pins left: no drop-in"
    );
    let (code, unpinned, stderr) = readiness(&common);
    assert_eq!(code, 1);
    for node in &unpinned.nodes {
        assert!(
            node.images.iter().all(|i| i.present == Some(true)
                && i.pinned == Some(false)
                && i.reason == Some(ImageReason::NotPinned)),
            "{node:?}"
        );
    }
    assert_eq!(
        stderr.matches("present but not pinned").count(),
        2,
        "{stderr}"
    );

    // With no pinboard drop-in left, an administrator's glob is what CRI-O would apply: it counts.
    std::fs::write(
        crio.path().join("10-site.conf"),
        format!(
            "[crio.image]\npinned_images = [\"{}/apply/*\"]\n",
            lab.registry_host()
        ),
    )
    .unwrap();
    let (_, globbed, _) = readiness(&common);
    let n2 = &globbed.nodes[1];
    assert!(n2.ready, "{n2:?}");
    assert_eq!(n2.pinned_by, Some(PinnedBy::Record));
}

/// A lab with two containerd nodes, n1 and n2, and no API server.
fn two_containerd_nodes(name: &str) -> Lab {
    Lab::start(
        name,
        LabConfig {
            // containerd 1.6.20 reports no pins: the record decides there (docs/runtimes.md).
            nodes: vec![
                NodeSpec::new("n1", 32 * MI).on(Runtime::Containerd16),
                NodeSpec::new("n2", 32 * MI).on(Runtime::Containerd16),
            ],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts")
}

/// A small image pushed for each repository, its layer seeded from `seed` on: their references.
fn push_small(lab: &Lab, repositories: &[&str], seed: u64) -> Vec<String> {
    repositories
        .iter()
        .zip(seed..)
        .map(|(repository, seed)| {
            let spec = ImageSpec::small(seed);
            lab.push_image(repository, &spec)
                .expect("push")
                .reference(&lab.registry_host())
        })
        .collect()
}

/// A PinnedImageSet file named `name` listing `images`.
fn set_file(dir: &std::path::Path, name: &str, images: &[&String]) -> String {
    let path = dir.join(format!("{name}.yaml"));
    let entries: String = images.iter().map(|i| format!("  - name: {i}\n")).collect();
    std::fs::write(
        &path,
        format!(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  \
             name: {name}\nspec:\n  pinnedImages:\n{entries}"
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// How many rows of `unpin`'s table say an image lost its pin.
fn unpinned_rows(table: &str) -> usize {
    table
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("unpinned"))
        .count()
}

/// Per node, each image's holders as `status -o json` lists them: `(sets, admin)`.
fn held_by(common: &[String]) -> Vec<Vec<(Vec<String>, bool)>> {
    let (code, stdout, stderr) = pinboard("status", common, &["-o", "json"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let status: NodesStatus = serde_json::from_str(&stdout).unwrap();
    status
        .nodes
        .iter()
        .map(|n| {
            n.images
                .iter()
                .map(|i| {
                    let held = i.held_by.clone().expect("heldBy in direct mode");
                    (held.sets, held.admin)
                })
                .collect()
        })
        .collect()
}

#[test]
fn unpinning_one_set_keeps_the_pins_another_set_holds() {
    let TwoNodes {
        lab,
        crio,
        nodes_file,
        images,
    } = two_nodes(
        "apply-holders",
        &["holders/x", "holders/y", "holders/z", "holders/admins"],
    );
    let [x, y, z, admins] = <[String; 4]>::try_from(images).unwrap();
    let base: Vec<String> = [
        "--nodes",
        &nodes_file.display().to_string(),
        "--insecure-registry",
        &lab.registry_host(),
        "--min-free",
        "1Mi",
    ]
    .map(String::from)
    .to_vec();
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter()
            .cloned()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };
    let a = set_file(lab.dir(), "set-a", &[&x, &y]);
    let b = set_file(lab.dir(), "set-b", &[&y, &z]);
    // The argument list an operator's script passes to apply, reused for unpin and check.
    let (set_a, set_b) = (with(&["--set", &a]), with(&["--set", &b]));
    let both = with(&["--set", &a, "--set", &b]);

    for args in [&set_a, &set_b] {
        let (code, stdout, stderr) = pinboard("apply", args, &[]);
        assert_eq!(code, 0, "{stdout}\n{stderr}\nlab: {}", lab.dir().display());
    }
    // The administrator's own entry for an image of theirs, in pinboard's drop-in, without a mark.
    lab.node("n2").pull(&admins).expect("ctr pull");
    let drop_in = crio.path().join(CRIO_DROP_IN);
    let text = std::fs::read_to_string(&drop_in).unwrap();
    let admin_line = format!("      \"{admins}\",\n");
    std::fs::write(
        &drop_in,
        text.replace(
            "    pinned_images = [\n",
            &format!("    pinned_images = [\n{admin_line}"),
        ),
    )
    .unwrap();

    // Who holds what, on both nodes: images in the order of the sets (x, y, z).
    let sets = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    for node in held_by(&both) {
        assert_eq!(
            node,
            [
                (sets(&["set-a"]), false),
                (sets(&["set-a", "set-b"]), false),
                (sets(&["set-b"]), false)
            ]
        );
    }
    // The table says it in each cell: y's on both nodes, the label's and the drop-in's.
    let (code, table, stderr) = pinboard("status", &both, &[]);
    assert_eq!(code, 0, "{stderr}");
    let y_row = table
        .lines()
        .find(|l| l.starts_with(&y[..y.find("@sha256:").unwrap() + 20]))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        y_row.matches("✓ pinned (set-a, set-b)").count(),
        2,
        "{table}"
    );

    // unpin set-a: x loses its pin, y stays pinned for set-b, on both nodes; the output says so.
    let (code, stdout, stderr) = pinboard("unpin", &set_a, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!("set set-a ({a})\n")),
        "{stdout}"
    );
    for node in ["n1", "n2"] {
        let row = |image: &str, rest: &str| {
            let short = &image[..image.find("@sha256:").unwrap() + 20];
            stdout.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.len() > 2
                    && cells[0] == node
                    && cells[1].starts_with(short)
                    && cells[2..].join(" ") == rest
            })
        };
        assert!(row(&x, "unpinned -"), "{node}: x\n{stdout}");
        assert!(row(&y, "stays pinned set-b"), "{node}: y\n{stdout}");
    }
    let (code, after_a, stderr) = readiness(&set_a);
    assert_eq!(code, 1, "{stderr}");
    for node in &after_a.nodes {
        assert_eq!(
            node.images[0].reason,
            Some(ImageReason::NotPinned),
            "{node:?}"
        );
        assert_eq!(node.images[1].reason, None, "y stays pinned: {node:?}");
        assert_eq!(node.images[1].held_by.as_ref().unwrap().sets, ["set-b"]);
    }
    let (code, _, stderr) = readiness(&set_b);
    assert_eq!(code, 0, "set-b is whole: {stderr}");

    // unpin set-b: y and z go too; the administrator's entry stays, as written, and still pins.
    let (code, stdout, stderr) = pinboard("unpin", &set_b, &["-o", "json"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, after_b, _) = readiness(&both);
    assert_eq!(code, 1);
    for node in &after_b.nodes {
        assert!(
            node.images
                .iter()
                .all(|i| i.present == Some(true) && i.pinned == Some(false)),
            "{node:?}"
        );
    }
    let text = std::fs::read_to_string(&drop_in).unwrap();
    assert!(text.contains(&admin_line), "{text}");
    assert_eq!(
        read_crio_pins(crio.path()).unwrap(),
        std::slice::from_ref(&admins)
    );
    let (_, admin_view, _) = readiness(&with(&["--image", &admins]));
    let n2 = &admin_view.nodes[1];
    assert_eq!(n2.images[0].reason, None, "{n2:?}");
    assert!(n2.images[0].held_by.as_ref().unwrap().admin);

    // A set without a name is named after its images; that name unpins it, from any machine.
    let list = lab.dir().join("list.txt");
    std::fs::write(&list, format!("{x}\n")).unwrap();
    let listed = with(&["--images-file", &list.display().to_string()]);
    let (code, stdout, stderr) = pinboard("apply", &listed, &["-o", "json"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let applied: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let name = applied["sets"][0]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("images-"), "{applied}");
    assert_eq!(applied["sets"][0]["namedAfterImages"], true);
    // A name no node holds is a typo: refused before anything changes, the good name included.
    let typo = with(&["--set", &name, "--set", "no-such-set"]);
    let (code, _, stderr) = pinboard("unpin", &typo, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr
            .contains("no-such-set: no such file, and no node holds a pin for a set of that name"),
        "{stderr}"
    );
    assert_eq!(readiness(&listed).0, 0, "nothing was unpinned");
    let (code, stdout, stderr) = pinboard("unpin", &with(&["--set", &name]), &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(unpinned_rows(&stdout), 2, "{stdout}");

    // --all-sets releases every set's hold and nothing else.
    for args in [&set_a, &listed] {
        assert_eq!(pinboard("apply", args, &[]).0, 0);
    }
    let (code, stdout, stderr) = pinboard("unpin", &with(&["--all-sets"]), &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(unpinned_rows(&stdout), 4, "x and y on two nodes:\n{stdout}");
    assert_eq!(read_crio_pins(crio.path()).unwrap(), [admins]);
}

#[test]
fn a_pin_set_by_hand_stays_through_unpin_until_release_unowned_names_its_image() {
    const PINNED: &str = "io.cri-containerd.pinned=pinned";
    let lab = two_containerd_nodes("apply-unowned");
    let [x, y, tool] = <[String; 3]>::try_from(push_small(
        &lab,
        &["unowned/x", "unowned/y", "unowned/tool"],
        900,
    ))
    .unwrap();
    // The administrator pinned x, which the set lists, and a tool of theirs by hand: no holder label.
    let nodes = ["n1", "n2"];
    for node in nodes {
        for image in [&x, &tool] {
            lab.node(node).pull(image).expect("ctr pull");
            lab.node(node).label(image, PINNED);
        }
    }
    let set = set_file(lab.dir(), "set-a", &[&x, &y]);
    let mut common: Vec<String> = nodes
        .iter()
        .flat_map(|n| ["--cri".into(), format!("{n}={}", lab.node(n).endpoint())])
        .collect();
    common.extend(["--set".into(), set]);
    let applying: Vec<String> = common
        .iter()
        .cloned()
        .chain(["--insecure-registry".into(), lab.registry_host()])
        .chain(["--min-free".into(), "1Mi".into()])
        .collect();
    let (code, stdout, stderr) = pinboard("apply", &applying, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}\nlab: {}", lab.dir().display());

    // status says who holds each pin: x the set and the hand-set pin, y the set alone; on both nodes.
    let (code, stdout, stderr) = pinboard("status", &common, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("✓ pinned (set-a, unowned)").count(),
        2,
        "{stdout}"
    );
    assert_eq!(stdout.matches("✓ pinned (set-a)").count(), 2, "{stdout}");

    let labelled = |node: &str, image: &str| {
        let listing = lab.node(node).images_ls();
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().next() == Some(image))
            .unwrap_or_else(|| panic!("{node}: {image} stays on the node\n{listing}"))
            .to_string();
        line.contains(PINNED)
    };
    // unpin releases the set's hold; the hand-set pin of x stays, said to be unowned.
    let (code, stdout, stderr) = pinboard("unpin", &common, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for node in nodes {
        let row = |image: &str| {
            let short = &image[..image.find("@sha256:").unwrap() + 20];
            stdout
                .lines()
                .find(|l| l.starts_with(node) && l.contains(short))
                .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        };
        assert_eq!(row(&x).as_deref(), Some("stays pinned unowned"), "{stdout}");
        assert_eq!(row(&y).as_deref(), Some("unpinned -"), "{stdout}");
        assert!(labelled(node, &x) && !labelled(node, &y) && labelled(node, &tool));
    }

    // --release-unowned takes x's pin too; the tool, which the set does not list, stays pinned.
    let (code, stdout, stderr) = pinboard("unpin", &common, &["--release-unowned", "-o", "json"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(
            report["nodes"][i]["unpinned"],
            serde_json::json!([x]),
            "{report}"
        );
        assert!(!labelled(node, &x) && labelled(node, &tool), "{node}");
    }
    let tool_args = [
        "--cri".to_string(),
        format!("n1={}", lab.node("n1").endpoint()),
        "--image".into(),
        tool.clone(),
    ];
    let (code, tool_view, stderr) = readiness(&tool_args);
    assert_eq!(code, 0, "the tool stays pinned: {stderr}");
    assert!(
        tool_view.nodes[0].images[0]
            .held_by
            .as_ref()
            .unwrap()
            .unowned
    );
}

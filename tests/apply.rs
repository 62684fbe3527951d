//! Headless `apply` and `unpin` against the lab, judged by `check`: a node that pins through a CRI-O
//! drop-in (a nodes file with `pin: crio-drop-in`, a temporary config dir, no reload) next to one that pins
//! with the containerd label. The lab's containerd 1.6.20 cannot report pins, so on the drop-in node the
//! record decides: CRI-O's effective `pinned_images`, so an image is pinned there only when the files
//! list it, an administrator's glob included. Unpinning keeps the images.

mod support;

use pinboard::backend::pins::{CRIO_DROP_IN, read_crio_pins};
use pinboard::model::readiness::{ImageReason, PinnedBy, Readiness};
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec};

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

#[test]
fn apply_pins_through_the_drop_in_and_the_label_and_unpin_keeps_the_images() {
    let lab = Lab::start(
        "apply-crio",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 32 * MI), NodeSpec::new("n2", 32 * MI)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let images: Vec<String> = (0..2u64)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 800 + i,
                    bytes: 64 * 1024,
                    format: LayerFormat::Gzip,
                }],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("apply/app{i}"), &spec)
                .expect("push")
                .reference(&lab.registry_host())
        })
        .collect();
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

    // The drop-in alone decides on n2: take one image out of it by hand.
    std::fs::write(
        crio.path().join(CRIO_DROP_IN),
        format!(
            "[crio]\n  [crio.image]\n    pinned_images = [\"{}\"]\n",
            images[0]
        ),
    )
    .unwrap();
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

    // unpin: every node loses its pins, keeps its images.
    let (code, stdout, stderr) = pinboard("unpin", &unpin_args, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("pin label removed from 2 image(s)"),
        "{stdout}"
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

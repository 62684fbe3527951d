//! Pinning on a real containerd (the lab's 1.6): the label `io.cri-containerd.pinned=pinned` is set on every
//! image record of an image and removed again through containerd's images service, as `ctr` sees it; the
//! image itself is never touched. containerd 1.6 does not report pins through CRI, so nothing is confirmed.

mod support;

use std::time::Duration;

use pinboard::backend::cri::CriClient;
use pinboard::backend::pins::{containerd_label, label_containerd};
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec};

const PINNED: &str = "io.cri-containerd.pinned=pinned";

/// `ctr images ls` lines of the node, one per image record.
fn records(lab: &Lab) -> Vec<String> {
    lab.node("n1")
        .images_ls()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pin_label_is_set_on_every_record_and_removed_again() {
    let lab = Lab::start(
        "pins-label",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start");
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed: 41,
            bytes: 256 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let pushed = lab.push_image("pins/app", &spec).expect("push");
    let reference = pushed.reference(&lab.registry_host());
    let client = CriClient::connect(
        &lab.node("n1").endpoint().parse().unwrap(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    // Pulled through CRI, as the engine does: containerd then names it by reference and by id.
    client
        .pull_image(&reference, None, Duration::from_secs(30))
        .await
        .unwrap();

    let pinned = label_containerd(&client, &reference, true).await.unwrap();
    assert_eq!(
        pinned.records,
        [reference.clone(), pushed.config_digest.clone()]
    );
    assert!(
        !pinned.confirmed,
        "containerd 1.6 does not report Image.pinned"
    );
    for name in [&reference, &pushed.config_digest] {
        assert_eq!(
            containerd_label(&client, name).await.unwrap().as_deref(),
            Some("pinned")
        );
    }
    let listing = records(&lab);
    let ours: Vec<&String> = listing
        .iter()
        .filter(|l| l.starts_with(&reference) || l.starts_with(&pushed.config_digest))
        .collect();
    assert_eq!(ours.len(), 2, "{listing:?}");
    assert!(ours.iter().all(|l| l.contains(PINNED)), "{ours:?}");

    // Pinning twice changes nothing; unpinning removes the label and keeps the image.
    assert_eq!(
        label_containerd(&client, &reference, true).await.unwrap(),
        pinned
    );
    let unpinned = label_containerd(&client, &reference, false).await.unwrap();
    assert_eq!(unpinned.records, pinned.records);
    assert_eq!(containerd_label(&client, &reference).await.unwrap(), None);
    assert!(!records(&lab).iter().any(|l| l.contains(PINNED)));
    assert!(
        client.image_status(&reference).await.unwrap().is_some(),
        "never deleted"
    );

    // An image the node does not have cannot be pinned, and the error says so.
    let missing = format!(
        "{}/pins/none@sha256:{}",
        lab.registry_host(),
        "0".repeat(64)
    );
    let err = label_containerd(&client, &missing, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not on the node"), "{err}");
    assert_eq!(containerd_label(&client, &missing).await.unwrap(), None);
}

/// Unpinning a set: containerd loses the label, the CRI-O drop-in loses exactly those entries (keeping an
/// administrator's comment and another set's pin) and CRI-O is reloaded; every image stays on the node.
#[tokio::test(flavor = "multi_thread")]
async fn unpinning_removes_pins_and_keeps_images() {
    use pinboard::backend::node::DirectNode;
    use pinboard::backend::pins::PinTarget;
    use pinboard::backend::pins::{Reload, read_crio_pins, write_crio_pins};
    use pinboard::engine::unpin;

    let lab = Lab::start(
        "pins-unpin",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start");
    let spec = |seed| ImageSpec {
        layers: vec![LayerSpec {
            seed,
            bytes: 128 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let refs: Vec<String> = [51, 52]
        .iter()
        .map(|&s| {
            lab.push_image(&format!("unpin/app{s}"), &spec(s))
                .unwrap()
                .reference(&lab.registry_host())
        })
        .collect();
    let endpoint = lab.node("n1").endpoint().parse().unwrap();
    let client = CriClient::connect(&endpoint, Duration::from_secs(10))
        .await
        .unwrap();
    for r in &refs {
        client
            .pull_image(r, None, Duration::from_secs(30))
            .await
            .unwrap();
        label_containerd(&client, r, true).await.unwrap();
    }
    let node = DirectNode {
        name: "n1".into(),
        endpoint,
    };

    let done = unpin(&node, PinTarget::ContainerdLabel, &refs)
        .await
        .unwrap();
    assert_eq!(done, "pin label removed from 2 image(s)");
    let listing = records(&lab);
    for r in &refs {
        let line = listing
            .iter()
            .find(|l| l.starts_with(r.as_str()))
            .expect("the image stays");
        assert!(!line.contains(PINNED), "{line}");
    }

    // CRI-O: the set's entries go, another set's pin and the admin's comment stay, one SIGHUP is sent.
    let dir = tempfile::tempdir().unwrap();
    let other =
        "quay.io/other/app@sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let mut all = refs.clone();
    all.push(other.to_string());
    write_crio_pins(dir.path(), &all).unwrap();
    let file = dir.path().join("50-pinned-images");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("# pinned for the 4.19 upgrade\n{text}")).unwrap();
    let hup = dir.path().join("hup.log");
    let mut crio = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap 'echo hup >> {}' HUP; while :; do sleep 0.1; done",
            hup.display()
        ))
        .spawn()
        .unwrap();
    let pidfile = dir.path().join("crio.pid");
    std::fs::write(&pidfile, crio.id().to_string()).unwrap();
    let target = PinTarget::CrioDropIn {
        config_dir: dir.path().into(),
        reload: Reload::Signal { pidfile },
    };

    let done = unpin(&node, target.clone(), &refs).await.unwrap();
    assert_eq!(done, "2 pin(s) removed from the CRI-O drop-in");
    assert_eq!(read_crio_pins(dir.path()).unwrap(), [other]);
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .starts_with("# pinned for the 4.19 upgrade\n")
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&hup)
        .unwrap_or_default()
        .lines()
        .count()
        < 1
    {
        assert!(std::time::Instant::now() < deadline, "no SIGHUP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing left to remove: the file is not rewritten and CRI-O is not reloaded again.
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
    assert_eq!(
        unpin(&node, target, &refs).await.unwrap(),
        "0 pin(s) removed from the CRI-O drop-in"
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap()),
        inode
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(&hup).unwrap().lines().count(), 1);
    assert!(
        refs.iter()
            .all(|r| records(&lab).iter().any(|l| l.starts_with(r.as_str()))),
        "images stay"
    );
    crio.kill().unwrap();
    let _ = crio.wait();
}

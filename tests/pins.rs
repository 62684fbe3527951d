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

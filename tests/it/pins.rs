//! Pinning on a real containerd (the lab's 1.6): the pin label `io.cri-containerd.pinned=pinned` and one
//! holder label per set (`pinboard.dev/set.<name>=<name>`) are set on every image record of an image and
//! removed again through containerd's images service, as `ctr` sees it: the pin goes with its last holder,
//! and a pin someone else set stays unless it is released on purpose. The image itself is never touched.
//! Where the runtime reports pins through CRI (not containerd 1.6.20), it confirms them. Then unpinning through the
//! engine on containerd and on a CRI-O drop-in, with a reload only when the drop-in changed.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use pinboard::backend::cri::CriClient;
use pinboard::backend::pins::{hold_containerd, record_labels, release_containerd};
use pinboard::model::holders::{Holder, Holders, ReleaseScope, holders_of};
use pinboard::model::set::from_flags;
use support::hup::HupRecorder;
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

/// The `ctr images ls` line of the record `name`.
fn record(lab: &Lab, name: &str) -> String {
    records(lab)
        .into_iter()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no record {name}"))
}

/// Each of `images` held by each of `sets`.
fn holds(images: &[&str], sets: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let images: Vec<String> = images.iter().map(|i| i.to_string()).collect();
    let sets: Vec<_> = sets.iter().map(|name| from_flags(name, &images)).collect();
    holders_of(&sets)
}

/// A lab with one containerd node, n1.
fn one_node(name: &str) -> Lab {
    Lab::start(
        name,
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("the lab must start")
}

fn image(lab: &Lab, repo: &str, seed: u64) -> support::PushedImage {
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed,
            bytes: 128 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    lab.push_image(repo, &spec).expect("push")
}

#[tokio::test(flavor = "multi_thread")]
async fn each_set_holds_the_pin_by_a_label_and_the_pin_goes_with_the_last() {
    let lab = one_node("pins-label");
    let pushed = image(&lab, "pins/app", 41);
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

    let held = hold_containerd(&client, &holds(&[&reference], &["set-a", "set-b"]))
        .await
        .unwrap();
    let mut names = held.records[0].clone();
    names.sort();
    let mut wanted = vec![reference.clone(), pushed.config_digest.clone()];
    wanted.sort();
    assert_eq!(names, wanted, "every record of the image");
    assert_eq!(
        held.confirmed,
        lab.node("n1").runtime.reports_pinned(),
        "CRI reports the pin where the runtime reports pins (containerd 1.6.20 does not)"
    );
    for name in &names {
        let line = record(&lab, name);
        for label in [
            PINNED,
            "pinboard.dev/set.set-a=set-a",
            "pinboard.dev/set.set-b=set-b",
        ] {
            assert!(line.contains(label), "{label} missing: {line}");
        }
    }

    // Releasing set-a keeps the pin for set-b, on every record.
    let changes = release_containerd(&client, &ReleaseScope::of_sets(&["set-a"], &[], false))
        .await
        .unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].pin, reference);
    assert_eq!(
        changes[0].after,
        Holders::from([Holder::Set("set-b".into())])
    );
    for name in &names {
        let line = record(&lab, name);
        assert!(line.contains(PINNED) && !line.contains("set-a"), "{line}");
    }
    // The last holder takes the pin label with it; the image stays.
    let changes = release_containerd(&client, &ReleaseScope::of_sets(&["set-b"], &[], false))
        .await
        .unwrap();
    assert!(changes[0].removed());
    for name in &names {
        let line = record(&lab, name);
        assert!(
            !line.contains(PINNED) && !line.contains("pinboard.dev"),
            "{line}"
        );
    }
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
    let err = hold_containerd(&client, &holds(&[&missing], &["set-a"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not on the node"), "{err}");
    assert_eq!(record_labels(&client, &missing).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pin_someone_else_set_is_adopted_and_stays_until_released_on_purpose() {
    let lab = one_node("pins-adopt");
    let reference = image(&lab, "pins/admin", 42).reference(&lab.registry_host());
    // An administrator (or pinboard before holders) pinned it by hand.
    lab.node("n1").pull(&reference).unwrap();
    lab.node("n1").label(&reference, PINNED);
    let client = CriClient::connect(
        &lab.node("n1").endpoint().parse().unwrap(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();

    // Releasing a set that does not hold it, even one that lists it: the pin stays, reported as unowned.
    let changes = release_containerd(
        &client,
        &ReleaseScope::of_sets(&["set-a"], &[&reference], false),
    )
    .await
    .unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].after, Holders::from([Holder::Unowned]));
    assert!(record(&lab, &reference).contains(PINNED));

    // A set holds it too: the earlier pin is kept as unowned beside it, so releasing the set keeps it.
    hold_containerd(&client, &holds(&[&reference], &["set-a"]))
        .await
        .unwrap();
    let line = record(&lab, &reference);
    assert!(
        line.contains("pinboard.dev/unowned=adopted") && line.contains("pinboard.dev/set.set-a"),
        "{line}"
    );
    release_containerd(
        &client,
        &ReleaseScope::of_sets(&["set-a"], &[&reference], false),
    )
    .await
    .unwrap();
    let line = record(&lab, &reference);
    assert!(line.contains(PINNED) && !line.contains("set-a"), "{line}");

    // --release-unowned, for an image the command names, takes it; for others it does nothing.
    let other = release_containerd(
        &client,
        &ReleaseScope::of_sets(&[], &["quay.io/x@sha256:1"], true),
    )
    .await
    .unwrap();
    assert!(other.is_empty(), "{other:?}");
    assert!(record(&lab, &reference).contains(PINNED));
    let changes = release_containerd(&client, &ReleaseScope::of_sets(&[], &[&reference], true))
        .await
        .unwrap();
    assert!(changes[0].removed());
    assert!(!record(&lab, &reference).contains(PINNED));
}

/// Unpinning a set through the engine: containerd loses its labels, the CRI-O drop-in loses exactly that
/// set's entries (keeping an administrator's comment and another set's pin) and CRI-O is reloaded;
/// every image stays on the node.
#[tokio::test(flavor = "multi_thread")]
async fn unpinning_releases_the_set_and_keeps_images() {
    use pinboard::backend::pins::{PinTarget, Reload, hold_crio_pins, read_crio_pins};
    use pinboard::backend::target::DirectNode;
    use pinboard::engine::unpin;

    let lab = one_node("pins-unpin");
    let refs: Vec<String> = [51, 52]
        .iter()
        .map(|&s| image(&lab, &format!("unpin/app{s}"), s).reference(&lab.registry_host()))
        .collect();
    let refs_str: Vec<&str> = refs.iter().map(String::as_str).collect();
    let endpoint = lab.node("n1").endpoint().parse().unwrap();
    let client = CriClient::connect(&endpoint, Duration::from_secs(10))
        .await
        .unwrap();
    for r in &refs {
        client
            .pull_image(r, None, Duration::from_secs(30))
            .await
            .unwrap();
    }
    hold_containerd(&client, &holds(&refs_str, &["set-a"]))
        .await
        .unwrap();
    let node = DirectNode {
        name: "n1".into(),
        endpoint,
    };
    let unpin_a = ReleaseScope::of_sets(&["set-a"], &refs_str, false);

    let done = unpin(&node, PinTarget::ContainerdLabel, &unpin_a)
        .await
        .unwrap();
    assert!(done.changes.iter().all(|c| c.removed()));
    assert_eq!(done.changes.len(), 2);
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
    hold_crio_pins(dir.path(), &holds(&refs_str, &["set-a"])).unwrap();
    hold_crio_pins(dir.path(), &holds(&[other], &["set-b"])).unwrap();
    let file = dir.path().join("50-pinned-images");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("# pinned for the 4.19 upgrade\n{text}")).unwrap();
    // Its pidfile outside the drop-in directory: CRI-O would read any file there as its configuration.
    let crio = HupRecorder::start(&lab.dir().join("crio"));
    let target = PinTarget::CrioDropIn {
        config_dir: dir.path().into(),
        reload: Reload::Signal {
            pidfile: crio.pidfile.clone(),
        },
    };

    let done = unpin(&node, target.clone(), &unpin_a).await.unwrap();
    assert_eq!(done.changes.iter().filter(|c| c.removed()).count(), 2);
    assert_eq!(read_crio_pins(dir.path()).unwrap(), [other]);
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .starts_with("# pinned for the 4.19 upgrade\n")
    );
    assert_eq!(crio.settled_hups(1), 1, "one SIGHUP");
    // Nothing left to remove: the file is not rewritten and CRI-O is not reloaded again.
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
    let again = unpin(&node, target, &unpin_a).await.unwrap();
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap()),
        inode
    );
    assert_eq!(crio.settled_hups(2), 1, "no reload when nothing changed");
    assert!(
        refs.iter()
            .all(|r| records(&lab).iter().any(|l| l.starts_with(r.as_str()))),
        "images stay"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_that_fails_halfway_puts_back_every_label_it_wrote() {
    let lab = one_node("pins-halfway");
    let present = image(&lab, "pins/a-present", 45).reference(&lab.registry_host());
    // Pushed, never pulled: the hold reaches it after labelling the present one, and fails.
    let absent = image(&lab, "pins/b-absent", 46).reference(&lab.registry_host());
    lab.node("n1").pull(&present).unwrap();
    let client = CriClient::connect(
        &lab.node("n1").endpoint().parse().unwrap(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let both = holds(&[&present, &absent], &["set-a"]);
    assert!(
        both.keys().next().is_some_and(|first| *first == present),
        "the present image is held first"
    );
    let err = hold_containerd(&client, &both).await.unwrap_err();
    assert!(err.to_string().contains("is not on the node"), "{err}");
    for record in records(&lab) {
        assert!(
            !record.contains(PINNED) && !record.contains("pinboard.dev/"),
            "nothing kept: {record}"
        );
    }
}

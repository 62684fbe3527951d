//! The kustomize tree of deploy/agent/ against the binary: each overlay, built by the kustomize in the lab's
//! kubectl (Kubernetes 1.20's, kustomize v2.0.3, the oldest a cluster's tooling may bring), gives the very
//! objects `pinboard agent manifests` prints with the matching flags and its defaults (namespace
//! pinboard-system, image ghcr.io/pinboard-dev/pinboard:v<this version>), compared parsed, object by object.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::{cached_binary, pinboard};

/// Each overlay of deploy/agent/overlays/ and the flags of `pinboard agent manifests` it stands for.
const OVERLAYS: [(&str, &[&str]); 7] = [
    ("containerd", &[]),
    ("crio", &["--runtime", "cri-o"]),
    ("node-credentials", &["--node-credentials"]),
    ("cache", &["--cache"]),
    ("gate", &["--gate"]),
    ("metrics", &["--metrics"]),
    ("service-monitor", &["--service-monitor"]),
];

/// The objects of a multi-document YAML by apiVersion, kind, namespace and name.
fn by_identity(yaml: &str) -> BTreeMap<String, Value> {
    let documents: Vec<Option<Value>> = serde_saphyr::from_multiple(yaml).expect("YAML");
    let objects: Vec<Value> = documents.into_iter().flatten().collect();
    let count = objects.len();
    let identified: BTreeMap<String, Value> = objects
        .into_iter()
        .map(|o| {
            let metadata = &o["metadata"];
            let id = format!(
                "{} {} {}/{}",
                o["apiVersion"].as_str().unwrap(),
                o["kind"].as_str().unwrap(),
                metadata["namespace"].as_str().unwrap_or(""),
                metadata["name"].as_str().unwrap()
            );
            (id, o)
        })
        .collect();
    assert_eq!(identified.len(), count, "no object twice");
    identified
}

#[test]
fn each_kustomize_overlay_builds_the_objects_pinboard_agent_manifests_prints() {
    let kubectl = cached_binary("kubectl").unwrap();
    let overlays = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/agent/overlays");
    let mut found: Vec<String> = std::fs::read_dir(&overlays)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut tested: Vec<&str> = OVERLAYS.iter().map(|(o, _)| *o).collect();
    tested.sort();
    assert_eq!(found, tested, "every overlay is compared");

    for (overlay, flags) in OVERLAYS {
        let built = Command::new(&kubectl)
            .arg("kustomize")
            .arg(overlays.join(overlay))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&built.stderr);
        assert!(
            built.status.success(),
            "kubectl kustomize {overlay}: {stderr}"
        );
        let kustomize = by_identity(&String::from_utf8_lossy(&built.stdout));
        let image = format!(
            "ghcr.io/pinboard-dev/pinboard:v{}",
            env!("CARGO_PKG_VERSION")
        );
        for daemonset in kustomize.values().filter(|o| o["kind"] == "DaemonSet") {
            assert_eq!(
                daemonset["spec"]["template"]["spec"]["containers"][0]["image"], image,
                "the overlay {overlay} names an image of another version: a new version names its image in \
                 deploy/agent/overlays/*/daemonset.yaml"
            );
        }
        let printed = pinboard(["agent", "manifests"].iter().chain(flags));
        assert_eq!(printed.code, 0, "{}", printed.stderr);
        let pinboard = by_identity(&printed.stdout);

        let only = |a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>| {
            a.keys()
                .filter(|k| !b.contains_key(*k))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (only(&kustomize, &pinboard), only(&pinboard, &kustomize)),
            (vec![], vec![]),
            "overlay {overlay}: objects only kustomize builds, only pinboard {flags:?} prints"
        );
        for (id, object) in &kustomize {
            assert!(
                object == &pinboard[id],
                "overlay {overlay}, {id}:\nkustomize builds {}\npinboard {flags:?} prints {}",
                serde_json::to_string_pretty(object).unwrap(),
                serde_json::to_string_pretty(&pinboard[id]).unwrap()
            );
        }
    }
}

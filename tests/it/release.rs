//! `pinboard release` and `--release` against lab release payloads laid out as `oc adm release new` writes
//! them: the set printed is exactly the payload's unique components plus the release image by digest, the
//! payload is read without downloading it (bytes counted at the lab proxy), a multi-arch payload is read
//! through the right platform's entry, and `plan`/`apply`/`unpin --release` work end to end on a real node.

use crate::support;

use serde_json::Value;
use support::release::{PushedRelease, ReleaseSpec};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Platform, Run, pinboard,
};

const MI: usize = 1 << 20;
const ROLE: &str = "machineconfiguration.openshift.io/role";

fn lab(name: &str, nodes: &[&str]) -> Lab {
    Lab::start(
        name,
        LabConfig {
            nodes: nodes.iter().map(|n| NodeSpec::new(n, 64 << 20)).collect(),
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("the lab starts")
}

fn explain(run: &Run) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    )
}

/// `n` small component images in one repository, as a release's components are; their references.
fn components(lab: &Lab, n: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 0xc0 + i,
                    bytes: 32 << 10,
                    format: LayerFormat::Gzip,
                }],
                ..ImageSpec::default()
            };
            lab.push_image("openshift-release-dev/ocp-v4.0-art-dev", &spec)
                .expect("push a component")
                .reference(&lab.registry_host())
        })
        .collect()
}

/// A release of `components`: etcd, console, cli and cli-artifacts (one digest), installer; and a tag
/// whose `from` is not a DockerImage.
fn release_spec(version: &str, components: &[String]) -> ReleaseSpec {
    let docker = |name: &str, i: usize| {
        (
            name.to_owned(),
            "DockerImage".to_owned(),
            components[i].clone(),
        )
    };
    ReleaseSpec {
        version: version.to_owned(),
        tags: vec![
            docker("etcd", 0),
            docker("console", 1),
            docker("cli", 2),
            docker("cli-artifacts", 2),
            (
                "tests".into(),
                "ImageStreamTag".into(),
                "tests:latest".into(),
            ),
            docker("installer", 3),
        ],
        base_bytes: 4 * MI,
        manifests_bytes: 2 * MI,
    }
}

fn release(lab: &Lab, args: &[&str]) -> Run {
    let insecure = [
        "--insecure-registry",
        &lab.registry_host(),
        "--insecure-registry",
        &lab.proxy_host(),
    ];
    pinboard(["release"].iter().chain(args).chain(&insecure))
}

/// The PinnedImageSet documents of YAML output: (name, role label, images).
fn sets(yaml: &str) -> Vec<(String, String, Vec<String>)> {
    yaml.split("---\n")
        .map(|doc| {
            let value: Value = serde_saphyr::from_str(doc).expect("YAML");
            let images = value["spec"]["pinnedImages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap().to_owned())
                .collect();
            (
                value["metadata"]["name"].as_str().unwrap().to_owned(),
                value["metadata"]["labels"][ROLE]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                images,
            )
        })
        .collect()
}

/// The release image by digest, as the proxy host names it.
fn through_proxy(lab: &Lab, pushed: &PushedRelease) -> String {
    pushed
        .digest_reference()
        .replace(&lab.registry_host(), &lab.proxy_host())
}

#[test]
fn release_prints_the_set_and_reads_only_the_start_of_the_last_layer() {
    let lab = lab("release", &[]);
    let parts = components(&lab, 4);
    let pushed = lab
        .push_release(
            "openshift-release-dev/ocp-release",
            "4.19.3-x86_64",
            &release_spec("4.19.3", &parts),
        )
        .unwrap();
    let by_tag = pushed
        .tag_reference
        .replace(&lab.registry_host(), &lab.proxy_host());

    let before = lab.proxy().bytes_down();
    let printed = release(&lab, &[&by_tag]);
    assert_eq!(printed.code, 0, "{}", explain(&printed));
    let read = lab.proxy().bytes_down() - before;
    assert!(
        read < pushed.base_layer_size,
        "read {read} bytes through the proxy; the base layer alone is {}: it must not be downloaded",
        pushed.base_layer_size
    );
    // Exactly: the release image by digest first, then each digest once (cli-artifacts folds into cli;
    // the ImageStreamTag is ignored).
    let expected = [
        through_proxy(&lab, &pushed),
        parts[0].clone(),
        parts[1].clone(),
        parts[2].clone(),
        parts[3].clone(),
    ];
    assert_eq!(
        sets(&printed.stdout),
        [(
            "release-4.19.3".to_owned(),
            "worker".to_owned(),
            expected.to_vec()
        )]
    );
    assert!(
        printed.stderr.contains("release 4.19.3 (")
            && printed
                .stderr
                .contains("5 images in set release-4.19.3; 1 tags share a digest"),
        "{}",
        explain(&printed)
    );

    // --exclude by tag name or pull spec, --pool and --name.
    let digest_tail = &parts[3][parts[3].len() - 12..];
    let chosen = release(
        &lab,
        &[
            &by_tag,
            "--exclude",
            "^console$",
            "--exclude",
            digest_tail,
            "--pool",
            "master",
            "--name",
            "upgrade",
        ],
    );
    assert_eq!(chosen.code, 0, "{}", explain(&chosen));
    let [(name, role, images)] = sets(&chosen.stdout).try_into().expect("one set");
    assert_eq!((name.as_str(), role.as_str()), ("upgrade", "master"));
    assert_eq!(
        images,
        [
            through_proxy(&lab, &pushed),
            parts[0].clone(),
            parts[2].clone()
        ]
    );
    assert!(
        chosen.stderr.contains("excluded: console, installer"),
        "{}",
        explain(&chosen)
    );

    // JSON is the same document; the table names components with their compressed sizes.
    let json = release(&lab, &[&by_tag, "-o", "json"]);
    let document: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(document["kind"], "PinnedImageSet");
    assert_eq!(
        document["spec"]["pinnedImages"].as_array().unwrap().len(),
        5
    );
    let table = release(&lab, &[&by_tag, "-o", "table"]);
    assert_eq!(table.code, 0, "{}", explain(&table));
    assert!(
        table.stdout.contains("cli, cli-artifacts"),
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains("(release image)"), "{}", table.stdout);
    assert!(table.stdout.contains("5 images, "), "{}", table.stdout);

    // An image that is not a release: exit 2, saying what its last layer holds instead.
    let plain = ImageSpec {
        layers: vec![LayerSpec {
            seed: 1,
            bytes: 1024,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let image = lab
        .push_image("apps/web", &plain)
        .unwrap()
        .reference(&lab.registry_host());
    let refused = release(&lab, &[&image]);
    assert_eq!(refused.code, 2, "{}", explain(&refused));
    assert!(
        refused.stderr.contains("not a release payload: its last layer holds no release-manifests/image-references (it holds data/"),
        "{}",
        explain(&refused)
    );
}

#[test]
fn a_multi_arch_release_is_read_through_the_platforms_entry() {
    let lab = lab("release-multi", &[]);
    let parts = components(&lab, 6);
    let amd = release_spec("4.19.3", &parts[..4]);
    let mut arm = release_spec("4.19.3", &parts[2..]);
    arm.base_bytes = MI;
    let arm64 = Platform::new("linux", "arm64", None);
    let pushed = lab
        .push_multi_release(
            "openshift-release-dev/ocp-release",
            "4.19.3-multi",
            &[(Platform::linux_amd64(), amd), (arm64, arm)],
        )
        .unwrap();
    let for_platform = |platform: &str| {
        let run = release(&lab, &[&pushed.tag_reference, "--platform", platform]);
        assert_eq!(run.code, 0, "{}", explain(&run));
        sets(&run.stdout).remove(0).2
    };
    // The release image is the index, by digest; the components are the platform's payload's.
    let index = pushed.digest_reference();
    assert_eq!(
        for_platform("linux/amd64"),
        [
            index.clone(),
            parts[0].clone(),
            parts[1].clone(),
            parts[2].clone(),
            parts[3].clone()
        ]
    );
    assert_eq!(
        for_platform("linux/arm64"),
        [
            index,
            parts[2].clone(),
            parts[3].clone(),
            parts[4].clone(),
            parts[5].clone()
        ]
    );
}

#[test]
fn plan_and_apply_take_a_release() {
    let lab = lab("release-apply", &["n1"]);
    let parts = components(&lab, 4);
    let pushed = lab
        .push_release(
            "openshift-release-dev/ocp-release",
            "4.19.3-x86_64",
            &release_spec("4.19.3", &parts),
        )
        .unwrap();
    let node = format!("n1={}", lab.node("n1").endpoint());
    let common = |command: &'static str| {
        let host = lab.registry_host();
        let mut args: Vec<String> = [
            command,
            "--release",
            &pushed.tag_reference,
            "--cri",
            &node,
            "--insecure-registry",
            &host,
            "--min-free",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["-o".into(), "json".into()]);
        pinboard(args)
    };
    let plan = common("plan");
    assert_eq!(plan.code, 0, "{}", explain(&plan));
    let survey: Value = serde_json::from_str(&plan.stdout).unwrap();
    assert_eq!(survey["sets"][0]["name"], "release-4.19.3");
    let planned: Vec<&str> = survey["nodes"][0]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ref"].as_str().unwrap())
        .collect();
    let mut expected = vec![pushed.digest_reference()];
    expected.extend(parts.iter().cloned());
    assert_eq!(planned, expected, "every component and the release image");
    let applied = common("apply");
    assert_eq!(applied.code, 0, "{}", explain(&applied));
    let report: Value = serde_json::from_str(&applied.stdout).unwrap();
    assert_eq!(report["sets"][0]["name"], "release-4.19.3");
    assert_eq!(
        report["sets"][0]["from"],
        format!("release 4.19.3, {}", pushed.digest_reference())
    );
    let check = common("check");
    assert_eq!(check.code, 0, "{}", explain(&check));
    let held: Value = serde_json::from_str(&check.stdout).unwrap();
    assert!(
        held["nodes"][0]["images"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["heldBy"]["sets"] == serde_json::json!(["release-4.19.3"])),
        "{held}"
    );
    // unpin with the same arguments reads the release again and releases its set's hold: every pin goes.
    let unpinned = common("unpin");
    assert_eq!(unpinned.code, 0, "{}", explain(&unpinned));
    let report: Value = serde_json::from_str(&unpinned.stdout).unwrap();
    assert_eq!(report["sets"][0]["name"], "release-4.19.3");
    let mut gone: Vec<String> = report["nodes"][0]["unpinned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect();
    gone.sort();
    expected.sort();
    assert_eq!(gone, expected, "{report}");
    assert_eq!(common("check").code, 1, "present, no longer pinned");
}

#[tokio::test]
async fn cluster_mode_plans_a_release_for_the_pool_it_names() {
    let lab = Lab::start(
        "release-cluster",
        LabConfig {
            nodes: Vec::new(),
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("the lab starts");
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let (_admin, _writer) =
        support::cluster::openshift(&lab, &["worker", "master"], &["w1", "w2"]).await;
    let parts = components(&lab, 4);
    let pushed = lab
        .push_release(
            "openshift-release-dev/ocp-release",
            "4.19.3-x86_64",
            &release_spec("4.19.3", &parts),
        )
        .unwrap();
    let plan = |pool: &'static str| {
        let args: Vec<String> = [
            "plan",
            "--release",
            &pushed.tag_reference,
            "--pool",
            pool,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--insecure-registry",
            &lab.registry_host(),
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        tokio::task::spawn_blocking(move || pinboard(args))
    };
    let workers = plan("worker").await.unwrap();
    assert_eq!(workers.code, 0, "{}", explain(&workers));
    let survey: Value = serde_json::from_str(&workers.stdout).unwrap();
    let nodes: Vec<(&str, usize)> = survey["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap(),
                n["images"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [("w1", 5), ("w2", 5)],
        "every worker, every component and the release image"
    );
    // The master pool has no nodes here: the release lands nowhere.
    let masters = plan("master").await.unwrap();
    assert_eq!(masters.code, 3, "{}", explain(&masters));
    assert!(
        masters.stderr.contains("the sets land on no node"),
        "{}",
        explain(&masters)
    );
}

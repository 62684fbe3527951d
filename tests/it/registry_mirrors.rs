//! Mirrors for pinboard's own registry reads, for disconnected and low-bandwidth sites: the source
//! registry's host is unreachable (a closed port) and a mirror holds the images. `plan` and `release`
//! succeed through a registries.conf.d mirror and say so; in cluster mode the cluster's
//! ImageDigestMirrorSet is followed, digest-only, with its source blocked by NeverContactSource.

use crate::support;

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use support::release::ReleaseSpec;
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, Run, free_port, pinboard,
};

fn explain(run: &Run) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    )
}

/// Components and a release in the lab registry (the mirror), named as if they lived at `source`.
struct Mirrored {
    source: String,
    components: Vec<String>,
    release_by_tag: String,
    release_by_digest: String,
}

fn mirrored(lab: &Lab) -> Mirrored {
    let source = format!("127.0.0.1:{}", free_port().unwrap());
    let mirror = lab.registry_host();
    let components: Vec<String> = (0..3)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 0x31 + i,
                    bytes: 16 << 10,
                    format: LayerFormat::Gzip,
                }],
                ..ImageSpec::default()
            };
            lab.push_image("openshift-release-dev/ocp-v4.0-art-dev", &spec)
                .unwrap()
                .reference(&mirror)
                .replace(&mirror, &source)
        })
        .collect();
    let spec = ReleaseSpec {
        version: "4.19.3".into(),
        tags: components
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("c{i}"), "DockerImage".into(), c.clone()))
            .collect(),
        base_bytes: 64 << 10,
        manifests_bytes: 4 << 10,
    };
    let pushed = lab
        .push_release("openshift-release-dev/ocp-release", "4.19.3-x86_64", &spec)
        .unwrap();
    Mirrored {
        release_by_tag: pushed.tag_reference.replace(&mirror, &source),
        release_by_digest: pushed.digest_reference().replace(&mirror, &source),
        source,
        components,
    }
}

#[test]
fn a_registries_conf_d_mirror_serves_plan_and_release_while_the_source_is_down() {
    let lab = Lab::start(
        "mirrors",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            ..LabConfig::default()
        },
    )
    .expect("the lab starts");
    let m = mirrored(&lab);
    let mirror = lab.registry_host();
    let conf_dir = lab.dir().join("containers");
    let drop_ins = conf_dir.join("registries.conf.d");
    std::fs::create_dir_all(&drop_ins).unwrap();
    std::fs::write(
        conf_dir.join("registries.conf"),
        "unqualified-search-registries = []\n",
    )
    .unwrap();
    std::fs::write(
        drop_ins.join("50-site-mirror.conf"),
        format!(
            "[[registry]]\nprefix = \"{}\"\n\n[[registry.mirror]]\nlocation = \"{mirror}\"\n",
            m.source
        ),
    )
    .unwrap();
    let node = format!("n1={}", lab.node("n1").endpoint());
    let run = |args: &[&str], with_mirrors: bool| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--insecure-registry".into(),
            mirror.clone(),
            "--insecure-registry".into(),
            m.source.clone(),
        ]);
        if with_mirrors {
            all.extend([
                "--registries-conf".into(),
                conf_dir.join("registries.conf").display().to_string(),
                "--registries-conf-dir".into(),
                drop_ins.display().to_string(),
            ]);
        }
        pinboard(all)
    };

    // release: the tag resolves through the mirror, and the set keeps the source's names, which the nodes
    // pull through their own mirrors.
    let release = run(&["release", &m.release_by_tag], true);
    assert_eq!(release.code, 0, "{}", explain(&release));
    assert!(
        release
            .stderr
            .contains(&format!("read through mirror {mirror}")),
        "{}",
        explain(&release)
    );
    let set: Value = serde_saphyr::from_str(&release.stdout).unwrap();
    let images: Vec<&str> = set["spec"]["pinnedImages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    let mut expected = vec![m.release_by_digest.as_str()];
    expected.extend(m.components.iter().map(String::as_str));
    assert_eq!(images, expected);

    // plan: every image answered by the mirror, and the table says so.
    let plan = run(
        &[
            "plan",
            "--release",
            &m.release_by_digest,
            "--cri",
            &node,
            "-o",
            "json",
        ],
        true,
    );
    assert_eq!(plan.code, 0, "{}", explain(&plan));
    let survey: Value = serde_json::from_str(&plan.stdout).unwrap();
    let answered: Vec<&str> = survey["nodes"][0]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["mirror"].as_str().unwrap_or("the source"))
        .collect();
    assert_eq!(answered, [mirror.as_str(); 4]);
    let table = run(
        &["plan", "--release", &m.release_by_digest, "--cri", &node],
        true,
    );
    assert!(
        table
            .stdout
            .contains(&format!("mirror {mirror} answered for 4 image(s)")),
        "{}",
        explain(&table)
    );

    // Without the mirror the source's closed port is all there is.
    let direct = run(
        &["plan", "--image", &m.components[0], "--cri", &node],
        false,
    );
    assert_eq!(direct.code, 2, "{}", explain(&direct));
    assert!(
        direct.stderr.contains("connection refused"),
        "{}",
        explain(&direct)
    );
}

#[tokio::test]
async fn cluster_mode_follows_the_clusters_image_digest_mirror_set() {
    let lab = Lab::start(
        "mirrors-cluster",
        LabConfig {
            apiserver: true,
            ..LabConfig::default()
        },
    )
    .expect("the lab starts");
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let (_admin, writer) = support::cluster::openshift(&lab, &["worker"], &["w1"]).await;
    let m = mirrored(&lab);
    let mirror = lab.registry_host();
    let idms = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("config.openshift.io", "v1", "ImageDigestMirrorSet"),
        "imagedigestmirrorsets",
    );
    writer
        .apply(
            &idms,
            "release-mirror",
            json!({"metadata": {"name": "release-mirror"}, "spec": {"imageDigestMirrors": [{
                "source": format!("{}/openshift-release-dev", m.source),
                "mirrors": [format!("{mirror}/openshift-release-dev")],
                "mirrorSourcePolicy": "NeverContactSource",
            }]}}),
        )
        .await;
    let release = |pullspec: String| {
        let args: Vec<String> = [
            "release",
            &pullspec,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--insecure-registry",
            &mirror,
            "--insecure-registry",
            &m.source,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        tokio::task::spawn_blocking(move || pinboard(args))
    };
    let by_digest = release(m.release_by_digest.clone()).await.unwrap();
    assert_eq!(by_digest.code, 0, "{}", explain(&by_digest));
    assert!(
        by_digest.stderr.contains(&format!(
            "read through mirror {mirror}/openshift-release-dev"
        )),
        "{}",
        explain(&by_digest)
    );
    // Digest mirrors serve digests only, and the source is never contacted: a tag cannot be resolved.
    let by_tag = release(m.release_by_tag.clone()).await.unwrap();
    assert_eq!(by_tag.code, 2, "{}", explain(&by_tag));
    assert!(
        by_tag
            .stderr
            .contains("is blocked by the cluster's mirror sets and no mirror there serves it"),
        "{}",
        explain(&by_tag)
    );
}

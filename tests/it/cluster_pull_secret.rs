//! Cluster mode sizes private images with the credentials the nodes pull with: the cluster's global pull
//! secret `openshift-config/pull-secret`. The lab's API server plays the cluster (deploy/rbac.yaml applied,
//! the viewer user bound to `pinboard-viewer`), its registry sits behind the token service, and pinboard
//! runs with a HOME holding no auth file, so the secret is the only place credentials can come from.
//!
//! - The admin's `plan` reads the secret and plans the private image; `--no-pull-secret` turns that off.
//! - The viewer's `plan` says it could not read the secret and what to grant, then refuses the image for
//!   want of credentials (exit 2); with the optional Role `pinboard-pull-secret` bound, it plans.
//! - `pinboard release` reads a release payload kept behind the same credentials with the secret too.
//! - With `PINBOARD_LOG=debug`, the secret's password appears in no output.

use crate::support;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Value, json};
use support::cluster::{
    allowed, apply_rbac, bind_viewer, eventually, kubeconfig_with_viewer, openshift, pull_secret,
};
use support::release::ReleaseSpec;
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, RegistrySetup, Run, TokenConfig, TokenUser,
    isolated, pinboard_with,
};

const PASSWORD: &str = "pull-secret-pass-5eb1";

async fn plan(home: &Path, args: Vec<String>) -> Run {
    let home = home.to_owned();
    tokio::task::spawn_blocking(move || {
        pinboard_with(args, |command| {
            isolated(&home)(command);
            // Whatever kube and the registry client log must not hold the secret either.
            command.env("PINBOARD_LOG", "debug");
        })
    })
    .await
    .unwrap()
}

fn explain(run: &Run) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    )
}

#[tokio::test]
async fn plan_reads_the_clusters_pull_secret_or_says_what_to_grant() {
    pinboard::install_crypto_provider();
    let lab = Lab::start(
        "cluster-pull-secret",
        LabConfig {
            apiserver: true,
            registry: RegistrySetup {
                tokens: Some(TokenConfig {
                    users: vec![TokenUser::new("cluster", PASSWORD, &["release/*"])],
                    public: Vec::new(),
                }),
                ..RegistrySetup::default()
            },
            ..LabConfig::default()
        },
    )
    .expect("the lab must start");
    let (admin, _writer) = openshift(&lab, &["worker"], &["n1", "n2"]).await;
    let proxy = lab.proxy_host();
    let spec = ImageSpec {
        layers: vec![LayerSpec {
            seed: 1401,
            bytes: 128 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let image = lab
        .push_image("release/operator", &spec)
        .unwrap()
        .reference(&proxy);
    // A release payload behind the same credentials, naming the image as a component.
    let payload = lab
        .push_release(
            "release/ocp-release",
            "4.19.3-x86_64",
            &ReleaseSpec {
                version: "4.19.3".into(),
                tags: vec![("operator".into(), "DockerImage".into(), image.clone())],
                base_bytes: 64 << 10,
                manifests_bytes: 4 << 10,
            },
        )
        .unwrap()
        .tag_reference
        .replace(&lab.registry_host(), &proxy);
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("cluster:{PASSWORD}"));
    pull_secret(
        &admin,
        &json!({"auths": {(proxy.clone()): {"auth": encoded}}}),
    )
    .await;
    apply_rbac(&admin).await;
    bind_viewer(&admin, "pinboard-viewer", None).await;
    let kubeconfig = kubeconfig_with_viewer(&lab);
    let set = lab.dir().join("release.yaml");
    std::fs::write(
        &set,
        format!(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: release\n  \
             labels:\n    machineconfiguration.openshift.io/role: worker\nspec:\n  pinnedImages:\n    - name: {image}\n"
        ),
    )
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let args = |context: &str, extra: &[&str]| -> Vec<String> {
        let kubeconfig: &PathBuf = &kubeconfig;
        let mut args: Vec<String> = ["plan", "--context", context, "--set"]
            .map(String::from)
            .to_vec();
        args.push(set.display().to_string());
        args.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
        args.extend([
            "--insecure-registry".into(),
            proxy.clone(),
            "-o".into(),
            "json".into(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let planned = |run: &Run| {
        let survey: Value =
            serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", explain(run)));
        let nodes = survey["nodes"].as_array().unwrap().clone();
        assert_eq!(nodes.len(), 2, "{}", run.stdout);
        for node in nodes {
            assert!(node["images"][0]["fetchBytes"].as_u64() > Some(0), "{node}");
        }
    };

    // The admin may read the secret: its credentials open the private image.
    let admin_plan = plan(home.path(), args("lab", &[])).await;
    assert_eq!(admin_plan.code, 0, "{}", explain(&admin_plan));
    planned(&admin_plan);
    assert!(
        !admin_plan
            .stderr
            .contains("cannot use the cluster's pull secret"),
        "{}",
        explain(&admin_plan)
    );
    assert!(
        admin_plan.stderr.contains("DEBUG"),
        "{}",
        explain(&admin_plan)
    );

    // `release` in cluster mode reads the payload with the secret: the set holds the component.
    let mut release_args: Vec<String> = [
        "release",
        payload.as_str(),
        "--context",
        "lab",
        "--kubeconfig",
    ]
    .map(String::from)
    .to_vec();
    release_args.push(kubeconfig.display().to_string());
    release_args.extend(["--insecure-registry".into(), proxy.clone()]);
    let release = plan(home.path(), release_args).await;
    assert_eq!(release.code, 0, "{}", explain(&release));
    assert!(release.stdout.contains(&image), "{}", explain(&release));

    // --no-pull-secret: only the (absent) auth files.
    let off = plan(home.path(), args("lab", &["--no-pull-secret"])).await;
    assert_eq!(off.code, 2, "{}", explain(&off));
    assert!(
        off.stderr.contains(&format!("refused access to {image}")),
        "{}",
        explain(&off)
    );

    // The viewer may not: it is told so and what to grant, and the image is refused.
    let viewer = support::cluster::client(&kubeconfig, Some("viewer")).await;
    eventually("pinboard-viewer in force", || async {
        allowed(&viewer, "list", "", "nodes", None, None)
            .await
            .then_some(())
    })
    .await;
    let refused = plan(home.path(), args("viewer", &[])).await;
    assert_eq!(refused.code, 2, "{}", explain(&refused));
    assert!(
        refused.stderr.contains(
            "warning: cannot use the cluster's pull secret openshift-config/pull-secret: forbidden ("
        ) && refused.stderr.contains(
            "Grant `get` on it with the Role pinboard-pull-secret in deploy/rbac.yaml (bound in \
             openshift-config), or pass --authfile FILE"
        ),
        "{}",
        explain(&refused)
    );
    assert!(
        refused.stderr.contains(&format!(
            "refused access to {image} (no credentials found for it"
        )),
        "{}",
        explain(&refused)
    );

    // With the optional Role bound, the viewer plans too.
    bind_viewer(&admin, "pinboard-pull-secret", Some("openshift-config")).await;
    eventually("pinboard-pull-secret in force", || async {
        allowed(
            &viewer,
            "get",
            "",
            "secrets",
            Some("openshift-config"),
            Some("pull-secret"),
        )
        .await
        .then_some(())
    })
    .await;
    let granted = plan(home.path(), args("viewer", &[])).await;
    assert_eq!(granted.code, 0, "{}", explain(&granted));
    planned(&granted);

    for run in [&admin_plan, &release, &off, &refused, &granted] {
        for secret in [PASSWORD, encoded.as_str()] {
            assert!(
                !run.stdout.contains(secret) && !run.stderr.contains(secret),
                "{}",
                explain(run)
            );
        }
    }
}

//! The headless commands in cluster mode: the real binary against the lab's etcd + kube-apiserver (and
//! registry), with the tests playing the kubelet and the machine-config daemon. For `check`, `status`,
//! `apply` and `unpin`, each case a pipeline must never get wrong ends in exit 1 with its reason; exit 0
//! when every node's daemon reports the set's generation done, unless a complete kubelet image list
//! contradicts it. `plan` plans every node a set lands on, from what the API tells about its space (a
//! stand-in kubelet's summary through the node proxy, else allocatable ephemeral-storage), its images, and
//! its kubelet's configuration.

use crate::support;

use std::path::{Path, PathBuf};

use pinboard::model::readiness::{NodesStatus, Readiness};
use serde_json::{Value, json};
use support::cluster::{NodeStatus, WAIT, Writer, digest, openshift};
use support::kubelet::{FakeKubelet, ImageFs, KubeletConfig};
use support::{ImageSpec, Lab, LayerFormat, LayerSpec, Run, pinboard};

const NODES: [&str; 3] = ["n1", "n2", "n3"];

fn set_file(dir: &Path, name: &str, role: &str, images: &[String]) -> PathBuf {
    let entries: String = images
        .iter()
        .map(|i| format!("    - name: {i}\n"))
        .collect();
    let path = dir.join(format!("{name}-{}.yaml", images.len()));
    std::fs::write(
        &path,
        format!(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: {name}\n  \
             labels:\n    machineconfiguration.openshift.io/role: {role}\nspec:\n  pinnedImages:\n{entries}"
        ),
    )
    .unwrap();
    path
}

/// The daemon's entry for generation `generation` of set `release`, reached or not.
fn entry(generation: i64, reached: bool) -> Value {
    let mut entry = json!({"name": "release", "desiredGeneration": generation});
    if reached {
        entry["currentGeneration"] = json!(generation);
    }
    entry
}

/// Runs the binary on a blocking thread, so the test can play the daemon meanwhile.
async fn run(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || pinboard(args))
        .await
        .unwrap()
}

fn args(kubeconfig: &Path, rest: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
    args.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
    args
}

fn explain(run: &Run) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    )
}

/// A lab with the machine-config CRDs, pools `worker` and `master`, and worker nodes n1–n3.
async fn cluster(name: &str) -> (Lab, kube::Client, Writer, PathBuf) {
    let lab = support::cluster::lab(name);
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let (admin, writer) = openshift(&lab, &["worker", "master"], &NODES).await;
    (lab, admin, writer, kubeconfig)
}

#[tokio::test]
async fn cluster_readiness_gates_what_a_pipeline_must_never_pass() {
    let (lab, admin, writer, kubeconfig) = cluster("cluster-check").await;
    let images = [digest(1), digest(2)];
    let kubelet_lists = |images: &[String]| {
        let mut listed = images.to_vec();
        listed.push(format!("quay.io/pinboard/own@sha256:{}", "a".repeat(64)));
        listed
    };

    // A set no pool selects is refused before anything is written.
    let stray = set_file(lab.dir(), "stray", "infra", &images);
    let refused = run(args(
        &kubeconfig,
        &["apply", "--set", stray.to_str().unwrap()],
    ))
    .await;
    assert_eq!(refused.code, 2, "{}", explain(&refused));
    assert!(
        refused.stderr.contains("matches no MachineConfigPool"),
        "{}",
        explain(&refused)
    );

    // Apply, while the daemons pull and the kubelets list the images: exit 0 once all three are done.
    let file = set_file(lab.dir(), "release", "worker", &images);
    let file_arg = file.to_str().unwrap().to_owned();
    let applying = tokio::spawn(run(args(
        &kubeconfig,
        &["apply", "--set", &file_arg, "--timeout", "60s"],
    )));
    let sets = kube::Api::<kube::core::DynamicObject>::all_with(
        admin.clone(),
        &writer.cluster.resources().pinned_image_set,
    );
    let deadline = std::time::Instant::now() + WAIT;
    while sets.get_opt("release").await.unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "apply never wrote the set"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let listed = kubelet_lists(&images);
    for node in NODES {
        writer.daemon(node, entry(1, false), true, None).await;
        let status = NodeStatus {
            ready: true,
            images: &listed,
            entries: listed.len(),
        };
        writer.node_status(node, &status).await;
        writer.daemon(node, entry(1, true), false, None).await;
    }
    let applied = applying.await.unwrap();
    assert_eq!(applied.code, 0, "{}", explain(&applied));
    assert!(
        applied
            .stderr
            .contains("applied PinnedImageSet release (generation 1)"),
        "{}",
        explain(&applied)
    );
    assert!(
        applied.stdout.contains("✓ ready: 3/3 nodes ready"),
        "{}",
        explain(&applied)
    );

    // Truly there: check by name and by file agree.
    for set in ["release", file_arg.as_str()] {
        let ok = run(args(&kubeconfig, &["check", "--set", set])).await;
        assert_eq!(ok.code, 0, "{}", explain(&ok));
    }

    // status -o json reads back into the structure the TUI uses.
    let status = run(args(
        &kubeconfig,
        &["status", "--set", "release", "-o", "json"],
    ))
    .await;
    assert_eq!(status.code, 0, "{}", explain(&status));
    let parsed: NodesStatus = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(parsed.nodes.len(), 3);
    assert!(
        parsed
            .nodes
            .iter()
            .all(|n| n.ready && n.sets[0].current_generation == Some(1))
    );
    let again = serde_json::to_string_pretty(&parsed).unwrap() + "\n";
    assert_eq!(again, status.stdout, "the JSON round-trips exactly");

    // The cases that must fail, one per node: n1 Degraded, n2 listing 12 images (a complete list) but not
    // the second of ours, n3 not ready.
    let error = "failed to pull quay.io/openshift/release: no space left on device";
    writer
        .daemon(
            "n1",
            json!({"name": "release", "desiredGeneration": 1, "currentGeneration": 1,
                   "lastFailedGeneration": 1, "lastFailedGenerationError": error}),
            false,
            Some("One or more PinnedImageSet is experiencing an error"),
        )
        .await;
    let only_first = kubelet_lists(&images[..1]);
    let complete = NodeStatus {
        ready: true,
        images: &only_first,
        entries: 12,
    };
    writer.node_status("n2", &complete).await;
    let not_ready = NodeStatus {
        ready: false,
        images: &listed,
        entries: listed.len(),
    };
    writer.node_status("n3", &not_ready).await;
    let failing = run(args(
        &kubeconfig,
        &["check", "--set", "release", "-o", "json"],
    ))
    .await;
    assert_eq!(failing.code, 1, "{}", explain(&failing));
    let verdict: Readiness = serde_json::from_str(&failing.stdout).unwrap();
    assert_eq!(verdict.ready_nodes, 0, "{}", explain(&failing));
    let stderr = &failing.stderr;
    assert!(
        stderr.contains(&format!("n1: set \"release\" generation 1 failed: {error}")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "n2: the kubelet's complete image list (12 of at most 50) lacks 1 image: {}; the machine-config \
             daemon reported the set done",
            images[1]
        )),
        "{stderr}"
    );
    assert!(stderr.contains("n3: node not ready"), "{stderr}");

    // Healed, then the set is edited to generation 2, which no node has seen yet.
    for node in NODES {
        let healthy = NodeStatus {
            ready: true,
            images: &listed,
            entries: listed.len(),
        };
        writer.node_status(node, &healthy).await;
        writer.daemon(node, entry(1, true), false, None).await;
    }
    let ok = run(args(&kubeconfig, &["check", "--set", "release"])).await;
    assert_eq!(ok.code, 0, "{}", explain(&ok));
    let edited = set_file(
        lab.dir(),
        "release",
        "worker",
        &[digest(1), digest(2), digest(3)],
    );
    let edit = run(args(
        &kubeconfig,
        &[
            "apply",
            "--set",
            edited.to_str().unwrap(),
            "--timeout",
            "1s",
        ],
    ))
    .await;
    assert_eq!(edit.code, 1, "{}", explain(&edit));
    let unseen = run(args(&kubeconfig, &["check", "--set", "release"])).await;
    assert_eq!(unseen.code, 1, "{}", explain(&unseen));
    assert!(
        unseen.stderr.contains(
            "n1: set \"release\": the node has not seen generation 2 yet (its MachineConfigNode wants generation 1)"
        ),
        "{}",
        explain(&unseen)
    );
    // The old file's images are all in generation 2, but nodes have not reached it: still not ready.
    let by_old_file = run(args(&kubeconfig, &["check", "--set", &file_arg])).await;
    assert_eq!(by_old_file.code, 1, "{}", explain(&by_old_file));

    // Bad input and an unreachable API server have their own exit codes.
    let unknown = run(args(&kubeconfig, &["check", "--set", "nope"])).await;
    assert_eq!(unknown.code, 2, "{}", explain(&unknown));
    assert!(
        unknown.stderr.contains(
            "\"nope\" is neither a file nor a PinnedImageSet on the cluster (sets there: release)"
        ),
        "{}",
        explain(&unknown)
    );
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let server = lab.apiserver().unwrap().url();
    let closed = format!("https://127.0.0.1:{}", support::free_port().unwrap());
    let dead = lab.dir().join("kubeconfig-dead");
    std::fs::write(&dead, text.replace(&server, &closed)).unwrap();
    let unreachable = run(args(&dead, &["check", "--set", "release"])).await;
    assert_eq!(unreachable.code, 3, "{}", explain(&unreachable));
    assert!(
        unreachable.stderr.contains("cannot reach the API server"),
        "{}",
        explain(&unreachable)
    );

    // Unpin deletes the set; doing it twice is not an error.
    for expected in ["deleted", "not on the cluster"] {
        let unpinned = run(args(&kubeconfig, &["unpin", "--set", "release"])).await;
        assert_eq!(unpinned.code, 0, "{}", explain(&unpinned));
        assert!(unpinned.stdout.contains(expected), "{}", explain(&unpinned));
    }
    assert!(sets.get_opt("release").await.unwrap().is_none());
}

#[tokio::test]
async fn cluster_plan_uses_the_api_figures_and_says_where_they_come_from() {
    let (lab, _admin, writer, kubeconfig) = cluster("cluster-plan").await;
    let spec = |seed| ImageSpec {
        layers: vec![LayerSpec {
            seed,
            bytes: 256 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let host = lab.registry_host();
    let pushed: Vec<String> = (0..2)
        .map(|i| {
            lab.push_image(&format!("cluster/app{i}"), &spec(i))
                .unwrap()
                .reference(&host)
        })
        .collect();
    // n1 has the first image; n2's list is full and silent; n3 has neither.
    let first = [pushed[0].clone()];
    let statuses = [(first.as_slice(), 1), (&[][..], 50), (&[][..], 1)];
    for (node, (images, entries)) in NODES.iter().zip(statuses) {
        let status = NodeStatus {
            ready: true,
            images,
            entries,
        };
        writer.node_status(node, &status).await;
    }
    // n1 has a kubelet the node proxy reaches: its figures are the image filesystem's, and its image GC
    // starts at 20%, below the 25% it already uses.
    let image_fs = ImageFs {
        capacity: 200 << 30,
        available: 150 << 30,
        used: 50 << 30,
    };
    let eager_gc = KubeletConfig {
        image_gc_high_threshold_percent: 20,
        ..KubeletConfig::default()
    };
    let dir = lab.dir().join("kubelet-n1");
    let kubelet = FakeKubelet::configured(&dir, "n1", move || image_fs, eager_gc).unwrap();
    writer.kubelet("n1", kubelet.port()).await;
    let file = set_file(lab.dir(), "apps", "worker", &pushed);
    let plan_with = |output: &'static str, extra: &'static [&'static str]| {
        let file = file.display().to_string();
        let host = host.clone();
        let mut rest = vec![
            "plan",
            "--set",
            &file,
            "--insecure-registry",
            &host,
            "-o",
            output,
        ];
        rest.extend(extra);
        run(args(&kubeconfig, &rest))
    };
    let plan = |output| plan_with(output, &[]);
    let json = plan("json").await;
    assert_eq!(json.code, 0, "{}", explain(&json));
    let survey: Value = serde_json::from_str(&json.stdout).unwrap();
    let nodes = survey["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{}", json.stdout);
    assert_eq!(nodes[0]["spaceSource"], "kubelet-summary", "{}", nodes[0]);
    assert_eq!(nodes[0]["capacityBytes"], 200u64 << 30);
    assert_eq!(nodes[0]["availableBytes"], 150u64 << 30);
    assert_eq!(nodes[0]["usedBytes"], 50u64 << 30);
    for node in &nodes[1..] {
        assert_eq!(
            node["spaceSource"], "allocatable-ephemeral-storage",
            "{node}"
        );
        assert_eq!(node["availableBytes"], 100u64 << 30);
        assert_eq!(node["capacityBytes"], 120u64 << 30);
    }
    // n1's kubelet collects garbage from 20%: already above it, so tight; the others' kubelets do not
    // answer, so their default (85%) is assumed, and the plan says so.
    assert_eq!(nodes[0]["gcHighPercent"], 20, "{}", nodes[0]);
    assert_eq!(nodes[0]["gcHighSource"], "kubelet-config");
    assert_eq!(nodes[0]["verdict"], "tight", "{}", nodes[0]);
    assert!(
        nodes[0]["reasons"][0].as_str().unwrap().contains(
            "above the image GC high threshold of 20% (the kubelet's imageGCHighThresholdPercent)"
        ),
        "{}",
        nodes[0]
    );
    for node in &nodes[1..] {
        assert_eq!(
            (&node["gcHighPercent"], &node["gcHighSource"]),
            (&json!(85), &json!("default"))
        );
        assert_eq!(node["verdict"], "fits", "{node}");
        assert!(
            node["reasons"]
                .to_string()
                .contains("the kubelet's configuration could not be read"),
            "{node}"
        );
    }
    // An explicit flag wins over every kubelet.
    let flagged = plan_with("json", &["--gc-high-percent", "90"]).await;
    let flagged: Value = serde_json::from_str(&flagged.stdout).unwrap();
    for node in flagged["nodes"].as_array().unwrap() {
        assert_eq!(
            (&node["gcHighPercent"], &node["gcHighSource"]),
            (&json!(90), &json!("flag"))
        );
        assert_eq!(node["verdict"], "fits", "{node}");
    }
    let present = |n: usize| -> Vec<Value> {
        nodes[n]["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["present"].clone())
            .collect()
    };
    assert_eq!(present(0), [json!(true), json!(false)]);
    assert_eq!(
        present(1),
        [Value::Null, Value::Null],
        "a full list proves nothing"
    );
    assert_eq!(present(2), [json!(false), json!(false)]);
    assert!(
        nodes[0]["fetchBytes"].as_u64() < nodes[2]["fetchBytes"].as_u64(),
        "n1 fetches only the second image"
    );
    let table = plan("table").await;
    assert!(
        table.stdout.contains("100 GiB (allocatable)"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains(
            "GC high threshold per node: n1 20% (kubelet), n2 85% (default), n3 85% (default)"
        ),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains("(allocatable): the Node's allocatable ephemeral-storage"),
        "{}",
        table.stdout
    );

    let stray = set_file(lab.dir(), "stray", "infra", &pushed);
    let nowhere = run(args(
        &kubeconfig,
        &[
            "plan",
            "--set",
            stray.to_str().unwrap(),
            "--insecure-registry",
            &host,
        ],
    ))
    .await;
    assert_eq!(nowhere.code, 3, "{}", explain(&nowhere));
    assert!(
        nowhere.stderr.contains("the sets land on no node"),
        "{}",
        explain(&nowhere)
    );
}

/// Stand-in kubelets for `nodes`, answering `/configz` with `config`, each Node pointed at its own.
async fn kubelets(
    lab: &Lab,
    writer: &Writer,
    nodes: &[&str],
    config: KubeletConfig,
) -> Vec<FakeKubelet> {
    let mut started = Vec::new();
    for node in nodes {
        let image_fs = || ImageFs {
            capacity: 200 << 30,
            available: 150 << 30,
            used: 50 << 30,
        };
        let dir = lab
            .dir()
            .join(format!("kubelet-{node}-{}", config.node_status_max_images));
        let kubelet = FakeKubelet::configured(&dir, node, image_fs, config).unwrap();
        writer.kubelet(node, kubelet.port()).await;
        started.push(kubelet);
    }
    started
}

/// The images of `check -o json`'s node `n`, as (ref, evidence).
fn evidence(run: &Run, n: usize) -> Vec<(String, String)> {
    let verdict: Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|_| panic!("{}", explain(run)));
    verdict["nodes"][n]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["ref"].as_str().unwrap().to_owned(),
                i["evidence"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_daemons_report_is_the_proof_and_only_a_complete_kubelet_list_contradicts_it() {
    let (lab, _admin, writer, kubeconfig) = cluster("cluster-evidence").await;
    // A release-sized set, 120 images, far more than the kubelet's 50-entry list can name; and a small one.
    let images: Vec<String> = (1..=120).map(digest).collect();
    let apps: Vec<String> = (1001..=1012).map(digest).collect();
    for (name, set) in [("release", &images), ("apps", &apps)] {
        let entries: Vec<Value> = set.iter().map(|i| json!({"name": i})).collect();
        writer
            .apply(
                &writer.cluster.resources().pinned_image_set,
                name,
                json!({"metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/role": "worker"}},
                       "spec": {"pinnedImages": entries}}),
            )
            .await;
    }
    let both = |generation| {
        json!([
            {"name": "release", "desiredGeneration": generation, "currentGeneration": generation},
            {"name": "apps", "desiredGeneration": generation, "currentGeneration": generation},
        ])
    };
    // Every node done, Ready, its kubelet listing 50 other images (a full list, silent about the set).
    let full = NodeStatus {
        ready: true,
        images: &[],
        entries: 50,
    };
    for node in NODES {
        writer.node_status(node, &full).await;
        writer.daemons(node, both(1)).await;
    }
    let defaults = kubelets(&lab, &writer, &NODES, KubeletConfig::default()).await;
    let check_set = |set: &'static str, extra: &'static [&'static str]| {
        let mut rest = vec!["check", "--set", set];
        rest.extend(extra);
        run(args(&kubeconfig, &rest))
    };
    let check = |extra| check_set("release", extra);

    // (a) Ready on the daemon's word.
    let ok = check(&["-o", "json"]).await;
    assert_eq!(ok.code, 0, "{}", explain(&ok));
    for n in 0..3 {
        assert!(
            evidence(&ok, n).iter().all(|(_, e)| e == "daemon"),
            "{}",
            ok.stdout
        );
    }
    let verdict: Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(verdict["nodes"][0]["kubelet"]["nodeStatusMaxImages"], 50);
    assert_eq!(verdict["nodes"][0]["kubelet"]["imageListComplete"], false);
    assert!(
        verdict["nodes"][0]["kubelet"].get("assumed").is_none(),
        "read from /configz"
    );
    let table = check(&[]).await;
    assert_eq!(table.code, 0, "{}", explain(&table));
    assert!(
        table
            .stdout
            .contains("✓ ready (daemon's report; the kubelet lists 0 of 120 images)"),
        "{}",
        table.stdout
    );

    // (b) n2's kubelet lists 12 images, fewer than it may: a complete list, and it lacks image 7 of `apps`.
    let mut listed: Vec<String> = apps.iter().filter(|i| **i != apps[6]).cloned().collect();
    listed.push(format!("quay.io/pinboard/own@sha256:{}", "a".repeat(64)));
    let twelve = NodeStatus {
        ready: true,
        images: &listed,
        entries: 12,
    };
    writer.node_status("n2", &twelve).await;
    let contradicted = check_set("apps", &[]).await;
    assert_eq!(contradicted.code, 1, "{}", explain(&contradicted));
    assert!(
        contradicted.stderr.contains(&format!(
            "n2: the kubelet's complete image list (12 of at most 50) lacks 1 image: {};",
            apps[6]
        )),
        "{}",
        explain(&contradicted)
    );
    assert_eq!(
        contradicted.stderr.matches("lacks").count(),
        1,
        "only n2: {}",
        contradicted.stderr
    );
    // That list is complete for `release` too, and names none of its images.
    let release = check(&[]).await;
    assert!(
        release.stderr.contains(&format!(
            "n2: the kubelet's complete image list (12 of at most 50) lacks 120 images: {}, {}, {}, {}, {} and 115 more;",
            images[0], images[1], images[2], images[3], images[4]
        )),
        "{}",
        explain(&release)
    );

    // (c) An empty list proves nothing: judged by the daemon's report.
    let empty = NodeStatus {
        ready: true,
        images: &[],
        entries: 0,
    };
    writer.node_status("n2", &empty).await;
    for set in ["release", "apps"] {
        let ok = check_set(set, &[]).await;
        assert_eq!(ok.code, 0, "{}", explain(&ok));
    }

    // (e) A fourth worker joins after the set was applied: named until its daemon reports.
    writer.worker("n4").await;
    let joined = check(&[]).await;
    assert_eq!(joined.code, 1, "{}", explain(&joined));
    assert!(
        joined.stderr.contains(
            "n4: set \"release\": joined pool worker after the set was applied; its machine-config daemon \
             has not reported on this node yet"
        ),
        "{}",
        explain(&joined)
    );
    // Its daemon pulls both sets and reports; its kubelet now lists 50 images, not all of them.
    writer.node_status("n4", &full).await;
    writer.daemons("n4", both(1)).await;
    let reported = check(&[]).await;
    assert_eq!(reported.code, 0, "{}", explain(&reported));
    // n4 has no kubelet the proxy reaches: its defaults are assumed, and the output says so.
    assert!(
        reported
            .stderr
            .contains("warning: n4: the kubelet's configuration could not be read"),
        "{}",
        explain(&reported)
    );

    // An old kubelet ignores pins in image GC: a warning on check and status, not a failure.
    writer.kubelet_version("n3", "v1.24.17").await;
    let old = check(&[]).await;
    assert_eq!(old.code, 0, "{}", explain(&old));
    let warning = "warning: n3: kubelet v1.24.17 predates pinned-image support in image GC";
    assert!(old.stderr.contains(warning), "{}", explain(&old));
    let status = run(args(&kubeconfig, &["status", "--set", "release"])).await;
    assert!(status.stderr.contains(warning), "{}", explain(&status));
    assert!(
        status.stdout.contains("! kubelet v1.24.17 predates"),
        "{}",
        explain(&status)
    );

    // (d) n1's kubelet lists up to 200 images: its 50 entries are everything it has, and none is ours.
    drop(defaults);
    let roomy = KubeletConfig {
        node_status_max_images: 200,
        ..KubeletConfig::default()
    };
    let _roomy = kubelets(&lab, &writer, &["n1"], roomy).await;
    let complete = check(&["-o", "json"]).await;
    assert_eq!(complete.code, 1, "{}", explain(&complete));
    assert!(
        complete.stderr.contains(&format!(
            "n1: the kubelet's complete image list (50 of at most 200) lacks 120 images: {}, ",
            images[0]
        )),
        "{}",
        explain(&complete)
    );
    assert!(
        evidence(&complete, 0)
            .iter()
            .all(|(_, e)| e == "kubelet-list")
    );
}

#[tokio::test]
async fn verify_cri_requires_the_runtimes_word_where_it_can_be_asked() {
    pinboard::install_crypto_provider();
    let lab = Lab::start(
        "cluster-verify-cri",
        support::LabConfig {
            nodes: vec![support::NodeSpec::new("n1", 64 << 20)],
            apiserver: true,
            ..support::LabConfig::default()
        },
    )
    .expect("lab starts");
    let kubeconfig = lab.apiserver().unwrap().kubeconfig().to_owned();
    let (_admin, writer) = openshift(&lab, &["worker"], &["n1", "n2"]).await;
    let host = lab.registry_host();
    let images: Vec<String> = (0..2)
        .map(|i| {
            let spec = ImageSpec {
                layers: vec![LayerSpec {
                    seed: 900 + i,
                    bytes: 64 << 10,
                    format: LayerFormat::Gzip,
                }],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("verify/app{i}"), &spec)
                .unwrap()
                .reference(&host)
        })
        .collect();
    let file = set_file(lab.dir(), "release", "worker", &images);
    let sets = file.display().to_string();
    writer
        .apply(
            &writer.cluster.resources().pinned_image_set,
            "release",
            json!({"metadata": {"name": "release", "labels": {"machineconfiguration.openshift.io/role": "worker"}},
                   "spec": {"pinnedImages": images.iter().map(|i| json!({"name": i})).collect::<Vec<_>>()}}),
        )
        .await;
    // Both daemons report the set done, their kubelets list nothing yet: the cluster alone says ready.
    for node in ["n1", "n2"] {
        let empty = NodeStatus {
            ready: true,
            images: &[],
            entries: 0,
        };
        writer.node_status(node, &empty).await;
        writer.daemon(node, entry(1, true), false, None).await;
    }
    let endpoint = format!("n1={}", lab.node("n1").endpoint());
    let verify = |output: &'static str| {
        run(args(
            &kubeconfig,
            &[
                "check",
                "--set",
                "release",
                "--verify-cri",
                "--cri",
                &endpoint,
                "-o",
                output,
            ],
        ))
    };
    let cluster_only = run(args(&kubeconfig, &["check", "--set", "release"])).await;
    assert_eq!(cluster_only.code, 0, "{}", explain(&cluster_only));

    // n1's runtime does not have them: the daemon's word is not enough there. n2 has no endpoint given.
    let refuted = verify("table").await;
    assert_eq!(refuted.code, 1, "{}", explain(&refuted));
    assert!(
        refuted
            .stderr
            .contains("n1: its runtime says: 2 images missing:"),
        "{}",
        explain(&refuted)
    );
    assert!(
        !refuted.stderr.contains("error: n2:"),
        "{}",
        explain(&refuted)
    );

    // Pre-loaded and pinned on n1 (direct mode), the runtime confirms: ready, on the runtime's word.
    let applied = run(vec![
        "apply".into(),
        "--set".into(),
        sets.clone(),
        "--cri".into(),
        endpoint.clone(),
        "--insecure-registry".into(),
        host.clone(),
        "--min-free".into(),
        "0".into(),
    ])
    .await;
    assert_eq!(applied.code, 0, "{}", explain(&applied));
    let confirmed = verify("json").await;
    assert_eq!(confirmed.code, 0, "{}", explain(&confirmed));
    assert!(
        evidence(&confirmed, 0).iter().all(|(_, e)| e == "runtime"),
        "{}",
        confirmed.stdout
    );
    assert!(
        evidence(&confirmed, 1).iter().all(|(_, e)| e == "daemon"),
        "{}",
        confirmed.stdout
    );

    // --verify-cri without an endpoint to ask is bad input; --cri without --verify-cri is ignored, said so.
    let nothing = run(args(
        &kubeconfig,
        &["check", "--set", "release", "--verify-cri"],
    ))
    .await;
    assert_eq!(nothing.code, 2, "{}", explain(&nothing));
    assert!(
        nothing
            .stderr
            .contains("--verify-cri asks the nodes' runtimes"),
        "{}",
        explain(&nothing)
    );
    let ignored = run(args(
        &kubeconfig,
        &["status", "--set", "release", "--cri", &endpoint],
    ))
    .await;
    assert_eq!(ignored.code, 0, "{}", explain(&ignored));
    assert!(
        ignored.stderr.contains("--cri and --nodes are ignored"),
        "{}",
        explain(&ignored)
    );
}

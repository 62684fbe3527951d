//! pinboard's agents on a plain Kubernetes cluster (real kubelets, controllers, containerd nodes; the
//! registry behind the counting proxy): sets applied with `pinboard apply --kubeconfig`, carried out by
//! each node's agent, judged by `check` from the agents' reports, and read back from the nodes themselves.
//! One agent runs as a real pod of the manifests' DaemonSet, from an image of this build; the others as
//! processes started exactly as their pods would run.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use pinboard::model::readiness::{LeftOut, NodesStatus, Readiness};
use serde_json::{Value, json};
use support::agents::{AgentsLab, DAEMONSET, NAMESPACE, POD_LABEL};
use support::cluster::bind_viewer;
use support::kube_objects::{POD_WAIT, PodState, wait_for, wait_for_daemonset_pod};
use support::tmux::Tmux;
use support::{ImageSpec, NodeSpec};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(120);

fn small_images(lab: &AgentsLab, repositories: &[&str], seed: u64) -> Vec<String> {
    repositories
        .iter()
        .zip(seed..)
        .map(|(repository, seed)| {
            lab.lab
                .push_image(repository, &ImageSpec::small(seed))
                .expect("push")
                .reference(&lab.lab.registry_host())
        })
        .collect()
}

/// What `kubectl get` prints of pinboard's `plural`: the API server's Table (its CRD's printer columns),
/// one map of column name to cell per row.
async fn printed(lab: &AgentsLab, plural: &str) -> Vec<BTreeMap<String, Value>> {
    let request = http::Request::get(format!("/apis/pinboard.dev/v1alpha1/{plural}"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value =
        serde_json::from_str(&lab.admin.request_text(request).await.unwrap()).unwrap();
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            columns
                .iter()
                .cloned()
                .zip(row["cells"].as_array().unwrap().iter().cloned())
                .collect()
        })
        .collect()
}

/// Waits until `node`'s `ctr images ls` line of each of `images` says `pinned` as `wanted`.
async fn wait_pinned(lab: &AgentsLab, node: &str, images: &[&String], wanted: bool) {
    wait_for(&format!("{node}: pins {wanted}"), WAIT, || async {
        let listed = lab.lab.node(node).images_ls();
        let right = images.iter().all(|image| {
            listed
                .lines()
                .find(|l| l.starts_with(image.as_str()))
                .is_some_and(|l| l.contains("io.cri-containerd.pinned=pinned") == wanted)
        });
        right.then_some(()).ok_or(listed)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_set_applied_on_agents_is_pinned_on_every_node_and_unpinning_keeps_what_another_set_holds()
 {
    let nodes = vec![
        NodeSpec::new("n1", 512 * MIB),
        NodeSpec::new("n2", 200 * MIB),
        NodeSpec::new("n3", 200 * MIB),
    ];
    let lab = AgentsLab::start("agents-apply", nodes, Some("n1")).await;
    let images = small_images(&lab, &["agents/a", "agents/b", "agents/c"], 7100);
    let (a, b, c) = (&images[0], &images[1], &images[2]);
    let web = lab.set_file("web", &[a, b], "");
    let run = lab.pinboard(&["apply", "--set", web.to_str().unwrap(), "--timeout", "120s"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("applied PinSet web (generation 1)"),
        "{}",
        run.stderr
    );
    for node in ["n1", "n2", "n3"] {
        // Read back from the node itself: the pin label and the set's holder label.
        lab.lab.node(node).assert_pinned(&[a, b]);
        let listed = lab.lab.node(node).images_ls();
        assert!(listed.contains("pinboard.dev/set.web"), "{node}: {listed}");
    }
    let (code, judged, stderr) = lab.check(&["--set", "web"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(judged.nodes.len(), 3);
    for node in &judged.nodes {
        assert!(node.ready, "{node:?}");
        assert!(
            node.runtime
                .as_deref()
                .is_some_and(|r| r.starts_with("containerd"))
        );
    }
    // What each pin rests on comes with the agent's check of its runtime: at the rollout's end, or, when
    // that read did not answer (a loaded machine), at its next periodic check.
    let details = wait_for("every pinned image with its evidence", WAIT, || async {
        let details = lab
            .objects("PinboardNodeImages", "pinboardnodeimages")
            .await;
        let images = || {
            details
                .iter()
                .flat_map(|d| d["status"]["sets"].as_array().into_iter().flatten())
                .flat_map(|s| s["images"].as_array().into_iter().flatten())
        };
        (details.len() == 3 && images().all(|i| !i["evidence"].is_null()))
            .then_some(details.clone())
            .ok_or(format!("{details:?}"))
    })
    .await;
    for report in lab.reports().await {
        let set = &report["status"]["sets"][0];
        assert_eq!(set["name"], "web", "{report}");
        assert_eq!(set["state"], "pinned", "{report}");
        // The report stays small: its image lists are in the node's PinboardNodeImages.
        assert!(
            set["images"].is_null() && report["status"]["images"].is_null(),
            "{report}"
        );
        assert!(
            report["status"]["pinnedCount"].as_u64() >= Some(2),
            "{report}"
        );
        let name = &report["metadata"]["name"];
        let detail = details
            .iter()
            .find(|d| d["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("no PinboardNodeImages {name}"));
        assert_eq!(
            detail["metadata"]["ownerReferences"][0]["kind"], "Node",
            "{detail}"
        );
        let set_images = &detail["status"]["sets"][0];
        assert_eq!(set_images["name"], "web", "{detail}");
        assert_eq!(
            set_images["images"].as_array().unwrap().len(),
            2,
            "{detail}"
        );
        for image in set_images["images"].as_array().unwrap() {
            assert_eq!(image["state"], "pinned", "{detail}");
            // containerd 1.7 reports pins: the agent's word is the runtime's.
            assert_eq!(image["evidence"], "runtime", "{detail}");
        }
        assert!(
            report["status"]["imageFilesystem"]["capacityBytes"]
                .as_u64()
                .unwrap()
                >= 150 * MIB,
            "statvfs of the node's image filesystem: {report}"
        );
    }
    // `kubectl get pinboardnodes` shows each node's figures, `kubectl get pinsets` the nodes ready.
    for row in printed(&lab, "pinboardnodes").await {
        assert_eq!(row["Runtime"], "containerd", "{row:?}");
        assert!(row["Pinned"].as_u64() >= Some(2), "{row:?}");
        assert!(row["Images"].as_u64() >= row["Pinned"].as_u64(), "{row:?}");
    }
    wait_for(
        "kubectl get pinsets: web ready on 3 nodes",
        WAIT,
        || async {
            let sets = printed(&lab, "pinsets").await;
            sets.iter()
                .any(|row| row["Name"] == "web" && row["Nodes"] == 3 && row["Ready"] == 3)
                .then_some(())
                .ok_or(format!("{sets:?}"))
        },
    )
    .await;
    // The pod's agent ran from the manifests' template and the image of this build.
    let pod_report = lab
        .reports()
        .await
        .into_iter()
        .find(|r| r["metadata"]["name"] == "n1")
        .unwrap();
    assert_eq!(
        pod_report["status"]["agentVersion"],
        env!("CARGO_PKG_VERSION")
    );

    // A second set shares b; deleting the first keeps b and c pinned and releases a.
    let api = lab.set_file("api", &[b, c], "");
    let run = lab.pinboard(&["apply", "--set", api.to_str().unwrap(), "--timeout", "120s"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run = lab.pinboard(&["unpin", "--set", "web"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("deleted") || run.stderr.contains("deleted"),
        "{}",
        run.stdout
    );
    for node in ["n1", "n2", "n3"] {
        wait_pinned(&lab, node, &[a], false).await;
        lab.lab.node(node).assert_pinned(&[b, c]);
        assert!(
            lab.lab.node(node).images_ls().contains(a.as_str()),
            "images stay"
        );
    }
    let (code, _, stderr) = lab.check(&["--set", "api"]);
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_room_and_a_stopped_agent_are_named_and_bad_input_writes_nothing() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
        NodeSpec::new("n3", 24 * MIB),
    ];
    let mut lab = AgentsLab::start("agents-faults", nodes, None).await;
    let big = ImageSpec::gzip_layers(7200, &[30 * MIB as usize]);
    let big = lab
        .lab
        .push_image("agents/big", &big)
        .unwrap()
        .reference(&lab.lab.registry_host());
    let set = lab.set_file("big", &[&big], "");
    let set = set.to_str().unwrap();

    // Bad input is refused before anything is written.
    let tag_only = lab.set_file(
        "tagged",
        &[&format!("{}/agents/big:latest", lab.lab.registry_host())],
        "",
    );
    let run = lab.pinboard(&["apply", "--set", tag_only.to_str().unwrap()]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = lab.pinboard(&["apply", "--set", set, "--selector", "zone in a"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--selector"), "{}", run.stderr);
    let pin_sets: Api<DynamicObject> = Api::all_with(
        lab.admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("pinboard.dev", "v1alpha1", "PinSet"),
            "pinsets",
        ),
    );
    assert!(
        pin_sets
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // The CRD's schema refuses what it can: an image without a name.
    let nameless: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "pinboard.dev/v1alpha1", "kind": "PinSet",
        "metadata": {"name": "nameless"}, "spec": {"pinnedImages": [{}]},
    }))
    .unwrap();
    let refused = pin_sets.create(&PostParams::default(), &nameless).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );

    // The plan says the big image does not fit on n3: apply names it and writes nothing, unless forced.
    let run = lab.pinboard(&["apply", "--set", set]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("do not fit on 1 node (n3)"),
        "{}",
        run.stderr
    );
    let run = lab.pinboard(&["apply", "--set", set, "--force", "--timeout", "60s"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let (code, judged, stderr) = lab.check(&["--set", "big"]);
    assert_eq!(code, 1, "{stderr}");
    let n3 = judged.nodes.iter().find(|n| n.node == "n3").unwrap();
    assert!(!n3.ready);
    assert!(
        n3.reasons
            .iter()
            .any(|r| r.contains("failed") && r.contains("space")),
        "the agent's refusal, with the plan's reason: {:?}",
        n3.reasons
    );
    assert!(
        n3.reasons.iter().any(|r| r.contains("--min-free")) && !stderr.contains("force"),
        "what to do about it on a cluster, not a flag its reader has already used: {stderr}"
    );
    assert!(
        judged
            .nodes
            .iter()
            .filter(|n| n.node != "n3")
            .all(|n| n.ready),
        "{judged:?}"
    );

    // A stopped agent on a node no DaemonSet runs on (the lab's agents run as processes): once its heartbeat
    // lapses (four 1 s renewals), its node is left out, counted with why, not held back by the report its
    // agent left.
    lab.stop_agent("n2");
    let judged = wait_for("n2 left out", WAIT, || async {
        let (code, judged, stderr) = lab.check(&["--set", "big"]);
        (code == 1 && judged.nodes.iter().all(|n| n.node != "n2"))
            .then_some(judged)
            .ok_or(stderr)
    })
    .await;
    assert_eq!(judged.left_out.len(), 1, "{judged:?}");
    assert_eq!(judged.left_out[0].nodes, ["n2"]);
    assert!(
        judged.left_out[0].reason.ends_with(
            "(pinboard-agent-containerd: nodeSelector pinboard.dev/agent-pod=true), and the \
                        agent that ran there is stale"
        ),
        "{:?}",
        judged.left_out
    );
    // Started again, it carries on: the image is there, nothing is pulled again.
    lab.start_agent("n2");
    let (code, judged, stderr) = lab.check(&["--set", "big", "--wait", "--timeout", "60s"]);
    assert_eq!(code, 1, "n3 still has no room: {stderr}");
    assert!(
        judged.nodes.iter().find(|n| n.node == "n2").unwrap().ready,
        "{judged:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_joins_gets_the_set_from_its_own_agent_and_check_waits_for_it() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
    ];
    let mut lab = AgentsLab::start("agents-join", nodes, None).await;
    let images = small_images(&lab, &["agents/j1", "agents/j2"], 7300);
    let set = lab.set_file("joined", &[&images[0], &images[1]], "");
    let run = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "120s"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    lab.lab
        .add_node(NodeSpec::new("n3", 200 * MIB))
        .expect("n3 joins");
    lab.start_agent("n3");
    // Once its agent reports, the set (no selector: every node a DaemonSet should run an agent on or whose
    // agent is alive) counts n3, not ready yet or already pinned; `--wait` follows it to ready.
    wait_for("n3's report", WAIT, || async {
        let (_, judged, stderr) = lab.check(&["--set", "joined"]);
        judged
            .nodes
            .iter()
            .any(|n| n.node == "n3")
            .then_some(())
            .ok_or(stderr)
    })
    .await;
    let (code, judged, stderr) = lab.check(&["--set", "joined", "--wait", "--timeout", "90s"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(judged.nodes.len(), 3);
    lab.lab.node("n3").assert_pinned(&[&images[0], &images[1]]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_the_daemonset_should_run_on_is_not_ready_until_its_agent_pins_and_one_it_excludes_is_left_out()
 {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
        NodeSpec::new("n3", 200 * MIB),
    ];
    // The agents run as processes; the DaemonSet runs on the nodes labelled for it, none yet, and its
    // image is one nothing can pull.
    let mut lab = AgentsLab::start("agents-gap", nodes, None).await;
    let images = small_images(&lab, &["agents/g1", "agents/g2"], 7800);
    let set = lab.set_file("gap", &[&images[0], &images[1]], "");
    let run = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "120s"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // A node no DaemonSet runs on joins, without an agent: left out, and status says so.
    lab.lab
        .add_node(NodeSpec::new("n5", 200 * MIB))
        .expect("n5 joins");
    let excluded = "no pinboard agent DaemonSet runs there (pinboard-agent-containerd: nodeSelector \
                    pinboard.dev/agent-pod=true)";
    let run = lab.pinboard(&["status", "--set", "gap", "-o", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let status: NodesStatus = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(status.nodes.len(), 3, "{status:?}");
    assert_eq!(
        status.left_out,
        [LeftOut {
            reason: excluded.into(),
            count: 1,
            nodes: vec!["n5".into()],
        }]
    );
    let run = lab.pinboard(&["status", "--set", "gap"]);
    assert!(
        run.stdout
            .contains(&format!("\n1 node left out: {excluded}: n5\n")),
        "{}",
        run.stdout
    );
    let (code, judged, stderr) = lab.check(&["--set", "gap"]);
    assert_eq!(code, 0, "n5 holds nothing back: {stderr}");
    assert_eq!(judged.ready_nodes, 3);

    // A node labelled for the DaemonSet joins: not ready, named, before any agent reports there…
    lab.lab
        // Room for the agent's own image too: this build, stripped of debug data, is ~80 MiB unpacked.
        .add_node(NodeSpec::new("n4", 400 * MIB).labelled(POD_LABEL, "true"))
        .expect("n4 joins");
    let (code, judged, stderr) = lab.check(&["--set", "gap"]);
    assert_eq!(code, 1, "{stderr}");
    let n4 = judged.nodes.iter().find(|n| n.node == "n4").unwrap();
    assert!(!n4.ready);
    assert!(
        n4.reasons[0].starts_with(
            "no agent yet on node \"n4\": DaemonSet pinboard-system/pinboard-agent-containerd should run \
             one there, and none has reported; "
        ),
        "{:?}",
        n4.reasons
    );
    assert!(
        stderr.contains("n4: no agent yet on node \"n4\""),
        "{stderr}"
    );
    // …then with its pod's state, as its kubelet says it: the image cannot be pulled.
    let n4 = wait_for("n4's pod failing to pull, named", POD_WAIT, || async {
        let (code, judged, stderr) = lab.check(&["--set", "gap"]);
        let n4 = judged.nodes.into_iter().find(|n| n.node == "n4");
        n4.filter(|n4| {
            code == 1
                && ["ErrImagePull", "ImagePullBackOff"]
                    .iter()
                    .any(|w| n4.reasons[0].contains(&format!("its agent waiting: {w}")))
        })
        .ok_or(stderr)
    })
    .await;
    assert!(
        n4.reasons[0].contains("its pod pinboard-agent-containerd-")
            && n4.reasons[0].contains("is Pending")
            && n4.reasons[0].contains("unused.invalid/pinboard:none"),
        "{:?}",
        n4.reasons
    );
    assert!(
        n4.agent
            .as_deref()
            .is_some_and(|a| a.starts_with("no agent yet (pod ")),
        "{n4:?}"
    );
    // An account with only the viewer ClusterRole judges the same, and is told how to see the pod; with
    // the pods' Role too, it sees it. (RBAC reaches the API server's cache a moment after it is written.)
    let as_viewer = |wanted: &'static str| {
        let lab = &lab;
        async move {
            let run = lab.pinboard_as_viewer(&["check", "--set", "gap", "-o", "json"]);
            let judged: Readiness = serde_json::from_str(&run.stdout)
                .map_err(|e| format!("check -o json ({e}): {}\n{}", run.stdout, run.stderr))?;
            let n4 = judged.nodes.into_iter().find(|n| n.node == "n4");
            n4.filter(|n4| run.code == 1 && n4.reasons[0].contains(wanted))
                .ok_or(run.stderr)
        }
    };
    bind_viewer(&lab.admin, "pinboard-agents-viewer", None).await;
    let n4 = wait_for("the viewer told the pods are not its to read", WAIT, || {
        as_viewer("its pod could not be looked up")
    })
    .await;
    assert!(
        n4.reasons[0].ends_with(
            "none has reported; its pod could not be looked up: your account may not list pods in \
             namespace \"pinboard-system\": bind the Role pinboard-agents-viewer-pods there to it \
             (docs/agents.md)"
        ),
        "{:?}",
        n4.reasons
    );
    bind_viewer(&lab.admin, "pinboard-agents-viewer-pods", Some(NAMESPACE)).await;
    wait_for("the viewer told the pod's state", WAIT, || {
        as_viewer("its agent waiting: ")
    })
    .await;

    // The DaemonSet's image fixed, its pod runs the agent, which pins the set: ready, n5 still left out.
    lab.install_this_build().await;
    let (code, judged, stderr) = lab.check(&["--set", "gap", "--wait", "--timeout", "180s"]);
    assert_eq!(code, 0, "{stderr}");
    let names: Vec<&str> = judged.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["n1", "n2", "n3", "n4"]);
    assert_eq!(judged.left_out[0].nodes, ["n5"]);
    lab.lab.node("n4").assert_pinned(&[&images[0], &images[1]]);
    let pod =
        wait_for_daemonset_pod(&lab.admin, NAMESPACE, DAEMONSET, "n4", PodState::Running).await;
    let report = lab
        .reports()
        .await
        .into_iter()
        .find(|r| r["metadata"]["name"] == "n4")
        .unwrap();
    assert_eq!(
        report["status"]["agentVersion"],
        env!("CARGO_PKG_VERSION"),
        "the agent of pod {:?} reported",
        pod.metadata.name
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tui_on_agents_shows_nodes_plans_applies_follows_the_rollout_and_shows_the_pins() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
    ];
    let lab = AgentsLab::start("agents-tui", nodes, None).await;
    let images = small_images(&lab, &["agents/t1", "agents/t2"], 7500);
    let cluster = lab.lab.cluster().unwrap();
    let command = format!(
        "XDG_STATE_HOME={state} {bin} --kubeconfig {kubeconfig} --insecure-registry {registry} --min-free 4Mi \
         --image {a} --image {b}; echo EXITED $?; sleep 60",
        state = lab.lab.dir().join("state").display(),
        bin = env!("CARGO_BIN_EXE_pinboard"),
        kubeconfig = cluster.kubeconfig().display(),
        registry = lab.lab.registry_host(),
        a = images[0],
        b = images[1],
    );
    let tmux = Tmux::start("agents-tui", 140, 40, &command);
    // Nodes: the agents' reports, with their runtime and space.
    let nodes = tmux.wait_for("2/2 reachable", Duration::from_secs(30));
    assert!(
        nodes.contains("agents: "),
        "the status line names the fleet:\n{nodes}"
    );
    for node in ["n1", "n2"] {
        let row = nodes
            .lines()
            .find(|l| l.contains(&format!("│{node} ")))
            .unwrap_or_default();
        assert!(row.contains("containerd"), "{node}:\n{nodes}");
    }
    // Plan, from the agents' complete image lists.
    tmux.keys(&["3", "p"]);
    let plan = tmux.wait_for("survey done: 2 nodes", Duration::from_secs(30));
    assert!(plan.contains("✓"), "both fit:\n{plan}");
    // Apply from the Sets screen; the Rollout screen follows the agents' reports to pinned.
    tmux.keys(&["2", "a"]);
    tmux.wait_for("apply set", Duration::from_secs(5));
    tmux.keys(&["y"]);
    let rollout = tmux.wait_for("applied PinSet", Duration::from_secs(20));
    assert!(rollout.contains("Rollout"), "{rollout}");
    let pinned = wait_for("both nodes pinned on the Rollout screen", WAIT, || async {
        let screen = tmux.screen();
        let rows = screen
            .lines()
            .filter(|l| (l.contains("│n1 ") || l.contains("│n2 ")) && l.contains("pinned"))
            .count();
        (rows == 2).then_some(screen.clone()).ok_or(screen)
    })
    .await;
    assert!(!pinned.contains("EXITED"), "{pinned}");
    for node in ["n1", "n2"] {
        lab.lab.node(node).assert_pinned(&images);
    }
    // `v`: the set checked as `pinboard check` checks it, each agent asking its runtime now.
    tmux.keys(&["v"]);
    let checked = tmux.wait_for("ready on 2 node(s), as of now", Duration::from_secs(30));
    assert!(!checked.contains("EXITED"), "{checked}");
    // Config: each node's pins and who holds them.
    tmux.keys(&["5"]);
    let config = tmux.wait_for("held by", Duration::from_secs(10));
    assert!(config.contains("pinboardnodes/"), "{config}");

    // An image removed behind the agents' back on n2, twice: the second loss waits (it recurs), and the
    // Rollout screen shows n2 restoring until its agent has put the image back.
    tmux.keys(&["4"]);
    let pinned_on_n2 = || async {
        let reports = lab.reports().await;
        let n2 = reports
            .iter()
            .find(|r| r["metadata"]["name"] == "n2")
            .cloned();
        let set = n2
            .map(|r| r["status"]["sets"][0].clone())
            .unwrap_or_default();
        (set["state"] == "pinned")
            .then_some(set.clone())
            .ok_or(set.to_string())
    };
    lab.lab.node("n2").remove_image(&images[1]);
    wait_for("n2 pinned again", WAIT, || async {
        let set = pinned_on_n2().await?;
        (set["restores"]["count"] == 1)
            .then_some(())
            .ok_or(set.to_string())
    })
    .await;
    lab.lab.node("n2").remove_image(&images[1]);
    let restoring = tmux.wait_for("restoring", Duration::from_secs(20));
    let row = restoring
        .lines()
        .find(|l| l.contains("│n2 "))
        .unwrap_or_default();
    assert!(row.contains("restoring"), "n2 is restoring:\n{restoring}");
    let back = wait_for("n2 pinned again on the Rollout screen", WAIT, || async {
        let screen = tmux.screen();
        let row = screen
            .lines()
            .find(|l| l.contains("│n2 "))
            .unwrap_or_default();
        row.contains("pinned")
            .then_some(screen.clone())
            .ok_or(screen)
    })
    .await;
    assert!(!back.contains("EXITED"), "{back}");
    lab.lab.node("n2").assert_pinned(&images);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_mid_rollout_carries_on_and_pulls_no_image_twice() {
    let mut lab =
        AgentsLab::start("agents-restart", vec![NodeSpec::new("n1", 400 * MIB)], None).await;
    // One pull at a time, so the agent can be caught between two images.
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--parallel", "1"]);
    let pushed: Vec<_> = (0..12)
        .map(|i| {
            let spec = ImageSpec::gzip_layers(7400 + i, &[8 * MIB as usize]);
            lab.lab.push_image(&format!("agents/r{i}"), &spec).unwrap()
        })
        .collect();
    let host = lab.lab.registry_host();
    let images: Vec<String> = pushed.iter().map(|p| p.reference(&host)).collect();
    let listed: Vec<&str> = images.iter().map(String::as_str).collect();
    let set = lab.set_file("restart", &listed, "");
    let run = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "1s"]);
    assert_ne!(run.code, 2, "{}", run.stderr);
    let held = wait_for("n1 midway", WAIT, || async {
        let on_node = lab.lab.node("n1").images_ls();
        let held: Vec<usize> = (0..images.len())
            .filter(|&i| on_node.contains(images[i].as_str()))
            .collect();
        (!held.is_empty() && held.len() < images.len())
            .then_some(held)
            .ok_or(on_node)
    })
    .await;
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--parallel", "1"]);
    let (code, _, stderr) = lab.check(&["--set", "restart", "--wait", "--timeout", "120s"]);
    assert_eq!(code, 0, "{stderr}");
    lab.lab.node("n1").assert_pinned(&images);
    // The images the node held when its agent was killed were not fetched again.
    let log = std::fs::read_to_string(lab.lab.dir().join("registry.log")).unwrap();
    for i in held {
        let layer = &pushed[i].layers[0].digest;
        let fetched = log
            .lines()
            .filter(|l| l.contains("GET /v2/") && l.contains(layer.as_str()))
            .count();
        assert_eq!(
            fetched, 1,
            "{}: its layer fetched {fetched} times",
            images[i]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lazy_pulling_asked_through_the_agents_is_written_by_each_agent_and_reported() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB).importing_conf_d(),
        NodeSpec::new("n2", 200 * MIB),
    ];
    let mut lab = AgentsLab::start("agents-lazy", nodes, None).await;
    let socket = lab.lab.dir().join("stargz.sock");
    for node in ["n1", "n2"] {
        let config = lab.lab.node(node).config_file().display().to_string();
        lab.stop_agent(node);
        lab.start_agent_with(
            node,
            &[
                "--containerd-config",
                &config,
                "--stargz-socket",
                socket.to_str().unwrap(),
            ],
        );
    }

    let run = lab.pinboard(&["lazy", "on", "--restart"]);
    assert_eq!(
        run.code, 2,
        "agents never restart a runtime: {}",
        run.stderr
    );
    assert!(run.stderr.contains("never restart"), "{}", run.stderr);

    // n1's agent writes the file its containerd imports; n2's config imports nothing: its agent says
    // what to add, in its report, and writes nothing.
    let run = lab.pinboard(&["lazy", "on", "-o", "json"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let said: Value = serde_json::from_str(&run.stdout).unwrap();
    let node = |name: &str| {
        said["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {said}"))
    };
    assert_eq!(
        node("n1")["lazyPulling"]["text"],
        "on after restart",
        "{said}"
    );
    assert!(node("n1")["error"].is_null(), "{said}");
    let n2_error = node("n2")["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        n2_error.contains("nothing written") && n2_error.contains("imports = ["),
        "{said}"
    );
    assert!(
        run.stderr
            .contains("error: n2: lazy pulling not changed: nothing written"),
        "{}",
        run.stderr
    );
    let n1_dir = lab.lab.node("n1").dir().to_path_buf();
    let written =
        std::fs::read_to_string(n1_dir.join("conf.d/zz-pinboard-lazy-pulling.toml")).unwrap();
    assert!(written.contains("[proxy_plugins.stargz]"), "{written}");
    let n2_dir = lab.lab.node("n2").dir().to_path_buf();
    assert!(!n2_dir.join("conf.d").exists(), "nothing written on n2");

    // Asked off again, n1's file no longer turns it on and its report follows.
    let run = lab.pinboard(&["lazy", "off", "-o", "json"]);
    let said: Value = serde_json::from_str(&run.stdout).unwrap();
    let n1 = said["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "n1")
        .cloned()
        .unwrap();
    assert_eq!(n1["lazyPulling"]["state"], "off", "{said}\n{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_set_edited_mid_rollout_converges_to_its_new_content() {
    let mut lab =
        AgentsLab::through_proxy("agents-edit", vec![NodeSpec::new("n1", 400 * MIB)]).await;
    // One pull at a time through a slow link, so the set can be edited while it is pulled.
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &["--parallel", "1"]);
    let images: Vec<String> = (0..10)
        .map(|i| {
            let spec = ImageSpec::gzip_layers(7600 + i, &[4 * MIB as usize]);
            lab.lab
                .push_image(&format!("agents/e{i}"), &spec)
                .unwrap()
                .reference(&lab.lab.proxy_host())
        })
        .collect();
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    lab.lab.proxy().set_bandwidth(Some(2 * MIB));
    let proxy = lab.lab.proxy_host();
    // Written, not waited for.
    let apply = |images: &[&str]| {
        let file = lab.set_file("edited", images, "");
        let run = lab.apply(&file, "1s", &[]);
        assert_ne!(run.code, 2, "{}", run.stderr);
    };
    apply(&refs[..8]);
    wait_for("n1 pulling the first content", WAIT, || async {
        let on_node = lab.lab.node("n1").images_ls();
        refs[..8]
            .iter()
            .any(|r| on_node.contains(r))
            .then_some(())
            .ok_or(on_node)
    })
    .await;
    // Edited: two images kept, six dropped, two new.
    let edited: Vec<&str> = [&refs[..2], &refs[8..]].concat();
    apply(&edited);
    lab.lab.proxy().set_bandwidth(None);
    let second = lab.lab.dir().join("edited.yaml");
    let (code, judged, stderr) = lab.check(&[
        "--insecure-registry",
        &proxy,
        "--set",
        second.to_str().unwrap(),
        "--wait",
        "--timeout",
        "120s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(judged.nodes[0].sets[0].current_generation, Some(2));
    let node = lab.lab.node("n1");
    node.assert_pinned(&edited);
    // The first content's rollout was given up: the dropped images it had not reached were never pulled,
    // and those it had are not pinned.
    let listed = node.images_ls();
    let dropped: Vec<&&str> = refs[2..8].iter().filter(|r| listed.contains(**r)).collect();
    assert!(
        dropped.len() < 6,
        "the old content was pulled to the end:\n{listed}"
    );
    for reference in dropped {
        let line = listed.lines().find(|l| l.starts_with(*reference)).unwrap();
        assert!(!line.contains("io.cri-containerd.pinned=pinned"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_left_only_lazily_present_is_named_and_its_node_not_ready() {
    let mut lab =
        AgentsLab::start("agents-lazily", vec![NodeSpec::new("n1", 200 * MIB)], None).await;
    let spec = ImageSpec::gzip_layers(7700, &[128 * 1024; 3]);
    let pushed = lab.lab.push_image("agents/lazily", &spec).unwrap();
    let image = pushed.reference(&lab.lab.registry_host());
    let set = lab.set_file("lazily", &[&image], "");
    let run = lab.pinboard(&["apply", "--set", set.to_str().unwrap(), "--timeout", "120s"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // As a remote snapshotter leaves an image: snapshots labelled remote, layer blobs not in the store.
    let digests: Vec<String> = pushed.layers.iter().map(|l| l.digest.clone()).collect();
    lab.lab
        .node("n1")
        .make_lazy(&pushed.config_digest, &digests)
        .unwrap();
    // The agent reads its node again at its start.
    lab.stop_agent("n1");
    lab.start_agent("n1");
    let n1 = wait_for("n1 judged lazily present", WAIT, || async {
        let (code, judged, stderr) = lab.check(&["--set", "lazily"]);
        let n1 = judged.nodes.into_iter().next().ok_or(stderr.clone())?;
        (code == 1 && n1.reasons.iter().any(|r| r.contains("present only lazily")))
            .then_some(n1)
            .ok_or(stderr)
    })
    .await;
    assert!(
        n1.reasons
            .iter()
            .any(|r| r.contains(&format!("{image} (3 of 3 layers remote)"))),
        "{:?}",
        n1.reasons
    );
}

/// `apply -o json` on agents says per node what its runtime fetched, as the node's agent measured it (its
/// content store's gain), beside what the plan said; the proxy counts the same bytes. n1 holds X (base B,
/// layer x) already: the set's Y and W share B, so n1 fetches only their own layers, n2 B too. Each node is
/// applied alone, so that the proxy's count is that node's; its progress lines count each blob once.
#[tokio::test(flavor = "multi_thread")]
async fn apply_on_agents_reports_what_each_node_fetched_as_the_proxy_counts_it() {
    let nodes = vec![
        NodeSpec::new("n1", 200 * MIB),
        NodeSpec::new("n2", 200 * MIB),
    ];
    let lab = AgentsLab::through_proxy("agents-fetched", nodes).await;
    let proxy = lab.lab.proxy_host();
    let layer = |seed, bytes: u64| support::LayerSpec {
        seed,
        bytes: bytes as usize,
        format: support::LayerFormat::Gzip,
    };
    let image = |repository: &str, layers: Vec<support::LayerSpec>| {
        let spec = ImageSpec {
            layers,
            ..ImageSpec::default()
        };
        lab.lab
            .push_image(repository, &spec)
            .expect("push")
            .reference(&proxy)
    };
    let base = layer(7300, 3 * MIB);
    let x = image("fetched/x", vec![base.clone(), layer(7301, 2 * MIB)]);
    let y = image("fetched/y", vec![base.clone(), layer(7302, 4 * MIB)]);
    let w = image("fetched/w", vec![base, layer(7303, MIB)]);
    lab.lab.node("n1").pull(&x).expect("n1 holds X");
    let set = lab.set_file("web", &[&y, &w], "");
    let mut fetched = BTreeMap::new();
    for node in ["n1", "n2"] {
        let before = lab.lab.proxy().bytes_down();
        let run = lab.pinboard(&[
            "apply",
            "-o",
            "json",
            "--insecure-registry",
            &proxy,
            "--set",
            set.to_str().unwrap(),
            "--selector",
            &format!("kubernetes.io/hostname={node}"),
            "--timeout",
            "120s",
        ]);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        let moved = lab.lab.proxy().bytes_down() - before;
        let report: Value = serde_json::from_str(&run.stdout).unwrap();
        let outcome = report["rollout"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["node"] == node)
            .unwrap_or_else(|| panic!("{node} in {report}"))
            .clone();
        let bytes = outcome["fetchedBytes"].as_u64().unwrap();
        eprintln!(
            "{node}: fetchedBytes {bytes}, plannedBytes {}, proxy {moved}",
            outcome["plannedBytes"]
        );
        assert_eq!(outcome["fetchedSource"], "content-store", "{outcome}");
        assert_eq!(outcome["state"], "pinned", "{outcome}");
        assert_eq!(
            (outcome["pulled"].as_u64(), outcome["pinned"].as_u64()),
            (Some(2), Some(2))
        );
        // The proxy also counts the manifests; the runtime's content store counts blobs.
        let against = format!("{node}: fetched bytes, against the proxy's");
        support::assert_within(&against, bytes, moved, 0.02);
        let planned = outcome["plannedBytes"].as_u64().unwrap();
        let plan = format!("{node}: planned bytes, against the fetched");
        support::assert_within(&plan, planned, bytes, 0.02);
        // Progress counts this node's bytes of this generation, each blob once: never more than the plan.
        for line in run.stderr.lines().filter(|l| l.ends_with(" fetched)")) {
            let total = line
                .rsplit_once(" of ")
                .and_then(|(_, t)| t.strip_suffix(" fetched)"))
                .and_then(|t| t.split_once(' '))
                .map(|(number, unit)| {
                    let unit = match unit {
                        "MiB" => MIB as f64,
                        "KiB" => 1024.0,
                        _ => 1.0,
                    };
                    number.parse::<f64>().unwrap() * unit
                })
                .unwrap();
            assert!(total <= planned as f64 * 1.01, "{node}: {line}");
        }
        fetched.insert(node, bytes);
    }
    assert!(
        fetched["n2"] >= fetched["n1"] + 3 * MIB,
        "n2 fetched B, n1 held it: {fetched:?}"
    );
}

/// An agent on a real CRI-O 1.33 node whose configuration serves its pull-bytes counter and sets a
/// `pull_progress_timeout` (the drop-in `pinboard crio-progress on` writes): its report's bytes rise while
/// a throttled pull runs, and the rollout's outcome names CRI-O's counters as its source, within 5 % of
/// what the link carried.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_on_crio_1_33_reports_live_bytes_from_crios_counters() {
    use support::fan_out::{reports, wait_set_pinned_on};
    let setup = support::agents::AgentsSetup {
        agent_args: vec!["--insecure-registry={proxy}".to_string()],
        ..Default::default()
    };
    let nodes = vec![NodeSpec::new("n1", 200 * MIB)];
    let mut lab = AgentsLab::start_with("agents-crio-bytes", nodes, None, setup).await;
    lab.add_host_node(
        NodeSpec::new("n4", 256 * MIB).on(support::Runtime::Crio133),
        &[],
    )
    .await;
    let config_dir = lab.lab.node("n4").crio().config_dir.clone();
    std::fs::write(
        config_dir.join("40-pinboard-pull-progress.conf"),
        "[crio.metrics]\nenable_metrics = true\n\n[crio.image]\npull_progress_timeout = \"10s\"\n",
    )
    .unwrap();
    lab.lab.restart_node("n4").unwrap();
    lab.kubectl(&["label", "node", "n4", "pinboard.test/runtime=crio"]);
    let image = lab
        .lab
        .push_image("crio/live", &ImageSpec::gzip_layers(7402, &[12 << 20]))
        .unwrap()
        .reference(&lab.lab.proxy_host());
    lab.lab.proxy().set_bandwidth(Some(MIB));
    let before = lab.lab.proxy().bytes_down();
    let selector = "  nodeSelector:\n    matchLabels:\n      pinboard.test/runtime: crio\n";
    let file = lab.set_file("live", &[&image], selector);
    lab.kubectl(&["apply", "-f", file.to_str().unwrap()]);
    let applied = std::time::Instant::now();
    // While it pulls, n4's report carries the bytes CRI-O counted so far.
    let (rising, seen) = wait_for("n4's bytes while it pulls", WAIT, || async {
        let reports = reports(&lab).await;
        let set = reports
            .get("n4")
            .map(|r| r["status"]["sets"][0].clone())
            .unwrap_or_default();
        let done = set["doneBytes"].as_u64().unwrap_or(0);
        let total = set["totalBytes"].as_u64().unwrap_or(0);
        (set["state"] == "pulling" && done > 0 && done < total)
            .then(|| (applied.elapsed(), (done, total)))
            .ok_or_else(|| format!("{set}"))
    })
    .await;
    eprintln!("n4's report: {seen:?} bytes {rising:?} after the set was applied");
    let reports = wait_set_pinned_on(&lab, "live", &["n4"]).await;
    let moved = lab.lab.proxy().bytes_down() - before;
    let outcome = &reports["n4"]["status"]["sets"][0]["outcome"];
    assert_eq!(outcome["fetchedSource"], "runtime-counters", "{outcome}");
    let fetched = outcome["fetchedBytes"].as_u64().unwrap_or(0);
    support::assert_within(
        "n4: CRI-O's counted bytes, against the link's",
        fetched,
        moved,
        0.05,
    );
}

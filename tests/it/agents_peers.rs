//! Nodes serving each other a fan-out set's blobs (`pinboard agent --peer-port`): containerd nodes with
//! real kubelets, an agent on each (processes started as their pods would run, all eligible for the
//! cache's role, each node's serving capped to emulate its NIC), the registry behind the counting proxy at
//! the lab's link cap. The cache's holder fetches each blob once; the nodes take it from each other as its
//! tracker says, every piece checked against the holder's hash.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agents::AgentsLab;
use support::fan_out::{
    self, WAIT, apply_fan_out_set, cache_token, push_images, reports, through_proxy,
    wait_link_moved, wait_set_pinned_on,
};
use support::kube_objects::wait_for;
use support::{PushedImage, RegistrySetup, unique_bytes};

const MI: u64 = 1 << 20;
/// The lab's registry link.
const LINK: u64 = 8 * MI;
/// Each node's NIC, emulated: what its agent sends to the other nodes, all together.
const NIC: &str = "8MiB/s";
const PEER_PORT: &str = "5051";
const EIGHT: [&str; 8] = ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"];

/// A lab of `nodes` serving each other, their agents eligible for the cache's role, each sending at most
/// `nic` to the others, each keeping its pieces in a directory of its own.
async fn peers_lab(name: &str, nodes: &[&str], nic: &str) -> AgentsLab {
    peers_lab_in(name, nodes, nic, "{lab}/peers-{node}").await
}

/// [`peers_lab`] with every agent's `--peer-dir` at `dir` (`{lab}` and `{node}` filled in).
async fn peers_lab_in(name: &str, nodes: &[&str], nic: &str, dir: &str) -> AgentsLab {
    let peers = [
        format!("--peer-port={PEER_PORT}"),
        format!("--peer-dir={dir}"),
        format!("--serve-rate={nic}"),
    ];
    let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
    let lab = fan_out::cache_lab(name, nodes, RegistrySetup::default(), &peers).await;
    lab.lab.proxy().set_bandwidth(Some(LINK));
    lab
}

/// The nodes' peer figures once every node in `nodes` reports them and they add up: what the nodes took
/// from each other and from the holder covers `taken` bytes at least.
async fn peer_figures(lab: &AgentsLab, nodes: &[&str], taken: u64) -> BTreeMap<String, Value> {
    wait_for("every node's peer figures", WAIT, || async {
        let reports = reports(lab).await;
        let figures: BTreeMap<String, Value> = nodes
            .iter()
            .filter_map(|n| {
                Some((
                    n.to_string(),
                    reports.get(*n)?["status"].get("peers")?.clone(),
                ))
            })
            .collect();
        let took: u64 = figures
            .values()
            .map(|p| {
                p["fromPeersBytes"].as_u64().unwrap_or(0)
                    + p["fromHolderBytes"].as_u64().unwrap_or(0)
            })
            .sum();
        (figures.len() == nodes.len() && took >= taken)
            .then(|| figures.clone())
            .ok_or_else(|| format!("{took} of {taken} bytes: {figures:?}"))
    })
    .await
}

/// The layers of `images` the nodes share (a piece for every stripe), each once.
fn shared_layers(images: &[PushedImage]) -> BTreeMap<String, u64> {
    images
        .iter()
        .flat_map(|i| &i.layers)
        .filter(|l| l.size > MI)
        .map(|l| (l.digest.clone(), l.size))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_nodes_take_a_fan_out_set_from_each_other_with_each_blob_over_the_link_once() {
    let nodes = EIGHT;
    let mut lab = peers_lab("agents-peers", &nodes, NIC).await;
    let images = push_images(&lab, "peers/app", 9800, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let (holder, _) = lab.cache_holder().await;
    // One node's agent serves its metrics (the lab's nodes share a network namespace: a port of its own).
    let watched = *nodes.iter().find(|n| **n != holder).unwrap();
    let metrics_port = support::free_port().unwrap().to_string();
    lab.stop_agent(watched);
    lab.start_agent_with(watched, &["--metrics-port", &metrics_port]);
    let lab_ip = lab.lab.network().expect("a cluster lab").lab_ip();
    let before = lab.lab.proxy().bytes_down();
    let started = Instant::now();
    apply_fan_out_set(&lab, "web", &references, "").await;
    wait_set_pinned_on(&lab, "web", &nodes).await;
    eprintln!(
        "8 nodes serving each other: pinned everywhere {:?} after the set was applied",
        started.elapsed()
    );
    for node in nodes {
        lab.lab.node(node).assert_pinned(&references);
    }
    lab.lab
        .assert_moved_at_most("8 nodes serving each other", before, unique, 1.02);
    // Every node took every shared layer; the nodes served each other, not only the holder.
    let layers = shared_layers(&images);
    let per_node: u64 = layers.values().sum();
    let figures = peer_figures(&lab, &nodes, per_node * nodes.len() as u64).await;
    let served: BTreeMap<&String, u64> = figures
        .iter()
        .map(|(node, p)| (node, p["servedBytes"].as_u64().unwrap_or(0)))
        .collect();
    let from_peers: u64 = figures
        .values()
        .map(|p| p["fromPeersBytes"].as_u64().unwrap())
        .sum();
    let from_holder: u64 = figures
        .values()
        .map(|p| p["fromHolderBytes"].as_u64().unwrap())
        .sum();
    eprintln!(
        "served by each node: {served:?}; taken from peers {from_peers}, from the holder {from_holder}"
    );
    let serving = served
        .iter()
        .filter(|(node, bytes)| **node != &holder && **bytes > 0)
        .count();
    assert!(
        serving >= 4,
        "at least half the nodes served others: {served:?}"
    );
    assert!(
        from_peers > from_holder,
        "the nodes took more from each other ({from_peers}) than from the holder ({from_holder})"
    );
    assert!(
        from_holder <= 2 * per_node,
        "the holder sent each shared layer about once ({from_holder} bytes for {per_node})"
    );
    // The watched node's metrics say what it took from the other nodes.
    let http = support::http::agent();
    let taken = format!("pinboard_peer_taken_bytes_total{{node=\"{watched}\",from=\"peers\"}} ");
    wait_for("the peer figures in the metrics", WAIT, || async {
        let url = format!("http://{lab_ip}:{metrics_port}/metrics");
        let page = http.get(&url).call().map_err(|e| e.to_string())?;
        let page = page
            .into_body()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        page.lines()
            .find_map(|l| l.strip_prefix(&taken)?.parse::<f64>().ok())
            .filter(|bytes| *bytes > 0.0)
            .map(|_| ())
            .ok_or_else(|| {
                page.lines()
                    .filter(|l| l.contains("peer"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
    })
    .await;
    // Every peer refuses a request without the cache's token, and serves one with it.
    let token = cache_token(&lab).await;
    let (digest, _) = layers.iter().next().expect("a shared layer");
    let mut cuts = std::collections::BTreeSet::new();
    for (node, peers) in &figures {
        let url = format!(
            "{}/pinboard/v1/pieces/{digest}",
            peers["address"].as_str().unwrap()
        );
        assert!(url.contains(&format!(":{PEER_PORT}/")), "{url}");
        let piece = "bytes=0-262143";
        let refused = http.get(&url).header("Range", piece).call();
        let status = refused.unwrap_or_else(|e| panic!("{node}: {e}")).status();
        assert_eq!(
            status.as_u16(),
            401,
            "{node} refuses a request without the token"
        );
        let answer = http
            .get(&url)
            .header("Range", piece)
            .header(pinboard::model::cache_token::CACHE_TOKEN_HEADER, &token)
            .call()
            .unwrap_or_else(|e| panic!("{node}: {e}"));
        assert_eq!(
            answer.status().as_u16(),
            206,
            "{node} serves its pieces with the token"
        );
        // And the cut it took the blob by: the holder's, whichever parent it came from.
        let cut_url = url.replace("/pieces/", "/cuts/");
        let cut = http
            .get(&cut_url)
            .header(pinboard::model::cache_token::CACHE_TOKEN_HEADER, &token)
            .call()
            .unwrap_or_else(|e| panic!("{node}: {e}"))
            .into_body()
            .read_to_string()
            .unwrap_or_else(|e| panic!("{node}'s cut: {e}"));
        let cut: pinboard::model::peers::Cut =
            serde_json::from_str(&cut).unwrap_or_else(|e| panic!("{node}'s cut {cut}: {e}"));
        assert!(cut.is_consistent(), "{node}: {cut:?}");
        cuts.insert(cut.digest());
    }
    assert_eq!(cuts.len(), 1, "every node took the blob by one cut");
}

/// Six nodes, as kubelets on one machine run them, share one `--peer-dir` (the DaemonSet's hostPath),
/// and take five sets from each other, one after another, without a fault: no node ever serves a piece
/// before it holds it, so none is refused, and every set is pinned whole.
#[tokio::test(flavor = "multi_thread")]
async fn six_nodes_sharing_one_peer_dir_take_five_sets_without_refusing_a_piece() {
    let nodes = ["n1", "n2", "n3", "n4", "n5", "n6"];
    let lab = peers_lab_in("agents-peers-shared", &nodes, NIC, "{lab}/peers").await;
    // What the nodes took of the shared layers, over the runs so far.
    let mut taken = 0;
    for run in 0..5u64 {
        let images = push_images(&lab, &format!("shared{run}/app"), 9700 + 10 * run, 3);
        let references = through_proxy(&lab, &images);
        let set = format!("run{run}");
        let before = lab.lab.proxy().bytes_down();
        apply_fan_out_set(&lab, &set, &references, "").await;
        wait_set_pinned_on(&lab, &set, &nodes).await;
        for node in nodes {
            lab.lab.node(node).assert_pinned(&references);
        }
        let unique = unique_bytes(&images);
        lab.lab
            .assert_moved_at_most(&format!("run {run}"), before, unique, 1.05);
        taken += shared_layers(&images).values().sum::<u64>() * nodes.len() as u64;
        let figures = peer_figures(&lab, &nodes, taken).await;
        let refused: BTreeMap<&String, u64> = figures
            .iter()
            .map(|(node, p)| (node, p["refusedPieces"].as_u64().unwrap_or(0)))
            .collect();
        let from_peers: u64 = figures
            .values()
            .map(|p| p["fromPeersBytes"].as_u64().unwrap_or(0))
            .sum();
        eprintln!("run {run}: refused pieces {refused:?}; taken from peers {from_peers} bytes");
        assert!(
            refused.values().all(|n| *n == 0),
            "run {run}: no piece refused in a fault-free fan-out: {refused:?} (lab: {})",
            lab.lab.dir().display()
        );
        assert!(from_peers > 0, "run {run}: the nodes served each other");
    }
}

/// A node killed while it forwards pieces to others (its DaemonSet starting it again): the nodes below it
/// resume their stripes from another parent, and every node still ends pinned with each blob over the
/// link about once.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_killed_mid_transfer_costs_its_children_a_resume_and_every_node_ends_pinned() {
    let nodes = EIGHT;
    // Slow NICs: the nodes take seconds to pass the set on, so the kill lands mid-transfer.
    let mut lab = peers_lab("agents-peers-killed", &nodes, "2MiB/s").await;
    let images = push_images(&lab, "killed/app", 9900, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let (holder, _) = lab.cache_holder().await;
    let victim = *nodes
        .iter()
        .find(|n| **n != holder)
        .expect("a node besides the holder");
    let before = lab.lab.proxy().bytes_down();
    apply_fan_out_set(&lab, "web", &references, "").await;
    wait_link_moved(&lab, before, unique / 2).await;
    // Placed and forwarding by now: every node of a batch of 8 serves children in its tree.
    std::thread::sleep(Duration::from_secs(1));
    lab.stop_agent(victim);
    std::thread::sleep(Duration::from_secs(2));
    lab.start_agent(victim);
    wait_set_pinned_on(&lab, "web", &nodes).await;
    for node in nodes {
        lab.lab.node(node).assert_pinned(&references);
    }
    let resumed: Vec<&str> = nodes
        .iter()
        .copied()
        .filter(|n| *n != victim)
        .filter(|n| {
            let log = std::fs::read_to_string(lab.lab.dir().join(format!("agent-{n}.log")));
            log.unwrap_or_default().lines().any(|l| {
                l.contains("resuming from another parent")
                    && l.contains(&format!("peer=\"{victim}\""))
            })
        })
        .collect();
    assert!(
        !resumed.is_empty(),
        "the nodes below {victim} resumed from another parent (lab: {})",
        lab.lab.dir().display()
    );
    eprintln!("{victim} killed mid-transfer: {resumed:?} resumed from another parent");
    lab.lab
        .assert_moved_at_most("a peer killed mid-transfer", before, unique, 1.10);
}

/// A node whose copy of the blobs went bad (its files overwritten on disk after it verified them) serves
/// corrupt pieces: the node taking them refuses each against the holder's hash and takes it elsewhere,
/// ends pinned with the right bytes, and the tracker drops the bad node and names it.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_serving_corrupt_pieces_is_refused_dropped_and_named() {
    let nodes = ["n1", "n2", "n3"];
    let lab = peers_lab("agents-peers-corrupt", &nodes, NIC).await;
    let images = push_images(&lab, "corrupt/app", 9950, 2);
    let references = through_proxy(&lab, &images);
    let (holder, _) = lab.cache_holder().await;
    let others: Vec<&str> = nodes.iter().copied().filter(|n| *n != holder).collect();
    let (bad, taker) = (others[0], others[1]);
    let on = |node: &str| {
        format!("  nodeSelector:\n    matchLabels:\n      kubernetes.io/hostname: {node}\n")
    };
    // `bad` takes the set first (from the holder), then its copies are spoiled.
    apply_fan_out_set(&lab, "first", &references, &on(bad)).await;
    wait_set_pinned_on(&lab, "first", &[bad]).await;
    let layers = shared_layers(&images);
    for digest in layers.keys() {
        let file = lab
            .lab
            .dir()
            .join(format!("peers-{bad}"))
            .join(bad)
            .join(digest.replace(':', "-"));
        let mut bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        bytes.iter_mut().for_each(|b| *b ^= 0x5a);
        std::fs::write(&file, bytes).unwrap();
    }
    // `taker` and the holder's node take the same blobs: the tracker names `bad` (done, least loaded) for
    // some of their stripes.
    let on_both = format!(
        "  nodeSelector:\n    matchExpressions:\n    - key: kubernetes.io/hostname\n      operator: In\n      \
         values: [{taker}, {holder}]\n"
    );
    apply_fan_out_set(&lab, "second", &references, &on_both).await;
    wait_set_pinned_on(&lab, "second", &[taker, &holder]).await;
    lab.lab.node(taker).assert_pinned(&references);
    // Whichever of the two the tracker sent to `bad` refused its pieces.
    let figures = peer_figures(&lab, &[taker, &holder], 2 * layers.values().sum::<u64>()).await;
    let refused: u64 = figures
        .values()
        .map(|p| p["refusedPieces"].as_u64().unwrap())
        .sum();
    assert!(refused >= 1, "the corrupt pieces were refused: {figures:?}");
    let dropped = wait_for("the holder names the dropped peer", WAIT, || async {
        let reports = reports(&lab).await;
        let dropped = reports[&holder]["status"]["cache"]["droppedPeers"].clone();
        dropped
            .as_array()
            .filter(|d| d.iter().any(|p| p["node"] == bad))
            .map(|_| dropped.clone())
            .ok_or_else(|| format!("{dropped}"))
    })
    .await;
    let reason = dropped[0]["reason"].as_str().unwrap();
    assert!(
        (reason.contains(taker) || reason.contains(&holder))
            && reason.contains("the holder's is sha256:"),
        "the reason says who refused what: {reason}"
    );
    let check = lab.pinboard(&["check", "--set", "second"]);
    assert_eq!(check.code, 0, "{}\n{}", check.stdout, check.stderr);
    assert!(
        check
            .stdout
            .contains(&format!("! {bad} no longer serves the other nodes")),
        "{}",
        check.stdout
    );
}

//! Fan-out across a cluster through pinboard's agents and the in-cluster cache: 3 containerd nodes with
//! real kubelets, an agent on each (processes started as their pods would run, each eligible for the
//! cache's role), the registry behind the counting proxy. A set with `spec.fanOut` ends pinned on every
//! node while each blob crosses the link about once, and every node's hosts.toml is back afterwards; also
//! for a private image (the cache refusing anyone without its token), a link that resets every MiB, the
//! cache's holder killed mid-rollout, and a CRI-O node (the stand-in, with its agent on this host) pulling
//! through its agent's relay beside the containerd nodes.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agents::{AgentsLab, AgentsSetup};
use support::fan_out::{
    self, CACHE_PORT, WAIT, apply_fan_out_set, cache_token, push_images, reports, through_proxy,
    wait_link_moved, wait_set_pinned_on,
};
use support::kube_objects::{apply_yaml, wait_for};
use support::link::{LinkSampler, assert_kept_to};
use support::{ImageSpec, NodeSpec, RegistrySetup, Runtime, unique_bytes};

const MI: u64 = 1 << 20;
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// How many rollouts the cache's holder is restarted in.
const RESTARTS: u64 = 10;

/// A lab of [`NODES`] whose agents are all eligible for the cache's role and reach `registry` through the
/// proxy.
async fn cache_lab(name: &str, registry: RegistrySetup) -> AgentsLab {
    cache_lab_with(name, registry, &[]).await
}

/// [`cache_lab`], every agent with `more` arguments.
async fn cache_lab_with(name: &str, registry: RegistrySetup, more: &[&str]) -> AgentsLab {
    fan_out::cache_lab(name, &NODES, registry, more).await
}

/// Waits until every node's report has set `name` pinned.
async fn wait_set_pinned(lab: &AgentsLab, name: &str) -> BTreeMap<String, Value> {
    wait_set_pinned_on(lab, name, &NODES).await
}

/// Waits until every node has set `name` pinned, and asserts that each holds `references` pinned and says
/// it pulled through the cache; the reports.
async fn wait_pinned_through_cache(
    lab: &AgentsLab,
    name: &str,
    references: &[String],
) -> BTreeMap<String, Value> {
    let reports = wait_set_pinned(lab, name).await;
    for node in NODES {
        lab.lab.node(node).assert_pinned(references);
        let set = &reports[node]["status"]["sets"][0];
        assert!(
            set["fanOut"]["cache"]
                .as_str()
                .is_some_and(|c| c.ends_with(&format!(":{CACHE_PORT}"))),
            "{node} pulled through the cache: {set}"
        );
    }
    reports
}

/// Applies set `web` of `references` over a link slowed to 2 MiB/s, and returns once a quarter of their
/// `unique` bytes crossed it, the link slow still; what the proxy had sent before.
async fn apply_until_a_quarter_moved(lab: &AgentsLab, references: &[String], unique: u64) -> u64 {
    lab.lab.proxy().set_bandwidth(Some(2 * MI));
    let before = lab.lab.proxy().bytes_down();
    apply_fan_out_set(lab, "web", references, "").await;
    wait_link_moved(lab, before, unique / 4).await;
    before
}

/// Waits until every node's hosts.toml is as it was (`before`).
async fn wait_hosts_back(lab: &AgentsLab, before: &[Option<String>]) {
    wait_for("every hosts.toml back", Duration::from_secs(30), || async {
        let now = hosts_files(lab);
        (now == before).then_some(()).ok_or(format!("{now:?}"))
    })
    .await;
}

/// Every node's hosts.toml for the proxy, as it is now (None: no file).
fn hosts_files(lab: &AgentsLab) -> Vec<Option<String>> {
    NODES
        .iter()
        .map(|n| std::fs::read_to_string(lab.lab.node(n).hosts_toml(&lab.lab.proxy_host())).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_set_is_pinned_on_every_node_with_each_blob_over_the_link_about_once() {
    let mut lab = cache_lab("agents-fanout", RegistrySetup::default()).await;
    let images = push_images(&lab, "fanout/app", 9100, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let hosts_before = hosts_files(&lab);
    let before = lab.lab.proxy().bytes_down();
    // `apply --fan-out` through the agents writes the set with spec.fanOut.
    let refs: Vec<&str> = references.iter().map(String::as_str).collect();
    let file = lab.set_file("web", &refs, "");
    let proxy = lab.lab.proxy_host();
    let run = lab.pinboard(&[
        "apply",
        "--insecure-registry",
        &proxy,
        "--set",
        file.to_str().unwrap(),
        "--fan-out",
        "--timeout",
        "120s",
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    wait_pinned_through_cache(&lab, "web", &references).await;
    let moved =
        lab.lab
            .assert_moved_at_most("fan-out through the in-cluster cache", before, unique, 1.05);
    // `apply -o json` says what crossed the link and what the cache served in this rollout, as of after
    // it: the holder's figures read after apply's question, not at its last heartbeat.
    let applied: Value = serde_json::from_str(&run.stdout).unwrap();
    let figure = |name: &str| applied["fanOut"][name].as_u64().unwrap_or(0);
    let (link, served) = (figure("linkBytes"), figure("servedBytes"));
    eprintln!(
        "apply -o json: linkBytes {link}, servedBytes {served}; the proxy counted {moved} for {unique} unique"
    );
    assert!(
        link >= unique - unique / 20 && link <= moved,
        "apply's linkBytes ({link}) is what crossed the link ({moved}) for {unique} unique"
    );
    assert!(
        served >= 3 * (unique - unique / 20),
        "apply's servedBytes ({served}) covers the 3 nodes' {unique} each"
    );
    assert!(
        !run.stderr.contains("did not report its figures"),
        "{}",
        run.stderr
    );
    // The holder reports its figures at its heartbeat's pace.
    wait_for(
        "the cache's figures in its holder's report",
        WAIT,
        || async {
            let reports = reports(&lab).await;
            let holders: Vec<&Value> = reports
                .values()
                .filter_map(|r| r["status"].get("cache"))
                .collect();
            let served = holders.first().and_then(|c| c["servedBytes"].as_u64());
            (holders.len() == 1 && served.is_some_and(|s| s >= 3 * (unique - unique / 20)))
                .then_some(())
                .ok_or_else(|| format!("{holders:?}"))
        },
    )
    .await;
    // `status -o json` and `check` carry them on the holder's node, with what crossed the link.
    let status = lab.pinboard(&["status", "--set", "web", "-o", "json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    let caches: Vec<&Value> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.get("cache"))
        .collect();
    assert_eq!(caches.len(), 1, "{status}");
    let link = caches[0]["linkBytes"].as_u64().unwrap();
    assert!(
        link >= unique - unique / 20 && link <= moved,
        "the cache's bytes from upstream ({link}) are the link's ({moved}) for {unique} unique"
    );
    let check = lab.pinboard(&["check", "--set", "web"]);
    assert_eq!(check.code, 0, "{}", check.stderr);
    assert!(
        check.stdout.contains("holds the in-cluster cache (http://"),
        "{}",
        check.stdout
    );
    // The holder restarted (its DaemonSet starting it again) counts on from its figures, kept in its
    // cache directory: a figure taken across its restart stays true.
    let (holder, _) = lab.cache_holder().await;
    lab.stop_agent(&holder);
    lab.start_agent(&holder);
    wait_for("the restarted holder's figures", WAIT, || async {
        let reports = reports(&lab).await;
        let cache = &reports[&holder]["status"]["cache"];
        let now = cache["linkBytes"].as_u64().unwrap_or(0);
        (now >= link && cache["address"].is_string())
            .then_some(())
            .ok_or_else(|| format!("{cache}"))
    })
    .await;
    wait_hosts_back(&lab, &hosts_before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cache_refuses_anonymous_requests_and_serves_a_private_image_to_the_nodes() {
    let lab = cache_lab("agents-fanout-private", support::private::token_registry()).await;
    let images = push_images(&lab, "private/app", 9200, 2);
    let references = through_proxy(&lab, &images);
    let proxy = lab.lab.proxy_host();
    let auth = serde_json::json!({"auths": {&proxy: {"auth": support::private::encoded_login()}}});
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: registry-login\n  namespace: {}\n\
         type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{auth}'\n",
        support::agents::NAMESPACE
    );
    apply_yaml(&lab.admin, &secret).await;
    let before = lab.lab.proxy().bytes_down();
    let extra = "  pullSecrets:\n  - name: registry-login\n";
    apply_fan_out_set(&lab, "private", &references, extra).await;
    wait_pinned_through_cache(&lab, "private", &references).await;
    lab.lab.assert_moved_at_most(
        "a private image through the cache",
        before,
        unique_bytes(&images),
        1.05,
    );

    // A pod asking the cache for the private blob, without the token or with another, gets 401.
    let (_, address) = lab.cache_holder().await;
    let layer = &images[0].layers[1].digest;
    let url = format!("{address}/v2/private/app0/blobs/{layer}?ns={proxy}");
    let http = support::http::agent();
    assert_eq!(http.get(&url).call().unwrap().status(), 401);
    let wrong = http
        .get(&url)
        .header("x-pinboard-cache-token", "guessed")
        .call()
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let catalog = format!("{address}/v2/");
    assert_eq!(http.get(&catalog).call().unwrap().status(), 401);
    let token = cache_token(&lab).await;
    let served = http
        .get(&url)
        .header("x-pinboard-cache-token", &token)
        .call()
        .unwrap();
    assert_eq!(served.status(), 200, "the agents' token is served");
    // The token is never logged.
    for node in NODES {
        let log = std::fs::read_to_string(lab.lab.dir().join(format!("agent-{node}.log"))).unwrap();
        assert!(
            !log.contains(&token),
            "{node}'s agent logged the cache's token"
        );
        for secret in [
            support::private::PASSWORD.to_string(),
            support::private::encoded_login(),
        ] {
            assert!(
                !log.contains(&secret),
                "{node}'s agent logged a registry secret"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_caches_holder_killed_mid_rollout_every_node_still_ends_pinned() {
    let mut lab = cache_lab("agents-fanout-killed", RegistrySetup::default()).await;
    let images = push_images(&lab, "killed/app", 9300, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let hosts_before = hosts_files(&lab);
    let (holder, _) = lab.cache_holder().await;
    let before = apply_until_a_quarter_moved(&lab, &references, unique).await;
    // The holder dies; its DaemonSet would start it again, as here.
    lab.stop_agent(&holder);
    lab.start_agent(&holder);
    lab.lab.proxy().set_bandwidth(None);
    wait_set_pinned(&lab, "web").await;
    for node in NODES {
        lab.lab.node(node).assert_pinned(&references);
    }
    // The other nodes' relays wait for the restarted holder and resume their blobs from where they broke;
    // only the holder's own node, whose relay died with it, may go to the source meanwhile.
    lab.lab
        .assert_moved_at_most("the cache's holder killed mid-rollout", before, unique, 2.0);
    wait_hosts_back(&lab, &hosts_before).await;
}

/// With the DaemonSet's default heartbeat (30 s), a holder killed mid-rollout and started again at once
/// serves again within seconds, well inside the relays' 30 s hold: it takes the role as soon as it has read
/// its Node and its sets' watch has listed, not at its next heartbeat, and never serves before it knows the
/// sets (a 404 would send the runtimes to the source for whole blobs). Ten rollouts, the holder restarted
/// in each: no node's pulls go to the source through its relay (a 404 passed on would count as one, with
/// its reason), and in every rollout the link carries each blob about once.
#[tokio::test(flavor = "multi_thread")]
async fn the_caches_holder_restarted_at_the_default_heartbeat_serves_before_the_relays_give_up() {
    let mut lab = cache_lab_with(
        "agents-fanout-restarted",
        RegistrySetup::default(),
        &["--heartbeat-every=30s"],
    )
    .await;
    let http = support::http::agent();
    let mut previous: Vec<String> = Vec::new();
    for round in 0..RESTARTS {
        let images = push_images(&lab, &format!("restarted{round}/app"), 9700 + round * 10, 3);
        let references = through_proxy(&lab, &images);
        let unique = unique_bytes(&images);
        let (holder, address) = lab.cache_holder().await;
        let before = apply_until_a_quarter_moved(&lab, &references, unique).await;
        lab.stop_agent(&holder);
        let restarted = std::time::Instant::now();
        lab.start_agent(&holder);
        // Serving again: the cache answers (401 to a request without the token) at its address.
        let catalog = format!("{address}/v2/");
        let serving = wait_for(
            "the restarted holder serves",
            Duration::from_secs(30),
            || async {
                match http.get(&catalog).call() {
                    Ok(answer) if answer.status() == 401 => Ok(restarted.elapsed()),
                    Ok(answer) => Err(format!("answered {}", answer.status())),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        eprintln!("round {round}: the restarted holder served again {serving:?} after it started");
        assert!(
            serving < Duration::from_secs(10),
            "well inside the relays' 30 s hold: {serving:?}"
        );
        lab.lab.proxy().set_bandwidth(None);
        let reports = wait_set_pinned(&lab, "web").await;
        for node in NODES {
            lab.lab.node(node).assert_pinned(&references);
            let set = &reports[node]["status"]["sets"][0];
            assert!(
                set["fanOut"]["sourceReason"].is_null(),
                "round {round}, {node}: no pulls went to the source: {set}"
            );
        }
        lab.lab.assert_moved_at_most(
            &format!("round {round}: the cache's holder restarted at the default heartbeat"),
            before,
            unique,
            1.10,
        );
        // The last round's images, released since, go as the kubelet's image GC would take them: ten
        // rounds would not fit on the nodes.
        for node in NODES {
            for reference in &previous {
                lab.lab.node(node).collect_image(reference);
            }
        }
        previous = references;
    }
}

/// The cache gone for good mid-rollout (its only eligible agent killed): the nodes' relays wait for it,
/// then send their runtimes to the source; every node still ends pinned, and each report says how many of
/// its pulls went to the source and why.
#[tokio::test(flavor = "multi_thread")]
async fn the_cache_gone_for_good_sends_the_nodes_to_the_source_and_their_reports_say_so() {
    let nodes = NODES.iter().map(|n| NodeSpec::new(n, 256 * MI)).collect();
    let setup = AgentsSetup {
        agent_args: vec!["--insecure-registry={proxy}".to_string()],
        ..AgentsSetup::default()
    };
    let mut lab = AgentsLab::start_with("agents-fanout-gone", nodes, None, setup).await;
    // Only n1's agent may hold the cache.
    let cache_dir = format!("--cache-dir={}/cache-n1", lab.lab.dir().display());
    lab.stop_agent("n1");
    lab.start_agent_with("n1", &[&format!("--cache-port={CACHE_PORT}"), &cache_dir]);
    let (holder, _) = lab.cache_holder().await;
    assert_eq!(holder, "n1");
    let images = push_images(&lab, "gone/app", 9700, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let hosts_before = hosts_files(&lab);
    apply_until_a_quarter_moved(&lab, &references, unique).await;
    lab.stop_agent("n1");
    lab.lab.proxy().set_bandwidth(None);
    // n1's node gets its agent back, no longer eligible: no agent serves the cache from now on.
    lab.start_agent("n1");
    let reports = wait_set_pinned(&lab, "web").await;
    for node in NODES {
        lab.lab.node(node).assert_pinned(&references);
        let fan_out = &reports[node]["status"]["sets"][0]["fanOut"];
        let reason = fan_out["sourceReason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("pulls went to the source"),
            "{node}'s report says its pulls went to the source and why: {fan_out}"
        );
    }
    wait_hosts_back(&lab, &hosts_before).await;
}

/// CRI-O's registries.conf cannot send the cache's token; the relay does, so a node running the real
/// CRI-O pulls through the cache as containerd's do: its registries.conf.d drop-in names the relay, and the
/// registry never hears from CRI-O itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_crio_1_33_node_pulls_through_its_agents_relay_beside_the_containerd_nodes() {
    let mut lab = cache_lab("agents-fanout-crio", RegistrySetup::default()).await;
    let images = push_images(&lab, "crio/app", 9600, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    lab.add_host_node(NodeSpec::new("n4", 200 * MI).on(Runtime::Crio133), &[])
        .await;
    let before = lab.lab.proxy().bytes_down();
    let heads_from = lab.lab.proxy().request_heads().len();
    apply_fan_out_set(&lab, "web", &references, "").await;
    let reports = wait_set_pinned_on(&lab, "web", &["n1", "n2", "n3", "n4"]).await;
    let set = &reports["n4"]["status"]["sets"][0];
    assert!(
        set["fanOut"]["cache"]
            .as_str()
            .is_some_and(|c| c.ends_with(&format!(":{CACHE_PORT}"))),
        "n4 pulled through the cache: {set}"
    );
    lab.lab.node("n4").assert_pinned(&references);
    let from_runtimes: Vec<String> = lab.lab.proxy().request_heads()[heads_from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .filter(|h| h.contains("/blobs/") && !h.contains("user-agent: pinboard/"))
        .collect();
    assert!(
        from_runtimes.is_empty(),
        "every blob came through pinboard, none from a runtime straight from the source: {from_runtimes:?}"
    );
    lab.lab.assert_moved_at_most(
        "a CRI-O node beside three containerd nodes",
        before,
        unique,
        1.05,
    );
    let registries_dir = lab.lab.node("n4").crio().registries_dir.clone();
    wait_for(
        "the fan-out drop-in removed",
        Duration::from_secs(30),
        || async {
            let left: Vec<_> = std::fs::read_dir(&registries_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.contains("pinboard"))
                .collect();
            left.is_empty()
                .then_some(())
                .ok_or_else(|| format!("{left:?}"))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_that_resets_every_mebibyte_still_carries_each_blob_about_once() {
    let lab = cache_lab("agents-fanout-resets", RegistrySetup::default()).await;
    let images = push_images(&lab, "resets/app", 9400, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    lab.lab.proxy().reset_after(MI, None);
    let before = lab.lab.proxy().bytes_down();
    apply_fan_out_set(&lab, "web", &references, "").await;
    wait_pinned_through_cache(&lab, "web", &references).await;
    lab.lab
        .assert_moved_at_most("a link resetting every MiB", before, unique, 1.10);
}

/// The in-cluster cache under `--link-rate` on every eligible agent: what crosses the registry link keeps the
/// budget in each second of a rollout to every node, and the holder's report says the budget.
#[tokio::test(flavor = "multi_thread")]
async fn the_in_cluster_cache_keeps_the_link_budget_in_each_second() {
    const BUDGET: u64 = 2 * MI;
    let lab = cache_lab_with(
        "agents-fanout-budget",
        RegistrySetup::default(),
        &["--link-rate=2MiB/s"],
    )
    .await;
    lab.lab.proxy().set_bandwidth(Some(8 * MI));
    // About 15 MiB: 7.5 s at the budget.
    let images = push_images(&lab, "budget/app", 9600, 6);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let before = lab.lab.proxy().bytes_down();
    let sampler = LinkSampler::start(&lab.lab);
    apply_fan_out_set(&lab, "web", &references, "").await;
    wait_pinned_through_cache(&lab, "web", &references).await;
    let samples = sampler.stop();
    lab.lab
        .assert_moved_at_most("under a budget of 2 MiB/s", before, unique, 1.05);
    assert_kept_to(
        &samples,
        BUDGET,
        "the in-cluster cache on a link of 8 MiB/s",
    );
    // The holder reports at its heartbeat's pace.
    wait_for("the budget in the holder's report", WAIT, || async {
        let budgets: Vec<Value> = reports(&lab)
            .await
            .values()
            .filter_map(|r| r["status"].get("cache"))
            .map(|c| c["linkRate"].clone())
            .collect();
        (budgets == [Value::from(BUDGET)])
            .then_some(())
            .ok_or(format!("{budgets:?}"))
    })
    .await;
}

/// A serving cap on the cache's holder (`--serve-rate`): what it sends to the nodes, all of them together,
/// takes at least its bytes at the cap, and `check` says the cap.
#[tokio::test(flavor = "multi_thread")]
async fn the_caches_holder_sends_to_the_nodes_under_its_serving_cap() {
    const CAP: u64 = 4 * MI;
    let lab = cache_lab_with(
        "agents-fanout-serve-cap",
        RegistrySetup::default(),
        &["--serve-rate=4MiB/s"],
    )
    .await;
    // About 8.9 MiB to each of 3 nodes: 6.8 s at the cap; without it the nodes pinned in 3.0 s.
    let images = push_images(&lab, "served/app", 9700, 3);
    let references = through_proxy(&lab, &images);
    let unique = unique_bytes(&images);
    let started = Instant::now();
    apply_fan_out_set(&lab, "web", &references, "").await;
    wait_pinned_through_cache(&lab, "web", &references).await;
    let took = started.elapsed().as_secs_f64();
    // Every byte the holder served went before the nodes said pinned; it reports at its heartbeat's pace.
    let served = wait_for("the holder's served bytes in its report", WAIT, || async {
        let served: Vec<u64> = reports(&lab)
            .await
            .values()
            .filter_map(|r| r["status"]["cache"]["servedBytes"].as_u64())
            .collect();
        match served[..] {
            [bytes] if bytes >= 3 * (unique - unique / 20) => Ok(bytes),
            _ => Err(format!("{served:?}")),
        }
    })
    .await;
    let at_cap = served as f64 / CAP as f64;
    eprintln!(
        "the holder served {:.1} MiB under a cap of 4 MiB/s: pinned everywhere after {took:.1} s, {at_cap:.1} s \
         at the cap",
        served as f64 / MI as f64
    );
    assert!(
        took >= 0.95 * at_cap,
        "{served} bytes served in {took:.1} s: faster than the cap of 4 MiB/s allows"
    );
    let check = lab.pinboard(&["check", "--set", "web"]);
    assert_eq!(check.code, 0, "{}", check.stderr);
    assert!(
        check.stdout.contains("served to the nodes (cap 4 MiB/s)"),
        "{}",
        check.stdout
    );
}

/// Capacity, measured rather than asserted (`cargo test --test it capacity -- --ignored --nocapture`): the
/// cache's endpoint (`pinboard mirror` runs the same code as the holder) serving one cached 32 MiB blob to
/// 10, 25 and 50 clients at once; prints the throughput and the server's CPU time per GiB served.
#[test]
#[ignore = "a measurement: run on its own"]
fn capacity_of_the_caches_endpoint_with_many_clients_at_once() {
    let lab = support::Lab::with_nodes("agents-fanout-capacity", Vec::new());
    let spec = ImageSpec::gzip_layers(9500, &[32 * MI as usize]);
    let image = lab.push_image("capacity/app", &spec).expect("push");
    let log = lab.dir().join("mirror.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(["mirror", "--listen", "127.0.0.1:0", "--insecure-registry"])
        .arg(lab.proxy_host())
        .arg("--cache-dir")
        .arg(lab.dir().join("cache"))
        .arg("--image")
        .arg(image.reference(&lab.proxy_host()))
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("pinboard mirror starts");
    let started = std::time::Instant::now();
    let addr = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("at http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(
            started.elapsed() < WAIT,
            "pinboard mirror never served: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let layer = &image.layers[0];
    let url = format!(
        "http://{addr}/v2/capacity/app/blobs/{}?ns={}",
        layer.digest,
        lab.proxy_host()
    );
    let fetch = |url: &str| {
        let mut body = support::http::agent().get(url).call().unwrap().into_body();
        std::io::copy(&mut body.as_reader(), &mut std::io::sink()).unwrap()
    };
    assert_eq!(fetch(&url), layer.size, "the cache is warm");
    let cpu_seconds = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        ticks / 100.0
    };
    for clients in [10u64, 25, 50] {
        let cpu_before = cpu_seconds(child.id());
        let began = std::time::Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..clients {
                scope.spawn(|| assert_eq!(fetch(&url), layer.size));
            }
        });
        let seconds = began.elapsed().as_secs_f64();
        let cpu = cpu_seconds(child.id()) - cpu_before;
        let served = (clients * layer.size) as f64;
        eprintln!(
            "capacity: {clients} clients: {:.0} MiB in {seconds:.2} s = {:.0} MiB/s; server CPU {cpu:.2} s \
             ({:.0}% of one core, {:.2} CPU-s per GiB)",
            served / MI as f64,
            served / MI as f64 / seconds,
            100.0 * cpu / seconds,
            cpu / (served / (1u64 << 30) as f64)
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

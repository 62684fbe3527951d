//! Every behaviour that touches a runtime, on each runtime of the lab's matrix (containerd 1.6, 1.7 and 2.1,
//! and the real CRI-O 1.33; `support::runtime`), through the real `pinboard` binary, each step judged
//! by the runtime's own word (its CRI ListImages, and `ctr` on containerd) as well as pinboard's:
//! survey and plan, apply (pull and pin), check and status, unpin with holders, a restart of the runtime;
//! and the contract, as each runtime's own metrics count it: every call pinboard made was answered.
//! An image a pod pulled by tag is part of a set that names it by digest: on CRI-O, which matches
//! `pinned_images` against the names it stored, apply must make it pinnable.

use crate::support;

use pinboard::model::readiness::{PinnedBy, Readiness};
use support::{ImageSpec, Lab, Node, NodeSpec, Run, Runtime};

/// A lab whose one node, n1, runs `runtime`, with an image filesystem of 256 MiB; containerd serves its
/// metrics (CRI-O always does in the lab).
fn one_node(name: &str, runtime: Runtime) -> Lab {
    let metrics = format!("127.0.0.1:{}", support::free_port().unwrap());
    Lab::with_nodes(
        &format!("{name}-{runtime}"),
        vec![
            NodeSpec::new("n1", 256 << 20)
                .serving_metrics(&metrics)
                .on(runtime),
        ],
    )
}

/// The CRI calls pinboard makes on every runtime in this test's life of a set.
const CRI_CALLS: [&str; 6] = [
    "Version",
    "Status",
    "ListImages",
    "ImageStatus",
    "PullImage",
    "ImageFsInfo",
];
/// What it asks of containerd's own services besides: the pin labels, the blobs a node holds.
const CONTAINERD_CALLS: [&str; 4] = ["Images/List", "Images/Get", "Images/Update", "Content/List"];

/// The contract: `node`'s runtime answered every call pinboard made of it so far, none with an error (its
/// own metrics: containerd's gRPC counts, CRI-O's operation counts).
fn assert_contract(node: &Node) {
    if node.runtime.is_crio() {
        let operations = node.crio_operations();
        for call in CRI_CALLS {
            let (total, errors) = operations.get(call).copied().unwrap_or_default();
            assert!(
                total > 0.0 && errors == 0.0,
                "CRI-O: {call} {total} answered, {errors} failed: {operations:?}"
            );
        }
        return;
    }
    let service = |call: &str| match call {
        "Version" | "Status" => format!("RuntimeService/{call}"),
        _ => format!("ImageService/{call}"),
    };
    let calls: Vec<String> = CRI_CALLS
        .iter()
        .map(|c| service(c))
        .chain(CONTAINERD_CALLS.iter().map(|c| c.to_string()))
        .collect();
    let calls: Vec<&str> = calls.iter().map(String::as_str).collect();
    support::runtime::assert_answered(node.runtime, &calls, &node.grpc_calls());
}

/// `check -o json` for `set`: the exit code and the report.
fn check(lab: &Lab, set: &str) -> (i32, Readiness, Run) {
    let run = lab.pinboard("check", &["--set", set, "-o", "json"]);
    let readiness = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("check -o json ({e}): {}\n{}", run.stdout, run.stderr));
    (run.code, readiness, run)
}

crate::on_every_runtime! {
    /// The life of two sets on one node: `a` names an image a pod pulled by tag and one to pull; `b`
    /// shares the pulled one. apply pins, check agrees with the runtime, unpinning `a` keeps what `b`
    /// holds, and a restart of the runtime keeps `b` ready.
    fn a_set_pulled_pinned_checked_and_unpinned(runtime) {
        let mut lab = one_node("lifecycle", runtime);
        let node = lab.node("n1");
        eprintln!("n1 runs {}", node.runtime_version());
        let host = lab.registry_host();
        let tagged = lab
            .push_tagged("matrix/tagged", &ImageSpec::small(7101), "1.0")
            .unwrap();
        let pulled = lab.push_image("matrix/pulled", &ImageSpec::small(7102)).unwrap();
        let (tagged_ref, pulled_ref) = (tagged.reference(&host), pulled.reference(&host));
        // A pod's pull, by tag.
        node.pull(&format!("{host}/matrix/tagged:1.0")).unwrap();
        let set_a = lab.set_file("set-a", &[&tagged_ref, &pulled_ref]);
        let set_b = lab.set_file("set-b", &[&pulled_ref]);

        let plan = lab.pinboard("plan", &["--set", &set_a, "-o", "json"]);
        assert_eq!(plan.code, 0, "{}\n{}", plan.stdout, plan.stderr);

        let apply = lab.pinboard("apply", &["--set", &set_a]);
        assert_eq!(apply.code, 0, "{}\n{}", apply.stdout, apply.stderr);
        node.assert_pinned(&[&tagged_ref, &pulled_ref]);
        let (code, report, run) = check(&lab, &set_a);
        assert_eq!(code, 0, "{}\n{}", run.stdout, run.stderr);
        let wanted = match runtime.reports_pinned() {
            true => PinnedBy::Runtime,
            false => PinnedBy::Record,
        };
        assert_eq!(report.nodes[0].pinned_by, Some(wanted));

        let apply = lab.pinboard("apply", &["--set", &set_b]);
        assert_eq!(apply.code, 0, "{}\n{}", apply.stdout, apply.stderr);
        let unpin = lab.pinboard("unpin", &["--set", &set_a]);
        assert_eq!(unpin.code, 0, "{}\n{}", unpin.stdout, unpin.stderr);
        assert!(node.cri_image(&tagged_ref).is_some(), "unpin keeps the image");
        if runtime.reports_pinned() {
            node.wait_cri_pinned(&[(&tagged_ref, false), (&pulled_ref, true)]);
        }
        let (code, _, run) = check(&lab, &set_b);
        assert_eq!(code, 0, "{}\n{}", run.stdout, run.stderr);
        let (code, _, run) = check(&lab, &set_a);
        assert_eq!(code, 1, "{}\n{}", run.stdout, run.stderr);
        let status = lab.pinboard("status", &["--set", &set_b]);
        assert_eq!(status.code, 0, "{}\n{}", status.stdout, status.stderr);
        assert_contract(node);

        // A restart of the runtime keeps what the node records.
        lab.restart_node("n1").unwrap();
        let (code, _, run) = check(&lab, &set_b);
        assert_eq!(code, 0, "after a restart: {}\n{}", run.stdout, run.stderr);
    }
}

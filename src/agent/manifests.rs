//! `pinboard agent manifests`: what `kubectl apply -f -` installs, printed by the binary it runs, so the two
//! always match. Its source is the kustomize tree of `deploy/agent/`, applied here as kustomize applies it:
//! the base (namespace, CRDs, least-privilege RBAC), the DaemonSet of the runtime's overlay, and for each
//! option its overlay's objects and JSON patch (RFC 6902) of the DaemonSet; then what no overlay can know:
//! the namespace, image, node selector and extra arguments. The alert rules of `deploy/agent/alerts/` become a
//! PrometheusRule. An integration test builds each overlay with kubectl's kustomize and compares.

mod documents;

use clap::Args;
use serde_json::{Value, json};

use crate::model::pinboard_api::DEFAULT_NAMESPACE;
use crate::model::runtime::RuntimeKind;
use documents::Document;

/// A file of `deploy/agent/`: its path there (for messages) and its text.
type Source = (&'static str, &'static str);

macro_rules! source {
    ($path:literal) => {
        ($path, include_str!(concat!("../../deploy/agent/", $path)))
    };
}

const BASE: [Source; 3] = [
    source!("base/namespace.yaml"),
    source!("base/crds.yaml"),
    source!("base/rbac.yaml"),
];
const DAEMONSET_CONTAINERD: Source = source!("overlays/containerd/daemonset.yaml");
const DAEMONSET_CRIO: Source = source!("overlays/crio/daemonset.yaml");
const ALERT_RULES: Source = source!("alerts/rules.yaml");

/// What an overlay of `deploy/agent/overlays/` adds on top of its runtime's: objects, and a JSON patch of
/// the DaemonSet.
struct Overlay {
    resources: &'static [Source],
    patch: Option<Source>,
}

const NODE_CREDENTIALS: Overlay = Overlay {
    resources: &[],
    patch: Some(source!("overlays/node-credentials/daemonset-patch.yaml")),
};
const CACHE: Overlay = Overlay {
    resources: &[],
    patch: Some(source!("overlays/cache/daemonset-patch.yaml")),
};
const GATE: Overlay = Overlay {
    resources: &[source!("overlays/gate/rbac.yaml")],
    patch: Some(source!("overlays/gate/daemonset-patch.yaml")),
};
const METRICS: Overlay = Overlay {
    resources: &[source!("overlays/metrics/service.yaml")],
    patch: Some(source!("overlays/metrics/daemonset-patch.yaml")),
};
const SERVICE_MONITOR: Overlay = Overlay {
    resources: &[source!("overlays/service-monitor/service-monitor.yaml")],
    patch: None,
};

#[derive(Args, Debug)]
pub struct ManifestArgs {
    /// The agent's image: this binary, built by the Containerfile.
    #[arg(long, value_name = "REF", default_value_t = default_image())]
    pub image: String,
    /// The agents' namespace.
    #[arg(long, value_name = "NS", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The runtime of the nodes: the DaemonSet mounts what it needs. A cluster with both runs the command
    /// twice, each with --node-selector.
    #[arg(long, value_enum, default_value = "containerd")]
    pub runtime: RuntimeKind,
    /// Only nodes with this label (KEY=VALUE), e.g. for a cluster whose nodes run different runtimes.
    #[arg(long, value_name = "KEY=VALUE")]
    pub node_selector: Option<String>,
    /// Also mount the node's own registry credentials (the kubelet's /var/lib/kubelet/config.json,
    /// read-only), used after a set's pull Secrets. Only where every node has that file.
    #[arg(long)]
    pub node_credentials: bool,
    /// Makes the agents eligible for the in-cluster cache's role (`--cache-port=5050`), with a hostPath
    /// blob cache at /var/lib/pinboard/cache: sets with `spec.fanOut` then pull through it, the nodes
    /// serving each other what they took (`--peer-port=5051`, /var/lib/pinboard/peers).
    #[arg(long)]
    pub cache: bool,
    /// The gate for new nodes: each agent removes the startup taint pinboard.dev/preloading:NoSchedule from
    /// its Node once the sets selecting it are pinned there. Adds the ClusterRole pinboard-agent-gate, which
    /// lets the agents patch any Node (RBAC cannot narrow a patch to one taint).
    #[arg(long)]
    pub gate: bool,
    /// Prometheus metrics on each node's IP at port 9471 (`--metrics-port=9471`), a headless Service
    /// pinboard-agent-metrics and prometheus.io scrape annotations.
    #[arg(long)]
    pub metrics: bool,
    /// A ServiceMonitor (Prometheus Operator) for the metrics' Service. Implies --metrics.
    #[arg(long)]
    pub service_monitor: bool,
    /// A PrometheusRule (Prometheus Operator) with the alert rules of deploy/agent/alerts/rules.yaml.
    /// Implies --metrics.
    #[arg(long)]
    pub alerts: bool,
    /// One more argument for the agent (repeatable), e.g. `--agent-arg=--insecure-registry
    /// --agent-arg=registry.lab:5000` or `--agent-arg=--parallel=4`.
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
}

fn default_image() -> String {
    format!(
        "ghcr.io/pinboard-dev/pinboard:v{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// A `--node-selector` that is no label.
#[derive(Debug, thiserror::Error)]
#[error("--node-selector {0:?} is not KEY=VALUE with a label key and value")]
pub struct NodeSelectorError(String);

/// The manifests for `args`, as one multi-document YAML.
pub fn render(args: &ManifestArgs) -> Result<String, NodeSelectorError> {
    let node_selector = args
        .node_selector
        .as_deref()
        .map(|selector| {
            selector
                .split_once('=')
                .filter(|(k, v)| {
                    crate::model::labels::valid_key(k) && crate::model::labels::valid_value(v)
                })
                .ok_or_else(|| NodeSelectorError(selector.to_owned()))
        })
        .transpose()?;
    let mut documents: Vec<Document> = BASE.iter().flat_map(read).collect();
    let mut daemonset = match args.runtime {
        RuntimeKind::Containerd => read(&DAEMONSET_CONTAINERD),
        RuntimeKind::Crio => read(&DAEMONSET_CRIO),
    }
    .remove(0);
    let cache_port_given = args
        .agent_args
        .iter()
        .any(|a| a.starts_with("--cache-port"));
    let metrics = args.metrics || args.service_monitor || args.alerts;
    let mut resources = Vec::new();
    for (overlay, asked) in [
        (&NODE_CREDENTIALS, args.node_credentials),
        (&CACHE, args.cache || cache_port_given),
        (&GATE, args.gate),
        (&METRICS, metrics),
        (&SERVICE_MONITOR, args.service_monitor),
    ] {
        if !asked {
            continue;
        }
        resources.extend(overlay.resources.iter().flat_map(read));
        if let Some((file, text)) = overlay.patch {
            let patch: json_patch::Patch = serde_saphyr::from_str(text)
                .unwrap_or_else(|e| panic!("{file} is no JSON patch: {e}"));
            json_patch::patch(&mut daemonset.object, &patch)
                .unwrap_or_else(|e| panic!("{file} does not apply: {e}"));
        }
    }
    let pod = &mut daemonset.object["spec"]["template"]["spec"];
    if let Some((key, value)) = node_selector {
        pod["nodeSelector"] = json!({ key: value });
    }
    for container in pod["containers"].as_array_mut().into_iter().flatten() {
        container["image"] = json!(args.image);
        let container_args = container["args"].as_array_mut().expect("the agent's args");
        // The port given replaces the cache overlay's.
        if cache_port_given {
            container_args.retain(|a| !a.as_str().is_some_and(|a| a.starts_with("--cache-port")));
        }
        container_args.extend(args.agent_args.iter().map(|a| json!(a)));
    }
    documents.push(daemonset);
    documents.extend(resources);
    if args.alerts {
        documents.push(prometheus_rule());
    }
    for document in &mut documents {
        place(document, &args.namespace);
    }
    Ok(documents::write(&documents))
}

/// The documents of one file of `deploy/agent/`.
fn read((file, text): &Source) -> Vec<Document> {
    documents::read(file, text)
}

/// The alert rules, as the Prometheus Operator takes them: a PrometheusRule's spec is a rules file.
fn prometheus_rule() -> Document {
    let (file, text) = ALERT_RULES;
    let rules: Value =
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{file} is not valid YAML: {e}"));
    Document {
        comment: format!(
            "# The agents' alert rules: deploy/agent/{file} of pinboard's repository, whose docs/agents.md \
             says what each\n# means and what to do. A Prometheus that selects rules by label \
             (kube-prometheus-stack: `release`) needs it added.\n"
        ),
        object: json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": "pinboard-agent",
                "namespace": DEFAULT_NAMESPACE,
                "labels": {"app.kubernetes.io/name": "pinboard-agent"},
            },
            "spec": rules,
        }),
    }
}

/// Moves `document` from the default namespace to `namespace`: the Namespace itself, the objects in it and
/// the bindings' subjects there. Objects elsewhere (the Events' RoleBindings in `default` and `kube-system`)
/// stay.
fn place(document: &mut Document, namespace: &str) {
    let object = &mut document.object;
    if object["kind"] == "Namespace" {
        object["metadata"]["name"] = json!(namespace);
    }
    let move_here = |field: Option<&mut Value>| {
        if let Some(field) = field.filter(|f| *f == DEFAULT_NAMESPACE) {
            *field = json!(namespace);
        }
    };
    move_here(object.pointer_mut("/metadata/namespace"));
    for subject in object
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        move_here(subject.get_mut("namespace"));
    }
    document.comment = document.comment.replace(DEFAULT_NAMESPACE, namespace);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(runtime: RuntimeKind) -> ManifestArgs {
        ManifestArgs {
            image: "registry.lab:5000/pinboard@sha256:0".into(),
            namespace: "pins".into(),
            runtime,
            node_selector: None,
            node_credentials: false,
            cache: false,
            gate: false,
            metrics: false,
            service_monitor: false,
            alerts: false,
            agent_args: vec!["--insecure-registry".into(), "registry.lab:5000".into()],
        }
    }

    /// The objects `args` print, as kubectl reads them.
    fn objects(args: &ManifestArgs) -> Vec<Value> {
        serde_saphyr::from_multiple(&render(args).unwrap()).unwrap()
    }

    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn daemonset(objects: &[Value]) -> &Value {
        let mut daemonsets = objects.iter().filter(|o| o["kind"] == "DaemonSet");
        let daemonset = daemonsets.next().expect("a DaemonSet");
        assert!(daemonsets.next().is_none(), "one DaemonSet");
        daemonset
    }

    fn agent(objects: &[Value]) -> &Value {
        &daemonset(objects)["spec"]["template"]["spec"]["containers"][0]
    }

    fn agent_args(objects: &[Value]) -> Vec<&str> {
        let args = agent(objects)["args"].as_array().unwrap();
        args.iter().map(|a| a.as_str().unwrap()).collect()
    }

    fn host_paths(objects: &[Value]) -> Vec<&str> {
        let volumes = daemonset(objects)["spec"]["template"]["spec"]["volumes"].as_array();
        volumes
            .unwrap()
            .iter()
            .filter_map(|v| v["hostPath"]["path"].as_str())
            .collect()
    }

    /// Whether a rule of a role bound to the agents' ServiceAccount (in `namespace`) allows `verb` on
    /// `resource` of `group`.
    fn agents_may(
        objects: &[Value],
        namespace: &str,
        verb: &str,
        group: &str,
        resource: &str,
    ) -> bool {
        let bound_roles = objects.iter().filter(|b| {
            b["kind"].as_str().is_some_and(|k| k.ends_with("Binding"))
                && b["subjects"].as_array().unwrap().iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == "pinboard-agent"
                        && s["namespace"] == namespace
                })
        });
        let has = |list: &Value, item: &str| list.as_array().unwrap().iter().any(|i| i == item);
        bound_roles
            .map(|b| {
                find(
                    objects,
                    b["roleRef"]["kind"].as_str().unwrap(),
                    b["roleRef"]["name"].as_str().unwrap(),
                )
                .unwrap()
            })
            .flat_map(|role| role["rules"].as_array().unwrap())
            .any(|r| {
                has(&r["apiGroups"], group)
                    && has(&r["resources"], resource)
                    && has(&r["verbs"], verb)
            })
    }

    #[test]
    fn the_manifests_name_the_image_and_namespace_and_mount_only_what_the_runtime_needs() {
        let containerd = objects(&args(RuntimeKind::Containerd));
        assert_eq!(
            daemonset(&containerd)["metadata"]["name"],
            "pinboard-agent-containerd"
        );
        assert_eq!(
            agent(&containerd)["image"],
            "registry.lab:5000/pinboard@sha256:0"
        );
        assert!(find(&containerd, "Namespace", "pins").is_some());
        for object in &containerd {
            let namespace = &object["metadata"]["namespace"];
            assert!(
                namespace.is_null()
                    || namespace == "pins"
                    || object["metadata"]["name"] == "pinboard-agent-events",
                "{} {} in {namespace}",
                object["kind"],
                object["metadata"]["name"]
            );
        }
        assert_eq!(
            host_paths(&containerd),
            [
                "/run/containerd",
                "/etc/containerd/certs.d",
                "/var/lib/containerd"
            ]
        );
        let pod = |o| &daemonset(o)["spec"]["template"]["spec"];
        assert!(
            pod(&containerd)["hostPID"].is_null(),
            "containerd needs no host PID namespace"
        );
        let crio = objects(&args(RuntimeKind::Crio));
        assert_eq!(daemonset(&crio)["metadata"]["name"], "pinboard-agent-crio");
        assert_eq!(pod(&crio)["hostPID"], true, "CRI-O is signalled to reload");
        assert!(host_paths(&crio).contains(&"/var/run/crio"));
        assert!(!host_paths(&crio).contains(&"/run/containerd"));
        for objects in [&containerd, &crio] {
            let security = &agent(objects)["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true);
            assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
            assert_eq!(
                pod(objects)["tolerations"],
                json!([{"operator": "Exists"}]),
                "tolerates every taint"
            );
            assert_eq!(
                agent_args(objects)[agent_args(objects).len() - 2..],
                ["--insecure-registry", "registry.lab:5000"],
                "the agent's extra arguments come last"
            );
            assert!(
                !host_paths(objects).contains(&"/var/lib/kubelet/config.json"),
                "no node credentials unless asked"
            );
        }
    }

    #[test]
    fn another_namespace_moves_every_object_and_binding_there_but_the_events_bindings() {
        let mut asked = args(RuntimeKind::Containerd);
        (asked.gate, asked.service_monitor, asked.alerts) = (true, true, true);
        let yaml = render(&asked).unwrap();
        assert!(
            !yaml.contains("pinboard-system"),
            "no object, binding or comment left behind"
        );
        let objects = objects(&asked);
        let events: Vec<(&Value, &Value)> = objects
            .iter()
            .filter(|o| {
                o["kind"] == "RoleBinding" && o["metadata"]["name"] == "pinboard-agent-events"
            })
            .map(|b| (&b["metadata"]["namespace"], &b["subjects"][0]["namespace"]))
            .collect();
        assert_eq!(
            events,
            [
                (&json!("default"), &json!("pins")),
                (&json!("kube-system"), &json!("pins"))
            ]
        );
    }

    #[test]
    fn a_node_selector_and_the_nodes_credentials_are_added_when_asked() {
        let mut asked = args(RuntimeKind::Containerd);
        asked.node_selector = Some("pinboard.dev/runtime=containerd".into());
        asked.node_credentials = true;
        let objects = objects(&asked);
        assert_eq!(
            daemonset(&objects)["spec"]["template"]["spec"]["nodeSelector"],
            json!({"pinboard.dev/runtime": "containerd"})
        );
        assert!(
            agent_args(&objects)
                .windows(2)
                .any(|w| w == ["--node-credentials", "/var/lib/kubelet/config.json"])
        );
        assert!(
            agent(&objects)["volumeMounts"]
                .as_array()
                .unwrap()
                .contains(&json!({"name": "node-credentials", "mountPath": "/var/lib/kubelet/config.json", "readOnly": true}))
        );
        assert!(host_paths(&objects).contains(&"/var/lib/kubelet/config.json"));
        assert!(
            !host_paths(&objects).contains(&"/var/lib/pinboard/cache"),
            "no cache unless asked"
        );
        asked.node_selector = Some("no value".into());
        assert!(
            render(&asked)
                .unwrap_err()
                .to_string()
                .contains("KEY=VALUE")
        );
    }

    #[test]
    fn the_cache_gets_its_port_and_blob_directory_and_a_port_given_replaces_the_default() {
        let mut asked = args(RuntimeKind::Crio);
        asked.cache = true;
        let objects = objects(&asked);
        assert!(agent_args(&objects).contains(&"--cache-port=5050"));
        assert!(agent_args(&objects).contains(&"--peer-port=5051"));
        assert!(host_paths(&objects).contains(&"/var/lib/pinboard/cache"));
        assert!(host_paths(&objects).contains(&"/var/lib/pinboard/peers"));
        asked.cache = false;
        asked.agent_args = vec!["--cache-port=6000".into()];
        let objects = super::tests::objects(&asked);
        let ports: Vec<_> = agent_args(&objects)
            .into_iter()
            .filter(|a| a.starts_with("--cache-port"))
            .collect();
        assert_eq!(ports, ["--cache-port=6000"]);
        assert!(host_paths(&objects).contains(&"/var/lib/pinboard/cache"));
    }

    #[test]
    fn the_agents_may_always_record_events_where_cluster_scoped_objects_have_them_only() {
        let objects = objects(&args(RuntimeKind::Containerd));
        assert_eq!(
            find(&objects, "ClusterRole", "pinboard-agent-events").unwrap()["rules"],
            json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}])
        );
        let bindings: Vec<(&Value, &Value)> = objects
            .iter()
            .filter(|b| b["roleRef"]["name"] == "pinboard-agent-events")
            .map(|b| (&b["kind"], &b["metadata"]["namespace"]))
            .collect();
        assert_eq!(
            bindings,
            [
                (&json!("RoleBinding"), &json!("default")),
                (&json!("RoleBinding"), &json!("kube-system"))
            ],
            "bound in those two namespaces, never cluster-wide"
        );
        let mention_events = objects
            .iter()
            .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Role")))
            .filter(|r| {
                r["rules"].as_array().unwrap().iter().any(|r| {
                    r["resources"]
                        .as_array()
                        .unwrap()
                        .contains(&json!("events"))
                })
            })
            .count();
        assert_eq!(mention_events, 1, "no other role grants Events");
    }

    #[test]
    fn the_gate_adds_its_argument_and_the_right_to_patch_nodes_only_when_asked() {
        let mut asked = args(RuntimeKind::Containerd);
        let without = objects(&asked);
        assert!(!agent_args(&without).contains(&"--gate"));
        assert!(!agents_may(&without, "pins", "patch", "", "nodes"));
        asked.gate = true;
        let with = objects(&asked);
        assert!(agent_args(&with).contains(&"--gate"));
        assert_eq!(
            find(&with, "ClusterRole", "pinboard-agent-gate").unwrap()["rules"],
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])
        );
        assert!(agents_may(&with, "pins", "patch", "", "nodes"));
        assert_eq!(
            daemonset(&with)["spec"]["template"]["spec"]["tolerations"],
            json!([{"operator": "Exists"}]),
            "the agent runs on a node still tainted"
        );
    }

    #[test]
    fn metrics_are_served_on_a_named_port_a_headless_service_selects() {
        let mut asked = args(RuntimeKind::Crio);
        let without = objects(&asked);
        assert!(
            !agent_args(&without)
                .iter()
                .any(|a| a.starts_with("--metrics-port"))
        );
        assert!(agent(&without)["ports"].is_null());
        assert!(!without.iter().any(|o| o["kind"] == "Service"));
        asked.metrics = true;
        let with = objects(&asked);
        assert!(agent_args(&with).contains(&"--metrics-port=9471"));
        assert_eq!(
            agent(&with)["ports"],
            json!([{"name": "metrics", "containerPort": 9471, "protocol": "TCP"}])
        );
        let template = &daemonset(&with)["spec"]["template"];
        assert_eq!(
            template["metadata"]["annotations"]["prometheus.io/scrape"],
            "true"
        );
        assert_eq!(
            template["metadata"]["annotations"]["prometheus.io/port"],
            "9471"
        );
        let service = find(&with, "Service", "pinboard-agent-metrics").unwrap();
        assert_eq!(service["metadata"]["namespace"], "pins");
        assert_eq!(
            service["spec"]["clusterIP"], "None",
            "headless: one endpoint per agent"
        );
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
        for (key, value) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(
                &template["metadata"]["labels"][key], value,
                "selects the agents' pods"
            );
        }
    }

    #[test]
    fn a_service_monitor_implies_the_metrics_and_selects_their_service() {
        let mut asked = args(RuntimeKind::Containerd);
        asked.service_monitor = true;
        let objects = objects(&asked);
        assert!(agent_args(&objects).contains(&"--metrics-port=9471"));
        let service = find(&objects, "Service", "pinboard-agent-metrics").unwrap();
        let monitor = find(&objects, "ServiceMonitor", "pinboard-agent").unwrap();
        assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(
            monitor["metadata"]["namespace"], "pins",
            "beside its Service"
        );
        for (key, value) in monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(&service["metadata"]["labels"][key], value);
        }
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    }

    #[test]
    fn the_alerts_are_the_rules_file_whole_as_a_prometheus_rule() {
        let mut asked = args(RuntimeKind::Containerd);
        assert!(
            !objects(&asked)
                .iter()
                .any(|o| o["kind"] == "PrometheusRule")
        );
        asked.alerts = true;
        let objects = objects(&asked);
        assert!(
            agent_args(&objects).contains(&"--metrics-port=9471"),
            "alerts need metrics"
        );
        let rule = find(&objects, "PrometheusRule", "pinboard-agent").unwrap();
        assert_eq!(rule["metadata"]["namespace"], "pins");
        let file: Value = serde_saphyr::from_str(ALERT_RULES.1).unwrap();
        assert_eq!(rule["spec"], file, "the rules file, whole");
    }
}

//! The agents' DaemonSets (label `app.kubernetes.io/name=pinboard-agent` in the agents' namespace: one per
//! runtime, containerd and CRI-O) and on which nodes each should run its pod, decided as the DaemonSet
//! controller decides it: the pod template's `nodeSelector`, its required node affinity
//! (`nodeSelectorTerms` ORed, each term's requirements ANDed, `matchExpressions` on labels and
//! `matchFields` on `metadata.name`), and its tolerations, with the ones the controller adds to every
//! daemon pod, against the node's `NoSchedule` and `NoExecute` taints. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::labels::{valid_key, valid_value};
use super::machine_config::{ClusterNode, NodeTaint};

/// The label every agents' DaemonSet carries, as a label selector.
pub const AGENTS_DAEMONSET_LABEL: &str = "app.kubernetes.io/name=pinboard-agent";

/// The tolerations the DaemonSet controller adds to every daemon pod (key, effect), whatever its template
/// says: a node's conditions never keep its daemons away.
const DAEMON_TOLERATIONS: [(&str, &str); 6] = [
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
/// Added too when the pods use the host's network (the agents' do).
const HOST_NETWORK_TOLERATION: (&str, &str) =
    ("node.kubernetes.io/network-unavailable", "NoSchedule");

/// What pinboard reads of one agents' DaemonSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentDaemonSet {
    pub name: String,
    pub namespace: String,
    /// `spec.selector`: its pods' labels.
    pub selector: LabelSelector,
    /// The pod template's `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The pod template's required node affinity, its terms; None when it has none.
    pub required_affinity: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
    pub host_network: bool,
}

impl From<&DaemonSet> for AgentDaemonSet {
    fn from(daemonset: &DaemonSet) -> AgentDaemonSet {
        let spec = &daemonset.spec;
        let pod = spec.template.spec.as_ref();
        AgentDaemonSet {
            name: daemonset.metadata.name.clone().unwrap_or_default(),
            namespace: daemonset.metadata.namespace.clone().unwrap_or_default(),
            selector: spec.selector.clone(),
            node_selector: pod
                .and_then(|p| p.node_selector.clone())
                .unwrap_or_default(),
            required_affinity: pod
                .and_then(|p| p.affinity.as_ref()?.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|required| required.node_selector_terms.clone()),
            tolerations: pod.and_then(|p| p.tolerations.clone()).unwrap_or_default(),
            host_network: pod.and_then(|p| p.host_network).unwrap_or(false),
        }
    }
}

/// The agents' DaemonSets as listed in their namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentDaemonSets {
    /// The agents' namespace, where they were looked for.
    pub namespace: String,
    pub listed: Vec<AgentDaemonSet>,
}

/// What the agents' DaemonSets say of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Placement<'a> {
    /// This DaemonSet (the first, by name, of those that would) should run its pod there.
    DaemonSet(&'a AgentDaemonSet),
    /// Every one leaves it out: `NAME: why` for each, `; `-separated.
    Excluded(String),
    /// There is none: nothing says where agents should run.
    NoDaemonSet,
}

impl AgentDaemonSets {
    /// Where `node` stands with the agents' DaemonSets.
    pub fn placement(&self, node: &ClusterNode) -> Placement<'_> {
        if self.listed.is_empty() {
            return Placement::NoDaemonSet;
        }
        let mut why = Vec::new();
        for daemonset in &self.listed {
            match daemonset.excludes(node) {
                None => return Placement::DaemonSet(daemonset),
                Some(reason) => why.push(format!("{}: {reason}", daemonset.name)),
            }
        }
        Placement::Excluded(why.join("; "))
    }
}

impl AgentDaemonSet {
    /// Why the DaemonSet controller would not run this DaemonSet's pod on `node`, in a few words
    /// (`nodeSelector pinboard.dev/agent-pod=true`); None when it would.
    pub fn excludes(&self, node: &ClusterNode) -> Option<String> {
        let selected = self
            .node_selector
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value));
        if !selected {
            let pairs: Vec<String> = self
                .node_selector
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            return Some(format!("nodeSelector {}", pairs.join(",")));
        }
        if let Some(terms) = &self.required_affinity
            && !terms.iter().any(|term| term_matches(term, node))
        {
            return Some(format!("required node affinity {}", terms_words(terms)));
        }
        node.taints
            .iter()
            .filter(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute"))
            .find(|taint| !self.tolerates(taint))
            .map(|taint| format!("taint {} not tolerated", taint_words(taint)))
    }

    /// Whether the daemon pod tolerates `taint`: by its template's tolerations or the controller's own.
    fn tolerates(&self, taint: &NodeTaint) -> bool {
        let mut added = DAEMON_TOLERATIONS
            .iter()
            .chain(self.host_network.then_some(&HOST_NETWORK_TOLERATION));
        added.any(|&(key, effect)| taint.key == key && taint.effect == effect)
            || self.tolerations.iter().any(|t| tolerates(t, taint))
    }
}

/// Whether one toleration tolerates `taint`, as Kubernetes matches them: an empty effect or key matches
/// any; `Exists` any value, `Equal` (or no operator) the same value.
fn tolerates(toleration: &Toleration, taint: &NodeTaint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    let key = toleration.key.as_deref().unwrap_or_default();
    if (!effect.is_empty() && effect != taint.effect) || (!key.is_empty() && key != taint.key) {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => toleration.value.as_deref().unwrap_or_default() == taint.value,
        "Exists" => true,
        _ => false,
    }
}

/// Whether `node` satisfies every requirement of `term`; a term without any, or with one Kubernetes would
/// refuse, matches no node.
fn term_matches(term: &NodeSelectorTerm, node: &ClusterNode) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions.iter().all(|r| label_matches(r, &node.labels))
        && fields.iter().all(|r| field_matches(r, &node.name))
}

/// One `matchExpressions` requirement on a node's labels: `In` and `NotIn` take values, `Exists` and
/// `DoesNotExist` none, `Gt` and `Lt` one integer compared with the label's.
fn label_matches(requirement: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    if !valid_key(&requirement.key) {
        return false;
    }
    let label = labels.get(&requirement.key);
    let listed = || label.is_some_and(|l| values.contains(l));
    let valid_values = !values.is_empty() && values.iter().all(|v| valid_value(v));
    match requirement.operator.as_str() {
        "In" if valid_values => listed(),
        "NotIn" if valid_values => !listed(),
        "Exists" if values.is_empty() => label.is_some(),
        "DoesNotExist" if values.is_empty() => label.is_none(),
        operator @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return false;
            };
            match (bound.parse::<i64>(), label.map(|l| l.parse::<i64>())) {
                (Ok(bound), Some(Ok(value))) if operator == "Gt" => value > bound,
                (Ok(bound), Some(Ok(value))) => value < bound,
                _ => false,
            }
        }
        _ => false,
    }
}

/// One `matchFields` requirement: `metadata.name` is the only field, `In` or `NotIn` one value.
fn field_matches(requirement: &NodeSelectorRequirement, name: &str) -> bool {
    let [value] = requirement.values.as_deref().unwrap_or_default() else {
        return false;
    };
    let field = (requirement.key == "metadata.name").then_some(name);
    match requirement.operator.as_str() {
        "In" => field == Some(value.as_str()),
        "NotIn" => field != Some(value.as_str()),
        _ => false,
    }
}

/// Terms as `kubectl -l` would write each, ` or `-separated: `zone in (a,b),!gpu or metadata.name in (n1)`.
fn terms_words(terms: &[NodeSelectorTerm]) -> String {
    if terms.is_empty() {
        return "without terms (no node)".into();
    }
    let term = |term: &NodeSelectorTerm| {
        let requirements = term.match_expressions.iter().chain(&term.match_fields);
        let words: Vec<String> = requirements.flatten().map(requirement_words).collect();
        match words.is_empty() {
            true => "an empty term (no node)".to_string(),
            false => words.join(","),
        }
    };
    terms.iter().map(term).collect::<Vec<_>>().join(" or ")
}

fn requirement_words(requirement: &NodeSelectorRequirement) -> String {
    let key = &requirement.key;
    let values = requirement.values.as_deref().unwrap_or_default().join(",");
    match requirement.operator.as_str() {
        "In" => format!("{key} in ({values})"),
        "NotIn" => format!("{key} notin ({values})"),
        "Exists" => key.clone(),
        "DoesNotExist" => format!("!{key}"),
        "Gt" => format!("{key}>{values}"),
        "Lt" => format!("{key}<{values}"),
        other => format!("{key} {other} ({values})"),
    }
}

/// `dedicated=gpu:NoSchedule`, `node-role.kubernetes.io/control-plane:NoSchedule`.
fn taint_words(taint: &NodeTaint) -> String {
    match taint.value.is_empty() {
        true => format!("{}:{}", taint.key, taint.effect),
        false => format!("{}={}:{}", taint.key, taint.value, taint.effect),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str, &str)]) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints: taints
                .iter()
                .map(|(key, value, effect)| NodeTaint {
                    key: key.to_string(),
                    value: value.to_string(),
                    effect: effect.to_string(),
                })
                .collect(),
            ..ClusterNode::default()
        }
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn term(
        expressions: Vec<NodeSelectorRequirement>,
        fields: Vec<NodeSelectorRequirement>,
    ) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(expressions),
            match_fields: Some(fields),
        }
    }

    fn with_affinity(terms: Vec<NodeSelectorTerm>) -> AgentDaemonSet {
        AgentDaemonSet {
            name: "pinboard-agent-containerd".into(),
            required_affinity: Some(terms),
            ..AgentDaemonSet::default()
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Toleration {
            key: some(key),
            operator: some(operator),
            value: some(value),
            effect: some(effect),
            toleration_seconds: None,
        }
    }

    #[test]
    fn the_node_selector_must_match_every_label_and_names_itself_when_it_does_not() {
        let daemonset = AgentDaemonSet {
            node_selector: [("pinboard.dev/agent-pod".to_string(), "true".to_string())].into(),
            ..AgentDaemonSet::default()
        };
        assert_eq!(
            daemonset.excludes(&node("n1", &[("pinboard.dev/agent-pod", "true")], &[])),
            None
        );
        assert_eq!(
            daemonset.excludes(&node("n2", &[("pinboard.dev/agent-pod", "false")], &[])),
            Some("nodeSelector pinboard.dev/agent-pod=true".into())
        );
        assert!(daemonset.excludes(&node("n3", &[], &[])).is_some());
        assert_eq!(
            AgentDaemonSet::default().excludes(&node("n4", &[], &[])),
            None
        );
    }

    #[test]
    fn match_expressions_in_not_in_exists_does_not_exist_gt_and_lt() {
        let labels = [("zone", "a"), ("cores", "8"), ("gpu", "")];
        let n = node("n1", &labels, &[]);
        let matches = |r: NodeSelectorRequirement| {
            with_affinity(vec![term(vec![r], vec![])])
                .excludes(&n)
                .is_none()
        };
        assert!(matches(requirement("zone", "In", &["a", "b"])));
        assert!(!matches(requirement("zone", "In", &["b"])));
        assert!(
            !matches(requirement("rack", "In", &["a"])),
            "no label, not in"
        );
        assert!(matches(requirement("zone", "NotIn", &["b"])));
        assert!(!matches(requirement("zone", "NotIn", &["a"])));
        assert!(
            matches(requirement("rack", "NotIn", &["a"])),
            "no label, not in"
        );
        assert!(
            matches(requirement("gpu", "Exists", &[])),
            "an empty value exists"
        );
        assert!(!matches(requirement("rack", "Exists", &[])));
        assert!(matches(requirement("rack", "DoesNotExist", &[])));
        assert!(!matches(requirement("zone", "DoesNotExist", &[])));
        assert!(matches(requirement("cores", "Gt", &["4"])));
        assert!(!matches(requirement("cores", "Gt", &["8"])));
        assert!(matches(requirement("cores", "Lt", &["16"])));
        assert!(!matches(requirement("cores", "Lt", &["8"])));
        assert!(!matches(requirement("zone", "Gt", &["1"])), "not a number");
        assert!(!matches(requirement("rack", "Lt", &["1"])), "no label");
        // What the API server refuses matches nothing: In without values, Exists with one, Gt with two,
        // an unknown operator, a bad key.
        assert!(!matches(requirement("rack", "NotIn", &[])));
        assert!(!matches(requirement("zone", "Exists", &["a"])));
        assert!(!matches(requirement("cores", "Gt", &["1", "2"])));
        assert!(!matches(requirement("zone", "Matches", &["a"])));
        assert!(!matches(requirement("bad key!", "DoesNotExist", &[])));
    }

    #[test]
    fn match_fields_select_by_node_name() {
        let n1 = node("n1", &[], &[]);
        let by_name = |operator: &str, values: &[&str]| {
            with_affinity(vec![term(
                vec![],
                vec![requirement("metadata.name", operator, values)],
            )])
        };
        assert_eq!(by_name("In", &["n1"]).excludes(&n1), None);
        assert!(by_name("In", &["n2"]).excludes(&n1).is_some());
        assert_eq!(by_name("NotIn", &["n2"]).excludes(&n1), None);
        assert!(by_name("NotIn", &["n1"]).excludes(&n1).is_some());
        assert!(
            by_name("In", &["n1", "n2"]).excludes(&n1).is_some(),
            "a field takes exactly one value"
        );
        assert!(by_name("Exists", &[]).excludes(&n1).is_some());
    }

    #[test]
    fn terms_are_ored_and_each_terms_requirements_anded() {
        let zone_a = requirement("zone", "In", &["a"]);
        let big = requirement("cores", "Gt", &["4"]);
        let n2 = requirement("metadata.name", "In", &["n2"]);
        let daemonset = with_affinity(vec![
            term(vec![zone_a.clone(), big.clone()], vec![]),
            term(vec![], vec![n2]),
        ]);
        let (small_a, big_a) = (
            node("n1", &[("zone", "a"), ("cores", "2")], &[]),
            node("n3", &[("zone", "a"), ("cores", "8")], &[]),
        );
        assert_eq!(daemonset.excludes(&big_a), None, "the first term");
        assert_eq!(
            daemonset.excludes(&node("n2", &[], &[])),
            None,
            "the second term"
        );
        assert_eq!(
            daemonset.excludes(&small_a),
            Some("required node affinity zone in (a),cores>4 or metadata.name in (n2)".into()),
            "neither: both terms named"
        );
        // No term, or an empty one, selects nothing; an absent affinity everything.
        assert!(with_affinity(Vec::new()).excludes(&big_a).is_some());
        assert!(
            with_affinity(vec![NodeSelectorTerm::default()])
                .excludes(&big_a)
                .is_some()
        );
    }

    #[test]
    fn untolerated_no_schedule_and_no_execute_taints_exclude_but_prefer_no_schedule_does_not() {
        let plain = AgentDaemonSet {
            name: "pinboard-agent-containerd".into(),
            ..AgentDaemonSet::default()
        };
        let gpu = |effect: &str| node("n1", &[], &[("dedicated", "gpu", effect)]);
        assert_eq!(
            plain.excludes(&gpu("NoSchedule")),
            Some("taint dedicated=gpu:NoSchedule not tolerated".into())
        );
        assert!(plain.excludes(&gpu("NoExecute")).is_some());
        assert_eq!(plain.excludes(&gpu("PreferNoSchedule")), None);
        let tolerating = |t: Toleration| AgentDaemonSet {
            tolerations: vec![t],
            ..plain.clone()
        };
        // The shipped DaemonSets: `operator: Exists` alone tolerates every taint.
        assert_eq!(
            tolerating(toleration("", "Exists", "", "")).excludes(&gpu("NoExecute")),
            None
        );
        assert_eq!(
            tolerating(toleration("dedicated", "Equal", "gpu", "NoSchedule"))
                .excludes(&gpu("NoSchedule")),
            None
        );
        assert_eq!(
            tolerating(toleration("dedicated", "", "gpu", "")).excludes(&gpu("NoExecute")),
            None,
            "no operator is Equal, no effect any effect"
        );
        assert!(
            tolerating(toleration("dedicated", "Equal", "db", "NoSchedule"))
                .excludes(&gpu("NoSchedule"))
                .is_some(),
            "another value"
        );
        assert!(
            tolerating(toleration("dedicated", "Exists", "", "NoSchedule"))
                .excludes(&gpu("NoExecute"))
                .is_some(),
            "another effect"
        );
        assert!(
            tolerating(toleration("other", "Exists", "", ""))
                .excludes(&gpu("NoSchedule"))
                .is_some(),
            "another key"
        );
        // What the controller adds to every daemon pod: a cordoned or not-ready node keeps its daemons;
        // network-unavailable only for pods on the host's network.
        let cordoned = node(
            "n2",
            &[],
            &[
                ("node.kubernetes.io/unschedulable", "", "NoSchedule"),
                ("node.kubernetes.io/not-ready", "", "NoExecute"),
            ],
        );
        assert_eq!(plain.excludes(&cordoned), None);
        let no_network = node(
            "n3",
            &[],
            &[("node.kubernetes.io/network-unavailable", "", "NoSchedule")],
        );
        assert!(plain.excludes(&no_network).is_some());
        let host_network = AgentDaemonSet {
            host_network: true,
            ..plain.clone()
        };
        assert_eq!(host_network.excludes(&no_network), None);
    }

    #[test]
    fn a_node_is_placed_by_the_first_daemonset_that_would_run_there_or_excluded_by_all_with_why() {
        let runtime = |name: &str, value: &str| AgentDaemonSet {
            name: name.into(),
            node_selector: [("pinboard.dev/runtime".to_string(), value.to_string())].into(),
            ..AgentDaemonSet::default()
        };
        let daemonsets = AgentDaemonSets {
            namespace: "pinboard-system".into(),
            listed: vec![
                runtime("pinboard-agent-containerd", "containerd"),
                runtime("pinboard-agent-crio", "crio"),
            ],
        };
        let crio = node("n1", &[("pinboard.dev/runtime", "crio")], &[]);
        assert!(matches!(
            daemonsets.placement(&crio),
            Placement::DaemonSet(d) if d.name == "pinboard-agent-crio"
        ));
        assert_eq!(
            daemonsets.placement(&node("n2", &[], &[])),
            Placement::Excluded(
                "pinboard-agent-containerd: nodeSelector pinboard.dev/runtime=containerd; \
                 pinboard-agent-crio: nodeSelector pinboard.dev/runtime=crio"
                    .into()
            )
        );
        assert_eq!(
            AgentDaemonSets::default().placement(&crio),
            Placement::NoDaemonSet
        );
    }

    #[test]
    fn a_daemonset_is_read_from_its_pod_template() {
        let daemonset: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pinboard-agent-crio", "namespace": "pins"},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "pinboard-agent"}},
                "template": {"spec": {
                    "hostNetwork": true,
                    "nodeSelector": {"pinboard.dev/runtime": "crio"},
                    "tolerations": [{"operator": "Exists"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["a"]}
                        ]}]
                    }}},
                    "containers": [{"name": "agent"}],
                }},
            },
        }))
        .unwrap();
        let read = AgentDaemonSet::from(&daemonset);
        assert_eq!(
            (read.name.as_str(), read.namespace.as_str()),
            ("pinboard-agent-crio", "pins")
        );
        assert!(read.host_network);
        assert_eq!(read.node_selector["pinboard.dev/runtime"], "crio");
        assert_eq!(read.tolerations.len(), 1);
        assert_eq!(read.required_affinity.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            read.selector.match_labels.unwrap()["app.kubernetes.io/name"],
            "pinboard-agent"
        );
    }
}

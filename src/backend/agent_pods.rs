//! The agents' DaemonSet pods on nodes whose agent does not report, looked up when a command judges them
//! (not watched: a few nodes lack an agent, and a watch of every agent pod on 5,000 nodes is not worth
//! that). For each node, its DaemonSet's pods there (`spec.nodeName=NODE`); for each DaemonSet once, its
//! pods the scheduler has not placed (`spec.nodeName=`), each matched to the node it was made for.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::core::Selector;

use crate::model::agent_daemonsets::AgentDaemonSet;
use crate::model::agent_pods::{AgentPod, AgentPods, PodsOnNode};

/// Nodes looked up per judgement, the first by name; the others are named without their pod's state.
const LOOKED_UP: usize = 10;
/// Requests in flight at once.
const AT_ONCE: usize = 4;

/// What the API server says of the agent pods of the first few `missing` nodes (node, the DaemonSet that
/// should run there); a node whose pods cannot be read says why, naming the Role to bind when the account
/// may not.
pub async fn agent_pods(client: &kube::Client, missing: &[(String, AgentDaemonSet)]) -> AgentPods {
    let missing = &missing[..missing.len().min(LOOKED_UP)];
    let mut unplaced: BTreeMap<&str, Result<Vec<AgentPod>, String>> = BTreeMap::new();
    for (_, daemonset) in missing {
        if !unplaced.contains_key(daemonset.name.as_str()) {
            let listed = list(client, daemonset, "spec.nodeName=").await;
            unplaced.insert(&daemonset.name, listed);
        }
    }
    let lists: Vec<_> = missing
        .iter()
        .map(|(node, daemonset)| on_node(client, node, daemonset))
        .collect();
    let on_nodes: Vec<_> = futures::stream::iter(lists)
        .buffered(AT_ONCE)
        .collect()
        .await;
    on_nodes
        .into_iter()
        .map(|(node, daemonset, listed)| {
            let made_for_node = |pod: &&AgentPod| pod.node.as_deref() == Some(node.as_str());
            let pods = listed.and_then(|mut pods| {
                let unplaced = unplaced[daemonset.name.as_str()].as_ref()?;
                pods.extend(unplaced.iter().filter(made_for_node).cloned());
                Ok(pods)
            });
            let looked = match pods {
                Ok(pods) => PodsOnNode::Found(pods),
                Err(why) => PodsOnNode::Unreadable(why),
            };
            (node.clone(), looked)
        })
        .collect()
}

/// `daemonset`'s pods on `node`, with them.
async fn on_node<'a>(
    client: &kube::Client,
    node: &'a String,
    daemonset: &'a AgentDaemonSet,
) -> (
    &'a String,
    &'a AgentDaemonSet,
    Result<Vec<AgentPod>, String>,
) {
    let listed = list(client, daemonset, &format!("spec.nodeName={node}")).await;
    (node, daemonset, listed)
}

/// `daemonset`'s pods matching field selector `fields`.
async fn list(
    client: &kube::Client,
    daemonset: &AgentDaemonSet,
    fields: &str,
) -> Result<Vec<AgentPod>, String> {
    let namespace = &daemonset.namespace;
    let selector = Selector::try_from(daemonset.selector.clone()).map_err(|e| {
        format!(
            "DaemonSet {}'s selector cannot be read: {e}",
            daemonset.name
        )
    })?;
    let params = ListParams::default().labels_from(&selector).fields(fields);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods.list(&params).await {
        Ok(list) => Ok(list.items.iter().map(AgentPod::from).collect()),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(format!(
            "your account may not list pods in namespace {namespace:?}: bind the Role \
             pinboard-agents-viewer-pods there to it (docs/agents.md)"
        )),
        Err(e) => Err(format!("the API server failed: {e}")),
    }
}

//! `pinboard agent manifests`: what `kubectl apply -f -` installs, printed by the binary it runs, so the two
//! always match: the namespace, the CRDs, least-privilege RBAC and the agent's DaemonSet for one runtime,
//! from `deploy/agent/`.

use clap::Args;

use crate::model::runtime::RuntimeKind;

const NAMESPACE: &str = include_str!("../../deploy/agent/namespace.yaml");
const CRDS: &str = include_str!("../../deploy/agent/crds.yaml");
const RBAC: &str = include_str!("../../deploy/agent/rbac.yaml");
const DAEMONSET_CONTAINERD: &str = include_str!("../../deploy/agent/daemonset-containerd.yaml");
const DAEMONSET_CRIO: &str = include_str!("../../deploy/agent/daemonset-crio.yaml");
/// Where the in-cluster cache serves on its holder's node, with `--cache`.
const CACHE_PORT: u16 = 5050;

#[derive(Args, Debug)]
pub struct ManifestArgs {
    /// The agent's image: this binary, built by the Containerfile.
    #[arg(long, value_name = "REF", default_value_t = default_image())]
    pub image: String,
    /// The agents' namespace.
    #[arg(long, value_name = "NS", default_value = crate::model::pinboard_api::DEFAULT_NAMESPACE)]
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
    /// blob cache at /var/lib/pinboard/cache: sets with `spec.fanOut` then pull through it.
    #[arg(long)]
    pub cache: bool,
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
    let mut daemonset = match args.runtime {
        RuntimeKind::Containerd => DAEMONSET_CONTAINERD,
        RuntimeKind::Crio => DAEMONSET_CRIO,
    }
    .to_string();
    if let Some(selector) = &args.node_selector {
        let (key, value) = selector
            .split_once('=')
            .filter(|(k, v)| {
                crate::model::labels::valid_key(k) && crate::model::labels::valid_value(v)
            })
            .ok_or_else(|| NodeSelectorError(selector.clone()))?;
        daemonset = daemonset.replace(
            "      serviceAccountName: pinboard-agent\n",
            &format!(
                "      serviceAccountName: pinboard-agent\n      nodeSelector:\n        {key}: {value:?}\n"
            ),
        );
    }
    if args.node_credentials {
        daemonset = daemonset
            .replace(
                "args: [agent, ",
                "args: [agent, --node-credentials, /var/lib/kubelet/config.json, ",
            )
            .replace(
                "        volumeMounts:\n",
                "        volumeMounts:\n        - {name: node-credentials, mountPath: /var/lib/kubelet/config.json, readOnly: true}\n",
            )
            .replace(
                "      volumes:\n",
                "      volumes:\n      - {name: node-credentials, hostPath: {path: /var/lib/kubelet/config.json, type: File}}\n",
            );
    }
    let cache_port_given = args
        .agent_args
        .iter()
        .any(|a| a.starts_with("--cache-port"));
    if args.cache && !cache_port_given {
        daemonset = daemonset.replace(
            "args: [agent, ",
            &format!("args: [agent, --cache-port={CACHE_PORT}, "),
        );
    }
    if args.cache || cache_port_given {
        daemonset = daemonset
            .replace(
                "        volumeMounts:\n",
                "        volumeMounts:\n        - {name: cache, mountPath: /var/lib/pinboard/cache}\n",
            )
            .replace(
                "      volumes:\n",
                "      volumes:\n      - {name: cache, hostPath: {path: /var/lib/pinboard/cache, type: DirectoryOrCreate}}\n",
            );
    }
    if !args.agent_args.is_empty() {
        let extra: Vec<String> = args.agent_args.iter().map(|a| format!("{a:?}")).collect();
        daemonset = daemonset.replace(
            "args: [agent, ",
            &format!("args: [agent, {}, ", extra.join(", ")),
        );
    }
    let documents = [NAMESPACE, CRDS, RBAC, &daemonset];
    Ok(documents
        .iter()
        .map(|d| {
            d.replace("{{NAMESPACE}}", &args.namespace)
                .replace("{{IMAGE}}", &args.image)
        })
        .collect::<Vec<_>>()
        .join("---\n"))
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
            agent_args: vec!["--insecure-registry".into(), "registry.lab:5000".into()],
        }
    }

    #[test]
    fn the_manifests_name_the_image_and_namespace_and_mount_only_what_the_runtime_needs() {
        let containerd = render(&args(RuntimeKind::Containerd)).unwrap();
        assert!(!containerd.contains("{{"), "every placeholder filled");
        assert!(containerd.contains("image: registry.lab:5000/pinboard@sha256:0"));
        assert!(containerd.contains("namespace: pins"));
        assert!(containerd.contains("/run/containerd") && !containerd.contains("/var/run/crio"));
        assert!(
            !containerd.contains("hostPID"),
            "containerd needs no host PID namespace"
        );
        let crio = render(&args(RuntimeKind::Crio)).unwrap();
        assert!(crio.contains("/var/run/crio") && crio.contains("hostPID: true"));
        assert!(!crio.contains("/run/containerd"));
        for yaml in [&containerd, &crio] {
            assert!(yaml.contains("readOnlyRootFilesystem: true"));
            assert!(yaml.contains("drop: [ALL]"));
            assert!(yaml.contains("- operator: Exists"), "tolerates every taint");
            assert!(
                yaml.contains(r#"args: [agent, "--insecure-registry", "registry.lab:5000", "#),
                "the agent's extra arguments come first"
            );
            assert!(
                !yaml.contains("/var/lib/kubelet"),
                "no node credentials unless asked"
            );
        }
    }

    #[test]
    fn a_node_selector_and_the_nodes_credentials_are_added_when_asked() {
        let mut asked = args(RuntimeKind::Containerd);
        asked.node_selector = Some("pinboard.dev/runtime=containerd".into());
        asked.node_credentials = true;
        let yaml = render(&asked).unwrap();
        assert!(yaml.contains("nodeSelector:\n        pinboard.dev/runtime: \"containerd\""));
        assert!(yaml.contains("--node-credentials, /var/lib/kubelet/config.json"));
        assert!(yaml.contains("mountPath: /var/lib/kubelet/config.json, readOnly: true"));
        assert!(
            !yaml.contains("/var/lib/pinboard/cache"),
            "no cache unless asked"
        );
        asked.cache = true;
        let yaml = render(&asked).unwrap();
        assert!(yaml.contains(", --cache-port=5050, --node-credentials, "));
        assert!(
            yaml.contains("hostPath: {path: /var/lib/pinboard/cache, type: DirectoryOrCreate}")
        );
        asked.cache = false;
        asked.agent_args = vec!["--cache-port=6000".into()];
        let yaml = render(&asked).unwrap();
        assert!(yaml.contains("\"--cache-port=6000\"") && !yaml.contains("5050"));
        assert!(yaml.contains("mountPath: /var/lib/pinboard/cache"));
        asked.node_selector = Some("no value".into());
        assert!(
            render(&asked)
                .unwrap_err()
                .to_string()
                .contains("KEY=VALUE")
        );
    }
}

//! `pinboard lazy on|off|status`: lazy pulling on every node, the way its runtime does it
//! ([`crate::fleet::Fleet::lazy`]), for scripts. `on` and `off` write what each runtime needs (nothing with
//! `--readonly`, which says what would be written); `--restart` then restarts the runtimes whose change is
//! not in force yet. Exit 0 when every node is as asked (`status`: when every node answered and its lazy
//! pulling could be read), 1 when some node could not be changed, 3 when none answered.

use clap::{Args, ValueEnum};

use super::output::{printed_then, render, table};
use crate::backend::lazy::Apply;
use crate::error::{Exit, Failure};
use crate::model::lazy::NodeLazy;
use crate::options::{Caller, CommonArgs};

/// `pinboard lazy`'s arguments: what to do, how, and the common list.
#[derive(Args, Debug)]
pub struct LazyArgs {
    /// `on` or `off` on every node, or its `status`.
    #[arg(value_enum)]
    pub action: LazyAction,
    /// Write nothing: say what `on` or `off` would write, line by line.
    #[arg(long)]
    pub readonly: bool,
    /// After writing, restart each runtime that has not read the change yet (`systemctl restart containerd`
    /// or `crio`); without it pinboard only says that the runtime must be restarted.
    #[arg(long, conflicts_with = "readonly")]
    pub restart: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LazyAction {
    On,
    Off,
    Status,
}

/// What `pinboard lazy -o json|yaml` prints.
#[derive(serde::Serialize)]
struct Nodes<'a> {
    nodes: &'a [NodeLazy],
}

pub async fn run(args: LazyArgs) -> Result<String, Failure> {
    let fleet = args
        .common
        .fleet(Caller::Command {
            asks_runtimes: false,
        })
        .await?;
    let wanted = match args.action {
        LazyAction::On => Some(true),
        LazyAction::Off => Some(false),
        LazyAction::Status => None,
    };
    let apply = Apply {
        write: !args.readonly,
        restart: args.restart,
    };
    let nodes = fleet.lazy(wanted, apply).await?;
    for node in &nodes {
        if let Some(lazy) = &node.lazy_pulling
            && lazy.store_serving == Some(false)
        {
            tracing::warn!(
                "{}: lazy pulling {}: {}",
                node.node,
                lazy.text,
                lazy.detail.as_deref().unwrap_or_default()
            );
        }
    }
    let text = render(&Nodes { nodes: &nodes }, args.common.output(), || {
        lazy_table(&nodes)
    })?;
    verdict(text, &nodes)
}

/// `text` for stdout when every node is as asked; otherwise `text` is written here, and the nodes' errors
/// end the command: exit 3 when no node answered, else 1.
fn verdict(text: String, nodes: &[NodeLazy]) -> Result<String, Failure> {
    let lines: Vec<String> = nodes
        .iter()
        .filter_map(|n| Some(format!("{}: {}", n.node, n.error.as_deref()?)))
        .collect();
    if lines.is_empty() {
        return Ok(text);
    }
    if nodes.iter().all(|n| !n.reachable) {
        return Err(Failure::unreachable(lines));
    }
    Err(printed_then(
        &text,
        Failure {
            exit: Exit::NotReady,
            lines,
        },
    ))
}

/// One row per node, then what each node has to say: the restart to do, the lines to add, the diff.
fn lazy_table(nodes: &[NodeLazy]) -> String {
    let changing = nodes.iter().any(|n| n.change.is_some());
    let mut headers = vec!["NODE", "RUNTIME", "LAZY PULLING", "FILE"];
    if changing {
        headers.push("CHANGE");
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let unknown = || "unknown".to_string();
            let mut row = vec![
                n.node.clone(),
                n.runtime.clone().unwrap_or_else(|| match n.reachable {
                    true => unknown(),
                    false => "unreachable".into(),
                }),
                n.lazy_pulling
                    .as_ref()
                    .map_or_else(unknown, |l| l.text.clone()),
                n.file.clone().unwrap_or_else(|| "-".into()),
            ];
            if changing {
                row.push(n.change.map_or("-", |c| c.word()).to_string());
            }
            row
        })
        .collect();
    let headers: Vec<String> = headers.into_iter().map(String::from).collect();
    let mut out = table(&headers, &rows, &|_, _, text| text.to_string());
    for node in nodes {
        let mut said = Vec::new();
        if let Some(command) = &node.restarted {
            said.push(format!("  - restarted with `{command}`"));
        }
        if let Some(detail) = node.lazy_pulling.as_ref().and_then(|l| l.detail.as_ref()) {
            said.push(format!("  - {detail}"));
        }
        if let Some(error) = &node.error {
            said.push(format!("  ✗ {error}"));
        }
        if let Some(add) = &node.add {
            said.push(format!("  add {}:", add.place));
            said.extend(add.lines.iter().map(|line| format!("      {line}")));
        }
        if !node.diff.is_empty() {
            let file = node.file.as_deref().unwrap_or_default();
            said.push(format!("  {file} would read:"));
            said.extend(node.diff.iter().map(|line| format!("    {line}")));
        }
        if !said.is_empty() {
            out.push_str(&format!("\n{}:\n{}\n", node.node, said.join("\n")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lazy::{AddLines, FileChangeKind, LazyPulling, LazyState};

    #[test]
    fn the_table_says_each_nodes_state_and_what_to_do() {
        let on = LazyPulling::new(
            LazyState::OnAfterRestart,
            Some("stargz"),
            Some(false),
            Some("containerd reads it when it restarts: `systemctl restart containerd`".into()),
        );
        let nodes = [
            NodeLazy {
                node: "n2".into(),
                runtime: Some("containerd 1.6.20".into()),
                reachable: true,
                lazy_pulling: Some(on),
                file: Some("/etc/containerd/conf.d/zz-pinboard-lazy-pulling.toml".into()),
                change: Some(FileChangeKind::Written),
                ..NodeLazy::default()
            },
            NodeLazy {
                node: "n3".into(),
                reachable: true,
                change: Some(FileChangeKind::NotWritten),
                error: Some(
                    "nothing written: /etc/containerd/config.toml imports no directory".into(),
                ),
                add: Some(AddLines {
                    lines: vec!["imports = [\"/etc/containerd/conf.d/*.toml\"]".into()],
                    place: "before line 4 (`[grpc]`) of /etc/containerd/config.toml".into(),
                }),
                ..NodeLazy::default()
            },
        ];
        let text = lazy_table(&nodes);
        assert_eq!(
            text,
            "NODE  RUNTIME            LAZY PULLING      FILE                                                  CHANGE\n\
             n2    containerd 1.6.20  on after restart  /etc/containerd/conf.d/zz-pinboard-lazy-pulling.toml  written\n\
             n3    unknown            unknown           -                                                     not written\n\
             \n\
             n2:\n  \
             - containerd reads it when it restarts: `systemctl restart containerd`\n\
             \n\
             n3:\n  \
             ✗ nothing written: /etc/containerd/config.toml imports no directory\n  \
             add before line 4 (`[grpc]`) of /etc/containerd/config.toml:\n      \
             imports = [\"/etc/containerd/conf.d/*.toml\"]\n"
        );
        let failure = verdict(String::new(), &nodes).unwrap_err();
        assert_eq!(failure.exit, Exit::NotReady);
        assert_eq!(
            failure.lines,
            ["n3: nothing written: /etc/containerd/config.toml imports no directory"]
        );
    }
}

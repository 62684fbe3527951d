//! `pinboard crio-progress on|off|status`: whether each CRI-O node counts its pull bytes as they arrive
//! ([`crate::model::crio_progress`]): `on` writes pinboard's drop-in (`enable_metrics = true`,
//! `pull_progress_timeout = "5m"`), `off` removes it, `status` reads what the files set and whether the
//! metrics answer. CRI-O reads both settings only when it starts: `--restart` restarts it
//! (`systemctl restart crio`, which keeps running containers), else pinboard says to. Direct mode, on the
//! node itself (the files are the node's). Exit 0 when every node is as asked, 1 when some node could not
//! be changed or read, 3 when none answered.

use clap::{Args, ValueEnum};

use super::output::{printed_then, table};
use crate::backend::cri::{CriClient, DEFAULT_TIMEOUT};
use crate::backend::crio_counter::{pull_bytes, read_progress, set_progress};
use crate::backend::pins::{PinTarget, Reload, reload_crio, resolve};
use crate::backend::target::NodeTarget;
use crate::error::{Exit, Failure};
use crate::model::crio_progress::{PROGRESS_DROP_IN, PROGRESS_TIMEOUT, go_duration};
use crate::model::runtime::RuntimeKind;
use crate::options::CommonArgs;

/// `pinboard crio-progress`'s arguments.
#[derive(Args, Debug)]
pub struct CrioProgressArgs {
    /// `on` or `off` on every CRI-O node, or its `status`.
    #[arg(value_enum)]
    pub action: ProgressAction,
    /// After writing, restart CRI-O where the file changed (`systemctl restart crio`: running containers
    /// keep running); without it pinboard says that CRI-O reads it when it restarts.
    #[arg(long)]
    pub restart: bool,
    /// With `on`: the `pull_progress_timeout` to set (a Go duration). CRI-O reports every tenth of it, and
    /// cancels a pull that moved no byte for all of it.
    #[arg(long = "crio-timeout", value_name = "DURATION", default_value = PROGRESS_TIMEOUT,
          value_parser = timeout)]
    pub crio_timeout: String,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProgressAction {
    On,
    Off,
    Status,
}

/// One node's row.
struct NodeProgress {
    node: String,
    runtime: String,
    /// Counted, or why not.
    bytes: String,
    change: &'static str,
    /// What to do, or what went wrong.
    said: Option<String>,
    failed: bool,
    reachable: bool,
}

/// A `pull_progress_timeout` CRI-O takes: a positive Go duration.
fn timeout(text: &str) -> Result<String, String> {
    match go_duration(text) {
        Some(d) if !d.is_zero() => Ok(text.to_string()),
        Some(_) => Err("0 turns progress off: use `crio-progress off`".into()),
        None => Err(format!("{text:?} is not a Go duration such as 5m or 30s")),
    }
}

pub async fn run(args: CrioProgressArgs) -> Result<String, Failure> {
    let targets = args.common.targets.resolve()?;
    let wanted = match args.action {
        ProgressAction::On => Some(Some(args.crio_timeout.as_str())),
        ProgressAction::Off => Some(None),
        ProgressAction::Status => None,
    };
    let mut nodes = Vec::new();
    for target in &targets {
        nodes.push(node(target, wanted, args.restart).await);
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.node.clone(),
                n.runtime.clone(),
                n.bytes.clone(),
                n.change.to_string(),
            ]
        })
        .collect();
    let headers = ["NODE", "RUNTIME", "PULL BYTES", "CHANGE"].map(String::from);
    let mut text = table(&headers, &rows, &|_, _, cell| cell.to_string());
    for n in &nodes {
        if let Some(said) = &n.said {
            text.push_str(&format!("\n{}: {said}", n.node));
        }
    }
    text.push('\n');
    let lines: Vec<String> = nodes
        .iter()
        .filter(|n| n.failed)
        .map(|n| format!("{}: {}", n.node, n.said.as_deref().unwrap_or_default()))
        .collect();
    match lines.is_empty() {
        true => Ok(text),
        false if nodes.iter().all(|n| !n.reachable) => Err(Failure::unreachable(lines)),
        false => Err(printed_then(
            &text,
            Failure {
                exit: Exit::NotReady,
                lines,
            },
        )),
    }
}

/// Does what `wanted` says on one node: progress on with a timeout (`Some(Some(timeout))`), off
/// (`Some(None)`), or only its status (`None`).
async fn node(target: &NodeTarget, wanted: Option<Option<&str>>, restart: bool) -> NodeProgress {
    let mut row = NodeProgress {
        node: target.node.name.clone(),
        runtime: "unreachable".into(),
        bytes: "unknown".into(),
        change: "-",
        said: None,
        failed: true,
        reachable: false,
    };
    let connected = async {
        let client = CriClient::connect(&target.node.endpoint, DEFAULT_TIMEOUT).await?;
        let version = client.version().await?;
        Ok::<_, crate::backend::cri::CriError>((client, version))
    };
    let (client, version) = match connected.await {
        Ok(connected) => connected,
        Err(e) => {
            row.said = Some(e.to_string());
            return row;
        }
    };
    row.reachable = true;
    row.runtime = format!("{} {}", version.runtime_name, version.runtime_version);
    if RuntimeKind::of_cri_name(&version.runtime_name) != Some(RuntimeKind::Crio) {
        row.bytes = "counted (content ingests)".into();
        row.failed = false;
        return row;
    }
    let config_dir = match resolve(target.pin.clone(), &version.runtime_name, &client) {
        Ok(PinTarget::CrioDropIn { config_dir, .. }) => config_dir,
        Ok(_) => unreachable!("a CRI-O node pins through its drop-in"),
        Err(e) => {
            row.said = Some(e.to_string());
            return row;
        }
    };
    let dir = config_dir.clone();
    let changed = match wanted {
        None => Ok(false),
        Some(timeout) => {
            let timeout = timeout.map(str::to_string);
            tokio::task::spawn_blocking(move || set_progress(&dir, timeout.as_deref()))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        }
    };
    let changed = match changed {
        Ok(changed) => changed,
        Err(e) => {
            row.said = Some(format!("nothing written: {e}"));
            return row;
        }
    };
    if wanted.is_some() {
        row.change = if changed { "written" } else { "unchanged" };
    }
    let file = config_dir.join(PROGRESS_DROP_IN).display().to_string();
    if changed && restart {
        if let Err(e) = tokio::task::spawn_blocking(|| reload_crio(&Reload::Restart))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            row.said = Some(format!("{file} written; restarting CRI-O: {e}"));
            return row;
        }
    } else if changed {
        row.said = Some(format!(
            "{file} written: CRI-O reads it when it restarts (`systemctl restart crio`, which keeps \
             running containers; or --restart)"
        ));
    }
    let settings = match tokio::task::spawn_blocking(move || read_progress(&config_dir)).await {
        Ok(Ok(settings)) => settings,
        Ok(Err(e)) => {
            row.said = Some(e.to_string());
            return row;
        }
        Err(e) => {
            row.said = Some(e.to_string());
            return row;
        }
    };
    row.failed = false;
    row.bytes = match (&settings.metrics, settings.why_no_bytes()) {
        (Some(at), None) => {
            let serving = match pull_bytes(at).await {
                Ok(_) => "its metrics answer",
                Err(_) if changed && !restart => "after its restart",
                Err(_) => "its metrics do not answer",
            };
            format!(
                "counted: every {:?}, at {}, {serving}",
                settings.pull_progress_timeout / 10,
                at.address()
            )
        }
        (_, why) => {
            if row.said.is_none() && wanted.is_none() {
                row.said = why;
            }
            "not counted".into()
        }
    };
    row
}

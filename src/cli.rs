//! The headless commands. Each reads its input completely and checks it before touching anything, so bad
//! input ends with one clear message per problem, exit code 2, and nothing done.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use crossterm::style::{ResetColor, SetForegroundColor};
use ratatui::backend::IntoCrossterm;
use serde::Deserialize;

use crate::backend::cri::CriEndpoint;
use crate::backend::node::DirectNode;
use crate::backend::registry::{Registry, RegistryOptions};
use crate::error::{Exit, Failure};
use crate::model::image::Platform;
use crate::model::plan::{Limits, NodePlan};
use crate::model::set::{self, ImageSet};
use crate::model::units::{human, human_signed, parse_bytes};
use crate::survey::{Survey, SurveyError, survey};
use crate::ui::status::verdict_label;
use crate::ui::theme::Theme;

#[derive(Parser, Debug)]
#[command(
    name = "pinboard",
    version,
    about = "Pin and pre-load container images on cluster nodes, and watch those rollouts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Preview what pre-loading image sets costs each node: bytes to fetch, disk after, and a verdict.
    Plan(PlanArgs),
}

/// Which images: any mix of these, each set checked against the PinnedImageSet rules.
#[derive(Args, Debug, Default)]
pub struct SetInput {
    /// PinnedImageSet YAML (several documents allowed). Repeatable.
    #[arg(long = "set", value_name = "FILE")]
    pub sets: Vec<PathBuf>,
    /// A list file: one reference per line, `#` comments, blank lines ignored. Repeatable.
    #[arg(long = "images-file", value_name = "FILE")]
    pub images_files: Vec<PathBuf>,
    /// One image reference (HOST/[NAMESPACE/]NAME@sha256:DIGEST). Repeatable.
    #[arg(long = "image", value_name = "REF")]
    pub images: Vec<String>,
}

/// Which nodes, reached directly over their CRI sockets.
#[derive(Args, Debug, Default)]
pub struct Targets {
    /// A node's CRI endpoint: [NAME=]unix:///path or [NAME=]tcp://host:port. Repeatable. Without it, the
    /// endpoint crictl would use (CONTAINER_RUNTIME_ENDPOINT, /etc/crictl.yaml, the CRI-O and containerd sockets).
    #[arg(long = "cri", value_name = "[NAME=]ENDPOINT")]
    pub cri: Vec<String>,
    /// The nodes' platform, for multi-platform images: os/arch[/variant]. Default: this machine's.
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// Timeout for each CRI call.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub timeout: u64,
}

/// How to reach registries.
#[derive(Args, Debug, Default)]
pub struct RegistryArgs {
    /// Registry credentials (containers-auth.json / docker config format). Default: REGISTRY_AUTH_FILE,
    /// $XDG_RUNTIME_DIR/containers/auth.json, ~/.docker/config.json, /var/lib/kubelet/config.json.
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
    /// Talk plain HTTP to this registry (HOST[:PORT]). Repeatable. All others use HTTPS.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Manifest requests in flight at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub registry_concurrency: usize,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
    Yaml,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub input: SetInput,
    #[command(flatten)]
    pub targets: Targets,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Kubelet image GC high threshold, percent: a node above it after pre-loading is `tight`.
    #[arg(long, value_name = "PERCENT", default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub gc_high_percent: u8,
    /// Free space that must remain after pre-loading, e.g. 16Gi (the OpenShift daemon's floor).
    #[arg(long, value_name = "BYTES", default_value = "16Gi", value_parser = parse_bytes)]
    pub min_free: u64,
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Runs a command; returns what to print on stdout, or the failure.
pub async fn run(cli: Cli) -> Result<String, Failure> {
    match cli.command {
        Command::Plan(args) => plan(args).await,
    }
}

async fn plan(args: PlanArgs) -> Result<String, Failure> {
    let sets = read_sets(&args.input)?;
    let nodes = resolve_targets(&args.targets.cri)?;
    let platform = match &args.targets.platform {
        Some(text) => Platform::parse(text).map_err(Failure::bad_input)?,
        None => Platform::host(),
    };
    let registry = registry_client(&args.registry)?;
    let limits = Limits {
        gc_high_percent: args.gc_high_percent,
        min_free_bytes: args.min_free,
    };
    let timeout = Duration::from_secs(args.targets.timeout.max(1));
    let survey = survey(&nodes, &sets, &registry, &platform, limits, timeout).await.map_err(|err| match err {
        SurveyError::NoTarget(errors) => Failure::unreachable(
            errors.into_iter().map(|e| format!("{e}; check that the runtime is running and the path or address is right")).collect(),
        ),
        SurveyError::Images(failed) => Failure {
            exit: Exit::BadInput,
            lines: failed.into_iter().map(|(_, err)| err.to_string()).collect(),
        },
    })?;
    render(&survey, args.output)
}

pub fn registry_client(args: &RegistryArgs) -> Result<Registry, Failure> {
    Registry::new(RegistryOptions {
        authfile: args.authfile.clone(),
        insecure_registries: args.insecure_registries.clone(),
        concurrency: args.registry_concurrency.max(1),
        ..RegistryOptions::default()
    })
    .map_err(|e| Failure::bad_input(e.to_string()))
}

/// Reads and checks every set named on the command line. All problems of all sets are reported together.
pub fn read_sets(input: &SetInput) -> Result<Vec<ImageSet>, Failure> {
    let mut sets = Vec::new();
    let mut problems = Vec::new();
    for path in &input.sets {
        match set::parse_yaml(&read_file(path)?, &path.display().to_string()) {
            Ok(found) if found.is_empty() => {
                problems.push(format!("{}: holds no PinnedImageSet", path.display()))
            }
            Ok(found) => sets.extend(found),
            Err(found) => problems.extend(found.iter().map(ToString::to_string)),
        }
    }
    for path in &input.images_files {
        let name = path
            .file_stem()
            .map_or("images".into(), |s| s.to_string_lossy().into_owned());
        sets.push(set::parse_list(
            &read_file(path)?,
            &path.display().to_string(),
            &name,
        ));
    }
    if !input.images.is_empty() {
        sets.push(set::from_flags("command-line", &input.images));
    }
    if sets.is_empty() && problems.is_empty() {
        return Err(Failure::bad_input(
            "no images given: pass --set FILE, --images-file FILE or --image REF",
        ));
    }
    problems.extend(
        sets.iter()
            .flat_map(|s| s.validate())
            .map(|p| p.to_string()),
    );
    if problems.is_empty() {
        Ok(sets)
    } else {
        Err(Failure {
            exit: Exit::BadInput,
            lines: problems,
        })
    }
}

fn read_file(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", path.display())))
}

/// `--cri` values to nodes. Without any, the endpoint crictl would use.
pub fn resolve_targets(flags: &[String]) -> Result<Vec<DirectNode>, Failure> {
    if flags.is_empty() {
        let endpoint = default_endpoint().ok_or_else(|| {
            Failure::unreachable(vec![
                "no CRI endpoint: CONTAINER_RUNTIME_ENDPOINT is unset, /etc/crictl.yaml names none, and neither \
                 /run/crio/crio.sock nor /run/containerd/containerd.sock exists; pass --cri [NAME=]ENDPOINT"
                    .into(),
            ])
        })?;
        return Ok(vec![DirectNode {
            name: host_name(),
            endpoint,
        }]);
    }
    let mut nodes: Vec<DirectNode> = Vec::new();
    for flag in flags {
        // `NAME=` only when what precedes `=` cannot be part of an endpoint.
        let (name, endpoint) = match flag.split_once('=') {
            Some((name, endpoint)) if !name.contains([':', '/']) => (Some(name), endpoint),
            _ => (None, flag.as_str()),
        };
        let endpoint: CriEndpoint = endpoint
            .parse()
            .map_err(|e: String| Failure::bad_input(format!("--cri {flag}: {e}")))?;
        let name = match name {
            Some(name) if valid_node_name(name) => name.to_string(),
            Some(name) => {
                return Err(Failure::bad_input(format!(
                    "--cri {flag}: node name {name:?} is not a DNS name (lowercase letters, digits, '-', '.')"
                )));
            }
            None if flags.len() == 1 => host_name(),
            None => {
                return Err(Failure::bad_input(format!(
                    "--cri {flag}: name each node when giving several endpoints: --cri NAME={endpoint}"
                )));
            }
        };
        if nodes.iter().any(|n| n.name == name) {
            return Err(Failure::bad_input(format!(
                "--cri {flag}: node name {name:?} is given twice"
            )));
        }
        nodes.push(DirectNode { name, endpoint });
    }
    Ok(nodes)
}

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The endpoint crictl would pick: CONTAINER_RUNTIME_ENDPOINT, /etc/crictl.yaml, then the first existing
/// default socket of CRI-O or containerd.
fn default_endpoint() -> Option<CriEndpoint> {
    #[derive(Deserialize)]
    struct CrictlConfig {
        #[serde(rename = "runtime-endpoint")]
        runtime_endpoint: Option<String>,
    }
    if let Ok(value) = std::env::var("CONTAINER_RUNTIME_ENDPOINT") {
        return value.parse().ok();
    }
    let configured = std::fs::read_to_string("/etc/crictl.yaml")
        .ok()
        .and_then(|text| serde_saphyr::from_str::<CrictlConfig>(&text).ok())
        .and_then(|c| c.runtime_endpoint);
    if let Some(endpoint) = configured {
        return endpoint.parse().ok();
    }
    [
        "/run/crio/crio.sock",
        "/run/containerd/containerd.sock",
        "/var/run/crio/crio.sock",
    ]
    .iter()
    .find(|p| Path::new(p).exists())
    .map(|p| CriEndpoint::Unix(PathBuf::from(p)))
}

fn render(survey: &Survey, output: Output) -> Result<String, Failure> {
    match output {
        Output::Json => Ok(serde_json::to_string_pretty(survey).expect("survey serializes") + "\n"),
        Output::Yaml => serde_saphyr::to_string(survey)
            .map_err(|e| Failure::bad_input(format!("cannot write YAML: {e}"))),
        Output::Table => {
            let theme = std::io::stdout().is_terminal().then(Theme::from_env);
            Ok(plan_table(survey, theme.as_ref()))
        }
    }
}

fn or_unknown(value: Option<u64>) -> String {
    value.map_or_else(|| "unknown".into(), human)
}

/// The human table: one row per node, then each node's reasons, then the image × node presence matrix.
/// With a theme (stdout is a terminal), verdicts are also colored.
pub fn plan_table(survey: &Survey, theme: Option<&Theme>) -> String {
    let headers = [
        "NODE",
        "RUNTIME",
        "CAPACITY",
        "AVAILABLE",
        "PRESENT",
        "FETCH",
        "EST. DISK",
        "AFTER",
        "VERDICT",
    ];
    let verdict_column = headers.len() - 1;
    let rows: Vec<Vec<String>> = survey.nodes.iter().map(node_row).collect();
    let paint = |row: usize, column: usize, text: &str| match theme {
        Some(theme) if column == verdict_column && !theme.is_monochrome() => {
            let color = theme.verdict(survey.nodes[row].verdict).into_crossterm();
            format!("{}{text}{}", SetForegroundColor(color), ResetColor)
        }
        _ => text.to_string(),
    };
    let mut out = table(&headers.map(String::from), &rows, &paint);
    let sets: Vec<String> = survey
        .sets
        .iter()
        .map(|s| format!("{} ({} images)", s.name, s.images))
        .collect();
    out.push_str(&format!(
        "\nsets: {}; floor {} (--min-free), GC high threshold {}% (--gc-high-percent); est. disk is uncompressed \
         size where the image states it, else 2x compressed\n",
        sets.join(", "),
        human(survey.min_free_bytes),
        survey.gc_high_percent
    ));
    for node in survey.nodes.iter().filter(|n| !n.reasons.is_empty()) {
        out.push_str(&format!("\n{}:\n", node.node));
        for reason in &node.reasons {
            out.push_str(&format!("  - {reason}\n"));
        }
    }
    if let Some(first) = survey.nodes.first() {
        let mut headers = vec!["IMAGE".to_string(), "LAZY".to_string()];
        headers.extend(survey.nodes.iter().map(|n| n.node.clone()));
        let rows: Vec<Vec<String>> = first
            .images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let mut row = vec![
                    short_reference(&image.reference),
                    image.lazy_format.to_string(),
                ];
                row.extend(survey.nodes.iter().map(|n| match n.images[i].present {
                    Some(true) => "✓ present".to_string(),
                    Some(false) => format!("↓ {}", human(n.images[i].fetch_bytes)),
                    None => "? unknown".to_string(),
                }));
                row
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&headers, &rows, &|_, _, text| text.to_string()));
    }
    out
}

fn node_row(node: &NodePlan) -> Vec<String> {
    let present = node
        .images
        .iter()
        .filter(|i| i.present == Some(true))
        .count();
    let basis = match node.estimate_basis {
        crate::model::plan::EstimateBasis::TwiceCompressed => " (2x)",
        crate::model::plan::EstimateBasis::Mixed => " (mixed)",
        _ => "",
    };
    vec![
        node.node.clone(),
        node.runtime.clone().unwrap_or_else(|| "unreachable".into()),
        or_unknown(node.capacity_bytes),
        or_unknown(node.available_bytes),
        format!("{present}/{}", node.images.len()),
        human(node.fetch_bytes),
        format!("{}{basis}", human(node.estimated_disk_bytes)),
        node.available_after_bytes
            .map_or_else(|| "unknown".into(), human_signed),
        verdict_label(node.verdict),
    ]
}

/// `host/name@sha256:0123456789ab…`: long enough to tell images apart, short enough for a table.
fn short_reference(reference: &str) -> String {
    match reference.split_once("@sha256:") {
        Some((name, hex)) if hex.len() > 12 => format!("{name}@sha256:{}…", &hex[..12]),
        _ => reference.to_string(),
    }
}

/// Left-aligned columns separated by two spaces; widths by characters, not bytes. `paint(row, column, text)`
/// may decorate a body cell (e.g. color it) without changing its width.
fn table(
    headers: &[String],
    rows: &[Vec<String>],
    paint: &dyn Fn(usize, usize, &str) -> String,
) -> String {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([headers[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..headers.len()).map(width).collect();
    let line = |cells: &[String], painted: &dyn Fn(usize, &str) -> String| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, w))| {
                painted(column, cell) + &" ".repeat(w - cell.chars().count())
            })
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    std::iter::once(line(headers, &|_, text| text.to_string()))
        .chain(
            rows.iter()
                .enumerate()
                .map(|(row, cells)| line(cells, &|column, text| paint(row, column, text))),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_flags_name_nodes() {
        let nodes =
            resolve_targets(&["n1=unix:///a.sock".into(), "n2=tcp://10.0.0.2:10010".into()])
                .unwrap();
        assert_eq!(
            nodes[0],
            DirectNode {
                name: "n1".into(),
                endpoint: CriEndpoint::Unix("/a.sock".into())
            }
        );
        assert_eq!(nodes[1].endpoint, CriEndpoint::Tcp("10.0.0.2:10010".into()));

        let single = resolve_targets(&["unix:///a.sock".into()]).unwrap();
        assert_eq!(single[0].name, host_name());

        let unnamed =
            resolve_targets(&["unix:///a.sock".into(), "unix:///b.sock".into()]).unwrap_err();
        assert!(unnamed.lines[0].contains("name each node"), "{unnamed}");
        assert_eq!(unnamed.exit, Exit::BadInput);
        let twice =
            resolve_targets(&["a=unix:///a.sock".into(), "a=unix:///b.sock".into()]).unwrap_err();
        assert!(twice.lines[0].contains("given twice"));
        let bad = resolve_targets(&["n1=http://x".into()]).unwrap_err();
        assert!(
            bad.lines[0].starts_with("--cri n1=http://x: CRI endpoint"),
            "{bad}"
        );
        assert!(
            resolve_targets(&["N_1=unix:///a.sock".into()])
                .unwrap_err()
                .lines[0]
                .contains("not a DNS name")
        );
    }

    #[test]
    fn tables_align_by_characters() {
        let rows = [
            vec!["✓ fits".into(), "x".into()],
            vec!["?".into(), "yy".into()],
        ];
        let t = table(&["A".into(), "B".into()], &rows, &|_, _, text| {
            text.to_string()
        });
        assert_eq!(t, "A       B\n✓ fits  x\n?       yy\n");
        let painted = table(&["A".into(), "B".into()], &rows, &|row, column, text| {
            if (row, column) == (1, 0) {
                format!("<{text}>")
            } else {
                text.to_string()
            }
        });
        assert_eq!(
            painted, "A       B\n✓ fits  x\n<?>       yy\n",
            "decoration does not shift columns"
        );
    }

    #[test]
    fn short_references_keep_twelve_hex_digits() {
        let r = format!("quay.io/a@sha256:{}", "0123456789abcdef".repeat(4));
        assert_eq!(short_reference(&r), "quay.io/a@sha256:0123456789ab…");
    }
}

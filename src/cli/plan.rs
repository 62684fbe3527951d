//! `pinboard plan`: what pre-loading image sets costs each node, as a table, JSON or YAML.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::time::Duration;

use crossterm::style::{ResetColor, SetForegroundColor};
use ratatui::backend::IntoCrossterm;

use super::output::{image_matrix, table};
use crate::error::Failure;
use crate::model::plan::{
    EstimateBasis, FetchBasis, FloorSource, GcSource, ImagePlan, NodePlan, SpaceSource,
};
use crate::model::reference::some_of;
use crate::model::units::{clock, human, human_rate, human_signed};
use crate::options::{Caller, CommonArgs, Output};
use crate::survey::Survey;
use crate::ui::status::verdict_label;
use crate::ui::theme::Theme;

pub async fn run(args: CommonArgs) -> Result<String, Failure> {
    let fleet = args
        .fleet(Caller::Command {
            asks_runtimes: false,
        })
        .await?;
    let mut survey = fleet.plan(&args.input.sources()).await?;
    survey.link_bytes = survey.link_bytes.at_rate(args.cache.link_rate);
    if let Output::Json = args.output() {
        // Thousands of nodes make hundreds of MB of JSON: written as it is made, not built in memory first.
        super::output::write_json(&survey)?;
        return Ok(String::new());
    }
    render(&survey, args.output())
}

fn render(survey: &Survey, output: Output) -> Result<String, Failure> {
    super::output::render(survey, output, || {
        let theme = std::io::stdout().is_terminal().then(Theme::from_env);
        plan_table(survey, theme.as_ref())
    })
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
        "\nsets: {}; {}, {}; est. disk is uncompressed size where the image states it, else 2x compressed\n",
        sets.join(", "),
        floors(survey),
        gc_thresholds(survey)
    ));
    out.push_str(&what_if(survey));
    out.push_str(&format!(
        "registry link: {} if every node pulls for itself, {} with fan-out (--fan-out: each blob once, \
         what the blob cache holds not again)\n",
        human(survey.link_bytes.direct),
        human(survey.link_bytes.fan_out)
    ));
    if let (Some(rate), Some(seconds)) = (survey.link_bytes.rate, survey.link_bytes.fan_out_seconds)
    {
        out.push_str(&format!(
            "link budget: {} (--link-rate): fan-out's {} take {} over the link at least\n",
            human_rate(rate),
            human(survey.link_bytes.fan_out),
            clock(Duration::from_secs(seconds))
        ));
    }
    let sources = [
        SpaceSource::KubeletSummary,
        SpaceSource::AllocatableEphemeralStorage,
    ];
    let used = |source| survey.nodes.iter().any(|n| n.space_source == Some(source));
    for source in sources.into_iter().filter(|s| used(*s)) {
        out.push_str(&match source {
            SpaceSource::KubeletSummary => {
                "space figures: the kubelet's image filesystem (its summary through the node proxy)\n".into()
            }
            SpaceSource::AllocatableEphemeralStorage => format!(
                "(allocatable): the Node's {} (what the OpenShift daemon checks), not the image \
                 filesystem's free space; the kubelet summary needs `get nodes/proxy` and a kubelet that \
                 answers\n",
                source.label()
            ),
        });
    }
    out.push_str(&mirrors_used(survey));
    let bounds: Vec<&str> = survey
        .nodes
        .iter()
        .filter(|n| n.fetch_basis == FetchBasis::UpperBound)
        .map(|n| n.node.as_str())
        .collect();
    if !bounds.is_empty() {
        out.push_str(&format!(
            "FETCH of {} is an upper bound: its runtime could not say which blobs it holds, so only the \
             sets' present images are left out\n",
            bounds.join(", ")
        ));
    }
    for node in survey.nodes.iter().filter(|n| !n.reasons.is_empty()) {
        out.push_str(&format!("\n{}:\n", node.node));
        for reason in &node.reasons {
            out.push_str(&format!("  - {reason}\n"));
        }
    }
    let columns: Vec<(&str, &[ImagePlan])> = survey
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.images.as_slice()))
        .collect();
    let matrix = image_matrix(
        &["LAZY"],
        &columns,
        |i| &i.reference,
        |i| vec![i.lazy_format.to_string()],
        |i| match (i.present, &i.lazy) {
            // Its remote layers still come over the link.
            (Some(true), Some(lazy)) => format!("~ {}, ↓ {}", lazy.words(), human(i.fetch_bytes)),
            (Some(true), None) => "✓ present".to_string(),
            (Some(false), _) => format!("↓ {}", human(i.fetch_bytes)),
            (None, _) => "? unknown".to_string(),
        },
    );
    if !matrix.is_empty() {
        out.push('\n');
        out.push_str(&matrix);
    }
    out
}

/// `mirror mirror.example.com/ocp answered for 187 images`, one line per mirror that served the survey.
fn mirrors_used(survey: &Survey) -> String {
    let mut by_mirror: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for image in survey.nodes.iter().flat_map(|n| &n.images) {
        if let Some(mirror) = &image.mirror {
            by_mirror
                .entry(mirror)
                .or_default()
                .insert(&image.reference);
        }
    }
    by_mirror
        .iter()
        .map(|(mirror, images)| {
            format!(
                "mirror {mirror} answered for {} image(s) (registries.conf or an ImageDigestMirrorSet)\n",
                images.len()
            )
        })
        .collect()
}

/// `floor 16 GiB (--min-free)` when every node has the same, else each floor with the nodes judged by it.
fn floors(survey: &Survey) -> String {
    let groups = grouped(survey, |n| Some((n.min_free_bytes, n.min_free_source)));
    match groups.as_slice() {
        [] => format!("floor {} (--min-free)", human(survey.min_free_bytes)),
        [((bytes, source), _)] => format!("floor {} ({})", human(*bytes), source.label()),
        _ => {
            let each: Vec<String> = groups
                .iter()
                .map(|((bytes, source), nodes)| {
                    format!(
                        "{} ({}) on {}",
                        human(*bytes),
                        source.short(),
                        some_of(nodes)
                    )
                })
                .collect();
            format!("floors: {}", each.join("; "))
        }
    }
}

/// On agents with `--min-free` given: that it is a what-if, and the floors the agents pull by instead.
fn what_if(survey: &Survey) -> String {
    let own = grouped(survey, |n| {
        (n.min_free_source == FloorSource::WhatIf)
            .then_some(n.agent_min_free_bytes)
            .flatten()
    });
    if own.is_empty() {
        return String::new();
    }
    let each: Vec<String> = own
        .iter()
        .map(|(bytes, nodes)| format!("{} on {}", human(*bytes), some_of(nodes)))
        .collect();
    format!(
        "--min-free {} is a what-if: the agents pull by their own floors ({}), which is what `apply` \
         judges by\n",
        human(survey.min_free_bytes),
        each.join("; ")
    )
}

/// The nodes by what `key` says of them, in first-seen order; nodes it says nothing of are left out.
fn grouped<K: PartialEq>(
    survey: &Survey,
    key: impl Fn(&NodePlan) -> Option<K>,
) -> Vec<(K, Vec<&str>)> {
    let mut groups: Vec<(K, Vec<&str>)> = Vec::new();
    for node in &survey.nodes {
        let Some(k) = key(node) else {
            continue;
        };
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, nodes)) => nodes.push(&node.node),
            None => groups.push((k, vec![&node.node])),
        }
    }
    groups
}

/// `GC high threshold 85% (--gc-high-percent)` when every node has the same, else each node's.
fn gc_thresholds(survey: &Survey) -> String {
    let mut thresholds: Vec<(u8, GcSource)> = survey
        .nodes
        .iter()
        .map(|n| (n.gc_high_percent, n.gc_high_source))
        .collect();
    thresholds.dedup();
    match thresholds.as_slice() {
        [] => format!("GC high threshold {}%", survey.gc_high_percent),
        [(percent, source)] => format!("GC high threshold {percent}% ({})", source.label()),
        _ => {
            let each: Vec<String> = survey
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "{} {}% ({})",
                        n.node,
                        n.gc_high_percent,
                        n.gc_high_source.short()
                    )
                })
                .collect();
            format!("GC high threshold per node: {}", each.join(", "))
        }
    }
}

fn node_row(node: &NodePlan) -> Vec<String> {
    let present = node
        .images
        .iter()
        .filter(|i| i.present == Some(true))
        .count();
    let basis = match node.estimate_basis {
        EstimateBasis::TwiceCompressed => " (2x)",
        EstimateBasis::Mixed => " (mixed)",
        _ => "",
    };
    vec![
        node.node.clone(),
        node.runtime.clone().unwrap_or_else(|| "unreachable".into()),
        or_unknown(node.capacity_bytes),
        match node.space_source {
            Some(SpaceSource::AllocatableEphemeralStorage) => {
                format!("{} (allocatable)", or_unknown(node.available_bytes))
            }
            _ => or_unknown(node.available_bytes),
        },
        format!("{present}/{}", node.images.len()),
        human(node.fetch_bytes),
        format!("{}{basis}", human(node.estimated_disk_bytes)),
        node.available_after_bytes
            .map_or_else(|| "unknown".into(), human_signed),
        verdict_label(node.verdict),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::plan::{AgentLimits, Limits, NodeFacts, plan_node};

    const MI: u64 = 1 << 20;

    /// n1 and n2 on agents started with `--min-free 1Mi`, n3 with an agent that does not say.
    fn survey(limits: Limits) -> Survey {
        let node = |name: &str, agent: Option<u64>| NodeFacts {
            name: name.into(),
            capacity_bytes: Some(100 * MI),
            available_bytes: Some(50 * MI),
            used_bytes: Some(50 * MI),
            agent_limits: agent.map(|min_free_bytes| AgentLimits {
                min_free_bytes,
                gc_high_percent: None,
            }),
            ..NodeFacts::default()
        };
        let nodes = [node("n1", Some(MI)), node("n2", Some(MI)), node("n3", None)];
        Survey {
            sets: Vec::new(),
            gc_high_percent: limits.gc_high_percent,
            min_free_bytes: limits.min_free_bytes,
            nodes: nodes.iter().map(|n| plan_node(n, &[], &limits)).collect(),
            link_bytes: Default::default(),
            facts: Default::default(),
        }
    }

    #[test]
    fn the_table_names_each_nodes_floor_and_a_given_min_free_on_agents_as_a_what_if() {
        let own = plan_table(&survey(Limits::default()), None);
        assert!(
            own.contains("floors: 1 MiB (its agent's) on n1, n2; 16 GiB (--min-free) on n3"),
            "{own}"
        );
        assert!(!own.contains("what-if"), "{own}");
        let given = Limits {
            min_free_bytes: 16 << 30,
            min_free_given: true,
            ..Limits::default()
        };
        let what_if = plan_table(&survey(given), None);
        assert!(
            what_if.contains(
                "floors: 16 GiB (--min-free, what-if) on n1, n2; 16 GiB (--min-free) on n3"
            ),
            "{what_if}"
        );
        assert!(
            what_if.contains(
                "--min-free 16 GiB is a what-if: the agents pull by their own floors (1 MiB on n1, n2), \
                 which is what `apply` judges by"
            ),
            "{what_if}"
        );
    }
}

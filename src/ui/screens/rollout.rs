//! The Rollout screen in direct mode: the engine's rollout summed over every node, then per node, then
//! per image on the selected node, with why the selected image (or its node) is where it is.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use crate::model::lazy::remote_count;
use crate::model::reference::some_of;
use crate::model::rollout::{ImageRollout, ImageState, NodeRollout, NodeState};
use crate::model::units::{clock, human, human_rate};
use crate::ui::state::{NO_CACHE, Pane, Screen, State, matches};
use crate::ui::status::{Tone, image_status, node_status, pin_method_label};
use crate::ui::theme::{Role, Theme};
use crate::ui::widgets::{
    Column, bar, col, duration, empty, fg, fit_line, flex, longest, pane, right, sized_to,
    status_span, table, table_title, tally,
};

const ROLLOUT_NODE_COLUMNS: [Column; 8] = [
    flex("NODE", 10),
    col("STATE", 12, 0),
    col("PROGRESS", 12, 2),
    col("BYTES", 21, 0),
    col("RATE", 11, 3),
    col("ETA", 7, 0),
    col("ELAPSED", 7, 4),
    col("IMAGES", 16, 5),
];

const ROLLOUT_IMAGE_COLUMNS: [Column; 6] = [
    flex("IMAGE", 20),
    col("STATE", 11, 0),
    col("PROGRESS", 12, 2),
    col("BYTES", 21, 1),
    col("ELAPSED", 9, 3),
    col("RETRIES", 24, 4),
];

pub(in crate::ui) fn draw(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let (now, stall_after) = (state.now, state.stall_after);
    if state.rollout.nodes().is_empty() {
        let text = "no rollout yet: a on the Sets or Plan screen applies a set";
        empty(theme, frame, area, "Rollout", text);
        return;
    }
    let [summary_area, nodes_area, images_area, detail_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Percentage(50),
        Constraint::Fill(1),
        Constraint::Length(2),
    ])
    .areas(area);
    frame.render_widget(fit_line(summary(state), area.width), summary_area);

    let filter = state.filter(Screen::Rollout);
    let cursor = state.cursor(Pane::RolloutNodes);
    let mut title = table_title("Nodes", cursor, filter);
    // `pinned*`: the legend, once some node shows it.
    let unconfirmed = state.rollout.nodes().values().any(|n| {
        matches!(
            n.state,
            NodeState::Pinned {
                confirmed: false,
                ..
            }
        )
    });
    if unconfirmed {
        title.push_span(Span::styled(
            "* pins written, not confirmed: the runtime does not report pins ",
            fg(theme.role(Role::Dim)),
        ));
    }
    let rows = state
        .rollout_order
        .iter()
        .filter(|n| matches(n, filter))
        .map(|name| (name, &state.rollout.nodes()[name]));
    table(
        frame,
        nodes_area,
        theme,
        pane(theme, title, state.focus() == Pane::RolloutNodes),
        &sized_to(
            ROLLOUT_NODE_COLUMNS,
            longest(state.rollout_order.iter().map(String::as_str)),
        ),
        cursor,
        rows,
        |(name, node), widths| {
            let stalled = node.stalled(now, stall_after).next().is_some();
            let elapsed = match node.state {
                NodeState::Pulling { since } => duration(now.saturating_duration_since(since)),
                NodeState::Pinned { took, .. } => duration(took),
                _ => "-".into(),
            };
            [
                Line::from(name.clone()),
                Line::from(status_span(theme, node_status(&node.state, stalled))),
                progress(theme, node.done_bytes(), node.total_bytes(), widths[2]),
                right(bytes_of(node, node.done_bytes(), node.total_bytes())),
                right(
                    node.throughput(now)
                        .map_or("-".into(), |r| format!("{}/s", human(r as u64))),
                ),
                right(node.eta(now).map_or("-".into(), duration)),
                right(elapsed),
                counts(theme, node, now, stall_after),
            ]
        },
    );

    let Some((name, node)) = state.selected_rollout_node() else {
        return;
    };
    let stalled: Vec<&str> = node.stalled(now, stall_after).collect();
    let cursor = state.cursor(Pane::RolloutImages);
    let title = Line::from(format!(
        " Images on {name} [{}/{}] ",
        cursor.selected.map_or(0, |(i, _)| i + 1),
        cursor.len
    ));
    let images = node.images();
    table(
        frame,
        images_area,
        theme,
        pane(theme, title, state.focus() == Pane::RolloutImages),
        &ROLLOUT_IMAGE_COLUMNS,
        cursor,
        images,
        |(image, rollout), widths| {
            let status = image_status(&rollout.state, stalled.contains(&image));
            let elapsed = match rollout.state {
                ImageState::Pulling { since, .. } => duration(now.saturating_duration_since(since)),
                ImageState::Pulled { took } => duration(took),
                ImageState::Retrying { until, .. } => {
                    format!("in {}", duration(until.saturating_duration_since(now)))
                }
                _ => "-".into(),
            };
            let retries = match rollout.retries().last() {
                Some(last) => format!("{}: {last}", rollout.retries().len()),
                None => "-".into(),
            };
            [
                Line::from(image.to_string()),
                Line::from(status_span(theme, status)),
                progress(theme, rollout.done_bytes, rollout.total_bytes, widths[2]),
                // A lazy image moved no bytes: how much of it is still in the registry instead.
                right(match rollout.state {
                    ImageState::Lazy { remote, layers } => {
                        remote_count(remote.into(), layers.into())
                    }
                    _ => bytes_of(node, rollout.done_bytes, rollout.total_bytes),
                }),
                right(elapsed),
                Line::from(retries),
            ]
        },
    );
    let image = state
        .selected(Pane::RolloutImages)
        .and_then(|i| Some((i, node.image(i)?)));
    frame.render_widget(
        Paragraph::new(image_detail(state, node, image)).wrap(Wrap { trim: true }),
        detail_area,
    );
}

/// Bytes to the nodes and over the registry link, rate and ETA over every node, and how many nodes are in
/// each state.
fn summary(state: &State) -> Line<'static> {
    let theme = &state.theme;
    let (now, stall_after) = (state.now, state.stall_after);
    let (done, total) = state.rollout.bytes();
    let rate: f64 = state
        .rollout
        .nodes()
        .values()
        .filter_map(|n| n.throughput(now))
        .sum();
    // Nodes pull in parallel: the rollout ends with its slowest node.
    let eta = state
        .rollout
        .nodes()
        .values()
        .filter_map(|n| n.eta(now))
        .max();
    // Without fan-out, every byte a node fetches crosses the registry link.
    let budget = match (state.rollout.link_rate(), &state.survey) {
        (Some(rate), Some(survey)) => format!(
            ", budget {}, {} left at it",
            human_rate(rate),
            state
                .rollout
                .link_eta(survey.link_bytes.fan_out)
                .map_or_else(String::new, clock)
        ),
        (Some(rate), None) => format!(", budget {}", human_rate(rate)),
        (None, _) => String::new(),
    };
    // Nodes whose runtime reports no pull bytes (CRI-O without its counters): their bytes moved, so 0 B
    // would be wrong.
    let unreported = state
        .rollout
        .nodes()
        .values()
        .filter(|n| matches!(n.bytes_note(), Some((false, _))))
        .count();
    // Fan-out asked, but no cache carried the bytes: every node pulled from the registry itself.
    let uncached = state.fans_out()
        && !state.steers_pulls()
        && (state.cluster_cache().is_none() || state.rollout.all_direct());
    let link = match state.rollout.link_bytes() {
        Some(link) if uncached => format!(
            "{} ({NO_CACHE}: every node pulled from the registry)",
            human(link)
        ),
        Some(link) => {
            let mut how = vec![format!("fan-out{budget}")];
            let direct = state.rollout.direct_from_source();
            if !direct.is_empty() {
                how.push(format!(
                    "{} pulled from the registry itself",
                    some_of(direct)
                ));
            }
            // What those nodes' runtimes fetched from the source themselves is not known to pinboard.
            let partly = state.rollout.partly_from_source();
            if !partly.is_empty() {
                how.push(format!(
                    "not counted: what {} took from the source",
                    some_of(partly)
                ));
            }
            format!("{} ({})", human(link), how.join("; "))
        }
        None if unreported > 0 && total == 0 => "not reported".into(),
        None => human(done),
    };
    let overall = match (unreported, total) {
        (0, _) => format!("{}/{}", human(done), human(total)),
        (_, 0) => "not reported (the runtime reports no pull bytes)".into(),
        (n, _) => format!(
            "{}/{} (not counted: {n} node(s) whose runtime reports no bytes)",
            human(done),
            human(total)
        ),
    };
    let mut spans = vec![Span::styled(
        format!(
            "overall {overall} · link {link} · {}/s · ETA {} · nodes:",
            human(rate as u64),
            eta.map_or("-".into(), duration)
        ),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    let statuses = state
        .rollout
        .nodes()
        .values()
        .map(|node| node_status(&node.state, node.stalled(now, stall_after).next().is_some()));
    spans.extend(tally(theme, statuses));
    Line::from(spans)
}

fn progress(theme: &Theme, done: u64, total: u64, width: u16) -> Line<'static> {
    let fraction = if total == 0 {
        0.0
    } else {
        done as f64 / total as f64
    };
    bar(
        width,
        &[(fraction, '█', fg(theme.tone(Tone::Active)))],
        fg(theme.role(Role::Dim)),
        &[],
    )
}

/// `✓3 ↓1 ✗1 ‖1 ·2`: a node's images by state, the ones that are there only.
fn counts(
    theme: &Theme,
    node: &NodeRollout,
    now: std::time::Instant,
    stall_after: std::time::Duration,
) -> Line<'static> {
    let stalled = node.stalled(now, stall_after).count();
    let pulling =
        node.count(|s| matches!(s, ImageState::Pulling { .. } | ImageState::Retrying { .. }));
    let groups = [
        (
            "✓",
            Tone::Ok,
            node.count(|s| {
                matches!(
                    s,
                    ImageState::Pinned { .. } | ImageState::Pulled { .. } | ImageState::Present
                )
            }),
        ),
        ("↓", Tone::Active, pulling - stalled),
        ("‖", Tone::Warn, stalled),
        (
            "~",
            Tone::Warn,
            node.count(|s| matches!(s, ImageState::Lazy { .. })),
        ),
        ("✗", Tone::Error, node.failed()),
        (
            "·",
            Tone::Idle,
            node.count(|s| {
                matches!(
                    s,
                    ImageState::Queued | ImageState::Skipped | ImageState::Cancelled
                )
            }),
        ),
    ];
    Line::from(
        groups
            .into_iter()
            .filter(|(_, _, n)| *n > 0)
            .map(|(glyph, tone, n)| Span::styled(format!("{glyph}{n} "), fg(theme.tone(tone))))
            .collect::<Vec<_>>(),
    )
}

/// `done/total` of a node or of one of its images; `not reported` where the node's runtime reports no pull
/// bytes (CRI-O without its counters), rather than 0 B for bytes that moved.
fn bytes_of(node: &NodeRollout, done: u64, total: u64) -> String {
    match node.bytes_note() {
        Some((false, _)) if total == 0 => "not reported".into(),
        _ => format!("{}/{}", human(done), human(total)),
    }
}

/// Why the selected image (or its node) is where it is: failure reason, every retry, stall.
fn image_detail(
    state: &State,
    node: &NodeRollout,
    image: Option<(&str, &ImageRollout)>,
) -> Vec<Line<'static>> {
    let theme = &state.theme;
    let error = fg(theme.tone(Tone::Error));
    let mut lines = Vec::new();
    match &node.state {
        NodeState::Refused { reason }
        | NodeState::Stopped { reason }
        | NodeState::PinFailed { reason } => {
            lines.push(Line::styled(format!("node: {reason}"), error));
        }
        NodeState::Pinned { confirmed: false, method, .. } => lines.push(Line::from(format!(
            "node: pinned (not confirmed by runtime): {} written; this runtime does not report pins",
            pin_method_label(Some(*method))
        ))),
        _ => {}
    }
    // How its bytes are known: CRI-O's counters, or why there are none, with the fix.
    if let Some((counted, note)) = node.bytes_note() {
        let tone = if counted { Tone::Idle } else { Tone::Warn };
        lines.push(Line::styled(format!("bytes: {note}"), fg(theme.tone(tone))));
    }
    if let Some((name, image)) = image {
        match &image.state {
            ImageState::Failed { reason } => {
                lines.push(Line::styled(format!("failed: {reason} (r retries)"), error))
            }
            ImageState::Lost { found } => lines.push(Line::styled(
                format!("lost since it was pinned: {found}; the node's agent puts it back"),
                error,
            )),
            ImageState::Lazy { .. } => lines.push(Line::styled(
                format!(
                    "{}: present only lazily, its layers read from the registry when first used",
                    image.state.lazy_words().unwrap_or_default()
                ),
                fg(theme.tone(Tone::Warn)),
            )),
            ImageState::Pulling { .. }
                if node
                    .stalled(state.now, state.stall_after)
                    .any(|s| s == name) =>
            {
                lines.push(Line::styled(
                    format!(
                        "stalled: no bytes for {} or more (r retries, c cancels)",
                        duration(state.stall_after)
                    ),
                    fg(theme.tone(Tone::Warn)),
                ));
            }
            _ => {}
        }
        if !image.retries().is_empty() {
            let retries: Vec<String> = image
                .retries()
                .iter()
                .enumerate()
                .map(|(i, r)| format!("{}) {r}", i + 1))
                .collect();
            lines.push(Line::from(format!("retries: {}", retries.join("  "))));
        }
    }
    lines
}

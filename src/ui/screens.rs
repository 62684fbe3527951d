//! The five screens. Each reads the state and draws into its area; tables build rows for the visible
//! window only (see [`super::widgets::table`]).

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::layout::config_areas;
use super::state::{Pane, Screen, SetDraft, State, matches};
use super::status::{Tone, image_status, node_status, pin_method_label, verdict_label};
use super::theme::{Role, Theme};
use super::widgets::{
    Column, UNKNOWN, bar, col, dim, duration, empty, fg, fit_line, flex, or_unknown, pane, right,
    status_span, table, table_title, tally,
};
use crate::model::diff::DiffKind;
use crate::model::plan::{NodePlan, Verdict};
use crate::model::reference::shorten_digests;
use crate::model::rollout::{ImageRollout, ImageState, NodeRollout, NodeState};
use crate::model::units::{human, human_signed};
use crate::survey::Survey;

const NODE_COLUMNS: [Column; 10] = [
    flex("NODE", 10),
    col("REACH", 9, 0),
    col("RUNTIME", 17, 8),
    col("CAPACITY", 10, 7),
    col("USED", 10, 9),
    col("AVAIL", 10, 0),
    col("IMAGES", 7, 6),
    col("PINNED", 7, 0),
    col("PIN METHOD", 16, 5),
    col("LAZY", 8, 0),
];

pub(super) fn nodes(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let cursor = state.cursor(Pane::Nodes);
    let filter = state.filter(Screen::Nodes);
    // In cluster mode space figures are the Node's ephemeral-storage, not the image filesystem.
    let name = match state.cluster {
        Some(_) => "Nodes (space: ephemeral-storage capacity / allocatable)",
        None => "Nodes",
    };
    let title = table_title(name, cursor, filter);
    let rows = state.nodes.iter().filter(|n| matches(&n.name, filter));
    // Warnings (a kubelet whose image GC ignores pins) get a line below the table, for the selected node.
    let (area, warning_area) = match state.nodes.iter().any(|n| n.warning.is_some()) {
        true => {
            let [table_area, warning_area] =
                Layout::vertical([Constraint::Fill(1), Constraint::Length(2)]).areas(area);
            (table_area, Some(warning_area))
        }
        false => (area, None),
    };
    table(
        frame,
        area,
        theme,
        pane(theme, title, true),
        &NODE_COLUMNS,
        cursor,
        rows,
        |n, _| {
            let (glyph, word, tone) = match n.reachable {
                Some(true) if n.warning.is_some() => ("!", "up", Tone::Warn),
                Some(true) => ("✓", "up", Tone::Ok),
                Some(false) => ("✗", "down", Tone::Error),
                None => ("?", UNKNOWN, Tone::Idle),
            };
            let lazy = match n.lazy_pulling {
                Some(true) => "on",
                Some(false) => "off",
                None => UNKNOWN,
            };
            [
                Line::from(n.name.clone()),
                Line::styled(format!("{glyph} {word}"), fg(theme.tone(tone))),
                Line::from(n.runtime.clone().unwrap_or_else(|| UNKNOWN.into())),
                right(or_unknown(n.capacity_bytes, human)),
                right(or_unknown(n.used_bytes, human)),
                right(or_unknown(n.available_bytes, human)),
                right(or_unknown(n.images, |c| c.to_string())),
                right(or_unknown(n.pinned, |c| c.to_string())),
                Line::from(pin_method_label(n.pin_method)),
                Line::from(lazy),
            ]
        },
    );
    if let Some(warning_area) = warning_area {
        let selected = state.selected(Pane::Nodes);
        let text = match state
            .nodes
            .iter()
            .find(|n| Some(n.name.as_str()) == selected)
        {
            Some(node) => node
                .warning
                .as_ref()
                .map_or_else(String::new, |w| format!("! {}: {w}", node.name)),
            None => String::new(),
        };
        let line = Line::styled(text, fg(theme.tone(Tone::Warn)));
        frame.render_widget(Paragraph::new(line).wrap(Wrap { trim: true }), warning_area);
    }
}

const ENTRY_COLUMNS: [Column; 2] = [col("OK", 2, 0), flex("REFERENCE", 20)];
const TARGET_COLUMNS: [Column; 2] = [col("ON", 3, 0), flex("NODE", 8)];
const POOL_COLUMNS: [Column; 2] = [col("ON", 3, 0), flex("POOL", 8)];

pub(super) fn sets(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let [top, problem_area] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(5)]).areas(area);
    let side = (area.width / 5).clamp(12, 24);
    let [sets_area, entries_area, targets_area] = Layout::horizontal([
        Constraint::Length(side),
        Constraint::Fill(1),
        Constraint::Length(side),
    ])
    .areas(top);

    let focus = state.focus();
    let cursor = state.cursor(Pane::Sets);
    let title = table_title("Sets", cursor, "");
    table(
        frame,
        sets_area,
        theme,
        pane(theme, title, focus == Pane::Sets),
        &[flex("NAME", 6), col("!", 1, 0)],
        cursor,
        state.sets.iter(),
        |draft, _| {
            let ok = draft.problems().is_empty();
            let (glyph, tone) = if ok {
                ("✓", Tone::Ok)
            } else {
                ("✗", Tone::Error)
            };
            [
                Line::from(draft.set.name.clone()),
                Line::styled(glyph, fg(theme.tone(tone))),
            ]
        },
    );

    let draft = state.selected_set();
    let filter = state.filter(Screen::Sets);
    let cursor = state.cursor(Pane::Entries);
    let name = draft.map_or("no set", |d| d.set.name.as_str());
    let title = table_title(name, cursor, filter);
    let entries = draft
        .into_iter()
        .flat_map(|d| d.set.entries.iter().map(move |e| (d, e)))
        .filter(|(_, e)| matches(&e.reference, filter));
    table(
        frame,
        entries_area,
        theme,
        pane(theme, title, focus == Pane::Entries),
        &ENTRY_COLUMNS,
        cursor,
        entries,
        |(draft, entry), _| {
            let (glyph, tone) = match draft.entry_problem(entry) {
                None => ("✓", Tone::Ok),
                Some(_) => ("✗", Tone::Error),
            };
            [
                Line::styled(glyph, fg(theme.tone(tone))),
                Line::from(entry.reference.clone()),
            ]
        },
    );

    let cursor = state.cursor(Pane::Targets);
    let focused = focus == Pane::Targets;
    match &state.cluster {
        Some(session) => {
            let pool = draft.and_then(SetDraft::targeted_pool);
            table(
                frame,
                targets_area,
                theme,
                pane(theme, table_title("Target pool", cursor, ""), focused),
                &POOL_COLUMNS,
                cursor,
                session.view.pools.iter(),
                |p, _| {
                    let on = pool == Some(p.name());
                    [
                        Line::from(if on { "(x)" } else { "( )" }),
                        Line::from(p.name().to_owned()),
                    ]
                },
            );
        }
        None => table(
            frame,
            targets_area,
            theme,
            pane(theme, table_title("Targets", cursor, ""), focused),
            &TARGET_COLUMNS,
            cursor,
            state.nodes.iter(),
            |node, _| {
                let on = draft.is_some_and(|d| d.targets.contains(&node.name));
                [
                    Line::from(if on { "[x]" } else { "[ ]" }),
                    Line::from(node.name.clone()),
                ]
            },
        ),
    }

    // The selected entry's rule and fix; else the set's own problems; else that it is valid.
    let selected = draft.zip(state.selected(Pane::Entries)).and_then(|(d, r)| {
        let entry = d.set.entries.iter().find(|e| e.reference == r)?;
        d.entry_problem(entry)
    });
    let error = fg(theme.tone(Tone::Error));
    let lines = match (draft, selected) {
        (None, _) => vec![dim(
            theme,
            "no set yet: n names one, i adds images, I imports a file",
        )],
        (Some(_), Some(problem)) => vec![
            Line::styled(format!("✗ {}", problem.message), error),
            Line::from(format!("  fix: {}", problem.fix)),
        ],
        (Some(d), None) => {
            let set_level: Vec<Line> = d
                .problems()
                .iter()
                .filter(|p| p.entry.is_none())
                .map(|p| Line::styled(format!("✗ {}; {}", p.message, p.fix), error))
                .collect();
            let broken = d.problems().len() - set_level.len();
            let mut lines = set_level;
            if broken > 0 {
                lines.push(Line::styled(
                    format!("✗ {broken} entry problem(s): select a ✗ entry to see its rule"),
                    error,
                ));
            }
            if lines.is_empty() {
                lines.push(Line::styled(
                    format!(
                        "✓ valid PinnedImageSet: {} image(s), {} target node(s)",
                        d.set.entries.len(),
                        d.targets.len()
                    ),
                    fg(theme.tone(Tone::Ok)),
                ));
            }
            // A release's set says which release it pins.
            if let crate::model::set::Origin::Release { .. } = &d.set.origin {
                lines.push(Line::from(format!("  from {}", d.set.origin)));
            }
            lines
        }
    };
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(pane(
            theme,
            Line::from(" Validation "),
            false,
        )),
        problem_area,
    );
}

const PLAN_COLUMNS: [Column; 7] = [
    flex("NODE", 10),
    col("VERDICT", 10, 0),
    col("AVAIL", 10, 0),
    col("AFTER", 11, 0),
    col("FETCH", 10, 2),
    col("DISK", 10, 1),
    col("USED BEFORE → AFTER", 20, 3),
];

pub(super) fn plan(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let Some(survey) = &state.survey else {
        let text = if state.surveying {
            "surveying nodes and registry…"
        } else {
            "no survey yet: p surveys every set against its target nodes"
        };
        empty(theme, frame, area, "Plan", text);
        return;
    };
    let filter = state.filter(Screen::Plan);
    let cursor = state.cursor(Pane::Plan);
    let table_height = (cursor.len as u16 + 3).clamp(5, area.height / 2);
    let [table_area, detail_area] =
        Layout::vertical([Constraint::Length(table_height), Constraint::Fill(1)]).areas(area);
    let sets: Vec<String> = survey
        .sets
        .iter()
        .map(|s| format!("{} ({})", s.name, s.images))
        .collect();
    let title = table_title("Plan", cursor, filter);
    let link = survey.link_bytes;
    let fan_out = if state.cluster.is_some() {
        ""
    } else if state.fan_out {
        " (f: on)"
    } else {
        " (f: off)"
    };
    // The link first: it is what fan-out changes, and the sets are on the Sets screen.
    let title = Line::from(format!(
        "{title}link: {} direct, {} with fan-out{fan_out} · sets: {} ",
        human(link.direct),
        human(link.fan_out),
        sets.join(", "),
    ));
    let rows = survey.nodes.iter().filter(|n| matches(&n.node, filter));
    table(
        frame,
        table_area,
        theme,
        pane(theme, title, true),
        &PLAN_COLUMNS,
        cursor,
        rows,
        |n, widths| {
            let verdict = fg(theme.verdict(n.verdict));
            [
                Line::from(n.node.clone()),
                Line::styled(verdict_label(n.verdict), verdict),
                right(or_unknown(n.available_bytes, human)),
                right(or_unknown(n.available_after_bytes, human_signed)),
                right(human(n.fetch_bytes)),
                right(human(n.estimated_disk_bytes)),
                disk_bar(theme, survey, n, true, widths[6]),
            ]
        },
    );
    let node = state
        .selected(Pane::Plan)
        .and_then(|name| survey.nodes.iter().find(|n| n.node == name));
    if let Some(node) = node {
        plan_detail(state, frame, detail_area, survey, node);
    }
}

/// Used space before (`█`) and what the plan adds (`▓`, verdict color); `│` GC threshold, `┃` floor.
fn disk_bar(
    theme: &Theme,
    survey: &Survey,
    node: &NodePlan,
    after: bool,
    width: u16,
) -> Line<'static> {
    let (Some(capacity), Some(available)) = (node.capacity_bytes, node.available_bytes) else {
        return Line::from(UNKNOWN);
    };
    let capacity = capacity.max(1) as f64;
    let used = (capacity - available as f64) / capacity;
    let added = if after {
        node.estimated_disk_bytes as f64 / capacity
    } else {
        0.0
    };
    let floor = 1.0 - survey.min_free_bytes as f64 / capacity;
    let gc = f64::from(node.gc_high_percent) / 100.0;
    bar(
        width,
        &[
            (used, '█', Style::new()),
            (added, '▓', fg(theme.verdict(node.verdict))),
        ],
        fg(theme.role(Role::Dim)),
        &[(gc, '│'), (floor, '┃')],
    )
}

fn plan_detail(state: &State, frame: &mut Frame, area: Rect, survey: &Survey, node: &NodePlan) {
    let theme = &state.theme;
    let block = pane(theme, Line::from(format!(" {} ", node.node)), false);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let verdict = fg(theme.verdict(node.verdict)).add_modifier(Modifier::BOLD);
    let percent = |free: Option<i64>| match (node.capacity_bytes, free) {
        (Some(c), Some(f)) if c > 0 => {
            format!("{:.0}% used", (c as i64 - f) as f64 * 100.0 / c as f64)
        }
        _ => format!("{UNKNOWN} use"),
    };
    let bar_width = inner.width.saturating_sub(34).min(60);
    let before_free = node.available_bytes.map(|a| a as i64);
    let mut lines = vec![
        Line::from(vec![
            Span::styled(verdict_label(node.verdict), verdict),
            Span::raw(format!(
                "  {}  capacity {}  fetch {}  disk +{} ({})",
                node.runtime.as_deref().unwrap_or(UNKNOWN),
                or_unknown(node.capacity_bytes, human),
                human(node.fetch_bytes),
                human(node.estimated_disk_bytes),
                serde_json::to_value(node.estimate_basis)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )),
            Span::raw(
                node.space_source
                    .map(|s| format!("  space: {}", s.label()))
                    .unwrap_or_default(),
            ),
        ]),
        bar_line(
            "before ",
            disk_bar(theme, survey, node, false, bar_width),
            percent(before_free),
            or_unknown(node.available_bytes, human),
        ),
        bar_line(
            "after  ",
            disk_bar(theme, survey, node, true, bar_width),
            percent(node.available_after_bytes),
            or_unknown(node.available_after_bytes, human_signed),
        ),
        dim(
            theme,
            format!(
                "        │ GC threshold {}% ({})   ┃ floor: {} free (--min-free)",
                node.gc_high_percent,
                node.gc_high_source.short(),
                human(survey.min_free_bytes)
            ),
        ),
    ];
    let reason_style = match node.verdict {
        Verdict::Fits => Style::new(),
        other => fg(theme.verdict(other)),
    };
    lines.extend(
        node.reasons
            .iter()
            .map(|r| Line::styled(format!("reason: {r}"), reason_style)),
    );
    let present = node
        .images
        .iter()
        .filter(|i| i.present == Some(true))
        .count();
    lines.push(Line::styled(
        format!("images: {present} of {} already present", node.images.len()),
        Style::new().add_modifier(Modifier::BOLD),
    ));
    let room = usize::from(inner.height).saturating_sub(lines.len());
    lines.extend(node.images.iter().take(room).map(|image| {
        let (glyph, word, style) = match image.present {
            Some(true) => ("=", "present", fg(theme.tone(Tone::Ok))),
            Some(false) => ("↓", "fetch", Style::new()),
            None => ("?", "maybe", fg(theme.verdict(Verdict::Unknown))),
        };
        Line::from(vec![
            Span::styled(format!("{glyph} {word:<8}"), style),
            Span::raw(format!(
                "{:>11}  {}",
                human(image.fetch_bytes),
                image.reference
            )),
        ])
    }));
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|l| fit_line(l, inner.width))
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

fn bar_line(
    label: &'static str,
    bar: Line<'static>,
    percent: String,
    free: String,
) -> Line<'static> {
    let mut spans = vec![Span::raw(label), Span::raw("[")];
    spans.extend(bar.spans);
    spans.push(Span::raw(format!("] {percent}, {free} free")));
    Line::from(spans)
}

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

pub(super) fn rollout(state: &State, frame: &mut Frame, area: Rect) {
    if let Some(session) = &state.cluster {
        return super::screens_cluster::rollout(state, session, frame, area);
    }
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
    let rows = state
        .rollout_order
        .iter()
        .filter(|n| matches(n, filter))
        .map(|name| (name, &state.rollout.nodes()[name]));
    table(
        frame,
        nodes_area,
        theme,
        pane(
            theme,
            table_title("Nodes", cursor, filter),
            state.focus() == Pane::RolloutNodes,
        ),
        &ROLLOUT_NODE_COLUMNS,
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
                right(format!(
                    "{}/{}",
                    human(node.done_bytes()),
                    human(node.total_bytes())
                )),
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
                right(format!(
                    "{}/{}",
                    human(rollout.done_bytes),
                    human(rollout.total_bytes)
                )),
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
    let link = match state.rollout.link_bytes() {
        Some(link) => format!("{} (fan-out)", human(link)),
        None => human(done),
    };
    let mut spans = vec![Span::styled(
        format!(
            "overall {}/{} · link {link} · {}/s · ETA {} · nodes:",
            human(done),
            human(total),
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
            super::status::pin_method_label(Some(*method))
        ))),
        _ => {}
    }
    if let Some((name, image)) = image {
        match &image.state {
            ImageState::Failed { reason } => {
                lines.push(Line::styled(format!("failed: {reason} (r retries)"), error))
            }
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

pub(super) fn config(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    if state.config.is_empty() {
        let text = "no configuration yet: it shows once a set is applied or planned";
        empty(theme, frame, area, "Config", text);
        return;
    }
    let [list_area, diff_area] = config_areas(area);
    let focus = state.focus();
    let filter = state.filter(Screen::Config);
    let cursor = state.cursor(Pane::Config);
    let rows = state
        .config
        .iter()
        .filter(|(name, _)| matches(name, filter));
    table(
        frame,
        list_area,
        theme,
        pane(
            theme,
            table_title("Nodes", cursor, filter),
            focus == Pane::Config,
        ),
        &[flex("NODE", 6), col("±", 7, 0)],
        cursor,
        rows,
        |(name, view), _| {
            let changed = |kind| view.lines.iter().filter(|(k, _)| *k == kind).count();
            [
                Line::from(name.clone()),
                right(format!(
                    "+{} -{}",
                    changed(DiffKind::Added),
                    changed(DiffKind::Removed)
                )),
            ]
        },
    );
    let Some(view) = state.selected(Pane::Config).map(|n| &state.config[n]) else {
        return;
    };
    let focused = focus == Pane::ConfigDiff;
    let mut block = pane(theme, Line::from(format!(" {} ", view.path)), focused);
    let inner = block.inner(diff_area);
    // What is in force heads the pane and stays while the diff scrolls below it.
    let notes: Vec<Line> = view
        .notes
        .iter()
        .map(|note| {
            if note.warning {
                Line::styled(format!("! {}", note.text), fg(theme.tone(Tone::Warn)))
            } else {
                Line::styled(format!("  {}", note.text), fg(theme.role(Role::Dim)))
            }
        })
        .map(|line| fit_line(line, inner.width))
        .collect();
    // Taller than the pane: the lines shown, and how to see the rest, in the bottom border (the path
    // fills the top one on narrow terminals).
    let rows = usize::from(inner.height).saturating_sub(notes.len());
    let total = view.lines.len();
    let first = state.diff_scroll().min(total.saturating_sub(rows));
    if total > rows {
        let how = if focused {
            "↑/↓ PgUp/PgDn g/G scroll"
        } else {
            "Tab, then ↑/↓ scroll"
        };
        let shown = format!(
            " lines {}–{} of {total} · {how} ",
            first + 1,
            (first + rows).min(total)
        );
        block = block.title_bottom(Line::from(shown));
    }
    let lines: Vec<Line> = notes
        .into_iter()
        .chain(
            view.lines[first..]
                .iter()
                .take(rows)
                // Digests cut short, so that what follows a reference (who holds it) stays in view.
                .map(|(kind, text)| (kind, shorten_digests(text)))
                .map(|(kind, text)| match kind {
                    DiffKind::Added => {
                        Line::styled(format!("+ {text}"), fg(theme.role(Role::Added)))
                    }
                    DiffKind::Removed => {
                        Line::styled(format!("- {text}"), fg(theme.role(Role::Removed)))
                    }
                    DiffKind::Same => Line::from(format!("  {text}")),
                })
                .map(|line| fit_line(line, inner.width)),
        )
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block), diff_area);
}

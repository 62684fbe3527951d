//! The Plan screen: the survey's verdict per node with its space before and after, what crosses the
//! registry link with and without fan-out, and the selected node's detail: disk bars, reasons, and which
//! images are already there.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::model::plan::{NodePlan, Verdict};
use crate::model::units::{human, human_signed};
use crate::ui::state::{Pane, Screen, State, matches};
use crate::ui::status::{Tone, verdict_label};
use crate::ui::theme::{Role, Theme};
use crate::ui::widgets::{
    Column, UNKNOWN, bar, col, dim, empty, fg, fit_line, flex, longest, or_unknown, pane, right,
    sized_to, table, table_title,
};

const PLAN_COLUMNS: [Column; 7] = [
    flex("NODE", 10),
    col("VERDICT", 10, 0),
    col("AVAIL", 10, 0),
    col("AFTER", 11, 0),
    col("FETCH", 10, 2),
    col("DISK", 10, 1),
    col("USED BEFORE → AFTER", 20, 3),
];

pub(in crate::ui) fn draw(state: &State, frame: &mut Frame, area: Rect) {
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
    let fan_out = if !state.fans_out() {
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
        &sized_to(
            PLAN_COLUMNS,
            longest(survey.nodes.iter().map(|n| n.node.as_str())),
        ),
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
                disk_bar(theme, n, true, widths[6]),
            ]
        },
    );
    let node = state
        .selected(Pane::Plan)
        .and_then(|name| survey.nodes.iter().find(|n| n.node == name));
    if let Some(node) = node {
        plan_detail(state, frame, detail_area, node);
    }
}

/// Used space before (`█`) and what the plan adds (`▓`, verdict color); `│` GC threshold, `┃` floor.
fn disk_bar(theme: &Theme, node: &NodePlan, after: bool, width: u16) -> Line<'static> {
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
    let floor = 1.0 - node.min_free_bytes as f64 / capacity;
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

fn plan_detail(state: &State, frame: &mut Frame, area: Rect, node: &NodePlan) {
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
            disk_bar(theme, node, false, bar_width),
            percent(before_free),
            or_unknown(node.available_bytes, human),
        ),
        bar_line(
            "after  ",
            disk_bar(theme, node, true, bar_width),
            percent(node.available_after_bytes),
            or_unknown(node.available_after_bytes, human_signed),
        ),
        dim(
            theme,
            format!(
                "        │ GC threshold {}% ({})   ┃ floor: {} free ({})",
                node.gc_high_percent,
                node.gc_high_source.short(),
                human(node.min_free_bytes),
                node.min_free_source.short()
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
        let (glyph, word, style) = match (image.present, &image.lazy) {
            // Its remote layers still come over the link: the line says how many.
            (Some(true), Some(_)) => ("~", "lazy", fg(theme.tone(Tone::Warn))),
            (Some(true), None) => ("=", "present", fg(theme.tone(Tone::Ok))),
            (Some(false), _) => ("↓", "fetch", Style::new()),
            (None, _) => ("?", "maybe", fg(theme.verdict(Verdict::Unknown))),
        };
        let remote = image
            .lazy
            .as_ref()
            .map_or_else(String::new, |lazy| format!(" ({})", lazy.count()));
        Line::from(vec![
            Span::styled(format!("{glyph} {word:<8}"), style),
            Span::raw(format!(
                "{:>11}  {}{remote}",
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

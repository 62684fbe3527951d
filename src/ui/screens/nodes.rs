//! The Nodes screen: one row per node (reachability, runtime, space, images, pins, pin method, lazy
//! pulling), and below the table the selected node's warning when any node has one.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};

use crate::model::lazy::LazyPulling;
use crate::model::units::human;
use crate::ui::state::{Pane, Screen, State, matches};
use crate::ui::status::{Tone, pin_method_label};
use crate::ui::widgets::{
    Column, UNKNOWN, col, fg, flex, longest, or_unknown, pane, right, sized_to, table, table_title,
};

const NODE_COLUMNS: [Column; 10] = [
    flex("NODE", 8),
    col("REACH", 9, 0),
    // `containerd 1.6.20~ds1`, `cri-o 1.31.0`: whole.
    col("RUNTIME", 21, 8),
    col("CAPACITY", 10, 7),
    col("USED", 10, 9),
    col("AVAIL", 10, 0),
    col("IMAGES", 7, 6),
    col("PINNED", 7, 0),
    col("PIN METHOD", 16, 5),
    col("LAZY", 21, 0),
];

pub(in crate::ui) fn draw(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let cursor = state.cursor(Pane::Nodes);
    let filter = state.filter(Screen::Nodes);
    // On OpenShift, space figures are the Node's ephemeral-storage, not the image filesystem.
    let name = match state.machine_config {
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
        &sized_to(
            NODE_COLUMNS,
            longest(state.nodes.iter().map(|n| n.name.as_str())),
        ),
        cursor,
        rows,
        |n, _| {
            let (glyph, word, tone) = match n.reachable {
                Some(true) if n.warning.is_some() => ("!", "up", Tone::Warn),
                Some(true) => ("✓", "up", Tone::Ok),
                Some(false) => ("✗", "down", Tone::Error),
                None => ("?", UNKNOWN, Tone::Idle),
            };
            let lazy = n.lazy_pulling.as_ref().map_or(UNKNOWN, LazyPulling::short);
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

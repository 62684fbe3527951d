//! The Config screen: per node, what pinning writes against what is there; the notes on what is in force
//! head the diff, which scrolls below them.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::model::diff::DiffKind;
use crate::model::reference::shorten_digests;
use crate::ui::layout::config_areas;
use crate::ui::state::{Pane, Screen, State, matches};
use crate::ui::status::Tone;
use crate::ui::theme::Role;
use crate::ui::widgets::{col, empty, fg, fit_line, flex, pane, right, table, table_title};

pub(in crate::ui) fn draw(state: &State, frame: &mut Frame, area: Rect) {
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

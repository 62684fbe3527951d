//! The pieces the screens are drawn with: panes, tables that build rows for the visible window only,
//! lines cut to fit, bars, and how figures, durations and status counts read.

use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table};

use super::state::Cursor;
use super::status::Status;
use super::theme::{Role, Theme};

pub(super) fn fg(color: Color) -> Style {
    Style::new().fg(color)
}

/// `✓ pinned` in its tone's color.
pub(super) fn status_span(theme: &Theme, status: Status) -> Span<'static> {
    Span::styled(
        format!("{} {}", status.glyph, status.word),
        fg(theme.tone(status.tone)),
    )
}

/// A pane: bordered, its title in the accent color when it has the focus.
pub(super) fn pane<'a>(theme: &Theme, title: Line<'a>, focused: bool) -> Block<'a> {
    let color = if focused {
        theme.role(Role::Accent)
    } else {
        theme.role(Role::Dim)
    };
    Block::bordered().title(title).border_style(fg(color))
}

/// One column of a table: its natural width, whether it takes the room left, and how early it is hidden
/// when the terminal is narrow (0: never, higher: earlier).
#[derive(Clone, Copy, Debug)]
pub(super) struct Column {
    pub title: &'static str,
    pub width: u16,
    pub flex: bool,
    pub drop: u8,
    /// The most a flexible column grows to: its longest cell ([`sized_to`]).
    pub most: u16,
}

pub(super) const fn col(title: &'static str, width: u16, drop: u8) -> Column {
    Column {
        title,
        width,
        flex: false,
        drop,
        most: width,
    }
}

pub(super) const fn flex(title: &'static str, width: u16) -> Column {
    Column {
        title,
        width,
        flex: true,
        drop: 0,
        most: u16::MAX,
    }
}

/// The most characters of any of `names`.
pub(super) fn longest<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(|n| n.chars().count()).max().unwrap_or(0)
}

/// `columns` with their flexible column grown only as wide as its longest cell, `longest` characters (a
/// node's name): two-letter names do not take half the screen; the space left stays on the right.
pub(super) fn sized_to<const N: usize>(mut columns: [Column; N], longest: usize) -> [Column; N] {
    for column in columns.iter_mut().filter(|c| c.flex) {
        let longest = u16::try_from(longest).unwrap_or(u16::MAX).saturating_add(1);
        column.most = longest.max(column.width);
    }
    columns
}

/// Each column's width in `width` cells (0: hidden): hides the least important until the rest fit, then
/// gives the flexible column what is left.
fn fit_columns<const N: usize>(columns: &[Column; N], width: u16) -> [u16; N] {
    let mut widths = columns.map(|c| c.width);
    let total = |w: &[u16; N]| {
        let shown = w.iter().filter(|w| **w > 0).count() as u16;
        w.iter().sum::<u16>() + shown.saturating_sub(1)
    };
    while total(&widths) > width {
        let Some(drop) = (0..N)
            .filter(|i| widths[*i] > 0 && columns[*i].drop > 0)
            .max_by_key(|i| (columns[*i].drop, *i))
        else {
            break;
        };
        widths[drop] = 0;
    }
    if let Some(f) = (0..N).find(|i| columns[*i].flex && widths[*i] > 0) {
        let used = total(&widths);
        widths[f] = if used <= width {
            (widths[f] + (width - used)).min(columns[f].most)
        } else {
            widths[f].saturating_sub(used - width).max(1)
        };
    }
    widths
}

/// The line cut to `width` cells with `…` where it was cut.
pub(super) fn fit_line(line: Line<'_>, width: u16) -> Line<'_> {
    let width = usize::from(width);
    if line.width() <= width {
        return line;
    }
    let mut left = width.saturating_sub(1);
    let mut spans = Vec::with_capacity(line.spans.len() + 1);
    for span in line.spans {
        let chars = span.content.chars().count();
        if chars <= left {
            left -= chars;
            spans.push(span);
        } else {
            let cut: String = span.content.chars().take(left).collect();
            spans.push(Span::styled(cut, span.style));
            break;
        }
    }
    spans.push(Span::raw("…"));
    Line {
        spans,
        style: line.style,
        alignment: line.alignment,
    }
}

/// The first visible row: keeps the selected row in view, centered once the list scrolls.
fn window_offset(selected: usize, len: usize, height: usize) -> usize {
    if len <= height {
        return 0;
    }
    selected.saturating_sub(height / 2).min(len - height)
}

/// A table in a pane, with rows only for the visible window of `items` (which must yield `cursor.len`
/// items in display order). `cells` gets each visible item and the column widths.
#[allow(clippy::too_many_arguments)] // Each is a different part of the table; a struct would only rename them.
pub(super) fn table<'a, T, const N: usize>(
    frame: &mut Frame,
    area: Rect,
    theme: &Theme,
    block: Block<'a>,
    columns: &[Column; N],
    cursor: Cursor<'_>,
    items: impl Iterator<Item = T>,
    mut cells: impl FnMut(T, &[u16; N]) -> [Line<'a>; N],
) {
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let widths = fit_columns(columns, inner.width);
    let height = usize::from(inner.height.saturating_sub(1));
    let selected = cursor.selected.map(|(i, _)| i);
    let offset = window_offset(selected.unwrap_or(0), cursor.len, height);
    let shown = |w: &u16| *w > 0;
    let header = Row::new(
        columns
            .iter()
            .zip(widths)
            .filter(|(_, w)| shown(w))
            .map(|(c, w)| fit_line(Line::from(c.title), w)),
    )
    .style(fg(theme.role(Role::Accent)).add_modifier(Modifier::BOLD));
    let rows = items
        .skip(offset)
        .take(height)
        .enumerate()
        .map(|(i, item)| {
            let line = cells(item, &widths);
            let row = Row::new(
                line.into_iter()
                    .zip(widths)
                    .filter(|(_, w)| shown(w))
                    .map(|(l, w)| fit_line(l, w)),
            );
            if Some(offset + i) == selected {
                row.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                row
            }
        });
    let constraints = widths.into_iter().filter(shown).map(Constraint::Length);
    frame.render_widget(
        Table::new(rows, constraints)
            .header(header)
            .column_spacing(1),
        inner,
    );
}

/// `Nodes [2/3] /n2`: the pane's title with position and filter.
pub(super) fn table_title<'a>(name: &'a str, cursor: Cursor<'_>, filter: &str) -> Line<'a> {
    let position = cursor.selected.map_or(0, |(i, _)| i + 1);
    let mut text = format!(" {name} [{position}/{}]", cursor.len);
    if !filter.is_empty() {
        text.push_str(&format!(" /{filter}"));
    }
    text.push(' ');
    Line::from(text)
}

/// `1h02m`, `3m05s`, `42s`.
pub(super) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A bar of `width` cells: `parts` are (fraction of the whole, glyph, style) drawn in order, the rest is
/// `░`; `markers` (fraction, glyph) replace the cell at their position (thresholds).
pub(super) fn bar(
    width: u16,
    parts: &[(f64, char, Style)],
    rest: Style,
    markers: &[(f64, char)],
) -> Line<'static> {
    let width = usize::from(width);
    if width == 0 {
        return Line::default();
    }
    let mut cells: Vec<(char, Style)> = Vec::with_capacity(width);
    for (fraction, glyph, style) in parts {
        let n = (fraction.clamp(0.0, 1.0) * width as f64).round() as usize;
        let n = n.min(width - cells.len());
        cells.extend(std::iter::repeat_n((*glyph, *style), n));
    }
    cells.resize(width, ('░', rest));
    for (fraction, glyph) in markers {
        let at = (fraction.clamp(0.0, 1.0) * width as f64) as usize;
        cells[at.min(width - 1)].0 = *glyph;
    }
    let mut spans: Vec<Span<'static>> = Vec::new();
    for (glyph, style) in cells {
        match spans.last_mut() {
            Some(span) if span.style == style => span.content.to_mut().push(glyph),
            _ => spans.push(Span::styled(glyph.to_string(), style)),
        }
    }
    Line::from(spans)
}

/// What a figure that could not be read shows.
pub(super) const UNKNOWN: &str = "unknown";

/// `value` as `show` writes it, or [`UNKNOWN`].
pub(super) fn or_unknown<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| UNKNOWN.to_string(), show)
}

/// A right-aligned cell: figures line up by their last digit.
pub(super) fn right(text: String) -> Line<'static> {
    Line::from(text).right_aligned()
}

/// A line in the theme's dim color.
pub(super) fn dim(theme: &Theme, text: impl Into<String>) -> Line<'static> {
    Line::styled(text.into(), fg(theme.role(Role::Dim)))
}

/// A screen with nothing to show yet, saying how to get something.
pub(super) fn empty(theme: &Theme, frame: &mut Frame, area: Rect, title: &str, text: &str) {
    let block = pane(theme, Line::from(format!(" {title} ")), true);
    frame.render_widget(Paragraph::new(dim(theme, text)).block(block), area);
}

/// ` ✓ 3 pinned ↓ 1 pulling`: how many of `statuses` there are of each, in first-seen order.
pub(super) fn tally(theme: &Theme, statuses: impl Iterator<Item = Status>) -> Vec<Span<'static>> {
    let mut counts: Vec<(Status, usize)> = Vec::new();
    for status in statuses {
        match counts.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => counts.push((status, 1)),
        }
    }
    counts
        .into_iter()
        .map(|(status, n)| {
            Span::styled(
                format!(" {} {n} {}", status.glyph, status.word),
                fg(theme.tone(status.tone)),
            )
        })
        .collect()
}

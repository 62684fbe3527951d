//! Where things go on the terminal, for drawing and for `update` alike: the frame's areas, the Config
//! screen's split, how help flows into columns and how far a page moves. `update` scrolls by these and
//! render draws into them, so the two cannot disagree.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::widgets::{Block, Borders};

use super::keymap::help_lines;
use super::state::State;

/// Help's lines flow into columns at least this wide; what does not fit then scrolls.
const HELP_COLUMN_WIDTH: u16 = 36;

/// The tab bar, the screen (or help), the message line and the status line.
pub(super) fn frame_areas(area: Rect) -> [Rect; 4] {
    Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area)
}

/// Lines the Config screen's diff shows in a terminal of `size` (width × height): how far it scrolls.
pub(super) fn diff_rows((width, height): (u16, u16)) -> usize {
    let [_, body, _, _] = frame_areas(Rect::new(0, 0, width, height));
    let [_, diff] = config_areas(body);
    usize::from(Block::bordered().inner(diff).height)
}

/// How help's lines flow into its area: lines per column, columns, and how far they scroll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HelpFlow {
    pub rows: usize,
    pub columns: usize,
    pub max_scroll: usize,
}

impl HelpFlow {
    /// As many columns as the lines need; if fewer fit, as many as fit, and the rest scrolls.
    pub(super) fn new(lines: usize, inner: Rect) -> HelpFlow {
        let rows = usize::from(inner.height.max(1));
        let needed = lines.div_ceil(rows);
        let fit = usize::from(inner.width / HELP_COLUMN_WIDTH).max(1);
        if needed <= fit {
            return HelpFlow {
                rows,
                columns: needed,
                max_scroll: 0,
            };
        }
        HelpFlow {
            rows,
            columns: fit,
            max_scroll: lines - rows * fit,
        }
    }

    /// How help flows in the terminal size `update` last heard of.
    pub(super) fn for_state(state: &State) -> HelpFlow {
        let (width, height) = state.size;
        let [_, body, _, _] = frame_areas(Rect::new(0, 0, width, height));
        HelpFlow::new(help_lines().count(), help_block().inner(body))
    }

    /// Lines a page moves: all that are shown.
    pub(super) fn page(self) -> usize {
        self.rows * self.columns
    }
}

/// Help's pane: a rule with its title above the columns.
pub(super) fn help_block() -> Block<'static> {
    Block::new().borders(Borders::TOP)
}

/// The Config screen's node list and diff.
pub(super) fn config_areas(area: Rect) -> [Rect; 2] {
    let side = (area.width / 4).clamp(12, 28);
    Layout::horizontal([Constraint::Length(side), Constraint::Fill(1)]).areas(area)
}

/// Rows PgUp/PgDn move in a terminal `height` rows tall: about what a full-height table shows.
pub(super) fn page_rows(height: u16) -> usize {
    usize::from(height.saturating_sub(8)).max(1)
}

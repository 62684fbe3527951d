//! The Sets screen: the sets being composed, the selected set's entries, the nodes it targets (in cluster
//! mode, its pool), and what its validation says.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};

use crate::ui::state::{Pane, Screen, SetDraft, State, matches};
use crate::ui::status::Tone;
use crate::ui::widgets::{Column, col, dim, fg, flex, pane, table, table_title};

const ENTRY_COLUMNS: [Column; 2] = [col("OK", 2, 0), flex("REFERENCE", 20)];
const TARGET_COLUMNS: [Column; 2] = [col("ON", 3, 0), flex("NODE", 8)];
const POOL_COLUMNS: [Column; 2] = [col("ON", 3, 0), flex("POOL", 8)];

pub(in crate::ui) fn draw(state: &State, frame: &mut Frame, area: Rect) {
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
    match state
        .machine_config
        .as_ref()
        .filter(|_| state.targets_pools())
    {
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

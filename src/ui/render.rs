//! Drawing: the frame around every screen (tabs, message line, status line, help, confirmation); the
//! screens draw themselves with [`super::widgets`]. Reads the state only.

use ratatui::Frame;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::keymap::{self, Action, Binding, HelpLine, KEYMAP};
use super::layout::{HelpFlow, frame_areas, help_block};
use super::screens;
use super::state::NO_CACHE;
use super::state::{Mode, Screen, State};
use super::status::Tone;
use super::theme::Role;
use super::widgets::{fg, fit_line};
use crate::model::machine_config::Connection;

/// Draws the whole UI.
pub fn render(state: &State, frame: &mut Frame) {
    let [tabs_area, body, message, status] = frame_areas(frame.area());
    tabs(state, frame, tabs_area);
    if state.mode() == &Mode::Help {
        help(state, frame, body);
    } else {
        match state.screen() {
            Screen::Nodes => screens::nodes::draw(state, frame, body),
            Screen::Sets => screens::sets::draw(state, frame, body),
            Screen::Plan => screens::plan::draw(state, frame, body),
            Screen::Rollout => match &state.machine_config {
                Some(session) => screens::rollout_cluster::draw(state, session, frame, body),
                None => screens::rollout::draw(state, frame, body),
            },
            Screen::Config => screens::config::draw(state, frame, body),
        }
    }
    message_line(state, frame, message);
    status_line(state, frame, status);
    if let Mode::Confirm(confirm) = state.mode() {
        let skipped = match confirm.skips_no_space {
            true => confirm.no_space.len(),
            false => 0,
        };
        let ready = confirm.nodes.len() - skipped;
        let question = if confirm.unpin {
            format!(
                "unpin set {} from {ready} node(s)? y/n (images stay)",
                confirm.set
            )
        } else {
            format!("apply set {} to {ready} node(s)? y/n", confirm.set)
        };
        let mut lines = vec![Line::from(question)];
        if !confirm.unpin && state.fans_out() {
            let cache = state.cluster_cache().is_some();
            lines.push(Line::from(
                match (confirm.fan_out, state.steers_pulls(), cache) {
                    (true, true, _) => "fan-out on: every blob crosses the registry link once".into(),
                    (true, false, true) => {
                        "fan-out on: through the in-cluster cache, each blob once".into()
                    }
                    (true, false, false) => format!(
                        "fan-out on, but {NO_CACHE}: each node pulls from the registry after waiting 60 s"
                    ),
                    (false, ..) => "fan-out off: each node pulls from the registry (f on Plan)".into(),
                },
            ));
        }
        match (confirm.no_space.is_empty(), confirm.skips_no_space) {
            (true, _) => {}
            (false, true) => lines.push(Line::from(format!(
                "will be skipped (no-space): {}; F to force",
                confirm.no_space.join(", ")
            ))),
            (false, false) => lines.push(Line::from(format!(
                "no room by the plan: {}; the daemons will fail there",
                confirm.no_space.join(", ")
            ))),
        }
        popup(state, frame, "confirm", lines);
    }
}

/// The UI drawn into a buffer of the given size: for tests, screenshots and benchmarks.
pub fn render_to_buffer(state: &State, width: u16, height: u16) -> Buffer {
    let mut terminal =
        Terminal::new(TestBackend::new(width, height)).expect("a test backend never fails");
    terminal
        .draw(|frame| render(state, frame))
        .expect("a test backend never fails");
    terminal.backend().buffer().clone()
}

/// A buffer's text, one line per row without trailing spaces: what snapshots and tests compare.
pub fn buffer_text(buffer: &Buffer) -> String {
    let width = usize::from(buffer.area.width);
    let symbols: Vec<&str> = buffer.content().iter().map(|c| c.symbol()).collect();
    symbols
        .chunks(width)
        .map(|row| row.concat().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn tabs(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let mut spans = vec![Span::styled(
        " pinboard ",
        fg(theme.role(Role::Accent)).add_modifier(Modifier::BOLD),
    )];
    for (n, screen) in Screen::ALL.iter().enumerate() {
        let label = format!(" {} {} ", n + 1, title(*screen));
        spans.push(if *screen == state.screen() {
            Span::styled(label, Style::new().add_modifier(Modifier::REVERSED))
        } else {
            Span::styled(label, fg(theme.role(Role::Dim)))
        });
    }
    frame.render_widget(fit_line(Line::from(spans), area.width), area);
}

fn title(screen: Screen) -> &'static str {
    match screen {
        Screen::Nodes => "Nodes",
        Screen::Sets => "Sets",
        Screen::Plan => "Plan",
        Screen::Rollout => "Rollout",
        Screen::Config => "Config",
    }
}

/// Input boxes, the filter being typed, or the last flash message.
fn message_line(state: &State, frame: &mut Frame, area: Rect) {
    let accent = fg(state.theme.role(Role::Accent));
    let line = match state.mode() {
        Mode::Command(text) => {
            Line::from(vec![Span::styled(":", accent), Span::raw(text), cursor()])
        }
        Mode::Filter => Line::from(vec![
            Span::styled("/", accent),
            Span::raw(state.filter(state.screen())),
            cursor(),
        ]),
        Mode::Input { prompt, text } => {
            // Pasted lists are long: keep the end, where typing happens, in view.
            let text = text.replace('\n', " ");
            let label = format!("{}: ", prompt.label());
            let room = usize::from(area.width).saturating_sub(label.chars().count() + 2);
            let skip = text.chars().count().saturating_sub(room);
            let tail: String = text.chars().skip(skip).collect();
            Line::from(vec![
                Span::styled(label, accent),
                Span::raw(if skip > 0 { "…" } else { "" }),
                Span::raw(tail),
                cursor(),
            ])
        }
        Mode::Help => Line::styled("Esc or ? closes help", accent),
        Mode::Normal | Mode::Confirm(_) => match (state.flash(), state.filter(state.screen())) {
            (Some(text), _) => Line::styled(text.to_string(), accent),
            (None, "") => Line::default(),
            (None, filter) => Line::styled(format!("filter /{filter} (Esc clears)"), accent),
        },
    };
    frame.render_widget(fit_line(line, area.width), area);
}

fn cursor() -> Span<'static> {
    Span::styled(" ", Style::new().add_modifier(Modifier::REVERSED))
}

/// Target, connection, read-only, then the keys that matter on this screen.
fn status_line(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let reachable = state
        .nodes
        .iter()
        .filter(|n| n.reachable == Some(true))
        .count();
    let total = state.nodes.len();
    let (glyph, tone) = match reachable {
        _ if total == 0 => ("?", Tone::Idle),
        r if r == total => ("●", Tone::Ok),
        0 => ("✗", Tone::Error),
        _ => ("!", Tone::Warn),
    };
    let mut spans = vec![
        Span::raw(format!(" {} ", state.target)),
        Span::styled(
            format!("{glyph} {reachable}/{total} reachable "),
            fg(theme.tone(tone)),
        ),
    ];
    if let Some(session) = &state.machine_config {
        let connection = session.view.connection();
        let tone = match connection {
            Connection::Synced => Tone::Ok,
            Connection::Connecting => Tone::Active,
            Connection::Reconnecting { .. } => Tone::Warn,
        };
        spans.push(Span::styled(
            format!("API {connection} "),
            fg(theme.tone(tone)),
        ));
    }
    if state.readonly {
        spans.push(Span::styled(
            "read-only ",
            fg(theme.tone(Tone::Warn)).add_modifier(Modifier::BOLD),
        ));
    }
    if state.surveying {
        spans.push(Span::styled("surveying… ", fg(theme.tone(Tone::Active))));
    }
    spans.push(Span::styled("│", fg(theme.role(Role::Dim))));
    // The daemons and agents pull on their nodes: nothing to retry or cancel here; fan out only through
    // pinboard's or the agents' cache; only agents are asked to check now.
    let engine_only = |b: &&Binding| {
        (!state.steers_pulls() && matches!(b.action, Action::Retry | Action::Cancel))
            || (!state.fans_out() && b.action == Action::ToggleFanOut)
            || (!state.on_agents() && b.action == Action::CheckNow)
    };
    let shown = KEYMAP
        .iter()
        .filter(|b| b.applies_to(state.screen()) && !engine_only(b))
        .filter_map(|b| Some((b, b.status?)));
    for (binding, name) in shown {
        spans.push(Span::styled(
            format!(" {}", binding.keys_label()),
            fg(theme.role(Role::Accent)),
        ));
        spans.push(Span::raw(format!(" {name}")));
    }
    frame.render_widget(
        fit_line(Line::from(spans), area.width).style(Style::new().add_modifier(Modifier::DIM)),
        area,
    );
}

/// Every binding of the keymap, grouped by where it works, flowed into as many columns as fit; scrolled
/// when they do not.
fn help(state: &State, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let lines = help_lines(state);
    let inner = help_block().inner(area);
    let flow = HelpFlow::new(lines.len(), inner);
    let first = state.help_scroll.min(flow.max_scroll);
    let shown = &lines[first..lines.len().min(first + flow.page())];
    let title = if flow.max_scroll > 0 {
        format!(
            " Keys (this screen's in color) · {}–{} of {} · ↑/↓ PgUp/PgDn scroll ",
            first + 1,
            first + shown.len(),
            lines.len()
        )
    } else {
        " Keys (this screen's in color) ".to_string()
    };
    let block = help_block()
        .title(title)
        .border_style(fg(theme.role(Role::Dim)));
    frame.render_widget(block, area);
    let areas = Layout::horizontal(vec![Constraint::Fill(1); flow.columns]).split(inner);
    for (column, area) in shown.chunks(flow.rows).zip(areas.iter()) {
        let column: Vec<Line> = column
            .iter()
            .map(|l| fit_line(l.clone(), area.width))
            .collect();
        frame.render_widget(Paragraph::new(column), *area);
    }
}

/// Help's lines: a heading per group of screens, then its bindings (this screen's in color).
fn help_lines(state: &State) -> Vec<Line<'static>> {
    let theme = &state.theme;
    keymap::help_lines()
        .map(|line| match line {
            HelpLine::Heading(screens) => {
                let names: Vec<&str> = screens.iter().map(|s| s.name()).collect();
                let heading = if names.is_empty() {
                    "everywhere".to_string()
                } else {
                    names.join(", ")
                };
                Line::styled(
                    heading,
                    Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
                )
            }
            HelpLine::Binding(binding) => {
                let (key_style, text_style) = if binding.applies_to(state.screen()) {
                    (fg(theme.role(Role::Accent)), Style::new())
                } else {
                    (fg(theme.role(Role::Dim)), fg(theme.role(Role::Dim)))
                };
                Line::from(vec![
                    Span::styled(format!("{:>9} ", binding.keys_label()), key_style),
                    Span::styled(binding.description, text_style),
                ])
            }
        })
        .collect()
}

/// A centered box over the screen.
fn popup(state: &State, frame: &mut Frame, title: &str, lines: Vec<Line>) {
    let area = frame.area();
    let width = area.width.saturating_sub(4).min(70);
    let height = (lines.len() as u16 + 2).min(area.height);
    let rect = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, rect);
    let block = Block::bordered()
        .title(format!(" {title} "))
        .border_style(fg(state.theme.tone(Tone::Warn)).add_modifier(Modifier::BOLD));
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(block.padding(ratatui::widgets::Padding::horizontal(1))),
        rect,
    );
}

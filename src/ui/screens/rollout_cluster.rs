//! The Rollout screen in cluster mode: for the set chosen on the Sets screen (else the cluster's first),
//! the pool rollup, then one row per node the set lands on: its pool, where it is (done, pulling, slow,
//! waiting, failed, unknown), the set's generation against the MachineConfigNode's desired / current /
//! last-failed ones, how long it has been in that state, and the daemon's message. Only visible rows are
//! built.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use crate::model::cluster_session::ClusterSession;
use crate::model::machine_config::{
    DEGRADED, PROGRESSING, PinnedImageSet, SetProgress, node_set_state, pool_rollup, pools_for_set,
};
use crate::ui::state::{Pane, Screen, State, matches};
use crate::ui::status::{Tone, set_state_status};
use crate::ui::widgets::{
    Column, col, duration, empty, fg, flex, longest, pane, sized_to, status_span, table,
    table_title, tally,
};

const COLUMNS: [Column; 8] = [
    flex("NODE", 12),
    col("POOL", 8, 3),
    col("STATE", 10, 0),
    col("DESIRED", 7, 2),
    col("CURRENT", 7, 2),
    col("FAILED", 6, 4),
    col("FOR", 7, 1),
    flex("MESSAGE", 40),
];

/// Where `node` is with `set`, at the screen's time.
fn node_state(
    session: &ClusterSession,
    set: &PinnedImageSet,
    node: &str,
    state: &State,
) -> SetProgress {
    let wall = state.wall(state.now);
    session
        .view
        .machine_config_node(node)
        .map_or(SetProgress::Unknown, |mcn| {
            node_set_state(mcn, set.name(), set.generation(), wall)
        })
}

pub(in crate::ui) fn draw(state: &State, session: &ClusterSession, frame: &mut Frame, area: Rect) {
    let theme = &state.theme;
    let Some(set) = state.followed_set().and_then(|name| session.view.set(name)) else {
        let text = "no PinnedImageSet on the cluster yet: a on the Sets screen applies one";
        empty(theme, frame, area, "Rollout", text);
        return;
    };
    let [summary_area, nodes_area, detail_area] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Fill(1),
        Constraint::Length(4),
    ])
    .areas(area);
    let members = session
        .members
        .get(set.name())
        .map_or(&[][..], Vec::as_slice);
    frame.render_widget(
        Paragraph::new(summary(state, session, set, members)).wrap(Wrap { trim: true }),
        summary_area,
    );

    let filter = state.filter(Screen::Rollout);
    let cursor = state.cursor(Pane::RolloutNodes);
    let rows = members.iter().filter(|n| matches(n, filter));
    // The set follows the Sets screen's selection: say so where the operator looks.
    let title = table_title(
        "Nodes (the set selected on the Sets screen)",
        cursor,
        filter,
    );
    table(
        frame,
        nodes_area,
        theme,
        pane(theme, title, true),
        &sized_to(COLUMNS, longest(members.iter().map(String::as_str))),
        cursor,
        rows,
        |node, _| {
            let node_state = node_state(session, set, node, state);
            let entry = session
                .view
                .machine_config_node(node)
                .and_then(|m| m.set_status(set.name()));
            let generation = |g: Option<i64>| Line::from(g.map_or("-".into(), |g| g.to_string()));
            let (elapsed, message) = match &node_state {
                SetProgress::Progressing { elapsed } => (*elapsed, String::new()),
                SetProgress::SlowButWorking { elapsed, message } => {
                    (*elapsed, format!("still pulling: {message}"))
                }
                SetProgress::Failed { error, .. } => (None, error.clone()),
                SetProgress::Waiting => (None, "has not seen this generation yet".into()),
                SetProgress::Unknown => (None, "no MachineConfigNode reports on it".into()),
                SetProgress::Done => (None, String::new()),
            };
            [
                Line::from(node.clone()),
                Line::from(session.view.pool_of(node).unwrap_or("-").to_owned()),
                Line::from(status_span(theme, set_state_status(&node_state))),
                generation(entry.and_then(|e| e.desired_generation)),
                generation(entry.and_then(|e| e.current_generation)),
                generation(entry.and_then(|e| e.last_failed_generation)),
                Line::from(elapsed.map_or("-".into(), duration)),
                Line::from(message),
            ]
        },
    );

    let detail = state
        .selected(Pane::RolloutNodes)
        .map(|node| {
            let mut lines = conditions(session, node);
            lines.extend(judged(state, session, set, node));
            lines
        })
        .unwrap_or_default();
    frame.render_widget(
        Paragraph::new(detail).wrap(Wrap { trim: true }),
        detail_area,
    );
}

/// `set release generation 2 · pool worker 2/3 updated · nodes: ✓ 2 done ↓ 1 pulling`.
fn summary(
    state: &State,
    session: &ClusterSession,
    set: &PinnedImageSet,
    members: &[String],
) -> Vec<Line<'static>> {
    let theme = &state.theme;
    let pools = pools_for_set(&set.metadata.labels, &session.view.pools);
    let rollups: Vec<String> = session
        .view
        .pools
        .iter()
        .filter(|p| pools.iter().any(|name| name == p.name()))
        .map(|p| match pool_rollup(p) {
            Some((updated, machines)) => format!("pool {} {updated}/{machines} updated", p.name()),
            None => format!("pool {} (no rollup yet)", p.name()),
        })
        .collect();
    let mut spans = vec![Span::styled(
        format!(
            "set {} generation {} · {} images · {} · nodes:",
            set.name(),
            set.generation(),
            set.images().count(),
            if rollups.is_empty() {
                "lands in no pool".to_owned()
            } else {
                rollups.join(", ")
            }
        ),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    let statuses = members
        .iter()
        .map(|node| set_state_status(&node_state(session, set, node, state)));
    spans.extend(tally(theme, statuses));
    vec![Line::from(spans)]
}

/// The selected node as `pinboard check` judges it: what the judgement rests on, then the first reason it
/// is not ready or, failing that, the first warning.
fn judged(
    state: &State,
    session: &ClusterSession,
    set: &PinnedImageSet,
    node: &str,
) -> Vec<Line<'static>> {
    let Some(readiness) = session.node_readiness(set.name(), node, state.wall(state.now)) else {
        return Vec::new();
    };
    let theme = &state.theme;
    let verdict = match readiness.ready {
        true => "ready",
        false => "not ready",
    };
    let evidence = readiness
        .evidence_words()
        .map_or_else(String::new, |words| format!(" ({words})"));
    let mut lines = vec![Line::from(format!("check: {verdict}{evidence}"))];
    let note = match (readiness.reasons.first(), readiness.warnings.first()) {
        (Some(reason), _) => Some((format!("✗ {reason}"), Tone::Error)),
        (None, Some(warning)) => Some((format!("! {warning}"), Tone::Warn)),
        (None, None) => None,
    };
    lines.extend(note.map(|(text, tone)| Line::styled(text, fg(theme.tone(tone)))));
    lines
}

/// The selected node's PinnedImageSets conditions: type, status, reason, message.
fn conditions(session: &ClusterSession, node: &str) -> Vec<Line<'static>> {
    let Some(mcn) = session.view.machine_config_node(node) else {
        return vec![Line::from(format!("{node}: no MachineConfigNode"))];
    };
    [PROGRESSING, DEGRADED]
        .into_iter()
        .filter_map(|type_| mcn.condition(type_))
        .map(|c| {
            Line::from(format!(
                "{}={} {}: {}",
                c.type_,
                c.status,
                c.reason.as_deref().unwrap_or("-"),
                c.message.as_deref().unwrap_or("")
            ))
        })
        .collect()
}

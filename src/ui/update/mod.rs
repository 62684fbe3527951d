//! [`update`], the one pure function between the TUI's [`State`] and the outside world: it folds a
//! [`Msg`] in and returns the [`Cmd`]s to carry out. No I/O, no clock (time arrives in [`Msg::Tick`]).
//! Keys, modes and moving about are handled here; what the keys set off is in `sets` (composing sets),
//! `rollout` (surveying, applying, unpinning, retrying) and `cluster` (the watched cluster).

mod machine_config;
mod rollout;
mod sets;

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::model::lazy::LazyPulling;
use crate::model::rollout::NodeState;
use crate::model::set;
use crate::ui::keymap::{Action, lookup};
use crate::ui::layout::{HelpFlow, diff_rows, page_rows};
use crate::ui::msg::{Cmd, FilePurpose, Msg};
use crate::ui::state::{Cursor, Mode, Pane, Prompt, Screen, State};
use rollout::{apply, confirm, finished_message, retry_or_cancel, survey, toggle_fan_out, unpin};
use sets::{import, remove, submit, toggle_target};

/// How long a flash message stays.
const FLASH_FOR: Duration = Duration::from_secs(5);

/// Folds one message into the state; returns what the outside world should do.
pub fn update(state: &mut State, msg: Msg) -> Vec<Cmd> {
    let mut dirty = true;
    let cmds = match msg {
        Msg::Key(key) => on_key(state, key),
        Msg::Paste(text) => {
            on_paste(state, &text);
            Vec::new()
        }
        Msg::Resize { width, height } => {
            state.page = page_rows(height);
            state.size = (width, height);
            Vec::new()
        }
        Msg::Tick(now) => {
            state.now = now;
            let expired = state
                .flash
                .as_ref()
                .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= FLASH_FOR);
            dirty = state.time_visible();
            if expired {
                state.flash = None;
            }
            Vec::new()
        }
        Msg::NodesUpdated(mut nodes) => {
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            state.follow_every_node(nodes.iter().map(|n| n.name.clone()).collect());
            state.nodes = nodes;
            Vec::new()
        }
        Msg::Checked { set, result } => {
            rollout::checked(state, &set, result);
            Vec::new()
        }
        Msg::SurveyDone(result) => {
            state.surveying = false;
            match result {
                Ok(survey) => {
                    state.say(format!("survey done: {} nodes", survey.nodes.len()));
                    state.survey = Some(survey);
                }
                Err(err) => state.say(format!("survey failed: {err}")),
            }
            Vec::new()
        }
        Msg::Rollout(event) => {
            let was_finished = state.rollout.is_finished();
            state.apply_rollout(event);
            // The engine stays up for retries while a node has failures: say so when nothing is moving.
            if !was_finished && state.rollout.is_finished() {
                state.say(finished_message(&state.rollout));
            }
            Vec::new()
        }
        Msg::FanOut(nodes) => {
            state.rollout.set_fan_out(nodes);
            Vec::new()
        }
        Msg::LinkBytes(bytes) => {
            state.rollout.record_link_bytes(bytes);
            Vec::new()
        }
        Msg::EngineFinished(result) => {
            state.say(match result {
                Ok(()) => finished_message(&state.rollout),
                Err(err) => format!("rollout stopped: {err}"),
            });
            Vec::new()
        }
        Msg::FileRead {
            path,
            purpose: FilePurpose::ImportSet,
            result,
        } => {
            match result {
                Ok(text) => import(state, &path, &text),
                Err(err) => state.say(format!("cannot read {}: {err}", path.display())),
            }
            Vec::new()
        }
        Msg::FileWritten { path, result } => {
            state.say(match result {
                Ok(()) => format!("wrote {}", path.display()),
                Err(err) => format!("cannot write {}: {err}", path.display()),
            });
            Vec::new()
        }
        Msg::ConfigViews(views) => {
            state.config.extend(views);
            Vec::new()
        }
        Msg::Notice(text) => {
            state.say(text);
            Vec::new()
        }
        Msg::Cluster(change) => {
            machine_config::apply(state, change);
            Vec::new()
        }
        Msg::Kubelets(read) => {
            if let Some(session) = state.machine_config.as_mut() {
                session.learn_kubelets(read);
            }
            Vec::new()
        }
        Msg::ImageFs(read) => {
            machine_config::learn_image_fs(state, read);
            Vec::new()
        }
        Msg::ReleaseRead(read) => {
            match read {
                Ok((sets, note)) => {
                    for mut set in sets {
                        set.name = state.unique_set_name(&set.name);
                        state.add_set(set);
                    }
                    state.say(note);
                }
                Err(err) => state.say(format!("cannot read the release: {err}")),
            }
            Vec::new()
        }
    };
    state.dirty |= dirty;
    cmds
}

fn on_key(state: &mut State, key: KeyEvent) -> Vec<Cmd> {
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        return vec![Cmd::Quit];
    }
    match std::mem::replace(&mut state.mode, Mode::Normal) {
        Mode::Normal => match lookup(&key, state.screen) {
            Some(action) => on_action(state, action),
            None => Vec::new(),
        },
        Mode::Help => {
            if !matches!(key.code, KeyCode::Esc | KeyCode::Char('?' | 'q')) {
                state.mode = Mode::Help;
                if let Some(action) = lookup(&key, state.screen) {
                    let flow = HelpFlow::for_state(state);
                    let at = scrolled(state.help_scroll, action, flow.page(), flow.max_scroll);
                    state.help_scroll = at;
                }
            }
            Vec::new()
        }
        Mode::Command(mut text) => {
            match key.code {
                KeyCode::Enter => return run_command(state, text.trim()),
                KeyCode::Esc => {}
                code => {
                    edit(&mut text, code);
                    state.mode = Mode::Command(text);
                }
            }
            Vec::new()
        }
        Mode::Filter => {
            match key.code {
                KeyCode::Enter if state.filter(state.screen).is_empty() => {
                    state.filters.remove(&state.screen);
                }
                KeyCode::Enter => {}
                KeyCode::Esc => {
                    state.filters.remove(&state.screen);
                }
                code => {
                    edit(state.filters.entry(state.screen).or_default(), code);
                    state.mode = Mode::Filter;
                }
            }
            Vec::new()
        }
        Mode::Input { prompt, mut text } => match key.code {
            KeyCode::Enter => submit(state, prompt, &text),
            KeyCode::Esc => Vec::new(),
            code => {
                edit(&mut text, code);
                state.mode = Mode::Input { prompt, text };
                Vec::new()
            }
        },
        Mode::Confirm(confirm) => match key.code {
            KeyCode::Char('y') if confirm.unpin => unpin(state, confirm),
            KeyCode::Char('y') => apply(state, confirm, false),
            KeyCode::Char('F')
                if confirm.skips_no_space && !confirm.no_space.is_empty() && !confirm.unpin =>
            {
                apply(state, confirm, true)
            }
            KeyCode::Char('n') | KeyCode::Esc => {
                state.say(if confirm.unpin {
                    "unpin cancelled"
                } else {
                    "apply cancelled"
                });
                Vec::new()
            }
            _ => {
                state.mode = Mode::Confirm(confirm);
                Vec::new()
            }
        },
    }
}

fn edit(text: &mut String, code: KeyCode) {
    match code {
        KeyCode::Backspace => {
            text.pop();
        }
        KeyCode::Char(c) => text.push(c),
        _ => {}
    }
}

fn on_paste(state: &mut State, pasted: &str) {
    match &mut state.mode {
        Mode::Input {
            prompt: Prompt::AddImages,
            text,
        } => {
            text.push(' ');
            text.push_str(pasted);
        }
        // One-line boxes take the first line only.
        Mode::Input { text, .. } | Mode::Command(text) => {
            text.push_str(pasted.lines().next().unwrap_or("").trim());
        }
        Mode::Filter => {
            let first = pasted.lines().next().unwrap_or("").trim();
            state
                .filters
                .entry(state.screen)
                .or_default()
                .push_str(first);
        }
        Mode::Normal if state.screen == Screen::Sets => {
            state.mode = Mode::Input {
                prompt: Prompt::AddImages,
                text: pasted.to_string(),
            };
        }
        _ => {}
    }
}

fn run_command(state: &mut State, command: &str) -> Vec<Cmd> {
    if matches!(command, "q" | "q!" | "quit") {
        return vec![Cmd::Quit];
    }
    match Screen::ALL.iter().find(|s| s.name() == command) {
        Some(screen) => state.goto(*screen),
        None => {
            let names: Vec<&str> = Screen::ALL.iter().map(|s| s.name()).collect();
            state.say(format!(
                "no command {command:?}: try {} or q",
                names.join(", ")
            ));
        }
    }
    Vec::new()
}

/// Where a view that scrolls up to `max` starts after a moving key; other keys leave it.
fn scrolled(at: usize, action: Action, page: usize, max: usize) -> usize {
    let to = match action {
        Action::Up => at.saturating_sub(1),
        Action::Down => at + 1,
        Action::PageUp => at.saturating_sub(page),
        Action::PageDown => at + page,
        Action::Top => 0,
        Action::Bottom => max,
        _ => at,
    };
    to.min(max)
}

fn on_action(state: &mut State, action: Action) -> Vec<Cmd> {
    let pane = state.focus();
    let page = state.page;
    match action {
        Action::Quit => return vec![Cmd::Quit],
        Action::Command => state.mode = Mode::Command(String::new()),
        Action::Filter => state.mode = Mode::Filter,
        Action::Help => {
            state.mode = Mode::Help;
            state.help_scroll = 0;
        }
        Action::Back => {
            if state.filters.remove(&state.screen).is_none()
                && let Some(previous) = state.history.pop()
            {
                state.screen = previous;
            }
        }
        Action::Goto(screen) => state.goto(screen),
        Action::Up
        | Action::Down
        | Action::PageUp
        | Action::PageDown
        | Action::Top
        | Action::Bottom
            if pane == Pane::ConfigDiff =>
        {
            scroll_diff(state, action)
        }
        Action::Up => state.move_selection(pane, |at, _| at.saturating_sub(1)),
        Action::Down => state.move_selection(pane, |at, _| at + 1),
        Action::PageUp => state.move_selection(pane, |at, _| at.saturating_sub(page)),
        Action::PageDown => state.move_selection(pane, |at, _| at + page),
        Action::Top => state.move_selection(pane, |_, _| 0),
        Action::Bottom => state.move_selection(pane, |_, len| len - 1),
        Action::NextPane => match state.screen {
            Screen::Sets => {
                state.sets_pane = match state.sets_pane {
                    Pane::Sets => Pane::Entries,
                    Pane::Entries => Pane::Targets,
                    _ => Pane::Sets,
                }
            }
            Screen::Config => {
                state.config_pane = match state.config_pane {
                    Pane::Config => Pane::ConfigDiff,
                    _ => Pane::Config,
                }
            }
            _ => {
                state.rollout_pane = match state.rollout_pane {
                    Pane::RolloutNodes => Pane::RolloutImages,
                    _ => Pane::RolloutNodes,
                }
            }
        },
        Action::Apply => confirm(state, false),
        Action::ToggleFanOut => toggle_fan_out(state),
        Action::Unpin => confirm(state, true),
        Action::Survey => return survey(state),
        Action::AddImages => {
            if state.sets.is_empty() {
                let name = state.unique_set_name("images");
                state.add_set(set::from_flags(&name, &[]));
            }
            open(state, Prompt::AddImages, String::new());
        }
        Action::Import => open(state, Prompt::ImportPath, String::new()),
        Action::Export => {
            if state.writable("export")
                && let Some(draft) = state.selected_set()
            {
                let path = format!("{}.yaml", draft.set.name);
                open(state, Prompt::ExportPath, path);
            }
        }
        Action::NewSet => open(state, Prompt::NewSet, String::new()),
        Action::Rename => {
            if let Some(draft) = state.selected_set() {
                let name = draft.set.name.clone();
                open(state, Prompt::Rename, name);
            }
        }
        Action::Remove => remove(state),
        Action::ToggleTarget => toggle_target(state),
        Action::ToggleLazy => {
            if state.writable("lazy pulling")
                && let Some(name) = state.selected(Pane::Nodes)
            {
                let node = state.nodes.iter().find(|n| n.name == name);
                let enable = !node
                    .and_then(|n| n.lazy_pulling.as_ref())
                    .is_some_and(LazyPulling::configured);
                return vec![Cmd::ToggleLazy {
                    node: name.to_string(),
                    enable,
                }];
            }
        }
        Action::Retry | Action::Cancel => return retry_or_cancel(state, action),
        Action::CheckNow => return rollout::check_now(state),
    }
    Vec::new()
}

/// Scrolls the selected node's diff, as far as its last line at the bottom of the pane.
fn scroll_diff(state: &mut State, action: Action) {
    let Some(node) = state.selected(Pane::Config).map(str::to_string) else {
        return;
    };
    let view = &state.config[&node];
    // The notes above the diff take rows of their own.
    let rows = diff_rows(state.size).saturating_sub(view.notes.len());
    let max = view.lines.len().saturating_sub(rows);
    let at = scrolled(state.diff_scroll(), action, rows.max(1), max);
    state.diff_scroll.insert(node, at);
}

fn open(state: &mut State, prompt: Prompt, text: String) {
    state.mode = Mode::Input { prompt, text };
}

impl State {
    /// Whether a visible figure changes with time alone (elapsed, ETA, stalls, a flash to expire).
    fn time_visible(&self) -> bool {
        self.flash.is_some()
            || (self.screen == Screen::Rollout && self.machine_config.is_some())
            || (self.screen == Screen::Rollout
                && self
                    .rollout
                    .nodes()
                    .values()
                    .any(|n| matches!(n.state, NodeState::Pulling { .. })))
    }

    fn move_selection(&mut self, pane: Pane, step: impl FnOnce(usize, usize) -> usize) {
        let Cursor { len, selected } = self.cursor(pane);
        if let Some((at, _)) = selected {
            let to = step(at, len).min(len - 1);
            let row = self.rows(pane).nth(to).map(str::to_string);
            self.selected.extend(row.map(|row| (pane, row)));
        }
    }
}

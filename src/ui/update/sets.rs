//! Composing sets on the Sets screen: what is typed at its prompts, imported files, removing entries and
//! sets, and choosing their target nodes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::fleet::Targets;
use crate::model::export::set_yaml;
use crate::model::set::{self, Entry, ImageSet, Origin};
use crate::ui::msg::{Cmd, FilePurpose};
use crate::ui::state::{Pane, Prompt, SetDraft, State};

pub(super) fn submit(state: &mut State, prompt: Prompt, text: &str) -> Vec<Cmd> {
    let text = text.trim();
    if text.is_empty() {
        return Vec::new();
    }
    match prompt {
        Prompt::AddImages => add_images(state, text),
        Prompt::ImportPath if is_pullspec(text) => {
            state.say(format!("reading release {text}…"));
            return vec![Cmd::ImportRelease(text.to_owned())];
        }
        Prompt::ImportPath => {
            return vec![Cmd::ReadFile(PathBuf::from(text), FilePurpose::ImportSet)];
        }
        Prompt::ExportPath => {
            if let Some(draft) = state.selected_set() {
                let yaml = set_yaml(&draft.set, state.fleet.set_kind());
                return vec![Cmd::WriteFile(PathBuf::from(text), yaml)];
            }
        }
        Prompt::NewSet | Prompt::Rename => {
            if state.sets.iter().any(|s| s.set.name == text) {
                state.say(format!("a set named {text} exists already"));
            } else if prompt == Prompt::NewSet {
                state.add_set(set::from_flags(text, &[]));
                state.sets_pane = Pane::Entries;
            } else if let Some(draft) = state.selected_set_mut() {
                draft.set.name = text.to_string();
                state.selected.insert(Pane::Sets, text.to_string());
            }
        }
    }
    Vec::new()
}

fn add_images(state: &mut State, text: &str) {
    let first = state.typed + 1;
    let entries: Vec<Entry> = text
        .split_whitespace()
        .enumerate()
        .map(|(i, reference)| Entry {
            reference: reference.to_string(),
            origin: Origin::File {
                path: "typed".into(),
                line: Some(first + i),
            },
        })
        .collect();
    state.typed += entries.len();
    let added = entries.len();
    if let Some(draft) = state.selected_set_mut() {
        draft.edit(|set| set.entries.extend(entries));
        let broken = draft
            .problems()
            .iter()
            .filter(|p| p.entry.is_some())
            .count();
        let text = format!("added {added} image(s); {broken} entry problem(s) in the set");
        state.say(text);
    }
}

/// Whether what was typed at the import prompt names a release image rather than a file: a registry host,
/// and a tag or a digest.
fn is_pullspec(text: &str) -> bool {
    let host = text.split('/').next().unwrap_or("");
    let last = text.rsplit('/').next().unwrap_or("");
    text.contains('/')
        && host.contains('.')
        && !text.starts_with(['.', '/', '~'])
        && (last.contains(':') || last.contains('@'))
}

pub(super) fn import(state: &mut State, path: &Path, text: &str) {
    let shown = path.display().to_string();
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    ) || text.contains("kind:");
    if yaml {
        match set::parse_yaml(text, &shown) {
            Ok(sets) => {
                let count = sets.len();
                for mut set in sets {
                    set.name = state.unique_set_name(&set.name);
                    state.add_set(set);
                }
                state.say(format!("imported {count} set(s) from {shown}"));
            }
            Err(problems) => state.say(format!(
                "{shown}: {} problem(s): {}",
                problems.len(),
                problems[0]
            )),
        }
        return;
    }
    // Named after its images, as the headless commands name a list file's set.
    let mut list = set::parse_list(text, &shown);
    list.name = state.unique_set_name(&list.name);
    let count = list.entries.len();
    match state.selected_set_mut() {
        Some(draft) => draft.edit(|set| set.entries.extend(list.entries)),
        None => state.add_set(list),
    }
    state.say(format!("imported {count} image(s) from {shown}"));
}

pub(super) fn remove(state: &mut State) {
    match state.sets_pane {
        Pane::Sets => {
            if let Some(name) = state.selected_set().map(|s| s.set.name.clone()) {
                state.sets.retain(|s| s.set.name != name);
                state.selected.remove(&Pane::Sets);
                state.say(format!("removed set {name}"));
            }
        }
        Pane::Entries => {
            if let Some(reference) = state.selected(Pane::Entries).map(str::to_string)
                && let Some(draft) = state.selected_set_mut()
            {
                draft.edit(|set| {
                    if let Some(at) = set.entries.iter().position(|e| e.reference == reference) {
                        set.entries.remove(at);
                    }
                });
                state.selected.remove(&Pane::Entries);
            }
        }
        _ => state.say("Tab to the sets or entries pane to remove"),
    }
}

pub(super) fn toggle_target(state: &mut State) {
    if state.sets_pane != Pane::Targets {
        state.say("Tab to the targets pane to choose nodes (a pool in cluster mode)");
        return;
    }
    let Some(node) = state.selected(Pane::Targets).map(str::to_string) else {
        return;
    };
    if state.targets_pools() {
        return super::machine_config::toggle_pool(state, &node);
    }
    if let Some(draft) = state.selected_set_mut()
        && !draft.targets.remove(&node)
    {
        draft.targets.insert(node);
    }
}

impl State {
    /// Nodes that come and go (a cluster's): a set that targeted every node keeps targeting every node,
    /// the ones that joined included; sets aimed at chosen nodes keep their choice.
    pub(super) fn follow_every_node(&mut self, now: BTreeSet<String>) {
        if self.fleet.targets != Targets::Nodes {
            return;
        }
        let before: BTreeSet<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        if before == now {
            return;
        }
        for draft in &mut self.sets {
            if draft.targets == before {
                draft.targets = now.clone();
            }
        }
    }
}

impl State {
    pub(super) fn unique_set_name(&self, base: &str) -> String {
        let taken = |name: &str| self.sets.iter().any(|s| s.set.name == name);
        let mut name = base.to_string();
        let mut n = 2;
        while taken(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }

    pub(super) fn add_set(&mut self, set: ImageSet) {
        let targets = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.selected.insert(Pane::Sets, set.name.clone());
        self.sets.push(SetDraft::new(set, targets));
    }
}

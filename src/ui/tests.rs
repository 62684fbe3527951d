//! The TUI driven by key sequences and messages, and every screen drawn from the demo state and
//! compared with its snapshot (as text) at 120×40 and 80×24.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::buffer::Buffer;

use super::demo::{self, demo_state};
use super::keymap::KEYMAP;
use super::layout::{HelpFlow, diff_rows};
use super::msg::{Cmd, FilePurpose, Msg};
use super::render::render_to_buffer;
use super::state::{Mode, NO_CACHE, Pane, Screen, State};
use super::svg::buffer_to_svg;
use super::theme::Theme;
use super::update::update;
use crate::error::Failure;
use crate::model::rollout::{Event, FanOutNodes, Rollout};
use crate::model::units::human;

fn state() -> State {
    demo_state(Instant::now(), Theme::named("monochrome").unwrap())
}

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

/// Types `keys`; `<Enter>`, `<Esc>`, `<Tab>`, `<Down>` and `<PgDn>` name those keys.
fn type_keys(state: &mut State, keys: &str) -> Vec<Cmd> {
    let mut cmds = Vec::new();
    let mut rest = keys;
    while let Some(c) = rest.chars().next() {
        let named = [
            ("<Enter>", KeyCode::Enter),
            ("<Esc>", KeyCode::Esc),
            ("<Tab>", KeyCode::Tab),
            ("<Down>", KeyCode::Down),
            ("<PgDn>", KeyCode::PageDown),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name));
        let (code, len) = match named {
            Some((name, code)) => (code, name.len()),
            None => (KeyCode::Char(c), c.len_utf8()),
        };
        cmds.extend(update(state, key(code)));
        rest = &rest[len..];
    }
    cmds
}

fn text(buffer: &Buffer) -> String {
    super::render::buffer_text(buffer)
}

fn screen_text(state: &State) -> String {
    text(&render_to_buffer(state, 120, 40))
}

#[test]
fn command_bar_switches_screens_and_esc_goes_back() {
    let mut state = state();
    assert!(type_keys(&mut state, ":plan<Enter>").is_empty());
    assert_eq!(state.screen(), Screen::Plan);
    type_keys(&mut state, "4");
    assert_eq!(state.screen(), Screen::Rollout);
    type_keys(&mut state, "<Esc>");
    assert_eq!(state.screen(), Screen::Plan);
    type_keys(&mut state, ":nope<Enter>");
    assert!(state.flash().unwrap().contains("no command \"nope\""));
    assert_eq!(type_keys(&mut state, ":q<Enter>"), [Cmd::Quit]);
}

#[test]
fn filter_narrows_the_table_then_esc_clears_it_then_goes_back() {
    let mut state = state();
    type_keys(&mut state, "3/-2");
    assert_eq!(state.mode(), &Mode::Filter);
    let shown = screen_text(&state);
    assert!(shown.contains("Plan [1/1] /-2"), "{shown}");
    assert!(!shown.contains("worker-0 "), "{shown}");
    type_keys(&mut state, "<Esc>");
    assert_eq!(state.filter(Screen::Plan), "");
    assert_eq!(
        state.screen(),
        Screen::Plan,
        "the first Esc only closes the filter"
    );
    // A filter kept with Enter is cleared by the next Esc, then Esc goes back.
    type_keys(&mut state, "/-1<Enter>");
    assert_eq!(state.selected(Pane::Plan), Some("worker-1"));
    type_keys(&mut state, "<Esc>");
    assert_eq!(
        (state.filter(Screen::Plan), state.screen()),
        ("", Screen::Plan)
    );
    type_keys(&mut state, "<Esc>");
    assert_eq!(state.screen(), Screen::Nodes);
}

#[test]
fn help_lists_every_binding_of_the_keymap() {
    let mut state = state();
    type_keys(&mut state, "?");
    assert_eq!(state.mode(), &Mode::Help);
    let shown = screen_text(&state);
    for binding in KEYMAP {
        assert!(
            shown.contains(binding.description),
            "{} missing from help:\n{shown}",
            binding.description
        );
    }
    type_keys(&mut state, "<Esc>");
    assert_eq!(state.mode(), &Mode::Normal);
}

#[test]
fn help_taller_than_the_terminal_scrolls_with_the_moving_keys() {
    let mut state = state();
    let (width, height) = (80, 12);
    update(&mut state, Msg::Resize { width, height });
    type_keys(&mut state, "?");
    let shown = |state: &State| text(&render_to_buffer(state, width, height));
    let (first, last) = (KEYMAP[0].description, KEYMAP[KEYMAP.len() - 1].description);
    assert!(
        shown(&state).contains(first) && !shown(&state).contains(last),
        "{}",
        shown(&state)
    );

    type_keys(&mut state, "G");
    let bottom = state.help_scroll;
    assert!(bottom > 0);
    assert!(
        !shown(&state).contains(first) && shown(&state).contains(last),
        "{}",
        shown(&state)
    );
    insta::assert_snapshot!("help_scrolled_to_the_end_80x12", shown(&state));
    type_keys(&mut state, "j");
    assert_eq!(state.help_scroll, bottom, "no further than the last line");
    type_keys(&mut state, "k");
    assert_eq!(state.help_scroll, bottom - 1);

    type_keys(&mut state, "g<Down><PgDn>");
    let page = HelpFlow::for_state(&state).page();
    assert_eq!(state.help_scroll, (1 + page).min(bottom));
    type_keys(&mut state, "??");
    assert_eq!(state.help_scroll, 0, "help opens at the top");
}

#[test]
fn the_config_screen_says_what_crio_has_in_force_and_warns_when_a_later_file_replaces_it() {
    use crate::model::config_view::{ConfigNote, ConfigView};
    let note = |text: &str, warning| ConfigNote {
        text: text.into(),
        warning,
    };
    // Drawn above the diff, the warning with its glyph.
    let mut state = state();
    let view = ConfigView {
        path: "/etc/crio/crio.conf.d/50-pinned-images".into(),
        notes: vec![
            note(
                "in force: pinned_images from 99-override.conf (1 entry)",
                false,
            ),
            note("  b", false),
            note(
                "99-override.conf replaces pinned_images: 1 of these images would not be pinned; add them \
                 there or remove its pinned_images",
                true,
            ),
        ],
        lines: vec![(
            crate::model::diff::DiffKind::Added,
            "pinned_images = [...]".into(),
        )],
    };
    update(
        &mut state,
        Msg::ConfigViews([("worker-1".to_string(), view)].into()),
    );
    type_keys(&mut state, "5");
    let screen = text(&render_to_buffer(&state, 120, 40));
    assert!(
        screen.contains("in force: pinned_images from 99-override.conf (1 entry)"),
        "{screen}"
    );
    assert!(
        screen.contains("! 99-override.conf replaces pinned_images"),
        "{screen}"
    );
}

#[test]
fn config_diff_scrolls_when_tab_gives_it_the_focus_and_stays_with_its_node() {
    let mut state = state();
    let (width, height) = (80, 12);
    update(&mut state, Msg::Resize { width, height });
    let shown = |state: &State| text(&render_to_buffer(state, width, height));
    type_keys(&mut state, "5");
    let lines: Vec<String> = state.config["worker-1"]
        .lines
        .iter()
        .map(|(_, line)| line.clone())
        .collect();
    // The notes on what is in force stay above the diff and take rows of their own.
    let notes = &state.config["worker-1"].notes;
    assert!(!notes.is_empty(), "the demo shows what CRI-O has in force");
    let rows = diff_rows((width, height)) - notes.len();
    assert!(lines.len() > rows, "the demo diff is taller than the pane");
    let bottom = lines.len() - rows;
    assert!(
        shown(&state).contains(&format!("lines 1–{rows} of {} · Tab", lines.len())),
        "{}",
        shown(&state)
    );
    // The node list has the focus: j and k select nodes.
    type_keys(&mut state, "jk");
    assert_eq!(state.selected(Pane::Config), Some("worker-1"));

    // Tab: the diff has it; the moving keys scroll it and leave the selection.
    type_keys(&mut state, "<Tab>j");
    assert_eq!(state.focus(), Pane::ConfigDiff);
    assert_eq!(state.diff_scroll(), 1);
    assert_eq!(state.selected(Pane::Config), Some("worker-1"));
    assert!(
        shown(&state).contains(&format!("lines 2–{} of {}", rows + 1, lines.len())),
        "{}",
        shown(&state)
    );
    type_keys(&mut state, "G");
    assert_eq!(state.diff_scroll(), bottom);
    let end = shown(&state);
    assert!(
        end.contains(lines.last().unwrap()) && !end.contains(&lines[0]),
        "{end}"
    );
    insta::assert_snapshot!("config_diff_scrolled_to_the_end_80x12", end);
    type_keys(&mut state, "j");
    assert_eq!(state.diff_scroll(), bottom, "no further than the last line");
    type_keys(&mut state, "k");
    assert_eq!(state.diff_scroll(), bottom - 1);
    type_keys(&mut state, "g<PgDn>");
    assert_eq!(state.diff_scroll(), rows.min(bottom));

    // A node added before it: the scroll stays with worker-1's diff.
    let added = state.config["worker-2"].clone();
    update(
        &mut state,
        Msg::ConfigViews([("worker-0".to_string(), added)].into()),
    );
    assert_eq!(state.selected(Pane::Config), Some("worker-1"));
    assert_eq!(state.diff_scroll(), rows.min(bottom));

    // Back to the list: another node's diff starts at its top; worker-1's is where it was left.
    type_keys(&mut state, "<Tab>j");
    assert_eq!(state.focus(), Pane::Config);
    assert_eq!(state.selected(Pane::Config), Some("worker-2"));
    assert_eq!(state.diff_scroll(), 0);
    type_keys(&mut state, "k");
    assert_eq!(state.diff_scroll(), rows.min(bottom));
}

#[test]
fn pasted_references_become_entries_and_a_broken_one_shows_its_rule() {
    let mut state = state();
    type_keys(&mut state, "2n");
    type_keys(&mut state, "extra<Enter>");
    assert_eq!(state.selected_set().unwrap().set.name, "extra");
    type_keys(&mut state, "i");
    update(
        &mut state,
        Msg::Paste(format!("{}\n{} ", demo::RELEASE, demo::TAGGED)),
    );
    type_keys(&mut state, &format!(" {}<Enter>", "quay.io/a/b"));
    let draft = state.selected_set().unwrap();
    assert_eq!(draft.set.entries.len(), 3);
    let problems: Vec<&str> = draft
        .problems()
        .iter()
        .map(|p| p.message.as_str())
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("uses a tag, not a digest"),
        "{problems:?}"
    );
    // The broken entry (selected) shows its rule and fix.
    assert_eq!(state.selected(Pane::Entries), Some(demo::TAGGED));
    let shown = screen_text(&state);
    assert!(shown.contains("✗ "), "{shown}");
    assert!(shown.contains("uses a tag, not a digest"), "{shown}");
    assert!(shown.contains("fix:"), "{shown}");
}

#[test]
fn selection_follows_the_node_when_an_event_resorts_the_rows() {
    let mut state = state();
    type_keys(&mut state, "4");
    let before: Vec<String> = state.rows(Pane::RolloutNodes).map(str::to_string).collect();
    assert_eq!(before, ["worker-1", "worker-0", "worker-2"]);
    update(&mut state, key(KeyCode::Down));
    assert_eq!(state.selected(Pane::RolloutNodes), Some("worker-0"));
    // worker-2 fails to pin: it moves to the top, worker-0 stays selected at its new row.
    let at = state.now;
    update(
        &mut state,
        Msg::Rollout(Event::PinFailed {
            node: "worker-2".into(),
            reason: "reload failed".into(),
            at,
        }),
    );
    let after: Vec<&str> = state.rows(Pane::RolloutNodes).collect();
    assert_eq!(after, ["worker-1", "worker-2", "worker-0"]);
    assert_eq!(state.selected(Pane::RolloutNodes), Some("worker-0"));
}

#[test]
fn retry_on_a_failed_image_and_cancel_on_a_stalled_one() {
    let mut state = state();
    type_keys(&mut state, "4");
    let cmds = type_keys(&mut state, "r");
    assert_eq!(
        cmds,
        [Cmd::Retry {
            node: "worker-1".into(),
            image: demo::EXPORTER.into()
        }]
    );
    // The images pane, up to the stalled PROMETHEUS pull.
    type_keys(&mut state, "<Tab>k");
    assert_eq!(state.selected(Pane::RolloutImages), Some(demo::PROMETHEUS));
    assert_eq!(
        type_keys(&mut state, "c"),
        [Cmd::Cancel {
            node: "worker-1".into(),
            image: demo::PROMETHEUS.into()
        }]
    );
    // Nothing to retry on an image already pulled.
    type_keys(&mut state, "gr");
    assert!(state.flash().unwrap().contains("nothing to retry"));
}

#[test]
fn an_image_present_only_lazily_says_how_many_of_its_layers_are_remote() {
    let mut state = state();
    type_keys(&mut state, "4");
    update(
        &mut state,
        Msg::Rollout(Event::ImageLazy {
            node: "worker-1".into(),
            image: demo::EXPORTER.into(),
            remote: 2,
            layers: 3,
        }),
    );
    let row = screen_text(&state)
        .lines()
        .find(|l| l.contains("node-exporter") && l.contains("lazy"))
        .map(str::to_owned);
    let row = row.expect("the image's row says lazy");
    assert!(
        row.contains("~ lazy") && row.contains("2 of 3 layers remote"),
        "{row}"
    );
}

#[test]
fn readonly_blocks_writes_with_a_message() {
    let mut state = state();
    state.readonly = true;
    for keys in ["2a", "2e", "4r", "1L"] {
        assert!(type_keys(&mut state, keys).is_empty(), "{keys}");
        assert!(state.flash().unwrap().starts_with("read-only"), "{keys}");
        assert_eq!(state.mode(), &Mode::Normal);
    }
    assert!(screen_text(&state).contains("read-only"));
}

#[test]
fn apply_asks_first_and_names_the_nodes_it_will_skip() {
    let mut state = state();
    // The set with the broken entry is refused outright.
    type_keys(&mut state, "2a");
    assert!(state.flash().unwrap().contains("breaks 1 rule"));
    type_keys(&mut state, "<Tab><Tab>j");
    assert_eq!(state.selected_set().unwrap().set.name, "monitoring");
    type_keys(&mut state, "a");
    let shown = screen_text(&state);
    assert!(
        shown.contains("apply set monitoring to 2 node(s)? y/n"),
        "{shown}"
    );
    assert_eq!(type_keys(&mut state, "n"), []);
    // Targeting worker-0 too: it has no room, so it is named, and F forces it.
    type_keys(&mut state, "<Tab><Tab>g a");
    let shown = screen_text(&state);
    assert!(
        shown.contains("will be skipped (no-space): worker-0; F to force"),
        "{shown}"
    );
    assert!(
        shown.contains("fan-out off: each node pulls from the registry (f on Plan)"),
        "{shown}"
    );
    let cmds = type_keys(&mut state, "y");
    let [
        Cmd::Apply {
            set,
            nodes,
            force,
            fan_out,
        },
    ] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(
        (set.name.as_str(), nodes.len(), *force, *fan_out),
        ("monitoring", 3, false, false)
    );
    assert_eq!(state.screen(), Screen::Rollout);
}

#[test]
fn apply_names_the_nodes_without_room_whoever_pulls() {
    use crate::fleet::{Puller, Targets, Traits};
    let confirm_text = |puller: Puller| {
        let mut state = state();
        state.fleet = Traits {
            targets: Targets::Nodes,
            puller,
        };
        // As above: monitoring chosen, then worker-0 (no room) targeted too.
        for keys in ["2a", "<Tab><Tab>j", "a", "n", "<Tab><Tab>g a"] {
            type_keys(&mut state, keys);
        }
        screen_text(&state)
    };
    let agents = confirm_text(Puller::Agents);
    assert!(
        agents.contains("apply set monitoring to 2 node(s)? y/n")
            && agents.contains("will be skipped (no-space): worker-0; F to force"),
        "each node's agent skips a node without room: {agents}"
    );
    assert!(
        agents.contains("fan-out off: each node pulls from the registry (f on Plan)"),
        "agents fan out through the in-cluster cache: {agents}"
    );
    // The machine-config daemons try every node: the one without room is named, not skipped.
    let mut state = state();
    state.mode = Mode::Confirm(crate::ui::state::Confirm {
        set: "monitoring".into(),
        nodes: vec!["worker-0".into(), "worker-1".into()],
        no_space: vec!["worker-0".into()],
        skips_no_space: Puller::Daemons.skips_no_space(),
        unpin: false,
        fan_out: false,
    });
    let daemons = screen_text(&state);
    assert!(
        daemons.contains("apply set monitoring to 2 node(s)? y/n")
            && daemons.contains("no room by the plan: worker-0; the daemons will fail there"),
        "{daemons}"
    );
}

#[test]
fn on_agents_a_set_that_targets_every_node_follows_the_nodes_that_join() {
    use crate::fleet::Traits;
    use crate::model::node_summary::NodeSummary;
    let theme = Theme::named("monochrome").unwrap();
    let mut state = State::new("agents: lab", theme, false, Instant::now());
    state.join_fleet(Traits::AGENTS, None, std::time::SystemTime::now());
    state.sets.push(crate::ui::state::SetDraft::new(
        crate::model::set::from_flags("web", &[]),
        Default::default(),
    ));
    let nodes = |names: &[&str]| {
        Msg::NodesUpdated(
            names
                .iter()
                .map(|n| NodeSummary {
                    name: n.to_string(),
                    ..NodeSummary::default()
                })
                .collect(),
        )
    };
    let targets = |state: &State| state.sets[0].targets.iter().cloned().collect::<Vec<_>>();
    update(&mut state, nodes(&["n1", "n2"]));
    assert_eq!(
        targets(&state),
        ["n1", "n2"],
        "the agents' nodes, once they report"
    );
    update(&mut state, nodes(&["n1", "n2", "n3"]));
    assert_eq!(targets(&state), ["n1", "n2", "n3"], "n3 joined");
    // Chosen nodes stay chosen.
    state.sets[0].targets.remove("n1");
    update(&mut state, nodes(&["n1", "n2", "n3", "n4"]));
    assert_eq!(targets(&state), ["n2", "n3"]);
}

#[test]
fn f_on_the_plan_screen_turns_fan_out_on_for_the_next_apply_and_the_rollout_counts_link_bytes() {
    let mut state = state();
    let link = state.survey.as_ref().unwrap().link_bytes;
    assert!(link.fan_out < link.direct, "{link:?}");
    assert!(type_keys(&mut state, "2f").is_empty());
    assert!(!state.fan_out, "f does nothing on the Sets screen");
    type_keys(&mut state, "3");
    let plan = screen_text(&state);
    let figures = format!(
        "link: {} direct, {} with fan-out (f: off)",
        human(link.direct),
        human(link.fan_out)
    );
    assert!(plan.contains(&figures), "{plan}");
    type_keys(&mut state, "f");
    assert!(state.fan_out);
    assert_eq!(
        state.flash().unwrap(),
        format!(
            "fan-out on: {} over the registry link instead of {}; nodes pull through pinboard's blob cache",
            human(link.fan_out),
            human(link.direct)
        )
    );
    assert!(screen_text(&state).contains("with fan-out (f: on)"));
    // The monitoring set, on the nodes with room.
    type_keys(&mut state, "2<Tab><Tab>j3a");
    let shown = screen_text(&state);
    assert!(
        shown.contains("fan-out on: every blob crosses the registry link once"),
        "{shown}"
    );
    let cmds = type_keys(&mut state, "y");
    assert!(
        matches!(cmds.as_slice(), [Cmd::Apply { fan_out: true, .. }]),
        "{cmds:?}"
    );
    let summary = |state: &State| {
        let text = screen_text(state);
        text.lines()
            .find(|l| l.contains("overall"))
            .unwrap_or_default()
            .to_string()
    };
    // Until the backend says the rollout is fanned out, the link carries what the nodes fetch.
    assert!(
        summary(&state).contains("link 0 B ·"),
        "{}",
        summary(&state)
    );
    update(&mut state, Msg::FanOut(FanOutNodes::default()));
    assert!(
        summary(&state).contains("link 0 B (fan-out)"),
        "{}",
        summary(&state)
    );
    update(&mut state, Msg::LinkBytes(5 << 20));
    let link = format!("link {} (fan-out)", human(5 << 20));
    assert!(summary(&state).contains(&link), "{}", summary(&state));
    // On agents, a node some of whose pulls went to the source while the cache was away: the figure says
    // what it leaves out.
    update(
        &mut state,
        Msg::FanOut(FanOutNodes {
            link_rate: None,
            direct: Vec::new(),
            partly: vec!["n2".into()],
        }),
    );
    update(&mut state, Msg::LinkBytes(5 << 20));
    let link = format!(
        "link {} (fan-out; not counted: what n2 took from the source)",
        human(5 << 20)
    );
    assert!(summary(&state).contains(&link), "{}", summary(&state));
    // A node that pulled from the registry itself (its agent could not relay): named beside the figure,
    // which counts its bytes.
    update(
        &mut state,
        Msg::FanOut(FanOutNodes {
            link_rate: None,
            direct: vec!["n3".into()],
            partly: Vec::new(),
        }),
    );
    update(&mut state, Msg::LinkBytes(5 << 20));
    assert!(
        summary(&state).contains("(fan-out; n3 pulled from the registry itself)"),
        "{}",
        summary(&state)
    );

    // Off again: the next confirmation says so.
    type_keys(&mut state, "3f");
    assert!(!state.fan_out);
    assert_eq!(
        state.flash().unwrap(),
        "fan-out off: every node pulls from the registry itself"
    );
}

#[test]
fn f_on_agents_fans_the_set_out_through_the_in_cluster_cache_and_says_whether_one_serves() {
    use crate::fleet::Traits;
    let mut state = state();
    state.fleet = Traits::AGENTS;
    let link = state.survey.as_ref().unwrap().link_bytes;
    type_keys(&mut state, "3f");
    assert!(state.fan_out);
    let flash = state.flash().unwrap().to_string();
    assert!(
        flash.starts_with(&format!(
            "fan-out on: {} over the registry link instead of {}",
            human(link.fan_out),
            human(link.direct)
        )) && flash.contains("no agent serves the in-cluster cache")
            && flash.contains("pinboard agent manifests --cache"),
        "{flash}"
    );
    type_keys(&mut state, "f");
    assert!(!state.fan_out);
    // n2's agent holds the cache's role.
    let mut nodes = state.nodes.clone();
    nodes[1].cache = Some("http://10.0.0.2:5050".into());
    let holder = nodes[1].name.clone();
    update(&mut state, Msg::NodesUpdated(nodes));
    type_keys(&mut state, "3f");
    let flash = state.flash().unwrap().to_string();
    assert!(
        flash.contains(&format!(
            "the set gets spec.fanOut: its nodes pull through the in-cluster cache at \
             http://10.0.0.2:5050 (held by {holder})"
        )),
        "{flash}"
    );
    type_keys(&mut state, "2<Tab><Tab>j3a");
    assert!(
        screen_text(&state).contains("fan-out on: through the in-cluster cache, each blob once"),
        "{:?}\n{}",
        state.flash(),
        screen_text(&state)
    );
    let cmds = type_keys(&mut state, "y");
    assert!(
        matches!(cmds.as_slice(), [Cmd::Apply { fan_out: true, .. }]),
        "{cmds:?}"
    );
}

#[test]
fn on_agents_without_a_cache_the_dialog_and_the_summary_say_so_and_never_fan_out() {
    use crate::fleet::Traits;
    let mut state = state();
    state.fleet = Traits::AGENTS;
    type_keys(&mut state, "3f");
    assert!(state.flash().unwrap().contains(NO_CACHE));
    type_keys(&mut state, "2<Tab><Tab>j3a");
    let shown = screen_text(&state);
    assert!(
        shown.contains(&format!("fan-out on, but {NO_CACHE}")),
        "{shown}"
    );
    assert!(!shown.contains("each blob once"), "{shown}");
    type_keys(&mut state, "y");
    // The agents pulled from the registry themselves, as their reports say.
    let nodes: Vec<String> = state.rollout.nodes().keys().cloned().collect();
    update(
        &mut state,
        Msg::FanOut(FanOutNodes {
            direct: nodes,
            ..FanOutNodes::default()
        }),
    );
    let summary = screen_text(&state)
        .lines()
        .find(|l| l.contains("overall"))
        .unwrap_or_default()
        .to_string();
    assert!(
        summary.contains(&format!(
            "({NO_CACHE}: every node pulled from the registry)"
        )) && !summary.contains("(fan-out"),
        "{summary}"
    );
}

#[test]
fn unpin_asks_first_and_keeps_the_images() {
    let mut state = state();
    // A set that breaks a rule can still be unpinned: its valid entries may be pinned.
    type_keys(&mut state, "2U");
    let shown = screen_text(&state);
    assert!(
        shown.contains("unpin set upgrade-4.19 from 3 node(s)? y/n (images stay)"),
        "{shown}"
    );
    assert_eq!(
        type_keys(&mut state, "F"),
        [],
        "nothing to force when unpinning"
    );
    let cmds = type_keys(&mut state, "y");
    let [Cmd::Unpin { set, nodes }] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!((set.name.as_str(), nodes.len()), ("upgrade-4.19", 3));
    assert!(state.flash().unwrap().contains("images stay"));

    let mut readonly = self::state();
    readonly.readonly = true;
    assert_eq!(type_keys(&mut readonly, "2U"), []);
    assert!(readonly.flash().unwrap().contains("read-only"));
}

#[test]
fn a_release_pull_spec_at_the_import_prompt_reads_the_release() {
    let mut state = state();
    type_keys(&mut state, "2I");
    let pullspec = "quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64";
    let cmds = type_keys(&mut state, &format!("{pullspec}<Enter>"));
    assert_eq!(cmds, [Cmd::ImportRelease(pullspec.into())]);
    let mut set = crate::model::set::from_flags("release-4.19.3", &[demo::UBI.into()]);
    set.origin = crate::model::set::Origin::Release {
        image: "quay.io/openshift-release-dev/ocp-release@sha256:ab".into(),
        version: "4.19.3".into(),
        component: None,
    };
    let note = "release 4.19.3 (quay.io/…): 1 images in set release-4.19.3".to_owned();
    update(&mut state, Msg::ReleaseRead(Ok((vec![set], note.clone()))));
    let draft = state.selected_set().unwrap();
    assert_eq!(draft.set.name, "release-4.19.3");
    let shown = screen_text(&state);
    assert!(shown.contains(&note), "the note is said: {shown}");
    assert!(
        shown.contains("from release 4.19.3 (quay.io/openshift-release-dev/ocp-release@sha256:ab)"),
        "{shown}"
    );
    // Paths stay files, even with a colon in the name.
    type_keys(&mut state, "I");
    let cmds = type_keys(&mut state, "./backups/sets:old.yaml<Enter>");
    assert_eq!(
        cmds,
        [Cmd::ReadFile(
            "./backups/sets:old.yaml".into(),
            FilePurpose::ImportSet
        )]
    );
    update(
        &mut state,
        Msg::ReleaseRead(Err(Failure::bad_input("manifest not found"))),
    );
    assert!(screen_text(&state).contains("cannot read the release: manifest not found"));
}

#[test]
fn import_reads_the_file_and_adds_its_entries() {
    let mut state = state();
    type_keys(&mut state, "2I");
    let cmds = type_keys(&mut state, "sets/extra.yaml<Enter>");
    let path = PathBuf::from("sets/extra.yaml");
    assert_eq!(cmds, [Cmd::ReadFile(path.clone(), FilePurpose::ImportSet)]);
    let yaml = format!(
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: \
         monitoring\nspec:\n  pinnedImages:\n  - name: {}\n",
        demo::UBI
    );
    update(
        &mut state,
        Msg::FileRead {
            path,
            purpose: FilePurpose::ImportSet,
            result: Ok(yaml),
        },
    );
    let draft = state.selected_set().unwrap();
    assert_eq!(draft.set.name, "monitoring-2", "names stay unique");
    assert_eq!(draft.set.references().collect::<Vec<_>>(), [demo::UBI]);
    // A list file adds to the selected set.
    update(
        &mut state,
        Msg::FileRead {
            path: "more.txt".into(),
            purpose: FilePurpose::ImportSet,
            result: Ok(format!("# more\n{}\n", demo::ART)),
        },
    );
    assert_eq!(state.selected_set().unwrap().set.entries.len(), 2);
}

#[test]
fn export_writes_yaml_that_reads_back_as_the_same_set() {
    let mut state = state();
    type_keys(&mut state, "2<Tab><Tab>j");
    type_keys(&mut state, "e");
    let cmds = type_keys(&mut state, "<Enter>");
    let [Cmd::WriteFile(path, yaml)] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!(path, &PathBuf::from("monitoring.yaml"));
    let sets = crate::model::set::parse_yaml(yaml, "monitoring.yaml").unwrap();
    let original = &state.selected_set().unwrap().set;
    assert_eq!(sets[0].name, original.name);
    assert_eq!(sets[0].labels, original.labels);
    assert!(sets[0].references().eq(original.references()));
    assert!(
        yaml.starts_with(
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"
        ),
        "{yaml}"
    );
}

#[test]
fn lazy_toggle_and_survey_become_commands() {
    let mut state = state();
    assert_eq!(
        type_keys(&mut state, "1jL"),
        [Cmd::ToggleLazy {
            node: "worker-1".into(),
            enable: true
        }]
    );
    // Survey refuses while a set breaks a rule, then covers every set and the union of their targets.
    assert!(type_keys(&mut state, "3p").is_empty());
    type_keys(&mut state, "2d");
    let cmds = type_keys(&mut state, "p");
    let [Cmd::Survey { sets, nodes }] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!((sets.len(), nodes.len()), (2, 3));
    assert!(state.surveying);
}

#[test]
fn ticks_redraw_only_when_time_shows() {
    let mut state = state();
    state.take_dirty();
    let later = state.now + Duration::from_secs(10);
    update(&mut state, Msg::Tick(later));
    assert!(
        !state.take_dirty(),
        "nothing on the Nodes screen depends on time"
    );
    type_keys(&mut state, "4");
    state.take_dirty();
    update(&mut state, Msg::Tick(later + Duration::from_secs(1)));
    assert!(
        state.take_dirty(),
        "a rollout is running: elapsed and ETA move"
    );
}

#[test]
fn a_large_rollout_draws_only_its_visible_rows() {
    let mut state = state();
    let now = state.now;
    let images: Vec<String> = (0..500)
        .map(|i| format!("quay.io/app/image-{i}@sha256:{i:064}"))
        .collect();
    let mut rollout = Rollout::default();
    for n in 0..2000 {
        rollout.apply(Event::NodeStarted {
            node: format!("node-{n:04}"),
            images: images.clone(),
            at: now,
        });
    }
    state.set_rollout(rollout);
    type_keys(&mut state, "4G");
    let shown = text(&render_to_buffer(&state, 120, 40));
    assert!(shown.contains("Nodes [2000/2000]"), "{shown}");
    assert!(shown.contains("node-1999"), "{shown}");
    assert!(!shown.contains("node-0000"), "{shown}");
}

#[test]
fn a_node_pinned_without_the_runtimes_word_is_pinned_star_with_its_legend() {
    let mut state = state();
    let now = state.now;
    let mut rollout = Rollout::default();
    for (node, confirmed) in [("n1", true), ("n2", false)] {
        rollout.apply(Event::NodeStarted {
            node: node.into(),
            images: vec!["a@sha256:1".into()],
            at: now,
        });
        rollout.apply(Event::Pinned {
            node: node.into(),
            method: crate::model::rollout::PinMethod::ContainerdLabel,
            confirmed,
            at: now,
        });
    }
    state.set_rollout(rollout);
    type_keys(&mut state, "4");
    let shown = screen_text(&state);
    assert!(shown.contains("pinned*"), "{shown}");
    assert!(
        shown.contains("* pins written, not confirmed: the runtime does not report pins"),
        "{shown}"
    );
    // Every node confirmed: no legend.
    let mut confirmed = Rollout::default();
    confirmed.apply(Event::Pinned {
        node: "n1".into(),
        method: crate::model::rollout::PinMethod::ContainerdLabel,
        confirmed: true,
        at: now,
    });
    state.set_rollout(confirmed);
    assert!(!screen_text(&state).contains("not confirmed"));
}

#[test]
fn a_crio_node_that_reports_no_bytes_says_so_and_never_shows_0_b_for_a_pull() {
    let mut state = state();
    let now = state.now;
    let image = "q.io/app@sha256:1".to_string();
    let mut rollout = Rollout::default();
    rollout.apply(Event::NodeStarted {
        node: "n1".into(),
        images: vec![image.clone()],
        at: now,
    });
    rollout.apply(Event::NodeBytes {
        node: "n1".into(),
        counted: false,
        note: "CRI-O reports no pull bytes: its metrics are off; `pinboard crio-progress on` …"
            .into(),
    });
    rollout.apply(Event::PullStarted {
        node: "n1".into(),
        image: image.clone(),
        attempt: 1,
        at: now,
    });
    rollout.apply(Event::PullDone {
        node: "n1".into(),
        image,
        at: now,
    });
    state.set_rollout(rollout);
    type_keys(&mut state, "4");
    let shown = screen_text(&state);
    assert!(shown.contains("not reported"), "{shown}");
    assert!(!shown.contains("0 B/0 B"), "{shown}");
    assert!(
        shown.contains("bytes: CRI-O reports no pull bytes: its metrics are off"),
        "the node's detail says why, once: {shown}"
    );
}

#[test]
fn svg_has_every_cell_with_its_color() {
    let theme = Theme::named("dark").unwrap();
    let state = demo_state(Instant::now(), theme.clone());
    let svg = buffer_to_svg(&render_to_buffer(&state, 80, 24), &theme);
    assert!(svg.starts_with("<svg "));
    assert!(svg.contains("worker-0"));
    assert!(
        svg.contains("fill=\"#23d18b\""),
        "light green for ok statuses"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
}

#[test]
fn cluster_screens_say_what_check_would_and_warn_of_kubelets_that_ignore_pins() {
    let mut state = demo::cluster_state(Instant::now(), Theme::named("monochrome").unwrap());
    type_keys(&mut state, "1");
    assert!(
        !screen_text(&state).contains("predates"),
        "worker-0 is fine"
    );
    type_keys(&mut state, "jjjj");
    assert!(
        screen_text(&state)
            .contains("! worker-4: kubelet v1.27.4 predates pinned-image support in image GC"),
        "{}",
        screen_text(&state)
    );
    // The Rollout screen: worker-0 is done on the daemon's word; worker-2 is still pulling after the
    // daemon's sync window ended, not failed.
    type_keys(&mut state, "4");
    state.select(Pane::RolloutNodes, "worker-0");
    let shown = screen_text(&state);
    assert!(
        shown.contains("check: ready (daemon's report; the kubelet lists 3 of 3 images)"),
        "{shown}"
    );
    state.select(Pane::RolloutNodes, "worker-2");
    let shown = screen_text(&state);
    assert!(shown.contains("check: not ready"), "{shown}");
    assert!(
        shown.contains("✗ set \"ocp-4.19-release\" generation 2: still pulling for 7m00s"),
        "{shown}"
    );
}

macro_rules! snapshots {
    ($($name:ident: $screen:literal;)*) => {$(
        #[test]
        fn $name() {
            let theme = Theme::named("monochrome").unwrap();
            let (_, state) = demo::screens(Instant::now(), &theme)
                .into_iter()
                .find(|(name, _)| *name == $screen)
                .expect("demo::screens has it");
            for (width, height) in [(120, 40), (80, 24)] {
                let name = format!("{}_{width}x{height}", stringify!($name));
                insta::assert_snapshot!(name, text(&render_to_buffer(&state, width, height)));
            }
        }
    )*};
}

snapshots! {
    nodes_screen: "nodes";
    sets_screen: "sets";
    plan_screen: "plan";
    rollout_screen: "rollout";
    config_screen: "config";
    help_screen: "help";
    apply_confirmation: "apply";
    cluster_nodes_screen: "cluster-nodes";
    cluster_sets_screen: "cluster-sets";
    cluster_rollout_screen: "cluster-rollout";
}

#[test]
fn v_on_agents_checks_the_rolled_out_set_now_and_says_the_verdict_once() {
    use crate::fleet::Traits;
    use crate::model::readiness::Readiness;
    let mut state = state();
    // Direct mode: pinboard's own rollout asks the runtimes as it goes; nothing to send.
    type_keys(&mut state, "4");
    assert!(type_keys(&mut state, "v").is_empty());
    state.fleet = Traits::AGENTS;
    assert!(type_keys(&mut state, "v").is_empty());
    assert_eq!(state.flash().unwrap(), "no rollout yet: apply a set first");
    type_keys(&mut state, "2<Tab><Tab>j3a");
    let set = match type_keys(&mut state, "y").as_slice() {
        [Cmd::Apply { set, .. }] => set.name.clone(),
        cmds => panic!("{cmds:?}"),
    };
    let cmds = type_keys(&mut state, "v");
    assert!(
        matches!(cmds.as_slice(), [Cmd::Check { set: checked }] if *checked == set),
        "{cmds:?}"
    );
    assert!(
        state
            .flash()
            .unwrap()
            .contains("each node's agent asks its runtime now")
    );
    let node = |name: &str, reasons: &[&str]| {
        serde_json::json!({"node": name, "runtime": null, "reachable": true, "pinMethod": null,
            "ready": reasons.is_empty(), "reasons": reasons, "images": []})
    };
    let readiness = |nodes: Vec<serde_json::Value>| -> Readiness {
        let ready = nodes.iter().all(|n| n["ready"] == true);
        serde_json::from_value(serde_json::json!({"ready": ready, "readyNodes": 0, "nodes": nodes}))
            .unwrap()
    };
    let checked = |state: &mut State, result| {
        let set = set.clone();
        update(state, Msg::Checked { set, result });
        state.flash().unwrap().to_string()
    };
    let said = checked(
        &mut state,
        Ok(readiness(vec![node("n1", &[]), node("n2", &[])])),
    );
    assert_eq!(
        said,
        format!("check of set {set}: ready on 2 node(s), as of now (each agent asked its runtime)")
    );
    let unanswered = "set \"s\": the agent on node \"n2\" has not answered this check";
    let said = checked(
        &mut state,
        Ok(readiness(vec![
            node("n1", &[]),
            node("n2", &[unanswered, "1 image missing"]),
        ])),
    );
    assert_eq!(
        said,
        format!("check of set {set}: not ready: n2: {unanswered} (and 1 more)")
    );
}

//! The TUI's real backend: carries out [`Cmd`]s on the [`Fleet`] the arguments name and reports back with
//! [`Msg`]s. Every figure and every write goes through the same fleet operations the headless commands
//! use; this file only translates between them and the UI.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use super::TuiArgs;
use super::msg::{Cmd, Msg};
use super::run::{UiBackend, execute_file_cmd, read_release};
use super::state::{SetDraft, State};
use super::theme::Theme;
use crate::engine::Control;
use crate::error::Failure;
use crate::fanout::Update;
use crate::fleet::{Events, Fleet, FleetEvent, RolloutControl, SetSources};
use crate::model::image::Platform;
use crate::model::release_payload::SetOptions;
use crate::options::Caller;

/// Opens the TUI on the nodes and sets of `args`; returns when the operator quits.
pub async fn run(args: TuiArgs) -> Result<(), Failure> {
    let common = &args.common;
    let fleet: Arc<dyn Fleet> = Arc::from(
        common
            .fleet(Caller::Tui {
                readonly: args.readonly,
            })
            .await?,
    );
    let platform = common.targets.platform()?;
    let theme = theme_of(&args)?;
    fleet.connect().await?;
    let (registry, warnings) = fleet.registry().await?;
    let sources = common.input.sources();
    let (sets, mut notes) =
        crate::fleet::sets::resolve(&sources, false, &registry, &platform).await?;
    let denied = match args.readonly {
        true => None,
        false => fleet.write_denied().await,
    };
    let mut state = State::new(fleet.label(), theme, args.readonly, Instant::now());
    state.stall_after = Duration::from_secs(args.stall_after.max(1));
    state.join_fleet(fleet.traits(), denied, SystemTime::now());
    state.fan_out = common.rollout.fan_out && state.fans_out();
    for warning in warnings {
        tracing::warn!("{warning}");
        notes.push(warning);
    }
    if !notes.is_empty() {
        state.say(notes.join("; "));
    }
    let every_node: BTreeSet<String> = fleet.nodes().into_iter().collect();
    state.sets = sets
        .iter()
        .map(|set| SetDraft::new(set.clone(), every_node.clone()))
        .collect();
    let options = common.input.release.set_options();
    let backend = Live::new(Arc::clone(&fleet), sets, options, platform);
    let ran = super::run::run(state, backend).await;
    // A rollout still under way was cancelled when the UI went: wait for it to put fan-out's files back.
    fleet.shut_down().await;
    ran.map_err(|e| Failure::bad_input(format!("terminal UI failed: {e:#}")))
}

/// The theme `--theme` names; monochrome whenever NO_COLOR is set.
fn theme_of(args: &TuiArgs) -> Result<Theme, Failure> {
    match &args.theme {
        Some(name) if std::env::var_os("NO_COLOR").is_none() => {
            Theme::named(name).map_err(Failure::from)
        }
        _ => Ok(Theme::from_env()),
    }
}

/// The backend on a fleet.
pub struct Live {
    fleet: Arc<dyn Fleet>,
    initial_sets: Vec<crate::model::set::ImageSet>,
    /// How a release typed at the import prompt becomes sets (`--pool`, `--exclude`, `--release-name`).
    release_options: SetOptions,
    platform: Platform,
    /// The running rollout's controls; None when no rollout runs.
    control: Option<RolloutControl>,
}

impl Live {
    /// A backend on `fleet`, starting with `sets`.
    pub fn new(
        fleet: Arc<dyn Fleet>,
        sets: Vec<crate::model::set::ImageSet>,
        release_options: SetOptions,
        platform: Platform,
    ) -> Live {
        Live {
            fleet,
            initial_sets: sets,
            release_options,
            platform,
            control: None,
        }
    }

    /// A channel the fleet tells its events on, each passed on to `tx` as the UI's message.
    fn events(tx: &UnboundedSender<Msg>) -> Events {
        let (events, mut received) = unbounded_channel();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(event) = received.recv().await {
                if tx.send(message(event)).is_err() {
                    return;
                }
            }
        });
        events
    }

    fn control(&self, control: Control, tx: &UnboundedSender<Msg>) {
        let sent = self
            .control
            .as_ref()
            .is_some_and(|c| c.send(control).is_ok());
        if !sent {
            let _ = tx.send(Msg::Notice(
                "no rollout is running: apply a set first".into(),
            ));
        }
    }
}

/// What the UI makes of a fleet's event.
fn message(event: FleetEvent) -> Msg {
    match event {
        FleetEvent::Nodes(nodes) => Msg::NodesUpdated(nodes),
        FleetEvent::ConfigViews(views) => Msg::ConfigViews(views),
        FleetEvent::Cluster(update) => Msg::Cluster(update),
        FleetEvent::Kubelets(read) => Msg::Kubelets(read),
        FleetEvent::ImageFs(read) => Msg::ImageFs(read),
        FleetEvent::Surveyed(survey) => Msg::SurveyDone(Ok(survey)),
        FleetEvent::Rollout(Update::Event(event)) => Msg::Rollout(event),
        FleetEvent::Rollout(Update::FanOut(nodes)) => Msg::FanOut(nodes),
        FleetEvent::Rollout(Update::LinkBytes(bytes)) => Msg::LinkBytes(bytes),
        FleetEvent::RolloutFinished(result) => Msg::EngineFinished(result),
        FleetEvent::Notice(text) => Msg::Notice(text),
    }
}

impl UiBackend for Live {
    fn start(&mut self, tx: &UnboundedSender<Msg>) {
        self.fleet.watch(Self::events(tx));
        self.fleet
            .refresh(self.initial_sets.clone(), Self::events(tx));
    }

    fn execute(&mut self, cmd: Cmd, tx: &UnboundedSender<Msg>) {
        let Some(cmd) = execute_file_cmd(cmd, tx) else {
            return;
        };
        match cmd {
            Cmd::Quit | Cmd::ReadFile(..) | Cmd::WriteFile(..) => {}
            Cmd::ImportRelease(pullspec) => {
                let (fleet, platform, options, tx) = (
                    Arc::clone(&self.fleet),
                    self.platform.clone(),
                    self.release_options.clone(),
                    tx.clone(),
                );
                tokio::spawn(async move {
                    match fleet.registry().await {
                        Ok((registry, _)) => {
                            read_release(registry, platform, options, pullspec, &tx)
                        }
                        Err(e) => {
                            let _ = tx.send(Msg::ReleaseRead(Err(e)));
                        }
                    }
                });
            }
            Cmd::Survey { sets, nodes } => {
                self.fleet.refresh(sets.clone(), Self::events(tx));
                let (fleet, tx) = (Arc::clone(&self.fleet), tx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(Msg::SurveyDone(fleet.survey(sets, nodes).await));
                });
            }
            Cmd::Apply {
                set,
                nodes,
                force,
                fan_out,
            } => {
                if self.control.as_ref().is_some_and(|c| !c.is_closed()) {
                    let _ = tx.send(Msg::Notice("a rollout is already running".into()));
                    return;
                }
                self.control = self
                    .fleet
                    .roll_out(set, nodes, force, fan_out, Self::events(tx));
            }
            Cmd::Check { set } => {
                let (fleet, tx) = (Arc::clone(&self.fleet), tx.clone());
                tokio::spawn(async move {
                    let sources = SetSources {
                        sets: vec![set.clone().into()],
                        ..SetSources::default()
                    };
                    let result = fleet.readiness(&sources, None).await;
                    let _ = tx.send(Msg::Checked { set, result });
                });
            }
            Cmd::Unpin { set, nodes } => self.fleet.release(set, nodes, Self::events(tx)),
            Cmd::Retry { node, image } => self.control(Control::Retry { node, image }, tx),
            Cmd::Cancel { node, image } => self.control(Control::Cancel { node, image }, tx),
            Cmd::ToggleLazy { node, enable } => self.fleet.set_lazy(node, enable, Self::events(tx)),
        }
    }
}

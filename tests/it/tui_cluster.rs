//! The TUI in cluster mode against the lab's real kube-apiserver: its backend ([`Live`] on an OpenShift
//! fleet) watching and
//! writing, the state folding what it sends through the same `update` the terminal loop uses, and the
//! screens drawn from that state. The tests play the machine-config daemon.

use crate::support;
use pinboard::fleet::Traits;

use std::time::SystemTime;

use pinboard::backend::openshift::ConnectOptions;
use pinboard::backend::registry::RegistryOptions;
use pinboard::fleet::Fleet;
use pinboard::fleet::machine_config::registry::RegistrySettings;
use pinboard::fleet::machine_config::{MachineConfigFleet, MachineConfigSettings};
use pinboard::model::image::Platform;
use pinboard::model::lazy::LazyPulling;
use pinboard::model::machine_config::{ROLE_LABEL, lazy_config_name};
use pinboard::model::plan::{Limits, SpaceSource};
use pinboard::model::release_payload::SetOptions;
use pinboard::model::set::from_flags;
use pinboard::ui::live::Live;
use pinboard::ui::msg::{Cmd, Msg};
use pinboard::ui::render::{buffer_text, render_to_buffer};
use pinboard::ui::run::UiBackend;
use pinboard::ui::state::State;
use pinboard::ui::theme::Theme;
use pinboard::ui::update::update;
use serde_json::json;
use support::cluster::{WAIT, client, discover, openshift};
use support::{ImageSpec, LayerFormat, LayerSpec};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// A TUI session: the state, the backend, and the channel the backend answers on.
struct Session {
    state: State,
    backend: Live,
    tx: UnboundedSender<Msg>,
    rx: UnboundedReceiver<Msg>,
    notices: Vec<String>,
}

impl Session {
    async fn new(kubeconfig: &std::path::Path, registry_host: String) -> Session {
        let theme = Theme::named("monochrome").unwrap();
        let mut state = State::new("cluster: lab", theme, false, std::time::Instant::now());
        state.join_fleet(Traits::MACHINE_CONFIG, None, SystemTime::now());
        let fleet = MachineConfigFleet::new(MachineConfigSettings {
            connect: ConnectOptions {
                kubeconfig: Some(kubeconfig.to_owned()),
                context: None,
            },
            registry: RegistrySettings {
                options: RegistryOptions {
                    insecure_registries: vec![registry_host],
                    ..RegistryOptions::default()
                },
                no_pull_secret: true,
            },
            platform: Platform::host(),
            limits: Limits::default(),
            cache_dir: None,
            verify: None,
            lazy_store: "/var/lib/stargz-store/store:ref".to_owned(),
            release: SetOptions::default(),
            agents_namespace: "pinboard-system".to_owned(),
        });
        fleet.connect().await.expect("the lab's cluster answers");
        let backend = Live::new(
            std::sync::Arc::new(fleet),
            Vec::new(),
            SetOptions::default(),
            Platform::host(),
        );
        let (tx, rx) = unbounded_channel();
        let mut session = Session {
            state,
            backend,
            tx,
            rx,
            notices: Vec::new(),
        };
        session.backend.start(&session.tx);
        session
    }

    /// Folds the backend's messages into the state (carrying out the commands `update` returns) until
    /// `done` holds; panics with the screen after [`WAIT`].
    async fn until(&mut self, what: &str, done: impl Fn(&Session) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(msg)) => {
                    if let Msg::Notice(text) = &msg {
                        self.notices.push(text.clone());
                    }
                    for cmd in update(&mut self.state, msg) {
                        self.backend.execute(cmd, &self.tx);
                    }
                }
                _ => panic!(
                    "timed out waiting for: {what}\nnotices: {:?}\n{}",
                    self.notices,
                    self.screen()
                ),
            }
        }
    }

    fn execute(&mut self, cmd: Cmd) {
        self.backend.execute(cmd, &self.tx);
    }

    fn screen(&self) -> String {
        buffer_text(&render_to_buffer(&self.state, 120, 30))
    }

    fn noticed(&self, text: &str) -> bool {
        self.notices.iter().any(|n| n.contains(text))
    }

    fn key(&mut self, c: char) {
        let key = crossterm::event::KeyEvent::new(
            crossterm::event::KeyCode::Char(c),
            crossterm::event::KeyModifiers::NONE,
        );
        for cmd in update(&mut self.state, Msg::Key(key)) {
            self.backend.execute(cmd, &self.tx);
        }
    }
}

fn entry(generation: i64, reached: bool) -> serde_json::Value {
    let mut entry = json!({"name": "release", "desiredGeneration": generation});
    if reached {
        entry["currentGeneration"] = json!(generation);
    }
    entry
}

#[tokio::test]
async fn the_tui_follows_and_writes_the_cluster() {
    let lab = support::cluster::lab("tui-cluster");
    let apiserver = lab.apiserver().unwrap();
    let (admin, writer) = openshift(&lab, &["worker"], &["n1", "n2", "n3"]).await;
    let cluster = writer.cluster.clone();
    assert_eq!(cluster.write_denied().await, None, "the admin may write");

    let host = lab.registry_host();
    let spec = |seed| ImageSpec {
        layers: vec![LayerSpec {
            seed,
            bytes: 64 << 10,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let images: Vec<String> = (0..2)
        .map(|i| {
            let pushed = lab.push_image(&format!("tui/app{i}"), &spec(i)).unwrap();
            pushed.reference(&host)
        })
        .collect();
    let mut tui = Session::new(apiserver.kubeconfig(), host).await;
    tui.until("three nodes, synced", |s| {
        s.state.nodes.len() == 3 && s.screen().contains("API synced")
    })
    .await;
    assert!(tui.screen().contains("3/3 reachable"), "{}", tui.screen());

    // A set that lands in no pool is refused; one labelled for workers is applied.
    let mut stray = from_flags("stray", &images[..1]);
    stray.labels.insert(ROLE_LABEL.into(), "infra".into());
    tui.execute(Cmd::Apply {
        fan_out: false,
        set: stray,
        nodes: Vec::new(),
        force: false,
    });
    tui.until("the stray set refused", |s| s.noticed("not applied"))
        .await;
    assert!(
        tui.noticed("matches no MachineConfigPool"),
        "{:?}",
        tui.notices
    );
    let mut release = from_flags("release", &images);
    release.labels.insert(ROLE_LABEL.into(), "worker".into());
    tui.execute(Cmd::Apply {
        fan_out: false,
        set: release,
        nodes: Vec::new(),
        force: false,
    });
    tui.key('4');
    tui.until("the set on the Rollout screen, every node waiting", |s| {
        s.noticed("applied PinnedImageSet release (generation 1)")
            && s.screen().contains("nodes: · 3 waiting")
    })
    .await;

    // The daemon: n1 done, n2 pulling, n3 failed; the screen says so, with the daemon's error.
    writer.daemon("n1", entry(1, true), false, None).await;
    writer.daemon("n2", entry(1, false), true, None).await;
    let mut failed = entry(1, false);
    failed["lastFailedGeneration"] = json!(1);
    failed["lastFailedGenerationError"] = json!("no space left on device");
    writer
        .daemon(
            "n3",
            failed,
            false,
            Some("One or more PinnedImageSet is experiencing an error"),
        )
        .await;
    tui.until("done, pulling, failed", |s| {
        s.screen()
            .contains("nodes: ✓ 1 done ↓ 1 pulling ✗ 1 failed")
    })
    .await;
    assert!(
        tui.screen().contains("no space left on device"),
        "{}",
        tui.screen()
    );

    // Lazy pulling for n1's pool: a ContainerRuntimeConfig appears, and the Nodes screen says on.
    let configs = kube::Api::<kube::core::DynamicObject>::all_with(
        admin.clone(),
        &cluster.resources().runtime_config,
    );
    tui.execute(Cmd::ToggleLazy {
        node: "n1".into(),
        enable: true,
    });
    tui.until("lazy pulling on for the pool", |s| {
        s.state
            .nodes
            .iter()
            .all(|n| n.lazy_pulling == Some(LazyPulling::of_pool(true)))
    })
    .await;
    let written = configs.get(&lazy_config_name("worker")).await.unwrap();
    assert_eq!(
        written.data["spec"]["containerRuntimeConfig"]["additionalLayerStores"][0]["path"],
        "/var/lib/stargz-store/store:ref"
    );
    tui.execute(Cmd::ToggleLazy {
        node: "n1".into(),
        enable: false,
    });
    tui.until("lazy pulling off again", |s| {
        s.state
            .nodes
            .iter()
            .all(|n| n.lazy_pulling == Some(LazyPulling::of_pool(false)))
    })
    .await;

    // The Plan comes from the cluster's figures: allocatable ephemeral-storage, no kubelet here.
    let sets: Vec<_> = tui.state.sets.iter().map(|d| d.set.clone()).collect();
    assert!(
        sets.iter().any(|s| s.name == "release"),
        "the cluster's set joined the composer"
    );
    tui.execute(Cmd::Survey {
        sets,
        nodes: Vec::new(),
    });
    tui.until("the survey", |s| {
        s.state.survey.is_some() || s.noticed("survey failed")
    })
    .await;
    let survey = tui.state.survey.as_ref().expect("the survey succeeds");
    assert_eq!(survey.nodes.len(), 3);
    for node in &survey.nodes {
        assert_eq!(
            node.space_source,
            Some(SpaceSource::AllocatableEphemeralStorage)
        );
        assert_eq!(node.available_bytes, Some(100 << 30));
        assert!(
            node.fetch_bytes > 0,
            "nothing is on the nodes yet: {node:?}"
        );
    }
    tui.key('3');
    assert!(tui.screen().contains("n1"), "{}", tui.screen());

    // Unpin deletes the set.
    let set = tui.state.selected_set().unwrap().set.clone();
    tui.execute(Cmd::Unpin {
        set,
        nodes: Vec::new(),
    });
    tui.until("the set deleted", |s| {
        s.noticed("deleted PinnedImageSet release")
    })
    .await;
    tui.key('4');
    tui.until("no set left on the Rollout screen", |s| {
        s.screen().contains("no PinnedImageSet on the cluster yet")
    })
    .await;

    // A viewer gets a read-only session that says why, and its write keys are refused.
    let viewer_config = lab.dir().join("viewer-kubeconfig");
    let admin_text = std::fs::read_to_string(apiserver.kubeconfig()).unwrap();
    let token_line = admin_text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .expect("the lab's kubeconfig has a token");
    std::fs::write(
        &viewer_config,
        admin_text.replace(
            token_line,
            &format!("    token: {}", apiserver.viewer_token()),
        ),
    )
    .unwrap();
    let viewer = discover(&client(&viewer_config, None).await).await;
    let denied = viewer.write_denied().await;
    assert!(
        denied
            .as_deref()
            .is_some_and(|d| d.contains("pinboard-operator")),
        "{denied:?}"
    );
    let mut read_only = State::new(
        "cluster: viewer",
        Theme::named("monochrome").unwrap(),
        false,
        std::time::Instant::now(),
    );
    read_only.join_fleet(Traits::MACHINE_CONFIG, denied, SystemTime::now());
    assert!(read_only.readonly);
    let shown = render_to_buffer(&read_only, 120, 10);
    let text: String = shown.content().iter().map(|c| c.symbol()).collect();
    assert!(text.contains("read-only"), "{text}");
}

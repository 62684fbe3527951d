//! A CRI-O stand-in, as CRI-O cannot run here: a tonic server on a unix socket speaking the real CRI
//! runtime.v1 messages (Version, Status, ListImages, ImageStatus, ImageFsInfo, PullImage, RemoveImage) and
//! behaving as CRI-O does with pins, by the version the test chooses (docs/pins.md), written from
//! those facts and not from pinboard's model:
//!
//! - It reads `crio.conf`, then every file under `crio.conf.d` (a walk, each directory's entries sorted by
//!   name, subdirectories entered in place, no extension filter); the last file that sets
//!   `crio.image.pinned_images` wins. It does so at start and on SIGHUP.
//! - Its version decides what a SIGHUP does with pins: nothing before 1.28 (no `pinned_images`) and on
//!   1.28.x (applied at start only), nothing on 1.29.0–1.29.3 (the startup patterns stay, cri-o #7954),
//!   additions only on 1.29.4–1.29.6 and 1.30.0–1.30.2 (removals and `[]` ignored, cri-o #8202), the new
//!   list from 1.29.7 / 1.30.3 / 1.31.0 on.
//! - Its version decides which calls report `pinned`: ListImages from 1.28, ImageStatus only from
//!   1.29.7 / 1.30.6 / 1.31.0. Patterns match as CRI-O's regexes do: case-insensitive; exact; `prefix*`
//!   unanchored; `*keyword*` contains; against every name of the image.
//! - PullImage really resolves the image against the registries it is given (plain HTTP, as a
//!   registries.conf `insecure` entry): manifest (an index resolved to linux/amd64), config and layers,
//!   each checked against its digest, so a missing image fails with c/image's `manifest unknown`. The
//!   image is then recorded in its storage, laid out as containers-storage lays out its graphroot with the
//!   overlay driver: `overlay-images/images.json` (re-read on every call as c/storage does, so a test can
//!   also put an image there under any name, as a `podman pull` into the same storage would), each image
//!   naming its top layer; `overlay-layers/layers.json`, each layer its parent and digests, with IDs made
//!   as containers/image makes them; a directory `overlay/<id>/` per layer. Its config and layers' bytes are
//!   kept in `blobs/` (compressed, once per digest; RemoveImage drops those and the layers no image holds),
//!   so a full image filesystem fails the pull with `no space left on device`. Sizes are the compressed
//!   ones (real CRI-O stores and reports uncompressed sizes). ImageFsInfo names `<storage>/overlay-images`
//!   as the image filesystem, as CRI-O names `<graphroot>/<driver>-images`;
//!   [`CrioStandIn::start_on_tmpfs`] makes the storage a tmpfs of a given size.
//!   [`CrioStandIn::make_lazy`] leaves an image as stargz-store leaves a lazily pulled one: each layer an
//!   additional-layer-store layer (an `additionallayer` file naming the store's copy, `diff` a link to it).
//! - It reads `registries.conf` and `registries.conf.d/*.conf` (by name; a later `[[registry]]` with the
//!   same prefix replaces an earlier one) at start and on SIGHUP, as containers-image does for CRI-O. A
//!   digest reference is pulled from the mirrors of the longest matching prefix that serve digests
//!   (`pull-from-mirror` `all` or `digest-only`), in order, each mirror that fails giving way to the next,
//!   then from the source unless it is `blocked`.
//! - PullImage's credentials are taken as CRI-O takes them: the user and password (`username` and
//!   `password`, or `auth` decoded), nothing else (`identity_token`, `registry_token` and `server_address`
//!   are ignored). A registry that asks for a bearer token gets one from its realm by GET with those
//!   credentials, as containers/image asks.
//!
//! It is a separate process, as CRI-O is: `--crio-reload signal:PIDFILE` reaches it as it reaches CRI-O,
//! a SIGHUP to the pid its pidfile names, and a restart is a new process reading its files again (the
//! test's [`CrioStandIn::restart`]), or the process executing itself again on SIGUSR1 (pinboard's
//! `systemctl restart crio`, through the `systemctl` [`CrioStandIn::systemctl`] writes). In one
//! test process shared by several tests, a signal would reach every test's stand-in. The process is the
//! test binary itself, run again with only its ignored test [`ENTRY`] (declared in tests/it/main.rs) and
//! [`ENV`] naming the stand-in's settings; that test calls [`serve`]. So the stand-in is always built from
//! the same source as the test, with nothing else to build. The lab example runs itself the same way: its
//! `main` calls [`serve`] when [`ENV`] is set.
//!
//! What it did is counted in `status.json` (reloads handled, calls per RPC), for tests to read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use pinboard::backend::proto::cri::{
    AuthConfig, FilesystemIdentifier, FilesystemUsage, Image, ImageFsInfoRequest,
    ImageFsInfoResponse, ImageStatusRequest, ImageStatusResponse, ListImagesRequest,
    ListImagesResponse, PullImageRequest, PullImageResponse, RemoveImageRequest,
    RemoveImageResponse, RuntimeCondition, RuntimeStatus, StatusRequest, StatusResponse,
    UInt64Value, VersionRequest, VersionResponse,
    image_service_server::{ImageService, ImageServiceServer},
    runtime_service_server::{RuntimeService, RuntimeServiceServer},
};
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use super::http;
use super::images::sha256_digest;
use super::lab::{create_unique_dir, mount_tmpfs, target_dir, unmount};
use super::process::{Proc, stop_all};

/// The name of the test that runs the stand-in, in tests/it/main.rs.
const ENTRY: &str = "crio_stand_in";
/// Names the stand-in's settings file in its process. A binary without the test harness (the lab example)
/// runs [`serve`] itself when it is set.
pub const ENV: &str = "PINBOARD_CRIO_STAND_IN";

/// The stand-in's settings, shared by the test and the stand-in's process.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Settings {
    /// As CRI Version reports it, e.g. `1.29.2`.
    version: String,
    socket: PathBuf,
    crio_conf: PathBuf,
    config_dir: PathBuf,
    pidfile: PathBuf,
    /// Its image storage, a containers-storage graphroot (see [`IMAGES_DIR`], [`LAYERS_DIR`], [`LAYER_DIRS`]).
    storage: PathBuf,
    status: PathBuf,
    /// `127.0.0.1:PORT` registries it pulls from over plain HTTP.
    registries: Vec<String>,
    /// Its `registries.conf.d`; `registries.conf` is beside it.
    registries_dir: PathBuf,
}

/// The storage's image records (`images.json`), its layer records (`layers.json`) and its layers'
/// directories, as containers-storage names them for the overlay driver; the image filesystem CRI-O
/// reports is [`IMAGES_DIR`].
const IMAGES_DIR: &str = "overlay-images";
const LAYERS_DIR: &str = "overlay-layers";
const LAYER_DIRS: &str = "overlay";

/// An image in the stand-in's storage, with c/storage's names for what c/storage records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Stored {
    /// The config digest's hex, as CRI-O's image ids are.
    id: String,
    /// Repo tags and repo digests.
    names: Vec<String>,
    /// Its top layer's ID; empty for an image put there without layers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    layer: String,
    size: u64,
    /// Its config's and layers' digests: the storage keeps their bytes in `blobs/`.
    #[serde(default)]
    blobs: Vec<String>,
}

/// A layer in the stand-in's storage, as c/storage's `layers.json` records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct StoredLayer {
    id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    parent: String,
    compressed_diff_digest: String,
    compressed_size: u64,
    diff_digest: String,
}

/// What the stand-in did since it first started, for tests: a restart carries the counts on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Times it started: the first start, then one per restart.
    pub starts: u64,
    /// SIGHUPs handled.
    pub reloads: u64,
    /// Calls per RPC name (`ListImages`, `ImageStatus`, ...).
    pub calls: BTreeMap<String, u64>,
    /// Images pulled, per host that served them (a mirror's or the source's).
    pub pulled_from: BTreeMap<String, u64>,
    /// The `[[registry]]` rules read at start and at each reload, one line per rule: `prefix -> mirror,
    /// mirror (blocked)`; the last are in force.
    pub registries: Vec<Vec<String>>,
}

/// A running stand-in; dropping it stops its process (and unmounts its storage's tmpfs, if it has one).
pub struct CrioStandIn {
    dir: PathBuf,
    settings: Settings,
    settings_file: PathBuf,
    socket_dir: PathBuf,
    procs: Vec<Proc>,
    /// The storage, when it is a tmpfs of its own.
    mounted: Option<PathBuf>,
}

impl CrioStandIn {
    /// Starts a stand-in reporting CRI-O `version`, pulling from `registries`, in
    /// `target/lab/<name>-<pid>-<n>/`, with an empty `crio.conf.d` and a `crio.conf` beside it that sets
    /// no pins; returns once it serves CRI. Write drop-ins before [`CrioStandIn::restart`] to have them read
    /// at start. Its storage, the image filesystem ImageFsInfo reports, is a directory on the disk
    /// `target/` is on.
    pub fn start(name: &str, version: &str, registries: &[String]) -> Result<CrioStandIn> {
        CrioStandIn::start_with(name, version, registries, None)
    }

    /// [`CrioStandIn::start`] with its storage on a tmpfs of `imagefs_bytes` (> 0), as the lab's containerd
    /// nodes have their root: an image filesystem of its own size, which statvfs on the mountpoint
    /// ImageFsInfo reports measures. Unmounted when the stand-in is dropped.
    pub fn start_on_tmpfs(
        name: &str,
        version: &str,
        registries: &[String],
        imagefs_bytes: u64,
    ) -> Result<CrioStandIn> {
        ensure!(
            imagefs_bytes > 0,
            "crio stand-in {name}: imagefs_bytes must be > 0"
        );
        CrioStandIn::start_with(name, version, registries, Some(imagefs_bytes))
    }

    fn start_with(
        name: &str,
        version: &str,
        registries: &[String],
        imagefs_bytes: Option<u64>,
    ) -> Result<CrioStandIn> {
        let (dir, unique) = create_unique_dir(&target_dir().join("lab"), name)?;
        eprintln!("crio stand-in {name}: logs and state in {}", dir.display());
        let etc = dir.join("etc/crio");
        std::fs::create_dir_all(etc.join("crio.conf.d"))?;
        let registries_dir = dir.join("etc/containers/registries.conf.d");
        std::fs::create_dir_all(&registries_dir)?;
        std::fs::write(
            etc.join("crio.conf"),
            "[crio.image]\npause_image = \"registry.k8s.io/pause:3.9\"\n",
        )?;
        // Unix socket paths are short (108 bytes): under /tmp, not the lab directory.
        let socket_dir =
            std::env::temp_dir().join(format!("pinboard-crio-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&socket_dir)?;
        let settings = Settings {
            version: version.to_string(),
            socket: socket_dir.join("crio.sock"),
            crio_conf: etc.join("crio.conf"),
            config_dir: etc.join("crio.conf.d"),
            pidfile: dir.join("crio.pid"),
            storage: dir.join("storage"),
            status: dir.join("status.json"),
            registries: registries.to_vec(),
            registries_dir,
        };
        std::fs::create_dir_all(&settings.storage)?;
        let settings_file = dir.join("stand-in.json");
        std::fs::write(&settings_file, serde_json::to_string_pretty(&settings)?)?;
        let mounted = match imagefs_bytes {
            Some(bytes) => {
                mount_tmpfs(&settings.storage, bytes)?;
                Some(settings.storage.clone())
            }
            None => None,
        };
        // The image filesystem CRI-O reports, made after the tmpfs hides what was under it.
        std::fs::create_dir_all(settings.storage.join(IMAGES_DIR))?;
        let mut stand_in = CrioStandIn {
            dir,
            settings,
            settings_file,
            socket_dir,
            procs: Vec::new(),
            mounted,
        };
        stand_in.launch()?;
        Ok(stand_in)
    }

    fn launch(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.settings.pidfile);
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args([
                "--exact",
                ENTRY,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV, &self.settings_file);
        let log = self.dir.join("crio.log");
        let mut proc = Proc::spawn("crio stand-in", command, &log)?;
        let (socket, pidfile) = (&self.settings.socket, &self.settings.pidfile);
        let ready = proc.wait_ready(Duration::from_secs(30), || {
            pidfile.exists() && std::os::unix::net::UnixStream::connect(socket).is_ok()
        });
        self.procs.push(proc);
        ready
    }

    /// Stops the process and starts a new one on the same files and storage, as `systemctl restart crio`.
    pub fn restart(&mut self) -> Result<()> {
        stop_all(&mut self.procs);
        self.procs.clear();
        self.launch()
    }

    /// `unix:///…/crio.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.settings.socket.display())
    }

    /// `…/etc/crio/crio.conf.d`; `crio.conf` is beside it.
    pub fn config_dir(&self) -> &Path {
        &self.settings.config_dir
    }

    pub fn pidfile(&self) -> &Path {
        &self.settings.pidfile
    }

    /// `…/etc/containers/registries.conf.d`; `registries.conf` is beside it.
    pub fn registries_dir(&self) -> &Path {
        &self.settings.registries_dir
    }

    /// pinboard's arguments for this stand-in as node `name`: its endpoint, its drop-in directory, and its
    /// reload through its pidfile.
    pub fn node_args(&self, name: &str) -> Vec<String> {
        self.node_args_reloading(name, &format!("signal:{}", self.pidfile().display()))
    }

    /// [`CrioStandIn::node_args`] with another `--crio-reload` (`restart`, say).
    pub fn node_args_reloading(&self, name: &str, reload: &str) -> Vec<String> {
        vec![
            "--cri".into(),
            format!("{name}={}", self.endpoint()),
            "--crio-config-dir".into(),
            self.config_dir().display().to_string(),
            "--crio-reload".into(),
            reload.into(),
        ]
    }

    /// A `systemctl` that acts on this stand-in as systemd acts on CRI-O's unit, for pinboard's process:
    /// returns the directory holding it, to put first on that process's `PATH`. It appends each command
    /// line to a log ([`CrioStandIn::systemctl_calls`]). `reload crio` sends SIGHUP to the pidfile's
    /// process, as the unit's `ExecReload` does. `restart crio` restarts the stand-in (SIGUSR1: it executes
    /// itself again, reading its files anew and dropping every CRI connection) and, when `waits`, returns
    /// once it serves again, as `systemctl restart` waits for a `Type=notify` unit such as CRI-O's to be
    /// ready; otherwise at once, as for a unit of `Type=simple` (or `--no-block`), while it is still
    /// starting. Other units are not found.
    pub fn systemctl(&self, waits: bool) -> Result<PathBuf> {
        let bin = self.dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let script = format!(
            r#"#!/bin/sh
# systemctl for the CRI-O stand-in's unit `crio`
printf '%s\n' "$*" >> '{log}'
pidfile='{pidfile}'
if [ "$2" != crio ]; then
  echo "Failed to $1 $2.service: Unit $2.service not found." >&2
  exit 5
fi
case "$1" in
  reload) kill -HUP "$(cat "$pidfile")" ;;
  restart)
    pid=$(cat "$pidfile") || exit 1
    rm -f "$pidfile"
    kill -USR1 "$pid" || exit 1
    tries=0
    while [ -n '{waits}' ] && [ ! -s "$pidfile" ]; do
      tries=$((tries + 1))
      if [ "$tries" -gt 600 ]; then
        echo "Job for crio.service failed because a timeout was exceeded." >&2
        exit 1
      fi
      sleep 0.05
    done ;;
  *)
    echo "Unknown command verb $1." >&2
    exit 1 ;;
esac
"#,
            log = self.systemctl_log().display(),
            pidfile = self.settings.pidfile.display(),
            waits = if waits { "waits" } else { "" },
        );
        let path = bin.join("systemctl");
        std::fs::write(&path, script)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(bin)
    }

    fn systemctl_log(&self) -> PathBuf {
        self.dir.join("systemctl.log")
    }

    /// The command lines [`CrioStandIn::systemctl`] was run with, in order.
    pub fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.systemctl_log())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Puts an image known by `names` into the stand-in's storage, as a `podman pull` into the same
    /// storage would; returns its id.
    pub fn store(&self, names: &[&str]) -> Result<String> {
        let id = sha256_digest(names.join(",").as_bytes())["sha256:".len()..].to_string();
        let image = Stored {
            id: id.clone(),
            names: names.iter().map(|n| n.to_string()).collect(),
            size: 1 << 20,
            ..Stored::default()
        };
        record(&self.settings.storage, image).map_err(anyhow::Error::msg)?;
        Ok(id)
    }

    /// Leaves the stored image named `name` as CRI-O with stargz-store among its additional layer stores
    /// leaves a lazily pulled one (c/storage's `CreateFromAdditionalLayer`): each of its layers' directories
    /// holds an `additionallayer` file naming the layer's directory in the store, and its `diff` is a link
    /// to the store's; the layers' bytes are no longer in the storage. Returns how many layers it has.
    pub fn make_lazy(&self, name: &str) -> Result<usize> {
        let storage = &self.settings.storage;
        let _held = STORAGE.lock().unwrap();
        let image = load(storage)
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .find(|i| i.names.iter().any(|n| n == name))
            .with_context(|| format!("the stand-in holds no image {name}"))?;
        let layers = chain(
            &load_layers(storage).map_err(anyhow::Error::msg)?,
            &image.layer,
        );
        for layer in &layers {
            let digest = &layer.compressed_diff_digest;
            let store = self.dir.join("stargz-store/store").join(digest);
            std::fs::create_dir_all(store.join("diff"))?;
            let dir = storage.join(LAYER_DIRS).join(&layer.id);
            let _ = std::fs::remove_dir_all(dir.join("diff"));
            std::fs::write(dir.join("additionallayer"), store.display().to_string())?;
            std::os::unix::fs::symlink(store.join("diff"), dir.join("diff"))?;
            let _ = std::fs::remove_file(
                storage
                    .join("blobs")
                    .join(digest.trim_start_matches("sha256:")),
            );
        }
        Ok(layers.len())
    }

    /// What it did so far.
    pub fn counts(&self) -> Counts {
        std::fs::read_to_string(&self.settings.status)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    /// Sends SIGHUP to the pid in its pidfile, as `systemctl reload crio` does, and waits until handled.
    pub fn reload(&self) -> Result<()> {
        let pid: i32 = std::fs::read_to_string(&self.settings.pidfile)?
            .trim()
            .parse()?;
        let before = self.counts().reloads;
        // SAFETY: kill(2) takes no pointers; the pid is our stand-in's, which is still running.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            bail!("SIGHUP to {pid}: {}", std::io::Error::last_os_error());
        }
        self.wait_reloads(before + 1)
    }

    /// Waits until it has handled `count` SIGHUPs since it first started.
    pub fn wait_reloads(&self, count: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.counts().reloads < count {
            if Instant::now() > deadline {
                bail!(
                    "the stand-in handled {} reloads, not {count}",
                    self.counts().reloads
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for CrioStandIn {
    fn drop(&mut self) {
        stop_all(&mut self.procs);
        // Bulky data goes (configs and logs stay): the tmpfs with it, or the blobs on the disk.
        match &self.mounted {
            Some(storage) => unmount(storage),
            None => {
                let _ = std::fs::remove_dir_all(self.settings.storage.join("blobs"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.socket_dir);
    }
}

// ---------------------------------------------------------------------------------------------------------
// The stand-in's process

/// Runs the stand-in named by [`ENV`] until it is killed. Only for its process: the test [`ENTRY`].
pub fn serve() {
    let Some(file) = std::env::var_os(ENV) else {
        panic!("{ENTRY} is the CRI-O stand-in's process: CrioStandIn::start runs it with {ENV} set")
    };
    let settings: Settings = serde_json::from_str(
        &std::fs::read_to_string(&file).expect("the stand-in's settings file"),
    )
    .expect("the stand-in's settings");
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(run(settings))
        .expect("the stand-in serves");
}

async fn run(settings: Settings) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Before the pidfile exists: a SIGHUP or SIGUSR1 must never find the default action (exit).
    let mut hangups = signal(SignalKind::hangup())?;
    let mut restarts = signal(SignalKind::user_defined1())?;
    let version = parse_version(&settings.version).context("the stand-in's version")?;
    let pins = if version >= (1, 28, 0) {
        read_pinned_images(&settings).map_err(anyhow::Error::msg)?
    } else {
        Vec::new()
    };
    eprintln!(
        "CRI-O {} starting; pinned_images {pins:?}",
        settings.version
    );
    let rules = read_registries(&settings).map_err(anyhow::Error::msg)?;
    let _ = std::fs::remove_file(&settings.socket);
    let listener = tokio::net::UnixListener::bind(&settings.socket)?;
    // What the process before this one counted, when this is a restart.
    let mut counts: Counts = std::fs::read_to_string(&settings.status)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    counts.starts += 1;
    counts
        .registries
        .push(rules.iter().map(Rule::to_string).collect());
    let state = Arc::new(StandIn {
        version,
        pins: Mutex::new(pins),
        counts: Mutex::new(counts),
        rules: Mutex::new(rules),
        settings,
    });
    state.save_counts();
    std::fs::write(&state.settings.pidfile, std::process::id().to_string())?;
    let runtime = RuntimeServiceServer::new(Shared(state.clone()));
    let images = ImageServiceServer::new(Shared(state.clone()));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                tokio::spawn(serve_connection(stream, runtime.clone(), images.clone()));
            }
            _ = hangups.recv() => state.reload(),
            _ = restarts.recv() => return Err(restart()),
        }
    }
}

/// SIGUSR1, the restart [`CrioStandIn::systemctl`] asks for: the process executes itself again, with the
/// same arguments and environment. Its listener and every CRI connection close (their descriptors are
/// close-on-exec), and the new image reads its files again as a CRI-O that starts; it keeps the pid,
/// so the test still owns it and stops it by that pid. Returns only when the exec failed.
fn restart() -> anyhow::Error {
    use std::os::unix::process::CommandExt as _;
    eprintln!("restart: executing the stand-in again");
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return anyhow::anyhow!("restart: the stand-in's executable: {e}"),
    };
    let error = Command::new(exe).args(std::env::args_os().skip(1)).exec();
    anyhow::anyhow!("restart: exec: {error}")
}

/// gRPC over HTTP/2 on one connection, each call to the service its path names (tonic's router would
/// need axum: this is the whole of it).
async fn serve_connection(
    stream: tokio::net::UnixStream,
    runtime: RuntimeServiceServer<Shared>,
    images: ImageServiceServer<Shared>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    use tower::Service as _;
    let route = tower::service_fn(move |request: ::http::Request<hyper::body::Incoming>| {
        let (mut runtime, mut images) = (runtime.clone(), images.clone());
        async move {
            let request = request.map(tonic::body::Body::new);
            if request
                .uri()
                .path()
                .starts_with("/runtime.v1.RuntimeService/")
            {
                runtime.call(request).await
            } else {
                images.call(request).await
            }
        }
    });
    let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .http2_only()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(route))
        .await;
    if let Err(e) = served {
        eprintln!("a CRI connection ended: {e}");
    }
}

type Semver = (u32, u32, u32);

fn parse_version(text: &str) -> Option<Semver> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

struct StandIn {
    settings: Settings,
    version: Semver,
    /// The patterns in force.
    pins: Mutex<Vec<String>>,
    /// The registries.conf rules in force.
    rules: Mutex<Vec<Rule>>,
    counts: Mutex<Counts>,
}

/// The state as the generated servers take it.
#[derive(Clone)]
struct Shared(Arc<StandIn>);

impl StandIn {
    fn count(&self, rpc: &str) {
        *self
            .counts
            .lock()
            .unwrap()
            .calls
            .entry(rpc.to_string())
            .or_default() += 1;
        self.save_counts();
    }

    fn save_counts(&self) {
        let text = serde_json::to_string(&*self.counts.lock().unwrap()).expect("json");
        let tmp = self.settings.status.with_extension("tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &self.settings.status);
        }
    }

    /// SIGHUP: what this version does with `pinned_images` on reload.
    fn reload(&self) {
        // Held until the reload is counted: whoever sees the new pins sees the count, and the reverse.
        let mut pins = self.pins.lock().unwrap();
        match read_pinned_images(&self.settings) {
            Err(e) => eprintln!("reload: {e}; keeping the configuration"),
            Ok(new) => {
                match self.version {
                    // No pinned_images before 1.28; 1.28 applies them at start only; 1.29.0-1.29.3 keep
                    // the startup regexes (cri-o #7954).
                    v if v < (1, 29, 4) => {}
                    // cri-o #8202: removals and `[]` ignored, additions applied.
                    (1, 29, 4..=6) | (1, 30, 0..=2) => {
                        for pattern in new {
                            if !pins.contains(&pattern) {
                                pins.push(pattern);
                            }
                        }
                    }
                    _ => *pins = new,
                }
                eprintln!("reload: pinned_images in force {:?}", *pins);
            }
        }
        // Registries are re-read on every reload, whatever the version.
        match read_registries(&self.settings) {
            Err(e) => eprintln!("reload: {e}; keeping the registries"),
            Ok(rules) => {
                let lines: Vec<String> = rules.iter().map(Rule::to_string).collect();
                eprintln!("reload: registries in force {lines:?}");
                self.counts.lock().unwrap().registries.push(lines);
                *self.rules.lock().unwrap() = rules;
            }
        }
        self.counts.lock().unwrap().reloads += 1;
        self.save_counts();
    }

    fn pinned(&self, image: &Stored) -> bool {
        let pins = self.pins.lock().unwrap();
        pins.iter()
            .any(|pattern| image.names.iter().any(|name| regex_matches(pattern, name)))
    }

    /// The image as CRI shows it; `report` says whether this call reports `pinned`.
    fn cri_image(&self, image: &Stored, report: bool) -> Image {
        let (digests, tags): (Vec<String>, Vec<String>) =
            image.names.iter().cloned().partition(|n| n.contains('@'));
        Image {
            id: image.id.clone(),
            repo_tags: tags,
            repo_digests: digests,
            size: image.size,
            pinned: report && self.pinned(image),
            ..Image::default()
        }
    }

    fn find(&self, name: &str) -> Result<Option<Stored>, Status> {
        let images = load(&self.settings.storage).map_err(Status::internal)?;
        let id = name.strip_prefix("sha256:").unwrap_or(name);
        Ok(images
            .into_iter()
            .find(|i| i.id == id || i.names.iter().any(|n| n == name)))
    }
}

/// CRI-O's regex for a `pinned_images` entry, matched against one name.
fn regex_matches(pattern: &str, name: &str) -> bool {
    let (pattern, name) = (pattern.to_lowercase(), name.to_lowercase());
    if pattern.len() > 1 && pattern.starts_with('*') && pattern.ends_with('*') {
        name.contains(&pattern[1..pattern.len() - 1])
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        // `prefix.*` without `^`: found anywhere.
        name.contains(prefix)
    } else {
        name == pattern
    }
}

/// `pinned_images` as CRI-O reads its files now: `crio.conf`, then the drop-in walk; the last one wins.
fn read_pinned_images(settings: &Settings) -> Result<Vec<String>, String> {
    let mut files = vec![settings.crio_conf.clone()];
    walk(&settings.config_dir, &mut files).map_err(|e| e.to_string())?;
    let mut pins = Vec::new();
    for file in files {
        let Some(doc) = read_toml(&file)? else {
            continue;
        };
        if let Some(list) = doc
            .get("crio")
            .and_then(|c| c.get("image"))
            .and_then(|i| i.get("pinned_images"))
        {
            let array = list
                .as_array()
                .ok_or_else(|| format!("{}: pinned_images is not a list", file.display()))?;
            pins = array
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
        }
    }
    Ok(pins)
}

/// A TOML file of CRI-O's, None when it cannot be read (as CRI-O skips it); Err when it is not TOML.
fn read_toml(file: &Path) -> Result<Option<toml_edit::DocumentMut>, String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(None);
    };
    text.parse()
        .map(Some)
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// Go's `filepath.Walk`: each directory's names sorted, directories entered where they sort.
fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut names: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    names.sort();
    for name in names {
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path)?.is_dir() {
            walk(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

fn load(storage: &Path) -> Result<Vec<Stored>, String> {
    read_records(&storage.join(IMAGES_DIR).join("images.json"))
}

fn load_layers(storage: &Path) -> Result<Vec<StoredLayer>, String> {
    read_records(&storage.join(LAYERS_DIR).join("layers.json"))
}

/// A JSON list of records; none when the file is not there.
fn read_records<T: serde::de::DeserializeOwned>(file: &Path) -> Result<Vec<T>, String> {
    match std::fs::read_to_string(file) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes a JSON list of records atomically, its directory made first.
fn write_records<T: Serialize>(file: &Path, records: &[T]) -> Result<(), String> {
    let dir = file.parent().expect("a records file has a directory");
    let tmp = dir.join(format!(".records.tmp-{}", std::process::id()));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, serde_json::to_string_pretty(records).expect("json")))
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|e| e.to_string())
}

/// The layers from `top` down to the bottom one, bottom first.
fn chain(layers: &[StoredLayer], top: &str) -> Vec<StoredLayer> {
    let mut chain = Vec::new();
    let mut at = top;
    while let Some(layer) = layers.iter().find(|l| l.id == at) {
        chain.push(layer.clone());
        at = &layer.parent;
    }
    chain.reverse();
    chain
}

/// Records `layers` (a chain, bottom first) that the storage does not have yet, each with its directory.
fn record_layers(storage: &Path, layers: &[StoredLayer]) -> Result<(), String> {
    let _held = STORAGE.lock().unwrap();
    let mut stored = load_layers(storage)?;
    for layer in layers {
        if stored.iter().any(|l| l.id == layer.id) {
            continue;
        }
        std::fs::create_dir_all(storage.join(LAYER_DIRS).join(&layer.id).join("diff"))
            .map_err(|e| e.to_string())?;
        stored.push(layer.clone());
    }
    write_records(&storage.join(LAYERS_DIR).join("layers.json"), &stored)
}

/// A layer's ID as containers/image gives it: its uncompressed digest's hex for a bottom layer, else the hex
/// of the SHA-256 of `PARENT+HEX`.
fn layer_id(parent: &str, diff_id: &str) -> String {
    let hex = diff_id.trim_start_matches("sha256:");
    match parent {
        "" => hex.to_string(),
        _ => sha256_digest(format!("{parent}+{hex}").as_bytes())["sha256:".len()..].to_string(),
    }
}

/// Held while the storage's image list is read, changed and written back: parallel pulls record at once,
/// and one must not lose the other's image.
static STORAGE: Mutex<()> = Mutex::new(());

/// Adds `image` to the storage (its names joining an image with the same id), atomically.
fn record(storage: &Path, image: Stored) -> Result<(), String> {
    let _held = STORAGE.lock().unwrap();
    let mut images = load(storage)?;
    match images.iter_mut().find(|i| i.id == image.id) {
        Some(old) => {
            for name in image.names {
                if !old.names.contains(&name) {
                    old.names.push(name);
                }
            }
        }
        None => images.push(image),
    }
    save(storage, &images)
}

/// Keeps a pulled blob's `bytes` in the storage's `blobs/` (once per digest), as c/storage keeps layers: a
/// full image filesystem fails the pull with the write's error, as CRI-O's does.
/// `rootfs.diff_ids` of an image config's bytes.
fn config_diff_ids(config: &[u8]) -> Vec<String> {
    serde_json::from_slice::<serde_json::Value>(config)
        .ok()
        .and_then(|c| {
            let ids = c["rootfs"]["diff_ids"].as_array()?.iter();
            Some(
                ids.filter_map(|id| id.as_str().map(str::to_string))
                    .collect(),
            )
        })
        .unwrap_or_default()
}

/// The image config a stored image keeps in `blobs/`, as JSON.
fn stored_config(storage: &Path, image: &Stored) -> Option<serde_json::Value> {
    let bytes = std::fs::read(storage.join("blobs").join(&image.id)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The uncompressed digests of every layer the storage holds, from its images' configs.
fn held_diff_ids(storage: &Path) -> Result<std::collections::HashSet<String>, String> {
    Ok(load(storage)?
        .iter()
        .filter_map(|image| std::fs::read(storage.join("blobs").join(&image.id)).ok())
        .flat_map(|config| config_diff_ids(&config))
        .collect())
}

fn keep_blob(storage: &Path, digest: &str, bytes: &[u8]) -> Result<(), String> {
    let dir = storage.join("blobs");
    let path = dir.join(digest.trim_start_matches("sha256:"));
    if path.exists() {
        return Ok(());
    }
    // Parallel pulls of the same layer write files of their own.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        "{}.partial-{n}",
        digest.trim_start_matches("sha256:")
    ));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        // As Go words the errno.
        let cause = match e.raw_os_error() {
            Some(libc::ENOSPC) => "no space left on device".to_string(),
            _ => e.to_string(),
        };
        format!(
            "writing blob: storing blob to file {:?}: write {}: {cause}",
            tmp.display(),
            tmp.display()
        )
    })
}

/// Removes the layers no image in `images` holds any more, with their directories, as c/storage does.
fn drop_unused_layers(storage: &Path, images: &[Stored]) -> Result<(), String> {
    let layers = load_layers(storage)?;
    let used: std::collections::BTreeSet<String> = images
        .iter()
        .flat_map(|i| chain(&layers, &i.layer))
        .map(|l| l.id)
        .collect();
    let (kept, gone): (Vec<StoredLayer>, Vec<StoredLayer>) =
        layers.into_iter().partition(|l| used.contains(&l.id));
    for layer in gone {
        let _ = std::fs::remove_dir_all(storage.join(LAYER_DIRS).join(&layer.id));
    }
    write_records(&storage.join(LAYERS_DIR).join("layers.json"), &kept)
}

/// Removes the blobs no image in `images` holds any more, as c/storage removes an image's unused layers.
fn drop_unused_blobs(storage: &Path, images: &[Stored]) {
    let held: std::collections::BTreeSet<&str> = images
        .iter()
        .flat_map(|i| &i.blobs)
        .map(|digest| digest.trim_start_matches("sha256:"))
        .collect();
    let Ok(entries) = std::fs::read_dir(storage.join("blobs")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.contains(".partial-") && !held.contains(name.as_ref()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes the storage's image list atomically.
fn save(storage: &Path, images: &[Stored]) -> Result<(), String> {
    write_records(&storage.join(IMAGES_DIR).join("images.json"), images)
}

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// The user and password CRI-O takes from a PullImage's `AuthConfig`: `auth` (base64 `user:password`)
/// when set, else `username` and `password`; no user, no credentials.
fn crio_login(auth: Option<&AuthConfig>) -> Option<(String, String)> {
    let auth = auth?;
    let (user, password) = match auth.auth.as_str() {
        "" => (auth.username.clone(), auth.password.clone()),
        encoded => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()?;
            let text = String::from_utf8(decoded).ok()?;
            let (user, password) = text.split_once(':')?;
            (user.to_owned(), password.trim_end_matches('\0').to_owned())
        }
    };
    (!user.is_empty()).then_some((user, password))
}

/// What answers a registry's 401: `Authorization` for the retry, from its `WWW-Authenticate` challenge
/// (`Basic`, or `Bearer realm=…,service=…`: a token by GET from the realm, with `login` when given).
fn authorize(
    agent: &ureq::Agent,
    challenge: &str,
    repo: &str,
    login: Option<&(String, String)>,
) -> Result<String, String> {
    let basic = |(user, password): &(String, String)| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let param = |name: &str| {
        let start = challenge.find(&format!("{name}=\""))? + name.len() + 2;
        let end = challenge[start..].find('"')? + start;
        Some(challenge[start..end].to_owned())
    };
    if challenge.to_ascii_lowercase().starts_with("basic") {
        return login
            .map(basic)
            .ok_or_else(|| "authentication required".to_owned());
    }
    let realm = param("realm").ok_or_else(|| format!("unreadable challenge {challenge:?}"))?;
    let mut request = agent
        .get(&realm)
        .query("scope", format!("repository:{repo}:pull"));
    if let Some(service) = param("service") {
        request = request.query("service", service);
    }
    if let Some(login) = login {
        request = request.header("Authorization", basic(login));
    }
    let mut response = request.call().map_err(|e| format!("{realm}: {e}"))?;
    if response.status() != 200 {
        return Err(format!(
            "requesting bearer token: invalid status code from registry {} (Unauthorized)",
            response.status().as_u16()
        ));
    }
    let body = response
        .body_mut()
        .read_to_vec()
        .map_err(|e| format!("{realm}: {e}"))?;
    let answer: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("{realm}: {e}"))?;
    let token = answer["token"]
        .as_str()
        .or(answer["access_token"].as_str())
        .ok_or("the token service sent no token")?;
    Ok(format!("Bearer {token}"))
}

/// One `[[registry]]` of registries.conf.
#[derive(Clone, Debug)]
struct Rule {
    prefix: String,
    /// Where the source really is, when rewritten.
    location: Option<String>,
    blocked: bool,
    /// (location, pull-from-mirror), in order.
    mirrors: Vec<(String, String)>,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mirrors: Vec<&str> = self.mirrors.iter().map(|(m, _)| m.as_str()).collect();
        write!(f, "{} -> {}", self.prefix, mirrors.join(", "))?;
        if self.blocked {
            f.write_str(" (blocked)")?;
        }
        Ok(())
    }
}

/// The rules containers-image reads: `registries.conf`, then `registries.conf.d/*.conf` by name, a later
/// table with the same prefix replacing an earlier one.
fn read_registries(settings: &Settings) -> Result<Vec<Rule>, String> {
    let dir = &settings.registries_dir;
    let mut files = vec![
        dir.parent()
            .expect("etc/containers")
            .join("registries.conf"),
    ];
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    names.sort();
    files.extend(names);
    let mut rules: Vec<Rule> = Vec::new();
    for file in files {
        let Some(doc) = read_toml(&file)? else {
            continue;
        };
        let tables = doc.get("registry").and_then(|r| r.as_array_of_tables());
        for table in tables.into_iter().flat_map(|t| t.iter()) {
            let text = |key: &str| table.get(key).and_then(|v| v.as_str()).map(str::to_string);
            let prefix = text("prefix")
                .or_else(|| text("location"))
                .ok_or_else(|| format!("{}: a [[registry]] without prefix", file.display()))?;
            let mirrors = table.get("mirror").and_then(|m| m.as_array_of_tables());
            let rule = Rule {
                prefix: prefix.trim_end_matches('/').to_string(),
                location: text("location"),
                blocked: table.get("blocked").and_then(|b| b.as_bool()) == Some(true),
                mirrors: mirrors
                    .into_iter()
                    .flat_map(|m| m.iter())
                    .filter_map(|m| {
                        let location = m.get("location")?.as_str()?.to_string();
                        let from = m.get("pull-from-mirror").and_then(|v| v.as_str());
                        Some((location, from.unwrap_or("all").to_string()))
                    })
                    .collect(),
            };
            rules.retain(|r| r.prefix != rule.prefix);
            rules.push(rule);
        }
    }
    Ok(rules)
}

/// Where a reference to `host/repo` is fetched from, in order, as `host/repo` pairs: the mirrors of the
/// longest matching prefix that serve this kind of reference, then the source unless blocked.
fn candidates(rules: &[Rule], host: &str, repo: &str, by_digest: bool) -> Vec<String> {
    let full = format!("{host}/{repo}");
    let rule = rules
        .iter()
        .filter(|r| full == r.prefix || full.starts_with(&format!("{}/", r.prefix)))
        .max_by_key(|r| r.prefix.len());
    let Some(rule) = rule else {
        return vec![full];
    };
    let rest = &full[rule.prefix.len()..];
    let serves = |from: &str| match from {
        "digest-only" => by_digest,
        "tag-only" => !by_digest,
        _ => true,
    };
    let mut places: Vec<String> = rule
        .mirrors
        .iter()
        .filter(|(_, from)| serves(from))
        .map(|(location, _)| format!("{location}{rest}"))
        .collect();
    if !rule.blocked {
        places.push(format!(
            "{}{rest}",
            rule.location.as_deref().unwrap_or(&rule.prefix)
        ));
    }
    places
}

/// Pulls `image` with `login` into `storage` from the places the `rules` give (the source must be one of
/// `registries`, a mirror may be anywhere), each failing place giving way to the next: (the stored image,
/// the digest reference pulled, the host that served it).
fn pull(
    storage: &Path,
    registries: &[String],
    rules: &[Rule],
    image: &str,
    login: Option<(String, String)>,
) -> Result<(Stored, String, String), String> {
    let source = |cause: String| format!("initializing source docker://{image}: {cause}");
    let (host, rest) = image
        .split_once('/')
        .ok_or_else(|| source("not a fully qualified reference".into()))?;
    let (repo, reference) = match rest.split_once('@') {
        Some((repo, digest)) => (repo, digest),
        None => match rest.rsplit_once(':') {
            Some((repo, tag)) => (repo, tag),
            None => (rest, "latest"),
        },
    };
    if !registries.iter().any(|r| r == host) {
        return Err(source(format!(
            "pinging container registry {host}: the stand-in reaches only the lab registry"
        )));
    }
    let mut last = None;
    for place in candidates(rules, host, repo, reference.starts_with("sha256:")) {
        let (from, path) = place.split_once('/').expect("host/repo");
        match pull_from(storage, from, path, reference, image, login.as_ref()) {
            Ok((stored, digest)) => {
                let by_digest = format!("{host}/{repo}@{digest}");
                let names = if reference.starts_with("sha256:") {
                    vec![by_digest.clone()]
                } else {
                    vec![format!("{host}/{repo}:{reference}"), by_digest.clone()]
                };
                let image = Stored { names, ..stored };
                return Ok((image, by_digest, from.to_string()));
            }
            Err(e) => {
                eprintln!("pull {image} from {place}: {e}");
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| source("no place to pull from: the source is blocked".into())))
}

/// Pulls `reference` of `repo` from `host` with `login` into `storage` (its config and layers kept there):
/// the image (without names) and its manifest's digest.
fn pull_from(
    storage: &Path,
    host: &str,
    repo: &str,
    reference: &str,
    image: &str,
    login: Option<&(String, String)>,
) -> Result<(Stored, String), String> {
    let source = |cause: String| format!("initializing source docker://{image}: {cause}");
    let agent = http::agent();
    let authorization = std::cell::RefCell::new(None::<String>);
    let get = |path: &str, accept: &str| -> Result<Vec<u8>, String> {
        let url = format!("http://{host}/v2/{repo}/{path}");
        let send = |authorization: Option<&String>| {
            let mut request = agent.get(&url).header("Accept", accept);
            if let Some(value) = authorization {
                request = request.header("Authorization", value);
            }
            request.call().map_err(|e| format!("{url}: {e}"))
        };
        let mut response = send(authorization.borrow().as_ref())?;
        if response.status() == 401 {
            let challenge = response
                .headers()
                .get("WWW-Authenticate")
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let value = authorize(&agent, &challenge, repo, login)?;
            response = send(Some(&value))?;
            *authorization.borrow_mut() = Some(value);
        }
        match response.status().as_u16() {
            // Layers of any size: ureq's default limit (10 MiB) is for bodies read whole by accident.
            200 => response
                .body_mut()
                .with_config()
                .limit(u64::MAX)
                .read_to_vec()
                .map_err(|e| format!("{url}: {e}")),
            404 if path.starts_with("manifests/") => Err(source(format!(
                "reading manifest {reference} in {host}/{repo}: manifest unknown"
            ))),
            401 | 403 => Err(source(format!(
                "reading manifest {reference} in {host}/{repo}: unauthorized: authentication required"
            ))),
            status => Err(format!("{url}: {status}")),
        }
    };
    let verified = |bytes: Vec<u8>, digest: &str| {
        if sha256_digest(&bytes) == digest {
            Ok(bytes)
        } else {
            Err(format!(
                "{host}/{repo}@{digest}: the content does not match its digest"
            ))
        }
    };
    let top = get(&format!("manifests/{reference}"), MANIFEST_TYPES)?;
    let digest = sha256_digest(&top);
    if reference.starts_with("sha256:") && digest != reference {
        return Err(format!("{image}: the manifest does not match its digest"));
    }
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&top).map_err(|e| e.to_string())?;
    if let Some(entries) = manifest["manifests"].as_array() {
        let child = entries
            .iter()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64")
            .and_then(|m| m["digest"].as_str())
            .ok_or_else(|| format!("{image}: no linux/amd64 image in the index"))?
            .to_string();
        let bytes = verified(get(&format!("manifests/{child}"), MANIFEST_TYPES)?, &child)?;
        manifest = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    }
    let config = manifest["config"]["digest"].as_str().ok_or("no config")?;
    let config_bytes = verified(get(&format!("blobs/{config}"), "*/*")?, config)?;
    keep_blob(storage, config, &config_bytes)?;
    let diff_ids = config_diff_ids(&config_bytes);
    // c/storage reuses a layer it holds, by its uncompressed digest, whichever image brought it.
    let held = held_diff_ids(storage)?;
    let mut size = config_bytes.len() as u64;
    let mut blobs = vec![config.to_string()];
    let mut layers: Vec<StoredLayer> = Vec::new();
    for (at, layer) in manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let blob_digest = layer["digest"].as_str().ok_or("a blob without digest")?;
        blobs.push(blob_digest.to_string());
        let diff_id = diff_ids.get(at).cloned().unwrap_or_default();
        let parent = layers.last().map_or("", |l| l.id.as_str());
        let record = StoredLayer {
            id: layer_id(parent, &diff_id),
            parent: parent.to_string(),
            compressed_diff_digest: blob_digest.to_string(),
            compressed_size: layer["size"].as_u64().unwrap_or(0),
            diff_digest: diff_id.clone(),
        };
        layers.push(record);
        if held.contains(&diff_id) {
            size += layer["size"].as_u64().unwrap_or(0);
            continue;
        }
        let bytes = verified(get(&format!("blobs/{blob_digest}"), "*/*")?, blob_digest)?;
        keep_blob(storage, blob_digest, &bytes)?;
        size += bytes.len() as u64;
    }
    record_layers(storage, &layers)?;
    let stored = Stored {
        id: config.trim_start_matches("sha256:").to_string(),
        names: Vec::new(),
        layer: layers.last().map(|l| l.id.clone()).unwrap_or_default(),
        size,
        blobs,
    };
    Ok((stored, digest))
}

#[tonic::async_trait]
impl RuntimeService for Shared {
    async fn version(
        &self,
        _: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        self.0.count("Version");
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "cri-o".into(),
            runtime_version: self.0.settings.version.clone(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.0.count("Status");
        let ready = |kind: &str| RuntimeCondition {
            r#type: kind.into(),
            status: true,
            ..RuntimeCondition::default()
        };
        Ok(Response::new(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![ready("RuntimeReady"), ready("NetworkReady")],
            }),
            ..StatusResponse::default()
        }))
    }
}

#[tonic::async_trait]
impl ImageService for Shared {
    async fn list_images(
        &self,
        _: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        let state = &self.0;
        state.count("ListImages");
        let images = load(&state.settings.storage).map_err(Status::internal)?;
        // ListImages reports pins from 1.28 on.
        let report = state.version >= (1, 28, 0);
        Ok(Response::new(ListImagesResponse {
            images: images.iter().map(|i| state.cri_image(i, report)).collect(),
        }))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let state = &self.0;
        state.count("ImageStatus");
        let request = request.into_inner();
        let name = request.image.map(|i| i.image).unwrap_or_default();
        // ImageStatus reports pins only from 1.29.7 / 1.30.6 / 1.31.0 on.
        let report = match state.version {
            (1, 29, patch) => patch >= 7,
            (1, 30, patch) => patch >= 6,
            v => v >= (1, 31, 0),
        };
        let found = state.find(&name)?;
        // With `verbose`, CRI-O answers `info["info"]`: the image's labels and its OCI config.
        let info = match (&found, request.verbose) {
            (Some(image), true) => {
                let spec = stored_config(&state.settings.storage, image);
                let labels = spec
                    .as_ref()
                    .map(|s| s["config"]["Labels"].clone())
                    .filter(|l| l.is_object());
                let mut info = serde_json::json!({"imageSpec": spec});
                if let Some(labels) = labels {
                    info["labels"] = labels;
                }
                [("info".to_string(), info.to_string())].into()
            }
            _ => Default::default(),
        };
        Ok(Response::new(ImageStatusResponse {
            image: found.map(|i| state.cri_image(&i, report)),
            info,
        }))
    }

    async fn pull_image(
        &self,
        request: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        let state = self.0.clone();
        state.count("PullImage");
        let request = request.into_inner();
        let login = crio_login(request.auth.as_ref());
        let image = request.image.map(|i| i.image).unwrap_or_default();
        let (storage, registries) = (
            state.settings.storage.clone(),
            state.settings.registries.clone(),
        );
        let rules = state.rules.lock().unwrap().clone();
        let pulled =
            tokio::task::spawn_blocking(move || pull(&storage, &registries, &rules, &image, login))
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        let (stored, image_ref, from) = pulled.map_err(Status::unknown)?;
        record(&state.settings.storage, stored).map_err(Status::internal)?;
        *state
            .counts
            .lock()
            .unwrap()
            .pulled_from
            .entry(from)
            .or_default() += 1;
        state.save_counts();
        Ok(Response::new(PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let state = &self.0;
        state.count("RemoveImage");
        let name = request
            .into_inner()
            .image
            .map(|i| i.image)
            .unwrap_or_default();
        if let Some(gone) = state.find(&name)? {
            let _held = STORAGE.lock().unwrap();
            let mut images = load(&state.settings.storage).map_err(Status::internal)?;
            images.retain(|i| i.id != gone.id);
            save(&state.settings.storage, &images).map_err(Status::internal)?;
            drop_unused_layers(&state.settings.storage, &images).map_err(Status::internal)?;
            drop_unused_blobs(&state.settings.storage, &images);
        }
        Ok(Response::new(RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        let state = &self.0;
        state.count("ImageFsInfo");
        let used: u64 = load(&state.settings.storage)
            .map_err(Status::internal)?
            .iter()
            .map(|i| i.size)
            .sum();
        let usage = FilesystemUsage {
            fs_id: Some(FilesystemIdentifier {
                mountpoint: state
                    .settings
                    .storage
                    .join(IMAGES_DIR)
                    .display()
                    .to_string(),
            }),
            used_bytes: Some(UInt64Value { value: used }),
            ..FilesystemUsage::default()
        };
        Ok(Response::new(ImageFsInfoResponse {
            image_filesystems: vec![usage],
            ..ImageFsInfoResponse::default()
        }))
    }
}

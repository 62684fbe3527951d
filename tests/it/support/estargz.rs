//! eStargz images for the lab, made as their users make them: a source image (gzip layers of chosen files)
//! imported into a builder containerd of the lab's own, converted with `ctr-remote image convert --estargz
//! --oci` (Debian's stargz-snapshotter), exported with `ctr images export`, and pushed to the lab registry
//! by the lab's pusher, so that a token or TLS registry takes it as it takes every lab image.
//!
//! The builder has its own root in `<lab>/estargz/<n>/` (not a node's: a blob in a node's content store
//! would be counted as there), no CRI plugin, and lives for one conversion.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::images::{
    BuiltLayer, EPOCH, Extras, PushedImage, PushedLayer, oci_archive, random_bytes,
};
use super::process::{Proc, run, stop_all};
use super::registry::Registry;

/// What a file of an eStargz image holds.
#[derive(Clone, Debug)]
pub enum FileContent {
    Text(String),
    /// `bytes` pseudo-random bytes from `seed`: incompressible.
    Random {
        seed: u64,
        bytes: usize,
    },
    /// This machine's static busybox (Debian's busybox-static), so that a container can read the files.
    Busybox,
}

/// One regular file at `path` (relative, e.g. `data/small.txt`).
#[derive(Clone, Debug)]
pub struct EstargzFile {
    pub path: String,
    pub content: FileContent,
}

impl EstargzFile {
    pub fn new(path: &str, content: FileContent) -> EstargzFile {
        EstargzFile {
            path: path.to_owned(),
            content,
        }
    }
}

/// An eStargz image: its layers, bottom first, each its files.
#[derive(Clone, Debug)]
pub struct EstargzSpec {
    pub layers: Vec<Vec<EstargzFile>>,
}

impl EstargzSpec {
    /// busybox and `data/small.txt` (`small`) in one layer, then one layer per entry of `random`, each a
    /// file `data/big-<i>.bin` of that many incompressible bytes from `seed + i`.
    pub fn with_busybox(small: &str, seed: u64, random: &[usize]) -> EstargzSpec {
        let mut layers = vec![vec![
            EstargzFile::new("bin/busybox", FileContent::Busybox),
            EstargzFile::new("data/small.txt", FileContent::Text(small.to_owned())),
        ]];
        for (i, &bytes) in (0u64..).zip(random) {
            layers.push(vec![EstargzFile::new(
                &format!("data/big-{i}.bin"),
                FileContent::Random {
                    seed: seed + i,
                    bytes,
                },
            )]);
        }
        EstargzSpec { layers }
    }
}

/// Where the busybox of [`FileContent::Busybox`] comes from.
const BUSYBOX: &str = "/bin/busybox";
/// The source and converted images' names in the builder.
const SOURCE: &str = "lab.invalid/estargz-source:1";
const CONVERTED: &str = "lab.invalid/estargz:1";
/// A builder conversion's namespace.
const NAMESPACE: &str = "lab-estargz";

/// Converts `spec` into an eStargz image in a builder under `lab_dir`: the image as an OCI archive (its
/// index naming one manifest), for [`push_archive`].
pub(crate) fn estargz_archive(
    lab_dir: &Path,
    short_socket_dir: &Path,
    spec: &EstargzSpec,
) -> Result<Vec<u8>> {
    let layers = spec
        .layers
        .iter()
        .map(|files| BuiltLayer::gzip(&layer_tar(files)?))
        .collect::<Result<Vec<_>>>()?;
    let archive = oci_archive(SOURCE, &layers, &Extras::default())?;
    Builder::start(lab_dir, short_socket_dir)?.convert(&archive)
}

/// A tar of `files`, with their directories, every header fixed but the content.
fn layer_tar(files: &[EstargzFile]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut directories = std::collections::BTreeSet::new();
    for file in files {
        let mut parent = Path::new(&file.path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            directories.insert(dir.to_owned());
            parent = dir.parent();
        }
    }
    let header = |kind, mode, size: usize| {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size as u64);
        header.set_mtime(EPOCH);
        header
    };
    for dir in &directories {
        tar.append_data(
            &mut header(tar::EntryType::Directory, 0o755, 0),
            dir,
            std::io::empty(),
        )?;
    }
    for file in files {
        let (bytes, mode) = match &file.content {
            FileContent::Text(text) => (text.clone().into_bytes(), 0o644),
            FileContent::Random { seed, bytes } => (random_bytes(*seed, *bytes), 0o644),
            FileContent::Busybox => (
                std::fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX}"))?,
                0o755,
            ),
        };
        let mut header = header(tar::EntryType::Regular, mode, bytes.len());
        tar.append_data(&mut header, &file.path, &bytes[..])?;
    }
    Ok(tar.into_inner()?)
}

/// A containerd of the lab's own for one conversion, stopped and its files removed when dropped.
struct Builder {
    dir: PathBuf,
    socket: PathBuf,
    proc: Proc,
}

impl Builder {
    fn start(lab_dir: &Path, short_socket_dir: &Path) -> Result<Builder> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = lab_dir.join("estargz").join(n.to_string());
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(short_socket_dir)?;
        let socket = short_socket_dir.join(format!("estargz-{n}.sock"));
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 # Content only: no CRI, no snapshotter but the default.\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.aufs\", \
                 \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.devmapper\", \
                 \"io.containerd.snapshotter.v1.zfs\"]\n\n[grpc]\n  address = \"{socket}\"\n",
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                socket = socket.display(),
            ),
        )?;
        let mut command = Command::new("containerd");
        command.arg("--config").arg(&config);
        let mut proc = Proc::spawn(
            "containerd (eStargz builder)",
            command,
            &lab_dir.join("estargz.log"),
        )?;
        let ready = proc.wait_ready(Duration::from_secs(30), || {
            ctr("ctr", &socket)
                .arg("version")
                .output()
                .is_ok_and(|out| out.status.success())
        });
        let builder = Builder { dir, socket, proc };
        ready?;
        Ok(builder)
    }

    /// Imports the OCI archive `source` (an image named [`SOURCE`]), converts it to eStargz, and returns
    /// the converted image exported as an OCI archive.
    fn convert(&self, source: &[u8]) -> Result<Vec<u8>> {
        let source_file = self.dir.join("source.tar");
        std::fs::write(&source_file, source)?;
        run(ctr("ctr", &self.socket)
            .args(["images", "import", "--no-unpack"])
            .arg(&source_file))
        .context("ctr images import")?;
        // Random content does not compress: the fastest level gives the same sizes.
        run(ctr("ctr-remote", &self.socket).args([
            "image",
            "convert",
            "--estargz",
            "--oci",
            "--estargz-compression-level",
            "1",
            SOURCE,
            CONVERTED,
        ]))
        .context("ctr-remote image convert --estargz")?;
        let exported = self.dir.join("estargz.tar");
        run(ctr("ctr", &self.socket)
            .args(["images", "export"])
            .arg(&exported)
            .arg(CONVERTED))
        .context("ctr images export")?;
        Ok(std::fs::read(&exported)?)
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        stop_all(std::slice::from_mut(&mut self.proc));
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `program` (ctr or ctr-remote) talking to the builder at `socket`, in its namespace.
fn ctr(program: &str, socket: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .arg("--address")
        .arg(socket)
        .args(["--namespace", NAMESPACE]);
    command
}

/// Pushes the one image of the OCI archive `archive` (its index naming one manifest) to `repo`.
pub(crate) fn push_archive(registry: &Registry, repo: &str, archive: &[u8]) -> Result<PushedImage> {
    let mut blobs = std::collections::HashMap::new();
    let mut index = None;
    for entry in tar::Archive::new(archive).entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes)?;
        if path == "index.json" {
            index = Some(bytes);
        } else if let Some(hex) = path.strip_prefix("blobs/sha256/") {
            blobs.insert(format!("sha256:{hex}"), bytes);
        }
    }
    let index: Value = serde_json::from_slice(&index.context("the archive has no index.json")?)?;
    let entries = index["manifests"]
        .as_array()
        .context("an index without manifests")?;
    let [entry] = &entries[..] else {
        bail!("the exported archive names {} manifests", entries.len());
    };
    let blob = |digest: &str| {
        blobs
            .get(digest)
            .with_context(|| format!("the archive lacks {digest}"))
    };
    let manifest_digest = entry["digest"].as_str().context("a manifest digest")?;
    let manifest_bytes = blob(manifest_digest)?;
    let manifest: Value = serde_json::from_slice(manifest_bytes)?;
    let media_type = manifest["mediaType"]
        .as_str()
        .or(entry["mediaType"].as_str())
        .context("a manifest media type")?;
    let config_digest = manifest["config"]["digest"].as_str().context("a config")?;
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().context("layers")? {
        let digest = layer["digest"].as_str().context("a layer digest")?;
        let bytes = blob(digest)?;
        registry.push_blob(repo, digest, bytes)?;
        layers.push(PushedLayer {
            digest: digest.to_owned(),
            size: bytes.len() as u64,
            uncompressed_size: layer["annotations"]["io.containers.estargz.uncompressed-size"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_default(),
            media_type: layer["mediaType"].as_str().unwrap_or_default().to_owned(),
        });
    }
    let config = blob(config_digest)?;
    registry.push_blob(repo, config_digest, config)?;
    let pushed_digest = registry.put_manifest_as(repo, None, media_type, manifest_bytes)?;
    if pushed_digest != manifest_digest {
        bail!("pushed {pushed_digest}, exported {manifest_digest}");
    }
    Ok(PushedImage {
        repo: repo.to_owned(),
        manifest_digest: manifest_digest.to_owned(),
        manifest_size: manifest_bytes.len() as u64,
        config_digest: config_digest.to_owned(),
        config_size: config.len() as u64,
        layers,
    })
}

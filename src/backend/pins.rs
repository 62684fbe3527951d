//! Writing pins on a node, the two ways runtimes enforce them:
//!
//! - CRI-O: `pinned_images` in the drop-in `50-pinned-images`, in the exact shape the OpenShift daemon
//!   writes, then a reload (CRI-O re-reads its config on SIGHUP) or a restart. The file is edited with
//!   `toml_edit` so an administrator's comments and other keys survive, written atomically and only when
//!   its content changes. What CRI-O makes of all its files together is read by [`read_crio_config`] and
//!   judged by [`crate::model::crio`].
//! - containerd: the label `io.cri-containerd.pinned=pinned` on every image record of the image, through
//!   containerd's images service on the CRI socket. Unpinning removes the label; images are never deleted.
//!
//! Also the pieces `lazy.rs` shares: nested-table edits that keep formatting, and the atomic write.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toml_edit::{Array, DocumentMut, Item, Table, TableLike, Value};

use super::cri::{CriClient, CriError};
use super::node::DirectNode;
use super::proto::containerd_images::{
    GetImageRequest, Image as ContainerdImage, UpdateImageRequest, images_client::ImagesClient,
};
use super::proto::cri::Image;
use crate::model::crio::{self, CrioConfig};

pub const CRIO_CONFIG_DIR: &str = "/etc/crio/crio.conf.d";
/// The OpenShift daemon's file name: sorts after CRI-O's own drop-ins, before the administrator's `99-*`.
pub const CRIO_DROP_IN: &str = "50-pinned-images";
pub const CONTAINERD_PIN_LABEL: &str = "io.cri-containerd.pinned";
pub const CONTAINERD_PIN_VALUE: &str = "pinned";
/// The containerd namespace the CRI plugin keeps its images in.
pub const CONTAINERD_NAMESPACE: &str = "k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{}: {cause}", path.display())]
    File { path: PathBuf, cause: String },
    #[error("reloading CRI-O: {0}")]
    Reload(String),
    #[error("containerd images service: {0}")]
    Containerd(String),
    #[error(transparent)]
    Cri(#[from] CriError),
}

fn file_error(path: &Path) -> impl FnOnce(String) -> PinError + '_ {
    move |cause| PinError::File {
        path: path.to_owned(),
        cause,
    }
}

// ---------------------------------------------------------------------------------------------------------
// Which way a node pins

/// How a node's pins are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinTarget {
    /// From the runtime's name: containerd -> label, cri-o -> the drop-in in /etc/crio/crio.conf.d and
    /// `systemctl reload crio`.
    Detect,
    /// The drop-in in `config_dir` on the machine pinboard runs on (the node itself), then `reload`. The
    /// plan's images are added to the pins the file lists already.
    CrioDropIn {
        config_dir: PathBuf,
        reload: Reload,
    },
    ContainerdLabel,
}

/// Connects to `node` and decides how it pins ([`resolve`]): the client and the decided target.
pub async fn connect_resolved(
    node: &DirectNode,
    target: PinTarget,
    timeout: Duration,
) -> Result<(CriClient, PinTarget), String> {
    let client = CriClient::connect(&node.endpoint, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let runtime = client
        .version()
        .await
        .map_err(|e| e.to_string())?
        .runtime_name;
    let pin = resolve(target, &runtime, &client)?;
    Ok((client, pin))
}

/// The target with `Detect` decided from the runtime's name.
pub fn resolve(target: PinTarget, runtime: &str, client: &CriClient) -> Result<PinTarget, String> {
    if target != PinTarget::Detect {
        return Ok(target);
    }
    match runtime {
        "containerd" => Ok(PinTarget::ContainerdLabel),
        // The drop-in is a file on the node: only writable when pinboard runs there.
        "cri-o" if !client.endpoint().is_local() => Err(format!(
            "CRI-O at {}: its pin drop-in can only be written on the node itself",
            client.endpoint()
        )),
        "cri-o" => Ok(PinTarget::CrioDropIn {
            config_dir: CRIO_CONFIG_DIR.into(),
            reload: Reload::Systemctl,
        }),
        other => Err(format!(
            "runtime {other:?}: pinboard pins only on containerd and CRI-O"
        )),
    }
}

// ---------------------------------------------------------------------------------------------------------
// CRI-O drop-in

/// The drop-in's new content for `pins` (sorted, de-duplicated), given its old content: `None` means the
/// file should not exist (no pins). Pure, for previews; everything else in an old file is kept.
pub fn crio_drop_in(old: Option<&str>, pins: &[String]) -> Result<Option<String>, String> {
    let pins: BTreeSet<&str> = pins.iter().map(String::as_str).collect();
    if pins.is_empty() {
        return Ok(None);
    }
    let mut doc = parse(old)?;
    let image = table_at(&mut doc, &["crio", "image"], Some("  "))?;
    set_array(image, "pinned_images", pins, "    ");
    Ok(Some(doc.to_string()))
}

/// The pins the drop-in in `config_dir` lists (empty when there is no file).
pub fn read_crio_pins(config_dir: &Path) -> Result<Vec<String>, PinError> {
    let path = config_dir.join(CRIO_DROP_IN);
    let Some(text) = read_optional(&path)? else {
        return Ok(Vec::new());
    };
    Ok(crio::pinned_images_in(&text)
        .map_err(file_error(&path))?
        .unwrap_or_default())
}

/// CRI-O's main configuration file for a drop-in directory: `crio.conf` beside it, as in CRI-O's own
/// layout (`/etc/crio/crio.conf` and `/etc/crio/crio.conf.d`).
pub fn crio_conf(config_dir: &Path) -> PathBuf {
    config_dir
        .parent()
        .unwrap_or(Path::new("/"))
        .join("crio.conf")
}

/// What CRI-O reads for `pinned_images`: [`crio_conf`], then every file under `config_dir`, recursively,
/// in CRI-O's order ([`crio::drop_in_order`]), whatever its name. Missing files and directories count as
/// empty. Blocking: call from `spawn_blocking`.
pub fn read_crio_config(config_dir: &Path) -> Result<CrioConfig, PinError> {
    let main = crio_conf(config_dir);
    let mut files: Vec<(String, String)> = read_optional(&main)?
        .map(|text| (main.display().to_string(), text))
        .into_iter()
        .collect();
    let mut drop_ins = Vec::new();
    collect_files(config_dir, Path::new(""), &mut drop_ins)?;
    crio::drop_in_order(&mut drop_ins);
    for relative in drop_ins {
        let path = config_dir.join(&relative);
        let text = fs::read_to_string(&path).map_err(|e| file_error(&path)(e.to_string()))?;
        files.push((relative.display().to_string(), text));
    }
    CrioConfig::read(files).map_err(file_error(config_dir))
}

/// Every file under `dir` (whose path below the drop-in directory is `relative`), as CRI-O's walk finds
/// them: directories are entered (not through symlinks), anything else that reads as a file is one.
fn collect_files(dir: &Path, relative: &Path, out: &mut Vec<PathBuf>) -> Result<(), PinError> {
    let err = |e: io::Error| file_error(dir)(e.to_string());
    let entries = match fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        entries => entries.map_err(err)?,
    };
    for entry in entries {
        let entry = entry.map_err(err)?;
        let path = entry.path();
        let name = relative.join(entry.file_name());
        if entry.file_type().map_err(err)?.is_dir() {
            collect_files(&path, &name, out)?;
        } else if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            out.push(name);
        }
    }
    Ok(())
}

/// Writes the drop-in in `config_dir` for `pins` when its content changes; returns whether it changed.
/// Blocking: call from `spawn_blocking`.
pub fn write_crio_pins(config_dir: &Path, pins: &[String]) -> Result<bool, PinError> {
    let path = config_dir.join(CRIO_DROP_IN);
    let old = read_optional(&path)?;
    let new = crio_drop_in(old.as_deref(), pins).map_err(file_error(&path))?;
    write_if_changed(&path, old.as_deref(), new.as_deref())
}

/// How CRI-O is told to re-read its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reload {
    /// SIGHUP to the pid in this file (CRI-O's `/var/run/crio/crio.pid`, or any process in tests).
    Signal {
        pidfile: PathBuf,
    },
    /// `systemctl reload crio`, as the OpenShift daemon does.
    Systemctl,
    /// `systemctl restart crio`: for the versions whose reload does not apply pins. Running containers
    /// keep running (conmon holds them, not CRI-O).
    Restart,
    None,
}

/// Reloads CRI-O. Blocking: call from `spawn_blocking`.
pub fn reload_crio(reload: &Reload) -> Result<(), PinError> {
    match reload {
        Reload::None => Ok(()),
        Reload::Signal { pidfile } => {
            let named =
                |cause: String| PinError::Reload(format!("pidfile {}: {cause}", pidfile.display()));
            let text = fs::read_to_string(pidfile).map_err(|e| named(e.to_string()))?;
            let pid: i32 = text
                .trim()
                .parse()
                .map_err(|_| named(format!("{:?} is not a pid", text.trim())))?;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGHUP,
            )
            .map_err(|e| named(format!("pid {pid} is stale or not ours: {e}")))
        }
        Reload::Systemctl => systemctl("reload"),
        Reload::Restart => systemctl("restart"),
    }
}

/// `systemctl VERB crio`.
fn systemctl(verb: &str) -> Result<(), PinError> {
    let out = std::process::Command::new("systemctl")
        .args([verb, "crio"])
        .output()
        .map_err(|e| PinError::Reload(format!("systemctl {verb} crio: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PinError::Reload(format!(
            "systemctl {verb} crio: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

// ---------------------------------------------------------------------------------------------------------
// containerd label

fn namespaced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "containerd-namespace",
        CONTAINERD_NAMESPACE.parse().expect("ascii"),
    );
    request
}

/// What pinning one image on containerd did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labelled {
    /// The containerd image records changed (or already so).
    pub records: Vec<String>,
    /// Whether CRI reports the image pinned (containerd >= 1.7; 1.6 does not report it).
    pub confirmed: bool,
}

/// Sets (`pinned`) or removes the pin label on every containerd image record of `image`: the reference and
/// the names CRI's ImageStatus reports (repo digests, repo tags, the `sha256:` id), then reads the labels
/// back. Fails when the image is not on the node or a record does not keep the label.
pub async fn label_containerd(
    client: &CriClient,
    image: &str,
    pinned: bool,
) -> Result<Labelled, PinError> {
    let status = client.image_status(image).await?.ok_or_else(|| {
        PinError::Containerd(format!("{image} is not on the node: nothing to label"))
    })?;
    let names: BTreeSet<String> = std::iter::once(image.to_string())
        .chain(status.repo_digests)
        .chain(status.repo_tags)
        .chain(std::iter::once(status.id))
        .filter(|n| !n.is_empty())
        .collect();
    let mut images = ImagesClient::new(client.channel());
    let mut records = Vec::new();
    for name in names {
        let labels = pinned
            .then(|| {
                (
                    CONTAINERD_PIN_LABEL.to_string(),
                    CONTAINERD_PIN_VALUE.to_string(),
                )
            })
            .into_iter()
            .collect();
        let update = UpdateImageRequest {
            image: Some(ContainerdImage {
                name: name.clone(),
                labels,
                ..ContainerdImage::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![format!("labels.{CONTAINERD_PIN_LABEL}")],
            }),
        };
        match images.update(namespaced(update)).await {
            // Not every name CRI reports has a record of its own (e.g. the id of an image `ctr` pulled).
            Err(status) if status.code() == tonic::Code::NotFound => continue,
            Err(status) => return Err(containerd_error("Update", &name, &status)),
            Ok(_) => {}
        }
        // Read back: proof it was written, since containerd 1.6 does not report pins through CRI.
        let has = containerd_label(client, &name).await?;
        if (has.as_deref() == Some(CONTAINERD_PIN_VALUE)) != pinned {
            return Err(PinError::Containerd(format!(
                "{name}: the label {CONTAINERD_PIN_LABEL} reads {has:?} after the update"
            )));
        }
        records.push(name);
    }
    let confirmed = client
        .image_status(image)
        .await?
        .is_some_and(|i| i.pinned == pinned);
    Ok(Labelled { records, confirmed })
}

/// The pin label on the containerd image record `name` (None: no label or no record).
pub async fn containerd_label(client: &CriClient, name: &str) -> Result<Option<String>, PinError> {
    match ImagesClient::new(client.channel())
        .get(namespaced(GetImageRequest { name: name.into() }))
        .await
    {
        Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
        Err(status) => Err(containerd_error("Get", name, &status)),
        Ok(reply) => Ok(reply
            .into_inner()
            .image
            .and_then(|mut i| i.labels.remove(CONTAINERD_PIN_LABEL))),
    }
}

/// Whether any containerd record of the image (the reference, or a name CRI reports for it in `status`)
/// carries the pin label, as pinning writes it on every one.
pub async fn pinned_by_label(
    client: &CriClient,
    reference: &str,
    status: &Image,
) -> Result<bool, PinError> {
    let names = std::iter::once(reference)
        .chain(status.repo_digests.iter().map(String::as_str))
        .chain(status.repo_tags.iter().map(String::as_str));
    for name in names {
        if containerd_label(client, name).await?.as_deref() == Some(CONTAINERD_PIN_VALUE) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn containerd_error(rpc: &str, name: &str, status: &tonic::Status) -> PinError {
    PinError::Containerd(format!(
        "{rpc} {name}: {} ({:?})",
        status.message(),
        status.code()
    ))
}

// ---------------------------------------------------------------------------------------------------------
// Shared with lazy.rs: TOML edits that keep formatting, and the atomic write.

pub(crate) fn parse(text: Option<&str>) -> Result<DocumentMut, String> {
    text.unwrap_or("")
        .parse()
        .map_err(|e: toml_edit::TomlError| format!("not valid TOML: {}", e.message()))
}

/// The table at `path`, created when missing: with `indent`, every level gets a header indented by it once
/// per level below the first (`[crio]` then `  [crio.image]`); without, only the last level does
/// (`[storage.options]`). Fails when something on the path is not a table.
pub(crate) fn table_at<'d>(
    doc: &'d mut DocumentMut,
    path: &[&str],
    indent: Option<&str>,
) -> Result<&'d mut dyn TableLike, String> {
    let mut table: &mut dyn TableLike = doc.as_table_mut();
    for (depth, name) in path.iter().enumerate() {
        let item = table.entry(name).or_insert_with(|| {
            let mut new = Table::new();
            match indent {
                Some(indent) => new.decor_mut().set_prefix(indent.repeat(depth)),
                None => new.set_implicit(depth + 1 < path.len()),
            }
            Item::Table(new)
        });
        table = item
            .as_table_like_mut()
            .ok_or_else(|| format!("{} is not a table", path[..=depth].join(".")))?;
    }
    Ok(table)
}

/// Sets `key` to an array of `values` on one line, keeping the formatting of an existing key and value
/// (e.g. a trailing comment); a new key is indented by `indent`.
pub(crate) fn set_array<'v>(
    table: &mut dyn TableLike,
    key: &str,
    values: impl IntoIterator<Item = &'v str>,
    indent: &str,
) {
    let mut array: Array = values.into_iter().collect();
    array.fmt();
    match table.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            let decor = old.decor().clone();
            *old = Value::Array(array);
            *old.decor_mut() = decor;
        }
        None => {
            table.insert(key, Item::Value(Value::Array(array)));
            if let Some(mut k) = table.key_mut(key) {
                k.leaf_decor_mut().set_prefix(indent);
            }
        }
    }
}

/// The file's text, or None when it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, PinError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_error(path)(e.to_string())),
    }
}

/// Makes `path` hold `new` (None: not exist), given that it holds `old`; returns whether anything changed.
/// A write goes to a temporary file in the same directory (same owner and mode as the old file), is synced,
/// renamed over the old one and the directory synced: a crash leaves the old file or the new, never half.
pub(crate) fn write_if_changed(
    path: &Path,
    old: Option<&str>,
    new: Option<&str>,
) -> Result<bool, PinError> {
    if old == new {
        return Ok(false);
    }
    let err = |e: io::Error| file_error(path)(e.to_string());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match new {
        None => fs::remove_file(path).map_err(err)?,
        Some(text) => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let tmp = dir.join(format!(
                ".{name}.tmp-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let written = (|| {
                let existing = fs::metadata(path).ok();
                let mode = existing.as_ref().map_or(0o644, |m| m.mode() & 0o7777);
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&tmp)?;
                if let Some(m) = &existing {
                    // The umask may have narrowed `mode`; the owner should not change either.
                    file.set_permissions(fs::Permissions::from_mode(mode))?;
                    std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
                }
                file.write_all(text.as_bytes())?;
                file.sync_all()?;
                fs::rename(&tmp, path)
            })();
            if let Err(e) = written {
                let _ = fs::remove_file(&tmp);
                return Err(err(e));
            }
        }
    }
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pins(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_new_drop_in_has_the_daemons_exact_shape_sorted_and_deduplicated() {
        let new = crio_drop_in(None, &pins(&["b@sha256:2", "a@sha256:1", "b@sha256:2"])).unwrap();
        assert_eq!(
            new.as_deref(),
            Some("[crio]\n  [crio.image]\n    pinned_images = [\"a@sha256:1\", \"b@sha256:2\"]\n")
        );
        assert_eq!(read_back(new.as_deref()), ["a@sha256:1", "b@sha256:2"]);
    }

    fn read_back(text: Option<&str>) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = text {
            fs::write(dir.path().join(CRIO_DROP_IN), text).unwrap();
        }
        read_crio_pins(dir.path()).unwrap()
    }

    #[test]
    fn an_edit_keeps_comments_and_other_keys() {
        let old = "# managed by pinboard; ask ops before editing\n[crio]\n  log_level = \"info\"\n  [crio.image]\n    # keep the pause image\n    pause_image = \"p\"\n    pinned_images = [\"old\"] # trailing\n[crio.runtime]\n  x = 1\n";
        let new = crio_drop_in(Some(old), &pins(&["z", "y"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            new,
            old.replace("[\"old\"]", "[\"y\", \"z\"]"),
            "only the list changes"
        );
    }

    #[test]
    fn same_pins_give_the_same_text_and_no_pins_no_file() {
        let first = crio_drop_in(None, &pins(&["a", "b"])).unwrap();
        assert_eq!(
            crio_drop_in(first.as_deref(), &pins(&["b", "a"])).unwrap(),
            first
        );
        assert_eq!(crio_drop_in(first.as_deref(), &[]).unwrap(), None);
        assert!(
            crio_drop_in(Some("crio = 1"), &pins(&["a"]))
                .unwrap_err()
                .contains("crio is not a table")
        );
        assert!(
            crio_drop_in(Some("[crio"), &pins(&["a"]))
                .unwrap_err()
                .contains("not valid TOML")
        );
    }

    #[test]
    fn writes_only_on_change_keeps_mode_and_an_empty_list_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CRIO_DROP_IN);
        assert!(write_crio_pins(dir.path(), &pins(&["a"])).unwrap());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let inode = fs::metadata(&path).unwrap().ino();
        assert!(!write_crio_pins(dir.path(), &pins(&["a", "a"])).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode, "not rewritten");
        assert!(write_crio_pins(dir.path(), &pins(&["a", "b"])).unwrap());
        let meta = fs::metadata(&path).unwrap();
        assert_ne!(meta.ino(), inode, "replaced by rename");
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(read_crio_pins(dir.path()).unwrap(), ["a", "b"]);
        assert!(write_crio_pins(dir.path(), &[]).unwrap());
        assert!(!path.exists());
        assert!(!write_crio_pins(dir.path(), &[]).unwrap());
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temporary files left"
        );
    }

    #[test]
    fn crio_config_is_read_from_crio_conf_then_every_file_under_the_drop_in_dir() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("crio.conf.d");
        let set = |path: &Path, patterns: &str| {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(
                path,
                format!("[crio.image]\npinned_images = [{patterns}]\n"),
            )
            .unwrap();
        };
        // Nothing there at all: no setting, no error.
        assert_eq!(read_crio_config(&dir).unwrap(), CrioConfig::default());
        set(&root.path().join("crio.conf"), "\"base/*\"");
        set(&dir.join("10-site.conf"), "\"site/*\"");
        // No extension filter, subdirectories read in place: `a/x` before `a-b`.
        set(&dir.join("a").join("x"), "\"a-x\"");
        set(&dir.join("a-b"), "\"a-b\"");
        fs::write(dir.join("05-log.conf"), "[crio]\nlog_level = \"debug\"\n").unwrap();
        let files: Vec<String> = read_crio_config(&dir)
            .unwrap()
            .settings
            .into_iter()
            .map(|s| s.file)
            .collect();
        let main = root.path().join("crio.conf").display().to_string();
        assert_eq!(files, [main.as_str(), "10-site.conf", "a/x", "a-b"]);
        fs::write(dir.join("20-bad.conf"), "[crio.image").unwrap();
        let err = read_crio_config(&dir).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}: 20-bad.conf: not valid TOML", dir.display())),
            "{err}"
        );
    }

    #[test]
    fn reload_errors_name_the_pidfile() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("crio.pid");
        let err = reload_crio(&Reload::Signal {
            pidfile: pidfile.clone(),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains(&pidfile.display().to_string()), "{err}");
        // Above any pid_max: no such process.
        fs::write(&pidfile, "99999999\n").unwrap();
        let err = reload_crio(&Reload::Signal {
            pidfile: pidfile.clone(),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("crio.pid") && err.contains("stale"), "{err}");
        reload_crio(&Reload::None).unwrap();
    }
}

//! CRI-O's pins: `pinned_images` in the one drop-in `50-pinned-images` (a second file would replace the
//! array, not add to it), then a reload (CRI-O re-reads its config on SIGHUP) or a restart.
//!
//! Each entry pinboard holds carries a TOML comment after its comma, invisible to CRI-O:
//! `"ref", # pinboard: set-a, set-b` (`(unowned)` for a pin adopted from before holders were recorded). A
//! note on top says the file is marked; in a marked file an entry without a mark is the administrator's and
//! is never removed. A file without the note predates marks: its entries are unowned. The file is edited
//! with `toml_edit`, one entry per line so that each can carry its mark, keeping an administrator's comments
//! and other keys, written atomically and only when its content changes. What CRI-O makes of all its files
//! together is read by [`read_crio_config`] and judged by [`crate::model::crio`].
//!
//! CRI-O enforces only the last file that sets `pinned_images`: the drop-in would revoke what an earlier
//! file (`crio.conf`, an administrator's `10-site.conf`) pins. So it carries that file's entries forward,
//! each marked `# pinboard: kept from 10-site.conf`, refreshed from that file at every write and gone with
//! the drop-in's last entry of its own. A configuration CRI-O cannot load (its reload would fail as a
//! whole) is refused before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use toml_edit::{Array, DocumentMut, Value};

use super::PinError;
use crate::backend::files::{file_error, read_optional, write_if_changed};
use crate::backend::toml_doc::{TomlDocError, decor_text, has_values, parse, set_value, table_at};
use crate::model::crio::{self, CrioConfig, PinnedImagesError, PinnedImagesSetting};
use crate::model::holders::{CrioEntry, Holder, Holders, PinChange, ReleaseScope};

pub const CRIO_CONFIG_DIR: &str = "/etc/crio/crio.conf.d";
/// The OpenShift daemon's file name: sorts after CRI-O's own drop-ins, before the administrator's `99-*`.
pub const CRIO_DROP_IN: &str = "50-pinned-images";

/// The first line of the note pinboard puts at the top of its drop-in. A drop-in without it was written
/// before pinboard marked the entries it holds: its entries are then unowned, not the administrator's.
const MARKED: &str =
    "# pinboard marks each entry it pinned with the sets holding it: \"ref\", # pinboard: SET, ...";
const HEADER: &str =
    "# Entries without that mark are the administrator's; pinboard never removes them.\n";
/// How the mark of an entry begins, and how an unowned holder is written in it (not a set name).
const MARK: &str = "# pinboard:";
const UNOWNED_MARK: &str = "(unowned)";
/// How the mark of an entry carried forward from an earlier file begins; the file's name follows.
const KEPT_MARK: &str = "kept from ";

/// Why the drop-in's text cannot be edited: CRI-O would refuse it too.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DropInError {
    #[error(transparent)]
    Toml(#[from] TomlDocError),
    #[error(transparent)]
    PinnedImages(#[from] PinnedImagesError),
}

/// The drop-in as pinboard edits it: the document, and each `pinned_images` entry with who holds it and the
/// comments around it, so that a rewrite keeps them.
struct DropIn {
    doc: DocumentMut,
    /// Written since pinboard marks its entries: an entry without a mark is the administrator's.
    marked: bool,
    entries: Vec<DropInEntry>,
    /// Comment lines after the last entry, before `]`.
    closing: Vec<String>,
}

struct DropInEntry {
    /// As written (a literal or basic string).
    value: Value,
    entry: CrioEntry,
    /// The earlier file it repeats, which the drop-in replaces: `{Admin}` holds it.
    kept_from: Option<String>,
    /// The comment after the entry that is not pinboard's mark.
    comment: Option<String>,
    /// Comment lines above the entry.
    above: Vec<String>,
}

impl DropInEntry {
    fn new(pattern: &str, holders: Holders) -> DropInEntry {
        DropInEntry {
            value: Value::from(pattern),
            entry: CrioEntry {
                pattern: pattern.to_string(),
                holders,
            },
            kept_from: None,
            comment: None,
            above: Vec::new(),
        }
    }

    /// An entry repeating `pattern` of the earlier file `file`.
    fn kept(pattern: &str, file: &str) -> DropInEntry {
        DropInEntry {
            kept_from: Some(file.to_string()),
            ..DropInEntry::new(pattern, Holders::from([Holder::Admin]))
        }
    }

    /// An administrator's own entry in the drop-in (not one kept from an earlier file).
    fn is_admins(&self) -> bool {
        self.kept_from.is_none() && self.entry.holders.contains(&Holder::Admin)
    }

    /// What follows the entry's comma: pinboard's mark, or the administrator's comment.
    fn trailing(&self) -> Option<String> {
        if let Some(file) = &self.kept_from {
            return Some(format!("{MARK} {KEPT_MARK}{file}"));
        }
        if self.is_admins() {
            return self.comment.clone();
        }
        let names: Vec<&str> = self
            .entry
            .holders
            .iter()
            .map(|h| match h {
                Holder::Set(name) => name.as_str(),
                _ => UNOWNED_MARK,
            })
            .collect();
        Some(format!("{MARK} {}", names.join(", ")))
    }
}

/// The first line of `text`, and the lines after it.
fn first_line(text: &str) -> (&str, &str) {
    text.split_once('\n').unwrap_or((text, ""))
}

/// The comment on the first line of `text`, if any.
fn comment_in(text: &str) -> Option<String> {
    let (line, _) = first_line(text);
    let line = line.trim();
    line.starts_with('#').then(|| line.to_string())
}

/// Every comment line of `text`, trimmed.
fn comment_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Who holds an entry, from the text after `# pinboard:`. An empty mark cannot be released by any set:
/// unowned, never dropped.
fn parse_mark(mark: &str) -> Holders {
    let holders: Holders = mark
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n {
            UNOWNED_MARK => Holder::Unowned,
            name => Holder::Set(name.to_string()),
        })
        .collect();
    if holders.is_empty() {
        Holders::from([Holder::Unowned])
    } else {
        holders
    }
}

impl DropIn {
    /// Reads the drop-in's text (None: no file). toml_edit keeps the comment after an entry's comma in the
    /// next entry's prefix, or, after the last entry, in the array's trailing text.
    fn parse(old: Option<&str>) -> Result<DropIn, DropInError> {
        let doc = parse(old)?;
        let marked = old.is_some_and(|text| text.lines().any(|l| l.trim_end() == MARKED));
        let mut entries = Vec::new();
        let mut closing = Vec::new();
        if let Some(item) = doc
            .get("crio")
            .and_then(|c| c.get("image"))
            .and_then(|i| i.get("pinned_images"))
        {
            let array = item.as_array().ok_or(PinnedImagesError::NotAnArray)?;
            let values: Vec<&Value> = array.iter().collect();
            let trailing = decor_text(Some(array.trailing()));
            for (i, value) in values.iter().enumerate() {
                let pattern = value
                    .as_str()
                    .ok_or_else(|| PinnedImagesError::not_a_string(value))?;
                let prefix = decor_text(value.decor().prefix());
                let above = if i == 0 {
                    comment_lines(prefix)
                } else {
                    comment_lines(first_line(prefix).1)
                };
                let after = values
                    .get(i + 1)
                    .map_or(trailing, |next| decor_text(next.decor().prefix()));
                let comment =
                    comment_in(after).or_else(|| comment_in(decor_text(value.decor().suffix())));
                let mark = comment.as_deref().and_then(|c| c.strip_prefix(MARK));
                let kept_from = mark
                    .and_then(|m| m.trim().strip_prefix(KEPT_MARK))
                    .map(str::to_string);
                let (holders, comment) = match mark {
                    _ if kept_from.is_some() => (Holders::from([Holder::Admin]), None),
                    Some(mark) => (parse_mark(mark), None),
                    None if marked => (Holders::from([Holder::Admin]), comment),
                    None => (Holders::from([Holder::Unowned]), comment),
                };
                let mut value = (*value).clone();
                value.decor_mut().clear();
                entries.push(DropInEntry {
                    value,
                    entry: CrioEntry {
                        pattern: pattern.to_string(),
                        holders,
                    },
                    kept_from,
                    comment,
                    above,
                });
            }
            if !values.is_empty() {
                closing = comment_lines(first_line(trailing).1);
            }
        }
        Ok(DropIn {
            doc,
            marked,
            entries,
            closing,
        })
    }

    /// Replaces the entries kept from an earlier file with those of `earlier`, the setting CRI-O has in
    /// force before the drop-in, each one the drop-in has no entry for: while the drop-in has an entry of
    /// its own (a set's, or the administrator's), so that it never revokes what that file pins. Without one
    /// of its own, it keeps none: the earlier file is in force again once the key is gone.
    fn keep(&mut self, earlier: Option<&PinnedImagesSetting>) {
        self.entries.retain(|e| e.kept_from.is_none());
        let Some(earlier) = earlier.filter(|_| !self.entries.is_empty()) else {
            return;
        };
        for pattern in &earlier.patterns {
            if !self.entries.iter().any(|e| e.entry.pattern == *pattern) {
                self.entries.push(DropInEntry::kept(pattern, &earlier.file));
            }
        }
    }

    /// The new text: entries sorted (stable, so an administrator's duplicate keeps its place), one per line
    /// with its mark, comments kept; the note on top. None when no entry and nothing else is left.
    fn render(mut self) -> Result<Option<String>, DropInError> {
        self.entries
            .sort_by(|a, b| a.entry.pattern.cmp(&b.entry.pattern));
        let image = table_at(&mut self.doc, &["crio", "image"], Some("  "))?;
        if self.entries.is_empty() {
            image.remove("pinned_images");
            let anything_left = self.doc.iter().any(|(_, item)| has_values(item));
            return Ok(anything_left.then(|| self.with_header()));
        }
        let indent = image
            .key("pinned_images")
            .and_then(|k| k.leaf_decor().prefix())
            .map_or("    ", |p| {
                let text = decor_text(Some(p));
                &text[text.rfind('\n').map_or(0, |i| i + 1)..]
            })
            .to_string();
        let inner = format!("{indent}  ");
        let mut array = Array::new();
        let mut after_previous = String::new();
        for mut entry in std::mem::take(&mut self.entries) {
            // A mark replaces a comment after the entry: the comment moves above it.
            if !entry.is_admins()
                && let Some(comment) = entry.comment.take()
            {
                entry.above.push(comment);
            }
            let mut prefix = format!("{after_previous}\n");
            for line in &entry.above {
                prefix.push_str(&format!("{inner}{line}\n"));
            }
            prefix.push_str(&inner);
            after_previous = entry
                .trailing()
                .map_or_else(String::new, |t| format!(" {t}"));
            let mut value = entry.value;
            value.decor_mut().set_prefix(prefix);
            array.push_formatted(value);
        }
        let mut trailing = format!("{after_previous}\n");
        for line in &self.closing {
            trailing.push_str(&format!("{inner}{line}\n"));
        }
        trailing.push_str(&indent);
        array.set_trailing(trailing);
        array.set_trailing_comma(true);
        set_value(image, "pinned_images", Value::Array(array), &indent);
        Ok(Some(self.with_header()))
    }

    fn with_header(&self) -> String {
        let text = self.doc.to_string();
        if self.marked {
            text
        } else {
            format!("{MARKED}\n{HEADER}{text}")
        }
    }
}

/// Every `pinned_images` entry of a drop-in's text, with who holds it.
pub fn crio_entries(text: &str) -> Result<Vec<CrioEntry>, DropInError> {
    Ok(DropIn::parse(Some(text))?
        .entries
        .into_iter()
        .map(|e| e.entry)
        .collect())
}

/// The drop-in's new content once each image of `holds` is held by its sets (added to what holds it
/// already; a new entry where pinboard has none for it), given its old content and `earlier`, the setting
/// CRI-O has in force before the drop-in ([`CrioConfig::before`]), whose entries it keeps. Pure, for
/// previews; an administrator's entries, comments and other keys are kept.
pub fn hold_in_drop_in(
    old: Option<&str>,
    holds: &BTreeMap<String, BTreeSet<String>>,
    earlier: Option<&PinnedImagesSetting>,
) -> Result<Option<String>, DropInError> {
    let mut drop_in = DropIn::parse(old)?;
    drop_in.entries.retain(|e| e.kept_from.is_none());
    for (image, sets) in holds {
        let sets = sets.iter().map(|s| Holder::Set(s.clone()));
        match drop_in
            .entries
            .iter_mut()
            .find(|e| !e.is_admins() && e.entry.pattern == *image)
        {
            Some(entry) => entry.entry.holders.extend(sets),
            None => drop_in
                .entries
                .push(DropInEntry::new(image, sets.collect())),
        }
    }
    drop_in.keep(earlier);
    drop_in.render()
}

/// The drop-in's new content once `release` is applied to its entries (an entry goes with its last
/// holder; the administrator's never go), with the entries of `earlier` kept as [`hold_in_drop_in`] keeps
/// them, and what it did to each entry it changed or was asked about. The text is unchanged when no
/// holder is released.
pub fn release_in_drop_in(
    old: Option<&str>,
    release: &ReleaseScope,
    earlier: Option<&PinnedImagesSetting>,
) -> Result<(Option<String>, Vec<PinChange>), DropInError> {
    let mut drop_in = DropIn::parse(old)?;
    let mut changes = Vec::new();
    for entry in drop_in.entries.iter_mut().filter(|e| e.kept_from.is_none()) {
        let names = [entry.entry.pattern.clone()];
        if let Some(change) = release.change(&entry.entry.pattern, &entry.entry.holders, &names) {
            entry.entry.holders = change.after.clone();
            changes.push(change);
        }
    }
    if changes.iter().all(|c| c.before == c.after) {
        return Ok((old.map(str::to_string), changes));
    }
    drop_in.entries.retain(|e| !e.entry.holders.is_empty());
    drop_in.keep(earlier);
    Ok((drop_in.render()?, changes))
}

/// The entries of the drop-in in `config_dir`, with who holds them (none when there is no file).
pub fn read_drop_in(config_dir: &Path) -> Result<Vec<CrioEntry>, PinError> {
    let path = config_dir.join(CRIO_DROP_IN);
    match read_optional(&path)? {
        Some(text) => Ok(crio_entries(&text).map_err(file_error(&path))?),
        None => Ok(Vec::new()),
    }
}

/// The patterns the drop-in in `config_dir` lists (empty when there is no file).
pub fn read_crio_pins(config_dir: &Path) -> Result<Vec<String>, PinError> {
    Ok(read_drop_in(config_dir)?
        .into_iter()
        .map(|e| e.pattern)
        .collect())
}

/// The drop-in's text in `config_dir` (None: no file): what [`put_back_drop_in`] restores. Blocking.
pub fn drop_in_text(config_dir: &Path) -> Result<Option<String>, PinError> {
    Ok(read_optional(&config_dir.join(CRIO_DROP_IN))?)
}

/// Makes the drop-in in `config_dir` hold `text` again (None: no file), as it was before a change that
/// could not take effect. Blocking.
pub fn put_back_drop_in(config_dir: &Path, text: Option<&str>) -> Result<(), PinError> {
    let path = config_dir.join(CRIO_DROP_IN);
    let now = read_optional(&path)?;
    write_if_changed(&path, now.as_deref(), text)?;
    Ok(())
}

/// Holds each image of `holds` by its sets in the drop-in in `config_dir`, keeping what the file before it
/// pins, written only when its content changes; returns whether it changed. Refused, with nothing written,
/// when CRI-O could not load its configuration ([`read_crio_config`]). Blocking: call from
/// `spawn_blocking`.
pub fn hold_crio_pins(
    config_dir: &Path,
    holds: &BTreeMap<String, BTreeSet<String>>,
) -> Result<bool, PinError> {
    let config = read_crio_config(config_dir)?;
    let path = config_dir.join(CRIO_DROP_IN);
    let old = read_optional(&path)?;
    let new = hold_in_drop_in(old.as_deref(), holds, config.before(CRIO_DROP_IN))
        .map_err(file_error(&path))?;
    Ok(write_if_changed(&path, old.as_deref(), new.as_deref())?)
}

/// Applies `release` to the drop-in in `config_dir`, keeping what the file before it pins, written only
/// when its content changes; returns whether it changed and what happened to each entry concerned. Refused
/// as [`hold_crio_pins`] is. Blocking: call from `spawn_blocking`.
pub fn release_crio_pins(
    config_dir: &Path,
    release: &ReleaseScope,
) -> Result<(bool, Vec<PinChange>), PinError> {
    let config = read_crio_config(config_dir)?;
    let path = config_dir.join(CRIO_DROP_IN);
    let old = read_optional(&path)?;
    let (new, changes) = release_in_drop_in(old.as_deref(), release, config.before(CRIO_DROP_IN))
        .map_err(file_error(&path))?;
    Ok((
        write_if_changed(&path, old.as_deref(), new.as_deref())?,
        changes,
    ))
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
/// empty; a file CRI-O could not load either is [`PinError::CrioConfig`]. Blocking: call from
/// `spawn_blocking`.
pub fn read_crio_config(config_dir: &Path) -> Result<CrioConfig, PinError> {
    CrioConfig::read(crio_config_files(config_dir)?)
        .map_err(|e| PinError::CrioConfig(file_error(config_dir)(e)))
}

/// The files CRI-O reads for its configuration, in its order, each named as people are shown it
/// (`crio.conf` by its path, a drop-in relative to `config_dir`) with its text. Blocking.
pub fn crio_config_files(config_dir: &Path) -> Result<Vec<(String, String)>, PinError> {
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
        let text = fs::read_to_string(&path).map_err(file_error(&path))?;
        files.push((relative.display().to_string(), text));
    }
    Ok(files)
}

/// Every file under `dir` (whose path below the drop-in directory is `relative`), as CRI-O's walk finds
/// them: directories are entered (not through symlinks), anything else that reads as a file is one.
fn collect_files(dir: &Path, relative: &Path, out: &mut Vec<PathBuf>) -> Result<(), PinError> {
    let err = |e: io::Error| file_error(dir)(e);
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;
    use crate::model::holders::{Sets, holders_of};
    use crate::model::set::{ImageSet, from_flags};

    /// Each image held by the sets that list it.
    fn holds(sets: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        let sets: Vec<ImageSet> = sets
            .iter()
            .map(|(name, images)| {
                let images: Vec<String> = images.iter().map(|i| i.to_string()).collect();
                from_flags(name, &images)
            })
            .collect();
        holders_of(&sets)
    }

    fn set(name: &str) -> Holder {
        Holder::Set(name.into())
    }

    /// What CRI-O reads from the text: the marks are comments, invisible to it.
    fn crio_reads(text: &str) -> Vec<String> {
        crio::pinned_images_in(text).unwrap().unwrap()
    }

    const NOTE: &str = "# pinboard marks each entry it pinned with the sets holding it: \"ref\", # pinboard: SET, ...\n\
                        # Entries without that mark are the administrator's; pinboard never removes them.\n";

    #[test]
    fn a_new_drop_in_marks_each_entry_with_its_sets_sorted_one_per_line() {
        let new = hold_in_drop_in(
            None,
            &holds(&[
                ("set-b", &["b@sha256:2", "a@sha256:1"]),
                ("set-a", &["a@sha256:1"]),
            ]),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            new,
            format!(
                "{NOTE}[crio]\n  [crio.image]\n    pinned_images = [\n      \"a@sha256:1\", # pinboard: set-a, set-b\n      \"b@sha256:2\", # pinboard: set-b\n    ]\n"
            )
        );
        assert_eq!(crio_reads(&new), ["a@sha256:1", "b@sha256:2"]);
        let entries = crio_entries(&new).unwrap();
        assert_eq!(
            entries[0].holders,
            Holders::from([set("set-a"), set("set-b")])
        );
        // Holding again changes nothing; another set is added to the entry, not a second entry.
        let again =
            hold_in_drop_in(Some(&new), &holds(&[("set-a", &["a@sha256:1"])]), None).unwrap();
        assert_eq!(again.as_deref(), Some(new.as_str()));
        let more = hold_in_drop_in(Some(&new), &holds(&[("set-c", &["b@sha256:2"])]), None)
            .unwrap()
            .unwrap();
        assert!(
            more.contains("\"b@sha256:2\", # pinboard: set-b, set-c\n"),
            "{more}"
        );
        assert_eq!(crio_reads(&more).len(), 2);
    }

    #[test]
    fn the_drop_in_keeps_what_the_file_it_replaces_pins_while_it_has_entries_of_its_own() {
        let site = |patterns: &[&str]| PinnedImagesSetting {
            file: "10-site.conf".into(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
        };
        let earlier = site(&["quay.io/db/*", "a@sha256:1"]);
        let new = hold_in_drop_in(
            None,
            &holds(&[("set-a", &["a@sha256:1", "b@sha256:2"])]),
            Some(&earlier),
        )
        .unwrap()
        .unwrap();
        // CRI-O reads the site's glob in the drop-in too; the site's exact entry is the set's already.
        assert_eq!(
            crio_reads(&new),
            ["a@sha256:1", "b@sha256:2", "quay.io/db/*"]
        );
        assert!(
            new.contains("\"quay.io/db/*\", # pinboard: kept from 10-site.conf\n"),
            "{new}"
        );
        let kept = crio_entries(&new).unwrap().pop().unwrap();
        assert_eq!(kept.holders, Holders::from([Holder::Admin]));
        // The site's file changed: the next write follows it, and a set never takes over a kept entry.
        let changed = site(&["quay.io/db2/*"]);
        let again = hold_in_drop_in(
            Some(&new),
            &holds(&[("set-b", &["quay.io/db2/*"])]),
            Some(&changed),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            crio_reads(&again),
            ["a@sha256:1", "b@sha256:2", "quay.io/db2/*"]
        );
        assert!(
            again.contains("\"quay.io/db2/*\", # pinboard: set-b\n"),
            "{again}"
        );
        // Releasing one set keeps the others' entries and what is kept; the last takes the file, and the
        // site's file is in force again.
        let (after_b, _) = release_in_drop_in(
            Some(&again),
            &ReleaseScope::of_sets(&["set-b"], &[], false),
            Some(&changed),
        )
        .unwrap();
        let after_b = after_b.unwrap();
        assert_eq!(
            crio_reads(&after_b),
            ["a@sha256:1", "b@sha256:2", "quay.io/db2/*"]
        );
        assert!(
            after_b.contains("# pinboard: kept from 10-site.conf"),
            "{after_b}"
        );
        let (gone, _) = release_in_drop_in(
            Some(&after_b),
            &ReleaseScope::of_sets(&["set-a"], &[], false),
            Some(&changed),
        )
        .unwrap();
        assert_eq!(gone, None);
    }

    #[test]
    fn releasing_a_set_keeps_what_another_holds_and_the_last_holder_takes_the_entry() {
        let both = hold_in_drop_in(
            None,
            &holds(&[
                ("set-a", &["x@sha256:1", "y@sha256:2"]),
                ("set-b", &["y@sha256:2", "z@sha256:3"]),
            ]),
            None,
        )
        .unwrap();
        let (after_a, changes) = release_in_drop_in(
            both.as_deref(),
            &ReleaseScope::of_sets(&["set-a"], &["x@sha256:1", "y@sha256:2"], false),
            None,
        )
        .unwrap();
        let after_a = after_a.unwrap();
        assert_eq!(crio_reads(&after_a), ["y@sha256:2", "z@sha256:3"]);
        assert!(after_a.contains("\"y@sha256:2\", # pinboard: set-b\n"));
        let removed: Vec<&str> = changes
            .iter()
            .filter(|c| c.removed())
            .map(|c| c.pin.as_str())
            .collect();
        assert_eq!(removed, ["x@sha256:1"]);
        let kept: Vec<(&str, &Holders)> = changes
            .iter()
            .filter(|c| !c.removed())
            .map(|c| (c.pin.as_str(), &c.after))
            .collect();
        assert_eq!(kept, [("y@sha256:2", &Holders::from([set("set-b")]))]);
        // The last set goes: nothing else is in the file, so the file goes.
        let (gone, _) = release_in_drop_in(
            Some(&after_a),
            &ReleaseScope::of_sets(&["set-b"], &[], false),
            None,
        )
        .unwrap();
        assert_eq!(gone, None);
    }

    #[test]
    fn an_administrators_entries_comments_and_keys_survive_every_release() {
        let marked = hold_in_drop_in(None, &holds(&[("set-a", &["x@sha256:1"])]), None)
            .unwrap()
            .unwrap();
        // An administrator adds an entry of their own with a comment, a glob, and another key.
        let edited = marked
            .replace(
                "    pinned_images = [\n",
                "    log_level = \"info\"\n    pinned_images = [\n      # the DB team's images\n      'quay.io/db/*', # keep: OPS-7\n",
            )
            .replace("[crio]\n", "[crio] # site settings\n");
        let entries = crio_entries(&edited).unwrap();
        assert_eq!(entries[0].pattern, "quay.io/db/*");
        assert_eq!(entries[0].holders, Holders::from([Holder::Admin]));
        let all = ReleaseScope {
            sets: Sets::All,
            only: None,
            images: BTreeSet::new(),
            release_unowned: true,
        };
        let (after, _) = release_in_drop_in(Some(&edited), &all, None).unwrap();
        let after = after.unwrap();
        assert_eq!(crio_reads(&after), ["quay.io/db/*"]);
        for kept in [
            "      # the DB team's images\n      'quay.io/db/*', # keep: OPS-7\n",
            "log_level = \"info\"",
            "[crio] # site settings",
            NOTE,
        ] {
            assert!(after.contains(kept), "{kept:?} lost:\n{after}");
        }
        // Without any entry left, the key goes and the administrator's other key stays.
        let only_admin = edited.replace("      'quay.io/db/*', # keep: OPS-7\n", "");
        let (left, _) = release_in_drop_in(Some(&only_admin), &all, None).unwrap();
        let left = left.unwrap();
        assert!(
            !left.contains("pinned_images") && left.contains("log_level"),
            "{left}"
        );
    }

    #[test]
    fn a_drop_in_from_before_marks_is_adopted_as_unowned() {
        // As pinboard wrote it before holders, with a comment an administrator added.
        let old = "# pinned for the 4.19 upgrade\n[crio]\n  [crio.image]\n    pinned_images = [\"old@sha256:0\", \"y@sha256:2\"]\n";
        let entries = crio_entries(old).unwrap();
        assert!(
            entries
                .iter()
                .all(|e| e.holders == Holders::from([Holder::Unowned]))
        );
        let held = hold_in_drop_in(Some(old), &holds(&[("set-b", &["y@sha256:2"])]), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            held,
            format!(
                "{NOTE}# pinned for the 4.19 upgrade\n[crio]\n  [crio.image]\n    pinned_images = [\n      \"old@sha256:0\", # pinboard: (unowned)\n      \"y@sha256:2\", # pinboard: set-b, (unowned)\n    ]\n"
            )
        );
        // Unpinning set-b keeps y for its earlier, unowned pin; only --release-unowned for y takes it.
        let (kept, _) = release_in_drop_in(
            Some(&held),
            &ReleaseScope::of_sets(&["set-b"], &["y@sha256:2"], false),
            None,
        )
        .unwrap();
        assert_eq!(
            crio_reads(kept.as_deref().unwrap()),
            ["old@sha256:0", "y@sha256:2"]
        );
        let (released, _) = release_in_drop_in(
            Some(&held),
            &ReleaseScope::of_sets(&["set-b"], &["y@sha256:2"], true),
            None,
        )
        .unwrap();
        assert_eq!(crio_reads(released.as_deref().unwrap()), ["old@sha256:0"]);
        // Releasing what no entry holds leaves the file as it is, even one from before marks.
        let (same, changes) = release_in_drop_in(
            Some(old),
            &ReleaseScope::of_sets(&["set-z"], &[], false),
            None,
        )
        .unwrap();
        assert_eq!(same.as_deref(), Some(old));
        assert!(changes.is_empty());
    }

    fn read_back(text: Option<&str>) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = text {
            fs::write(dir.path().join(CRIO_DROP_IN), text).unwrap();
        }
        read_crio_pins(dir.path()).unwrap()
    }

    #[test]
    fn broken_drop_ins_are_refused_naming_the_problem() {
        let one = holds(&[("set-a", &["a"])]);
        assert!(
            hold_in_drop_in(Some("crio = 1"), &one, None)
                .unwrap_err()
                .to_string()
                .contains("crio is not a table")
        );
        assert!(
            hold_in_drop_in(Some("[crio"), &one, None)
                .unwrap_err()
                .to_string()
                .contains("not valid TOML")
        );
        assert!(
            crio_entries("[crio.image]\npinned_images = [1]\n")
                .unwrap_err()
                .to_string()
                .contains("is not a string")
        );
        assert_eq!(read_back(None), Vec::<String>::new());
    }

    #[test]
    fn writes_only_on_change_keeps_mode_and_the_last_release_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CRIO_DROP_IN);
        assert!(hold_crio_pins(dir.path(), &holds(&[("set-a", &["a"])])).unwrap());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let inode = fs::metadata(&path).unwrap().ino();
        assert!(!hold_crio_pins(dir.path(), &holds(&[("set-a", &["a"])])).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode, "not rewritten");
        assert!(hold_crio_pins(dir.path(), &holds(&[("set-a", &["b"])])).unwrap());
        let meta = fs::metadata(&path).unwrap();
        assert_ne!(meta.ino(), inode, "replaced by rename");
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(read_crio_pins(dir.path()).unwrap(), ["a", "b"]);
        let (changed, _) =
            release_crio_pins(dir.path(), &ReleaseScope::of_sets(&["set-a"], &[], false)).unwrap();
        assert!(changed);
        assert!(!path.exists());
        let (changed, _) =
            release_crio_pins(dir.path(), &ReleaseScope::of_sets(&["set-a"], &[], false)).unwrap();
        assert!(!changed);
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

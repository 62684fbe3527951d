//! The lazy-pull storage drop-in for CRI-O (containers-storage): `additionallayerstores` pointing at
//! stargz-store, so eStargz and zstd:chunked images start before they are fully fetched.
//!
//! Same rules as the pin drop-in ([`super::pins::crio`]): edited with `toml_edit` so other content survives
//! ([`super::toml_doc`]), written atomically and only on change ([`super::files`]). The store only helps when
//! stargz-store has it mounted, so a missing mount comes back as a warning rather than an error: the file
//! may well be written before the store is started.

use std::path::{Path, PathBuf};

use toml_edit::{Item, Value};

use super::files::{file_error, read_optional, write_if_changed};
use super::pins::PinError;
use super::toml_doc::{TomlDocError, parse, set_array, table_at};

pub const STORAGE_CONF_DIR: &str = "/etc/containers/storage.conf.d";
pub const LAZY_DROP_IN: &str = "lazy-image-pull.conf";
/// stargz-store's default mount, with `:ref` (the store is addressed by image reference and layer digest).
pub const STARGZ_STORE: &str = "/var/lib/stargz-store/store:ref";
const KEY: &str = "additionallayerstores";

/// Where the drop-in lives and which store it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyConfig {
    pub file: PathBuf,
    pub store: String,
}

impl Default for LazyConfig {
    fn default() -> Self {
        LazyConfig {
            file: Path::new(STORAGE_CONF_DIR).join(LAZY_DROP_IN),
            store: STARGZ_STORE.into(),
        }
    }
}

/// Why the drop-in cannot be edited.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LazyError {
    #[error(transparent)]
    Toml(#[from] TomlDocError),
    #[error("storage.options.{KEY} is not an array")]
    NotAnArray,
    #[error("{KEY} entry {entry} is not a string")]
    NotAString { entry: String },
}

/// What the drop-in says now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LazyState {
    /// No file.
    Off,
    /// The file names the store.
    On,
    /// The file exists but does not name the store: its text, for the operator to look at.
    Other(String),
}

/// The drop-in's new content (None: no file) with the store added (`enable`) or removed. Other stores and
/// keys are kept; a file left with nothing in it goes.
pub fn lazy_drop_in(
    old: Option<&str>,
    store: &str,
    enable: bool,
) -> Result<Option<String>, LazyError> {
    let mut doc = parse(old)?;
    let options = table_at(&mut doc, &["storage", "options"], None)?;
    let mut stores = current(options.get(KEY))?;
    stores.retain(|s| s != store);
    if enable {
        stores.push(store.to_string());
    }
    if stores.is_empty() {
        options.remove(KEY);
    } else {
        set_array(options, KEY, stores.iter().map(String::as_str), "");
    }
    // Drop the tables this edit may have emptied (or created), then the file if nothing is left.
    for path in [&["storage", "options"][..], &["storage"]] {
        let (last, parents) = path.split_last().expect("non-empty");
        let parent = table_at(&mut doc, parents, None)?;
        if parent
            .get(last)
            .and_then(Item::as_table_like)
            .is_some_and(|t| t.is_empty())
        {
            parent.remove(last);
        }
    }
    let text = doc.to_string();
    Ok((!text.trim().is_empty()).then_some(text))
}

fn current(item: Option<&Item>) -> Result<Vec<String>, LazyError> {
    let Some(item) = item else {
        return Ok(Vec::new());
    };
    let array = item.as_array().ok_or(LazyError::NotAnArray)?;
    array
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| LazyError::NotAString {
                    entry: v.to_string(),
                })
        })
        .collect()
}

/// The state of the drop-in.
pub fn read_lazy(config: &LazyConfig) -> Result<LazyState, PinError> {
    let Some(text) = read_optional(&config.file)? else {
        return Ok(LazyState::Off);
    };
    let named = parse(Some(&text))
        .ok()
        .and_then(|doc| {
            let stores = doc
                .get("storage")?
                .get("options")?
                .get(KEY)?
                .as_array()?
                .clone();
            Some(
                stores
                    .iter()
                    .filter_map(Value::as_str)
                    .any(|s| s == config.store),
            )
        })
        .unwrap_or(false);
    Ok(if named {
        LazyState::On
    } else {
        LazyState::Other(text)
    })
}

/// What [`set_lazy`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyOutcome {
    pub changed: bool,
    /// Set when lazy pulling is on but the store is not mounted.
    pub warning: Option<String>,
}

/// Turns lazy pulling on or off in the drop-in. Blocking: call from `spawn_blocking`.
pub fn set_lazy(config: &LazyConfig, enable: bool) -> Result<LazyOutcome, PinError> {
    let old = read_optional(&config.file)?;
    let new =
        lazy_drop_in(old.as_deref(), &config.store, enable).map_err(file_error(&config.file))?;
    let changed = write_if_changed(&config.file, old.as_deref(), new.as_deref())?;
    let warning = if enable {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        store_warning(&config.store, &mountinfo)
    } else {
        None
    };
    Ok(LazyOutcome { changed, warning })
}

/// A warning when the store's directory (the part before `:ref`) is not a mount point in `mountinfo`
/// (the text of /proc/self/mountinfo).
pub fn store_warning(store: &str, mountinfo: &str) -> Option<String> {
    let dir = store
        .strip_suffix(":ref")
        .unwrap_or(store)
        .trim_end_matches('/');
    // Field 5 is the mount point, with space, tab, newline and backslash escaped in octal.
    let mounted = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape(point) == dir);
    (!mounted).then(|| {
        format!(
            "{dir} is not mounted: start stargz-store (stargz-store.service), or images will be pulled in full"
        )
    })
}

fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_writes_the_store_and_off_removes_the_file() {
        let on = lazy_drop_in(None, STARGZ_STORE, true).unwrap().unwrap();
        assert_eq!(
            on,
            "[storage.options]\nadditionallayerstores = [\"/var/lib/stargz-store/store:ref\"]\n"
        );
        assert_eq!(
            lazy_drop_in(Some(&on), STARGZ_STORE, true)
                .unwrap()
                .as_deref(),
            Some(on.as_str())
        );
        assert_eq!(lazy_drop_in(Some(&on), STARGZ_STORE, false).unwrap(), None);
        assert_eq!(lazy_drop_in(None, STARGZ_STORE, false).unwrap(), None);
    }

    #[test]
    fn other_content_survives_both_ways() {
        let old = "# site storage tuning\n[storage]\ndriver = \"overlay\"\n[storage.options]\nadditionallayerstores = [\"/other:ref\"]\n";
        let on = lazy_drop_in(Some(old), STARGZ_STORE, true)
            .unwrap()
            .unwrap();
        assert_eq!(
            on,
            old.replace(
                "\"/other:ref\"]",
                "\"/other:ref\", \"/var/lib/stargz-store/store:ref\"]"
            )
        );
        assert_eq!(
            lazy_drop_in(Some(&on), STARGZ_STORE, false)
                .unwrap()
                .as_deref(),
            Some(old)
        );
    }

    #[test]
    fn state_and_writes_go_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = LazyConfig {
            file: dir.path().join(LAZY_DROP_IN),
            store: format!("{}:ref", dir.path().display()),
        };
        assert_eq!(read_lazy(&config).unwrap(), LazyState::Off);
        let first = set_lazy(&config, true).unwrap();
        assert!(first.changed);
        assert!(first.warning.unwrap().contains("is not mounted"));
        assert_eq!(read_lazy(&config).unwrap(), LazyState::On);
        assert!(!set_lazy(&config, true).unwrap().changed);
        std::fs::write(&config.file, "[storage]\ndriver = \"overlay\"\n").unwrap();
        assert!(
            matches!(read_lazy(&config).unwrap(), LazyState::Other(t) if t.contains("overlay"))
        );
        assert!(
            set_lazy(&config, false).unwrap()
                == LazyOutcome {
                    changed: false,
                    warning: None
                }
        );
        assert!(set_lazy(&config, true).unwrap().changed);
        assert!(set_lazy(&config, false).unwrap().changed);
        assert_eq!(
            std::fs::read_to_string(&config.file).unwrap(),
            "[storage]\ndriver = \"overlay\"\n"
        );
    }

    #[test]
    fn the_store_must_be_a_mount_point() {
        let mountinfo = "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n\
                         98 22 0:50 / /var/lib/stargz\\040store/store rw - fuse.stargz-store stargz rw\n";
        assert_eq!(
            store_warning("/var/lib/stargz store/store:ref", mountinfo),
            None
        );
        let warning = store_warning(STARGZ_STORE, mountinfo).unwrap();
        assert!(
            warning.starts_with("/var/lib/stargz-store/store is not mounted"),
            "{warning}"
        );
    }
}

//! CRI-O's lazy pulling: the containers-storage drop-in `additionallayerstores` pointing at stargz-store,
//! so eStargz and zstd:chunked images start before they are fully fetched. CRI-O reads it when it starts.
//!
//! Same rules as the pin drop-in ([`crate::backend::pins::crio`]): edited with `toml_edit` so other content
//! survives ([`crate::backend::toml_doc`]). The store only helps when stargz-store has it mounted, so a
//! missing mount is said rather than refused: the file may well be written before the store is started.

use toml_edit::{Item, Value};

use crate::backend::toml_doc::{TomlDocError, parse, set_array, table_at};

pub const STORAGE_CONF_DIR: &str = "/etc/containers/storage.conf.d";
pub const LAZY_DROP_IN: &str = "lazy-image-pull.conf";
/// stargz-store's default mount, with `:ref` (the store is addressed by image reference and layer digest).
pub const STARGZ_STORE: &str = "/var/lib/stargz-store/store:ref";
const KEY: &str = "additionallayerstores";

/// Why the drop-in cannot be edited.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageDropInError {
    #[error(transparent)]
    Toml(#[from] TomlDocError),
    #[error("storage.options.{KEY} is not an array")]
    NotAnArray,
    #[error("{KEY} entry {entry} is not a string")]
    NotAString { entry: String },
}

/// The drop-in's new content (None: no file) with the store added (`enable`) or removed. Other stores and
/// keys are kept; a file left with nothing in it goes.
pub fn lazy_drop_in(
    old: Option<&str>,
    store: &str,
    enable: bool,
) -> Result<Option<String>, StorageDropInError> {
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

fn current(item: Option<&Item>) -> Result<Vec<String>, StorageDropInError> {
    let Some(item) = item else {
        return Ok(Vec::new());
    };
    let array = item.as_array().ok_or(StorageDropInError::NotAnArray)?;
    array
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| StorageDropInError::NotAString {
                    entry: v.to_string(),
                })
        })
        .collect()
}

/// Whether the drop-in's `text` names `store` among its additional layer stores.
pub fn names_store(text: &str, store: &str) -> bool {
    parse(Some(text))
        .ok()
        .and_then(|doc| {
            let stores = doc
                .get("storage")?
                .get("options")?
                .get(KEY)?
                .as_array()?
                .clone();
            Some(stores.iter().filter_map(Value::as_str).any(|s| s == store))
        })
        .unwrap_or(false)
}

/// Why `store` does not serve layers: not a mount point now (None when it is).
pub fn store_not_mounted(store: &str) -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    store_warning(store, &mountinfo)
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
    fn a_drop_in_names_the_store_or_not() {
        let on = lazy_drop_in(None, STARGZ_STORE, true).unwrap().unwrap();
        assert!(names_store(&on, STARGZ_STORE));
        assert!(!names_store(&on, "/other:ref"));
        assert!(!names_store(
            "[storage]\ndriver = \"overlay\"\n",
            STARGZ_STORE
        ));
        assert!(!names_store("not toml [", STARGZ_STORE));
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

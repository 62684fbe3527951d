//! Small files pinboard edits on a node (drop-ins, hosts.toml): read when they exist, and written
//! atomically, only when their content changes.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file that could not be read, parsed or written: its path and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {cause}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub cause: Box<dyn std::error::Error + Send + Sync>,
}

/// Puts `path` on a cause: `map_err(file_error(&path))`.
pub(crate) fn file_error<E>(path: &Path) -> impl FnOnce(E) -> FileError + '_
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    move |cause| FileError {
        path: path.to_owned(),
        cause: cause.into(),
    }
}

/// The file's text, or None when it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, FileError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_error(path)(e)),
    }
}

/// Makes `path` hold `new` (None: not exist), given that it holds `old`; returns whether anything changed.
/// A write goes to a temporary file in the same directory (same owner and mode as the old file), is synced,
/// renamed over the old one and the directory synced: a crash leaves the old file or the new, never half.
pub(crate) fn write_if_changed(
    path: &Path,
    old: Option<&str>,
    new: Option<&str>,
) -> Result<bool, FileError> {
    if old == new {
        return Ok(false);
    }
    let err = |e: io::Error| file_error(path)(e);
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

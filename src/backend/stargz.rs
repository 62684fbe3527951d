//! What stargz-snapshotter says of the layers it serves on this machine: it mounts each remote layer with
//! FUSE (`fuse.rawBridge`, source `stargz`, in this machine's mount table), and each mount answers
//! `/.stargz-snapshotter/<digest>.json` with the layer's size and the bytes fetched so far
//! ([`crate::model::lazy::layer_state`]; stargz 0.12 lists no such directory, but looks it up).
//!
//! Only the mounts under the node's image filesystem are read when there are any there (where the CRI
//! plugin looks for the snapshotter's files); otherwise every stargz mount of the machine, a node running
//! one snapshotter. A mount whose snapshotter died answers nothing (`ENOTCONN`) and says nothing; one
//! whose snapshotter hangs would block every read on it, so they are read in a thread of their own, given
//! up after a deadline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::lazy::{LayerFetch, layer_state};

/// The directory each stargz layer mount answers, and the FUSE filesystem's type and source.
const STATE_DIR: &str = ".stargz-snapshotter";
const FS_TYPE: &str = "fuse.rawBridge";
const SOURCE: &str = "stargz";

/// What the stargz layer mounts of this machine (those under `image_fs` when there are any) say of their
/// layers, by digest; empty when none answers within `within`.
pub async fn layer_states(
    image_fs: Option<PathBuf>,
    within: Duration,
) -> HashMap<String, LayerFetch> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A detached thread: one blocked on a hung mount must not hold up the runtime or the process's exit.
    std::thread::spawn(move || {
        let _ = tx.send(read_states(image_fs.as_deref()));
    });
    match tokio::time::timeout(within, rx).await {
        Ok(Ok(states)) => states,
        _ => {
            tracing::warn!(
                "stargz-snapshotter's layer mounts did not answer within {within:?}: how much of each layer \
                 it fetched is not said; a hung snapshotter blocks every read of its layers"
            );
            HashMap::new()
        }
    }
}

fn read_states(image_fs: Option<&Path>) -> HashMap<String, LayerFetch> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let stargz: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (source, mountpoint, kind) = (fields.next()?, fields.next()?, fields.next()?);
            (source == SOURCE && kind == FS_TYPE).then(|| PathBuf::from(unescape(mountpoint)))
        })
        .collect();
    let under: Vec<&PathBuf> = stargz
        .iter()
        .filter(|m| image_fs.is_some_and(|fs| m.starts_with(fs)))
        .collect();
    let chosen = match under.is_empty() {
        true => stargz.iter().collect(),
        false => under,
    };
    chosen
        .into_iter()
        .filter_map(|mount| std::fs::read_dir(mount.join(STATE_DIR)).ok())
        .flatten()
        .flatten()
        .filter_map(|entry| layer_state(&std::fs::read_to_string(entry.path()).ok()?))
        .collect()
}

/// A mount table field as the kernel escapes it (`\040` for a space, `\011` a tab, `\012` a newline,
/// `\134` a backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let octal = bytes
            .get(at + 1..at + 4)
            .filter(|d| bytes[at] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(digits) => {
                let code = digits.iter().fold(0u16, |n, d| n * 8 + u16::from(d - b'0'));
                out.push(u8::try_from(code).unwrap_or(b'?'));
                at += 4;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_escapes_are_undone() {
        assert_eq!(unescape("/var/lib/a\\040b/fs"), "/var/lib/a b/fs");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/odd\\09"), "/odd\\09");
    }
}

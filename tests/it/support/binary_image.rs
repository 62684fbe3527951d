//! Images made of a binary of this machine: one layer holding the binary at `/usr/local/bin/<name>` and
//! every shared library `ldd` says it links, the dynamic loader included, at the paths `ldd` names, so the
//! binary runs in a container as it does here. Headers are fixed (root-owned, mtime [`EPOCH`]), so the same
//! files give the same layer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::images::{BuiltLayer, EPOCH};

/// Where the binary goes in the image.
const BIN_DIR: &str = "usr/local/bin";

/// The layer for `binary`, and the binary's path in it (`/usr/local/bin/<name>`).
pub(crate) fn binary_layer(binary: &Path) -> Result<(BuiltLayer, String)> {
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", binary.display()))?;
    let in_image = format!("{BIN_DIR}/{name}");
    let mut files = vec![(in_image.clone(), binary.to_owned())];
    for library in linked_libraries(binary)? {
        let path = library
            .to_str()
            .with_context(|| format!("{} is not UTF-8", library.display()))?
            .trim_start_matches('/')
            .to_owned();
        files.push((path, library));
    }
    let mut directories = BTreeSet::new();
    for (path, _) in &files {
        let mut parent = Path::new(path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            directories.insert(dir.to_owned());
            parent = dir.parent();
        }
    }

    let mut tar = tar::Builder::new(Vec::new());
    for dir in &directories {
        let mut header = header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    for (path, source) in &files {
        let bytes =
            std::fs::read(source).with_context(|| format!("reading {}", source.display()))?;
        let mut header = header(tar::EntryType::Regular, 0o755, bytes.len());
        tar.append_data(&mut header, path, &bytes[..])?;
    }
    let layer = BuiltLayer::gzip(&tar.into_inner()?)?;
    Ok((layer, format!("/{in_image}")))
}

fn header(kind: tar::EntryType, mode: u32, size: usize) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(u64::try_from(size).expect("size fits u64"));
    header.set_mtime(EPOCH);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// The files `ldd` says `binary` loads (libraries and the loader), none for a static binary.
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let error = String::from_utf8_lossy(&out.stderr);
        if error.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!("ldd {}: {error}", binary.display());
    }
    let mut files = Vec::new();
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, `/lib64/ld-linux-x86-64.so.2 (0x…)`, or the
    // kernel's `linux-vdso.so.1 (0x…)`, which is no file.
    for line in text.lines().map(str::trim) {
        let file = match line.split_once("=>") {
            Some((library, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    bail!("{}: ldd finds no {}", binary.display(), library.trim());
                }
                target.split(" (").next().unwrap_or_default()
            }
            None => line.split(" (").next().unwrap_or_default(),
        };
        if file.starts_with('/') {
            files.push(PathBuf::from(file));
        }
    }
    Ok(files)
}

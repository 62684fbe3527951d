//! Which mirror rules pinboard's own registry reads follow, read from where the containers tools read them:
//! `CONTAINERS_REGISTRIES_CONF`, else `~/.config/containers/registries.conf` when it exists, else
//! `/etc/containers/registries.conf`; then every `*.conf` in `/etc/containers/registries.conf.d` (and
//! `~/.config/containers/registries.conf.d`), by name. `--registries-conf FILE` replaces the main file and
//! `--registries-conf-dir DIR` the drop-in directory, as containers/image lets its callers; `--idms FILE`
//! adds ImageDigestMirrorSet / ImageContentSourcePolicy documents. Files that are not there are skipped
//! unless named on the command line.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::Failure;
use crate::model::mirror_rules::{MirrorRules, MirrorRulesError};

const SYSTEM_CONF: &str = "/etc/containers/registries.conf";
const SYSTEM_DIR: &str = "/etc/containers/registries.conf.d";

/// Why the mirror rules cannot be read: a file or directory that cannot be read, or what is wrong in one.
#[derive(Debug, thiserror::Error)]
pub enum RegistriesConfError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Rules(#[from] MirrorRulesError),
}

impl From<RegistriesConfError> for Failure {
    fn from(error: RegistriesConfError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// Where the rules come from.
#[derive(Clone, Debug, Default)]
pub struct MirrorSources {
    /// `--registries-conf`.
    pub conf: Option<PathBuf>,
    /// `--registries-conf-dir`.
    pub dir: Option<PathBuf>,
    /// `--idms`, in order.
    pub mirror_sets: Vec<PathBuf>,
}

impl MirrorSources {
    /// The rules in force. Errors name the file and what is wrong with it.
    pub fn load(&self) -> Result<MirrorRules, RegistriesConfError> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let user = home.as_ref().map(|h| h.join(".config/containers"));
        let mut rules = MirrorRules::default();
        let main = match (&self.conf, std::env::var_os("CONTAINERS_REGISTRIES_CONF")) {
            (Some(conf), _) => Some((conf.clone(), true)),
            (None, Some(env)) => Some((PathBuf::from(env), true)),
            (None, None) => [
                user.as_ref().map(|u| u.join("registries.conf")),
                Some(SYSTEM_CONF.into()),
            ]
            .into_iter()
            .flatten()
            .find(|p| p.is_file())
            .map(|p| (p, false)),
        };
        if let Some((path, required)) = main
            && let Some(text) = read(&path, required)?
        {
            rules.add_registries_conf(&text, &path.display().to_string())?;
        }
        let dirs: Vec<PathBuf> = match &self.dir {
            Some(dir) => vec![dir.clone()],
            None => [
                Some(PathBuf::from(SYSTEM_DIR)),
                user.map(|u| u.join("registries.conf.d")),
            ]
            .into_iter()
            .flatten()
            .collect(),
        };
        for dir in dirs {
            for path in drop_ins(&dir, self.dir.is_some())? {
                if let Some(text) = read(&path, true)? {
                    rules.add_registries_conf(&text, &path.display().to_string())?;
                }
            }
        }
        for path in &self.mirror_sets {
            if let Some(text) = read(path, true)? {
                rules.add_mirror_sets(&text, &path.display().to_string())?;
            }
        }
        Ok(rules)
    }
}

/// The file's text; None when it is not there and not `required`.
fn read(path: &Path, required: bool) -> Result<Option<String>, RegistriesConfError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !required => Ok(None),
        Err(source) => Err(unreadable(path, source)),
    }
}

/// The `*.conf` files of a drop-in directory, by name.
fn drop_ins(dir: &Path, required: bool) -> Result<Vec<PathBuf>, RegistriesConfError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !required => return Ok(Vec::new()),
        Err(source) => return Err(unreadable(dir, source)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

fn unreadable(path: &Path, source: io::Error) -> RegistriesConfError {
    RegistriesConfError::Unreadable {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_named_file_then_its_drop_ins_by_name_then_mirror_sets() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("registries.conf");
        let drop_in_dir = dir.path().join("registries.conf.d");
        fs::create_dir(&drop_in_dir).unwrap();
        fs::write(
            &conf,
            "[[registry]]\nprefix = \"quay.io\"\n[[registry.mirror]]\nlocation = \"a.local\"\n",
        )
        .unwrap();
        // Read after 10-a.conf, so its rule for quay.io replaces the main file's; not a .conf: ignored.
        fs::write(
            drop_in_dir.join("20-b.conf"),
            "[[registry]]\nprefix = \"quay.io\"\n[[registry.mirror]]\nlocation = \"b.local\"\n",
        )
        .unwrap();
        fs::write(
            drop_in_dir.join("10-a.conf"),
            "[[registry]]\nprefix = \"quay.io\"\n[[registry.mirror]]\nlocation = \"c.local\"\n",
        )
        .unwrap();
        fs::write(drop_in_dir.join("README"), "not toml").unwrap();
        let idms = dir.path().join("idms.yaml");
        fs::write(&idms, "kind: ImageDigestMirrorSet\nspec:\n  imageDigestMirrors:\n  - source: ghcr.io/x\n    mirrors: [d.local/x]\n").unwrap();
        let sources = MirrorSources {
            conf: Some(conf),
            dir: Some(drop_in_dir.clone()),
            mirror_sets: vec![idms],
        };
        let rules = sources.load().unwrap();
        let first = |r: &str| rules.candidates(r)[0].reference.clone();
        assert_eq!(first(&format!("quay.io/a/b{D}")), format!("b.local/a/b{D}"));
        assert_eq!(first(&format!("ghcr.io/x/y{D}")), format!("d.local/x/y{D}"));
        let missing = MirrorSources {
            conf: Some(dir.path().join("nope.conf")),
            ..MirrorSources::default()
        };
        assert!(
            missing
                .load()
                .unwrap_err()
                .to_string()
                .contains("nope.conf")
        );
        fs::write(drop_in_dir.join("30-bad.conf"), "[[registry]\n").unwrap();
        let bad = MirrorSources {
            dir: Some(drop_in_dir),
            ..MirrorSources::default()
        };
        assert!(bad.load().unwrap_err().to_string().contains("30-bad.conf"));
    }
}

//! containerd's lazy pulling: stargz-snapshotter as a proxy plugin, and the CRI plugin's snapshotter set to
//! it with snapshot annotations on, in a file of pinboard's in a directory containerd's config imports
//! (`imports = ["/etc/containerd/conf.d/*.toml"]`). Where the config imports no such directory, nothing is
//! written: the error says which line to add, and where.
//!
//! containerd loads its config, then the files its `imports` name (a pattern's matches sorted by name), then
//! the files those import, each merged over what came before. Up to 1.7 a file that has a plugin's section
//! replaces that whole section (containerd #5837; 2.0 merges them key by key): a file setting only the
//! snapshotter would drop every other CRI setting (tried on 1.6.20: the registry's `config_path` went). So
//! pinboard's file repeats the CRI plugin's section of the last file before it that has one, with the
//! snapshotter changed, and is named to load last in its directory; a file loaded after it with a CRI
//! section of its own would win, and is refused. A config of version 3 (containerd 2) gets only the keys.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, TableLike, Value};

use super::{FileChange, LazyError};
use crate::backend::files::{file_error, read_optional};
use crate::backend::toml_doc::{decor_text, parse, set_value, table_at};

pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// containerd-stargz-grpc's default socket.
pub const STARGZ_SOCKET: &str = "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock";
/// The proxy plugin's name, which the CRI plugin's snapshotter names.
pub const SNAPSHOTTER: &str = "stargz";
/// pinboard's file in an imported directory, the pattern's `*` replaced by it: it sorts after the usual
/// names there, and so loads after them.
const OURS: &str = "zz-pinboard-lazy-pulling";
/// The directory pinboard suggests importing, beside the config.
const SUGGESTED_DIR: &str = "conf.d";
const CRI: &str = "io.containerd.grpc.v1.cri";
/// containerd 2's image plugin (config version 3), where its snapshotter is set.
const CRI_IMAGES: &str = "io.containerd.cri.v1.images";
/// The CRI plugin's snapshotter when no file sets it.
const DEFAULT_SNAPSHOTTER: &str = "overlayfs";
/// At most this many files are followed through imports: containerd itself refuses a loop.
const MAX_FILES: usize = 256;

/// One file of containerd's configuration as it loads it.
struct Loaded {
    path: PathBuf,
    doc: DocumentMut,
}

/// containerd's configuration files as it loads them, and where pinboard's file goes among them.
pub struct ContainerdFiles {
    config: PathBuf,
    /// The config's text; None when it does not exist (containerd runs on its defaults).
    config_text: Option<String>,
    /// Version 3: containerd 2's layout, whose sections merge key by key.
    version3: bool,
    /// Every file in load order, the config first; pinboard's file among them, empty when not written yet.
    loaded: Vec<Loaded>,
    /// pinboard's file, when the config imports a directory for it; its place in `loaded`.
    ours: Option<(PathBuf, usize)>,
}

impl ContainerdFiles {
    /// Reads `config` and every file it imports. Blocking.
    pub fn read(config: &Path) -> Result<ContainerdFiles, LazyError> {
        let config_text = read_optional(config)?;
        let top = parse(config_text.as_deref()).map_err(file_error(config))?;
        let version3 = top.get("version").and_then(Item::as_integer) == Some(3);
        let ours = imports(&top)
            .iter()
            .rev()
            .find_map(|import| our_file(config, import));
        let mut loaded = Vec::new();
        let mut pending = VecDeque::from([(config.to_path_buf(), Some(top))]);
        let mut seen = HashSet::new();
        while let Some((path, doc)) = pending.pop_front() {
            if !seen.insert(path.clone()) || loaded.len() >= MAX_FILES {
                continue;
            }
            let doc = match doc {
                Some(doc) => doc,
                None => parse(read_optional(&path)?.as_deref()).map_err(file_error(&path))?,
            };
            for import in imports(&doc) {
                let extra = ours.as_ref().filter(|o| matches_import(&path, &import, o));
                pending.extend(
                    resolve(&path, &import, extra)
                        .into_iter()
                        .map(|p| (p, None)),
                );
            }
            loaded.push(Loaded { path, doc });
        }
        let ours = ours.and_then(|path| {
            let at = loaded.iter().position(|l| l.path == path)?;
            Some((path, at))
        });
        Ok(ContainerdFiles {
            config: config.to_path_buf(),
            config_text,
            version3,
            loaded,
            ours,
        })
    }

    /// pinboard's file, when the config imports a directory for it.
    pub fn ours(&self) -> Option<&Path> {
        self.ours.as_ref().map(|(path, _)| path.as_path())
    }

    /// The CRI image setting these files give at `path` below the CRI image plugin's section (version 3:
    /// `io.containerd.cri.v1.images`, whose keys merge file by file; version 2: the CRI plugin, whose last
    /// section replaces the others whole, so a key it leaves out is the default): None when unset.
    fn cri_image_setting(&self, path: &[&str]) -> Option<&Item> {
        let mut setting = None;
        for loaded in &self.loaded {
            let section = match self.version3 {
                true => get(&loaded.doc, &["plugins", CRI_IMAGES]),
                false => get(&loaded.doc, &["plugins", CRI]),
            };
            let Some(section) = section else {
                continue;
            };
            let value = path
                .iter()
                .try_fold(section, |item, key| item.get(key))
                .filter(|item| !item.is_none());
            if value.is_some() || !self.version3 {
                setting = value;
            }
        }
        setting
    }

    /// The snapshotter these files give the CRI plugin, and the socket of its proxy plugin when one is
    /// configured for it.
    pub fn snapshotter(&self) -> (String, Option<PathBuf>) {
        let key: &[&str] = match self.version3 {
            true => &["snapshotter"],
            false => &["containerd", "snapshotter"],
        };
        let snapshotter = self
            .cri_image_setting(key)
            .and_then(Item::as_str)
            .unwrap_or(DEFAULT_SNAPSHOTTER)
            .to_string();
        let address = self
            .loaded
            .iter()
            .rev()
            .find_map(|l| get(&l.doc, &["proxy_plugins", &snapshotter, "address"])?.as_str())
            .map(PathBuf::from);
        (snapshotter, address)
    }

    /// The registry `config_path` (hosts.toml directory) these files give the CRI plugin, when set: what
    /// containerd 2 no longer reports through CRI `Status`.
    pub fn registry_config_path(&self) -> Option<PathBuf> {
        self.cri_image_setting(&["registry", "config_path"])
            .and_then(Item::as_str)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
    }

    /// pinboard's file with lazy pulling through `socket` turned on (`enable`) or off; refused when the
    /// config imports no directory for it, or a file loaded after it would override it.
    pub fn change(&self, enable: bool, socket: &Path) -> Result<FileChange, LazyError> {
        let Some((path, at)) = &self.ours else {
            return Err(self.no_import());
        };
        let old = read_optional(path)?;
        let doc = parse(old.as_deref()).map_err(file_error(path))?;
        if enable
            && let Some(later) = self.loaded[at + 1..]
                .iter()
                .find(|l| self.overrides(&l.doc))
        {
            return Err(LazyError::Overridden {
                file: path.clone(),
                by: later.path.clone(),
            });
        }
        let source = self.loaded[..*at]
            .iter()
            .rev()
            .find(|l| get(&l.doc, &["plugins", CRI]).is_some());
        let new = match (enable, self.version3) {
            (true, false) => {
                let section = source.and_then(|l| {
                    Some((get(&l.doc, &["plugins", CRI])?.clone(), l.path.as_path()))
                });
                on_v2(doc, old.is_none(), section, socket)
            }
            (true, true) => on_v3(doc, old.is_none(), socket),
            (false, _) => off(doc),
        }
        .map_err(file_error(path))?;
        Ok(FileChange {
            path: path.clone(),
            old,
            new,
        })
    }

    /// Whether a file's `doc`, loaded after pinboard's, would override its snapshotter.
    fn overrides(&self, doc: &DocumentMut) -> bool {
        match self.version3 {
            true => get(doc, &["plugins", CRI_IMAGES, "snapshotter"]).is_some(),
            false => get(doc, &["plugins", CRI]).is_some(),
        }
    }

    /// Why nothing is written: the config imports no directory. The exact lines to add, and where.
    fn no_import(&self) -> LazyError {
        let config = &self.config;
        let dir = config
            .parent()
            .unwrap_or(Path::new("/"))
            .join(SUGGESTED_DIR);
        let pattern = dir.join("*.toml").display().to_string();
        let quoted = toml_edit::Value::from(pattern.as_str()).to_string();
        let text = self.config_text.as_deref().unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let starts = |line: &&str, word: &str| {
            let line = line.trim_start();
            line.starts_with(word) && line[word.len()..].trim_start().starts_with('=')
        };
        let (add, place) = match (
            &self.config_text,
            lines.iter().position(|l| starts(l, "imports")),
        ) {
            (None, _) => (
                vec!["version = 2".to_string(), format!("imports = [{quoted}]")],
                format!(
                    "in a new file {} (there is none: containerd runs on its defaults)",
                    config.display()
                ),
            ),
            (Some(_), Some(at)) => {
                let mut entries: Vec<String> = imports(&parse(Some(text)).unwrap_or_default())
                    .iter()
                    .map(|i| toml_edit::Value::from(i.as_str()).to_string())
                    .collect();
                entries.push(quoted);
                (
                    vec![format!("imports = [{}]", entries.join(", "))],
                    format!("in place of line {} of {}", at + 1, config.display()),
                )
            }
            (Some(_), None) => {
                let place = match lines.iter().position(|l| l.trim_start().starts_with('[')) {
                    Some(at) => format!(
                        "before line {} (`{}`) of {}",
                        at + 1,
                        lines[at].trim(),
                        config.display()
                    ),
                    None => format!("at the end of {}", config.display()),
                };
                (vec![format!("imports = [{quoted}]")], place)
            }
        };
        LazyError::NoImport {
            config: config.clone(),
            add,
            place,
            then: format!(
                "then create {} and run `pinboard lazy on` again: pinboard writes {}",
                dir.display(),
                dir.join(format!("{OURS}.toml")).display()
            ),
        }
    }
}

/// The table or value at `path` in `doc`, if it is there.
fn get<'d>(doc: &'d DocumentMut, path: &[&str]) -> Option<&'d Item> {
    let mut item = doc.as_item();
    for key in path {
        item = item.get(key)?;
    }
    Some(item)
}

/// A document's `imports`.
fn imports(doc: &DocumentMut) -> Vec<String> {
    doc.get("imports")
        .and_then(Item::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// An import as a path: relative ones are relative to the directory of the file that imports them.
fn absolute(parent: &Path, import: &str) -> PathBuf {
    let path = Path::new(import);
    match path.is_absolute() {
        true => path.to_path_buf(),
        false => parent.parent().unwrap_or(Path::new("/")).join(path),
    }
}

/// pinboard's file for `import` of `config`, when it is a pattern in its last part only (`DIR/*.toml`):
/// the pattern's first `*` replaced by pinboard's name, the others dropped.
fn our_file(config: &Path, import: &str) -> Option<PathBuf> {
    let path = absolute(config, import);
    let name = path.file_name()?.to_str()?;
    let dir = path.parent()?;
    if !name.contains('*') || name.contains(['?', '[']) || dir.to_str()?.contains(['*', '?', '[']) {
        return None;
    }
    let ours = name.replacen('*', OURS, 1).replace('*', "");
    wildcard(name, &ours).then(|| dir.join(ours))
}

/// Whether `ours` is among the matches of `import` of the file at `parent`.
fn matches_import(parent: &Path, import: &str, ours: &Path) -> bool {
    let path = absolute(parent, import);
    path.parent() == ours.parent()
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .zip(ours.file_name().and_then(|n| n.to_str()))
            .is_some_and(|(pattern, name)| wildcard(pattern, name))
}

/// The files `import` names, as containerd resolves them: a pattern's matches sorted by name (`extra`
/// counted among them: pinboard's file before it exists), or the one path.
fn resolve(parent: &Path, import: &str, extra: Option<&PathBuf>) -> Vec<PathBuf> {
    let path = absolute(parent, import);
    if !import.contains('*') {
        return vec![path];
    }
    let (Some(dir), Some(pattern)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Vec::new();
    };
    let mut matches: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| wildcard(pattern, name))
                .map(|name| dir.join(name))
                .collect()
        })
        .unwrap_or_default();
    matches.extend(extra.cloned());
    matches.sort();
    matches.dedup();
    matches
}

/// Whether `name` matches `pattern`, whose `*` stands for any run of characters.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(name) = name.strip_prefix(head) else {
                return false;
            };
            (0..=name.len())
                .filter(|&i| name.is_char_boundary(i))
                .any(|i| wildcard(rest, &name[i..]))
        }
    }
}

/// The first lines of a file pinboard creates.
const HEADER: &str = "# Written by pinboard for lazy pulling through stargz-snapshotter; `pinboard lazy off` removes it.\n";

/// The header of a file of version 2, whose CRI section repeats the one in `from` (None: there is none).
fn header_v2(from: Option<&Path>) -> String {
    let Some(from) = from else {
        return HEADER.to_string();
    };
    format!(
        "{HEADER}# containerd 1.x takes the CRI plugin's whole section from the last file that has one, so the\n\
         # section below repeats the one in\n\
         #   {}\n\
         # with the snapshotter changed: change the CRI plugin's settings there, then run `pinboard lazy on`\n\
         # again.\n",
        from.display()
    )
}

/// Sets the proxy plugin for stargz-snapshotter at `socket`, and `version` when the file has none.
fn set_proxy_plugin(doc: &mut DocumentMut, version: i64, socket: &Path) -> Result<(), String> {
    if doc.get("version").is_none() {
        doc.insert("version", toml_edit::value(version));
    }
    let proxy = table_at(doc, &["proxy_plugins", SNAPSHOTTER], None).map_err(|e| e.to_string())?;
    let indent = sibling_indent(proxy);
    set_value(proxy, "type", "snapshot".into(), &indent);
    let address = socket.display().to_string();
    set_value(proxy, "address", address.as_str().into(), &indent);
    Ok(())
}

/// The snapshotter keys, in `table`.
fn set_snapshotter(table: &mut dyn TableLike) {
    let indent = sibling_indent(table);
    set_value(table, "snapshotter", SNAPSHOTTER.into(), &indent);
    set_value(table, "disable_snapshot_annotations", false.into(), &indent);
}

/// How the keys of `table` are indented (two spaces when it has none): a new key lines up with them.
fn sibling_indent(table: &dyn TableLike) -> String {
    table
        .iter()
        .find_map(|(key, _)| {
            let prefix = table.key(key)?.leaf_decor().prefix()?;
            Some(prefix.as_str()?.rsplit('\n').next()?.to_string())
        })
        .unwrap_or_else(|| "  ".into())
}

/// Makes `plugins` and `proxy_plugins` implicit: written only through their subtables' headers.
fn implicit_parents(doc: &mut DocumentMut) {
    for name in ["plugins", "proxy_plugins"] {
        if let Some(table) = doc.get_mut(name).and_then(Item::as_table_mut) {
            table.set_implicit(true);
        }
    }
}

/// Version 2: the proxy plugin, and `section` (the CRI plugin's section pinboard's file overrides, with
/// the file it is in; None: containerd's defaults) with the snapshotter set; `new` when the file is.
fn on_v2(
    mut doc: DocumentMut,
    new: bool,
    section: Option<(Item, &Path)>,
    socket: &Path,
) -> Result<Option<String>, String> {
    if new {
        doc.decor_mut()
            .set_prefix(header_v2(section.as_ref().map(|(_, from)| *from)));
    }
    set_proxy_plugin(&mut doc, 2, socket)?;
    let plugins = table_at(&mut doc, &["plugins"], None).map_err(|e| e.to_string())?;
    plugins.remove(CRI);
    if let Some((mut section, _)) = section {
        // Placed where it now goes, not where it was in its own file, after a blank line.
        unset_positions(&mut section);
        if let Some(table) = section.as_table_mut() {
            let prefix = decor_text(table.decor().prefix());
            if !prefix.starts_with('\n') {
                let spaced = format!("\n{prefix}");
                table.decor_mut().set_prefix(spaced);
            }
        }
        plugins.insert(CRI, section);
    }
    let containerd =
        table_at(&mut doc, &["plugins", CRI, "containerd"], None).map_err(|e| e.to_string())?;
    set_snapshotter(containerd);
    implicit_parents(&mut doc);
    Ok(Some(normalized(&doc)))
}

/// Version 3: the proxy plugin and the image plugin's snapshotter keys only (containerd 2 merges them).
fn on_v3(mut doc: DocumentMut, new: bool, socket: &Path) -> Result<Option<String>, String> {
    if new {
        doc.decor_mut().set_prefix(HEADER);
    }
    set_proxy_plugin(&mut doc, 3, socket)?;
    let images = table_at(&mut doc, &["plugins", CRI_IMAGES], None).map_err(|e| e.to_string())?;
    set_snapshotter(images);
    implicit_parents(&mut doc);
    Ok(Some(normalized(&doc)))
}

/// Removes what pinboard set (the proxy plugin, the CRI section or image plugin keys); the file goes when
/// nothing else is left in it.
fn off(mut doc: DocumentMut) -> Result<Option<String>, String> {
    let root = doc.as_table_mut();
    if let Some(proxy) = root
        .get_mut("proxy_plugins")
        .and_then(Item::as_table_like_mut)
    {
        proxy.remove(SNAPSHOTTER);
    }
    if let Some(plugins) = root.get_mut("plugins").and_then(Item::as_table_like_mut) {
        plugins.remove(CRI);
        if let Some(images) = plugins
            .get_mut(CRI_IMAGES)
            .and_then(Item::as_table_like_mut)
        {
            images.remove("snapshotter");
            images.remove("disable_snapshot_annotations");
        }
    }
    for path in [
        &["plugins", CRI_IMAGES][..],
        &["plugins"],
        &["proxy_plugins"],
    ] {
        let (last, parents) = path.split_last().expect("non-empty");
        let parent = table_at(&mut doc, parents, None).map_err(|e| e.to_string())?;
        if parent
            .get(last)
            .and_then(Item::as_table_like)
            .is_some_and(|t| t.is_empty())
        {
            parent.remove(last);
        }
    }
    let left = doc.iter().any(|(key, _)| key != "version");
    Ok(left.then(|| normalized(&doc)))
}

/// Forgets where `item`'s tables stood in the file they came from.
fn unset_positions(item: &mut Item) {
    if let Some(table) = item.as_table_mut() {
        table.set_position(None);
        for (_, child) in table.iter_mut() {
            unset_positions(child);
        }
    }
}

/// The document's text as it reads back: written again, it is the same, so an unchanged state is never
/// written twice.
fn normalized(doc: &DocumentMut) -> String {
    let text = doc.to_string();
    text.parse::<DocumentMut>()
        .map_or(text, |again| again.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toml_edit::Table;

    const SOCKET: &str = STARGZ_SOCKET;

    /// The CRI plugin's section in `doc`.
    fn cri_table(doc: &DocumentMut) -> Option<&Table> {
        get(doc, &["plugins", CRI])?.as_table()
    }

    /// A containerd config in a temporary directory, importing `conf.d/*.toml` when `imports`.
    fn setup(imports: bool) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let import = match imports {
            true => format!("imports = [\"{}/conf.d/*.toml\"]\n", dir.path().display()),
            false => String::new(),
        };
        std::fs::write(
            &config,
            format!(
                "version = 2\n{import}root = \"/var/lib/containerd\"\n\n[grpc]\n  address = \"/run/c.sock\"\n\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n  \
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"native\"\n  \
                 [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"/etc/containerd/certs.d\"\n"
            ),
        )
        .unwrap();
        (dir, config)
    }

    /// Writes what `change` says, as the caller would.
    fn write(change: &FileChange) {
        std::fs::create_dir_all(change.path.parent().unwrap()).unwrap();
        match &change.new {
            Some(text) => std::fs::write(&change.path, text).unwrap(),
            None => std::fs::remove_file(&change.path).unwrap(),
        }
    }

    #[test]
    fn on_repeats_the_cri_section_with_the_snapshotter_changed_and_off_removes_the_file() {
        let (dir, config) = setup(true);
        let files = ContainerdFiles::read(&config).unwrap();
        let ours = dir.path().join("conf.d/zz-pinboard-lazy-pulling.toml");
        assert_eq!(files.ours(), Some(ours.as_path()));
        assert_eq!(files.snapshotter(), ("native".into(), None));
        let on = files.change(true, Path::new(SOCKET)).unwrap();
        assert_eq!(on.path, ours);
        assert_eq!(on.old, None);
        let text = on.new.clone().unwrap();
        assert!(text.starts_with("# Written by pinboard"), "{text}");
        let doc: DocumentMut = text.parse().unwrap();
        assert_eq!(doc["version"].as_integer(), Some(2));
        assert_eq!(
            doc["proxy_plugins"]["stargz"]["type"].as_str(),
            Some("snapshot")
        );
        assert_eq!(
            doc["proxy_plugins"]["stargz"]["address"].as_str(),
            Some(SOCKET)
        );
        let cri = cri_table(&doc).unwrap();
        assert_eq!(cri["sandbox_image"].as_str(), Some("pause:3.9"));
        assert_eq!(
            cri["registry"]["config_path"].as_str(),
            Some("/etc/containerd/certs.d")
        );
        assert_eq!(cri["containerd"]["snapshotter"].as_str(), Some("stargz"));
        assert_eq!(
            cri["containerd"]["disable_snapshot_annotations"].as_bool(),
            Some(false)
        );
        write(&on);

        // Now in force by the files, and the same again is no change.
        let files = ContainerdFiles::read(&config).unwrap();
        assert_eq!(
            files.snapshotter(),
            ("stargz".into(), Some(PathBuf::from(SOCKET)))
        );
        let again = files.change(true, Path::new(SOCKET)).unwrap();
        assert_eq!(again.new, again.old, "{:?}", again.new);

        // Another file of the administrator's in the directory survives, and ours still loads last.
        std::fs::write(
            dir.path().join("conf.d/10-site.toml"),
            "version = 2\n[debug]\n  level = \"info\"\n",
        )
        .unwrap();
        let off = ContainerdFiles::read(&config)
            .unwrap()
            .change(false, Path::new(SOCKET))
            .unwrap();
        assert_eq!(
            off.new, None,
            "nothing of the administrator's was in pinboard's file"
        );
        write(&off);
        assert!(!ours.exists());
        assert_eq!(
            ContainerdFiles::read(&config).unwrap().snapshotter().0,
            "native"
        );
    }

    #[test]
    fn what_an_administrator_adds_to_pinboards_file_stays() {
        let (_dir, config) = setup(true);
        let on = ContainerdFiles::read(&config)
            .unwrap()
            .change(true, Path::new(SOCKET))
            .unwrap();
        let text = on.new.clone().unwrap() + "\n[metrics]\n  address = \"127.0.0.1:1338\"\n";
        std::fs::create_dir_all(on.path.parent().unwrap()).unwrap();
        std::fs::write(&on.path, &text).unwrap();
        let off = ContainerdFiles::read(&config)
            .unwrap()
            .change(false, Path::new(SOCKET))
            .unwrap();
        let left: DocumentMut = off.new.unwrap().parse().unwrap();
        assert_eq!(left["metrics"]["address"].as_str(), Some("127.0.0.1:1338"));
        assert!(left.get("proxy_plugins").is_none() && left.get("plugins").is_none());
    }

    #[test]
    fn a_config_without_imports_gets_the_line_to_add_and_nothing_written() {
        let (dir, config) = setup(false);
        let files = ContainerdFiles::read(&config).unwrap();
        assert_eq!(files.ours(), None);
        let err = files.change(true, Path::new(SOCKET)).unwrap_err();
        let LazyError::NoImport {
            add, place, then, ..
        } = &err
        else {
            panic!("{err}")
        };
        let pattern = dir.path().join("conf.d/*.toml");
        assert_eq!(add, &[format!("imports = [\"{}\"]", pattern.display())]);
        assert_eq!(
            place,
            &format!("before line 4 (`[grpc]`) of {}", config.display())
        );
        assert!(then.contains("zz-pinboard-lazy-pulling.toml"), "{then}");
        assert!(err.to_string().contains(&add[0]), "{err}");

        // An `imports` of plain files: the same list, with the directory added.
        std::fs::write(&config, "version = 2\nimports = [\"a.toml\"]\n").unwrap();
        let LazyError::NoImport { add, place, .. } = ContainerdFiles::read(&config)
            .unwrap()
            .change(true, Path::new(SOCKET))
            .unwrap_err()
        else {
            panic!()
        };
        assert_eq!(
            add,
            [format!("imports = [\"a.toml\", \"{}\"]", pattern.display())]
        );
        assert!(place.starts_with("in place of line 2 of"), "{place}");

        // No config at all.
        let missing = dir.path().join("none.toml");
        let LazyError::NoImport { add, .. } = ContainerdFiles::read(&missing)
            .unwrap()
            .change(true, Path::new(SOCKET))
            .unwrap_err()
        else {
            panic!()
        };
        assert_eq!(add[0], "version = 2");
    }

    #[test]
    fn a_file_loaded_after_pinboards_with_a_cri_section_is_refused() {
        let (dir, config) = setup(true);
        std::fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        std::fs::write(
            dir.path().join("conf.d/zzz-site.toml"),
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n",
        )
        .unwrap();
        let err = ContainerdFiles::read(&config)
            .unwrap()
            .change(true, Path::new(SOCKET))
            .unwrap_err();
        assert!(
            matches!(err, LazyError::Overridden { ref by, .. } if by.ends_with("zzz-site.toml")),
            "{err}"
        );
        // Turning off is always possible.
        assert!(
            ContainerdFiles::read(&config)
                .unwrap()
                .change(false, Path::new(SOCKET))
                .is_ok()
        );
    }

    #[test]
    fn version_3_gets_only_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "version = 3\nimports = [\"conf.d/*.toml\"]\n").unwrap();
        let files = ContainerdFiles::read(&config).unwrap();
        let on = files.change(true, Path::new(SOCKET)).unwrap();
        let doc: DocumentMut = on.new.clone().unwrap().parse().unwrap();
        assert_eq!(doc["version"].as_integer(), Some(3));
        assert_eq!(
            doc["plugins"][CRI_IMAGES]["snapshotter"].as_str(),
            Some("stargz")
        );
        assert!(doc["plugins"].get(CRI).is_none());
        write(&on);
        assert_eq!(
            ContainerdFiles::read(&config).unwrap().snapshotter().0,
            "stargz"
        );
        let off = ContainerdFiles::read(&config)
            .unwrap()
            .change(false, Path::new(SOCKET))
            .unwrap();
        assert_eq!(off.new, None);
    }

    #[test]
    fn the_registry_config_path_is_read_as_containerd_merges_its_files() {
        // Version 2: the last CRI section replaces the others whole.
        let (dir, config) = setup(true);
        let path = |config: &Path| {
            ContainerdFiles::read(config)
                .unwrap()
                .registry_config_path()
        };
        assert_eq!(
            path(&config),
            Some(PathBuf::from("/etc/containerd/certs.d"))
        );
        std::fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        let later = dir.path().join("conf.d/50-site.toml");
        std::fs::write(
            &later,
            "version = 2
[plugins.\"io.containerd.grpc.v1.cri\"]
  sandbox_image = \"p\"
",
        )
        .unwrap();
        assert_eq!(
            path(&config),
            None,
            "a later CRI section without it drops it"
        );
        // Version 3 (containerd 2): key by key, a later file without it keeps it.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 3\nimports = [\"{}/conf.d/*.toml\"]\n[plugins.\"{CRI_IMAGES}\".registry]\n  \
                 config_path = \"/etc/containerd/certs.d\"\n",
                dir.path().display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        std::fs::write(
            dir.path().join("conf.d/50-site.toml"),
            format!("version = 3\n[plugins.\"{CRI_IMAGES}\"]\n  snapshotter = \"native\"\n"),
        )
        .unwrap();
        assert_eq!(
            path(&config),
            Some(PathBuf::from("/etc/containerd/certs.d"))
        );
        assert_eq!(
            ContainerdFiles::read(&config).unwrap().snapshotter().0,
            "native"
        );
    }

    #[test]
    fn patterns_match_as_containerds_glob_does_for_a_star() {
        assert!(wildcard("*.toml", "a.toml"));
        assert!(wildcard("*.toml", "zz-pinboard-lazy-pulling.toml"));
        assert!(!wildcard("*.toml", "a.conf"));
        assert!(wildcard("containerd-*.conf", "containerd-x.conf"));
        assert!(wildcard("*", "anything"));
        let config = Path::new("/etc/containerd/config.toml");
        assert_eq!(
            our_file(config, "conf.d/*.toml"),
            Some(PathBuf::from(
                "/etc/containerd/conf.d/zz-pinboard-lazy-pulling.toml"
            ))
        );
        assert_eq!(our_file(config, "/etc/containerd/extra.toml"), None);
        assert_eq!(our_file(config, "/etc/*/x.toml"), None);
        assert_eq!(our_file(config, "/etc/containerd/?.toml"), None);
    }
}

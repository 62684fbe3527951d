//! What CRI-O enforces as pins, from its files and its version (docs/pins.md). Pure: the files' text
//! comes from [`crate::backend::pins`].
//!
//! - Its configuration: `crio.conf`, then every regular file under `crio.conf.d`, recursively, in lexical
//!   order ([`drop_in_order`]), whatever its extension. A later file that sets `crio.image.pinned_images`
//!   replaces the array: nothing is merged ([`CrioConfig::effective`]).
//! - Its patterns ([`Pattern`]), case-insensitive, matched against the names CRI-O stored for an image:
//!   those it was pulled by. CRI reports more: repo digests made of each stored repository and each digest
//!   of the image, so an image pulled by tag shows a repo digest no pattern can pin (CRI-O 1.33, tried).
//! - What a reload (SIGHUP, `systemctl reload crio`) does with changed pins, by version ([`ReloadPins`]).
//! - Why CRI-O does not pin what a file lists ([`explain_unpinned`]): the reason line `check` prints and
//!   the failure `apply` ends with.

use std::path::{Path, PathBuf};

use super::runtime::Version;

/// CRI-O's order of its drop-ins, given their paths relative to the drop-in directory: Go's
/// `filepath.Walk`, depth first, each directory's entries sorted by name byte-wise. That is `Path`'s own
/// component-wise order: `a/x` comes before `a-b/x` (a plain string sort would say the opposite), and
/// `10-x.conf` before `9-y.conf`.
pub fn drop_in_order(paths: &mut [PathBuf]) {
    paths.sort();
}

/// Why CRI-O refuses a file for its `pinned_images`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PinnedImagesError {
    #[error("not valid TOML: {message}")]
    NotToml { message: String },
    #[error("crio.image.pinned_images is not an array")]
    NotAnArray,
    #[error("pinned_images entry {entry} is not a string")]
    NotAString { entry: String },
}

impl PinnedImagesError {
    /// An entry of the array that is not a string, as written.
    pub fn not_a_string(value: &toml_edit::Value) -> PinnedImagesError {
        PinnedImagesError::NotAString {
            entry: value.to_string().trim().to_owned(),
        }
    }
}

/// The file of CRI-O's configuration it would refuse, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct CrioFileError {
    pub file: String,
    #[source]
    pub problem: PinnedImagesError,
}

/// The `crio.image.pinned_images` a file sets; None when it does not set it. Fails, as CRI-O refuses the
/// file, when the text is not TOML or the key is not an array of strings.
pub fn pinned_images_in(text: &str) -> Result<Option<Vec<String>>, PinnedImagesError> {
    let doc: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| PinnedImagesError::NotToml {
                message: e.message().to_owned(),
            })?;
    let Some(item) = doc
        .get("crio")
        .and_then(|c| c.get("image"))
        .and_then(|i| i.get("pinned_images"))
    else {
        return Ok(None);
    };
    let array = item.as_array().ok_or(PinnedImagesError::NotAnArray)?;
    array
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| PinnedImagesError::not_a_string(v))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// One `pinned_images` entry as CRI-O compiles it into a case-insensitive regular expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `name`: the whole name (`^name$`).
    Exact(String),
    /// `prefix*`: CRI-O's regex is `prefix.*` without an anchor, so the prefix may stand anywhere in the
    /// name. A lone `*` (which CRI-O's own code does not handle) counts as matching every name.
    Prefix(String),
    /// `*keyword*`: the keyword anywhere in the name.
    Contains(String),
}

impl Pattern {
    /// A leading `*` without a trailing one is a literal, part of an exact name.
    pub fn parse(text: &str) -> Pattern {
        let lower = text.to_lowercase();
        match lower.strip_suffix('*') {
            Some(rest) => match rest.strip_prefix('*') {
                Some(keyword) => Pattern::Contains(keyword.to_string()),
                None => Pattern::Prefix(rest.to_string()),
            },
            None => Pattern::Exact(lower),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        match self {
            Pattern::Exact(exact) => name == *exact,
            // Unanchored: a prefix matches wherever it occurs, exactly as a keyword does.
            Pattern::Prefix(part) | Pattern::Contains(part) => name.contains(part.as_str()),
        }
    }
}

/// Whether any of `patterns` matches any of an image's `names`.
pub fn pins<S: AsRef<str>>(patterns: &[String], names: &[S]) -> bool {
    patterns
        .iter()
        .map(|p| Pattern::parse(p))
        .any(|pattern| names.iter().any(|name| pattern.matches(name.as_ref())))
}

/// One file that sets `pinned_images`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedImagesSetting {
    /// As shown to people: `crio.conf`'s path, a drop-in's path relative to the drop-in directory.
    pub file: String,
    pub patterns: Vec<String>,
}

/// Every file that sets `pinned_images`, in the order CRI-O reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrioConfig {
    pub settings: Vec<PinnedImagesSetting>,
}

impl CrioConfig {
    /// From each file's name and text, in CRI-O's order (`crio.conf` first, then [`drop_in_order`]). Fails
    /// naming the first file CRI-O would refuse.
    pub fn read(
        files: impl IntoIterator<Item = (String, String)>,
    ) -> Result<CrioConfig, CrioFileError> {
        let mut settings = Vec::new();
        for (file, text) in files {
            match pinned_images_in(&text) {
                Ok(Some(patterns)) => settings.push(PinnedImagesSetting { file, patterns }),
                Ok(None) => {}
                Err(problem) => return Err(CrioFileError { file, problem }),
            }
        }
        Ok(CrioConfig { settings })
    }

    /// What CRI-O applies: the last file that sets `pinned_images`. None: no file does (CRI-O then pins
    /// only its pause image).
    pub fn effective(&self) -> Option<&PinnedImagesSetting> {
        self.settings.last()
    }

    /// Whether the effective list pins an image known by `names`.
    pub fn pins<S: AsRef<str>>(&self, names: &[S]) -> bool {
        self.effective().is_some_and(|s| pins(&s.patterns, names))
    }

    /// The configuration once the drop-in `file` (named relative to the drop-in directory) sets
    /// `patterns`: its setting replaced, or added where CRI-O's order puts it. `crio.conf`, named by its
    /// absolute path, always comes first.
    pub fn with_drop_in(&self, file: &str, patterns: Vec<String>) -> CrioConfig {
        let mut settings: Vec<PinnedImagesSetting> = self
            .settings
            .iter()
            .filter(|s| s.file != file)
            .cloned()
            .collect();
        let after = |s: &PinnedImagesSetting| {
            let path = Path::new(&s.file);
            path.is_relative() && path > Path::new(file)
        };
        let at = settings.iter().position(after).unwrap_or(settings.len());
        settings.insert(
            at,
            PinnedImagesSetting {
                file: file.to_string(),
                patterns,
            },
        );
        CrioConfig { settings }
    }

    /// What CRI-O has in force before the drop-in `file` (named relative to the drop-in directory): the
    /// last setting of a file it reads earlier, `crio.conf` included. The drop-in replaces it.
    pub fn before(&self, file: &str) -> Option<&PinnedImagesSetting> {
        self.settings.iter().rev().find(|s| {
            let path = Path::new(&s.file);
            path.is_absolute() || path < Path::new(file)
        })
    }

    /// The last file before the effective one whose list would pin an image known by `names`: a pin that
    /// a later file replaced.
    fn replaced_in<S: AsRef<str>>(&self, names: &[S]) -> Option<&PinnedImagesSetting> {
        let earlier = &self.settings[..self.settings.len().saturating_sub(1)];
        earlier.iter().rev().find(|s| pins(&s.patterns, names))
    }
}

/// What a CRI-O reload does with a changed `pinned_images`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadPins {
    /// Before 1.28.0: CRI-O has no `pinned_images`.
    Unsupported,
    /// 1.28.x: applied at start only, never on reload.
    AtStartOnly,
    /// 1.29.0–1.29.3: the reload keeps the patterns from start (cri-o #7954, fixed in 1.29.4 / 1.30.0).
    KeepsStartup,
    /// Up to 1.29.6 / 1.30.2: additions apply, removals and `[]` are ignored (cri-o #8202, fixed in 1.29.7 /
    /// 1.30.3 / 1.31.0).
    AddsOnly,
    Applies,
}

const RELOAD_KEEPS_STARTUP_FIXED: [Version; 2] = [Version::new(1, 29, 4), Version::new(1, 30, 0)];
const RELOAD_REMOVALS_FIXED: [Version; 3] = [
    Version::new(1, 29, 7),
    Version::new(1, 30, 3),
    Version::new(1, 31, 0),
];

/// Why CRI-O (`runtime`) applies no new pins while `error` (a file it cannot load, named) stands, with
/// the fix.
pub fn broken_config(runtime: &str, error: &str) -> String {
    format!(
        "{runtime} cannot load its configuration: {error}; its reload fails as a whole and keeps the pins \
         it had: fix or remove that file, then `pinboard apply` again"
    )
}

/// How `systemctl restart crio` is offered as the fix.
pub const RESTART_FIX: &str = "restart CRI-O (`systemctl restart crio` keeps running containers; \
                               `pinboard apply --crio-reload restart` does it)";

impl ReloadPins {
    pub fn of(version: Version) -> ReloadPins {
        if version < Version::new(1, 28, 0) {
            ReloadPins::Unsupported
        } else if (version.major, version.minor) == (1, 28) {
            ReloadPins::AtStartOnly
        } else if !version.has_fix(&RELOAD_KEEPS_STARTUP_FIXED) {
            ReloadPins::KeepsStartup
        } else if !version.has_fix(&RELOAD_REMOVALS_FIXED) {
            ReloadPins::AddsOnly
        } else {
            ReloadPins::Applies
        }
    }

    /// Whether a reload makes CRI-O pin what a file added.
    pub fn applies_additions(self) -> bool {
        matches!(self, ReloadPins::AddsOnly | ReloadPins::Applies)
    }

    /// Why pins a file lists are not in force on this version, with the fix; `file` names that file.
    fn why(self, file: &str) -> String {
        match self {
            ReloadPins::Unsupported => {
                "it has no pinned_images (added in CRI-O 1.28.0); upgrade CRI-O".into()
            }
            ReloadPins::AtStartOnly => {
                format!(
                    "CRI-O 1.28 applies pinned_images only at start, never on reload; {RESTART_FIX}"
                )
            }
            ReloadPins::KeepsStartup => format!(
                "its reload did not apply pinned_images (cri-o #7954, fixed in 1.29.4); {RESTART_FIX}"
            ),
            ReloadPins::AddsOnly | ReloadPins::Applies => format!(
                "it has not applied pinned_images since {file} changed; reload CRI-O \
                 (`systemctl reload crio`): a reload that fails keeps the old pins, and CRI-O's log \
                 (`journalctl -u crio`) names the file it could not decode"
            ),
        }
    }

    /// What unpinning leaves in force until CRI-O restarts, when its reload ignores removals.
    pub fn removal_note(self) -> Option<&'static str> {
        match self {
            ReloadPins::Unsupported | ReloadPins::Applies => None,
            ReloadPins::AtStartOnly => Some(
                "CRI-O 1.28 keeps the removed pins until it restarts (`systemctl restart crio`)",
            ),
            ReloadPins::KeepsStartup | ReloadPins::AddsOnly => Some(
                "this CRI-O ignores removed pins on reload (cri-o #8202, fixed in 1.29.7 / 1.30.3 / \
                 1.31.0): they stay until it restarts (`systemctl restart crio`)",
            ),
        }
    }
}

/// An image CRI-O reports not pinned: its reference, its repo tags, and every name CRI reports for it
/// (tags and repo digests).
pub struct NotPinned<'a> {
    pub reference: &'a str,
    pub tags: &'a [String],
    pub names: &'a [String],
}

impl NotPinned<'_> {
    /// The names CRI-O surely stored: its tags; an image without tags was pulled by digest, and its repo
    /// digests are then what it stored.
    fn stored(&self) -> &[String] {
        match self.tags.is_empty() {
            true => self.names,
            false => self.tags,
        }
    }
}

/// Why an image listed by digest, which CRI-O has only under its tags, is not pinned.
const STORED_UNDER_TAGS: &str = "CRI-O has them only under their tags, and matches pinned_images against \
                                 the names it stored, not repo digests; `pinboard apply` pulls each by \
                                 its digest to add that name (nothing is downloaded)";

/// Why CRI-O (`runtime`, e.g. `CRI-O 1.29.2`, at `version`) does not pin images its files list: one
/// sentence per file and cause, with the fix. The references no file lists are returned apart.
pub fn explain_unpinned<'a>(
    runtime: &str,
    version: Option<Version>,
    config: &CrioConfig,
    images: impl IntoIterator<Item = NotPinned<'a>>,
) -> (Vec<String>, Vec<&'a str>) {
    // (file that lists them, why) -> how many; in the order first met.
    let mut causes: Vec<(String, String, usize)> = Vec::new();
    let mut unlisted = Vec::new();
    for image in images {
        let names: Vec<&str> = std::iter::once(image.reference)
            .chain(image.names.iter().map(String::as_str))
            .collect();
        let cause = match (config.effective(), config.replaced_in(&names)) {
            (Some(effective), _) if config.pins(&names) && !config.pins(image.stored()) => {
                (effective.file.clone(), STORED_UNDER_TAGS.to_string())
            }
            (Some(effective), _) if config.pins(&names) => {
                let why = version.map_or(ReloadPins::Applies, ReloadPins::of);
                (effective.file.clone(), why.why(&effective.file))
            }
            (Some(effective), Some(earlier)) => (
                earlier.file.clone(),
                format!(
                    "{last} replaces pinned_images; add them to {last} or remove pinned_images from it",
                    last = effective.file
                ),
            ),
            _ => {
                unlisted.push(image.reference);
                continue;
            }
        };
        match causes
            .iter_mut()
            .find(|(file, why, _)| (file, why) == (&cause.0, &cause.1))
        {
            Some((_, _, count)) => *count += 1,
            None => causes.push((cause.0, cause.1, 1)),
        }
    }
    let reasons = causes
        .into_iter()
        .map(|(file, why, count)| {
            let (images, are) = if count == 1 {
                ("1 image".to_string(), "is")
            } else {
                (format!("{count} images"), "are")
            };
            format!("{images} listed in {file} {are} not pinned by {runtime}: {why}")
        })
        .collect();
    (reasons, unlisted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(file: &str, patterns: &[&str]) -> (String, String) {
        let list: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
        (
            file.to_string(),
            format!("[crio.image]\npinned_images = [{}]\n", list.join(", ")),
        )
    }

    #[test]
    fn drop_ins_are_read_depth_first_each_directory_by_name() {
        let mut paths: Vec<PathBuf> = ["b.conf", "a-b/c", "a/z", "9-y.conf", "10-x.conf", "a/0"]
            .iter()
            .map(PathBuf::from)
            .collect();
        drop_in_order(&mut paths);
        let order: Vec<&str> = paths.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            order,
            ["10-x.conf", "9-y.conf", "a/0", "a/z", "a-b/c", "b.conf"]
        );
    }

    #[test]
    fn the_last_file_that_sets_pinned_images_wins_and_others_are_skipped() {
        let config = CrioConfig::read([
            setting("/etc/crio/crio.conf", &["quay.io/base/*"]),
            (
                "05-log.conf".into(),
                "[crio]\nlog_level = \"debug\"\n".into(),
            ),
            setting("10-site.conf", &["registry.example.com/ns/*"]),
            setting("50-pinned-images", &["quay.io/a@sha256:1"]),
            (
                "60-other".into(),
                "[crio.image]\npause_image = \"p\"\n".into(),
            ),
        ])
        .unwrap();
        let files: Vec<&str> = config.settings.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(
            files,
            ["/etc/crio/crio.conf", "10-site.conf", "50-pinned-images"]
        );
        let effective = config.effective().unwrap();
        assert_eq!(effective.file, "50-pinned-images");
        assert_eq!(effective.patterns, ["quay.io/a@sha256:1"]);
        assert!(config.pins(&["quay.io/a@sha256:1"]));
        // Replaced, not merged: the site glob no longer pins.
        assert!(!config.pins(&["registry.example.com/ns/app@sha256:2"]));
        // An empty list is a setting too: it unpins everything.
        let emptied =
            CrioConfig::read([setting("10-site.conf", &["x"]), setting("99-none", &[])]).unwrap();
        assert_eq!(emptied.effective().unwrap().file, "99-none");
        assert!(!emptied.pins(&["x"]));
        assert_eq!(CrioConfig::default().effective(), None);
    }

    #[test]
    fn a_drop_in_written_takes_its_place_in_crio_order() {
        let config = CrioConfig::read([
            setting("/etc/crio/crio.conf", &["base"]),
            setting("10-site.conf", &["site"]),
            setting("99-override.conf", &["other"]),
        ])
        .unwrap();
        let written = config.with_drop_in("50-pinned-images", vec!["a".into()]);
        let files: Vec<&str> = written.settings.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(
            files,
            [
                "/etc/crio/crio.conf",
                "10-site.conf",
                "50-pinned-images",
                "99-override.conf"
            ]
        );
        assert!(!written.pins(&["a"]), "99-override.conf still wins");
        let replaced = written.with_drop_in("50-pinned-images", vec!["b".into()]);
        assert_eq!(replaced.settings.len(), 4);
        assert_eq!(replaced.settings[2].patterns, ["b"]);
        let alone = CrioConfig::default().with_drop_in("50-pinned-images", vec!["a".into()]);
        assert!(alone.pins(&["A"]));
        // What the drop-in replaces: the last file before it, crio.conf included.
        assert_eq!(
            config.before("50-pinned-images").unwrap().file,
            "10-site.conf"
        );
        assert_eq!(config.before("05-x").unwrap().file, "/etc/crio/crio.conf");
        assert_eq!(
            written.before("50-pinned-images").unwrap().file,
            "10-site.conf"
        );
        assert_eq!(CrioConfig::default().before("50-pinned-images"), None);
    }

    #[test]
    fn files_crio_would_refuse_are_named() {
        let err = CrioConfig::read([("20-bad.conf".into(), "[crio.image".into())])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("20-bad.conf: not valid TOML"), "{err}");
        let err = CrioConfig::read([(
            "20-bad.conf".into(),
            "[crio.image]\npinned_images = \"a\"\n".into(),
        )])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "20-bad.conf: crio.image.pinned_images is not an array"
        );
        let err = pinned_images_in("[crio.image]\npinned_images = [1]\n").unwrap_err();
        assert_eq!(err.to_string(), "pinned_images entry 1 is not a string");
    }

    #[test]
    fn patterns_follow_crio_exact_unanchored_prefix_and_keyword() {
        let d = "@sha256:0123";
        let m = |pattern: &str, name: &str| Pattern::parse(pattern).matches(name);
        // Exact, case-insensitive, anchored at both ends.
        assert!(m(
            "quay.io/ns/app@sha256:0123",
            &format!("Quay.IO/ns/app{d}")
        ));
        assert!(!m("quay.io/ns/app", &format!("quay.io/ns/app{d}")));
        // Trailing `*`: a prefix, but unanchored: it matches wherever it occurs.
        assert!(m(
            "registry.example.com/ns/*",
            &format!("registry.example.com/ns/app{d}")
        ));
        assert!(m(
            "Registry.Example.com/NS/*",
            &format!("registry.example.com/ns/app{d}")
        ));
        assert!(m(
            "example.com/ns/*",
            &format!("registry.example.com/ns/app{d}")
        ));
        assert!(!m(
            "registry.example.com/ns/*",
            &format!("registry.example.com/other/app{d}")
        ));
        // `*keyword*`: contains.
        assert!(m("*pause*", "registry.k8s.io/pause:3.9"));
        assert!(!m("*pause*", "registry.k8s.io/coredns:1.11"));
        // A leading `*` alone is a literal.
        assert!(!m("*/pause:3.9", "registry.k8s.io/pause:3.9"));
        assert!(m("*/pause:3.9", "*/PAUSE:3.9"));
        assert!(m("*", "anything"));
        // Every name of the image counts: a tag may match where the digest does not.
        let names = [
            format!("quay.io/ns/app{d}"),
            "quay.io/ns/app:v1".to_string(),
        ];
        assert!(pins(&["quay.io/ns/app:v1".to_string()], &names));
        assert!(!pins(&["quay.io/ns/app:v2".to_string()], &names));
    }

    #[test]
    fn what_a_reload_does_with_pins_by_version() {
        let of = |text: &str| ReloadPins::of(Version::parse(text).unwrap());
        assert_eq!(of("1.27.9"), ReloadPins::Unsupported);
        assert_eq!(of("1.28.0"), ReloadPins::AtStartOnly);
        assert_eq!(of("1.28.11"), ReloadPins::AtStartOnly);
        assert_eq!(of("1.29.0"), ReloadPins::KeepsStartup);
        assert_eq!(of("1.29.3"), ReloadPins::KeepsStartup);
        assert_eq!(of("1.29.4"), ReloadPins::AddsOnly);
        assert_eq!(of("1.29.6"), ReloadPins::AddsOnly);
        assert_eq!(of("1.29.7"), ReloadPins::Applies);
        assert_eq!(of("1.30.0"), ReloadPins::AddsOnly);
        assert_eq!(of("1.30.2"), ReloadPins::AddsOnly);
        assert_eq!(of("1.30.3"), ReloadPins::Applies);
        assert_eq!(of("1.31.0"), ReloadPins::Applies);
        assert!(!of("1.29.2").applies_additions() && of("1.29.4").applies_additions());
        assert!(of("1.30.2").removal_note().unwrap().contains("cri-o #8202"));
        assert_eq!(of("1.31.0").removal_note(), None);
    }

    #[test]
    fn unpinned_images_are_explained_by_file_cause_and_fix() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (a, b, c) = (
            names(&["registry.example.com/ns/a@sha256:1"]),
            names(&["registry.example.com/ns/b@sha256:2"]),
            names(&[]),
        );
        let images = || {
            [
                NotPinned {
                    reference: "registry.example.com/ns/a@sha256:1",
                    tags: &[],
                    names: &a,
                },
                NotPinned {
                    reference: "registry.example.com/ns/b@sha256:2",
                    tags: &[],
                    names: &b,
                },
                NotPinned {
                    reference: "quay.io/x/c@sha256:3",
                    tags: &[],
                    names: &c,
                },
            ]
        };
        let listed =
            CrioConfig::read([setting("50-pinned-images", &["registry.example.com/ns/*"])])
                .unwrap();
        let (reasons, rest) =
            explain_unpinned("CRI-O 1.29.2", Version::parse("1.29.2"), &listed, images());
        assert_eq!(
            reasons,
            [format!(
                "2 images listed in 50-pinned-images are not pinned by CRI-O 1.29.2: its reload did not \
                 apply pinned_images (cri-o #7954, fixed in 1.29.4); {RESTART_FIX}"
            )]
        );
        assert_eq!(rest, ["quay.io/x/c@sha256:3"]);

        let (reasons, _) =
            explain_unpinned("CRI-O 1.31.0", Version::parse("1.31.0"), &listed, images());
        assert!(
            reasons[0].contains(
                "it has not applied pinned_images since 50-pinned-images changed; reload CRI-O \
                 (`systemctl reload crio`): a reload that fails keeps the old pins"
            ),
            "{reasons:?}"
        );

        // Pulled by tag: CRI reports a repo digest CRI-O never stored, so the entry naming it cannot pin.
        let exact = CrioConfig::read([setting(
            "50-pinned-images",
            &["registry.example.com/ns/a@sha256:1"],
        )])
        .unwrap();
        let tags = names(&["registry.example.com/ns/a:1.0"]);
        let tagged = [tags.clone(), a.clone()].concat();
        let by_tag = NotPinned {
            reference: "registry.example.com/ns/a@sha256:1",
            tags: &tags,
            names: &tagged,
        };
        let (reasons, rest) =
            explain_unpinned("CRI-O 1.33.13", Version::parse("1.33.13"), &exact, [by_tag]);
        assert_eq!(
            reasons,
            [format!(
                "1 image listed in 50-pinned-images is not pinned by CRI-O 1.33.13: {STORED_UNDER_TAGS}"
            )]
        );
        assert!(rest.is_empty());
        // A glob that matches its tag would pin it: then the reload is what has not happened.
        let glob = CrioConfig::read([setting("50-pinned-images", &["registry.example.com/ns/*"])])
            .unwrap();
        let by_tag = NotPinned {
            reference: "registry.example.com/ns/a@sha256:1",
            tags: &tags,
            names: &tagged,
        };
        let (reasons, _) =
            explain_unpinned("CRI-O 1.33.13", Version::parse("1.33.13"), &glob, [by_tag]);
        assert!(
            reasons[0].contains("has not applied pinned_images"),
            "{reasons:?}"
        );

        let replaced = CrioConfig::read([
            setting("10-site.conf", &["registry.example.com/ns/*"]),
            setting("99-override.conf", &["quay.io/other/*"]),
        ])
        .unwrap();
        let (reasons, rest) = explain_unpinned(
            "CRI-O 1.31.0",
            Version::parse("1.31.0"),
            &replaced,
            images(),
        );
        assert_eq!(
            reasons,
            [
                "2 images listed in 10-site.conf are not pinned by CRI-O 1.31.0: 99-override.conf replaces \
              pinned_images; add them to 99-override.conf or remove pinned_images from it"
            ]
        );
        assert_eq!(rest, ["quay.io/x/c@sha256:3"]);
    }
}

//! What a container runtime's name and version (CRI `Version`) say about pins: which CRI calls carry its
//! word on them (`Image.pinned`). Facts from the runtimes' releases (docs/pins.md):
//!
//! - CRI-O reports `pinned` in ListImages since 1.28.0, in ImageStatus only since 1.29.7 / 1.30.6 / 1.31.0.
//!   Before 1.28 it has no `pinned_images` at all, so its `false` is the truth: it pins nothing.
//! - containerd reports it in both calls since 1.6.22 / 1.7.3 (Debian bookworm's 1.6.20 does not).
//!
//! Pure: no I/O.

use std::fmt;

/// `major.minor.patch` as a runtime reports it: `1.29.2`, `v1.7.3`, Debian's `1.6.20~ds1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// The leading `major.minor[.patch]` of `text` (an optional `v` first; anything after the numbers, such
    /// as `~ds1` or `-rc.1`, ignored). None when it does not start with `major.minor`.
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut numbers = text.splitn(3, '.').map(|part| {
            let digits = part.len() - part.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            part[..digits].parse::<u32>().ok()
        });
        let major = numbers.next()??;
        let minor = numbers.next()??;
        let patch = numbers.next().flatten().unwrap_or(0);
        Some(Version::new(major, minor, patch))
    }

    /// Whether this version has a fix released as `fixed_in`: one release per maintained line, oldest line
    /// first, the last being the first release of a newer line that always had it. 1.30.5 lacks a fix of
    /// `[1.29.7, 1.30.6, 1.31.0]`; 1.29.8 and 1.32.0 have it; 1.28.9 (no fixed release on its line) lacks it.
    pub fn has_fix(self, fixed_in: &[Version]) -> bool {
        let Some(last) = fixed_in.last() else {
            return false;
        };
        self >= *last
            || fixed_in
                .iter()
                .any(|fix| (fix.major, fix.minor) == (self.major, self.minor) && self >= *fix)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The runtimes pinboard pins on. As a command-line value: `containerd`, `cri-o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    Containerd,
    #[value(name = "cri-o")]
    Crio,
}

impl RuntimeKind {
    /// From CRI Version's `runtime_name`; None for a runtime pinboard does not pin on.
    pub fn of_cri_name(name: &str) -> Option<RuntimeKind> {
        match name {
            "cri-o" => Some(RuntimeKind::Crio),
            "containerd" => Some(RuntimeKind::Containerd),
            _ => None,
        }
    }
}

/// A runtime as its CRI `Version` answer names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    pub kind: RuntimeKind,
    /// None when the version text could not be read: then nothing is assumed about what it reports.
    pub version: Option<Version>,
    /// As reported.
    pub version_text: String,
}

/// Which CRI calls carry the runtime's word on pins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinReports {
    pub list_images: bool,
    pub image_status: bool,
}

impl PinReports {
    /// Whether the runtime's word on pins can be had at all.
    pub fn any(self) -> bool {
        self.list_images || self.image_status
    }
}

/// CRI-O's ImageStatus reports `pinned` from these releases on.
const CRIO_IMAGE_STATUS_PINNED: [Version; 3] = [
    Version::new(1, 29, 7),
    Version::new(1, 30, 6),
    Version::new(1, 31, 0),
];
/// containerd reports `pinned` (from its pin label) in ListImages and ImageStatus from these releases on.
const CONTAINERD_PINNED: [Version; 2] = [Version::new(1, 6, 22), Version::new(1, 7, 3)];

impl Runtime {
    /// From CRI Version's `runtime_name` and `runtime_version`; None for a runtime pinboard does not pin on.
    pub fn identify(name: &str, version: &str) -> Option<Runtime> {
        Some(Runtime {
            kind: RuntimeKind::of_cri_name(name)?,
            version: Version::parse(version),
            version_text: version.to_string(),
        })
    }

    /// The version, when this is CRI-O (whose version tables are in [`super::crio`]).
    pub fn crio_version(&self) -> Option<Version> {
        self.version.filter(|_| self.kind == RuntimeKind::Crio)
    }

    /// Which calls report pins. An unreadable version reports nothing: pinboard's record decides then.
    pub fn reports_pinned(&self) -> PinReports {
        let Some(version) = self.version else {
            return PinReports::default();
        };
        match self.kind {
            RuntimeKind::Crio => PinReports {
                list_images: true,
                image_status: version.has_fix(&CRIO_IMAGE_STATUS_PINNED),
            },
            RuntimeKind::Containerd => {
                let reports = version.has_fix(&CONTAINERD_PINNED);
                PinReports {
                    list_images: reports,
                    image_status: reports,
                }
            }
        }
    }
}

/// The versions pinboard knows, by runtime: the supported-versions table (docs/runtimes.md), oldest and
/// newest `major.minor`.
const KNOWN_CONTAINERD: (Version, Version) = (Version::new(1, 6, 0), Version::new(2, 1, u32::MAX));
const KNOWN_CRIO: (Version, Version) = (Version::new(1, 28, 0), Version::new(1, 33, u32::MAX));

impl Runtime {
    /// Why pinboard cannot vouch for this runtime, when its version is outside the supported-versions
    /// table (docs/runtimes.md): a warning, once per node. None for a version in the table.
    pub fn outside_known(&self) -> Option<String> {
        let (oldest, newest, range) = match self.kind {
            RuntimeKind::Containerd => (KNOWN_CONTAINERD.0, KNOWN_CONTAINERD.1, "1.6 to 2.1"),
            RuntimeKind::Crio => (KNOWN_CRIO.0, KNOWN_CRIO.1, "1.28 to 1.33"),
        };
        let name = self.name();
        let why = match self.version {
            None => "its version cannot be read".to_string(),
            Some(v) if v < oldest => {
                format!("it is older than {name} {range}, which pinboard knows")
            }
            Some(v) if v > newest => {
                format!("it is newer than {name} {range}, which pinboard knows")
            }
            Some(_) => return None,
        };
        Some(format!(
            "{self}: {why} (docs/runtimes.md): how it reports pins, reads lazy-pulling config and \
             signals lost images may differ from what pinboard expects"
        ))
    }

    /// Its name as people write it.
    fn name(&self) -> &'static str {
        match self.kind {
            RuntimeKind::Crio => "CRI-O",
            RuntimeKind::Containerd => "containerd",
        }
    }
}

impl fmt::Display for Runtime {
    /// `CRI-O 1.29.2`, `containerd 1.6.20~ds1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name(), self.version_text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_runtimes_write_them() {
        assert_eq!(Version::parse("1.29.2"), Some(Version::new(1, 29, 2)));
        assert_eq!(Version::parse("v1.7.3"), Some(Version::new(1, 7, 3)));
        assert_eq!(Version::parse("1.6.20~ds1"), Some(Version::new(1, 6, 20)));
        assert_eq!(Version::parse("1.31.0-rc.1"), Some(Version::new(1, 31, 0)));
        assert_eq!(Version::parse("2.0"), Some(Version::new(2, 0, 0)));
        for bad in ["", "v", "1", "one.two", "1.x"] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        assert_eq!(Version::new(1, 29, 2).to_string(), "1.29.2");
    }

    #[test]
    fn a_backported_fix_counts_on_its_line_and_every_later_line() {
        let fix = CRIO_IMAGE_STATUS_PINNED;
        let has = |text: &str| Version::parse(text).unwrap().has_fix(&fix);
        for yes in ["1.29.7", "1.29.10", "1.30.6", "1.31.0", "1.32.1", "2.0.0"] {
            assert!(has(yes), "{yes}");
        }
        for no in ["1.28.9", "1.29.6", "1.30.5", "1.30.0", "1.27.0"] {
            assert!(!has(no), "{no}");
        }
    }

    #[test]
    fn runtimes_outside_the_supported_versions_table_are_named() {
        let outside =
            |name: &str, version: &str| Runtime::identify(name, version).unwrap().outside_known();
        for known in [
            ("containerd", "1.6.20~ds1"),
            ("containerd", "v1.7.24"),
            ("containerd", "2.0.5"),
            ("containerd", "2.1.9+unknown"),
            ("cri-o", "1.28.0"),
            ("cri-o", "1.33.13"),
        ] {
            assert_eq!(outside(known.0, known.1), None, "{known:?}");
        }
        let newer = outside("containerd", "2.2.0").unwrap();
        assert!(
            newer.starts_with("containerd 2.2.0: it is newer than containerd 1.6 to 2.1"),
            "{newer}"
        );
        let older = outside("cri-o", "1.27.4").unwrap();
        assert!(
            older.starts_with("CRI-O 1.27.4: it is older than CRI-O 1.28 to 1.33"),
            "{older}"
        );
        assert!(outside("cri-o", "1.34.0").is_some());
        assert!(outside("containerd", "1.5.18").is_some());
        assert!(
            outside("containerd", "devel")
                .unwrap()
                .contains("cannot be read")
        );
    }

    #[test]
    fn which_calls_report_pins_by_runtime_and_version() {
        let reports = |name: &str, version: &str| {
            let r = Runtime::identify(name, version).unwrap().reports_pinned();
            (r.list_images, r.image_status)
        };
        // CRI-O: ListImages from 1.28 (before, it pins nothing), ImageStatus only from 1.29.7/1.30.6/1.31.
        assert_eq!(reports("cri-o", "1.27.4"), (true, false));
        assert_eq!(reports("cri-o", "1.28.0"), (true, false));
        assert_eq!(reports("cri-o", "1.29.2"), (true, false));
        assert_eq!(reports("cri-o", "1.29.7"), (true, true));
        assert_eq!(reports("cri-o", "1.30.5"), (true, false));
        assert_eq!(reports("cri-o", "1.30.6"), (true, true));
        assert_eq!(reports("cri-o", "1.31.0"), (true, true));
        // containerd: both calls from 1.6.22 / 1.7.3; Debian's 1.6.20 neither.
        assert_eq!(reports("containerd", "1.6.20~ds1"), (false, false));
        assert_eq!(reports("containerd", "1.6.22"), (true, true));
        assert_eq!(reports("containerd", "1.7.2"), (false, false));
        assert_eq!(reports("containerd", "v1.7.3"), (true, true));
        assert_eq!(reports("containerd", "2.0.0"), (true, true));
        // Unreadable version: nothing assumed.
        assert_eq!(reports("cri-o", "unknown"), (false, false));
        assert_eq!(Runtime::identify("docker", "24.0.0"), None);
        assert_eq!(
            Runtime::identify("cri-o", "1.29.2").unwrap().to_string(),
            "CRI-O 1.29.2"
        );
    }
}

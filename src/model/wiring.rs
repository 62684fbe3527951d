//! What fan-out writes on a node to point its runtime at pinboard's endpoint, and how pinboard knows its own
//! files again. Pure: the backend reads and writes the files ([`crate::backend::wiring`]).
//!
//! - containerd: `<config_path>/<registry host>/hosts.toml` with the endpoint as the first host, `pull`
//!   only (containerd asks a host for `resolve` only for tags, and sets are digest-only). An
//!   administrator's file is kept as it is, the endpoint's table placed before its hosts (its `server`, CA
//!   and other keys untouched); containerd tries hosts in order, `server` last, and goes on to the next
//!   when one fails, so a dead endpoint costs a refused connection, never a pull.
//! - CRI-O: one `registries.conf.d` drop-in with a `[[registry]]` per source registry (and per longer prefix
//!   an administrator configured for the sets' images), the endpoint as its first mirror with
//!   `pull-from-mirror = "digest-only"`. A later `[[registry]]` with the same prefix replaces an earlier
//!   one, so the administrator's table for that prefix is carried over whole (its `location`, `blocked`,
//!   `insecure` and mirrors, after the endpoint): nothing they configured stops applying.
//!
//! The in-cluster cache's token is never written here: a node reaches the cache through its agent's relay
//! ([`crate::backend::blobs::Relay`]), which sends it.
//!
//! Every file starts with a [`Marker`] line naming the pinboard process that wrote it, and a hosts.toml also
//! carries the administrator's original bytes (base64), so the file is put back byte for byte, by this
//! process at the end of the rollout or, if it was killed, by the next pinboard command that touches the
//! node once that process is gone.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, value};

use super::served::{Source, mirror_segment};

/// The marker's prefix: the first line of every file fan-out writes.
const MARKER: &str = "# pinboard-fan-out: ";
/// The second line of a hosts.toml: the administrator's original, or `none`.
const ORIGINAL: &str = "# pinboard-fan-out-original: ";
const NO_ORIGINAL: &str = "none";
const EXPLAIN: &str = "# written by `pinboard apply --fan-out` for the rollout; pinboard puts the original back when \
                       it ends, or the next pinboard command does if this process is gone";

/// Why fan-out's file cannot be made from the administrator's, or the administrator's read back from it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WiringFileError {
    #[error("not valid TOML: {message}")]
    NotToml { message: String },
    #[error("its `host` is not a table of [host.\"URL\"] tables")]
    HostNotATable,
    #[error("it already names {endpoint}")]
    AlreadyNamed { endpoint: String },
    #[error("its second line does not hold the original")]
    NoOriginal,
    #[error("its original is damaged: {0}")]
    OriginalNotBase64(base64::DecodeError),
    #[error("its original is damaged: {0}")]
    OriginalNotUtf8(std::string::FromUtf8Error),
    #[error("{file}: not valid TOML: {message}")]
    RegistriesNotToml { file: String, message: String },
    #[error("{file}: `registry` is not an array of [[registry]] tables")]
    RegistryNotAnArray { file: String },
    #[error("{file}: a [[registry]] has neither prefix nor location")]
    NoPrefix { file: String },
}

/// The pinboard process that wrote a file, and the endpoint the file points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub pid: u32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat`), so a reused pid is not
    /// mistaken for it.
    pub started: u64,
    /// `http://HOST:PORT`
    pub endpoint: String,
}

impl fmt::Display for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{MARKER}pid={} started={} endpoint={}",
            self.pid, self.started, self.endpoint
        )
    }
}

impl Marker {
    /// The marker of a file pinboard wrote (its first line), or None for any other file.
    pub fn of(text: &str) -> Option<Marker> {
        let rest = text.lines().next()?.strip_prefix(MARKER)?;
        let mut fields: BTreeMap<&str, &str> = rest
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .collect();
        Some(Marker {
            pid: fields.remove("pid")?.parse().ok()?,
            started: fields.remove("started")?.parse().ok()?,
            endpoint: fields.remove("endpoint")?.to_string(),
        })
    }

    /// `HOST:PORT`: the endpoint without its scheme, as a mirror location names it.
    pub fn endpoint_host(&self) -> &str {
        self.endpoint
            .split_once("://")
            .map_or(self.endpoint.as_str(), |(_, host)| host)
    }
}

/// The hosts.toml that points containerd at the endpoint first, given the administrator's file (None: there
/// was none). Fails, naming the cause, when the original is not a
/// hosts.toml containerd could read.
pub fn containerd_hosts(
    original: Option<&str>,
    marker: &Marker,
) -> Result<String, WiringFileError> {
    let mut doc: DocumentMut =
        original
            .unwrap_or("")
            .parse()
            .map_err(|e: toml_edit::TomlError| WiringFileError::NotToml {
                message: e.message().to_owned(),
            })?;
    let first = lowest_position(doc.as_table()).unwrap_or(0);
    let hosts = doc
        .entry("host")
        .or_insert_with(|| {
            let mut implicit = Table::new();
            implicit.set_implicit(true);
            Item::Table(implicit)
        })
        .as_table_mut()
        .ok_or(WiringFileError::HostNotATable)?;
    if hosts.contains_key(&marker.endpoint) {
        return Err(WiringFileError::AlreadyNamed {
            endpoint: marker.endpoint.clone(),
        });
    }
    let mut endpoint = Table::new();
    endpoint["capabilities"] = value(toml_edit::Array::from_iter(["pull"]));
    // Before every table of the file: containerd tries hosts in the order they are written.
    endpoint.set_position(Some(first - 2));
    hosts.insert(&marker.endpoint, Item::Table(endpoint));
    let original = match original {
        Some(text) => BASE64.encode(text),
        None => NO_ORIGINAL.to_string(),
    };
    let body = doc.to_string();
    let separator = if body.starts_with('\n') || body.is_empty() {
        ""
    } else {
        "\n"
    };
    Ok(format!(
        "{marker}\n{ORIGINAL}{original}\n{EXPLAIN}\n{separator}{body}"
    ))
}

/// What a hosts.toml pinboard wrote replaced: `Ok(Some(text))` the administrator's file, `Ok(None)` no file.
/// Err when the original line is missing or damaged.
pub fn containerd_original(wired: &str) -> Result<Option<String>, WiringFileError> {
    let line = wired
        .lines()
        .nth(1)
        .and_then(|l| l.strip_prefix(ORIGINAL))
        .ok_or(WiringFileError::NoOriginal)?;
    if line == NO_ORIGINAL {
        return Ok(None);
    }
    let bytes = BASE64
        .decode(line.trim())
        .map_err(WiringFileError::OriginalNotBase64)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(WiringFileError::OriginalNotUtf8)
}

/// The lowest position of any table in `table`, nested ones included.
fn lowest_position(table: &Table) -> Option<isize> {
    table
        .iter()
        .filter_map(|(_, item)| item.as_table())
        .flat_map(|t| [t.position(), lowest_position(t)])
        .flatten()
        .min()
}

/// One registries.conf file as containers-image reads it: its name (for messages) and text.
pub struct RegistriesFile<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

/// The CRI-O drop-in pointing every source of `references` at the endpoint, given the administrator's
/// registries.conf files in the order containers-image reads them (registries.conf, then the drop-ins by
/// name), pinboard's own left out. Fails naming a file that cannot be read, so that nothing an
/// administrator configured is dropped.
pub fn crio_registries<'s>(
    files: &[RegistriesFile<'_>],
    sources: impl IntoIterator<Item = &'s Source>,
    marker: &Marker,
) -> Result<String, WiringFileError> {
    let docs = files
        .iter()
        .map(|file| {
            let doc = file.text.parse::<DocumentMut>().map_err(|e| {
                WiringFileError::RegistriesNotToml {
                    file: file.name.to_owned(),
                    message: e.message().to_owned(),
                }
            })?;
            Ok((file.name, doc))
        })
        .collect::<Result<Vec<_>, WiringFileError>>()?;
    let tables = registry_tables(&docs)?;
    let mut prefixes: BTreeMap<String, Option<&Table>> = BTreeMap::new();
    for Source {
        registry,
        repository,
    } in sources
    {
        prefixes.insert(registry.clone(), tables.get(registry.as_str()).copied());
        // A longer prefix of the administrator's wins for these images: wire it too.
        let full = format!("{registry}/{repository}");
        for (prefix, table) in &tables {
            let longer = prefix.starts_with(&format!("{registry}/"));
            if longer && covers(prefix, &full) {
                prefixes.insert(prefix.to_string(), Some(*table));
            }
        }
    }
    let mut out = ArrayOfTables::new();
    for (prefix, admin) in prefixes {
        let mut table = admin.cloned().unwrap_or_default();
        table.decor_mut().clear();
        table["prefix"] = value(&prefix);
        let mut mirror = Table::new();
        let path = match prefix.split_once('/') {
            Some((registry, rest)) => format!("{}/{rest}", mirror_segment(registry)),
            None => mirror_segment(&prefix),
        };
        mirror["location"] = value(format!("{}/{path}", marker.endpoint_host()));
        mirror["insecure"] = value(marker.endpoint.starts_with("http://"));
        mirror["pull-from-mirror"] = value("digest-only");
        let mut mirrors = ArrayOfTables::new();
        mirrors.push(mirror);
        if let Some(theirs) = table.get("mirror").and_then(Item::as_array_of_tables) {
            for m in theirs.iter() {
                let mut m = m.clone();
                m.decor_mut().clear();
                mirrors.push(m);
            }
        }
        table.insert("mirror", Item::ArrayOfTables(mirrors));
        out.push(table);
    }
    let mut doc = DocumentMut::new();
    doc.insert("registry", Item::ArrayOfTables(out));
    Ok(format!("{marker}\n{EXPLAIN}\n\n{doc}"))
}

/// The last `[[registry]]` table per prefix (its `prefix`, else its `location`), as a later one replaces an
/// earlier one. Wildcard prefixes are left out: a host's own table ranks above them.
fn registry_tables<'d>(
    docs: &'d [(&str, DocumentMut)],
) -> Result<BTreeMap<String, &'d Table>, WiringFileError> {
    let mut tables = BTreeMap::new();
    for (name, doc) in docs {
        let Some(registries) = doc.get("registry") else {
            continue;
        };
        let registries =
            registries
                .as_array_of_tables()
                .ok_or_else(|| WiringFileError::RegistryNotAnArray {
                    file: name.to_string(),
                })?;
        for table in registries.iter() {
            let prefix = ["prefix", "location"]
                .iter()
                .find_map(|key| table.get(key).and_then(Item::as_str))
                .ok_or_else(|| WiringFileError::NoPrefix {
                    file: name.to_string(),
                })?;
            let prefix = prefix.trim_end_matches('/').to_string();
            if !prefix.starts_with("*.") {
                tables.insert(prefix, table);
            }
        }
    }
    Ok(tables)
}

/// Whether `prefix` covers the repository `full` (`host/path`), as containers-image matches prefixes: the
/// same, or followed by `/`.
fn covers(prefix: &str, full: &str) -> bool {
    full == prefix
        || full
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> Marker {
        Marker {
            pid: 4242,
            started: 99,
            endpoint: "http://127.0.0.1:40000".into(),
        }
    }

    /// The `[host."…"]` URLs of a hosts.toml in the order they are written, as containerd tries them.
    fn hosts_in_order(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("[host.\""))
            .map(|l| l.trim_end_matches("\"]").to_string())
            .collect()
    }

    #[test]
    fn an_administrators_hosts_toml_keeps_everything_with_the_endpoint_first_and_comes_back_byte_for_byte()
     {
        let admin = "# our registry\nserver = \"https://registry.example.com\"\nca = \"/etc/ca.pem\"\n\n\
                     [host.\"https://mirror.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n\
                     [host.\"https://registry.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n";
        let wired = containerd_hosts(Some(admin), &marker()).unwrap();
        assert_eq!(Marker::of(&wired), Some(marker()));
        assert_eq!(
            hosts_in_order(&wired),
            [
                "http://127.0.0.1:40000",
                "https://mirror.example.com",
                "https://registry.example.com"
            ]
        );
        let parsed: toml_edit::DocumentMut = wired.parse().unwrap();
        assert_eq!(
            parsed["server"].as_str(),
            Some("https://registry.example.com")
        );
        assert_eq!(parsed["ca"].as_str(), Some("/etc/ca.pem"));
        let capabilities = parsed["host"]["http://127.0.0.1:40000"]["capabilities"].to_string();
        assert_eq!(capabilities.trim(), "[\"pull\"]", "digests need only pull");
        assert!(wired.contains("# our registry"), "{wired}");
        assert_eq!(containerd_original(&wired).unwrap().as_deref(), Some(admin));
    }

    #[test]
    fn without_a_hosts_toml_only_the_endpoint_is_added_and_nothing_comes_back() {
        let wired = containerd_hosts(None, &marker()).unwrap();
        assert_eq!(hosts_in_order(&wired), ["http://127.0.0.1:40000"]);
        let parsed: toml_edit::DocumentMut = wired.parse().unwrap();
        assert!(
            parsed.get("server").is_none(),
            "containerd's default server stays the last host"
        );
        assert_eq!(containerd_original(&wired).unwrap(), None);
    }

    #[test]
    fn files_that_are_not_pinboards_or_cannot_be_read_are_told_apart() {
        assert_eq!(Marker::of("server = \"https://x\"\n"), None);
        assert_eq!(Marker::of("# pinboard-fan-out: pid=x\n"), None);
        let bad = containerd_hosts(Some("server = \n"), &marker())
            .unwrap_err()
            .to_string();
        assert!(bad.starts_with("not valid TOML"), "{bad}");
        let inline = containerd_hosts(Some("host = 3\n"), &marker())
            .unwrap_err()
            .to_string();
        assert!(inline.contains("`host` is not a table"), "{inline}");
        assert!(containerd_original("# pinboard-fan-out: pid=1 started=2 endpoint=e\n").is_err());
    }

    fn source(registry: &str, repository: &str) -> Source {
        Source {
            registry: registry.into(),
            repository: repository.into(),
        }
    }

    #[test]
    fn the_crio_drop_in_carries_over_the_administrators_tables_behind_the_endpoint() {
        let main = "unqualified-search-registries = [\"quay.io\"]\n\n\
                    [[registry]]\nprefix = \"quay.io\"\nlocation = \"quay.io\"\n\n\
                    [[registry.mirror]]\nlocation = \"old.example.com/quay\"\n";
        // A later drop-in replaces registries.conf's table for quay.io, and adds a longer prefix.
        let drop_in = "[[registry]]\nprefix = \"quay.io\"\ninsecure = false\n\n\
                       [[registry.mirror]]\nlocation = \"mirror.example.com/quay\"\ninsecure = true\n\
                       pull-from-mirror = \"digest-only\"\n\n\
                       [[registry]]\nprefix = \"quay.io/openshift-release-dev/ocp-release\"\nblocked = true\n\n\
                       [[registry]]\nlocation = \"*.example.org\"\n\n\
                       [[registry]]\nprefix = \"docker.io\"\n";
        let files = [
            RegistriesFile {
                name: "registries.conf",
                text: main,
            },
            RegistriesFile {
                name: "10-site.conf",
                text: drop_in,
            },
        ];
        let sources = [
            source("quay.io", "openshift-release-dev/ocp-release"),
            source("quay.io", "openshift-release-dev/ocp-v4.0-art-dev"),
            source("127.0.0.1:5000", "app"),
        ];
        let text = crio_registries(&files, &sources, &marker()).unwrap();
        assert_eq!(Marker::of(&text), Some(marker()));
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        let tables: Vec<&Table> = doc["registry"]
            .as_array_of_tables()
            .unwrap()
            .iter()
            .collect();
        let prefixes: Vec<&str> = tables
            .iter()
            .map(|t| t["prefix"].as_str().unwrap())
            .collect();
        assert_eq!(
            prefixes,
            [
                "127.0.0.1:5000",
                "quay.io",
                "quay.io/openshift-release-dev/ocp-release"
            ],
            "docker.io is not the sets' and stays as it is; the wildcard is not touched"
        );
        let mirrors = |t: &Table| -> Vec<(String, Option<String>)> {
            t["mirror"]
                .as_array_of_tables()
                .unwrap()
                .iter()
                .map(|m| {
                    let from = m.get("pull-from-mirror").and_then(Item::as_str);
                    (
                        m["location"].as_str().unwrap().to_string(),
                        from.map(String::from),
                    )
                })
                .collect()
        };
        let ours = |prefix: &str| {
            (
                format!("127.0.0.1:40000/{prefix}"),
                Some("digest-only".to_string()),
            )
        };
        // A port is `_` in the mirror's path: containers-image refuses `:` there.
        assert_eq!(mirrors(tables[0]), [ours("127.0.0.1_5000")]);
        assert_eq!(
            mirrors(tables[1]),
            [
                ours("quay.io"),
                ("mirror.example.com/quay".into(), Some("digest-only".into()))
            ],
            "the drop-in's table, which replaced registries.conf's"
        );
        assert_eq!(tables[1]["insecure"].as_bool(), Some(false));
        assert_eq!(
            tables[1]["mirror"]
                .as_array_of_tables()
                .unwrap()
                .get(0)
                .unwrap()["insecure"]
                .as_bool(),
            Some(true)
        );
        assert_eq!(
            mirrors(tables[2]),
            [ours("quay.io/openshift-release-dev/ocp-release")]
        );
        assert_eq!(
            tables[2]["blocked"].as_bool(),
            Some(true),
            "kept: the source stays blocked"
        );
    }

    #[test]
    fn a_registries_file_that_cannot_be_read_stops_the_wiring_naming_it() {
        let files = [RegistriesFile {
            name: "20-broken.conf",
            text: "[[registry]]\nblocked = true\n",
        }];
        let err = crio_registries(&files, &[source("quay.io", "a")], &marker()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "20-broken.conf: a [[registry]] has neither prefix nor location"
        );
    }
}

//! Mirror rules as the containers tools and OpenShift define them, for pinboard's own registry reads:
//! `registries.conf` and `registries.conf.d/*.conf` (containers-registries.conf(5): `[[registry]]` with
//! `prefix`/`location`, `blocked`, ordered `[[registry.mirror]]` with `location` and `pull-from-mirror`), and
//! ImageDigestMirrorSet / ImageContentSourcePolicy documents (digest-only mirrors; `NeverContactSource`
//! blocks the source). Pure: callers read the files.
//!
//! For a reference by digest, [`MirrorRules::candidates`] gives where to fetch it, in order: the mirrors of the
//! longest matching prefix that serve digests, then the source (its `location`, if rewritten) unless it is
//! blocked.

use std::fmt;

use serde::Deserialize;

use crate::error::Failure;

/// A file of mirror rules that cannot be read, named by its path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MirrorRulesError {
    #[error("{path}: not a registries.conf this tool reads: {message}")]
    NotRegistriesConf { path: String, message: String },
    #[error("{path}: a [[registry]] has neither prefix nor location")]
    NoPrefix { path: String },
    #[error("{path}: not YAML: {message}")]
    NotYaml { path: String, message: String },
    #[error("{path}: holds no ImageDigestMirrorSet or ImageContentSourcePolicy")]
    NoMirrorSets { path: String },
    #[error(
        "{path}: a {kind:?} document; only ImageDigestMirrorSet and ImageContentSourcePolicy name digest \
         mirrors"
    )]
    OtherKind { path: String, kind: String },
}

impl From<MirrorRulesError> for Failure {
    fn from(error: MirrorRulesError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// When a mirror is used (`pull-from-mirror`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum PullFrom {
    #[default]
    #[serde(rename = "all")]
    All,
    #[serde(rename = "digest-only")]
    DigestOnly,
    #[serde(rename = "tag-only")]
    TagOnly,
}

/// One mirror of a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// `host[:port][/path]` replacing the prefix.
    pub location: String,
    pub pull_from: PullFrom,
}

/// One `[[registry]]` (or IDMS/ICSP source): the references it covers and where they come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `host[:port][/path]`, or `*.domain` for every host under it.
    pub prefix: String,
    /// Where the source is really fetched from; None: the prefix itself.
    pub location: Option<String>,
    pub blocked: bool,
    pub mirrors: Vec<Mirror>,
    /// The file it comes from, for messages.
    pub from: String,
}

/// Where one fetch may go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The reference rewritten for that place: `mirror.example.com/ocp/release@sha256:…`.
    pub reference: String,
    /// None: the source; else the mirror's location.
    pub mirror: Option<String>,
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mirror {
            Some(location) => write!(f, "mirror {location}"),
            None => f.write_str("the source"),
        }
    }
}

/// Every rule in force, later files replacing earlier rules of the same prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorRules {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
struct RegistriesConf {
    #[serde(default)]
    registry: Vec<RegistryTable>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RegistryTable {
    prefix: Option<String>,
    location: Option<String>,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror: Vec<MirrorTable>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorTable {
    location: String,
    #[serde(default)]
    pull_from_mirror: PullFrom,
}

/// An ImageDigestMirrorSet or ImageContentSourcePolicy document.
#[derive(Deserialize)]
struct MirrorSetDocument {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    spec: MirrorSetSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MirrorSetSpec {
    #[serde(default)]
    image_digest_mirrors: Vec<DigestMirrors>,
    #[serde(default)]
    repository_digest_mirrors: Vec<DigestMirrors>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DigestMirrors {
    source: String,
    #[serde(default)]
    mirrors: Vec<String>,
    mirror_source_policy: Option<String>,
}

impl MirrorRules {
    /// Adds the `[[registry]]` tables of a registries.conf file (`path` for messages); a table with the
    /// prefix of an earlier one replaces it, as in a later drop-in.
    pub fn add_registries_conf(&mut self, text: &str, path: &str) -> Result<(), MirrorRulesError> {
        let conf: RegistriesConf =
            toml_edit::de::from_str(text).map_err(|e| MirrorRulesError::NotRegistriesConf {
                path: path.to_owned(),
                message: e.message().to_owned(),
            })?;
        for table in conf.registry {
            let prefix = table
                .prefix
                .or_else(|| table.location.clone())
                .ok_or_else(|| MirrorRulesError::NoPrefix {
                    path: path.to_owned(),
                })?;
            self.replace(Rule {
                prefix: trimmed(&prefix),
                location: table.location.map(|l| trimmed(&l)),
                blocked: table.blocked,
                mirrors: table
                    .mirror
                    .into_iter()
                    .map(|m| Mirror {
                        location: trimmed(&m.location),
                        pull_from: m.pull_from_mirror,
                    })
                    .collect(),
                from: path.to_owned(),
            });
        }
        Ok(())
    }

    /// Adds the ImageDigestMirrorSet and ImageContentSourcePolicy documents of a YAML file, as the
    /// machine-config operator renders them: digest-only mirrors, the source blocked by
    /// `NeverContactSource`; several entries for one source add their mirrors in order.
    pub fn add_mirror_sets(&mut self, text: &str, path: &str) -> Result<(), MirrorRulesError> {
        let documents: Vec<MirrorSetDocument> = serde_saphyr::from_multiple::<Option<_>>(text)
            .map_err(|e| MirrorRulesError::NotYaml {
                path: path.to_owned(),
                message: e.without_snippet().to_string(),
            })?
            .into_iter()
            .flatten()
            .collect();
        if documents.is_empty() {
            return Err(MirrorRulesError::NoMirrorSets {
                path: path.to_owned(),
            });
        }
        for document in documents {
            let entries = match document.kind.as_str() {
                "ImageDigestMirrorSet" => document.spec.image_digest_mirrors,
                "ImageContentSourcePolicy" => document.spec.repository_digest_mirrors,
                other => {
                    return Err(MirrorRulesError::OtherKind {
                        path: path.to_owned(),
                        kind: other.to_owned(),
                    });
                }
            };
            for entry in entries {
                let prefix = trimmed(&entry.source);
                let blocked = entry.mirror_source_policy.as_deref() == Some("NeverContactSource");
                let mirrors = entry.mirrors.iter().map(|location| Mirror {
                    location: trimmed(location),
                    pull_from: PullFrom::DigestOnly,
                });
                match self.rules.iter_mut().find(|r| r.prefix == prefix) {
                    Some(rule) => {
                        rule.blocked |= blocked;
                        rule.mirrors.extend(mirrors);
                    }
                    None => self.rules.push(Rule {
                        prefix,
                        location: None,
                        blocked,
                        mirrors: mirrors.collect(),
                        from: path.to_owned(),
                    }),
                }
            }
        }
        Ok(())
    }

    fn replace(&mut self, rule: Rule) {
        match self.rules.iter_mut().find(|r| r.prefix == rule.prefix) {
            Some(old) => *old = rule,
            None => self.rules.push(rule),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Where to fetch `reference` (`host[:port]/repository@sha256:…`), in order. A tag reference uses only
    /// mirrors that serve tags. Without a matching rule: the reference itself.
    pub fn candidates(&self, reference: &str) -> Vec<Candidate> {
        let by_digest = reference.contains('@');
        let (name, pin) = split_pin(reference);
        let Some((rule, rest)) = self.rule_for(name) else {
            return vec![Candidate {
                reference: reference.to_owned(),
                mirror: None,
            }];
        };
        let serves = |m: &&Mirror| match m.pull_from {
            PullFrom::All => true,
            PullFrom::DigestOnly => by_digest,
            PullFrom::TagOnly => !by_digest,
        };
        let mut candidates: Vec<Candidate> = rule
            .mirrors
            .iter()
            .filter(serves)
            .map(|m| Candidate {
                reference: format!("{}{rest}{pin}", m.location),
                mirror: Some(m.location.clone()),
            })
            .collect();
        if !rule.blocked {
            let reference = match (&rule.location, rule.prefix.starts_with("*.")) {
                (Some(location), _) => format!("{location}{rest}{pin}"),
                // A wildcard covers many hosts: the source is the reference's own.
                (None, true) => reference.to_owned(),
                (None, false) => format!("{}{rest}{pin}", rule.prefix),
            };
            candidates.push(Candidate {
                reference,
                mirror: None,
            });
        }
        candidates
    }

    /// Why `reference` cannot be fetched at all, when its source is blocked and no mirror serves it.
    pub fn blocked(&self, reference: &str) -> Option<String> {
        let (rule, _) = self.rule_for(split_pin(reference).0)?;
        self.candidates(reference).is_empty().then(|| {
            format!(
                "{reference}: its registry {} is blocked by {} and no mirror there serves it",
                rule.prefix, rule.from
            )
        })
    }

    /// The rule with the longest prefix matching `name` (`host/repo`, no tag or digest) on a path
    /// boundary, and what follows the prefix. A `*.domain` prefix matches hosts under the domain.
    fn rule_for<'a>(&self, name: &'a str) -> Option<(&Rule, &'a str)> {
        self.rules
            .iter()
            .filter_map(|rule| {
                let rest = match rule.prefix.strip_prefix("*.") {
                    Some(domain) => {
                        let (host, rest) = name.split_at(name.find('/').unwrap_or(name.len()));
                        let bare = host.split(':').next().unwrap_or(host);
                        bare.strip_suffix(domain)?.ends_with('.').then_some(rest)?
                    }
                    None => name.strip_prefix(rule.prefix.as_str())?,
                };
                (rest.is_empty() || rest.starts_with('/')).then_some((rule, rest))
            })
            .max_by_key(|(rule, _)| rule.prefix.len())
    }
}

/// `host/repo` and the `@digest` or `:tag` that follows it.
fn split_pin(reference: &str) -> (&str, &str) {
    if let Some(at) = reference.find('@') {
        return reference.split_at(at);
    }
    let slash = reference.rfind('/').unwrap_or(0);
    match reference[slash..].rfind(':') {
        Some(colon) => reference.split_at(slash + colon),
        None => (reference, ""),
    }
}

/// Locations and prefixes are written with or without a scheme or a trailing slash.
fn trimmed(text: &str) -> String {
    let text = text.trim();
    let text = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .unwrap_or(text);
    text.trim_end_matches('/').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn places(mirrors: &MirrorRules, reference: &str) -> Vec<String> {
        mirrors
            .candidates(reference)
            .into_iter()
            .map(|c| c.reference)
            .collect()
    }

    #[test]
    fn registries_conf_mirrors_come_first_then_the_source_and_pull_from_mirror_is_honoured() {
        let mut mirrors = MirrorRules::default();
        mirrors
            .add_registries_conf(
                r#"
unqualified-search-registries = ["registry.access.redhat.com"]

[[registry]]
prefix = "quay.io/openshift-release-dev"
location = "quay.io/openshift-release-dev"

[[registry.mirror]]
location = "mirror.example.com:5000/ocp"
pull-from-mirror = "digest-only"

[[registry.mirror]]
location = "backup.example.com/ocp"

[[registry.mirror]]
location = "tags.example.com/ocp"
pull-from-mirror = "tag-only"
"#,
                "/etc/containers/registries.conf",
            )
            .unwrap();
        let by_digest = format!("quay.io/openshift-release-dev/ocp-release{D}");
        assert_eq!(
            places(&mirrors, &by_digest),
            [
                format!("mirror.example.com:5000/ocp/ocp-release{D}"),
                format!("backup.example.com/ocp/ocp-release{D}"),
                by_digest.clone(),
            ]
        );
        assert_eq!(
            places(
                &mirrors,
                "quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64"
            ),
            [
                "backup.example.com/ocp/ocp-release:4.19.3-x86_64",
                "tags.example.com/ocp/ocp-release:4.19.3-x86_64",
                "quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64",
            ]
        );
        // A prefix matches on a path boundary only; other registries are fetched as they are.
        let other = format!("quay.io/openshift-release-devel/x{D}");
        assert_eq!(places(&mirrors, &other), std::slice::from_ref(&other));
        assert_eq!(
            mirrors.candidates(&by_digest)[0].to_string(),
            "mirror mirror.example.com:5000/ocp"
        );
        assert_eq!(mirrors.candidates(&by_digest)[2].to_string(), "the source");
    }

    #[test]
    fn a_later_drop_in_replaces_a_prefix_and_the_longest_prefix_wins() {
        let mut mirrors = MirrorRules::default();
        let first = "[[registry]]\nprefix = \"registry.example.com\"\n[[registry.mirror]]\nlocation = \"a.example.com\"\n";
        let later = "[[registry]]\nprefix = \"registry.example.com\"\nblocked = true\n[[registry.mirror]]\nlocation = \"b.example.com\"\n\n[[registry]]\nprefix = \"registry.example.com/team\"\nlocation = \"team.example.com/mirror\"\n";
        mirrors.add_registries_conf(first, "01-a.conf").unwrap();
        mirrors.add_registries_conf(later, "99-b.conf").unwrap();
        assert_eq!(
            places(&mirrors, &format!("registry.example.com/app/x{D}")),
            [format!("b.example.com/app/x{D}")],
            "the later file's mirror, and the source is blocked"
        );
        assert_eq!(
            places(&mirrors, &format!("registry.example.com/team/x{D}")),
            [format!("team.example.com/mirror/x{D}")],
            "the longer prefix, fetched from its location"
        );
        assert_eq!(
            mirrors.blocked(&format!("registry.example.com/app/x{D}")),
            None
        );
    }

    #[test]
    fn wildcard_prefixes_match_subdomains_and_keep_the_source() {
        let mut mirrors = MirrorRules::default();
        mirrors
            .add_registries_conf(
                "[[registry]]\nprefix = \"*.example.com\"\n[[registry.mirror]]\nlocation = \"m.local/cache\"\n",
                "r.conf",
            )
            .unwrap();
        let under = format!("reg.example.com:5000/a/b{D}");
        assert_eq!(
            places(&mirrors, &under),
            [format!("m.local/cache/a/b{D}"), under.clone()]
        );
        let apex = format!("example.com/a{D}");
        assert_eq!(places(&mirrors, &apex), std::slice::from_ref(&apex));
    }

    #[test]
    fn digest_mirror_sets_are_digest_only_and_never_contact_source_blocks() {
        let mut mirrors = MirrorRules::default();
        mirrors
            .add_mirror_sets(
                r#"
apiVersion: config.openshift.io/v1
kind: ImageDigestMirrorSet
metadata: {name: release}
spec:
  imageDigestMirrors:
  - source: quay.io/openshift-release-dev/ocp-release
    mirrors: [mirror.example.com/ocp/release]
    mirrorSourcePolicy: NeverContactSource
---
apiVersion: operator.openshift.io/v1alpha1
kind: ImageContentSourcePolicy
metadata: {name: old}
spec:
  repositoryDigestMirrors:
  - source: quay.io/openshift-release-dev/ocp-v4.0-art-dev
    mirrors: [mirror.example.com/ocp/art]
"#,
                "idms.yaml",
            )
            .unwrap();
        let release = format!("quay.io/openshift-release-dev/ocp-release{D}");
        assert_eq!(
            places(&mirrors, &release),
            [format!("mirror.example.com/ocp/release{D}")]
        );
        let art = format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev{D}");
        assert_eq!(
            places(&mirrors, &art),
            [format!("mirror.example.com/ocp/art{D}"), art.clone()]
        );
        // Digest-only: a tag goes to the source, and a blocked source with no tag mirror cannot be reached.
        let tagged = "quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64";
        assert!(places(&mirrors, tagged).is_empty());
        assert_eq!(
            mirrors.blocked(tagged).unwrap(),
            "quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64: its registry \
             quay.io/openshift-release-dev/ocp-release is blocked by idms.yaml and no mirror there serves it"
        );
        let wrong = mirrors
            .add_mirror_sets("kind: Deployment\n", "d.yaml")
            .unwrap_err()
            .to_string();
        assert!(wrong.contains("a \"Deployment\" document"), "{wrong}");
    }
}

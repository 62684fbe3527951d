//! Image sets: read from PinnedImageSet YAML, plain list files and `--image` flags, and checked against the
//! rules OpenShift's CRD enforces (1..=500 unique digest references, each as in [`check_pinned`]).
//!
//! Parsing takes text, not paths: reading files is the caller's job, so this stays free of I/O. Every
//! problem names where it is (file and line where there is one), the entry, the rule and the fix.
//!
//! A set's name is what holds its pins on the nodes ([`super::holders`]), so sets without one (a list
//! file, `--image` flags) are named after their content ([`content_name`]): the same images give the same
//! name, whichever file or flags they come from.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_saphyr::Spanned;
use sha2::{Digest as _, Sha256};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::labels::{Selector, SelectorError, valid_key, valid_value};
use super::pinboard_kinds;
use super::reference::check_pinned;

pub const MAX_ENTRIES: usize = 500;
/// The longest object name the API server takes (a DNS subdomain).
pub const MAX_NAME: usize = 253;
pub const API_GROUP: &str = "machineconfiguration.openshift.io";
pub const KIND: &str = "PinnedImageSet";

/// Where something was written, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    File {
        path: String,
        line: Option<usize>,
    },
    /// The n-th `--image` flag, counting from 1.
    Flag {
        index: usize,
    },
    /// A release payload (by digest) of `version`, and the component of its `image-references`, if any.
    Release {
        image: String,
        version: String,
        component: Option<String>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File {
                path,
                line: Some(line),
            } => write!(f, "{path}:{line}"),
            Origin::File { path, line: None } => write!(f, "{path}"),
            Origin::Flag { index } => write!(f, "--image #{index}"),
            Origin::Release {
                image,
                version,
                component: Some(component),
            } => write!(f, "release {version} ({image}), component {component}"),
            Origin::Release {
                image,
                version,
                component: None,
            } => write!(f, "release {version} ({image})"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub reference: String,
    pub origin: Origin,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSet {
    pub name: String,
    /// Its labels: on OpenShift, the pool role label decides where it lands.
    pub labels: BTreeMap<String, String>,
    pub entries: Vec<Entry>,
    pub origin: Origin,
    /// pinboard's agents: the nodes it lands on (none: every node with an agent).
    pub node_selector: Option<Selector>,
    /// pinboard's agents: Secrets in the agents' namespace whose credentials pull its images.
    pub pull_secrets: Vec<String>,
    /// pinboard's agents: pulled through the in-cluster cache (`spec.fanOut`).
    pub fan_out: bool,
}

/// One thing wrong with the input: where, what, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub origin: Origin,
    pub entry: Option<String>,
    pub message: String,
    pub fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.origin)?;
        if let Some(entry) = &self.entry {
            write!(f, "{entry}: ")?;
        }
        write!(f, "{}", self.message)?;
        if !self.fix.is_empty() {
            write!(f, "; {}", self.fix)?;
        }
        Ok(())
    }
}

impl ImageSet {
    pub fn references(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.reference.as_str())
    }

    /// Every rule the set breaks, in entry order. Empty means the API server would accept it.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(why) = name_problem(&self.name) {
            problems.push(Problem {
                origin: self.origin.clone(),
                entry: None,
                message: format!("set name {:?} {why}", self.name),
                fix: "name it with lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (a DNS subdomain, as the API server requires)".into(),
            });
        }
        if self.entries.is_empty() {
            problems.push(Problem {
                origin: self.origin.clone(),
                entry: None,
                message: format!(
                    "set {:?} has no images (a PinnedImageSet needs 1 to {MAX_ENTRIES})",
                    self.name
                ),
                fix: "add at least one image reference".into(),
            });
        }
        if self.entries.len() > MAX_ENTRIES {
            problems.push(Problem {
                origin: self.origin.clone(),
                entry: None,
                message: format!(
                    "set {:?} has {} images, over the PinnedImageSet limit of {MAX_ENTRIES}",
                    self.name,
                    self.entries.len()
                ),
                fix: "split it into several sets".into(),
            });
        }
        let mut first_seen: HashMap<&str, &Origin> = HashMap::new();
        for entry in &self.entries {
            if let Err(violation) = check_pinned(&entry.reference) {
                problems.push(Problem {
                    origin: entry.origin.clone(),
                    entry: Some(entry.reference.clone()),
                    message: violation.to_string(),
                    fix: violation.fix(&entry.reference),
                });
            } else if let Some(first) = first_seen.get(entry.reference.as_str()) {
                problems.push(Problem {
                    origin: entry.origin.clone(),
                    entry: Some(entry.reference.clone()),
                    message: format!("duplicate of the entry at {first} (entries must be unique)"),
                    fix: "remove one of them".into(),
                });
            } else {
                first_seen.insert(&entry.reference, &entry.origin);
            }
        }
        problems
    }
}

/// Why `name` cannot name a PinnedImageSet (the API server's DNS-subdomain rule); None when it can.
pub fn name_problem(name: &str) -> Option<String> {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if name.is_empty() {
        Some("is empty".into())
    } else if name.len() > MAX_NAME {
        Some(format!("is longer than {MAX_NAME} characters"))
    } else if !name
        .chars()
        .all(|c| alphanumeric(c) || c == '-' || c == '.')
    {
        Some("has characters other than lowercase letters, digits, '-' and '.'".into())
    } else if !name.starts_with(alphanumeric) || !name.ends_with(alphanumeric) {
        Some("does not start and end with a letter or digit".into())
    } else {
        None
    }
}

/// The name of a set that has none (a list file, `--image` flags): `images-` and the first 12 hex digits
/// of the SHA-256 of its distinct references, sorted, one per line. Stable: the same images give the same
/// name in any order, from any file or flags.
pub fn content_name<'r>(references: impl IntoIterator<Item = &'r str>) -> String {
    let distinct: std::collections::BTreeSet<&str> = references.into_iter().collect();
    let mut hash = Sha256::new();
    for reference in distinct {
        hash.update(reference.as_bytes());
        hash.update(b"\n");
    }
    let hex: String = hash.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("images-{hex}")
}

/// A set without a name from `--image` flags, named after its content ([`content_name`]).
pub fn from_image_flags(references: &[String]) -> ImageSet {
    let mut set = from_flags("", references);
    set.name = content_name(set.references());
    set
}

/// A set from `--image` flags, in the order given.
pub fn from_flags(name: &str, references: &[String]) -> ImageSet {
    ImageSet {
        name: name.to_string(),
        labels: BTreeMap::new(),
        entries: references
            .iter()
            .enumerate()
            .map(|(i, r)| Entry {
                reference: r.trim().to_string(),
                origin: Origin::Flag { index: i + 1 },
            })
            .collect(),
        origin: Origin::Flag { index: 1 },
        node_selector: None,
        pull_secrets: Vec::new(),
        fan_out: false,
    }
}

/// A set from a list file: one reference per line; `#` starts a comment; blank lines are skipped. Named
/// after its content ([`content_name`]).
pub fn parse_list(text: &str, path: &str) -> ImageSet {
    let entries: Vec<Entry> = text
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let reference = line.split('#').next().unwrap_or("").trim();
            (!reference.is_empty()).then(|| Entry {
                reference: reference.to_string(),
                origin: Origin::File {
                    path: path.to_string(),
                    line: Some(i + 1),
                },
            })
        })
        .collect();
    ImageSet {
        name: content_name(entries.iter().map(|e| e.reference.as_str())),
        labels: BTreeMap::new(),
        entries,
        origin: file_origin(path, None),
        node_selector: None,
        pull_secrets: Vec::new(),
        fan_out: false,
    }
}

fn file_origin(path: &str, line: Option<usize>) -> Origin {
    Origin::File {
        path: path.to_string(),
        line,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<Metadata>,
    spec: Option<Spec>,
}

#[derive(Deserialize)]
struct Metadata {
    /// Where it is written: the line a problem with the set's name points at.
    name: Option<Spanned<String>>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    pinned_images: Vec<Spanned<YamlEntry>>,
    /// PinSet only. Strict: an unknown key (`matchLabel`) would be dropped by the API server's pruning and
    /// leave a selector that selects every node.
    node_selector: Option<Spanned<SelectorYaml>>,
    #[serde(default)]
    pull_secrets: Vec<SecretYaml>,
    /// PinSet only.
    #[serde(default)]
    fan_out: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SelectorYaml {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    match_expressions: Vec<ExpressionYaml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpressionYaml {
    key: String,
    operator: String,
    #[serde(default)]
    values: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretYaml {
    name: String,
}

/// A node selector as written, checked as the API server would (operators and their values, label keys
/// and values), or why not.
fn node_selector(yaml: SelectorYaml) -> Result<LabelSelector, SelectorError> {
    for (key, value) in &yaml.match_labels {
        if !valid_key(key) || !valid_value(value) {
            return Err(SelectorError::MatchLabel {
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    let mut expressions = Vec::new();
    for e in yaml.match_expressions {
        let needs_values = match e.operator.as_str() {
            "In" | "NotIn" => true,
            "Exists" | "DoesNotExist" => false,
            _ => {
                return Err(SelectorError::Operator {
                    key: e.key,
                    operator: e.operator,
                });
            }
        };
        if !valid_key(&e.key) {
            return Err(SelectorError::Key(e.key));
        }
        if needs_values == e.values.is_empty() {
            return Err(SelectorError::Values {
                key: e.key,
                operator: e.operator,
            });
        }
        expressions.push(LabelSelectorRequirement {
            key: e.key,
            operator: e.operator,
            values: (!e.values.is_empty()).then_some(e.values),
        });
    }
    Ok(LabelSelector {
        match_labels: (!yaml.match_labels.is_empty()).then_some(yaml.match_labels),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    })
}

/// `- name: REF` (v1, later v1alpha1) or `- REF` (early v1alpha1).
struct YamlEntry(String);

impl<'de> Deserialize<'de> for YamlEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = YamlEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`name: <reference>` or a reference string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<YamlEntry, E> {
                Ok(YamlEntry(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<YamlEntry, A::Error> {
                let mut name = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "name" {
                        name = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                }
                name.map(YamlEntry)
                    .ok_or_else(|| de::Error::missing_field("name"))
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

/// Every PinnedImageSet in a (multi-document) YAML file. Empty documents are skipped; any other kind, a
/// missing name or a YAML error is a problem. Entry rules are not checked here: see [`ImageSet::validate`].
pub fn parse_yaml(text: &str, path: &str) -> Result<Vec<ImageSet>, Vec<Problem>> {
    let documents: Vec<Option<Spanned<Document>>> = serde_saphyr::from_multiple(text).map_err(|err| {
        let line = err.location().map(|l| l.line() as usize);
        let message = err.without_snippet().to_string();
        let message = message.lines().next().unwrap_or("").to_string();
        vec![Problem {
            origin: file_origin(path, line),
            entry: None,
            message: format!("not a valid PinnedImageSet YAML: {message}"),
            fix: "fix the YAML (each image is `- name: HOST/NAME@sha256:<digest>` under spec.pinnedImages)".into(),
        }]
    })?;
    let mut sets = Vec::new();
    let mut problems = Vec::new();
    for document in documents.into_iter().flatten() {
        let line = Some(document.defined.line() as usize);
        let doc = document.value;
        let here = file_origin(path, line);
        let group = doc.api_version.as_deref().and_then(|v| v.split('/').next());
        let kind_ok = matches!(
            (group, doc.kind.as_deref()),
            (Some(API_GROUP), Some(KIND))
                | (Some(pinboard_kinds::GROUP), Some(pinboard_kinds::SET_KIND))
        );
        if !kind_ok {
            problems.push(Problem {
                origin: here,
                entry: None,
                message: format!(
                    "document is {} {}, not a PinnedImageSet",
                    doc.api_version.as_deref().unwrap_or("<no apiVersion>"),
                    doc.kind.as_deref().unwrap_or("<no kind>")
                ),
                fix: format!(
                    "use apiVersion: {API_GROUP}/v1 and kind: {KIND} (or apiVersion: {} and kind: {}), \
                     or pass a plain list with --images-file",
                    pinboard_kinds::API_VERSION,
                    pinboard_kinds::SET_KIND
                ),
            });
            continue;
        }
        let Some((name, labels)) = doc.metadata.and_then(|m| Some((m.name?, m.labels))) else {
            problems.push(Problem {
                origin: here,
                entry: None,
                message: "PinnedImageSet has no metadata.name".into(),
                fix: "give it a name".into(),
            });
            continue;
        };
        let (pinned_images, selector, pull_secrets, fan_out) = match doc.spec {
            Some(spec) => (
                spec.pinned_images,
                spec.node_selector,
                spec.pull_secrets,
                spec.fan_out,
            ),
            None => (Vec::new(), None, Vec::new(), false),
        };
        let node_selector = match selector {
            Some(selector) => {
                let line = Some(selector.defined.line() as usize);
                match node_selector(selector.value) {
                    Ok(selector) => Some(Selector(selector)),
                    Err(message) => {
                        problems.push(Problem {
                            origin: file_origin(path, line),
                            entry: None,
                            message: format!("spec.nodeSelector: {message}"),
                            fix: "write matchLabels (key: value) and matchExpressions (key, operator, values) \
                                  as a Kubernetes label selector"
                                .into(),
                        });
                        continue;
                    }
                }
            }
            None => None,
        };
        let entries = pinned_images
            .into_iter()
            .map(|e| Entry {
                reference: e.value.0.trim().to_string(),
                origin: file_origin(path, Some(e.defined.line() as usize)),
            })
            .collect();
        sets.push(ImageSet {
            name: name.value,
            labels,
            entries,
            node_selector,
            pull_secrets: pull_secrets.into_iter().map(|s| s.name).collect(),
            fan_out,
            // Its name's line: where a problem with the set as a whole is found and fixed.
            origin: file_origin(path, Some(name.referenced.line() as usize)),
        });
    }
    if problems.is_empty() {
        Ok(sets)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_set_carries_its_node_selector_and_pull_secrets_and_a_mistyped_selector_is_refused() {
        let digest = "a".repeat(64);
        let yaml = format!(
            "apiVersion: pinboard.dev/v1alpha1\nkind: PinSet\nmetadata:\n  name: web\nspec:\n  \
             pinnedImages:\n  - name: quay.io/ns/app@sha256:{digest}\n  nodeSelector:\n    matchLabels:\n      \
             zone: a\n    matchExpressions:\n    - key: node-role.kubernetes.io/worker\n      operator: Exists\n  \
             pullSecrets:\n  - name: quay-login\n"
        );
        let sets = parse_yaml(&yaml, "web.yaml").unwrap();
        let set = &sets[0];
        assert_eq!(set.pull_secrets, ["quay-login"]);
        let selector = set.node_selector.as_ref().unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selector.matches(&labels(&[
            ("zone", "a"),
            ("node-role.kubernetes.io/worker", "")
        ])));
        assert!(!selector.matches(&labels(&[("zone", "a")])));
        assert!(set.validate().is_empty());

        // `matchLabel` would be pruned by the API server, leaving a selector that selects every node.
        let typo = yaml.replace("matchLabels", "matchLabel");
        let problems = parse_yaml(&typo, "web.yaml").unwrap_err();
        let text = problems[0].to_string();
        assert!(
            text.contains("matchLabel") && text.contains("web.yaml:"),
            "{text}"
        );
        let operator = yaml.replace("Exists", "Exist");
        let text = parse_yaml(&operator, "web.yaml").unwrap_err()[0].to_string();
        assert!(
            text.contains("operator \"Exist\" is not In, NotIn, Exists or DoesNotExist"),
            "{text}"
        );
    }

    const D1: &str = "sha256:4198606580b69c8335ad7ae531c3a74e51aee25db5faaf368234e8c8dae5cbea";
    const D2: &str = "sha256:513cf1028aa1a021fa73d0601427a0fbcf6d212b88aaf9d76d4e4841a061e44e";

    #[test]
    fn reads_multi_document_yaml_with_lines() {
        let text = format!(
            "apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: workers
  labels:
    machineconfiguration.openshift.io/role: worker
spec:
  pinnedImages:
  - name: quay.io/ocp/release@{D1}
  - name: quay.io/ocp/art@{D2}
---
---
apiVersion: machineconfiguration.openshift.io/v1alpha1
kind: PinnedImageSet
metadata: {{name: legacy}}
spec:
  pinnedImages:
  - quay.io/ocp/release@{D2}
"
        );
        let sets = parse_yaml(&text, "sets.yaml").unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].name, "workers");
        assert_eq!(
            sets[0].labels["machineconfiguration.openshift.io/role"],
            "worker"
        );
        let lines: Vec<String> = sets[0]
            .entries
            .iter()
            .map(|e| e.origin.to_string())
            .collect();
        assert_eq!(lines, ["sets.yaml:9", "sets.yaml:10"]);
        assert_eq!(sets[1].name, "legacy");
        assert_eq!(
            sets[1].entries[0].reference,
            format!("quay.io/ocp/release@{D2}")
        );
        assert_eq!(sets[1].entries[0].origin.to_string(), "sets.yaml:18");
    }

    #[test]
    fn a_bad_name_is_reported_at_the_line_of_its_name() {
        let text = format!(
            "apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: ok
spec:
  pinnedImages: [{{name: quay.io/a@{D1}}}]
---
apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  labels: {{a: b}}
  name: Bad_Name
spec:
  pinnedImages: [{{name: quay.io/a@{D1}}}]
"
        );
        let sets = parse_yaml(&text, "s.yaml").unwrap();
        assert!(sets[0].validate().is_empty());
        let problems = sets[1].validate();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .to_string()
                .starts_with("s.yaml:12: set name \"Bad_Name\" has characters"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn malformed_yaml_is_one_problem_with_a_line() {
        let problems = parse_yaml(
            "kind: PinnedImageSet\nspec:\n  pinnedImages: [\n",
            "bad.yaml",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 1);
        let text = problems[0].to_string();
        assert!(text.starts_with("bad.yaml:"), "{text}");
        assert!(text.contains("not a valid PinnedImageSet YAML"), "{text}");
    }

    #[test]
    fn other_kinds_and_nameless_sets_are_refused() {
        let problems = parse_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "cm.yaml",
        )
        .unwrap_err();
        assert!(
            problems[0]
                .to_string()
                .contains("v1 ConfigMap, not a PinnedImageSet"),
            "{}",
            problems[0]
        );
        let nameless =
            "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nspec: {}\n";
        assert!(
            parse_yaml(nameless, "n.yaml").unwrap_err()[0]
                .message
                .contains("metadata.name")
        );
    }

    #[test]
    fn list_files_skip_comments_and_blanks() {
        let set = parse_list(
            &format!("# upgrade images\n\nquay.io/a@{D1}  # base\n  quay.io/b@{D2}\n"),
            "l.txt",
        );
        let got: Vec<(String, String)> = set
            .entries
            .iter()
            .map(|e| (e.reference.clone(), e.origin.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (format!("quay.io/a@{D1}"), "l.txt:3".into()),
                (format!("quay.io/b@{D2}"), "l.txt:4".into())
            ]
        );
    }

    #[test]
    fn validation_names_entry_rule_and_place() {
        let set = parse_list(
            &format!(
                "quay.io/a:v1\nlocalhost:5000/a@{D1}\nquay.io/a/b/c@{D1}\nquay.io/a@{D1}\nquay.io/a@{D1}\n"
            ),
            "l.txt",
        );
        let problems: Vec<String> = set.validate().iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].starts_with("l.txt:1: quay.io/a:v1: uses a tag, not a digest"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].starts_with("l.txt:2: localhost:5000/a@"),
            "{}",
            problems[1]
        );
        assert!(problems[1].contains("has no dot"), "{}", problems[1]);
        assert!(
            problems[2].contains("more than one namespace segment"),
            "{}",
            problems[2]
        );
        assert!(
            problems[3].starts_with("l.txt:5:")
                && problems[3].contains("duplicate of the entry at l.txt:4")
        );
    }

    #[test]
    fn size_limits_are_1_to_500() {
        let refs = |n: usize| {
            (0..n)
                .map(|i| format!("quay.io/app{i}@{D1}"))
                .collect::<Vec<_>>()
        };
        assert!(from_flags("f", &refs(500)).validate().is_empty());
        let over = from_flags("f", &refs(501)).validate();
        assert_eq!(over.len(), 1);
        assert!(
            over[0]
                .message
                .contains("501 images, over the PinnedImageSet limit of 500")
        );
        assert!(
            from_flags("f", &[]).validate()[0]
                .message
                .contains("has no images")
        );
        assert_eq!(
            from_flags("f", &refs(2)).entries[1].origin.to_string(),
            "--image #2"
        );
    }

    #[test]
    fn sets_without_a_name_are_named_after_their_images_in_any_order() {
        let a = format!("quay.io/a@{D1}");
        let b = format!("quay.io/b@{D2}");
        let listed = parse_list(&format!("{b}\n# comment\n{a}\n"), "l.txt");
        let flagged = from_image_flags(&[a.clone(), b.clone()]);
        assert_eq!(listed.name, flagged.name, "same images, same name");
        assert!(listed.name.starts_with("images-") && listed.name.len() == 19);
        assert_eq!(name_problem(&listed.name), None);
        assert_ne!(from_image_flags(&[a]).name, listed.name);
    }

    #[test]
    fn set_names_follow_the_api_servers_rule() {
        for good in ["release-4.19", "a", "set.b-2"] {
            assert_eq!(name_problem(good), None, "{good}");
        }
        for bad in ["", "Set-A", "a_b", "-a", "a.", &"a".repeat(254)] {
            assert!(name_problem(bad).is_some(), "{bad}");
        }
        let problems = from_flags("My Set", &[format!("quay.io/a@{D1}")]).validate();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .to_string()
                .contains("set name \"My Set\" has characters")
        );
    }
}

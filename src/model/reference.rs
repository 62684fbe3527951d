//! Image references: parsing, normalization, and the exact rules a PinnedImageSet entry must follow.
//!
//! Two views of one string. [`ImageRef::parse`] reads any reference the way container tools do (docker.io
//! and `library/` implied) so pinboard can compare and suggest. [`check_pinned`] applies OpenShift's
//! PinnedImageSet v1 validation to the literal text, because that is what the API server enforces:
//! `^([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(:[0-9]{2,5})?/([a-zA-Z0-9-_]{0,61}/)?[a-zA-Z0-9-_.]*?$` before the `@`,
//! `sha256:` and 64 lowercase hex after it, 1..=447 characters.

use std::fmt;

pub const MAX_PINNED_REFERENCE_LEN: usize = 447;
const DEFAULT_REGISTRY: &str = "docker.io";

/// Why a text is not an image reference at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("empty image reference")]
    Empty,
    #[error("{text:?} has an empty path component")]
    EmptyPathComponent { text: String },
    #[error("{text:?} has an empty tag")]
    EmptyTag { text: String },
}

/// A parsed, normalized image reference: `registry/repository[:tag][@digest]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    /// Host with optional port, e.g. `quay.io` or `127.0.0.1:5000`.
    pub registry: String,
    /// Path below the host, e.g. `openshift-release-dev/ocp-release`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses a reference the way docker and containerd do: a first path component without `.` or `:`
    /// (and not `localhost`) is a Docker Hub repository, and single-name Hub repositories live in `library/`.
    pub fn parse(text: &str) -> Result<ImageRef, ReferenceError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let (name_and_tag, digest) = match text.split_once('@') {
            Some((name, digest)) => (name, Some(digest.to_string())),
            None => (text, None),
        };
        // A tag's colon comes after the last slash; a port's colon comes before it.
        let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_and_tag[last_slash..].rfind(':') {
            Some(i) => (
                &name_and_tag[..last_slash + i],
                Some(name_and_tag[last_slash + i + 1..].to_string()),
            ),
            None => (name_and_tag, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_string(), rest.to_string())
            }
            _ => (DEFAULT_REGISTRY.to_string(), name.to_string()),
        };
        let repository = if registry == DEFAULT_REGISTRY && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if repository.is_empty() || repository.split('/').any(str::is_empty) {
            return Err(ReferenceError::EmptyPathComponent {
                text: text.to_owned(),
            });
        }
        if tag.as_deref() == Some("") {
            return Err(ReferenceError::EmptyTag {
                text: text.to_owned(),
            });
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }
}

impl ImageRef {
    /// What a runtime resolves the reference to, as one string: `registry/repository@digest` when it has a
    /// digest (a tag beside it is ignored, as runtimes do), else `registry/repository:tag` (`latest`
    /// implied). Two names of one image in a runtime's listing compare equal this way.
    pub fn identity(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => format!("{}/{}@{digest}", self.registry, self.repository),
            (None, tag) => format!(
                "{}/{}:{}",
                self.registry,
                self.repository,
                tag.as_deref().unwrap_or("latest")
            ),
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Which PinnedImageSet rule an entry breaks. Each names the rule, and [`Violation::fix`] says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    Empty,
    TooLong { len: usize },
    NoDigest,
    SeveralAt,
    BadDigest { digest: String },
    NoHost { first: String },
    BadHost { host: String },
    BadPort { port: String },
    TooManySegments { path: String },
    BadNamespace { namespace: String },
    BadName { name: String },
}

impl Violation {
    /// What the administrator can do about it.
    pub fn fix(&self, text: &str) -> String {
        match self {
            Violation::Empty => "remove the empty entry".into(),
            Violation::TooLong { .. } => "use a shorter reference (a mirror with a shorter path)".into(),
            Violation::NoDigest => {
                let name = text.split('@').next().unwrap_or(text);
                format!(
                    "pin by digest: `skopeo inspect --format '{{{{.Digest}}}}' docker://{name}` prints it; write NAME@sha256:<digest>"
                )
            }
            Violation::SeveralAt | Violation::BadDigest { .. } => {
                "write exactly one @ followed by sha256: and 64 lowercase hex characters".into()
            }
            Violation::NoHost { .. } => match ImageRef::parse(text) {
                Ok(full) if full.registry.contains('.') => format!("write the registry host explicitly: {full}"),
                _ => "name the registry by a host with a dot, e.g. 127.0.0.1:5000 instead of localhost:5000".into(),
            },
            Violation::BadHost { .. } => "a host is dot-separated labels of letters, digits and '-'".into(),
            Violation::BadPort { .. } => "a port has 2 to 5 digits".into(),
            Violation::TooManySegments { .. } => {
                "PinnedImageSet allows host/name or host/namespace/name: mirror the image to a shallower path".into()
            }
            Violation::BadNamespace { .. } => {
                "a namespace has at most 61 letters, digits, '-' or '_'".into()
            }
            Violation::BadName { .. } => "an image name has only letters, digits, '-', '_' or '.'".into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Empty => write!(f, "empty reference"),
            Violation::TooLong { len } => {
                write!(
                    f,
                    "is {len} characters long, over the limit of {MAX_PINNED_REFERENCE_LEN}"
                )
            }
            Violation::NoDigest => write!(
                f,
                "uses a tag, not a digest (PinnedImageSet accepts digests only)"
            ),
            Violation::SeveralAt => write!(f, "has more than one '@'"),
            Violation::BadDigest { digest } => {
                write!(f, "digest {digest:?} is not sha256: and 64 lowercase hex")
            }
            Violation::NoHost { first } => write!(
                f,
                "registry host {first:?} has no dot (PinnedImageSet requires one)"
            ),
            Violation::BadHost { host } => write!(f, "registry host {host:?} is not valid"),
            Violation::BadPort { port } => write!(f, "port {port:?} is not 2 to 5 digits"),
            Violation::TooManySegments { path } => {
                write!(
                    f,
                    "path {path:?} has more than one namespace segment between host and name"
                )
            }
            Violation::BadNamespace { namespace } => {
                write!(f, "namespace {namespace:?} is not valid")
            }
            Violation::BadName { name } => write!(f, "image name {name:?} is not valid"),
        }
    }
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

fn is_namespace_char(c: char) -> bool {
    is_label_char(c) || c == '_'
}

/// Checks one entry against PinnedImageSet v1 validation. Returns the first rule it breaks.
pub fn check_pinned(text: &str) -> Result<(), Violation> {
    if text.is_empty() {
        return Err(Violation::Empty);
    }
    if text.len() > MAX_PINNED_REFERENCE_LEN {
        return Err(Violation::TooLong { len: text.len() });
    }
    let mut parts = text.split('@');
    let (name, digest) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), Some(digest), None) => (name, digest),
        (_, None, _) => return Err(Violation::NoDigest),
        _ => return Err(Violation::SeveralAt),
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64
        || !hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    {
        return Err(Violation::BadDigest {
            digest: digest.to_string(),
        });
    }
    let Some((host_port, path)) = name.split_once('/') else {
        return Err(Violation::NoHost {
            first: name.to_string(),
        });
    };
    let (host, port) = match host_port.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (host_port, None),
    };
    if !host.contains('.') {
        return Err(Violation::NoHost {
            first: host_port.to_string(),
        });
    }
    if host
        .split('.')
        .any(|label| label.is_empty() || !label.chars().all(is_label_char))
    {
        return Err(Violation::BadHost {
            host: host.to_string(),
        });
    }
    if let Some(port) = port
        && (!(2..=5).contains(&port.len()) || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(Violation::BadPort {
            port: port.to_string(),
        });
    }
    let segments: Vec<&str> = path.split('/').collect();
    let (namespace, image) = match segments.as_slice() {
        [image] => (None, *image),
        [namespace, image] => (Some(*namespace), *image),
        _ => {
            return Err(Violation::TooManySegments {
                path: path.to_string(),
            });
        }
    };
    if let Some(namespace) = namespace
        && (namespace.len() > 61 || !namespace.chars().all(is_namespace_char))
    {
        return Err(Violation::BadNamespace {
            namespace: namespace.to_string(),
        });
    }
    if !image.chars().all(|c| is_namespace_char(c) || c == '.') {
        return Err(Violation::BadName {
            name: image.to_string(),
        });
    }
    Ok(())
}

/// `host/name@sha256:0123456789ab…`: long enough to tell images apart, short enough for a table or a
/// notice.
pub fn short_reference(reference: &str) -> String {
    match reference.split_once("@sha256:") {
        Some((name, hex)) if hex.len() > 12 => format!("{name}@sha256:{}…", &hex[..12]),
        _ => reference.to_string(),
    }
}

/// How many references a line names before it says how many more there are.
const NAMED_IN_A_LINE: usize = 5;

/// `a, b, c` or, for a long list, its first few and `and 104 more`.
pub fn some_of<S: AsRef<str>>(references: &[S]) -> String {
    let named: Vec<&str> = references
        .iter()
        .take(NAMED_IN_A_LINE)
        .map(AsRef::as_ref)
        .collect();
    match references.len().saturating_sub(NAMED_IN_A_LINE) {
        0 => named.join(", "),
        more => format!("{} and {more} more", named.join(", ")),
    }
}

/// `1 image` / `3 images`.
pub fn count_images(n: usize) -> String {
    format!("{n} image{}", if n == 1 { "" } else { "s" })
}

/// `text` with every `@sha256:` digest cut to 12 hex digits, as [`short_reference`] cuts one reference:
/// a line of a config diff that fits the screen, with what follows the reference still in view.
pub fn shorten_digests(text: &str) -> String {
    const MARK: &str = "@sha256:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let (before, after) = rest.split_at(at + MARK.len());
        out.push_str(before);
        let hex = after.chars().take_while(char::is_ascii_hexdigit).count();
        if hex > 12 {
            out.push_str(&after[..12]);
            out.push('…');
        } else {
            out.push_str(&after[..hex]);
        }
        rest = &after[hex..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:4198606580b69c8335ad7ae531c3a74e51aee25db5faaf368234e8c8dae5cbea";

    fn pinned(text: &str) -> Result<(), Violation> {
        check_pinned(text)
    }

    #[test]
    fn accepts_what_openshift_accepts() {
        for ok in [
            format!("quay.io/openshift-release-dev/ocp-release@{D}"),
            format!("127.0.0.1:5000/app@{D}"),
            format!("registry.example.com:443/ns_1/web.app-2@{D}"),
            format!("quay.io/a/@{D}"), // the CRD's name class is `*`: an empty name passes it
        ] {
            assert_eq!(pinned(&ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn names_the_rule_each_bad_entry_breaks() {
        assert_eq!(pinned("quay.io/app:v1"), Err(Violation::NoDigest));
        assert_eq!(
            pinned(&format!("localhost:5000/app@{D}")),
            Err(Violation::NoHost {
                first: "localhost:5000".into()
            })
        );
        assert_eq!(
            pinned(&format!("app@{D}")),
            Err(Violation::NoHost {
                first: "app".into()
            })
        );
        assert_eq!(
            pinned(&format!("reg.example.com/a/b/c@{D}")),
            Err(Violation::TooManySegments {
                path: "a/b/c".into()
            })
        );
        assert_eq!(
            pinned(&format!("quay.io:5/app@{D}")),
            Err(Violation::BadPort { port: "5".into() })
        );
        assert_eq!(
            pinned(&format!("quay.io:123456/app@{D}")),
            Err(Violation::BadPort {
                port: "123456".into()
            })
        );
        assert!(matches!(
            pinned("quay.io/app@sha256:ABC"),
            Err(Violation::BadDigest { .. })
        ));
        assert!(matches!(
            pinned(&format!("quay.io/app@{}", D.to_uppercase())),
            Err(Violation::BadDigest { .. })
        ));
        assert_eq!(
            pinned(&format!("quay.io/a@b@{D}")),
            Err(Violation::SeveralAt)
        );
        assert!(matches!(
            pinned(&format!("qu_ay.io/app@{D}")),
            Err(Violation::BadHost { .. })
        ));
        assert!(matches!(
            pinned(&format!("quay.io/{}/app@{D}", "n".repeat(62))),
            Err(Violation::BadNamespace { .. })
        ));
        assert!(matches!(
            pinned(&format!("quay.io/ns/ap+p@{D}")),
            Err(Violation::BadName { .. })
        ));
        assert_eq!(pinned(""), Err(Violation::Empty));
    }

    #[test]
    fn length_limit_is_447() {
        let prefix = "quay.io/ns/";
        let suffix = format!("@{D}");
        let name = |n: usize| {
            format!(
                "{prefix}{}{suffix}",
                "a".repeat(n - prefix.len() - suffix.len())
            )
        };
        assert_eq!(pinned(&name(447)), Ok(()));
        assert_eq!(pinned(&name(448)), Err(Violation::TooLong { len: 448 }));
    }

    #[test]
    fn fixes_point_at_the_way_out() {
        assert!(
            Violation::NoDigest
                .fix("quay.io/app:v1")
                .contains("docker://quay.io/app:v1")
        );
        let hub = format!("nginx@{D}");
        assert_eq!(
            Violation::NoHost {
                first: "nginx".into()
            }
            .fix(&hub),
            format!("write the registry host explicitly: docker.io/library/nginx@{D}")
        );
        assert!(
            Violation::NoHost {
                first: "localhost:5000".into()
            }
            .fix(&format!("localhost:5000/a@{D}"))
            .contains("127.0.0.1")
        );
    }

    #[test]
    fn parses_and_normalizes_like_container_tools() {
        let r = ImageRef::parse("nginx").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/nginx", None)
        );
        let r = ImageRef::parse("localhost:5000/a/b:v2").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("localhost:5000", "a/b", Some("v2"))
        );
        let r = ImageRef::parse(&format!("quay.io/org/app:1.0@{D}")).unwrap();
        assert_eq!(r.to_string(), format!("quay.io/org/app:1.0@{D}"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(
            ImageRef::parse("user/app").unwrap().to_string(),
            "docker.io/user/app"
        );
        assert!(ImageRef::parse("quay.io//app").is_err());
        assert!(ImageRef::parse("app:").is_err());
    }

    #[test]
    fn identities_compare_names_as_runtimes_resolve_them() {
        let id = |text: &str| ImageRef::parse(text).unwrap().identity();
        assert_eq!(
            id(&format!("docker.io/busybox@{D}")),
            format!("docker.io/library/busybox@{D}")
        );
        assert_eq!(
            id(&format!("quay.io/org/app:1.0@{D}")),
            id(&format!("quay.io/org/app@{D}"))
        );
        assert_eq!(id("quay.io/org/app"), "quay.io/org/app:latest");
        assert_ne!(id("quay.io/org/app:1"), id("quay.io/org/app:2"));
    }

    #[test]
    fn short_references_keep_twelve_hex_digits() {
        let r = format!("quay.io/a@sha256:{}", "0123456789abcdef".repeat(4));
        assert_eq!(short_reference(&r), "quay.io/a@sha256:0123456789ab…");
    }

    #[test]
    fn digests_in_a_line_are_shortened_and_the_rest_kept() {
        let hex = "0123456789abcdef".repeat(4);
        let line = format!("  \"quay.io/a@sha256:{hex}\", # pinboard: set-a  b@sha256:12");
        assert_eq!(
            shorten_digests(&line),
            "  \"quay.io/a@sha256:0123456789ab…\", # pinboard: set-a  b@sha256:12"
        );
    }
}

//! References as the registry client takes them: parsed, spelled as the distribution spec allows, and
//! registries named as references spell them.

use super::error::RegistryError;
use crate::model::reference::{ImageRef, ReferenceError};

/// Why a reference is not one the registry client sends.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum InvalidReference {
    #[error(transparent)]
    Unparsed(#[from] ReferenceError),
    #[error("bad registry host {0:?}")]
    Host(String),
    #[error("bad repository {0:?}: lower-case letters, digits and . _ - only")]
    Repository(String),
    #[error("bad tag {0:?}")]
    Tag(String),
    #[error("bad digest {0:?}")]
    Digest(String),
}

/// `http://host:port/` or `host:port` as image references spell registries (Docker Hub is `docker.io`).
pub(super) fn normalize_registry(text: &str) -> String {
    let text = text.trim();
    let text = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .unwrap_or(text);
    let host = text.split('/').next().unwrap_or(text);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        other => other.to_string(),
    }
}

/// A reference as the registry client takes it: parsed, and spelled as the distribution spec allows.
pub(super) fn parse_reference(text: &str) -> Result<ImageRef, RegistryError> {
    ImageRef::parse(text)
        .map_err(InvalidReference::from)
        .and_then(|r| well_formed(&r).map(|()| r))
        .map_err(|e| RegistryError::Invalid {
            reference: text.to_string(),
            cause: format!("not a valid image reference ({e})"),
        })
}

/// Whether every part of the reference is spelled as the distribution spec allows, so nothing else is
/// sent to a registry: host, lower-case path components, tag and digest.
fn well_formed(reference: &ImageRef) -> Result<(), InvalidReference> {
    let host_ok = !reference.registry.is_empty()
        && reference
            .registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if !host_ok {
        return Err(InvalidReference::Host(reference.registry.clone()));
    }
    let component_ok = |c: &str| {
        c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    if !reference.repository.split('/').all(component_ok) {
        return Err(InvalidReference::Repository(reference.repository.clone()));
    }
    if let Some(tag) = &reference.tag {
        let ok = tag.len() <= 128
            && tag
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(InvalidReference::Tag(tag.clone()));
        }
    }
    match &reference.digest {
        Some(digest) if !valid_digest(digest) => Err(InvalidReference::Digest(digest.clone())),
        _ => Ok(()),
    }
}

/// Whether `digest` is `sha256:` with 64, or `sha512:` with 128, lower-case hex digits.
pub(super) fn valid_digest(digest: &str) -> bool {
    let hex = |h: &str, len: usize| {
        h.len() == len && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    match digest.split_once(':') {
        Some(("sha256", h)) => hex(h, 64),
        Some(("sha512", h)) => hex(h, 128),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_registry_names_are_normalized_as_references_spell_them() {
        assert_eq!(
            normalize_registry("http://127.0.0.1:5000/"),
            "127.0.0.1:5000"
        );
        assert_eq!(normalize_registry(" registry.local "), "registry.local");
        assert_eq!(normalize_registry("index.docker.io"), "docker.io");
    }
}

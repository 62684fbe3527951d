//! The in-cluster cache's token: a random secret only pinboard's agents have (kept in the Secret
//! [`crate::model::pinboard_api::CACHE_TOKEN_SECRET`]), that their relays send to the cache as a header
//! (`crate::backend::blobs::Relay`), never written into a node's files. The cache answers nothing without
//! it, so a pod cannot read private images through it.
//! Never printed: its `Debug` is redacted and it has no `Display`.

use std::fmt;

/// The header the token is sent in.
pub const CACHE_TOKEN_HEADER: &str = "x-pinboard-cache-token";

#[derive(Clone, PartialEq, Eq)]
pub struct CacheToken(String);

impl fmt::Debug for CacheToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheToken(<redacted>)")
    }
}

impl CacheToken {
    /// A token from its text (the Secret's value); None when empty.
    pub fn new(text: impl Into<String>) -> Option<CacheToken> {
        let text: String = text.into();
        let text = text.trim();
        (!text.is_empty()).then(|| CacheToken(text.to_string()))
    }

    /// The token itself, to be written into a header or a Secret: never into a log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, compared in time independent of where they differ.
    pub fn admits(&self, presented: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        ours.len() == presented.len()
            && ours
                .iter()
                .zip(presented)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_never_shown_and_admits_only_itself() {
        let token = CacheToken::new("s3cret-value\n").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
        assert!(token.admits(b"s3cret-value"));
        assert!(!token.admits(b"s3cret-valuX"));
        assert!(!token.admits(b"s3cret"));
        assert!(CacheToken::new("  ").is_none());
    }
}

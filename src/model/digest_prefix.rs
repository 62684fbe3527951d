//! Digests shortened to their first 8 bytes: how an agent publishes what its runtime holds, so that a
//! thousand blobs cost 8 KB on the API server instead of 70 KB of digests. A [`DigestPrefixes`] is a sorted
//! set of those 64-bit prefixes, written as the base64 of their concatenation (big-endian): one JSON
//! string, which the API server stores and serves without walking a thousand JSON values.
//!
//! 64 bits are exact in practice: a digest is a sha256 value, uniform over its bits, so a digest the node
//! lacks shares its prefix with one of the `n` it holds with probability `n / 2^64`. A node holding 10,000
//! blobs, asked about 10,000, is wrong once in 1.8 × 10^11 plans; 5,000 such nodes once in 37 million
//! plans. And a collision only leaves one blob out of a plan's figure: it never changes what is pulled.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes kept of each digest.
pub const PREFIX_BYTES: usize = 8;

/// The first [`PREFIX_BYTES`] of `digest` (`sha256:<hex>`, or any `algorithm:<hex>`); None when it is not
/// a digest.
pub fn prefix(digest: &str) -> Option<u64> {
    let (_, hex) = digest.split_once(':')?;
    let head = hex.get(..PREFIX_BYTES * 2)?;
    u64::from_str_radix(head, 16).ok()
}

/// A sorted set of digest prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DigestPrefixes(Vec<u64>);

impl DigestPrefixes {
    /// The prefixes of `digests`; what is not a digest is left out.
    pub fn of<'a>(digests: impl IntoIterator<Item = &'a str>) -> DigestPrefixes {
        DigestPrefixes::from_unsorted(digests.into_iter().filter_map(prefix).collect())
    }

    fn from_unsorted(mut prefixes: Vec<u64>) -> DigestPrefixes {
        prefixes.sort_unstable();
        prefixes.dedup();
        DigestPrefixes(prefixes)
    }

    /// Whether the set holds `digest`'s prefix; None when `digest` is not a digest.
    pub fn contains(&self, digest: &str) -> Option<bool> {
        Some(self.0.binary_search(&prefix(digest)?).is_ok())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The base64 of the prefixes' concatenation, in order.
    pub fn to_base64(&self) -> String {
        let bytes: Vec<u8> = self.0.iter().flat_map(|p| p.to_be_bytes()).collect();
        BASE64.encode(bytes)
    }

    /// The set `text` ([`Self::to_base64`]) writes.
    pub fn from_base64(text: &str) -> Result<DigestPrefixes, String> {
        let bytes = BASE64
            .decode(text)
            .map_err(|e| format!("not base64: {e}"))?;
        if bytes.len() % PREFIX_BYTES != 0 {
            return Err(format!(
                "{} bytes: not a whole number of {PREFIX_BYTES}-byte digest prefixes",
                bytes.len()
            ));
        }
        let prefixes = bytes
            .chunks_exact(PREFIX_BYTES)
            .map(|chunk| u64::from_be_bytes(chunk.try_into().expect("exact chunks")))
            .collect();
        // Sorted as written by an agent; sorted again in case another writer did not.
        Ok(DigestPrefixes::from_unsorted(prefixes))
    }
}

impl Serialize for DigestPrefixes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_base64())
    }
}

impl<'de> Deserialize<'de> for DigestPrefixes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
        DigestPrefixes::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(i: u32) -> String {
        use sha2::Digest as _;
        format!("sha256:{:x}", sha2::Sha256::digest(i.to_be_bytes()))
    }

    #[test]
    fn a_set_holds_exactly_the_prefixes_of_its_digests_and_reads_back_from_its_base64() {
        let held: Vec<String> = (0..1000).map(digest).collect();
        let set = DigestPrefixes::of(held.iter().map(String::as_str).rev());
        assert_eq!(set.len(), 1000);
        assert!(held.iter().all(|d| set.contains(d) == Some(true)));
        assert_eq!(set.contains(&digest(5000)), Some(false));
        assert_eq!(set.contains("not a digest"), None);
        assert_eq!(set.contains("sha256:abc"), None, "shorter than a prefix");
        let text = set.to_base64();
        // 8 bytes a digest, 4/3 for base64: a thousand blobs in under 11 KB.
        assert_eq!(text.len(), 10_668);
        assert_eq!(DigestPrefixes::from_base64(&text), Ok(set.clone()));
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(serde_json::from_str::<DigestPrefixes>(&json).unwrap(), set);
    }

    #[test]
    fn what_is_not_a_whole_number_of_prefixes_is_refused() {
        assert!(
            DigestPrefixes::from_base64("AAAA")
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(
            DigestPrefixes::from_base64("!!")
                .unwrap_err()
                .contains("not base64")
        );
        assert_eq!(
            DigestPrefixes::from_base64(""),
            Ok(DigestPrefixes::default())
        );
    }
}

//! Reading an OpenShift release payload without downloading it: `oc adm release new` puts
//! `release-manifests/image-references` and `release-manifests/release-metadata` at the start of the
//! payload's last layer, so that layer is read as it streams in (gzip, then tar) and the download stops as
//! soon as both files are read. The payload's other layers are never fetched.

use std::io::{self, Read};

use bytes::Bytes;
use futures::Stream;
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::model::release_payload::{IMAGE_REFERENCES, RELEASE_METADATA};

/// The two files a release payload's last layer starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadFiles {
    pub image_references: String,
    pub release_metadata: String,
}

/// Why the two files could not be read from the layer: what it holds instead.
#[derive(Debug, thiserror::Error)]
pub enum PayloadLayerError {
    #[error("reading the payload layer failed: {0}")]
    Task(tokio::task::JoinError),
    #[error("the payload's last layer is not a gzip tar: {0}")]
    NotGzipTar(io::Error),
    #[error("{path} in the payload cannot be read as text: {error}")]
    NotText { path: String, error: io::Error },
    #[error(
        "not a release payload: its last layer holds no {missing}{}",
        held(seen)
    )]
    Missing {
        missing: &'static str,
        /// The first entries it holds instead.
        seen: Vec<String>,
    },
}

/// ` (it holds a, b…)`, or nothing when the layer is empty.
fn held(seen: &[String]) -> String {
    if seen.is_empty() {
        String::new()
    } else {
        format!(" (it holds {}…)", seen.join(", "))
    }
}

/// How many entry names a "not a release" message lists.
const NAMED: usize = 5;
/// Neither file is larger than this in a real payload (image-references is ~200 KiB).
const MAX_FILE: u64 = 16 << 20;

/// Reads the two files from `layer`, a gzip tar arriving in chunks, and stops reading once both are read.
/// Err says what the layer holds instead.
pub async fn read_payload_layer<S>(layer: S) -> Result<PayloadFiles, PayloadLayerError>
where
    S: Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static,
{
    let reader = SyncIoBridge::new(StreamReader::new(layer));
    tokio::task::spawn_blocking(move || read_tar_gz(reader))
        .await
        .map_err(PayloadLayerError::Task)?
}

fn read_tar_gz(reader: impl Read) -> Result<PayloadFiles, PayloadLayerError> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(reader));
    let (mut references, mut metadata) = (None, None);
    let mut seen: Vec<String> = Vec::new();
    let entries = archive.entries().map_err(PayloadLayerError::NotGzipTar)?;
    for entry in entries {
        let mut entry = entry.map_err(PayloadLayerError::NotGzipTar)?;
        let path = entry
            .path()
            .map(|p| p.to_string_lossy().trim_start_matches("./").to_owned())
            .unwrap_or_default();
        let slot = match path.as_str() {
            IMAGE_REFERENCES => &mut references,
            RELEASE_METADATA => &mut metadata,
            _ => {
                if seen.len() < NAMED {
                    seen.push(path);
                }
                continue;
            }
        };
        let mut text = String::new();
        entry
            .by_ref()
            .take(MAX_FILE)
            .read_to_string(&mut text)
            .map_err(|error| PayloadLayerError::NotText {
                path: path.clone(),
                error,
            })?;
        *slot = Some(text);
        if let (Some(references), Some(metadata)) = (&references, &metadata) {
            // Both read: dropping the archive drops the stream, and the rest is never downloaded.
            return Ok(PayloadFiles {
                image_references: references.clone(),
                release_metadata: metadata.clone(),
            });
        }
    }
    let missing = match (&references, &metadata) {
        (None, _) => IMAGE_REFERENCES,
        _ => RELEASE_METADATA,
    };
    Err(PayloadLayerError::Missing { missing, seen })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A gzip tar of `files` (name, content), in order, as a release layer is.
    fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        builder
            .append_data(&mut dir, "release-manifests/", io::empty())
            .unwrap();
        for (name, content) in files {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            header.set_size(content.len() as u64);
            builder.append_data(&mut header, name, *content).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    /// `bytes` as a stream of 4 KiB chunks, counting how many chunks were taken.
    fn chunked(
        bytes: Vec<u8>,
        taken: Arc<AtomicUsize>,
    ) -> impl Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static {
        let chunks: Vec<io::Result<Bytes>> = bytes
            .chunks(4096)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(chunks).inspect(move |_| {
            taken.fetch_add(1, Ordering::Relaxed);
        })
    }

    use futures::StreamExt as _;

    /// Pseudo-random bytes gzip cannot shrink, standing in for the operators' manifests.
    fn noise(len: usize) -> Vec<u8> {
        let mut state = 7u64;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect()
    }

    #[tokio::test]
    async fn both_files_are_read_and_the_rest_of_the_layer_is_not() {
        let manifests = noise(2 << 20);
        let bytes = layer(&[
            (IMAGE_REFERENCES, br#"{"kind": "ImageStream"}"#),
            (RELEASE_METADATA, br#"{"version": "4.19.3"}"#),
            ("release-manifests/0000_50_big.yaml", &manifests),
        ]);
        let total_chunks = bytes.len().div_ceil(4096);
        let taken = Arc::new(AtomicUsize::new(0));
        let files = read_payload_layer(chunked(bytes, taken.clone()))
            .await
            .unwrap();
        assert_eq!(files.image_references, r#"{"kind": "ImageStream"}"#);
        assert_eq!(files.release_metadata, r#"{"version": "4.19.3"}"#);
        let taken = taken.load(Ordering::Relaxed);
        assert!(
            taken * 10 < total_chunks,
            "read {taken} of {total_chunks} chunks: it should stop after the two files"
        );
    }

    #[tokio::test]
    async fn a_layer_without_the_files_says_what_it_holds() {
        let bytes = layer(&[("usr/bin/app", b"ELF"), ("etc/config", b"x")]);
        let err = read_payload_layer(chunked(bytes, Arc::default()))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a release payload: its last layer holds no release-manifests/image-references (it holds \
             release-manifests/, usr/bin/app, etc/config…)"
        );
        let err = read_payload_layer(chunked(b"not gzip at all".to_vec(), Arc::default()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a gzip tar"), "{err}");
    }
}

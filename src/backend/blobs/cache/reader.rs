//! Reading a blob from the cache: from its complete file, or from the partial file of the download under
//! way as its bytes land, the last byte held back until the whole blob is verified.

use std::fmt;
use std::io::SeekFrom;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::BoxStream;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio::sync::watch;

use super::{BlobCache, BlobError, CHUNK, Progress};

/// An open reader of one blob. While it exists, the blob is not evicted.
pub struct Blob {
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) file: tokio::fs::File,
    /// `None` when the blob was complete on disk when opened.
    pub(super) progress: Option<watch::Receiver<Progress>>,
    /// Held for its `Drop`.
    pub(super) _in_use: InUse,
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("complete_when_opened", &self.progress.is_none())
            .finish()
    }
}

impl Blob {
    /// Bytes `range` of the blob (clamped to its size), as they land. The last byte comes only once the
    /// whole blob is verified; a failed download, or one that started over after this reader sent bytes,
    /// ends the stream with the error.
    pub fn stream(self, range: Range<u64>) -> BoxStream<'static, Result<Bytes, BlobError>> {
        let end = range.end.min(self.size);
        let reader = Reader {
            pos: range.start.min(end),
            end,
            positioned: false,
            generation: None,
            done: false,
            blob: self,
        };
        futures::stream::unfold(reader, |mut reader| async move {
            let item = reader.next().await?;
            Some((item, reader))
        })
        .boxed()
    }
}

struct Reader {
    blob: Blob,
    pos: u64,
    end: u64,
    positioned: bool,
    /// The download generation of the first byte sent.
    generation: Option<u32>,
    done: bool,
}

impl Reader {
    async fn next(&mut self) -> Option<Result<Bytes, BlobError>> {
        if self.done || self.pos >= self.end {
            return None;
        }
        let result = self.read().await;
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }

    async fn read(&mut self) -> Result<Bytes, BlobError> {
        let digest = self.blob.digest.clone();
        let io = |e: std::io::Error| BlobError::Io {
            path: digest.clone(),
            cause: e.to_string(),
        };
        if !self.positioned {
            self.blob
                .file
                .seek(SeekFrom::Start(self.pos))
                .await
                .map_err(io)?;
            self.positioned = true;
        }
        loop {
            let mut generation = 0;
            let limit = match self.blob.progress.as_mut() {
                None => self.end,
                Some(progress) => {
                    let now = progress.borrow_and_update().clone();
                    generation = now.generation;
                    if let Some(Err(error)) = now.outcome {
                        return Err(error);
                    }
                    if self.generation.is_some_and(|g| g != now.generation) {
                        return Err(BlobError::Discarded {
                            digest: self.blob.digest.clone(),
                        });
                    }
                    if now.outcome.is_some() {
                        self.end
                    } else {
                        // The last byte waits for verification.
                        now.written.min(self.end - 1)
                    }
                }
            };
            if limit > self.pos {
                let want = usize::try_from(limit - self.pos).map_or(CHUNK, |n| n.min(CHUNK));
                let mut buffer = BytesMut::zeroed(want);
                let n = self.blob.file.read(&mut buffer).await.map_err(io)?;
                if n > 0 {
                    buffer.truncate(n);
                    self.pos += n as u64;
                    self.generation.get_or_insert(generation);
                    return Ok(buffer.freeze());
                }
                if self.blob.progress.is_none() {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the cached file ends before byte {}", self.end),
                    )));
                }
            }
            // Wait for more bytes (or for the bytes of a download that started over).
            let progress = self
                .blob
                .progress
                .as_mut()
                .expect("complete blobs never wait");
            if progress.changed().await.is_err() {
                return Err(BlobError::Stopped {
                    digest: self.blob.digest.clone(),
                });
            }
        }
    }
}

/// Counts an open reader of a blob; evicts what waited for it when it goes.
pub(super) struct InUse {
    pub(super) cache: Arc<BlobCache>,
    pub(super) hex: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let over = {
            let mut state = self.cache.lock();
            if let Some(count) = state.in_use.get_mut(&self.hex) {
                *count -= 1;
                if *count == 0 {
                    state.in_use.remove(&self.hex);
                }
            }
            state.stored_bytes > self.cache.options.max_bytes
        };
        if over {
            self.cache.evict();
        }
    }
}

//! One blob a node takes in from its parents: its pieces in a file at their offsets, which of them are
//! verified ([`Fetch`]), and readers waiting for more: the runtime reads the verified prefix as it grows,
//! and other nodes read single pieces once verified. No byte is read out before its piece matched the
//! holder's hash, so a corrupt piece never leaves the node that received it.

use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::model::peers::{Cut, Fetch};

/// What the runtime is sent at a time.
const CHUNK: u64 = 1 << 20;

pub struct Taking {
    pub digest: String,
    pub cut: Cut,
    path: PathBuf,
    file: Arc<std::fs::File>,
    state: Mutex<Held>,
    /// Bumped at every verified piece, and when the taking fails.
    changed: watch::Sender<u64>,
}

struct Held {
    fetch: Fetch,
    failed: Option<String>,
    /// Last read by the runtime or another node: a complete blob unused for a while is let go.
    used: Instant,
}

/// Why a piece cannot be read now.
#[derive(Debug, PartialEq, Eq)]
pub enum NotHeld {
    /// Not verified yet: ask again.
    NotYet,
    /// The taking failed: this node will not have it.
    Failed(String),
}

impl Taking {
    /// A new taking of `digest` cut as `cut`, its pieces written to a new file at `path`. A file there
    /// before is unlinked, never truncated: whoever still reads it (an earlier taking's request, an agent
    /// sharing the directory) keeps its bytes, and no piece it holds turns to zeros.
    pub fn create(path: &Path, digest: &str, cut: Cut) -> std::io::Result<Taking> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(path)?;
        file.set_len(cut.size)?;
        Ok(Taking {
            digest: digest.to_string(),
            path: path.to_path_buf(),
            file: Arc::new(file),
            state: Mutex::new(Held {
                fetch: Fetch::new(cut.geometry()),
                failed: None,
                used: Instant::now(),
            }),
            cut,
            changed: watch::channel(0).0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next piece of `stripe` to ask for; None when the stripe is held or the taking failed.
    pub fn wanted(&self, stripe: usize) -> Option<u32> {
        let held = self.lock();
        held.failed.is_none().then(|| held.fetch.wanted(stripe))?
    }

    pub fn complete(&self) -> bool {
        self.lock().fetch.complete()
    }

    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Whether a complete or failed taking went unused for `idle`.
    pub fn idle_for(&self, idle: Duration) -> bool {
        let held = self.lock();
        (held.fetch.complete() || held.failed.is_some()) && held.used.elapsed() >= idle
    }

    /// Writes `bytes`, which matched the hash of `piece`, and makes the piece readable.
    pub async fn put(&self, piece: u32, bytes: Bytes) -> std::io::Result<()> {
        let offset = self.cut.geometry().range(piece).start;
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || file.write_all_at(&bytes, offset))
            .await
            .map_err(std::io::Error::other)??;
        self.lock().fetch.verified(piece);
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    /// The taking ends without the blob, for `why`: readers waiting see it.
    pub fn fail(&self, why: String) {
        self.lock().failed.get_or_insert(why);
        self.changed.send_modify(|n| *n += 1);
    }

    /// The bytes of `piece` once verified, waiting up to `patience` for it.
    pub async fn piece(&self, piece: u32, patience: Duration) -> Result<Bytes, NotHeld> {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            {
                let mut held = self.lock();
                if let Some(why) = &held.failed {
                    return Err(NotHeld::Failed(why.clone()));
                }
                if held.fetch.holds(piece) {
                    held.used = Instant::now();
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return Err(NotHeld::NotYet);
            }
        }
        self.read(self.cut.geometry().range(piece))
            .await
            .map_err(|e| NotHeld::Failed(format!("cannot read {}: {e}", self.path.display())))
    }

    /// Bytes `range` of the blob as the verified prefix grows: the runtime's download. Ends with an
    /// error when the taking fails.
    pub fn prefix_stream(
        self: &Arc<Self>,
        range: Range<u64>,
    ) -> BoxStream<'static, Result<Bytes, String>> {
        let taking = Arc::clone(self);
        let changed = self.changed.subscribe();
        futures::stream::unfold(
            (taking, changed, range.start, range.end),
            |(taking, mut changed, at, end)| async move {
                if at >= end {
                    return None;
                }
                loop {
                    // What is verified goes first, then the failure.
                    let ready = {
                        let mut held = taking.lock();
                        held.used = Instant::now();
                        let prefix = held.fetch.prefix_bytes().min(end);
                        match &held.failed {
                            Some(why) if prefix <= at => Err(why.clone()),
                            _ => Ok(prefix),
                        }
                    };
                    match ready {
                        Err(why) => return Some((Err(why), (taking, changed, end, end))),
                        Ok(prefix) if prefix > at => {
                            let span = at..prefix.min(at + CHUNK);
                            let next = span.end;
                            let read = taking.read(span).await.map_err(|e| e.to_string());
                            return Some((read, (taking, changed, next, end)));
                        }
                        Ok(_) => {
                            if changed.changed().await.is_err() {
                                return None;
                            }
                        }
                    }
                }
            },
        )
        .boxed()
    }

    async fn read(&self, range: Range<u64>) -> std::io::Result<Bytes> {
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || {
            let mut bytes = vec![0; (range.end - range.start) as usize];
            file.read_exact_at(&mut bytes, range.start)?;
            Ok(Bytes::from(bytes))
        })
        .await
        .map_err(std::io::Error::other)?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_runtime_reads_the_verified_prefix_as_it_grows_and_a_failure_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..600_000u32).map(|i| (i % 241) as u8).collect();
        let cut = Cut::of(&blob);
        let taking = Arc::new(Taking::create(&dir.path().join("b"), "sha256:b", cut).unwrap());
        let piece = |p: u32| {
            let r = taking.cut.geometry().range(p);
            Bytes::copy_from_slice(&blob[r.start as usize..r.end as usize])
        };
        let reader = taking.prefix_stream(0..blob.len() as u64);
        // Piece 1 first: nothing readable until piece 0 lands; another node waits for piece 2.
        taking.put(1, piece(1)).await.unwrap();
        assert_eq!(
            taking.piece(2, Duration::from_millis(20)).await,
            Err(NotHeld::NotYet)
        );
        let writer = Arc::clone(&taking);
        let (first, last) = (piece(0), piece(2));
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            writer.put(0, first).await.unwrap();
            writer.put(2, last).await.unwrap();
        });
        let read: Vec<Bytes> = reader.map(Result::unwrap).collect().await;
        later.await.unwrap();
        assert!(read.concat() == blob, "the blob, in order");
        assert!(taking.complete());
        assert_eq!(taking.piece(1, Duration::ZERO).await.unwrap(), piece(1));

        // A failed taking passes on what it verified, then its failure.
        let failing = Arc::new(
            Taking::create(&dir.path().join("c"), "sha256:c", taking.cut.clone()).unwrap(),
        );
        let mut reader = failing.prefix_stream(0..600_000);
        failing.put(0, piece(0)).await.unwrap();
        failing.fail("its parents are gone".into());
        assert_eq!(reader.next().await, Some(Ok(piece(0))));
        assert_eq!(
            reader.next().await,
            Some(Err("its parents are gone".into()))
        );
        assert_eq!(reader.next().await, None);
    }

    #[tokio::test]
    async fn a_new_taking_at_the_same_path_leaves_the_pieces_an_earlier_one_holds() {
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let cut = Cut::of(&blob);
        let path = dir.path().join("b");
        let first = Taking::create(&path, "sha256:b", cut.clone()).unwrap();
        let range = cut.geometry().range(0);
        let piece = Bytes::copy_from_slice(&blob[range.start as usize..range.end as usize]);
        first.put(0, piece.clone()).await.unwrap();
        // Another agent sharing the directory (or a retry after a failure) takes the same blob anew.
        let second = Taking::create(&path, "sha256:b", cut).unwrap();
        assert_eq!(first.piece(0, Duration::ZERO).await.unwrap(), piece);
        assert_eq!(second.piece(0, Duration::ZERO).await, Err(NotHeld::NotYet));
    }
}

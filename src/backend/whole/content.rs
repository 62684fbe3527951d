//! Blobs into and out of containerd's content store (namespace `k8s.io`), for whole pulls: a registry
//! blob streamed in through an ingest named as containerd names its own (`layer-sha256:<hex>`, so that
//! byte progress sees it as it sees a pull's), resumed where an earlier attempt left it, committed against
//! its digest and size; and the first bytes of a blob.
//!
//! containerd's `Content/Write` answers every request before it reads the next: requests go one at a time.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;
use tonic::Code;

use super::{WholeError, with_lease};
use crate::backend::cri::CriClient;
use crate::backend::pins::containerd::namespaced;
use crate::backend::proto::containerd_content::{
    InfoRequest, ReadContentRequest, WriteAction, WriteContentRequest, WriteContentResponse,
    content_client::ContentClient,
};
use crate::backend::registry::Registry;
use crate::model::served::Source;

/// How much goes in one write request.
const CHUNK: usize = 1 << 20;
/// How long the first wait for an ingest another pull is writing lasts; it doubles up to the second.
const LOCKED_FIRST_WAIT: Duration = Duration::from_millis(16);
const LOCKED_MAX_WAIT: Duration = Duration::from_secs(2);

/// The size of blob `digest` in the content store.
pub(super) async fn blob_size(client: &CriClient, digest: &str) -> Result<i64, WholeError> {
    let request = namespaced(InfoRequest {
        digest: digest.to_string(),
    });
    let mut content = ContentClient::new(client.channel());
    let info = client
        .call_content("Content/Info", async {
            content.info(request).await.map(tonic::Response::into_inner)
        })
        .await?;
    Ok(info.info.map_or(0, |i| i.size))
}

/// Blob `digest` whole (a manifest: small).
pub(super) async fn read(client: &CriClient, digest: &str) -> Result<Vec<u8>, WholeError> {
    head(client, digest, 0).await
}

/// The first `len` bytes of blob `digest` (0: all of it).
pub(super) async fn head(
    client: &CriClient,
    digest: &str,
    len: i64,
) -> Result<Vec<u8>, WholeError> {
    let request = namespaced(ReadContentRequest {
        digest: digest.to_string(),
        offset: 0,
        size: len,
    });
    let reading = async {
        let mut stream = ContentClient::new(client.channel())
            .read(request)
            .await?
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(part) = stream.next().await {
            bytes.extend_from_slice(&part?.data);
        }
        Ok(bytes)
    };
    Ok(client.call_content("Content/Read", reading).await?)
}

/// Writes `bytes` (blob `digest`, already in hand and checked) under the lease, unless it is there.
pub(super) async fn write_bytes(
    client: &CriClient,
    lease: &str,
    kind: &str,
    digest: &str,
    bytes: Bytes,
) -> Result<(), WholeError> {
    let mut ingest = match Ingest::open(client, lease, kind, digest, bytes.len() as u64).await? {
        Some(ingest) => ingest,
        None => return Ok(()),
    };
    ingest.truncate_if_started().await?;
    ingest.write(bytes).await?;
    ingest.commit().await
}

/// Streams blob `digest` (`size` bytes) of `source` from `registry` into the content store under the
/// lease, from where an earlier attempt's ingest got to, unless the blob is there already.
pub(super) async fn fetch_blob(
    client: &CriClient,
    registry: &Registry,
    lease: &str,
    source: &Source,
    digest: &str,
    size: u64,
) -> Result<(), WholeError> {
    let Some(mut ingest) = Ingest::open(client, lease, "layer", digest, size).await? else {
        return Ok(());
    };
    let from = ingest.offset;
    if from < size {
        let body = registry
            .blob(source, digest, from, None)
            .await
            .map_err(|failure| WholeError::Registry(failure.error))?;
        // A registry that ignored the Range sends the blob from its start: skip what is there.
        let mut skip = from - body.start;
        let mut stream = body.stream;
        let mut pending = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let mut chunk = chunk.map_err(|e| WholeError::BrokenOff {
                digest: digest.to_string(),
                cause: e.cause,
            })?;
            let dropped = skip.min(chunk.len() as u64);
            let _ = chunk.split_to(dropped as usize);
            skip -= dropped;
            pending.extend_from_slice(&chunk);
            if pending.len() >= CHUNK {
                ingest.write(pending.split().freeze()).await?;
            }
        }
        ingest.write(pending.freeze()).await?;
    }
    ingest.commit().await
}

/// One ingest being written, a request and its answer at a time.
struct Ingest {
    requests: mpsc::Sender<WriteContentRequest>,
    answers: tonic::Streaming<WriteContentResponse>,
    client: CriClient,
    reference: String,
    digest: String,
    total: u64,
    /// Bytes written so far.
    offset: u64,
}

/// What opening an ingest found.
enum Opened {
    Ingest(Box<Ingest>),
    /// The blob is in the store already.
    InStore,
    /// Another pull writes it now (images sharing a layer): containerd answers that its ref is locked.
    Locked,
}

/// Whether containerd refused a write because another writer holds its ref, as it answers while another
/// pull writes the same blob (a server's Unavailable, not a broken connection's).
fn locked(status: &tonic::Status) -> bool {
    status.code() == Code::Unavailable
        && std::error::Error::source(status).is_none()
        && status.message().contains("locked")
}

impl Ingest {
    /// Opens the ingest `<kind>-<digest>` for a blob of `total` bytes under the lease, and learns how far
    /// an earlier attempt got; None when the blob is in the store already. While another pull writes the
    /// same blob it waits, as containerd's own pulls do: that pull's commit makes the blob in the store.
    async fn open(
        client: &CriClient,
        lease: &str,
        kind: &str,
        digest: &str,
        total: u64,
    ) -> Result<Option<Ingest>, WholeError> {
        let mut wait = LOCKED_FIRST_WAIT;
        loop {
            match Ingest::try_open(client, lease, kind, digest, total).await? {
                Opened::Ingest(ingest) => return Ok(Some(*ingest)),
                Opened::InStore => return Ok(None),
                Opened::Locked => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(LOCKED_MAX_WAIT);
                }
            }
        }
    }

    async fn try_open(
        client: &CriClient,
        lease: &str,
        kind: &str,
        digest: &str,
        total: u64,
    ) -> Result<Opened, WholeError> {
        let reference = format!("{kind}-{digest}");
        let (requests, rx) = mpsc::channel(1);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|request| (request, rx))
        });
        let mut request = namespaced(stream);
        with_lease(&mut request, lease);
        let stat = WriteContentRequest {
            action: WriteAction::Stat as i32,
            r#ref: reference.clone(),
            total: total as i64,
            expected: digest.to_string(),
            ..WriteContentRequest::default()
        };
        requests
            .send(stat)
            .await
            .map_err(|_| WholeError::closed(&reference))?;
        // What the stream's opening and its first answer (the ingest's status) say.
        enum First {
            Status(Box<(tonic::Streaming<WriteContentResponse>, WriteContentResponse)>),
            InStore,
            Locked,
            Closed,
        }
        let opening = async {
            let mut answers = match ContentClient::new(client.channel()).write(request).await {
                Ok(answers) => answers.into_inner(),
                Err(status) if status.code() == Code::AlreadyExists => return Ok(First::InStore),
                Err(status) if locked(&status) => return Ok(First::Locked),
                Err(status) => return Err(status),
            };
            match answers.message().await {
                Ok(Some(stat)) => Ok(First::Status(Box::new((answers, stat)))),
                Ok(None) => Ok(First::Closed),
                Err(status) if status.code() == Code::AlreadyExists => Ok(First::InStore),
                Err(status) if locked(&status) => Ok(First::Locked),
                Err(status) => Err(status),
            }
        };
        let (answers, stat) = match client.call_content("Content/Write", opening).await? {
            First::Status(opened) => *opened,
            First::InStore => return Ok(Opened::InStore),
            First::Locked => return Ok(Opened::Locked),
            First::Closed => return Err(WholeError::closed(&reference)),
        };
        Ok(Opened::Ingest(Box::new(Ingest {
            requests,
            answers,
            client: client.clone(),
            reference,
            digest: digest.to_string(),
            total,
            offset: u64::try_from(stat.offset).unwrap_or(0),
        })))
    }

    /// Drops what an earlier write of bytes in hand left, so that they are written from the start.
    async fn truncate_if_started(&mut self) -> Result<(), WholeError> {
        if self.offset > 0 {
            self.send(WriteAction::Write, 0, Bytes::new()).await?;
            self.offset = 0;
        }
        Ok(())
    }

    async fn write(&mut self, data: Bytes) -> Result<(), WholeError> {
        if data.is_empty() {
            return Ok(());
        }
        let len = data.len() as u64;
        self.send(WriteAction::Write, self.offset, data).await?;
        self.offset += len;
        Ok(())
    }

    /// Commits the blob: containerd checks its digest and size (another writer committing it first is as
    /// good).
    async fn commit(mut self) -> Result<(), WholeError> {
        self.send(WriteAction::Commit, self.offset, Bytes::new())
            .await
    }

    /// Sends one request and waits for its answer.
    async fn send(
        &mut self,
        action: WriteAction,
        offset: u64,
        data: Bytes,
    ) -> Result<(), WholeError> {
        let request = WriteContentRequest {
            action: action as i32,
            r#ref: self.reference.clone(),
            total: self.total as i64,
            expected: self.digest.clone(),
            offset: offset as i64,
            data: data.to_vec(),
            ..WriteContentRequest::default()
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| WholeError::closed(&self.reference))?;
        self.answer().await.map(drop)
    }

    /// The answer to the last request; None when the blob turned out to be in the store already.
    async fn answer(&mut self) -> Result<Option<WriteContentResponse>, WholeError> {
        let reference = self.reference.clone();
        let answer = async {
            match self.answers.message().await {
                Ok(Some(answer)) => Ok(Some(Some(answer))),
                Ok(None) => Ok(None),
                Err(status) if status.code() == Code::AlreadyExists => Ok(Some(None)),
                Err(status) => Err(status),
            }
        };
        self.client
            .call_content("Content/Write", answer)
            .await?
            .ok_or_else(|| WholeError::closed(&reference))
    }
}

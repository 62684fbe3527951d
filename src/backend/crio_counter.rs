//! CRI-O's pull-bytes counter on a node: its progress settings read from its configuration files (as
//! CRI-O reads them: `crio.conf`, then the drop-ins; [`pins::crio_config_files`]), pinboard's drop-in that
//! turns them on ([`set_progress`]), and the counter read from its metrics page, over TCP or its metrics
//! socket. What they mean is [`crate::model::crio_progress`].

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::files::{read_optional, write_if_changed};
use super::pins::{self, PinError};
use crate::model::crio_progress::{
    CrioProgress, MetricsAt, PROGRESS_DROP_IN, PULL_BYTES, counter_total,
};

/// How long one read of the metrics page may take: a progress poll that does not answer is skipped.
const READ_WITHIN: Duration = Duration::from_secs(2);
/// The most of the metrics page read (CRI-O's is a few tens of KiB).
const PAGE_LIMIT: u64 = 8 << 20;

/// Why CRI-O's counter could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    #[error(transparent)]
    Config(#[from] PinError),
    #[error(transparent)]
    Setting(#[from] crate::model::crio_progress::ProgressSettingError),
    #[error("CRI-O's metrics at {at}: {error}")]
    Metrics { at: String, error: String },
}

/// CRI-O's progress settings as its files in and beside `config_dir` set them. Blocking.
pub fn read_progress(config_dir: &Path) -> Result<CrioProgress, CounterError> {
    Ok(CrioProgress::read(pins::crio_config_files(config_dir)?)?)
}

/// CRI-O's pull-bytes counter now (0 before any pull reported bytes).
pub async fn pull_bytes(at: &MetricsAt) -> Result<f64, CounterError> {
    let failed = |error: String| CounterError::Metrics {
        at: at.address().to_string(),
        error,
    };
    let page = tokio::time::timeout(READ_WITHIN, async {
        match at {
            MetricsAt::Tcp(address) => {
                get_metrics(tokio::net::TcpStream::connect(address).await?).await
            }
            MetricsAt::Socket(path) => {
                get_metrics(tokio::net::UnixStream::connect(path).await?).await
            }
        }
    })
    .await
    .map_err(|_| failed(format!("no answer within {READ_WITHIN:?}")))?
    .map_err(|e| failed(e.to_string()))?;
    Ok(counter_total(&page, PULL_BYTES).unwrap_or(0.0))
}

/// `GET /metrics` over `stream` (HTTP/1.0: the server closes the connection after its answer), the
/// page's body.
async fn get_metrics<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> std::io::Result<String> {
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    stream.take(PAGE_LIMIT).read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(std::io::Error::other(format!("answered {status:?}")));
    }
    Ok(body.to_string())
}

/// What [`set_progress`] writes: pinboard's drop-in turning CRI-O's pull byte counting on, progress
/// reported every tenth of `timeout`.
fn progress_drop_in(timeout: &str) -> String {
    format!(
        "# Written by `pinboard crio-progress on`: CRI-O counts its pull bytes as they arrive and serves\n\
         # them (container_runtime_crio_image_pulls_bytes_total); it also cancels a pull that moves no byte\n\
         # for pull_progress_timeout. CRI-O reads both when it starts. `pinboard crio-progress off` removes\n\
         # this file.\n\
         [crio.metrics]\n  enable_metrics = true\n\n[crio.image]\n  pull_progress_timeout = \"{timeout}\"\n"
    )
}

/// Writes pinboard's progress drop-in in `config_dir` with `timeout` as CRI-O's `pull_progress_timeout`,
/// or removes it (None), only when that changes it (atomic, as every file pinboard writes on a node);
/// whether it changed. Blocking.
pub fn set_progress(config_dir: &Path, timeout: Option<&str>) -> Result<bool, CounterError> {
    let path = config_dir.join(PROGRESS_DROP_IN);
    let old = read_optional(&path).map_err(PinError::from)?;
    let new = timeout.map(progress_drop_in);
    Ok(write_if_changed(&path, old.as_deref(), new.as_deref()).map_err(PinError::from)?)
}

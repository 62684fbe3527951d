//! A CRI client for one node: `unix:///path` or `tcp://host:port`, every call bounded by a timeout, and
//! errors that name the endpoint, the RPC and the cause.
//!
//! Replies are decoded up to 64 MiB: busy nodes overflow gRPC's default 4 MiB on ListImages.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::proto::cri::{
    AuthConfig, Image, ImageFsInfoRequest, ImageFsInfoResponse, ImageSpec, ImageStatusRequest,
    PullImageRequest, PullImageResponse, RemoveImageRequest, VersionRequest, VersionResponse,
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use crate::model::reference::ImageRef;
use crate::model::runtime::Runtime;

pub const MAX_DECODE_BYTES: usize = 64 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ImageStatus calls run at once against one node.
const STATUS_CONCURRENCY: usize = 16;

/// Never print registry secrets: prost's derived Debug would.
impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("auth", &redact(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redact(&self.identity_token))
            .field("registry_token", &redact(&self.registry_token))
            .finish()
    }
}

/// Where a node's CRI socket is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CriEndpoint {
    Unix(PathBuf),
    /// `host:port`
    Tcp(String),
}

impl CriEndpoint {
    /// Whether pinboard shares the node's filesystem (and can measure free space with statvfs).
    pub fn is_local(&self) -> bool {
        matches!(self, CriEndpoint::Unix(_))
    }
}

/// A text that names no CRI socket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "CRI endpoint {text:?} is not unix:///path/to/socket or tcp://host:port \
     (e.g. unix:///run/containerd/containerd.sock)"
)]
pub struct CriEndpointError {
    pub text: String,
}

impl FromStr for CriEndpoint {
    type Err = CriEndpointError;

    /// `unix:///run/containerd/containerd.sock`, a bare absolute path (as crictl accepts), or `tcp://host:port`.
    fn from_str(text: &str) -> Result<Self, CriEndpointError> {
        if let Some(path) = text.strip_prefix("unix://") {
            if path.starts_with('/') {
                return Ok(CriEndpoint::Unix(PathBuf::from(path)));
            }
        } else if let Some(addr) = text.strip_prefix("tcp://") {
            if let Some((host, port)) = addr.rsplit_once(':')
                && !host.is_empty()
                && port.parse::<u16>().is_ok()
            {
                return Ok(CriEndpoint::Tcp(addr.to_string()));
            }
        } else if text.starts_with('/') {
            return Ok(CriEndpoint::Unix(PathBuf::from(text)));
        }
        Err(CriEndpointError {
            text: text.to_owned(),
        })
    }
}

impl fmt::Display for CriEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CriEndpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            CriEndpoint::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

/// What went wrong, whether it means the node could not be reached at all, and what kind of failure it is.
#[derive(Clone, Debug, thiserror::Error)]
#[error("CRI endpoint {endpoint}: {rpc}: {cause}")]
pub struct CriError {
    pub endpoint: String,
    pub rpc: &'static str,
    pub cause: String,
    pub unreachable: bool,
    pub kind: CriErrorKind,
}

/// What a failed call says about trying it again, read once where the error is made: from the gRPC code,
/// and from the words containerd, CRI-O (containers/image) and pinboard's blob cache use for each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CriErrorKind {
    /// The image filesystem is full: "no space left on device".
    NoSpace,
    /// Access refused: "unauthorized", "denied", "forbidden", or the gRPC code PermissionDenied.
    Refused,
    /// Content that does not match its digest: the registry's copy is corrupt, and asking again downloads
    /// the same bytes again.
    Corrupt,
    /// No such image: "not found", "manifest unknown".
    NotFound,
    /// "invalid reference".
    InvalidReference,
    /// Anything else, such as no answer in time or a reset connection: another try may succeed.
    Transient,
    /// The node's state stops it for now (a container runs from the layers a whole pull would replace):
    /// trying again within the rollout would not help.
    InUse,
    /// The endpoint does not serve that call (gRPC Unimplemented).
    Unimplemented,
}

impl CriErrorKind {
    /// The kind of a failure with gRPC `code` (None: no answer, or no connection) and `cause`, its words
    /// in any letter case, without the code's name. The kinds are tried in the order above, so a full disk
    /// is NoSpace whatever else it says. Of the codes, PermissionDenied alone decides: NotFound or
    /// Unauthenticated go by their words, as the runtimes put the reason there.
    pub fn of(code: Option<tonic::Code>, cause: &str) -> CriErrorKind {
        let lower = cause.to_lowercase();
        let says = |words: &[&str]| words.iter().any(|w| lower.contains(w));
        if code == Some(tonic::Code::Unimplemented) {
            CriErrorKind::Unimplemented
        } else if says(&["no space left on device"]) {
            CriErrorKind::NoSpace
        } else if code == Some(tonic::Code::PermissionDenied)
            || says(&["unauthorized", "denied", "forbidden"])
        {
            CriErrorKind::Refused
        } else if says(&[
            "unexpected commit digest",
            "digest did not match",
            "digest mismatch",
        ]) {
            CriErrorKind::Corrupt
        } else if says(&["not found", "manifest unknown"]) {
            CriErrorKind::NotFound
        } else if says(&["invalid reference"]) {
            CriErrorKind::InvalidReference
        } else {
            CriErrorKind::Transient
        }
    }
}

/// A connected CRI client. Cheap to clone: clones share one HTTP/2 connection.
#[derive(Clone)]
pub struct CriClient {
    endpoint: CriEndpoint,
    channel: Channel,
    timeout: Duration,
}

impl CriClient {
    /// Connects, failing within `timeout` when nothing answers.
    pub async fn connect(endpoint: &CriEndpoint, timeout: Duration) -> Result<CriClient, CriError> {
        let unreachable = |cause: String| CriError {
            endpoint: endpoint.to_string(),
            rpc: "connect",
            kind: CriErrorKind::of(None, &cause),
            cause,
            unreachable: true,
        };
        let connecting = async {
            match endpoint {
                CriEndpoint::Unix(path) => {
                    let path = path.clone();
                    // The URI is required by tonic but unused: the connector dials the socket.
                    Endpoint::from_static("http://localhost")
                        .connect_with_connector(tower::service_fn(move |_| {
                            let path = path.clone();
                            async move {
                                tokio::net::UnixStream::connect(path)
                                    .await
                                    .map(TokioIo::new)
                            }
                        }))
                        .await
                }
                CriEndpoint::Tcp(addr) => {
                    Endpoint::from_shared(format!("http://{addr}"))
                        .map_err(|e| unreachable(e.to_string()))?
                        .connect()
                        .await
                }
            }
            .map_err(|e| unreachable(error_chain(&e)))
        };
        let channel = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| unreachable(format!("no answer within {timeout:?}")))??;
        Ok(CriClient {
            endpoint: endpoint.clone(),
            channel,
            timeout,
        })
    }

    pub fn endpoint(&self) -> &CriEndpoint {
        &self.endpoint
    }

    /// The connection, for containerd's own services on the same socket.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    /// Runs one RPC under `timeout`, turning failures into a [`CriError`] naming the call.
    async fn call<T>(
        &self,
        rpc: &'static str,
        timeout: Duration,
        request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        let answer = async { request.await.map(tonic::Response::into_inner) };
        self.call_within(rpc, timeout, answer).await
    }

    /// One call of another containerd service on the same socket (its content service), under this
    /// client's timeout, its failures as [`CriError`]s naming it.
    pub async fn call_content<T>(
        &self,
        rpc: &'static str,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, CriError> {
        self.call_within(rpc, self.timeout, call).await
    }

    /// [`CriClient::call_content`] under `timeout`, for calls that take long (applying a layer).
    pub async fn call_within<T>(
        &self,
        rpc: &'static str,
        timeout: Duration,
        request: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, CriError> {
        let error = |cause: String, unreachable: bool, kind: CriErrorKind| CriError {
            endpoint: self.endpoint.to_string(),
            rpc,
            cause,
            unreachable,
            kind,
        };
        match tokio::time::timeout(timeout, request).await {
            Err(_) => Err(error(
                format!("no answer within {timeout:?}"),
                false,
                CriErrorKind::Transient,
            )),
            Ok(Err(status)) => {
                let unreachable = status.code() == tonic::Code::Unavailable;
                let mut cause = if status.message().is_empty() {
                    error_chain(&status)
                } else {
                    status.message().to_string()
                };
                // A transport failure says only "transport error": what broke is in its sources.
                if let Some(source) = std::error::Error::source(&status) {
                    let chain = error_chain(source);
                    if chain.starts_with(&cause) {
                        cause = chain;
                    } else if !cause.contains(&chain) {
                        cause = format!("{cause}: {chain}");
                    }
                }
                let kind = CriErrorKind::of(Some(status.code()), &cause);
                Err(error(
                    format!("{} ({:?})", cause, status.code()),
                    unreachable,
                    kind,
                ))
            }
            Ok(Ok(answer)) => Ok(answer),
        }
    }

    /// The runtime's name and version. A runtime outside the supported-versions table is warned of, once
    /// per endpoint in a process ([`Runtime::outside_known`]).
    pub async fn version(&self) -> Result<VersionResponse, CriError> {
        let request = VersionRequest {
            version: "v1".into(),
        };
        let version = self
            .call("Version", self.timeout, self.runtime().version(request))
            .await?;
        static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        if let Some(warning) = Runtime::identify(&version.runtime_name, &version.runtime_version)
            .and_then(|r| r.outside_known())
        {
            let endpoint = self.endpoint.to_string();
            let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
            if !warned.contains(&endpoint) {
                tracing::warn!("{endpoint}: {warning}");
                warned.push(endpoint);
            }
        }
        Ok(version)
    }

    /// Why the runtime is not ready (its `RuntimeReady` condition is false), or None when it is.
    pub async fn not_ready(&self) -> Result<Option<String>, CriError> {
        let request = super::proto::cri::StatusRequest { verbose: false };
        let response = self
            .call("Status", self.timeout, self.runtime().status(request))
            .await?;
        let conditions = response.status.map(|s| s.conditions).unwrap_or_default();
        Ok(conditions
            .into_iter()
            .find(|c| c.r#type == "RuntimeReady" && !c.status)
            .map(|c| format!("RuntimeReady=false ({}: {})", c.reason, c.message)))
    }

    /// The CRI plugin's configuration as containerd reports it with CRI `Status` and `verbose`
    /// (`info["config"]`, JSON); None when the runtime reports none (CRI-O).
    pub async fn cri_config(&self) -> Result<Option<serde_json::Value>, CriError> {
        let request = super::proto::cri::StatusRequest { verbose: true };
        let response = self
            .call("Status", self.timeout, self.runtime().status(request))
            .await?;
        Ok(response
            .info
            .get("config")
            .and_then(|config| serde_json::from_str(config).ok()))
    }

    /// containerd's registry `config_path` (its hosts.toml directory), from [`CriClient::cri_config`]'s
    /// `registry.configPath`. None when the runtime does not report one (not set, or not containerd).
    pub async fn registry_config_path(&self) -> Result<Option<PathBuf>, CriError> {
        Ok(self
            .cri_config_text("registry", "configPath")
            .await?
            .map(PathBuf::from))
    }

    /// The snapshotter containerd's CRI plugin unpacks images with, from [`CriClient::cri_config`]'s
    /// `containerd.snapshotter`; containerd 2 no longer reports it there, so then from the image filesystem
    /// ImageFsInfo names, which is the snapshotter's root (`…/io.containerd.snapshotter.v1.<name>`). None
    /// when neither says.
    pub async fn cri_snapshotter(&self) -> Result<Option<String>, CriError> {
        if let Some(snapshotter) = self.cri_config_text("containerd", "snapshotter").await? {
            return Ok(Some(snapshotter));
        }
        let filesystems = self.image_fs_info().await?.image_filesystems;
        Ok(filesystems
            .iter()
            .filter_map(|fs| fs.fs_id.as_ref())
            .find_map(|id| snapshotter_of_root(&id.mountpoint)))
    }

    /// The text [`CriClient::cri_config`] holds at `section.key`, when it is set.
    async fn cri_config_text(&self, section: &str, key: &str) -> Result<Option<String>, CriError> {
        Ok(self.cri_config().await?.and_then(|config| {
            config[section][key]
                .as_str()
                .filter(|text| !text.is_empty())
                .map(str::to_string)
        }))
    }

    /// The image's record, or None when the runtime does not have it.
    pub async fn image_status(&self, image: &str) -> Result<Option<Image>, CriError> {
        let request = ImageStatusRequest {
            image: Some(spec(image)),
            verbose: false,
        };
        Ok(self
            .call(
                "ImageStatus",
                self.timeout,
                self.images().image_status(request),
            )
            .await?
            .image)
    }

    /// The image's OCI config as the runtime reports it with `verbose` (CRI-O: `info["info"]` holds
    /// `{"labels", "imageSpec"}`), or None when it does not (containerd, or the image is gone).
    pub async fn image_spec(&self, image: &str) -> Result<Option<serde_json::Value>, CriError> {
        let request = ImageStatusRequest {
            image: Some(spec(image)),
            verbose: true,
        };
        let response = self
            .call(
                "ImageStatus",
                self.timeout,
                self.images().image_status(request),
            )
            .await?;
        Ok(response
            .info
            .get("info")
            .and_then(|info| serde_json::from_str::<serde_json::Value>(info).ok())
            .map(|mut info| info["imageSpec"].take())
            .filter(|spec| spec.is_object()))
    }

    /// ImageStatus of each image, in the order given, a few at a time.
    pub async fn image_statuses(&self, images: &[String]) -> Vec<Result<Option<Image>, CriError>> {
        // Owned references: a future that borrows them is not Send-general enough for tokio::spawn.
        futures::stream::iter(images.to_vec())
            .map(|image| {
                let client = self.clone();
                async move { client.image_status(&image).await }
            })
            .buffered(STATUS_CONCURRENCY)
            .collect()
            .await
    }

    /// Each image's record, in the order given: from one ListImages when `listed` (the runtime's pins are
    /// reported there, and one call serves a whole set), else one ImageStatus per image. A listed record
    /// is an image's when one of its names resolves to the same thing ([`ImageRef::identity`]).
    pub async fn image_records(
        &self,
        references: &[String],
        listed: bool,
    ) -> Vec<Result<Option<Image>, CriError>> {
        if !listed {
            return self.image_statuses(references).await;
        }
        let listing = match self.list_images().await {
            Ok(listing) => listing,
            Err(e) => return references.iter().map(|_| Err(e.clone())).collect(),
        };
        let identity = |name: &str| ImageRef::parse(name).ok().map(|r| r.identity());
        let mut by_name = HashMap::new();
        for (i, image) in listing.iter().enumerate() {
            for name in image.repo_digests.iter().chain(&image.repo_tags) {
                if let Some(key) = identity(name) {
                    by_name.entry(key).or_insert(i);
                }
            }
        }
        references
            .iter()
            .map(|r| {
                Ok(identity(r)
                    .and_then(|key| by_name.get(&key))
                    .map(|&i| listing[i].clone()))
            })
            .collect()
    }

    pub async fn list_images(&self) -> Result<Vec<Image>, CriError> {
        let request = super::proto::cri::ListImagesRequest { filter: None };
        Ok(self
            .call(
                "ListImages",
                self.timeout,
                self.images().list_images(request),
            )
            .await?
            .images)
    }

    pub async fn image_fs_info(&self) -> Result<ImageFsInfoResponse, CriError> {
        self.call(
            "ImageFsInfo",
            self.timeout,
            self.images().image_fs_info(ImageFsInfoRequest {}),
        )
        .await
    }

    /// Pulls an image; returns the runtime's image reference. Pulls take long: `timeout` is the caller's.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        timeout: Duration,
    ) -> Result<String, CriError> {
        let request = PullImageRequest {
            image: Some(spec(image)),
            auth,
        };
        Ok(self
            .call("PullImage", timeout, self.images().pull_image(request))
            .await?
            .image_ref)
    }

    /// [`CriClient::pull_image`] through CRI's older `runtime.v1alpha2` API (its PullImage messages are
    /// v1's, field for field): what stargz-snapshotter 0.12's CRI keychain serves on its socket.
    pub async fn pull_image_v1alpha2(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        timeout: Duration,
    ) -> Result<String, CriError> {
        let request = PullImageRequest {
            image: Some(spec(image)),
            auth,
        };
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let pulling = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
            let path =
                http::uri::PathAndQuery::from_static("/runtime.v1alpha2.ImageService/PullImage");
            let codec = tonic_prost::ProstCodec::<PullImageRequest, PullImageResponse>::default();
            grpc.unary(tonic::Request::new(request), path, codec).await
        };
        Ok(self
            .call("PullImage (v1alpha2)", timeout, pulling)
            .await?
            .image_ref)
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let request = RemoveImageRequest {
            image: Some(spec(image)),
        };
        self.call(
            "RemoveImage",
            self.timeout,
            self.images().remove_image(request),
        )
        .await
        .map(drop)
    }
}

fn spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_string(),
        ..ImageSpec::default()
    }
}

/// An error and its sources, one line: tonic's top-level "transport error" alone says nothing.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// The snapshotter whose root `path` is: containerd names each `<root>/io.containerd.snapshotter.v1.<name>`.
fn snapshotter_of_root(path: &str) -> Option<String> {
    let name = std::path::Path::new(path).file_name()?.to_str()?;
    name.strip_prefix("io.containerd.snapshotter.v1.")
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshotter_is_named_by_its_root() {
        let of = |path: &str| snapshotter_of_root(path);
        assert_eq!(
            of("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs").as_deref(),
            Some("overlayfs")
        );
        assert_eq!(
            of("/var/lib/containerd/io.containerd.snapshotter.v1.stargz/").as_deref(),
            Some("stargz")
        );
        assert_eq!(of("/var/lib/containers/storage/overlay-images"), None);
        assert_eq!(of("/x/io.containerd.snapshotter.v1."), None);
    }

    #[test]
    fn endpoints_parse_like_crictl() {
        assert_eq!(
            "unix:///run/crio/crio.sock".parse(),
            Ok(CriEndpoint::Unix("/run/crio/crio.sock".into()))
        );
        assert_eq!(
            "/run/crio/crio.sock".parse(),
            Ok(CriEndpoint::Unix("/run/crio/crio.sock".into()))
        );
        assert_eq!(
            "tcp://10.0.0.5:10010".parse(),
            Ok(CriEndpoint::Tcp("10.0.0.5:10010".into()))
        );
        for bad in [
            "unix://relative.sock",
            "tcp://host",
            "tcp://:80",
            "http://x:1",
            "crio.sock",
        ] {
            let err = bad.parse::<CriEndpoint>().unwrap_err().to_string();
            assert!(
                err.contains("unix:///path/to/socket or tcp://host:port"),
                "{bad}: {err}"
            );
        }
        assert_eq!(CriEndpoint::Tcp("h:1".into()).to_string(), "tcp://h:1");
    }

    #[test]
    fn errors_are_classified_for_retries() {
        let kind = |cause: &str| CriErrorKind::of(Some(tonic::Code::Unknown), cause);
        assert_eq!(
            kind(
                "failed to pull and unpack image: failed to copy: write /x/ingest/data: no space left on device"
            ),
            CriErrorKind::NoSpace
        );
        assert_eq!(
            kind("failed to resolve reference \"r@sha256:1\": r@sha256:1: not found"),
            CriErrorKind::NotFound
        );
        assert_eq!(
            kind("reading manifest 1 in quay.io/x: manifest unknown"),
            CriErrorKind::NotFound
        );
        assert_eq!(
            kind("pulling from host r: 401 Unauthorized"),
            CriErrorKind::Refused
        );
        assert_eq!(
            kind("unexpected status from HEAD request to https://r/v2/x: 403 Forbidden"),
            CriErrorKind::Refused
        );
        assert_eq!(
            kind(
                "failed commit on ref \"layer-sha256:0f\": unexpected commit digest sha256:fa, expected sha256:0f: failed precondition"
            ),
            CriErrorKind::Corrupt
        );
        assert_eq!(
            kind("writing blob: Digest did not match, expected sha256:0f, got sha256:fa"),
            CriErrorKind::Corrupt
        );
        assert_eq!(
            kind("parsing image name \"UPPER\": invalid reference format"),
            CriErrorKind::InvalidReference
        );
        assert_eq!(
            kind("read tcp: connection reset by peer"),
            CriErrorKind::Transient
        );
        assert_eq!(
            CriErrorKind::of(None, "no answer within 5s"),
            CriErrorKind::Transient
        );
        // The code decides where the words do not: refused, unless the disk is full.
        let denied = |cause: &str| CriErrorKind::of(Some(tonic::Code::PermissionDenied), cause);
        assert_eq!(denied("pulling from host r"), CriErrorKind::Refused);
        assert_eq!(
            denied("write /x: no space left on device"),
            CriErrorKind::NoSpace
        );
        assert_eq!(
            kind("PullImage: ... 401 Unauthorized, repository not found"),
            CriErrorKind::Refused
        );
    }

    #[test]
    fn auth_config_debug_never_shows_secrets() {
        let auth = AuthConfig {
            username: "admin".into(),
            password: "hunter2".into(),
            auth: "YWRtaW46aHVudGVyMg==".into(),
            identity_token: "tok-123".into(),
            registry_token: "reg-456".into(),
            server_address: "quay.io".into(),
        };
        let text = format!(
            "{auth:?} {:?}",
            PullImageRequest {
                image: None,
                auth: Some(auth.clone())
            }
        );
        for secret in ["hunter2", "YWRtaW46aHVudGVyMg==", "tok-123", "reg-456"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(text.contains("admin") && text.contains("<redacted>"));
    }

    #[tokio::test]
    async fn unreachable_socket_names_endpoint_and_cause() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = CriEndpoint::Unix(dir.path().join("nothing.sock"));
        let err = CriClient::connect(&endpoint, Duration::from_secs(2))
            .await
            .err()
            .unwrap();
        assert!(err.unreachable);
        assert_eq!(err.kind, CriErrorKind::Transient);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "CRI endpoint unix://{}/nothing.sock: connect:",
                dir.path().display()
            )),
            "{text}"
        );
        assert!(text.contains("No such file or directory"), "{text}");
    }
}

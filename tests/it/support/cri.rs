//! A minimal CRI client of the lab's own, independent of pinboard's (its messages written here from CRI's
//! field numbers): the runtime's own word in tests, as `crictl` would give it, and a kubelet's pull by tag.
//! Each call runs on a thread of its own, so it can be made from sync code and from inside a runtime.

use std::future::Future;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
struct ImageSpec {
    #[prost(string, tag = "1")]
    image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    image: Option<CriImage>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListImagesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
struct ListImagesResponse {
    #[prost(message, repeated, tag = "1")]
    images: Vec<CriImage>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AuthConfig {
    #[prost(string, tag = "1")]
    username: String,
    #[prost(string, tag = "2")]
    password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PullImageRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageSpec>,
    #[prost(message, optional, tag = "2")]
    auth: Option<AuthConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PullImageResponse {
    #[prost(string, tag = "1")]
    image_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RemoveImageRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RemoveImageResponse {}

#[derive(Clone, PartialEq, prost::Message)]
struct VersionRequest {
    #[prost(string, tag = "1")]
    version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct VersionResponse {
    #[prost(string, tag = "2")]
    runtime_name: String,
    #[prost(string, tag = "3")]
    runtime_version: String,
}

/// An image as the runtime's CRI reports it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CriImage {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub repo_digests: Vec<String>,
    #[prost(bool, tag = "8")]
    pub pinned: bool,
}

impl CriImage {
    /// Whether `name` is one of its tags or digests.
    pub fn known_as(&self, name: &str) -> bool {
        self.repo_tags
            .iter()
            .chain(&self.repo_digests)
            .any(|n| n == name)
    }
}

/// The image ID the CRI runtime at `socket` reports for `image` (ImageStatus), `None` if it has no such
/// image.
pub(crate) fn image_id(socket: &Path, image: &str) -> Result<Option<String>> {
    let request = ImageStatusRequest { image: spec(image) };
    let response: ImageStatusResponse = call(socket, "ImageService/ImageStatus", request)?;
    Ok(response.image.map(|image| image.id))
}

/// Every image the runtime lists (ListImages), with its `pinned`.
pub fn list_images(socket: &Path) -> Result<Vec<CriImage>> {
    let response: ListImagesResponse =
        call(socket, "ImageService/ListImages", ListImagesRequest {})?;
    Ok(response.images)
}

/// Pulls `image` as a kubelet does (PullImage), with `login` (`USER:PASSWORD`) when given; the image's
/// reference as the runtime answers it.
pub(crate) fn pull_image(socket: &Path, image: &str, login: Option<&str>) -> Result<String> {
    let auth = login.map(|login| {
        let (username, password) = login.split_once(':').unwrap_or((login, ""));
        AuthConfig {
            username: username.into(),
            password: password.into(),
        }
    });
    let request = PullImageRequest {
        image: spec(image),
        auth,
    };
    let response: PullImageResponse = call(socket, "ImageService/PullImage", request)?;
    Ok(response.image_ref)
}

/// Removes `image` (RemoveImage), as `crictl rmi` or the kubelet's image GC does.
pub(crate) fn remove_image(socket: &Path, image: &str) -> Result<()> {
    let request = RemoveImageRequest { image: spec(image) };
    let _: RemoveImageResponse = call(socket, "ImageService/RemoveImage", request)?;
    Ok(())
}

/// `NAME VERSION` as the runtime's CRI Version names itself: `containerd 2.1.9+unknown`.
pub fn version(socket: &Path) -> Result<String> {
    let request = VersionRequest {
        version: "v1".into(),
    };
    let response: VersionResponse = call(socket, "RuntimeService/Version", request)?;
    Ok(format!(
        "{} {}",
        response.runtime_name, response.runtime_version
    ))
}

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_owned(),
    })
}

/// One unary CRI call `/runtime.v1.<method>` on the runtime at `socket`.
fn call<Req, Resp>(socket: &Path, method: &'static str, request: Req) -> Result<Resp>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let socket = socket.to_owned();
    on_own_thread(async move {
        let mut client = tonic::client::Grpc::new(connect(socket).await?);
        client.ready().await.context("CRI channel")?;
        let path = format!("/runtime.v1.{method}");
        let response: tonic::Response<Resp> = client
            .unary(
                tonic::Request::new(request),
                PathAndQuery::try_from(path).expect("a valid path"),
                ProstCodec::default(),
            )
            .await
            .with_context(|| format!("CRI {method}"))?;
        Ok(response.into_inner())
    })
}

/// Runs `work` to completion on a thread and runtime of its own.
fn on_own_thread<T: Send>(work: impl Future<Output = Result<T>> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(work)
            })
            .join()
            .expect("CRI client thread panicked")
    })
}

async fn connect(socket: PathBuf) -> Result<tonic::transport::Channel> {
    // The URI is required but unused: the connector below always dials the unix socket.
    tonic::transport::Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .context("connecting to the CRI socket")
}

//! A minimal CRI client of the lab's own (ImageStatus only), independent of pinboard's, used to check that
//! an image pre-loaded on a node is what the node's CRI plugin reports.

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
    image: Option<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Image {
    #[prost(string, tag = "1")]
    id: String,
}

/// The image ID the CRI runtime at `socket` reports for `image` (ImageStatus), `None` if it has no such
/// image. Runs on a thread of its own, so it can be called from sync code and from inside a runtime.
pub(crate) fn image_id(socket: &Path, image: &str) -> Result<Option<String>> {
    let socket = socket.to_owned();
    let request = ImageStatusRequest {
        image: Some(ImageSpec {
            image: image.to_owned(),
        }),
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(image_status(socket, request))
            })
            .join()
            .expect("CRI client thread panicked")
    })
}

async fn image_status(socket: PathBuf, request: ImageStatusRequest) -> Result<Option<String>> {
    // The URI is required but unused: the connector below always dials the unix socket.
    let channel = tonic::transport::Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .context("connecting to the CRI socket")?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.context("CRI channel")?;
    let response: tonic::Response<ImageStatusResponse> = client
        .unary(
            tonic::Request::new(request),
            PathAndQuery::from_static("/runtime.v1.ImageService/ImageStatus"),
            ProstCodec::default(),
        )
        .await
        .context("CRI ImageStatus")?;
    Ok(response.into_inner().image.map(|image| image.id))
}

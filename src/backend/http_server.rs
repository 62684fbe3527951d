//! The HTTP/1.1 listener under pinboard's registry endpoints ([`super::blobs::Endpoint`],
//! [`super::blobs::Relay`]) and the agent's metrics page: accepts connections and hands each request to the
//! handler until stopped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// A running listener. Stop it with [`Server::stop`]; dropping it stops it too.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `listen` (port 0: any free port) and answers each request with `handle`.
    pub async fn start<H, F, B>(listen: SocketAddr, handle: H) -> std::io::Result<Server>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, handle, stopped));
        tracing::debug!(%addr, "listening");
        Ok(Server {
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address it listens on (with the port chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`: what a node's mirror configuration names.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops listening and closes every connection.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Accepts connections until told to stop; dropping the set of connections closes them all.
async fn accept<H, F, B>(listener: TcpListener, handle: H, mut stopped: oneshot::Receiver<()>)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stopped => break,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, "registry endpoint cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = handle(request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "registry endpoint connection ended");
            }
        });
    }
}

/// A response body with nothing in it, for an endpoint whose bodies fail with `E`.
pub fn empty_body<E>() -> UnsyncBoxBody<Bytes, E> {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A response body of `bytes`, for an endpoint whose bodies fail with `E`.
pub fn full_body<E>(bytes: Bytes) -> UnsyncBoxBody<Bytes, E> {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

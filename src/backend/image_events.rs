//! containerd's image events (`/images/create`, `/images/update`, `/images/delete` in namespace `k8s.io`),
//! heard over the events service on the CRI socket: an agent checks its node at once when an image or its
//! pin label changes, instead of at its next periodic check. CRI-O has no such service: its agents check
//! only periodically.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::cri::{CriClient, CriEndpoint};
use super::proto::containerd_events::SubscribeRequest;
use super::proto::containerd_events::events_client::EventsClient;

/// The events of images in the namespace CRI uses.
const FILTER: &str = r#"namespace=="k8s.io",topic~="^/images/""#;
/// How long to wait before subscribing again after the stream broke (containerd restarting).
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(5);

/// Sends `()` for every image event on `endpoint`, resubscribing when the stream breaks. The channel
/// closes when the runtime has no events service (CRI-O).
pub fn image_changes(endpoint: CriEndpoint, timeout: Duration) -> UnboundedReceiver<()> {
    let (changes, received) = unbounded_channel();
    tokio::spawn(async move {
        loop {
            let subscribed = async {
                let client = CriClient::connect(&endpoint, timeout).await.ok()?;
                let request = SubscribeRequest {
                    filters: vec![FILTER.to_string()],
                };
                Some(EventsClient::new(client.channel()).subscribe(request).await)
            };
            match subscribed.await {
                Some(Ok(stream)) => {
                    tracing::debug!("following the runtime's image events");
                    let mut stream = stream.into_inner();
                    while let Some(Ok(_)) = stream.next().await {
                        if changes.send(()).is_err() {
                            return;
                        }
                    }
                }
                Some(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                    tracing::debug!("the runtime announces no image events: periodic checks only");
                    return;
                }
                Some(Err(status)) => {
                    tracing::debug!(
                        "cannot follow the runtime's image events: {}",
                        status.message()
                    )
                }
                None => {}
            }
            if changes.is_closed() {
                return;
            }
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
        }
    });
    received
}

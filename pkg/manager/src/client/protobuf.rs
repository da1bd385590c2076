//! The informer's client: the shared client's requests, asking the API server for protobuf, each answer
//! read back as the JSON of only the fields the informer decodes (`netcm-protobuf`).
//!
//! kube-apiserver encodes a Node in protobuf for about a third of the CPU its JSON costs; on a cluster
//! where the API server is the bottleneck that CPU is every controller's. kube-rs decodes only JSON, so
//! this client sits between kube-runtime's watcher and the shared client: it adds an `Accept` header and
//! turns what comes back into JSON (a list page or a Status whole, a watch stream frame by frame), which
//! the watcher then reads as ever. An answer in JSON (a proxy that drops the header) passes through.

use std::convert::Infallible;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use kube::client::Body;
use netcm_protobuf::{transcode_object, WatchFrames, PROTOBUF};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Transcoded = UnsyncBoxBody<Bytes, BoxError>;

/// What the informer asks for: protobuf first, JSON if the server has no protobuf for the kind.
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

/// A client that sends every request through `shared` and asks for protobuf on every GET, handing
/// kube JSON. Only for the Node informer: other kinds' answers are refused by name, not guessed at.
pub fn node_informer_client(shared: kube::Client) -> kube::Client {
    let namespace = shared.default_namespace().to_string();
    let service = tower::service_fn(move |request: Request<Body>| {
        let shared = shared.clone();
        async move { transcoded(shared, request).await }
    });
    kube::Client::new(service, namespace)
}

async fn transcoded(
    shared: kube::Client,
    mut request: Request<Body>,
) -> Result<Response<Transcoded>, kube::Error> {
    if request.method() == Method::GET {
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static(ACCEPT_PROTOBUF));
    }
    let response = shared.send(request).await?;
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if !content_type.starts_with(PROTOBUF) {
        return Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()));
    }
    let (mut parts, body) = response.into_parts();
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(CONTENT_LENGTH);
    let body = if content_type.contains("stream=watch") {
        watch_body(body)
    } else {
        let bytes = body.collect().await?.to_bytes();
        let json = transcode_object(&bytes).map_err(|e| kube::Error::Service(Box::new(e)))?;
        Full::new(Bytes::from(json))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    };
    Ok(Response::from_parts(parts, body))
}

/// A protobuf watch as JSON lines, one per event, each sent as soon as its frame is complete. A frame
/// that cannot be read ends the watch with an error, and the watcher starts over from what it saw last.
fn watch_body(body: Body) -> Transcoded {
    let chunks = body
        .into_data_stream()
        .map_err(BoxError::from)
        .map(Some)
        .chain(futures::stream::once(async { None }));
    let events = chunks.scan(WatchFrames::new(), |frames, chunk| {
        let next = match chunk {
            Some(Ok(bytes)) => frames.push(&bytes).map(Bytes::from).map_err(BoxError::from),
            Some(Err(e)) => Err(e),
            None => frames
                .finish()
                .map(|()| Bytes::new())
                .map_err(BoxError::from),
        };
        futures::future::ready(Some(next.map(Frame::data)))
    });
    StreamBody::new(events).boxed_unsync()
}

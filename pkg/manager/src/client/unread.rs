//! Writes whose answer netcm does not read. The API server answers a PATCH or a create with the whole
//! object — 8 KB for a realistic Node — and kube's typed calls decode it into a full `Node` (about 300
//! allocations) only for the caller to drop it. These send the same request through the same client
//! (token bucket, fence, deadline, metrics: the layer judges by method) and skip the body unbuilt.
//!
//! They also ask the API server to answer with the object's metadata only ([`METADATA_ANSWER`]):
//! encoding the whole Node in JSON for every write costs kube-apiserver CPU on bytes nobody reads, and
//! netcm CPU to receive them (see `CEILING_METADATA_ANSWER=1 hack/bench.sh allocation`). An error is
//! still a JSON `Status`, so it keeps its code.

use http::header::{HeaderValue, ACCEPT};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::IgnoredAny;
use serde::Serialize;

/// PATCHes `name` like [`Api::patch`], without decoding the answer.
pub async fn patch_unread<K, P>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    patch: &Patch<P>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone,
    P: Serialize + std::fmt::Debug,
{
    let request = kube::core::Request::new(api.resource_url())
        .patch(name, params, patch)
        .map_err(kube::Error::BuildRequest)?;
    send_unread(api, request).await
}

/// Creates `object` like [`Api::create`], without decoding the answer.
pub async fn create_unread<K, T>(
    api: &Api<K>,
    params: &PostParams,
    object: &T,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone,
    T: Serialize,
{
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(api.resource_url())
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    send_unread(api, request).await
}

/// What an unread write accepts: the object's metadata alone (`PartialObjectMetadata`, which every
/// resource of an API server since 1.15 can answer with, custom ones too), else plain JSON. The second
/// choice is what an error's `Status` is written in: the API server never transforms a `Status`, and
/// with no plain choice it would answer an error with 406 and lose its code.
pub const METADATA_ANSWER: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json";

/// `request`, asking for [`METADATA_ANSWER`].
pub fn asking_for_metadata<B>(mut request: http::Request<B>) -> http::Request<B> {
    request
        .headers_mut()
        .insert(ACCEPT, HeaderValue::from_static(METADATA_ANSWER));
    request
}

/// Sends `request` through `api`'s client, asking for the metadata alone; an error status is still a
/// typed `kube::Error`.
async fn send_unread<K: kube::Resource + Clone>(
    api: &Api<K>,
    request: http::Request<Vec<u8>>,
) -> Result<(), kube::Error> {
    let request = asking_for_metadata(request);
    api.clone()
        .into_client()
        .request::<IgnoredAny>(request)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use k8s_openapi::api::core::v1::Node;
    use kube::client::Body;

    use super::*;

    /// A client whose every request is answered `{}` at once, the `Accept` header of each recorded.
    fn recording_client() -> (kube::Client, Arc<Mutex<Vec<Option<String>>>>) {
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let recorded = seen.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let accept = request
                .headers()
                .get(ACCEPT)
                .map(|v| v.to_str().expect("ASCII").to_string());
            recorded.lock().expect("seen").push(accept);
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .header("content-type", "application/json")
                        .body(Body::from(b"{}".to_vec()))
                        .expect("response"),
                )
            }
        });
        (kube::Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn an_unread_patch_and_create_ask_for_the_metadata_alone_with_plain_json_for_errors() {
        let (client, seen) = recording_client();
        let nodes: Api<Node> = Api::all(client);
        let patch = serde_json::json!({"spec": {"podCIDR": "10.0.0.0/24"}});
        patch_unread(&nodes, "n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("answered");
        let node = Node::default();
        create_unread(&nodes, &PostParams::default(), &node)
            .await
            .expect("answered");
        let seen = seen.lock().expect("seen").clone();
        assert_eq!(seen, vec![Some(METADATA_ANSWER.to_string()); 2]);
        assert!(METADATA_ANSWER.ends_with(", application/json"));
    }
}

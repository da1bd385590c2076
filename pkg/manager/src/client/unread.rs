//! Writes whose answer netcm does not read. The API server answers a PATCH or a create with the whole
//! object — 8 KB for a realistic Node — and kube's typed calls decode it into a full `Node` (about 300
//! allocations) only for the caller to drop it. These send the same request through the same client
//! (token bucket, fence, deadline, metrics: the layer judges by method) and read no answer but an error.
//!
//! They ask for the answer in protobuf ([`UNREAD_ANSWER`]): encoding the Node is the largest part of a
//! write's cost to kube-apiserver that the writer chooses, and protobuf costs it the least — less than
//! JSON, and less than JSON of the metadata alone, whose conversion and encoding cost about what the
//! whole Node's JSON does (`hack/bench.sh patch-cost`). A kind with no protobuf (a custom resource)
//! is answered in JSON. An error's `Status` comes in either, and is read back with its code and message.

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::client::Body;
use netcm_protobuf::{transcode_object, PROTOBUF};
use serde::Serialize;

/// PATCHes `name` like [`Api::patch`], without reading the answer.
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

/// Creates `object` like [`Api::create`], without reading the answer.
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

/// What an unread write accepts: protobuf, else JSON (a custom resource's only encoding).
pub const UNREAD_ANSWER: &str = "application/vnd.kubernetes.protobuf, application/json";

/// `request`, asking for [`UNREAD_ANSWER`].
pub fn asking_for_protobuf<B>(mut request: http::Request<B>) -> http::Request<B> {
    request
        .headers_mut()
        .insert(ACCEPT, HeaderValue::from_static(UNREAD_ANSWER));
    request
}

/// Sends `request` through `api`'s client asking for [`UNREAD_ANSWER`]; an error's `Status` is a typed
/// `kube::Error::Api`, whichever encoding it came in.
async fn send_unread<K: kube::Resource + Clone>(
    api: &Api<K>,
    request: http::Request<Vec<u8>>,
) -> Result<(), kube::Error> {
    let request = asking_for_protobuf(request).map(Body::from);
    let response = api.clone().into_client().send(request).await?;
    let status = response.status();
    let protobuf = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(PROTOBUF));
    // Read to the end, so the connection can carry the next request.
    let body = response.into_body().collect().await?.to_bytes();
    if status.is_success() {
        return Ok(());
    }
    Err(kube::Error::Api(
        refusal(status.as_u16(), protobuf, &body).boxed(),
    ))
}

/// The `Status` of a refused write: decoded from its answer, else one naming the HTTP code and what came.
fn refusal(code: u16, protobuf: bool, body: &Bytes) -> kube::core::Status {
    let json = if protobuf {
        transcode_object(body).ok()
    } else {
        Some(body.to_vec())
    };
    match json.and_then(|j| serde_json::from_slice::<kube::core::Status>(&j).ok()) {
        Some(status) if status.code == code => status,
        Some(status) => status.with_code(code),
        None => kube::core::Status::failure(
            &String::from_utf8_lossy(&body[..body.len().min(512)]),
            "Unknown",
        )
        .with_code(code),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use k8s_openapi::api::core::v1::Node;
    use kube::client::Body;

    use super::*;

    /// A client whose every request is answered at once with `status`, `content_type` and `body`, the
    /// `Accept` header of each recorded.
    fn answering_client(
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    ) -> (kube::Client, Arc<Mutex<Vec<Option<String>>>>) {
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let recorded = seen.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let accept = request
                .headers()
                .get(ACCEPT)
                .map(|v| v.to_str().expect("ASCII").to_string());
            recorded.lock().expect("seen").push(accept);
            let body = body.clone();
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(status)
                        .header("content-type", content_type)
                        .body(Body::from(body))
                        .expect("response"),
                )
            }
        });
        (kube::Client::new(service, "default"), seen)
    }

    /// A protobuf `Status` as the API server writes one: the envelope, then status, message, reason and
    /// code.
    fn protobuf_status(code: u16, reason: &str, message: &str) -> Vec<u8> {
        fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
            let mut out = vec![(number << 3) | 2, u8::try_from(bytes.len()).expect("short")];
            out.extend_from_slice(bytes);
            out
        }
        let [low, high] = code.to_le_bytes();
        // The code as a varint: seven bits a byte, low first (codes need two bytes).
        let code = [0x80 | (low & 0x7f), (low >> 7) | (high << 1)];
        let type_meta = [field(1, b"v1"), field(2, b"Status")].concat();
        let status = [
            field(2, b"Failure"),
            field(3, message.as_bytes()),
            field(4, reason.as_bytes()),
            vec![6 << 3],
            code.to_vec(),
        ]
        .concat();
        let unknown = [field(1, &type_meta), field(2, &status)].concat();
        [b"k8s\0".to_vec(), unknown].concat()
    }

    #[tokio::test]
    async fn an_unread_patch_and_create_ask_for_protobuf_with_json_for_kinds_without_it() {
        let (client, seen) = answering_client(200, PROTOBUF, b"k8s\0 not read".to_vec());
        let nodes: Api<Node> = Api::all(client);
        let patch = serde_json::json!({"spec": {"podCIDR": "10.0.0.0/24"}});
        patch_unread(&nodes, "n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("answered");
        create_unread(&nodes, &PostParams::default(), &Node::default())
            .await
            .expect("answered");
        let seen = seen.lock().expect("seen").clone();
        assert_eq!(seen, vec![Some(UNREAD_ANSWER.to_string()); 2]);
        assert!(UNREAD_ANSWER.ends_with(", application/json"));
    }

    #[tokio::test]
    async fn a_refusal_keeps_its_code_reason_and_message_in_protobuf_and_in_json() {
        let pb = protobuf_status(422, "Invalid", "the test failed");
        let (client, _) = answering_client(422, PROTOBUF, pb);
        let nodes: Api<Node> = Api::all(client);
        let patch = serde_json::json!({});
        let refused =
            patch_unread(&nodes, "n1", &PatchParams::default(), &Patch::Merge(&patch)).await;
        match refused {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
                assert_eq!(s.message, "the test failed");
            }
            other => panic!("{other:?}"),
        }
        let json = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"exists","reason":"AlreadyExists","code":409}"#;
        let (client, _) = answering_client(409, "application/json", json.to_vec());
        let nodes: Api<Node> = Api::all(client);
        let taken = create_unread(&nodes, &PostParams::default(), &Node::default()).await;
        assert!(
            matches!(&taken, Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists"),
            "{taken:?}"
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_no_status_still_carries_the_http_code() {
        let (client, _) = answering_client(503, "text/plain", b"upstream gone".to_vec());
        let nodes: Api<Node> = Api::all(client);
        let patch = serde_json::json!({});
        let failed =
            patch_unread(&nodes, "n1", &PatchParams::default(), &Patch::Merge(&patch)).await;
        assert!(
            matches!(&failed, Err(kube::Error::Api(s)) if s.code == 503 && s.message.contains("upstream gone")),
            "{failed:?}"
        );
    }
}

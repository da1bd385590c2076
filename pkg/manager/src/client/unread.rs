//! Writes whose answer netcm does not read. The API server answers a PATCH or a create with the whole
//! object — 8 KB for a realistic Node — and kube's typed calls decode it into a full `Node` (about 300
//! allocations) only for the caller to drop it. These send the same request through the same client
//! (token bucket, fence, deadline, metrics: the layer judges by method) and skip the body unbuilt.

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

/// Sends `request` through `api`'s client; an error status is still a typed `kube::Error`.
async fn send_unread<K: kube::Resource + Clone>(
    api: &Api<K>,
    request: http::Request<Vec<u8>>,
) -> Result<(), kube::Error> {
    api.clone()
        .into_client()
        .request::<IgnoredAny>(request)
        .await
        .map(drop)
}

//! netcm's unread writes against the real API server: a Node's answered in protobuf (the encoding that
//! costs the server least), a claim's — a custom resource has no protobuf — in JSON, and each refused
//! with the code netcm's decisions rest on: a failed fence test is 422, a claim taken already is 409.

use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use netcm_e2e::{pod_cidr_claims, TestEnv};
use netcm_manager::client::unread::{
    asking_for_protobuf, create_unread, patch_unread, UNREAD_ANSWER,
};
use serde_json::json;

/// A Node as a kubelet registers it, status and all.
async fn registered_node(client: &kube::Client, name: &str) -> Node {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": {"cpu": "4", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "addresses": [{"type": "InternalIP", "address": "192.0.2.9"}]}
    }))
    .expect("a Node");
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create the Node")
}

/// A PodCIDRClaim of `cidr`, named as netcm names it.
fn claim(name: &str, cidr: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "ipam.netcm.io/v1alpha1", "kind": "PodCIDRClaim",
        "metadata": {"name": name}, "spec": {"cidr": cidr}
    }))
    .expect("a claim")
}

/// The content type and body of the answer to `request`, sent as an unread write asks.
async fn answer(client: &kube::Client, request: http::Request<Vec<u8>>) -> (String, Vec<u8>) {
    let request = asking_for_protobuf(request);
    assert_eq!(
        request.headers().get(ACCEPT).map(|v| v.as_bytes()),
        Some(UNREAD_ANSWER.as_bytes())
    );
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .expect("the write is answered");
    assert!(response.status().is_success(), "{:?}", response.status());
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response.into_body().collect().await.expect("the body");
    (content_type, body.to_bytes().to_vec())
}

#[tokio::test]
async fn an_unread_write_is_answered_in_protobuf_for_a_node_and_in_json_for_a_claim() {
    let env = TestEnv::new().await;
    registered_node(&env.client, "unread-protobuf").await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let patch = json!({"spec": {"podCIDR": "10.9.0.0/24", "podCIDRs": ["10.9.0.0/24"]}});
    let request = kube::core::Request::new(nodes.resource_url())
        .patch(
            "unread-protobuf",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .expect("a PATCH");
    let (content_type, body) = answer(&env.client, request).await;
    assert!(
        content_type.starts_with("application/vnd.kubernetes.protobuf"),
        "{content_type}"
    );
    assert!(body.starts_with(b"k8s\0"), "a protobuf envelope");
    let written = nodes.get("unread-protobuf").await.expect("the Node");
    assert_eq!(
        written.spec.and_then(|s| s.pod_cidr).as_deref(),
        Some("10.9.0.0/24")
    );

    let claims = pod_cidr_claims(&env.client);
    let request = kube::core::Request::new(claims.resource_url())
        .create(
            &PostParams::default(),
            serde_json::to_vec(&claim("10-9-0-0-16", "10.9.0.0/16")).expect("JSON"),
        )
        .expect("a POST");
    let (content_type, body) = answer(&env.client, request).await;
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let created: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(created["spec"]["cidr"], "10.9.0.0/16");
}

#[tokio::test]
async fn a_refused_unread_write_keeps_its_code_a_failed_test_422_and_a_taken_claim_409() {
    let env = TestEnv::new().await;
    registered_node(&env.client, "unread-refused").await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let fence: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": "not-this-node"},
        {"op": "add", "path": "/spec/podCIDR", "value": "10.9.1.0/24"},
    ]))
    .expect("a JSON Patch");
    let refused = patch_unread(
        &nodes,
        "unread-refused",
        &PatchParams::default(),
        &Patch::Json::<()>(fence),
    )
    .await;
    // Answered in protobuf, read back whole: the code, and the API server's own words.
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422 && s.reason == "Invalid" && s.message.contains("rejected our request")),
        "{refused:?}"
    );
    let untouched = nodes.get("unread-refused").await.expect("the Node");
    assert_eq!(untouched.spec.and_then(|s| s.pod_cidr), None);

    let claims = pod_cidr_claims(&env.client);
    let block = claim("10-9-0-0-16", "10.9.0.0/16");
    create_unread(&claims, &PostParams::default(), &block)
        .await
        .expect("the first claim is created");
    let taken = create_unread(&claims, &PostParams::default(), &block).await;
    assert!(
        matches!(&taken, Err(kube::Error::Api(s)) if s.code == 409),
        "{taken:?}"
    );
}

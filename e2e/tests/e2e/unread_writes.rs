//! netcm's unread writes against the real API server: answered with the object's metadata alone (a Node's
//! status is never encoded for an answer nobody reads), and refused with the code netcm's decisions
//! rest on — a failed fence test is 422, a claim taken already is 409.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use netcm_e2e::{pod_cidr_claims, TestEnv};
use netcm_manager::client::unread::{asking_for_metadata, create_unread, patch_unread};
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

/// The answer to `request` sent asking for metadata alone, checked to be a `PartialObjectMetadata`.
async fn metadata_answer(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> serde_json::Value {
    let answer = client
        .request_text(asking_for_metadata(request))
        .await
        .expect("the write is answered");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("a JSON answer");
    assert_eq!(answer["kind"], "PartialObjectMetadata", "{answer}");
    answer
}

#[tokio::test]
async fn an_unread_write_is_answered_with_the_metadata_alone_of_a_node_and_of_a_claim() {
    let env = TestEnv::new().await;
    let node = registered_node(&env.client, "unread-metadata").await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let patch = json!({"spec": {"podCIDR": "10.9.0.0/24", "podCIDRs": ["10.9.0.0/24"]}});
    let request = kube::core::Request::new(nodes.resource_url())
        .patch(
            "unread-metadata",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .expect("a PATCH");
    let answer = metadata_answer(&env.client, request).await;
    assert_eq!(answer["metadata"]["uid"], json!(node.metadata.uid));
    assert!(
        answer.get("status").is_none() && answer.get("spec").is_none(),
        "{answer}"
    );
    let written = nodes.get("unread-metadata").await.expect("the Node");
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
    let answer = metadata_answer(&env.client, request).await;
    assert!(answer.get("spec").is_none(), "{answer}");
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
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
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

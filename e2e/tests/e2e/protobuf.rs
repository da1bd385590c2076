//! The Node informer's protobuf client (`--kube-api-content-type`'s default) against the real API
//! server: every Node it reads is cached exactly as the full JSON Node, trimmed, would be; a watch
//! through it sees changes and deletions; and the API server's errors keep their codes, so
//! kube-runtime's watcher still relists on a 410.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher::{self, watcher, Event};
use kube::ResourceExt;
use netcm_e2e::{wait_for, TestEnv};
use netcm_manager::client::protobuf::node_informer_client;
use netcm_manager::node_fields::WireNode;
use netcm_manager::{CachedNode, NodeFields};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Every field a declaration can keep (of managedFields: every manager's annotations but netcm's).
fn everything() -> NodeFields {
    let mut f = NodeFields::none()
        .pod_cidrs()
        .taints()
        .addresses()
        .capacity_pods();
    f.unschedulable = true;
    f.provider_id = true;
    ["Ready", "NetworkUnavailable"]
        .into_iter()
        .fold(f, |f, t| f.condition(t))
        .annotations("")
        .labels("")
        .annotation_owners("", "netcm")
}

/// Nodes with every field netcm reads, written by others in every shape the API accepts.
async fn create_fixtures(client: &kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    let full = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "pb-full", "labels": {"kubernetes.io/hostname": "pb-full", "empty": ""},
                     "annotations": {"flannel.alpha.coreos.com/backend-data": "{\"VNI\":1}",
                                     "odd": "tab\tnewline\n\u{1}z\u{e9}\u{1F600}", "blank": ""}},
        "spec": {"podCIDR": "10.7.0.0/24", "podCIDRs": ["10.7.0.0/24", "fd00:7::/64"],
                 "providerID": "aws:///zone/i-1", "unschedulable": true,
                 "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}, {"key": "bare", "effect": "NoExecute"}]},
        "status": {"capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                   "conditions": [
                       {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "a \"quoted\" message"},
                       {"type": "NetworkUnavailable", "status": "False"}],
                   "addresses": [{"type": "InternalIP", "address": "192.0.2.7"},
                                 {"type": "InternalIP", "address": "2001:db8::7"},
                                 {"type": "Hostname", "address": "pb-full"}]}
    });
    let bare = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "pb-bare"}});
    let held = json!({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": "pb-deleting", "finalizers": ["example.io/hold"]}});
    for node in [full, bare, held] {
        let node: Node = serde_json::from_value(node).expect("a Node");
        nodes
            .create(&pp, &node)
            .await
            .expect("create a fixture Node");
    }
    nodes
        .delete("pb-deleting", &DeleteParams::default())
        .await
        .expect("delete the held Node");
}

/// What each Node is cached as, read through `client` as a `WireNode`, by name.
async fn cached_through(client: kube::Client) -> Vec<CachedNode> {
    let api: Api<WireNode> = Api::all(client);
    let fields = everything();
    // Pages of two: the protobuf list carries its continue token through the transcoding.
    let mut cached = Vec::new();
    let mut params = ListParams::default().labels("!absent").limit(2);
    loop {
        let page = api.list(&params).await.expect("a list page");
        cached.extend(page.items.into_iter().map(|w| fields.keep(w)));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    cached.sort_by(|a, b| a.name().cmp(b.name()));
    cached
}

#[tokio::test]
async fn through_protobuf_every_node_is_cached_as_the_full_json_node_trimmed_would_be() {
    let env = TestEnv::new().await;
    create_fixtures(&env.client).await;
    let through_protobuf = cached_through(node_informer_client(env.client.clone())).await;
    let fields = everything();
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut reference: Vec<CachedNode> = nodes
        .list(&ListParams::default())
        .await
        .expect("list Nodes as JSON")
        .items
        .into_iter()
        .map(|mut n| {
            fields.trim(&mut n);
            CachedNode::from(&n)
        })
        .collect();
    reference.sort_by(|a, b| a.name().cmp(b.name()));
    assert_eq!(through_protobuf, reference);
    // Not vacuous: the fixtures carry what the comparison is about.
    assert_eq!(through_protobuf.len(), 3);
    let full = &through_protobuf[2];
    assert_eq!(full.name(), "pb-full");
    assert_eq!(full.raw_pod_cidrs().count(), 2);
    assert_eq!(full.addresses().count(), 3);
    assert_eq!(full.capacity_pods(), Some(110));
    assert_eq!(
        full.annotation("odd"),
        Some("tab\tnewline\n\u{1}z\u{e9}\u{1F600}")
    );
    assert_eq!(through_protobuf[1].name(), "pb-deleting");
    assert!(through_protobuf[1].is_deleting() && !full.is_deleting());
}

#[tokio::test]
async fn a_watch_through_protobuf_sees_changes_and_deletions_and_errors_keep_their_codes() {
    let env = TestEnv::new().await;
    create_fixtures(&env.client).await;
    let api: Api<WireNode> = Api::all(node_informer_client(env.client.clone()));

    // The API server's 404 and a watch's 410 arrive as Statuses with their codes.
    match api.get("absent").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"))
        }
        other => panic!("a 404 Status, not {other:?}"),
    }
    let mut gone = api
        .watch(&WatchParams::default(), "1")
        .await
        .expect("a watch from a compacted resourceVersion")
        .boxed();
    match gone.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("an ERROR event with a 410, not {other:?}"),
    }

    // A kind the API server has no protobuf for (a custom resource) comes back in JSON and passes
    // through untouched.
    let claims = netcm_e2e::pod_cidr_claims(&node_informer_client(env.client.clone()));
    claims
        .list(&ListParams::default())
        .await
        .expect("a JSON answer passes through the protobuf client");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default().streaming_lists()).boxed();
        while let Some(ev) = events.next().await {
            if tx.send(ev.map_err(|e| e.to_string())).is_err() {
                break;
            }
        }
    });
    let mut listed = 0;
    loop {
        match tokio::time::timeout(TIMEOUT, rx.recv())
            .await
            .expect("the initial list")
        {
            Some(Ok(Event::InitApply(_))) => listed += 1,
            Some(Ok(Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("initial list: {other:?}"),
        }
    }
    assert_eq!(listed, 3);
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            "pb-bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"changed": "yes"}}})),
        )
        .await
        .expect("annotate");
    nodes
        .delete("pb-full", &DeleteParams::default())
        .await
        .expect("delete");
    let (mut changed, mut deleted) = (false, false);
    wait_for(
        "the change and the deletion through the watch",
        TIMEOUT,
        || {
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Ok(Event::Apply(w)) if w.name_any() == "pb-bare" => {
                        changed |= everything().keep(w).annotation("changed") == Some("yes")
                    }
                    Ok(Event::Delete(w)) if w.name_any() == "pb-full" => deleted = true,
                    Ok(_) => {}
                    Err(e) => panic!("the watch failed: {e}"),
                }
            }
            std::future::ready((changed && deleted).then_some(()))
        },
    )
    .await;
    task.abort();
}

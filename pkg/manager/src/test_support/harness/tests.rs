//! The scripted API itself: what it answers, and how it fails a test.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::*;

fn nodes(api: &ScriptedApi) -> Api<Node> {
    Api::all(api.client())
}

fn a_node(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "uid": format!("uid-{name}") } })
}

#[tokio::test(start_paused = true)]
async fn each_request_gets_the_answer_of_its_step_in_the_order_written() {
    let api = ScriptedApi::new();
    api.expect(Step::get("/api/v1/nodes/n1").reply(200, a_node("n1")));
    api.expect(Step::get("/api/v1/nodes/n2").reply_status(
        404,
        "NotFound",
        "nodes \"n2\" not found",
    ));
    let nodes = nodes(&api);
    let n1 = nodes.get("n1").await.expect("answered");
    assert_eq!(n1.metadata.uid.as_deref(), Some("uid-n1"));
    let n2 = nodes.get("n2").await;
    assert!(
        matches!(&n2, Err(kube::Error::Api(s)) if s.code == 404),
        "{n2:?}"
    );
    let seen: Vec<String> = api.requests().iter().map(ToString::to_string).collect();
    assert_eq!(seen, ["GET /api/v1/nodes/n1", "GET /api/v1/nodes/n2"]);
}

#[tokio::test(start_paused = true)]
#[should_panic(
    expected = "unexpected request GET /api/v1/nodes/n2: the script expects GET /api/v1/nodes/n1 next"
)]
async fn a_request_out_of_order_fails_the_test_naming_it_and_the_step_expected() {
    let api = ScriptedApi::new();
    api.expect(Step::get("/api/v1/nodes/n1"));
    let _ = nodes(&api).get("n2").await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "unexpected request GET /api/v1/nodes/n1: the script has no more steps")]
async fn a_request_after_the_script_ended_fails_the_test() {
    let api = ScriptedApi::new();
    let _ = nodes(&api).get("n1").await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "the body is not the one expected")]
async fn a_body_other_than_the_one_expected_fails_the_test() {
    let api = ScriptedApi::new();
    api.expect(
        Step::patch("/api/v1/nodes/n1").json(json!({ "spec": { "podCIDR": "10.0.0.0/24" } })),
    );
    let patch = json!({ "spec": { "podCIDR": "10.0.1.0/24" } });
    let _ = nodes(&api)
        .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "steps that never came: [\"GET /api/v1/nodes/n1\"]")]
async fn a_step_that_never_came_fails_the_test_when_the_api_is_dropped() {
    let api = ScriptedApi::new();
    api.expect(Step::get("/api/v1/nodes/n1"));
}

#[tokio::test(start_paused = true)]
async fn requests_sent_together_match_their_group_in_any_order() {
    let api = ScriptedApi::new();
    api.expect_in_any_order([
        Step::get("/api/v1/nodes/a").reply(200, a_node("a")),
        Step::get("/api/v1/nodes/b").reply(200, a_node("b")),
    ]);
    let nodes = nodes(&api);
    let (b, a) = futures::join!(nodes.get("b"), nodes.get("a"));
    assert_eq!(a.expect("a").metadata.name.as_deref(), Some("a"));
    assert_eq!(b.expect("b").metadata.name.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_delayed_answer_or_an_abandoned_write_comes_after_its_delay_on_the_paused_clock() {
    let api = ScriptedApi::new();
    api.expect(
        Step::get("/api/v1/nodes/n1")
            .after(Duration::from_secs(5))
            .reply(200, a_node("n1")),
    );
    api.expect(
        Step::patch("/api/v1/nodes/n1")
            .after(Duration::from_secs(9))
            .deadline_exceeded(),
    );
    let nodes = nodes(&api);
    let start = Instant::now();
    nodes.get("n1").await.expect("answered");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let patch = json!({});
    let late = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert_eq!(start.elapsed(), Duration::from_secs(14));
    let Err(kube::Error::Service(e)) = late else {
        panic!("not the layer's error: {late:?}");
    };
    assert!(e.downcast_ref::<WriteDeadlineExceeded>().is_some(), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_request_stays_on_its_way() {
    let api = ScriptedApi::new();
    api.expect(Step::get("/api/v1/nodes/n1").hang());
    let waited = tokio::time::timeout(Duration::from_secs(3600), nodes(&api).get("n1")).await;
    assert!(waited.is_err(), "answered: {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn the_query_and_content_type_of_a_step_must_match_too() {
    let api = ScriptedApi::new();
    api.expect(Step::get("/api/v1/nodes").query("limit=500").reply(
        200,
        json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [] }),
    ));
    api.expect(Step::patch("/api/v1/nodes/n1").content_type("application/merge-patch+json"));
    let nodes = nodes(&api);
    let params = kube::api::ListParams::default().limit(500);
    assert!(nodes.list(&params).await.expect("listed").items.is_empty());
    let patch = json!({});
    crate::client::unread::patch_unread(
        &nodes,
        "n1",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("answered");
}

#[tokio::test(start_paused = true)]
async fn events_are_logged_beside_the_script_and_answered_at_once() {
    let api = ScriptedApi::new();
    let ctx = api.context().build().expect("context");
    let about = netcm_node::CachedNode::builder("n1", "uid-n1", "1")
        .build()
        .object_ref();
    ctx.recorder
        .publish(
            &about,
            crate::EventType::Warning,
            "CIDRNotAvailable",
            "AllocateCIDR",
            "full".into(),
        )
        .await;
    assert_eq!(
        api.events(),
        [RecordedEvent {
            type_: "Warning".into(),
            reason: "CIDRNotAvailable".into(),
            action: "AllocateCIDR".into(),
            note: "full".into(),
            regarding: "n1".into(),
        }]
    );
    assert!(api.requests().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_context_leads_as_its_identity_and_caches_its_nodes_without_telling_handlers() {
    let api = ScriptedApi::new();
    let takeover = Takeover {
        previous_holder: "netcm-earlier".into(),
        previous_configuration: None,
        writes_may_land_until: std::time::Instant::now(),
        replaced: true,
    };
    let node = netcm_node::CachedNode::builder("n1", "uid-n1", "1").build();
    let ctx = api
        .context()
        .nodes([node])
        .leading("netcm-b", Some(takeover.clone()))
        .build()
        .expect("context");
    assert_eq!(ctx.leader.identity(), Some("netcm-b"));
    assert!(ctx.leader.ensure_leader().is_ok(), "leading");
    assert_eq!(ctx.leader.takeover().as_deref(), Some(&takeover));
    assert!(ctx.nodes.has_synced());
    let queue = ctx.node_queue("test").expect("subscribed before any run");
    assert!(ctx.nodes.get("n1").is_some());
    assert!(queue.is_empty(), "held: the listed nodes are not events");
    ctx.nodes.open();
    assert_eq!(queue.len(), 1, "opened, the handlers hear of them");
    ctx.nodes.remove("n1");
    assert!(ctx.nodes.get("n1").is_none());
    let standalone = api
        .context()
        .without_leader_election()
        .build()
        .expect("context");
    assert!(!standalone.leader_elected && standalone.leader.identity().is_none());
}

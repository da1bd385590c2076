//! The controller in-process, against a scripted API ([`ScriptedApi`]): which requests a pass sends, in
//! which order, and what it does with each answer. What the API server decides (evictions, deletes,
//! the allocator's pools) is `e2e/tests/e2e/pod_cidr_migration.rs`.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use netcm_api::pod_cidr_migration::{api_resource, FINALIZER};
use netcm_manager::test_support::harness::{ScriptedApi, Step};
use netcm_manager::{CachedNode, InitContext, Reconciler, SyncOutcome};
use serde_json::{json, Value};

use crate::metrics::MigrationMetrics;
use crate::migrator::Migrator;

const MIGRATION: &str = "/apis/ipam.netcm.io/v1alpha1/podcidrmigrations/m/status";
const CLUSTER_CIDRS: &str = "/apis/networking.x-k8s.io/v1/clustercidrs";

fn node(name: &str, cidr: &str) -> CachedNode {
    let mut b = CachedNode::builder(name, &format!("{name}-uid"), "1");
    b.pod_cidrs(&[cidr], Some(cidr));
    b.build()
}

/// Migration `m` toward pool `new`, read at resourceVersion 7, its finalizer on, with `status`.
fn migration(status: Value) -> DynamicObject {
    let mut obj = DynamicObject::new("m", &api_resource())
        .data(json!({ "spec": { "destination": "new" }, "status": status }));
    obj.metadata.resource_version = Some("7".into());
    obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    obj.metadata.creation_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    obj
}

fn migrator(ctx: &InitContext, obj: DynamicObject) -> Migrator {
    let mut writer = Writer::new(api_resource());
    writer.apply_watcher_event(&watcher::Event::Apply(obj));
    Migrator {
        nodes: ctx.nodes.clone(),
        store: writer.as_reader(),
        migrations: Api::all_with(ctx.client.clone(), &api_resource()),
        cluster_cidrs: Api::all_with(ctx.client.clone(), &crate::cluster_cidr_resource()),
        node_api: Api::all(ctx.client.clone()),
        pods: Api::all(ctx.client.clone()),
        guard: ctx.leader.clone(),
        recorder: ctx.recorder.clone(),
        flag_ranges: vec!["10.244.0.0/16".parse().expect("a CIDR")],
        metrics: MigrationMetrics::register(&ctx.registry).expect("metrics"),
    }
}

/// The pool `new` as the ClusterCIDR list answers it.
fn pools() -> Step {
    Step::get(CLUSTER_CIDRS).reply(
        200,
        json!({"apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDRList", "metadata": {},
               "items": [{"apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
                          "metadata": {"name": "new"},
                          "spec": {"ipv4": "10.96.0.0/16", "perNodeHostBits": 8}}]}),
    )
}

/// The API, and the controller whose cache holds Node `n1` of the flag pool and migration `m` with
/// no status yet; the pools' list is the first request expected.
fn started() -> (ScriptedApi, Migrator) {
    let api = ScriptedApi::new();
    let ctx = api
        .context()
        .nodes([node("n1", "10.244.1.0/24")])
        .build()
        .expect("context");
    let m = migrator(&ctx, migration(json!({})));
    api.expect(pools());
    (api, m)
}

#[tokio::test]
async fn a_pass_writes_the_progress_testing_its_read_before_it_cordons_and_evicts() {
    let (api, m) = started();
    api.expect(Step::patch(MIGRATION).check(|body| {
        assert_eq!(
            body[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(body[1]["value"]["phase"], "Progressing");
        assert_eq!(body[1]["value"]["nodes"]["n1"]["step"], "Draining");
        assert_eq!(body[1]["value"]["nodes"]["n1"]["uid"], "n1-uid");
    }));
    api.expect(Step::patch("/api/v1/nodes/n1").check(|body| {
        assert_eq!(
            body,
            &json!([
                {"op": "test", "path": "/metadata/uid", "value": "n1-uid"},
                {"op": "add", "path": "/spec/unschedulable", "value": true}
            ])
        );
    }));
    api.expect(
        Step::get("/api/v1/pods")
            .query("fieldSelector=spec.nodeName%3Dn1")
            .reply(
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}),
            ),
    );
    let outcome = m.sync("m").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_pass_planned_from_a_stale_read_takes_no_action() {
    // The cache shows the migration before the controller's own last write: planning from it would
    // start a Node again, or one more than maxUnavailable.
    let (api, m) = started();
    api.expect(Step::patch(MIGRATION).reply_status(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    ));
    let outcome = m.sync("m").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
    // No cordon, no eviction: the script ends at the refused status write.
}

#[tokio::test]
async fn a_drain_under_way_lists_its_pods_once_a_pass_and_evicts_them_from_that_list() {
    let api = ScriptedApi::new();
    let mut cordoned = CachedNode::builder("n1", "n1-uid", "2");
    cordoned
        .pod_cidrs(&["10.244.1.0/24"], Some("10.244.1.0/24"))
        .unschedulable(true);
    let ctx = api
        .context()
        .nodes([cordoned.build()])
        .build()
        .expect("context");
    let draining = json!({"phase": "Progressing", "draining": 1, "nodes": {"n1": {
        "step": "Draining", "toward": "new", "since": Timestamp::now().to_string(), "uid": "n1-uid"}}});
    let m = migrator(&ctx, migration(draining));
    api.expect(pools());
    api.expect(
        Step::get("/api/v1/pods")
            .query("fieldSelector=spec.nodeName%3Dn1")
            .reply(
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
                    {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1", "containers": []}}]}),
            ),
    );
    api.expect(Step::patch(MIGRATION));
    api.expect(Step::post("/api/v1/namespaces/ns/pods/p/eviction").reply(201, json!({})));
    let outcome = m.sync("m").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
}

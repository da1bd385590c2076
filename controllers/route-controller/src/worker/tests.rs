//! The Node reconciler against a scripted API server: the Events a conflict of pod CIDRs sends, the
//! Nodes it syncs again, and the creation times it reads.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use netcm_manager::test_support::harness::{ScriptedApi, Step};
use netcm_manager::{InitContext, Reconciler};
use netcm_node::test_support::{flannel_keys, node};
use serde_json::{json, Value};

use super::*;
use crate::backend::fake::FakeRoutes;
use crate::backend::Route;
use crate::ownership::Ownership;
use crate::seniority::ApiBirths;
use crate::table::{Parts, ROUTE_CIDR_CONFLICT};

/// The victim, created at 1s, and a later Node with a /25 inside its /24.
const VICTIM: (&str, &str, &str) = ("victim", "10.244.0.0/24", "192.0.2.1");
const ATTACKER: (&str, &str, &str) = ("attacker", "10.244.0.128/25", "192.0.2.66");

/// The metadata-only answer to a list of the Node `name`, created at `secs`.
fn metadata(name: &str, secs: i64) -> Value {
    let created = Timestamp::from_second(secs).expect("time").to_string();
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "7"},
        "items": [{
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
        }],
    })
}

/// The list of the Node `name` alone that reads its creation time, from the watch cache: a `list`,
/// the one right on Nodes the DaemonSet's account has.
fn selecting(name: &str) -> Step {
    Step::get("/api/v1/nodes")
        .query(&format!("fieldSelector=metadata.name%3D{name}"))
        .query("resourceVersion=0")
}

/// [`selecting`], answered with the Node created at `secs`.
fn read(name: &str, secs: i64) -> Step {
    selecting(name).reply(200, metadata(name, secs))
}

/// A reconciler for the Nodes `nodes`, over an in-memory table, reading creation times from `api`.
fn reconciler(
    api: &ScriptedApi,
    nodes: &[(&str, &str, &str)],
) -> (Arc<FakeRoutes>, RouteReconciler, InitContext) {
    let cached = nodes
        .iter()
        .map(|(name, cidr, ip)| node(name, &[cidr], &[("InternalIP", ip)], &[]));
    let ctx = api
        .context()
        .nodes(cached)
        .without_leader_election()
        .build()
        .expect("context");
    let backend = Arc::new(FakeRoutes::default());
    let metrics = crate::metrics::RouteMetrics::register(&ctx.registry).expect("metrics");
    let syncer = Arc::new(RouteSyncer::new(Parts {
        backend: backend.clone(),
        keys: flannel_keys(),
        own_node: None,
        ownership: Ownership::new(vec!["10.0.0.0/8".parse().expect("net")]),
        guard: ctx.leader.clone(),
        metrics,
        births: Arc::new(ApiBirths::new(ctx.client.clone())),
    }));
    let rec = RouteReconciler {
        syncer,
        nodes: ctx.nodes.clone(),
        queue: ctx.node_queue(NAME).expect("queue"),
        conditions: None,
        recorder: ctx.recorder.clone(),
        reports: Reports::EveryNode,
        resync: Arc::new(Notify::new()),
        lease_prefix: "flannel.alpha.coreos.com/".into(),
    };
    (backend, rec, ctx)
}

fn route(dst: &str, gw: &str) -> Route {
    Route {
        destination: dst.parse().expect("dst"),
        gateway: gw.parse().expect("gw"),
    }
}

#[tokio::test]
async fn the_later_node_alone_gets_a_route_cidr_conflict_event_and_creation_times_are_read_once() {
    let api = ScriptedApi::new();
    let (backend, rec, _ctx) = reconciler(&api, &[VICTIM, ATTACKER]);
    // Alone in the view, the victim needs no creation time.
    assert!(matches!(rec.sync(VICTIM.0).await, Ok(SyncOutcome::Done)));
    api.expect_in_any_order([read(ATTACKER.0, 2), read(VICTIM.0, 1)]);
    assert!(matches!(
        rec.sync(ATTACKER.0).await,
        Err(SyncError::Routes(1))
    ));
    api.verify();
    assert_eq!(backend.table(), [route(VICTIM.1, VICTIM.2)]);
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(
        (e.type_.as_str(), e.reason.as_str(), e.regarding.as_str()),
        ("Warning", ROUTE_CIDR_CONFLICT, ATTACKER.0)
    );
    assert!(
        e.note
            .contains("10.244.0.0/24 of node victim, which the API server created earlier"),
        "{}",
        e.note
    );
    // Known now: later syncs read nothing, and the victim is never told of the attacker.
    assert!(matches!(rec.sync(VICTIM.0).await, Ok(SyncOutcome::Done)));
    assert!(rec.sync(ATTACKER.0).await.is_err());
    api.verify();
    assert!(api.events().iter().all(|e| e.regarding == ATTACKER.0));
}

#[tokio::test]
async fn the_earlier_node_syncing_second_queues_the_later_one_which_loses_its_route() {
    let api = ScriptedApi::new();
    let (backend, rec, _ctx) = reconciler(&api, &[VICTIM, ATTACKER]);
    assert!(matches!(rec.sync(ATTACKER.0).await, Ok(SyncOutcome::Done)));
    assert_eq!(backend.table(), [route(ATTACKER.1, ATTACKER.2)]);
    api.expect_in_any_order([read(VICTIM.0, 1), read(ATTACKER.0, 2)]);
    assert!(matches!(rec.sync(VICTIM.0).await, Ok(SyncOutcome::Done)));
    let queued = rec.queue.get().await.expect("a key");
    assert_eq!(&*queued, ATTACKER.0);
    assert!(rec.sync(&queued).await.is_err());
    rec.queue.done(&queued);
    api.verify();
    assert_eq!(backend.table(), [route(VICTIM.1, VICTIM.2)]);
    let reasons: Vec<(String, String)> = api
        .events()
        .into_iter()
        .map(|e| (e.regarding, e.reason))
        .collect();
    assert_eq!(
        reasons,
        [(ATTACKER.0.to_string(), ROUTE_CIDR_CONFLICT.to_string())]
    );
}

#[tokio::test]
async fn a_creation_time_the_api_server_cannot_give_makes_the_sync_retry_without_a_failure_or_event(
) {
    let api = ScriptedApi::new();
    let (backend, rec, _ctx) = reconciler(&api, &[VICTIM, ATTACKER]);
    assert!(matches!(rec.sync(VICTIM.0).await, Ok(SyncOutcome::Done)));
    api.expect_in_any_order([
        selecting("attacker").reply_status(503, "ServiceUnavailable", "etcd is down"),
        selecting("victim").reply_status(503, "ServiceUnavailable", "etcd is down"),
    ]);
    assert!(matches!(
        rec.sync(ATTACKER.0).await,
        Ok(SyncOutcome::RetryAfter(_))
    ));
    api.verify();
    assert_eq!(backend.table(), [route(VICTIM.1, VICTIM.2)]);
    assert!(api.events().is_empty());
}

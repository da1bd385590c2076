//! Unit tests of the table logic against the in-memory backend.

use super::*;
use crate::backend::fake::FakeRoutes;
use crate::backend::TableChange;
use crate::seniority::fake::FakeBirths;
use netcm_node::test_support::{flannel_keys as keys, node};

mod conflict;
mod overlap;

/// The cluster CIDRs of every test here.
const CLUSTER_CIDRS: [&str; 2] = ["10.0.0.0/8", "fd00::/8"];

pub(super) fn syncer(own: Option<&str>) -> (Arc<FakeRoutes>, RouteSyncer) {
    let (backend, s, _) = syncer_with_metrics(own);
    (backend, s)
}

fn syncer_with_metrics(own: Option<&str>) -> (Arc<FakeRoutes>, RouteSyncer, RouteMetrics) {
    syncer_over(
        own,
        &CLUSTER_CIDRS,
        Arc::new(FakeRoutes::default()),
        Arc::new(FakeBirths::default()),
    )
}

/// A syncer over `backend` for the Node `own` with `cluster_cidrs`, reading creation times from `births`.
pub(super) fn syncer_over(
    own: Option<&str>,
    cluster_cidrs: &[&str],
    backend: Arc<FakeRoutes>,
    births: Arc<FakeBirths>,
) -> (Arc<FakeRoutes>, RouteSyncer, RouteMetrics) {
    let registry = prometheus::Registry::new();
    let metrics = RouteMetrics::register(&registry).expect("metrics");
    let s = RouteSyncer::new(Parts {
        backend: backend.clone(),
        keys: keys(),
        own_node: own.map(str::to_string),
        ownership: Ownership::new(cluster_cidrs.iter().map(|c| net(c)).collect()),
        guard: LeaderGuard::disabled(&registry).expect("guard"),
        metrics: metrics.clone(),
        births,
    });
    (backend, s, metrics)
}

pub(super) fn net(s: &str) -> IpNet {
    s.parse().expect("net")
}

pub(super) fn route(dst: &str, gw: &str) -> Route {
    Route {
        destination: dst.parse().expect("dst"),
        gateway: gw.parse().expect("gw"),
    }
}

pub(super) fn n(name: &str, cidr: &str, ip: &str) -> CachedNode {
    node(name, &[cidr], &[("InternalIP", ip)], &[])
}

/// Syncs the Node [`n`] builds from `name`, `cidr` and `ip`.
pub(super) async fn sync(s: &RouteSyncer, name: &str, cidr: &str, ip: &str) -> NodeSync {
    s.sync_node(name, Some(&n(name, cidr, ip)))
        .await
        .expect("sync")
}

/// The failures of `outcome`; panics on any other outcome.
pub(super) fn failures(outcome: NodeOutcome) -> Vec<Failure> {
    match outcome {
        NodeOutcome::Failed(f) => f,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_new_node_gets_its_route_and_a_second_sync_calls_nothing() {
    let (backend, s) = syncer(None);
    let a = n("a", "10.244.1.0/24", "192.0.2.1");
    let r = s.sync_node("a", Some(&a)).await.expect("sync");
    assert_eq!(r.outcome, NodeOutcome::Routed);
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
    backend.take_calls();
    s.sync_node("a", Some(&a)).await.expect("sync");
    assert!(backend.take_calls().is_empty());
}

#[tokio::test]
async fn a_changed_address_replaces_the_gateway_and_a_deleted_node_loses_its_route() {
    let (backend, s) = syncer(None);
    sync(&s, "a", "10.244.1.0/24", "192.0.2.1").await;
    sync(&s, "a", "10.244.1.0/24", "192.0.2.9").await;
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.9")]);
    let r = s.sync_node("a", None).await.expect("sync");
    assert_eq!(r.outcome, NodeOutcome::NotApplicable);
    assert!(backend.table().is_empty());
}

#[tokio::test]
async fn the_node_netcm_runs_on_gets_no_route() {
    let (backend, s) = syncer(Some("self"));
    let r = sync(&s, "self", "10.244.1.0/24", "192.0.2.1").await;
    assert_eq!(r.outcome, NodeOutcome::NotApplicable);
    assert!(backend.table().is_empty());
}

#[tokio::test]
async fn an_unreachable_gateway_fails_that_node_only() {
    let (backend, s) = syncer(None);
    backend
        .unreachable
        .lock()
        .expect("lock")
        .insert("203.0.113.5".parse().expect("ip"));
    let bad = sync(&s, "bad", "10.244.1.0/24", "203.0.113.5").await;
    let good = sync(&s, "good", "10.244.2.0/24", "192.0.2.2").await;
    let f = failures(bad.outcome);
    assert!(f[0].reason.contains("invalid gateway"), "{f:?}");
    assert_eq!(good.outcome, NodeOutcome::Routed);
    assert_eq!(backend.table(), [route("10.244.2.0/24", "192.0.2.2")]);
}

#[tokio::test]
async fn someone_elses_route_to_the_same_destination_is_left_alone_and_reported() {
    let (backend, s) = syncer(None);
    backend
        .foreign
        .lock()
        .expect("lock")
        .insert("10.244.1.0/24".parse().expect("net"));
    let r = sync(&s, "a", "10.244.1.0/24", "192.0.2.1").await;
    let f = failures(r.outcome);
    assert!(f[0].reason.contains("does not own"), "{f:?}");
    assert!(backend.table().is_empty());
}

#[tokio::test]
async fn a_route_netcm_made_before_a_restart_is_adopted_not_duplicated() {
    let (backend, s) = syncer(None);
    backend.ours.lock().expect("lock").insert(
        "10.244.1.0/24".parse().expect("net"),
        "192.0.2.7".parse().expect("ip"),
    );
    let r = sync(&s, "a", "10.244.1.0/24", "192.0.2.1").await;
    assert_eq!(r.outcome, NodeOutcome::Routed);
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
}

#[tokio::test]
async fn reconcile_deletes_routes_no_node_wants_and_requeues_nodes_whose_route_went_missing() {
    let (backend, s) = syncer(None);
    let a = Arc::new(n("a", "10.244.1.0/24", "192.0.2.1"));
    let b = Arc::new(n("b", "10.244.2.0/24", "192.0.2.2"));
    s.sync_node("a", Some(&a)).await.expect("sync");
    s.sync_node("b", Some(&b)).await.expect("sync");
    backend.ours.lock().expect("lock").insert(
        "10.99.0.0/24".parse().expect("net"),
        "192.0.2.99".parse().expect("ip"),
    );
    backend
        .ours
        .lock()
        .expect("lock")
        .remove(&"10.244.2.0/24".parse().expect("net"));
    let report = s
        .reconcile(&[a.clone(), b.clone()])
        .await
        .expect("reconcile");
    assert_eq!(report.deleted, [route("10.99.0.0/24", "192.0.2.99")]);
    assert_eq!(report.requeue, ["b"]);
    assert!(!report.in_sync());
    // The view now knows the route is gone, so b's sync recreates it.
    s.sync_node("b", Some(&b)).await.expect("sync");
    assert_eq!(
        backend.table(),
        [
            route("10.244.1.0/24", "192.0.2.1"),
            route("10.244.2.0/24", "192.0.2.2")
        ]
    );
    assert!(s.reconcile(&[a, b]).await.expect("reconcile").in_sync());
}

#[tokio::test]
async fn two_nodes_claiming_one_pod_cidr_do_not_fight_over_the_route() {
    let births = Arc::new(FakeBirths::with(&[("uid-a", 1), ("uid-b", 2)]));
    let (backend, s, _) = syncer_over(
        None,
        &CLUSTER_CIDRS,
        Arc::new(FakeRoutes::default()),
        births,
    );
    sync(&s, "a", "10.244.1.0/24", "192.0.2.1").await;
    let r = sync(&s, "b", "10.244.1.0/24", "192.0.2.2").await;
    assert!(matches!(r.outcome, NodeOutcome::Failed(_)), "{r:?}");
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
    // Once a is gone, b takes the destination over.
    s.sync_node("a", None).await.expect("sync");
    let r = sync(&s, "b", "10.244.1.0/24", "192.0.2.2").await;
    assert_eq!(r.outcome, NodeOutcome::Routed);
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.2")]);
}

#[tokio::test]
async fn a_pod_cidr_without_an_address_of_its_family_fails_without_a_backend_call() {
    let (backend, s) = syncer(None);
    let v6_only = node(
        "a",
        &["10.244.1.0/24"],
        &[("InternalIP", "2001:db8::1")],
        &[],
    );
    let r = s.sync_node("a", Some(&v6_only)).await.expect("sync");
    assert!(matches!(r.outcome, NodeOutcome::Failed(_)), "{r:?}");
    assert!(backend.take_calls().is_empty());
}

#[tokio::test]
async fn a_listed_default_route_of_netcms_protocol_is_kept_with_no_nodes_as_it_is_outside_the_cluster_cidrs(
) {
    let (backend, s) = syncer(None);
    for (dst, gw) in [
        ("0.0.0.0/0", "192.0.2.254"),
        ("172.16.0.0/24", "192.0.2.253"),
    ] {
        backend
            .ours
            .lock()
            .expect("lock")
            .insert(net(dst), gw.parse().expect("ip"));
    }
    let report = s.reconcile(&[]).await.expect("reconcile");
    assert!(report.deleted.is_empty(), "{report:?}");
    assert_eq!(
        backend.table(),
        [
            route("0.0.0.0/0", "192.0.2.254"),
            route("172.16.0.0/24", "192.0.2.253")
        ]
    );
}

#[tokio::test]
async fn a_default_like_outside_or_lan_pod_cidr_gets_no_route_and_a_failure_saying_why() {
    let (backend, s) = syncer(None);
    backend
        .connected
        .lock()
        .expect("lock")
        .push(net("10.99.0.0/16"));
    s.refresh_connected().await;
    for (cidr, why) in [
        ("0.0.0.0/1", "default-like"),
        ("172.16.0.0/24", "outside every --cluster-cidr"),
        ("10.99.3.0/24", "directly connected"),
    ] {
        let r = sync(&s, "bad", cidr, "192.0.2.5").await;
        let f = failures(r.outcome);
        assert!(f[0].reason.contains(why), "{cidr}: {f:?}");
        assert_eq!(f[0].gateway, Some("192.0.2.5".parse().expect("ip")));
        assert!(!f[0].on_this_host);
    }
    assert!(backend.table().is_empty());
    assert!(backend
        .take_calls()
        .iter()
        .all(|c| !c.starts_with("create")));
}

#[tokio::test]
async fn a_route_netcm_made_to_a_pod_cidr_now_over_the_hosts_lan_is_deleted() {
    let (backend, s) = syncer(None);
    let a = Arc::new(n("a", "10.99.3.0/24", "192.0.2.5"));
    s.sync_node("a", Some(&a)).await.expect("sync");
    assert_eq!(backend.table(), [route("10.99.3.0/24", "192.0.2.5")]);
    // The host gains an address in that network: the route would now capture the host's own traffic.
    backend
        .connected
        .lock()
        .expect("lock")
        .push(net("10.99.0.0/16"));
    let report = s.reconcile(&[a]).await.expect("reconcile");
    assert_eq!(report.deleted, [route("10.99.3.0/24", "192.0.2.5")]);
    assert_eq!(report.requeue, ["a"], "to report the refusal");
}

#[tokio::test]
async fn route_sync_total_counts_every_pass_even_one_whose_listing_fails_and_has_no_labels() {
    let registry = prometheus::Registry::new();
    let metrics = RouteMetrics::register(&registry).expect("metrics");
    let backend = Arc::new(FakeRoutes::default());
    let s = RouteSyncer::new(Parts {
        backend: backend.clone(),
        keys: keys(),
        own_node: None,
        ownership: Ownership::new(vec![net("10.0.0.0/8")]),
        guard: LeaderGuard::disabled(&registry).expect("guard"),
        metrics: metrics.clone(),
        births: Arc::new(FakeBirths::default()),
    });
    s.reconcile(&[]).await.expect("reconcile");
    backend
        .list_fails
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(s.reconcile(&[]).await.is_err());
    assert_eq!(metrics.sync_total.get(), 2);
    let family = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "route_controller_route_sync_total")
        .expect("registered");
    assert_eq!(
        family.help(),
        "A metric counting the amount of times routes have been synced with the cloud provider."
    );
    assert_eq!(family.get_metric().len(), 1);
    assert!(family.get_metric()[0].get_label().is_empty());
}

#[tokio::test]
async fn a_route_someone_deletes_leaves_the_view_and_its_node_is_synced_again_which_recreates_it() {
    let (backend, s) = syncer(None);
    let a = n("a", "10.244.1.0/24", "192.0.2.1");
    s.sync_node("a", Some(&a)).await.expect("sync");
    backend.ours.lock().expect("lock").clear();
    let removed = TableChange::Removed {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        ours: true,
    };
    assert_eq!(s.table_changed(&removed).await.as_deref(), Some("a"));
    s.sync_node("a", Some(&a)).await.expect("sync");
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
}

#[tokio::test]
async fn netcms_own_changes_reported_back_cost_no_sync() {
    let (backend, s) = syncer(None);
    sync(&s, "a", "10.244.1.0/24", "192.0.2.1").await;
    let added = TableChange::Added {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        ours: true,
    };
    assert_eq!(s.table_changed(&added).await, None);
    // A Node deleted: netcm deletes the route, then hears of it.
    s.sync_node("a", None).await.expect("sync");
    assert!(backend.table().is_empty());
    let removed = TableChange::Removed {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        ours: true,
    };
    assert_eq!(s.table_changed(&removed).await, None);
    assert_eq!(s.table_changed(&TableChange::Lost).await, None);
}

#[tokio::test]
async fn a_route_someone_repoints_brings_its_node_back_to_its_own_gateway() {
    let (backend, s) = syncer(None);
    let a = n("a", "10.244.1.0/24", "192.0.2.1");
    s.sync_node("a", Some(&a)).await.expect("sync");
    backend
        .ours
        .lock()
        .expect("lock")
        .insert(net("10.244.1.0/24"), "192.0.2.250".parse().expect("ip"));
    let repointed = TableChange::Added {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.250".parse().expect("ip")),
        ours: true,
    };
    assert_eq!(s.table_changed(&repointed).await.as_deref(), Some("a"));
    backend.take_calls();
    s.sync_node("a", Some(&a)).await.expect("sync");
    assert_eq!(
        backend.take_calls(),
        ["replace 10.244.1.0/24 via 192.0.2.1"]
    );
    assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
}

#[tokio::test]
async fn someone_elses_route_replacing_netcms_is_reported_on_the_node_and_left_alone() {
    let (backend, s) = syncer(None);
    let a = n("a", "10.244.1.0/24", "192.0.2.1");
    s.sync_node("a", Some(&a)).await.expect("sync");
    // `ip route replace … proto static` takes the destination over.
    backend.ours.lock().expect("lock").clear();
    backend
        .foreign
        .lock()
        .expect("lock")
        .insert(net("10.244.1.0/24"));
    let theirs = TableChange::Added {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.9".parse().expect("ip")),
        ours: false,
    };
    assert_eq!(s.table_changed(&theirs).await.as_deref(), Some("a"));
    let r = s.sync_node("a", Some(&a)).await.expect("sync");
    assert!(matches!(r.outcome, NodeOutcome::Failed(_)), "{r:?}");
    // Once it is gone, the failing Node is synced again at once.
    backend.foreign.lock().expect("lock").clear();
    let gone = TableChange::Removed {
        destination: net("10.244.1.0/24"),
        gateway: Some("192.0.2.9".parse().expect("ip")),
        ours: false,
    };
    assert_eq!(s.table_changed(&gone).await.as_deref(), Some("a"));
    let r = s.sync_node("a", Some(&a)).await.expect("sync");
    assert_eq!(r.outcome, NodeOutcome::Routed);
}

#[tokio::test]
async fn a_bad_peer_is_not_a_host_fault_but_a_host_that_may_not_route_is() {
    let (backend, s) = syncer(Some("self"));
    backend
        .unreachable
        .lock()
        .expect("lock")
        .insert("203.0.113.5".parse().expect("ip"));
    let bad = sync(&s, "bad", "10.244.9.0/24", "203.0.113.5").await;
    assert!(matches!(bad.outcome, NodeOutcome::Failed(_)));
    assert!(!bad.host_fault());
    let report = s.reconcile(&[]).await.expect("reconcile");
    assert_eq!(report.host_faults, 0);

    backend
        .host_fails
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let good = sync(&s, "good", "10.244.2.0/24", "192.0.2.2").await;
    assert!(good.host_fault(), "{good:?}");
    let report = s.reconcile(&[]).await.expect("reconcile");
    assert_eq!(report.host_faults, 1);
    // Counted once: the next pass starts afresh.
    backend
        .host_fails
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(s.reconcile(&[]).await.expect("reconcile").host_faults, 0);
}

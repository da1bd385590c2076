//! Unit tests of Nodes that claim the same pod CIDR: who keeps the route, whatever order they sync in.

use super::super::*;
use super::{failures, n, net, route, sync, syncer_over, CLUSTER_CIDRS};
use crate::backend::fake::FakeRoutes;
use crate::seniority::fake::FakeBirths;

/// The pod CIDR both Nodes of these tests claim.
const SHARED: &str = "10.244.1.0/24";
/// The Node the pod CIDR was handed to, created first.
const VICTIM: (&str, &str) = ("victim", "192.0.2.1");
/// A Node registered later with a copy of the victim's pod CIDR; its name sorts first.
const COPY: (&str, &str) = ("copy", "192.0.2.2");
/// When the API server created them, by uid.
const BORN: [(&str, i64); 4] = [
    ("uid-victim", 1),
    ("uid-copy", 2),
    ("uid-a", 1),
    ("uid-b", 2),
];

/// Both orders in which the two Nodes can sync first.
const ORDERS: [[(&str, &str); 2]; 2] = [[VICTIM, COPY], [COPY, VICTIM]];

/// A syncer that knows the creation times of [`BORN`].
fn syncer() -> (Arc<FakeRoutes>, RouteSyncer) {
    let births = Arc::new(FakeBirths::with(&BORN));
    let (backend, s, _) = syncer_over(
        None,
        &CLUSTER_CIDRS,
        Arc::new(FakeRoutes::default()),
        births,
    );
    (backend, s)
}

/// A syncer over a table that already routes [`SHARED`] to `routed`, as after a restart.
fn restarted_with(routed: Option<(&str, &str)>) -> (Arc<FakeRoutes>, RouteSyncer) {
    let (backend, s) = syncer();
    if let Some((_, gw)) = routed {
        backend
            .ours
            .lock()
            .expect("lock")
            .insert(net(SHARED), gw.parse().expect("ip"));
    }
    (backend, s)
}

/// Starts as the controller does (a full reconcile over every Node), then syncs the Nodes in `order`;
/// returns each Node's outcome by name.
async fn start_then_sync(
    s: &RouteSyncer,
    order: [(&str, &str); 2],
) -> HashMap<String, NodeOutcome> {
    let nodes: Vec<Arc<CachedNode>> = order
        .iter()
        .map(|(name, gw)| Arc::new(n(name, SHARED, gw)))
        .collect();
    s.reconcile(&nodes).await.expect("reconcile");
    let mut outcomes = HashMap::new();
    for (name, gw) in order {
        outcomes.insert(name.to_string(), sync(s, name, SHARED, gw).await.outcome);
    }
    outcomes
}

#[tokio::test]
async fn after_a_restart_a_copied_pod_cidr_is_routed_to_the_earlier_node_whichever_syncs_first_and_wherever_the_table_pointed(
) {
    for (order, table) in ORDERS.into_iter().flat_map(|o| [(o, VICTIM), (o, COPY)]) {
        let (backend, s) = restarted_with(Some(table));
        let outcomes = start_then_sync(&s, order).await;
        assert_eq!(backend.table(), [route(SHARED, VICTIM.1)], "{order:?}");
        assert_eq!(outcomes[VICTIM.0], NodeOutcome::Routed, "{order:?}");
        let lost = failures(outcomes[COPY.0].clone());
        assert_eq!(lost.len(), 1, "{order:?}: {lost:?}");
        assert!(!lost[0].on_this_host, "{order:?}: {lost:?}");
        // Later passes change nothing.
        let again = start_then_sync(&s, order).await;
        assert_eq!(backend.table(), [route(SHARED, VICTIM.1)], "{order:?}");
        assert_eq!(again[VICTIM.0], NodeOutcome::Routed, "{order:?}");
    }
}

#[tokio::test]
async fn with_no_route_in_the_table_a_shared_pod_cidr_goes_to_the_earlier_node_whichever_syncs_first(
) {
    for order in ORDERS {
        let (backend, s) = restarted_with(None);
        let outcomes = start_then_sync(&s, order).await;
        let routed: Vec<&String> = outcomes
            .iter()
            .filter(|(_, o)| **o == NodeOutcome::Routed)
            .map(|(name, _)| name)
            .collect();
        assert_eq!(routed, [VICTIM.0], "{order:?}: {outcomes:?}");
        assert_eq!(backend.table(), [route(SHARED, VICTIM.1)], "{order:?}");
    }
}

#[tokio::test]
async fn the_node_routed_first_keeps_its_pod_cidr_when_a_copy_appears_and_when_its_gateway_changes()
{
    let (backend, s) = syncer();
    sync(&s, VICTIM.0, SHARED, VICTIM.1).await;
    let copy = sync(&s, COPY.0, SHARED, COPY.1).await;
    assert!(matches!(copy.outcome, NodeOutcome::Failed(_)), "{copy:?}");
    let moved = sync(&s, VICTIM.0, SHARED, "192.0.2.9").await;
    assert_eq!(moved.outcome, NodeOutcome::Routed);
    sync(&s, COPY.0, SHARED, COPY.1).await;
    assert_eq!(backend.table(), [route(SHARED, "192.0.2.9")]);
}

#[tokio::test]
async fn the_losing_node_fails_the_same_way_at_every_resync_without_a_route_change() {
    let (backend, s) = restarted_with(Some(VICTIM));
    start_then_sync(&s, [COPY, VICTIM]).await;
    backend.take_calls();
    let first = failures(sync(&s, COPY.0, SHARED, COPY.1).await.outcome);
    let second = failures(sync(&s, COPY.0, SHARED, COPY.1).await.outcome);
    // The same failure each time, so the Warning Event it becomes is one the recorder deduplicates.
    assert_eq!(first, second);
    assert!(backend.take_calls().is_empty());
}

#[tokio::test]
async fn the_first_syncs_know_every_node_that_asks_for_a_destination_even_when_the_first_listing_fails(
) {
    let (backend, s) = syncer();
    backend
        .list_fails
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let first = Arc::new(n("a", SHARED, "192.0.2.1"));
    let second = Arc::new(n("b", SHARED, "192.0.2.2"));
    assert!(s.reconcile(&[first, second]).await.is_err());
    // "a" was created first; "b" syncing before it must not take the route.
    let b = sync(&s, "b", SHARED, "192.0.2.2").await;
    assert!(matches!(b.outcome, NodeOutcome::Failed(_)), "{b:?}");
    assert_eq!(
        sync(&s, "a", SHARED, "192.0.2.1").await.outcome,
        NodeOutcome::Routed
    );
    assert_eq!(backend.table(), [route(SHARED, "192.0.2.1")]);
}

//! Unit tests of pod CIDRs that overlap another Node's without being equal to it, and of the attacks on
//! that rule: a Node that registers a pod CIDR inside, around or equal to another Node's must never get
//! a route to it, whoever syncs first, on every host, after restarts.

use super::super::*;
use super::{failures, n, net, route, syncer_over, CLUSTER_CIDRS};
use crate::backend::fake::FakeRoutes;
use crate::seniority::fake::FakeBirths;
use netcm_node::test_support::{full_node, node};

// ---- helpers: the only part that knows how a syncer learns when each Node was created ----

/// A syncer whose Nodes the API server created at the given seconds, by uid (`uid-<name>` for the Nodes
/// the fixtures build).
fn syncer_born(born: &[(&str, i64)]) -> (Arc<FakeRoutes>, RouteSyncer, RouteMetrics) {
    syncer_with(None, &CLUSTER_CIDRS, born)
}

/// [`syncer_born`] for the Node `own` (node mode) and these cluster CIDRs.
fn syncer_with(
    own: Option<&str>,
    cluster_cidrs: &[&str],
    born: &[(&str, i64)],
) -> (Arc<FakeRoutes>, RouteSyncer, RouteMetrics) {
    let (backend, s, metrics, _) = syncer_and_births(own, cluster_cidrs, born);
    (backend, s, metrics)
}

/// [`syncer_with`], with its source of creation times.
fn syncer_and_births(
    own: Option<&str>,
    cluster_cidrs: &[&str],
    born: &[(&str, i64)],
) -> (Arc<FakeRoutes>, RouteSyncer, RouteMetrics, Arc<FakeBirths>) {
    let births = Arc::new(FakeBirths::with(born));
    let (backend, s, metrics) = syncer_over(
        own,
        cluster_cidrs,
        Arc::new(FakeRoutes::default()),
        births.clone(),
    );
    (backend, s, metrics, births)
}

trait Readable {
    /// Makes every creation time unreadable (`false`) or readable again.
    fn readable(&self, readable: bool);
}

impl Readable for FakeBirths {
    fn readable(&self, readable: bool) {
        self.unreadable
            .store(!readable, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Tells the syncer when the Nodes `born` ((name, uid, seconds)) were created, as a full listing does.
fn remember(s: &RouteSyncer, born: &[(&str, &str, i64)]) {
    s.remember_births(born.iter().map(|(name, uid, secs)| {
        let created = k8s_openapi::jiff::Timestamp::from_second(*secs).expect("time");
        let uid = uid.to_string();
        (name.to_string(), Seniority { created, uid })
    }));
}

/// The Event reason the worker publishes a failure under.
fn event_reason(f: &Failure) -> &'static str {
    f.cause.event_reason()
}

/// Nodes whose routes lose to an earlier Node's overlapping pod CIDR.
fn conflicting(m: &RouteMetrics) -> i64 {
    m.conflicting_nodes.get()
}

/// The Nodes a sync asks to sync again.
fn requeued(sync: &NodeSync) -> Vec<String> {
    sync.requeue.clone()
}

/// Whether a sync asks to be retried on its own, without a failure.
fn retries(sync: &NodeSync) -> bool {
    sync.undecided
}

// ---- fixtures ----

/// The Node the pod CIDR was handed to, created first.
const VICTIM: &str = "victim";
/// Its pod CIDR and gateway.
const VICTIM_CIDR: &str = "10.244.0.0/24";
const VICTIM_GW: &str = "192.0.2.1";
/// A Node registered later by a kubelet, with a pod CIDR of its choosing; its name sorts first.
const ATTACKER: &str = "attacker";
const ATTACKER_GW: &str = "192.0.2.66";

/// The victim created at 1s, the attacker at 2s.
const BORN: [(&str, i64); 2] = [("uid-victim", 1), ("uid-attacker", 2)];

async fn sync_v(s: &RouteSyncer) -> NodeSync {
    s.sync_node(VICTIM, Some(&n(VICTIM, VICTIM_CIDR, VICTIM_GW)))
        .await
        .expect("sync")
}

async fn sync_a(s: &RouteSyncer, cidr: &str) -> NodeSync {
    s.sync_node(ATTACKER, Some(&n(ATTACKER, cidr, ATTACKER_GW)))
        .await
        .expect("sync")
}

/// Asserts the attacker's sync failed with one conflict naming the victim, and no other failure.
fn assert_lost_to_victim(sync: &NodeSync, cidr: &str) {
    let lost = failures(sync.outcome.clone());
    assert_eq!(lost.len(), 1, "{cidr}: {lost:?}");
    assert_eq!(
        event_reason(&lost[0]),
        "RouteCIDRConflict",
        "{cidr}: {lost:?}"
    );
    assert!(lost[0].reason.contains(VICTIM), "{cidr}: {lost:?}");
    assert!(!lost[0].on_this_host, "{cidr}: {lost:?}");
}

// ---- the overlap rule ----

#[tokio::test]
async fn a_later_node_whose_pod_cidr_lies_inside_an_earlier_nodes_gets_no_route_and_a_conflict_event(
) {
    for inside in ["10.244.0.128/25", "10.244.0.7/32", "10.244.0.0/25"] {
        let (backend, s, metrics) = syncer_born(&BORN);
        assert_eq!(sync_v(&s).await.outcome, NodeOutcome::Routed);
        let a = sync_a(&s, inside).await;
        assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)], "{inside}");
        assert_lost_to_victim(&a, inside);
        assert_eq!(conflicting(&metrics), 1, "{inside}");
        assert_eq!(metrics.failing_nodes.get(), 1, "{inside}");
        // The victim is not blamed, and its route is not touched again.
        backend.take_calls();
        assert_eq!(sync_v(&s).await.outcome, NodeOutcome::Routed);
        assert!(backend.take_calls().is_empty(), "{inside}");
    }
}

#[tokio::test]
async fn a_later_node_whose_pod_cidr_contains_an_earlier_nodes_gets_no_route_and_the_earlier_keeps_its_own(
) {
    for around in ["10.244.0.0/23", "10.244.0.0/16", "10.0.0.0/8"] {
        let (backend, s, _) = syncer_born(&BORN);
        sync_v(&s).await;
        let a = sync_a(&s, around).await;
        assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)], "{around}");
        assert_lost_to_victim(&a, around);
    }
}

#[tokio::test]
async fn a_later_node_with_an_equal_pod_cidr_gets_no_route_even_when_it_syncs_first_and_its_name_sorts_first(
) {
    let (backend, s, _) = syncer_born(&BORN);
    let first = sync_a(&s, VICTIM_CIDR).await;
    // Nothing else asks for it yet: the attacker routes it, as any lone Node would.
    assert_eq!(first.outcome, NodeOutcome::Routed);
    let v = sync_v(&s).await;
    assert_eq!(
        v.outcome,
        NodeOutcome::Routed,
        "the earlier Node takes it over"
    );
    assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)]);
    assert_eq!(requeued(&v), [ATTACKER]);
    assert_lost_to_victim(&sync_a(&s, VICTIM_CIDR).await, VICTIM_CIDR);
    assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)]);
}

#[tokio::test]
async fn the_earlier_node_syncing_after_a_later_overlapping_one_has_its_route_and_the_later_loses_its_own(
) {
    for cidr in ["10.244.0.128/25", "10.244.0.7/32", "10.244.0.0/23"] {
        let (backend, s, _) = syncer_born(&BORN);
        assert_eq!(sync_a(&s, cidr).await.outcome, NodeOutcome::Routed);
        let v = sync_v(&s).await;
        assert_eq!(v.outcome, NodeOutcome::Routed, "{cidr}");
        let a = sync_a(&s, cidr).await;
        assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)], "{cidr}");
        assert_lost_to_victim(&a, cidr);
        assert_eq!(requeued(&v), [ATTACKER], "{cidr}");
        assert!(
            backend
                .take_calls()
                .contains(&format!("delete {cidr} via {ATTACKER_GW}")),
            "{cidr}"
        );
    }
}

#[tokio::test]
async fn overlapping_ipv6_pod_cidrs_are_routed_only_to_the_earlier_node() {
    let (backend, s, _) = syncer_born(&BORN);
    let v = s
        .sync_node(
            VICTIM,
            Some(&n(VICTIM, "fd00:10:244:1::/64", "2001:db8::1")),
        )
        .await
        .expect("sync");
    assert_eq!(v.outcome, NodeOutcome::Routed);
    for cidr in [
        "fd00:10:244:1::/80",
        "fd00:10:244:1::7/128",
        "fd00:10:244::/48",
        "fd00:10:244:1::/64",
    ] {
        let a = s
            .sync_node(ATTACKER, Some(&n(ATTACKER, cidr, "2001:db8::66")))
            .await
            .expect("sync");
        assert_lost_to_victim(&a, cidr);
        assert_eq!(
            backend.table(),
            [route("fd00:10:244:1::/64", "2001:db8::1")],
            "{cidr}"
        );
    }
}

#[tokio::test]
async fn a_dual_stack_node_loses_only_the_family_whose_pod_cidr_overlaps_an_earlier_nodes() {
    let (backend, s, _) = syncer_born(&BORN);
    let dual = |name: &str, v4: &str, v6: &str, last: u8| {
        node(
            name,
            &[v4, v6],
            &[
                ("InternalIP", &format!("192.0.2.{last}")),
                ("InternalIP", &format!("2001:db8::{last}")),
            ],
            &[],
        )
    };
    let v = dual(VICTIM, VICTIM_CIDR, "fd00:10:244:1::/64", 1);
    assert_eq!(
        s.sync_node(VICTIM, Some(&v)).await.expect("sync").outcome,
        NodeOutcome::Routed
    );
    // IPv4 inside the victim's, IPv6 its own.
    let a = dual(ATTACKER, "10.244.0.64/26", "fd00:10:244:2::/64", 66);
    let lost = failures(s.sync_node(ATTACKER, Some(&a)).await.expect("sync").outcome);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].destination, net("10.244.0.64/26"));
    assert_eq!(event_reason(&lost[0]), "RouteCIDRConflict");
    assert_eq!(
        backend.table(),
        [
            route(VICTIM_CIDR, "192.0.2.1"),
            route("fd00:10:244:1::/64", "2001:db8::1"),
            route("fd00:10:244:2::/64", "2001:db8::66"),
        ]
    );
    // And the other way round: IPv6 inside, IPv4 its own.
    let a = dual(ATTACKER, "10.244.9.0/24", "fd00:10:244:1:8000::/65", 66);
    let lost = failures(s.sync_node(ATTACKER, Some(&a)).await.expect("sync").outcome);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].destination, net("fd00:10:244:1:8000::/65"));
    assert_eq!(
        backend.table(),
        [
            route(VICTIM_CIDR, "192.0.2.1"),
            route("10.244.9.0/24", "192.0.2.66"),
            route("fd00:10:244:1::/64", "2001:db8::1"),
        ]
    );
}

#[tokio::test]
async fn when_the_earlier_node_is_deleted_the_later_one_is_synced_again_and_gets_its_route() {
    let (backend, s, metrics) = syncer_born(&BORN);
    sync_v(&s).await;
    assert_lost_to_victim(&sync_a(&s, "10.244.0.128/25").await, "10.244.0.128/25");
    let gone = s.sync_node(VICTIM, None).await.expect("sync");
    assert_eq!(requeued(&gone), [ATTACKER]);
    assert!(backend.table().is_empty());
    assert_eq!(
        sync_a(&s, "10.244.0.128/25").await.outcome,
        NodeOutcome::Routed
    );
    assert_eq!(backend.table(), [route("10.244.0.128/25", ATTACKER_GW)]);
    assert_eq!(conflicting(&metrics), 0);
}

#[tokio::test]
async fn a_node_deleted_and_created_again_is_the_later_one_and_yields_to_the_node_that_stayed() {
    // The victim's Node is re-created (new uid) after the attacker registered: the API server's
    // creation times make the attacker the earlier Node. This is the rule's known limit.
    let born = [
        ("uid-victim", 1),
        ("uid-attacker", 2),
        ("uid-victim-again", 3),
    ];
    let mut again = full_node(VICTIM, &[VICTIM_CIDR], &[("InternalIP", VICTIM_GW)], &[]);
    again.metadata.uid = Some("uid-victim-again".into());
    let again = CachedNode::from(&again);
    let (backend, s, _) = syncer_born(&born);
    sync_v(&s).await;
    sync_a(&s, "10.244.0.128/25").await;
    // The delete and the re-creation reach the sync as one change of the Node.
    let v = s.sync_node(VICTIM, Some(&again)).await.expect("sync");
    let lost = failures(v.outcome.clone());
    assert_eq!(event_reason(&lost[0]), "RouteCIDRConflict", "{lost:?}");
    assert!(lost[0].reason.contains(ATTACKER), "{lost:?}");
    assert_eq!(requeued(&v), [ATTACKER]);
    assert_eq!(
        sync_a(&s, "10.244.0.128/25").await.outcome,
        NodeOutcome::Routed
    );
    assert_eq!(backend.table(), [route("10.244.0.128/25", ATTACKER_GW)]);
}

#[tokio::test]
async fn with_many_nodes_only_the_later_overlapping_ones_lose_and_nodes_without_overlap_cost_no_lookup(
) {
    const NODES: u32 = 50_000;
    let name = |i: u32| format!("node-{i}");
    let cidr = |i: u32| format!("10.{}.{}.0/24", i / 256, i % 256);
    let gw = |i: u32| format!("172.16.{}.{}", i / 256, i % 256);
    let mut born: Vec<(String, i64)> = (0..NODES)
        .map(|i| (format!("uid-{}", name(i)), i64::from(i)))
        .collect();
    // Registered after every other Node: a /32 inside one, a /16 over 256, a copy of one.
    let attackers = [
        ("attacker-32", "10.0.7.9/32"),
        ("attacker-16", "10.3.0.0/16"),
        ("attacker-copy", "10.0.100.0/24"),
    ];
    for (a, _) in attackers {
        born.push((format!("uid-{a}"), i64::from(NODES) + 1));
    }
    let born: Vec<(&str, i64)> = born.iter().map(|(u, t)| (u.as_str(), *t)).collect();
    let (backend, s, metrics, births) = syncer_and_births(None, &CLUSTER_CIDRS, &born);
    let mut nodes: Vec<Arc<CachedNode>> = (0..NODES)
        .map(|i| Arc::new(n(&name(i), &cidr(i), &gw(i))))
        .collect();
    for (a, c) in attackers {
        nodes.push(Arc::new(n(a, c, "192.0.2.66")));
    }
    s.reconcile(&nodes).await.expect("reconcile");
    // The attackers sync first.
    for node in nodes.iter().rev() {
        s.sync_node(node.name(), Some(node)).await.expect("sync");
    }
    let table = backend.table();
    assert_eq!(table.len(), NODES as usize);
    assert!(
        table
            .iter()
            .all(|r| r.gateway.to_string().starts_with("172.16.")),
        "an attacker has a route"
    );
    for (a, c) in attackers {
        let lost = failures(
            s.sync_node(a, Some(&n(a, c, "192.0.2.66")))
                .await
                .expect("sync")
                .outcome,
        );
        assert_eq!(event_reason(&lost[0]), "RouteCIDRConflict", "{a}: {lost:?}");
    }
    assert_eq!(conflicting(&metrics), 3);
    assert_eq!(metrics.failing_nodes.get(), 3);
    // Creation times are read for the 3 attackers and the 258 Nodes they overlap, each once at most.
    let reads = births.reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(reads <= 3 + 258, "{reads} reads");
}

#[tokio::test]
async fn after_a_restart_a_later_nodes_overlapping_route_left_in_the_table_is_deleted_whichever_syncs_first(
) {
    for attacker_first in [true, false] {
        let (backend, s, _) = syncer_born(&BORN);
        // Left by a process that routed both.
        for (dst, gw) in [(VICTIM_CIDR, VICTIM_GW), ("10.244.0.128/25", ATTACKER_GW)] {
            backend
                .ours
                .lock()
                .expect("lock")
                .insert(net(dst), gw.parse().expect("ip"));
        }
        let v = Arc::new(n(VICTIM, VICTIM_CIDR, VICTIM_GW));
        let a = Arc::new(n(ATTACKER, "10.244.0.128/25", ATTACKER_GW));
        let report = s
            .reconcile(&[v.clone(), a.clone()])
            .await
            .expect("reconcile");
        assert!(report.requeue.contains(&ATTACKER.to_string()), "{report:?}");
        let mut order = [v, a];
        if attacker_first {
            order.reverse();
        }
        for node in &order {
            s.sync_node(node.name(), Some(node)).await.expect("sync");
        }
        assert_eq!(
            backend.table(),
            [route(VICTIM_CIDR, VICTIM_GW)],
            "attacker first: {attacker_first}"
        );
    }
}

#[tokio::test]
async fn a_full_reconcile_that_knows_the_creation_times_deletes_a_later_nodes_overlapping_route_as_the_startup_sweep_does(
) {
    let (backend, s, _, births) = syncer_and_births(None, &CLUSTER_CIDRS, &BORN);
    for (dst, gw) in [(VICTIM_CIDR, VICTIM_GW), ("10.244.0.7/32", ATTACKER_GW)] {
        backend
            .ours
            .lock()
            .expect("lock")
            .insert(net(dst), gw.parse().expect("ip"));
    }
    remember(
        &s,
        &[(VICTIM, "uid-victim", 1), (ATTACKER, "uid-attacker", 2)],
    );
    let v = Arc::new(n(VICTIM, VICTIM_CIDR, VICTIM_GW));
    let a = Arc::new(n(ATTACKER, "10.244.0.7/32", ATTACKER_GW));
    let report = s.reconcile(&[a, v]).await.expect("reconcile");
    assert_eq!(report.deleted, [route("10.244.0.7/32", ATTACKER_GW)]);
    assert_eq!(report.requeue, [ATTACKER], "to report the conflict");
    assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)]);
    assert_eq!(births.reads.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_pod_cidr_this_host_refuses_as_over_its_lan_still_holds_back_a_later_one_inside_it() {
    let (backend, s, _) = syncer_born(&BORN);
    backend
        .connected
        .lock()
        .expect("lock")
        .push(net("10.244.1.0/24"));
    s.refresh_connected().await;
    let v = s
        .sync_node(VICTIM, Some(&n(VICTIM, "10.244.0.0/23", VICTIM_GW)))
        .await
        .expect("sync");
    assert!(failures(v.outcome)[0].reason.contains("directly connected"));
    // Other hosts route the victim's /23, so here too the attacker's /25 inside it is the later one.
    let a = sync_a(&s, "10.244.0.0/25").await;
    assert_lost_to_victim(&a, "10.244.0.0/25");
    assert!(backend.table().is_empty());
}

#[tokio::test]
async fn in_node_mode_every_host_routes_only_the_earlier_node_whatever_order_its_syncs_run() {
    let bystander = ("bystander", "10.244.5.0/24", "192.0.2.5");
    let everyone = [
        (VICTIM, VICTIM_CIDR, VICTIM_GW),
        (ATTACKER, "10.244.0.128/25", ATTACKER_GW),
        bystander,
    ];
    let born = [("uid-victim", 1), ("uid-attacker", 3), ("uid-bystander", 2)];
    for (host, _, _) in everyone {
        for reversed in [false, true] {
            let (backend, s, _) = syncer_with(Some(host), &[], &born);
            let mut order = everyone.to_vec();
            if reversed {
                order.reverse();
            }
            let nodes: Vec<Arc<CachedNode>> = order
                .iter()
                .map(|(name, c, gw)| Arc::new(n(name, c, gw)))
                .collect();
            s.reconcile(&nodes).await.expect("reconcile");
            // Twice: what the first round decides is final.
            for _ in 0..2 {
                for node in &nodes {
                    s.sync_node(node.name(), Some(node)).await.expect("sync");
                }
            }
            let want: Vec<Route> = [(VICTIM, VICTIM_CIDR, VICTIM_GW), bystander]
                .iter()
                .filter(|(name, _, _)| *name != host)
                .map(|(_, c, gw)| route(c, gw))
                .collect();
            let mut want = want;
            want.sort();
            assert_eq!(backend.table(), want, "host {host}, reversed {reversed}");
        }
    }
}

#[tokio::test]
async fn while_creation_times_cannot_be_read_no_contested_route_is_created_and_none_is_taken_away()
{
    let (backend, s, _, births) = syncer_and_births(None, &CLUSTER_CIDRS, &BORN);
    births.readable(false);
    assert_eq!(sync_v(&s).await.outcome, NodeOutcome::Routed);
    let a = sync_a(&s, "10.244.0.128/25").await;
    assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)]);
    // Not a failure to report yet: the sync is tried again.
    assert_eq!(a.outcome, NodeOutcome::Waiting);
    assert!(retries(&a));
    backend.take_calls();
    assert_eq!(sync_v(&s).await.outcome, NodeOutcome::Routed);
    assert!(backend.take_calls().is_empty());
    births.readable(true);
    assert_lost_to_victim(&sync_a(&s, "10.244.0.128/25").await, "10.244.0.128/25");
}

// ---- attacks ----

#[tokio::test]
async fn a_default_like_or_wide_pod_cidr_covering_every_node_gets_no_route_and_takes_none_away() {
    let born = [("uid-victim", 1), ("uid-other", 1), ("uid-attacker", 2)];
    for wide in ["0.0.0.0/0", "0.0.0.0/1", "10.0.0.0/9", "10.0.0.0/8"] {
        let (backend, s, _) = syncer_born(&born);
        sync_v(&s).await;
        let other = s
            .sync_node("other", Some(&n("other", "10.99.0.0/24", "192.0.2.3")))
            .await
            .expect("sync");
        assert_eq!(other.outcome, NodeOutcome::Routed, "{wide}");
        let lost = failures(sync_a(&s, wide).await.outcome);
        assert_eq!(lost.len(), 1, "{wide}: {lost:?}");
        assert_eq!(
            backend.table(),
            [
                route("10.99.0.0/24", "192.0.2.3"),
                route(VICTIM_CIDR, VICTIM_GW)
            ],
            "{wide}"
        );
        // Neither Node loses its route to it afterwards.
        backend.take_calls();
        sync_v(&s).await;
        s.sync_node("other", Some(&n("other", "10.99.0.0/24", "192.0.2.3")))
            .await
            .expect("sync");
        assert!(backend.take_calls().is_empty(), "{wide}");
    }
}

#[tokio::test]
async fn an_ipv4_mapped_ipv6_pod_cidr_gets_no_route_even_where_every_destination_is_netcms() {
    // Node mode without --cluster-cidr: every destination that is not default-like counts as netcm's.
    let (backend, s, _) = syncer_with(None, &[], &BORN);
    sync_v(&s).await;
    for mapped in [
        "::ffff:10.244.0.0/120",
        "::ffff:10.244.0.128/121",
        "::ffff:0:0/96",
    ] {
        let a = s
            .sync_node(ATTACKER, Some(&n(ATTACKER, mapped, "2001:db8::66")))
            .await
            .expect("sync");
        let lost = failures(a.outcome);
        assert!(lost[0].reason.contains("IPv4-mapped"), "{mapped}: {lost:?}");
        assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)], "{mapped}");
    }
}

#[tokio::test]
async fn a_pod_cidr_written_with_host_bits_counts_as_its_network_and_conflicts_like_it() {
    for sloppy in ["10.244.0.7/24", "10.244.0.200/25", "10.244.1.7/23"] {
        let (backend, s, _) = syncer_born(&BORN);
        // The attacker first, with a name that sorts first: neither may win it the route.
        sync_a(&s, sloppy).await;
        sync_v(&s).await;
        let a = sync_a(&s, sloppy).await;
        let lost = failures(a.outcome);
        assert_eq!(
            event_reason(&lost[0]),
            "RouteCIDRConflict",
            "{sloppy}: {lost:?}"
        );
        assert_eq!(
            lost[0].destination,
            net(sloppy).trunc(),
            "{sloppy}: the network is what is routed and compared"
        );
        assert_eq!(backend.table(), [route(VICTIM_CIDR, VICTIM_GW)], "{sloppy}");
    }
    // With leading zeros it is read as decimal, as Kubernetes' ParseCIDRSloppy reads it: the same
    // network, which conflicts. With padding it is no CIDR at all: it claims and routes nothing.
    let (backend, s, _) = syncer_born(&BORN);
    sync_v(&s).await;
    assert_lost_to_victim(&sync_a(&s, "010.244.000.000/24").await, "leading zeros");
    for unparsable in [" 10.244.0.0/24", "10.244.0.0/24 ", "10.244.0.0/024x"] {
        let a = sync_a(&s, unparsable).await;
        assert_eq!(a.outcome, NodeOutcome::NotApplicable, "{unparsable:?}");
        assert_eq!(
            backend.table(),
            [route(VICTIM_CIDR, VICTIM_GW)],
            "{unparsable:?}"
        );
    }
}

#[tokio::test]
async fn an_attacker_changing_its_pod_cidr_again_and_again_never_gets_a_route_and_never_moves_the_victims(
) {
    let (backend, s, metrics) = syncer_born(&BORN);
    sync_v(&s).await;
    let steps = [
        "10.244.0.128/25",
        "10.244.0.7/32",
        "10.244.0.0/24",
        "10.244.0.0/22",
        "10.244.0.64/26",
        "10.244.0.0/24",
        "10.244.0.255/32",
    ];
    for round in 0..3 {
        for cidr in steps {
            backend.take_calls();
            let a = sync_a(&s, cidr).await;
            assert_lost_to_victim(&a, cidr);
            assert_eq!(
                backend.table(),
                [route(VICTIM_CIDR, VICTIM_GW)],
                "round {round}, {cidr}"
            );
            assert!(
                backend
                    .take_calls()
                    .iter()
                    .all(|c| !c.contains(VICTIM_GW) && !c.starts_with("create")),
                "round {round}, {cidr}"
            );
            // Whatever the attacker asks for, the victim's sync changes nothing.
            assert_eq!(sync_v(&s).await.outcome, NodeOutcome::Routed);
            assert!(backend.take_calls().is_empty(), "round {round}, {cidr}");
        }
    }
    assert_eq!(conflicting(&metrics), 1);
    // Once it asks for a pod CIDR of its own, it gets its route.
    assert_eq!(
        sync_a(&s, "10.244.7.0/24").await.outcome,
        NodeOutcome::Routed
    );
    assert_eq!(conflicting(&metrics), 0);
}

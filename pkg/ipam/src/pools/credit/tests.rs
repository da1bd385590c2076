//! Tests of the credit: pools sharing a range each count, drain and reuse only what they handed out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::pool::{ObjectPool, PoolSpec, PoolState};
use crate::selector::{NodeSelector, NodeView, Requirement, SelectorTerm};
use crate::test_fixtures::{net, nets, pools};
use crate::Pools;

/// Nodes labelled `group=<group>`.
fn group(group: &str) -> NodeSelector {
    NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: vec![Requirement {
            key: "group".into(),
            operator: "In".parse().unwrap(),
            values: vec![group.into()],
        }],
        match_fields: vec![],
    }])
}

/// A ClusterCIDR `name` selecting `group=<name>` over `range` with /24 node CIDRs.
fn shared(name: &str, range: &str, deleting: bool) -> ObjectPool {
    ObjectPool {
        name: name.into(),
        uid: format!("uid-{name}"),
        spec: Ok(PoolSpec {
            selector: group(name),
            per_node_host_bits: 8,
            ipv4: Some(net(range)),
            ipv6: None,
            sizing: None,
        }),
        deleting,
        modified: false,
    }
}

/// A full flag pool elsewhere (one /24, held), and ClusterCIDRs "a" and "b" sharing 10.1.0.0/23: two
/// /24s between them.
fn a_and_b() -> Pools {
    let mut p = pools("10.0.0.0/24", "");
    p.record("uid-f", &nets(&["10.0.0.0/24"]));
    let report = p.sync_objects(&[
        shared("a", "10.1.0.0/23", false),
        shared("b", "10.1.0.0/23", false),
    ]);
    assert_eq!(report.activated, ["a", "b"]);
    p
}

/// Allocates for the Node `name` (its UID `uid-<name>`) labelled `group=<group>`; its pool and CIDRs.
fn allocate(
    p: &mut Pools,
    name: &str,
    group: &str,
) -> Result<(String, Vec<ipnet::IpNet>), crate::Error> {
    let labels = BTreeMap::from([("group".to_string(), group.to_string())]);
    p.allocate_for(
        &format!("uid-{name}"),
        &NodeView {
            name,
            labels: &labels,
            provider_id: None,
        },
    )
    .map(|a| (a.pool, a.cidrs))
}

fn holders(p: &Pools, pool: &str) -> usize {
    p.report(pool).unwrap().holders
}

#[test]
fn pools_sharing_a_range_each_count_only_the_nodes_they_served() {
    let mut p = a_and_b();
    allocate(&mut p, "b1", "b").unwrap();
    assert_eq!((holders(&p, "a"), holders(&p, "b")), (0, 1));
    allocate(&mut p, "a1", "a").unwrap();
    assert_eq!((holders(&p, "a"), holders(&p, "b")), (1, 1));
    p.release_node("uid-b1");
    assert_eq!((holders(&p, "a"), holders(&p, "b")), (1, 0));
}

#[test]
fn a_deleted_pool_sharing_a_range_drains_when_its_own_nodes_are_gone() {
    let mut p = a_and_b();
    allocate(&mut p, "a1", "a").unwrap();
    allocate(&mut p, "b1", "b").unwrap();
    p.sync_objects(&[
        shared("a", "10.1.0.0/23", true),
        shared("b", "10.1.0.0/23", false),
    ]);
    assert!(!p.drained("a"), "a's Node still holds its CIDR");
    p.release_node("uid-a1");
    assert!(p.drained("a"), "only b's Node holds a CIDR of the range");
}

#[test]
fn a_node_of_the_second_pool_sharing_a_range_takes_that_pools_held_cidr_when_the_range_is_full() {
    let mut p = a_and_b();
    let (pool, b1) = allocate(&mut p, "b1", "b").unwrap();
    assert_eq!(pool, "b");
    allocate(&mut p, "a1", "a").unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    assert_eq!(p.release_node_with_hold("uid-b1", "b1", None, until), b1);

    let (pool, b2) = allocate(&mut p, "b2", "b").expect("b holds a free CIDR");
    assert_eq!((pool.as_str(), b2), ("b", b1));
}

#[test]
fn a_release_hold_counts_in_the_stats_of_the_pool_whose_node_released_it() {
    let mut p = a_and_b();
    allocate(&mut p, "b1", "b").unwrap();
    p.release_node_with_hold(
        "uid-b1",
        "b1",
        None,
        Instant::now() + Duration::from_secs(60),
    );
    let held = |pool: &str| -> u64 {
        p.stats()
            .iter()
            .filter(|s| s.pool == pool)
            .map(|s| s.release_hold)
            .sum()
    };
    assert_eq!((held("a"), held("b")), (0, 1));
}

#[test]
fn nodes_recorded_before_their_pool_exists_are_its_holders_once_it_does() {
    let mut p = pools("10.0.0.0/16", "");
    p.record("uid-x", &nets(&["10.1.0.0/24"]));
    p.sync_objects(&[shared("a", "10.1.0.0/23", false)]);
    assert_eq!(holders(&p, "a"), 1);
}

#[test]
fn the_nodes_of_a_pool_that_is_gone_count_for_a_pool_sharing_its_range() {
    let mut p = a_and_b();
    allocate(&mut p, "a1", "a").unwrap();
    // The object went without its finalizer (removed by hand): its Node still holds the CIDR.
    p.sync_objects(&[shared("b", "10.1.0.0/23", false)]);
    assert_eq!(holders(&p, "b"), 1);
    assert_eq!(p.report("b").unwrap().state, PoolState::Active);
}

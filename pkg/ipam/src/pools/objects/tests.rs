//! Tests of ClusterCIDR pools: selection, refusal, draining.

use std::collections::BTreeMap;

use super::*;
use crate::error::Error;
use crate::pool::DEFAULT_POOL;
use crate::selector::{NodeSelector, NodeView, Requirement, SelectorTerm};
use crate::test_fixtures::{net, pools};

mod rank;

fn exists(key: &str) -> NodeSelector {
    NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: vec![Requirement {
            key: key.into(),
            operator: "Exists".parse().unwrap(),
            values: vec![],
        }],
        match_fields: vec![],
    }])
}

fn obj(name: &str, selector: NodeSelector, bits: i64, v4: &str, v6: &str) -> ObjectPool {
    ObjectPool {
        name: name.into(),
        uid: format!("uid-{name}"),
        spec: Ok(PoolSpec {
            selector,
            per_node_host_bits: bits,
            ipv4: (!v4.is_empty()).then(|| net(v4)),
            ipv6: (!v6.is_empty()).then(|| net(v6)),
            sizing: None,
        }),
        deleting: false,
        modified: false,
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn alloc(
    p: &mut Pools,
    name: &str,
    l: &BTreeMap<String, String>,
) -> Result<(String, Vec<String>), Error> {
    p.allocate_for(
        name,
        &NodeView {
            name,
            labels: l,
            provider_id: None,
        },
    )
    .map(|a| (a.pool, a.cidrs.iter().map(ToString::to_string).collect()))
}

fn state(p: &Pools, name: &str) -> PoolState {
    p.reports()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap()
        .state
}

#[test]
fn a_gpu_pool_serves_gpu_nodes_with_its_own_mask_and_the_flag_pool_the_rest() {
    let mut p = pools("10.244.0.0/16", "");
    let gpu = NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: vec![Requirement {
            key: "node-role".into(),
            operator: "In".parse().unwrap(),
            values: vec!["gpu".into()],
        }],
        match_fields: vec![],
    }]);
    let r = p.sync_objects(&[obj("gpu", gpu, 6, "10.100.0.0/24", "fd00:100::/120")]);
    assert_eq!(r.activated, ["gpu"]);
    let (pool, cidrs) = alloc(&mut p, "g1", &labels(&[("node-role", "gpu")])).unwrap();
    assert_eq!(
        (pool.as_str(), cidrs),
        ("gpu", vec!["10.100.0.0/26".into(), "fd00:100::/122".into()])
    );
    let (pool, cidrs) = alloc(&mut p, "c1", &labels(&[("node-role", "cpu")])).unwrap();
    assert_eq!(
        (pool.as_str(), cidrs),
        (DEFAULT_POOL, vec!["10.244.0.0/24".to_string()])
    );
}

#[test]
fn a_new_pool_serves_nodes_that_found_every_pool_full() {
    let mut p = pools("10.250.0.0/24", "");
    let none = labels(&[]);
    alloc(&mut p, "a", &none).unwrap();
    assert!(matches!(alloc(&mut p, "b", &none), Err(Error::Full { .. })));
    let r = p.sync_objects(&[obj("more", NodeSelector::Fallback, 8, "10.251.0.0/24", "")]);
    assert_eq!(r.activated, ["more"]);
    assert_eq!(alloc(&mut p, "b", &none).unwrap().1, ["10.251.0.0/24"]);
    assert!(matches!(
        alloc(&mut p, "c", &none),
        Err(Error::PoolsFull { pools }) if pools.len() == 2
    ));
}

#[test]
fn a_deleted_pool_drains_gives_nothing_new_and_is_released_when_its_last_holder_goes() {
    let mut p = pools("10.244.0.0/16", "");
    let big = labels(&[("big", "")]);
    let mut o = obj("big", exists("big"), 8, "10.50.0.0/16", "");
    p.sync_objects(std::slice::from_ref(&o));
    assert_eq!(alloc(&mut p, "a", &big).unwrap().0, "big");
    o.deleting = true;
    p.sync_objects(std::slice::from_ref(&o));
    assert_eq!(state(&p, "big"), PoolState::Draining);
    assert!(!p.drained("big"));
    assert_eq!(alloc(&mut p, "b", &big).unwrap().0, DEFAULT_POOL);
    p.release_node("a");
    assert!(p.drained("big"));
    let r = p.sync_objects(&[]);
    assert_eq!(r.removed, ["big"]);
    assert_eq!(p.reports().len(), 1);
}

#[test]
fn a_deleted_pool_ends_its_release_holds_so_only_its_nodes_keep_it_draining() {
    let mut p = pools("10.244.0.0/16", "");
    let big = labels(&[("big", "")]);
    let mut o = obj("big", exists("big"), 8, "10.50.0.0/16", "");
    p.sync_objects(std::slice::from_ref(&o));
    alloc(&mut p, "a", &big).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    p.release_node_with_hold("a", "node-a", None, until);
    o.deleting = true;
    p.sync_objects(std::slice::from_ref(&o));
    assert!(
        p.drained("big"),
        "a release hold must not keep a deleted pool alive"
    );
    assert_eq!(p.next_release_hold_end(), None);
}

#[test]
fn an_object_recreated_under_its_name_is_a_new_pool() {
    let mut p = pools("10.244.0.0/16", "");
    let mut o = obj("x", exists("x"), 8, "10.50.0.0/16", "");
    p.sync_objects(std::slice::from_ref(&o));
    o.deleting = true;
    p.sync_objects(std::slice::from_ref(&o));
    assert_eq!(state(&p, "x"), PoolState::Draining);
    let mut again = obj("x", exists("x"), 8, "10.50.0.0/16", "");
    again.uid = "uid-x2".into();
    let r = p.sync_objects(&[again]);
    assert_eq!(
        (r.removed, r.activated),
        (vec!["x".to_string()], vec!["x".to_string()])
    );
    assert_eq!(state(&p, "x"), PoolState::Active);
}

#[test]
fn a_new_leader_sees_a_draining_pool_held_by_existing_nodes() {
    let mut p = pools("10.244.0.0/16", "");
    p.record_and_check("uid-a", &[net("10.50.3.0/24")]);
    let mut o = obj("big", exists("big"), 8, "10.50.0.0/16", "");
    o.deleting = true;
    p.sync_objects(&[o]);
    assert_eq!(state(&p, "big"), PoolState::Draining);
    assert!(!p.drained("big"));
    assert_eq!(p.reports()[1].holders, 1);
}

#[test]
fn a_partial_overlap_is_refused_until_the_pool_it_overlaps_is_gone() {
    let mut p = pools("10.244.0.0/16", "");
    let a = obj("a", NodeSelector::Fallback, 8, "10.60.0.0/16", "");
    let b = obj("b", NodeSelector::Fallback, 8, "10.60.128.0/17", "");
    p.sync_objects(&[a.clone(), b.clone()]);
    assert!(matches!(
        state(&p, "b"),
        PoolState::Refused(Refusal::PoolOverlap { ref pool, .. }) if pool == "a"
    ));
    assert!(
        p.drained("b"),
        "a refused pool holds nothing, so its finalizer may go"
    );
    let r = p.sync_objects(std::slice::from_ref(&b));
    assert_eq!(
        (r.removed, r.activated),
        (vec!["a".to_string()], vec!["b".to_string()])
    );
}

#[test]
fn pools_sharing_one_range_with_different_masks_never_hand_out_overlapping_cidrs() {
    let mut p = pools("10.244.0.0/16", "");
    let small = obj("small", exists("small"), 6, "10.244.0.0/16", "");
    let large = obj("large", exists("large"), 10, "10.244.0.0/16", "");
    p.sync_objects(&[small, large]);
    assert_eq!(state(&p, "large"), PoolState::Active);
    let mut got: Vec<IpNet> = Vec::new();
    for i in 0..40 {
        let (role, pool) = [
            ("small", "small"),
            ("large", "large"),
            ("other", DEFAULT_POOL),
        ][i % 3];
        let (from, cidrs) = alloc(&mut p, &format!("n{i}"), &labels(&[(role, "")])).unwrap();
        assert_eq!(from, pool);
        let c = net(&cidrs[0]);
        assert!(
            got.iter().all(|g| !Span::of(g).overlaps(&Span::of(&c))),
            "{c} overlaps"
        );
        got.push(c);
    }
}

#[test]
fn a_pool_overlapping_the_service_range_is_refused() {
    let mut p = pools("10.244.0.0/16", "10.96.0.0/12");
    p.sync_objects(&[obj("svc", NodeSelector::Fallback, 8, "10.96.0.0/16", "")]);
    assert_eq!(state(&p, "svc").phase(), "Refused");
    assert_eq!(
        state(&p, "svc"),
        PoolState::Refused(Refusal::ServiceRangeOverlap {
            range: net("10.96.0.0/16"),
            service_range: net("10.96.0.0/12"),
        })
    );
}

#[test]
fn a_pool_inside_a_node_cidr_held_outside_every_pool_is_refused() {
    let mut p = pools("10.244.0.0/16", "");
    p.record_and_check("uid-x", &[net("10.70.0.0/15")]);
    p.sync_objects(&[obj("x", NodeSelector::Fallback, 8, "10.70.0.0/16", "")]);
    assert_eq!(state(&p, "x").phase(), "Refused");
    // A Node CIDR inside the new range is simply kept in use.
    p.record_and_check("uid-y", &[net("10.80.3.0/24")]);
    p.sync_objects(&[obj("y", NodeSelector::Fallback, 8, "10.80.0.0/16", "")]);
    assert_eq!(state(&p, "y"), PoolState::Active);
    let y = p.reports().into_iter().find(|r| r.name == "y").unwrap();
    assert_eq!(y.holders, 1);
}

#[test]
fn invalid_and_modified_specs_are_refused_with_the_reason() {
    let mut p = pools("10.244.0.0/16", "");
    let mut modified = obj("m", NodeSelector::Fallback, 8, "10.1.0.0/16", "");
    modified.modified = true;
    let mut unreadable = obj("u", NodeSelector::Fallback, 8, "10.2.0.0/16", "");
    unreadable.spec = Err("\"Near\" is not a valid node selector operator".into());
    p.sync_objects(&[
        obj("tiny", NodeSelector::Fallback, 3, "10.3.0.0/16", ""),
        obj("huge", NodeSelector::Fallback, 17, "10.4.0.0/16", ""),
        obj("swapped", NodeSelector::Fallback, 8, "fd00::/64", ""),
        obj("empty", NodeSelector::Fallback, 8, "", ""),
        modified,
        unreadable,
    ]);
    for name in ["tiny", "huge", "swapped", "empty", "u"] {
        assert!(
            matches!(state(&p, name), PoolState::Refused(Refusal::Invalid(_))),
            "{name}"
        );
    }
    assert_eq!(state(&p, "m"), PoolState::Refused(Refusal::Modified));
    assert_eq!(Refusal::Modified.reason(), "ClusterCIDRModified");
}

#[test]
fn candidates_rank_specific_then_small_then_narrow_then_by_name_and_the_fallback_last() {
    let mut p = pools("10.244.0.0/16", "");
    let two = NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: ["a", "b"]
            .iter()
            .map(|k| Requirement {
                key: k.to_string(),
                operator: "Exists".parse().unwrap(),
                values: vec![],
            })
            .collect(),
        match_fields: vec![],
    }]);
    p.sync_objects(&[
        obj(
            "fallback-small",
            NodeSelector::Fallback,
            8,
            "10.9.0.0/24",
            "",
        ),
        obj("one-big", exists("a"), 8, "10.10.0.0/16", ""),
        obj("one-small", exists("a"), 8, "10.11.0.0/20", ""),
        obj("one-small-narrow", exists("a"), 6, "10.12.0.0/22", ""),
        obj("one-small-b", exists("a"), 8, "10.13.0.0/20", ""),
        obj("two", two, 8, "10.14.0.0/16", ""),
        obj("all", NodeSelector::Terms(vec![]), 8, "10.15.0.0/16", ""),
    ]);
    let l = labels(&[("a", ""), ("b", "")]);
    let order: Vec<String> = p
        .candidates(&NodeView {
            name: "n",
            labels: &l,
            provider_id: None,
        })
        .into_iter()
        .map(|i| p.reports()[i].name.clone())
        .collect();
    assert_eq!(
        order,
        [
            "two",
            "one-small-narrow",
            "one-small",
            "one-small-b",
            "one-big",
            "all",
            "fallback-small",
            DEFAULT_POOL
        ]
    );
}

#[test]
fn stats_name_the_pool_of_every_cluster_cidr() {
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[obj(
        "gpu",
        exists("gpu"),
        6,
        "10.100.0.0/24",
        "fd00:100::/120",
    )]);
    let s: Vec<(String, String)> = p
        .stats()
        .into_iter()
        .map(|s| (s.pool, s.cluster_cidr))
        .collect();
    assert_eq!(
        s,
        [
            (DEFAULT_POOL.to_string(), "10.244.0.0/16".to_string()),
            ("gpu".into(), "10.100.0.0/24".into()),
            ("gpu".into(), "fd00:100::/120".into()),
        ]
    );
    assert_eq!(
        p.pool_of(net("10.100.0.64/26")).map(|(n, _)| n),
        Some("gpu")
    );
}

#[test]
fn labels_are_needed_only_while_an_active_pool_selects_by_label() {
    let mut p = pools("10.244.0.0/16", "");
    assert!(!p.selects_by_label(), "the flag pool selects every Node");
    let by_name = NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: vec![],
        match_fields: vec![Requirement {
            key: "metadata.name".into(),
            operator: "In".parse().unwrap(),
            values: vec!["a".into()],
        }],
    }]);
    p.sync_objects(&[obj("by-name", by_name.clone(), 6, "10.100.0.0/24", "")]);
    assert!(!p.selects_by_label(), "a selector on names reads no label");
    p.sync_objects(&[
        obj("by-name", by_name.clone(), 6, "10.100.0.0/24", ""),
        obj("gpu", exists("gpu"), 6, "10.101.0.0/24", ""),
    ]);
    assert!(p.selects_by_label());
    p.sync_objects(&[obj("by-name", by_name, 6, "10.100.0.0/24", "")]);
    assert!(
        !p.selects_by_label(),
        "a pool that is gone no longer needs labels"
    );
}

/// `n` ClusterCIDRs inside the flag pool's 10.0.0.0/8, so all refused.
fn refused_objects(n: usize) -> Vec<ObjectPool> {
    (0..n)
        .map(|i| {
            let v4 = format!("10.{}.{}.0/24", (i >> 8) & 0xff, i & 0xff);
            obj(&format!("refused-{i}"), NodeSelector::Fallback, 4, &v4, "")
        })
        .collect()
}

#[test]
fn a_pass_over_unchanged_objects_searches_and_checks_the_pools_for_none_of_them() {
    let mut p = pools("10.0.0.0/8", "");
    let objects = refused_objects(2_000);
    p.sync_objects(&objects);
    let refused = p
        .reports()
        .iter()
        .filter(|r| r.is_object)
        .all(|r| r.state.phase() == "Refused");
    assert!(refused);
    p.object_scans = 0;
    let report = p.sync_objects(&objects);
    assert_eq!(report, SyncReport::default());
    assert_eq!(
        p.object_scans, 0,
        "an unchanged pass searched or checked the pools for objects"
    );
    assert!(matches!(
        state(&p, "refused-7"),
        PoolState::Refused(Refusal::PoolOverlap { ref pool, .. }) if pool == DEFAULT_POOL
    ));
}

#[test]
fn a_pool_refused_for_a_node_cidr_around_it_allocates_once_that_node_is_released() {
    let mut p = pools("10.244.0.0/16", "");
    p.record_and_check("uid-wide", &[net("10.70.0.0/15")]);
    let objects = [obj("x", NodeSelector::Fallback, 8, "10.70.0.0/16", "")];
    p.sync_objects(&objects);
    assert!(matches!(
        state(&p, "x"),
        PoolState::Refused(Refusal::NodeCidrOverlap { ref owner, .. }) if owner == "uid-wide"
    ));
    let epoch = p.refusal_epoch();
    p.record_and_check("uid-inside", &[net("10.244.3.0/24")]);
    p.release_node("uid-inside");
    assert_eq!(
        p.refusal_epoch(),
        epoch,
        "a CIDR inside a pool changes no refusal"
    );
    p.release_node("uid-wide");
    assert_ne!(p.refusal_epoch(), epoch);
    let r = p.sync_objects(&objects);
    assert_eq!(r.activated, ["x"]);
}

#[test]
fn a_refused_pool_is_built_again_when_its_object_changes() {
    let mut p = pools("10.244.0.0/16", "");
    let mut x = obj("x", NodeSelector::Fallback, 8, "10.71.0.0/16", "");
    x.spec = Err("nodeSelector: unknown operator".into());
    p.sync_objects(std::slice::from_ref(&x));
    assert!(matches!(
        state(&p, "x"),
        PoolState::Refused(Refusal::Invalid(_))
    ));
    let fixed = obj("x", NodeSelector::Fallback, 8, "10.71.0.0/16", "");
    assert_eq!(p.sync_objects(&[fixed]).activated, ["x"]);
}

#[test]
fn refusals_name_the_pools_as_they_stand_after_the_pass() {
    let mut p = pools("10.244.0.0/16", "10.60.0.0/20");
    // The older one overlaps the service range; the newer one, added in the same pass, overlaps it.
    let objects = [
        obj("older", NodeSelector::Fallback, 8, "10.60.0.0/16", ""),
        obj("newer", NodeSelector::Fallback, 8, "10.60.128.0/17", ""),
    ];
    p.sync_objects(&objects);
    assert_eq!(state(&p, "newer"), PoolState::Active);
    assert!(matches!(
        state(&p, "older"),
        PoolState::Refused(Refusal::PoolOverlap { ref pool, .. }) if pool == "newer"
    ));
    p.object_scans = 0;
    p.sync_objects(&objects);
    assert_eq!(p.object_scans, 0, "the pass before left nothing to check");
}

#[test]
fn while_a_migration_runs_only_its_destination_gives_out_cidrs_and_holdings_stay() {
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[obj("new", NodeSelector::Fallback, 8, "10.96.0.0/16", "")]);
    let none = labels(&[]);
    let (_, before) = alloc(&mut p, "stays", &none).expect("a pool has room");
    assert!(p.open_only(Some("new")));
    assert!(!p.open_only(Some("new")), "no change the second time");
    let (pool, cidrs) = alloc(&mut p, "moved", &none).expect("the destination has room");
    assert_eq!((pool.as_str(), cidrs[0].as_str()), ("new", "10.96.0.0/24"));
    assert_eq!(
        p.held_by("stays").map(|h| h[0].to_string()),
        Some(before[0].clone()),
        "closing a pool takes nothing from its Nodes"
    );
    assert!(p.open_only(None));
    let (_, again) = alloc(&mut p, "later", &none).expect("every pool is open again");
    assert_eq!(again.len(), 1);
}

#[test]
fn a_migration_to_a_pool_that_does_not_select_a_node_leaves_it_waiting() {
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[obj("gpu", exists("gpu"), 8, "10.96.0.0/16", "")]);
    p.open_only(Some("gpu"));
    assert!(matches!(
        alloc(&mut p, "plain", &labels(&[])),
        Err(Error::NoPool { .. })
    ));
    assert_eq!(
        alloc(&mut p, "g", &labels(&[("gpu", "")])).map(|a| a.0),
        Ok("gpu".to_string())
    );
}

//! Tests of [`Pools`]: allocation, the ownership ledger and their interplay.

use std::collections::HashSet;
use std::time::Instant;

use super::*;
use crate::outcome::{CidrFinding, RecordChange};
use crate::test_fixtures::{allocated, net, nets, pools};

#[test]
fn dual_stack_gives_one_cidr_per_family_primary_first() {
    let mut p = pools("fd00:10::/56,10.244.0.0/16", "");
    assert_eq!(
        p.allocate("a").unwrap(),
        nets(&["fd00:10::/64", "10.244.0.0/24"])
    );
    assert_eq!(
        p.allocate("b").unwrap(),
        nets(&["fd00:10:0:1::/64", "10.244.1.0/24"])
    );
}

#[test]
fn a_second_allocate_for_the_same_node_returns_the_same_cidrs() {
    let mut p = pools("10.244.0.0/16,fd00:10::/56", "");
    let first = p.allocate_detailed("a").unwrap();
    assert_eq!(first.fresh.len(), 2);
    let again = p.allocate_detailed("a").unwrap();
    assert_eq!(again.cidrs, first.cidrs);
    assert!(again.fresh.is_empty());
    assert_eq!(allocated(&p), 2);
}

#[test]
fn allocate_detailed_reports_the_cluster_cidr_and_tries() {
    let mut p = pools("10.0.0.0/16", "10.0.0.0/23");
    let a = p.allocate_detailed("a").unwrap();
    assert_eq!(
        a.fresh,
        vec![PoolTries {
            cluster: net("10.0.0.0/16"),
            cidr: net("10.0.2.0/24"),
            tries: 2
        }]
    );
}

#[test]
fn service_range_is_never_handed_out() {
    let mut p = pools("10.0.0.0/22", "10.0.1.0/24");
    let mut got = HashSet::new();
    while let Ok(c) = p.allocate(&format!("n{}", got.len())) {
        got.insert(c[0]);
    }
    assert_eq!(
        got,
        nets(&["10.0.0.0/24", "10.0.2.0/24", "10.0.3.0/24"])
            .into_iter()
            .collect()
    );
}

#[test]
fn a_service_range_larger_than_the_cluster_cidr_fills_only_that_cluster_cidr() {
    let mut p = pools("10.96.0.0/24,10.1.0.0/24", "10.96.0.0/12");
    let s = p.stats();
    assert_eq!((s[0].allocated, s[0].max), (1, 1));
    assert_eq!(s[1].allocated, 0);
    assert_eq!(p.allocate("a").unwrap(), nets(&["10.1.0.0/24"]));
}

#[test]
fn a_service_range_smaller_than_a_node_cidr_blocks_its_whole_node_cidr() {
    let mut p = pools("10.0.0.0/23", "10.0.0.16/28");
    assert_eq!(p.allocate("a").unwrap(), nets(&["10.0.1.0/24"]));
}

#[test]
fn releasing_a_node_that_overlapped_a_service_range_keeps_the_range_reserved() {
    let mut p = pools("10.0.0.0/22", "10.0.1.0/24");
    p.record_and_check("rogue", &nets(&["10.0.1.0/24"]));
    p.release_node("rogue");
    assert_eq!(allocated(&p), 1);
    let mut all = Vec::new();
    while let Ok(c) = p.allocate(&format!("n{}", all.len())) {
        all.push(c[0]);
    }
    assert!(!all.contains(&net("10.0.1.0/24")));
}

#[test]
fn exhausted_pool_returns_full_and_releases_partial_allocation() {
    let mut p = pools("10.0.0.0/24,fd00::/64", "");
    p.record_and_check("v6-hog", &nets(&["fd00::/64"]));
    let err = p.allocate("a").unwrap_err();
    assert_eq!(
        err,
        Error::Full {
            family: Family::V6,
            clusters: nets(&["fd00::/64"])
        }
    );
    assert!(err.to_string().starts_with(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
    ));
    assert!(err.to_string().contains("IPv6"));
    assert_eq!(p.stats()[0].allocated, 0, "the IPv4 CIDR was given back");
    assert_eq!(p.held_by("a"), None);
    p.release_node("v6-hog");
    assert_eq!(
        p.allocate("a").unwrap(),
        nets(&["10.0.0.0/24", "fd00::/64"])
    );
}

#[test]
fn a_second_cluster_cidr_of_the_same_family_extends_the_pool() {
    let mut p = pools("10.0.0.0/23,10.9.0.0/24", "");
    let got: Vec<IpNet> = (0..3)
        .map(|i| p.allocate(&format!("n{i}")).unwrap()[0])
        .collect();
    assert_eq!(got, nets(&["10.0.0.0/24", "10.0.1.0/24", "10.9.0.0/24"]));
    assert!(
        matches!(p.allocate("n3"), Err(Error::Full { ref clusters, .. }) if clusters.len() == 2)
    );
    // Room in the first cluster CIDR is used again first.
    p.release_node("n0");
    assert_eq!(p.allocate("n4").unwrap(), nets(&["10.0.0.0/24"]));
}

#[test]
fn allocator_never_reuses_a_cidr_that_a_node_still_holds() {
    let mut p = pools("10.0.0.0/22", "");
    p.record_and_check("a", &nets(&["10.0.0.0/24"]));
    p.record_and_check("b", &nets(&["10.0.2.0/24"]));
    let mut got = Vec::new();
    while let Ok(c) = p.allocate(&format!("n{}", got.len())) {
        got.push(c[0]);
    }
    assert_eq!(got, nets(&["10.0.1.0/24", "10.0.3.0/24"]));
}

#[test]
fn holding_the_same_cidrs_again_is_a_no_op() {
    let mut p = pools("10.0.0.0/16", "");
    let first = p.record_and_check("a", &nets(&["10.0.1.0/24"]));
    assert_eq!(first.change, RecordChange::New);
    assert!(first.is_clean());
    let again = p.record_and_check("a", &nets(&["10.0.1.5/24"]));
    assert_eq!(again.change, RecordChange::Unchanged);
    assert_eq!(allocated(&p), 1);
}

#[test]
fn holding_confirms_an_allocation_without_changing_it() {
    let mut p = pools("10.0.0.0/16", "");
    let cidrs = p.allocate("a").unwrap();
    assert_eq!(
        p.record_and_check("a", &cidrs).change,
        RecordChange::Unchanged
    );
    assert_eq!(allocated(&p), 1);
}

#[test]
fn holding_different_cidrs_replaces_the_old_ones() {
    let mut p = pools("10.0.0.0/16", "");
    p.record_and_check("a", &nets(&["10.0.1.0/24"]));
    let out = p.record_and_check("a", &nets(&["10.0.7.0/24"]));
    assert_eq!(
        out.change,
        RecordChange::Replaced {
            previous: nets(&["10.0.1.0/24"])
        }
    );
    assert_eq!(p.held_by("a"), Some(&nets(&["10.0.7.0/24"])[..]));
    assert_eq!(p.holder_of(net("10.0.1.0/24")), None);
    assert_eq!(allocated(&p), 1);
}

#[test]
fn holding_nothing_forgets_the_node() {
    let mut p = pools("10.0.0.0/16", "");
    p.record_and_check("a", &nets(&["10.0.1.0/24"]));
    let out = p.record_and_check("a", &[]);
    assert!(matches!(out.change, RecordChange::Replaced { .. }));
    assert_eq!(p.held_by("a"), None);
    assert_eq!(allocated(&p), 0);
    assert_eq!(p.record_and_check("b", &[]).change, RecordChange::Unchanged);
    assert_eq!(p.node_count(), 0);
}

#[test]
fn an_overlapping_hold_is_reported_as_a_conflict_naming_the_other_node() {
    let mut p = pools("10.0.0.0/16", "");
    p.record_and_check("a", &nets(&["10.0.0.0/23"]));
    let out = p.record_and_check("b", &nets(&["10.0.1.0/24"]));
    assert_eq!(out.change, RecordChange::New);
    assert_eq!(
        out.findings,
        vec![CidrFinding::Conflict {
            cidr: net("10.0.1.0/24"),
            other_node: "a".into(),
            other_cidr: net("10.0.0.0/23"),
        }]
    );
    assert_eq!(
        out.findings[0].to_string(),
        "pod CIDR 10.0.1.0/24 overlaps 10.0.0.0/23 held by node a"
    );
    // Both are recorded: each sees the other.
    assert_eq!(
        p.record_and_check("a", &nets(&["10.0.0.0/23"]))
            .findings
            .len(),
        1
    );
}

#[test]
fn releasing_one_of_two_conflicting_nodes_keeps_the_other_nodes_blocks() {
    let mut p = pools("10.0.0.0/22", "");
    p.record_and_check("a", &nets(&["10.0.0.0/23"]));
    p.record_and_check("b", &nets(&["10.0.1.0/24"]));
    assert_eq!(allocated(&p), 2);
    p.release_node("a");
    assert_eq!(allocated(&p), 1);
    assert_eq!(p.holder_of(net("10.0.1.0/24")), Some("b"));
    let got: Vec<IpNet> = (0..3)
        .map(|i| p.allocate(&format!("n{i}")).unwrap()[0])
        .collect();
    assert!(!got.contains(&net("10.0.1.0/24")));
    assert!(p.allocate("n4").is_err());
}

#[test]
fn releasing_a_small_cidr_keeps_its_block_when_a_sibling_still_holds_part_of_it() {
    let mut p = pools("10.0.0.0/23", "");
    p.record_and_check("a", &nets(&["10.0.0.0/26"]));
    p.record_and_check("b", &nets(&["10.0.0.64/26"]));
    assert_eq!(allocated(&p), 1);
    assert!(p.record_and_check("b", &nets(&["10.0.0.64/26"])).is_clean());
    p.release_node("a");
    assert_eq!(allocated(&p), 1);
    assert_eq!(p.allocate("c").unwrap(), nets(&["10.0.1.0/24"]));
}

#[test]
fn a_cidr_outside_every_cluster_cidr_is_reported_and_still_held() {
    let mut p = pools("10.0.0.0/16", "");
    let out = p.record_and_check("a", &nets(&["192.168.0.0/24", "fd00::/64"]));
    assert_eq!(
        out.findings,
        vec![
            CidrFinding::OutOfRange {
                cidr: net("192.168.0.0/24")
            },
            CidrFinding::OutOfRange {
                cidr: net("fd00::/64")
            },
        ]
    );
    assert_eq!(p.holder_of(net("192.168.0.0/24")), Some("a"));
    assert_eq!(allocated(&p), 0);
    assert_eq!(p.release_node("a").len(), 2);
}

#[test]
fn a_cidr_partly_outside_the_cluster_keeps_the_overlapping_blocks_in_use() {
    let mut p = pools("10.0.0.0/23", "");
    let out = p.record_and_check("a", &nets(&["10.0.0.0/16"]));
    assert_eq!(
        out.findings,
        vec![CidrFinding::OutOfRange {
            cidr: net("10.0.0.0/16")
        }]
    );
    assert!(p.allocate("b").is_err());
}

#[test]
fn a_held_cidr_overlapping_a_service_range_is_reported() {
    let mut p = pools("10.0.0.0/16", "10.0.5.0/24");
    let out = p.record_and_check("a", &nets(&["10.0.5.0/24"]));
    assert_eq!(
        out.findings,
        vec![CidrFinding::ServiceRangeOverlap {
            cidr: net("10.0.5.0/24"),
            service_range: net("10.0.5.0/24"),
        }]
    );
    assert_eq!(out.findings[0].kind(), "service_range_overlap");
}

#[test]
fn stats_report_every_cluster_cidr_primary_first() {
    let mut p = pools("fd00::/64,10.0.0.0/23", "");
    p.allocate("a").unwrap();
    let s = p.stats();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].cluster_cidr, "fd00::/64");
    assert_eq!((s[0].allocated, s[0].max), (1, 1));
    assert_eq!(s[1].cluster_cidr, "10.0.0.0/23");
    assert_eq!(s[1].family, Family::V4);
    assert_eq!((s[1].allocated, s[1].max), (1, 2));
    assert_eq!(s[1].usage, 0.5);
}

#[test]
fn five_thousand_nodes_allocate_and_hold_quickly() {
    let mut p = pools("10.0.0.0/8,fd00::/48", "10.96.0.0/12");
    let start = Instant::now();
    let mut all = Vec::with_capacity(5000);
    for i in 0..5000 {
        all.push(p.allocate(&format!("node-{i}")).unwrap());
    }
    let alloc = start.elapsed();

    let mut q = pools("10.0.0.0/8,fd00::/48", "10.96.0.0/12");
    let start = Instant::now();
    for (i, cidrs) in all.iter().enumerate() {
        assert!(q.record_and_check(&format!("node-{i}"), cidrs).is_clean());
    }
    let hold = start.elapsed();

    eprintln!("5000 nodes: allocate {alloc:?}, hold {hold:?}");
    assert_eq!(allocated(&p), allocated(&q));
    // Generous bounds for unoptimized builds on a busy machine; release
    // builds take a few milliseconds.
    assert!(alloc.as_millis() < 2000, "allocate took {alloc:?}");
    assert!(hold.as_millis() < 2000, "hold took {hold:?}");
}

#[test]
fn a_claimed_cidr_is_adoptable_only_if_it_fits_todays_configuration_and_overlaps_nothing() {
    let mut p = pools("10.244.0.0/16,fd00:10::/56", "10.244.255.0/24");
    p.record_and_check("other", &nets(&["10.244.7.0/24", "fd00:10:0:7::/64"]));
    assert!(p.is_valid_allocation("a", &nets(&["10.244.3.0/24", "fd00:10:0:3::/64"])));
    // A single family on a dual-stack cluster, the wrong order, an old mask size, outside every
    // cluster CIDR, inside the service range, or overlapping another holder: all refused.
    assert!(!p.is_valid_allocation("a", &nets(&["10.244.3.0/24"])));
    assert!(!p.is_valid_allocation("a", &nets(&["fd00:10:0:3::/64", "10.244.3.0/24"])));
    assert!(!p.is_valid_allocation("a", &nets(&["10.244.2.0/23", "fd00:10:0:3::/64"])));
    assert!(!p.is_valid_allocation("a", &nets(&["10.99.3.0/24", "fd00:10:0:3::/64"])));
    assert!(!p.is_valid_allocation("a", &nets(&["10.244.255.0/24", "fd00:10:0:3::/64"])));
    assert!(!p.is_valid_allocation("a", &nets(&["10.244.7.0/24", "fd00:10:0:3::/64"])));
    assert!(p.is_valid_allocation("other", &nets(&["10.244.7.0/24", "fd00:10:0:7::/64"])));
}

#[test]
fn a_freed_cidr_could_serve_a_waiting_node_only_inside_its_pools_and_no_smaller_than_its_node_cidr()
{
    let p = pools("10.0.0.0/16", "");
    let labels = std::collections::BTreeMap::new();
    let view = crate::NodeView {
        name: "w",
        labels: &labels,
        provider_id: None,
    };
    assert!(p.could_serve(&view, None, &nets(&["10.0.3.0/24"])));
    assert!(p.could_serve(&view, None, &nets(&["10.0.2.0/23"])));
    assert!(
        !p.could_serve(&view, None, &nets(&["10.0.3.0/26"])),
        "smaller than a /24"
    );
    assert!(
        !p.could_serve(&view, None, &nets(&["10.1.0.0/24"])),
        "outside every pool"
    );
    assert_eq!(
        p.node_cidrs_within(&nets(&["10.0.2.0/23", "10.0.5.0/24"])),
        3
    );
}

mod sizing;

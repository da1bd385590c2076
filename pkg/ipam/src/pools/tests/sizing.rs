//! Tests of a flag pool sized from capacity (`--node-cidr-size-from-pods`): the sizes it hands out,
//! the one ledger across sizes, and everything that asks "is this one of the pool's node CIDRs".

use std::collections::BTreeMap;

use ipnet::IpNet;
use proptest::prelude::*;

use super::*;
use crate::config::{AllocatorFlags, SizingFlags};
use crate::pool::{HostBitsRange, ObjectPool, PoolSpec, PoolState, Refusal};
use crate::selector::NodeSelector;
use crate::space::PoolSpace;
use crate::test_fixtures::{net, nets};

/// The flag pool of `cluster` sized from capacity within `/min..=/max` (default: the node mask, /24).
fn sized(cluster: &str, services: &str, min: u8, max: u8) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster.into(),
        service_cluster_ip_range: services.into(),
        ..AllocatorFlags::default()
    };
    let sizing = SizingFlags {
        size_from_pods: true,
        min_mask_ipv4: Some(min),
        max_mask_ipv4: Some(max),
    };
    let config = AllocatorConfig::from_flags(&flags)
        .unwrap()
        .with_sizing(&sizing)
        .unwrap();
    Pools::new(&config).unwrap()
}

fn alloc(p: &mut Pools, node: &str, pods: Option<u64>) -> Result<Vec<IpNet>, Error> {
    let labels = BTreeMap::new();
    let view = NodeView {
        name: node,
        labels: &labels,
        provider_id: None,
    };
    p.allocate_sized_for(node, &view, pods).map(|a| a.cidrs)
}

#[test]
fn nodes_of_16_30_64_and_110_pods_get_a_27_26_25_and_24_from_one_pool() {
    let mut p = sized("10.0.0.0/22", "", 24, 27);
    let got: Vec<IpNet> = [16, 30, 64, 110]
        .iter()
        .enumerate()
        .map(|(i, &pods)| alloc(&mut p, &format!("n{i}"), Some(pods)).unwrap()[0])
        .collect();
    assert_eq!(
        got,
        nets(&[
            "10.0.0.0/27",
            "10.0.0.64/26",
            "10.0.0.128/25",
            "10.0.1.0/24"
        ])
    );
    assert_eq!(p.holder_of(net("10.0.0.200/32")), Some("n2"));
    assert_eq!(
        alloc(&mut p, "plain", None).unwrap(),
        nets(&["10.0.2.0/24"]),
        "a Node without capacity gets the node mask"
    );
}

#[test]
fn ipv6_keeps_its_fixed_mask_beside_a_sized_ipv4() {
    let mut p = sized("10.0.0.0/22,fd00::/56", "", 24, 27);
    assert_eq!(
        alloc(&mut p, "a", Some(16)).unwrap(),
        nets(&["10.0.0.0/27", "fd00::/64"])
    );
}

#[test]
fn releasing_a_large_block_frees_every_smallest_block_of_it() {
    let mut p = sized("10.0.0.0/24", "", 24, 27);
    assert_eq!(
        alloc(&mut p, "big", Some(110)).unwrap(),
        nets(&["10.0.0.0/24"])
    );
    assert!(alloc(&mut p, "small", Some(8)).is_err(), "full");
    p.release_node("big");
    assert_eq!(p.sets()[0].allocated(), 0);
    assert_eq!(
        alloc(&mut p, "small", Some(8)).unwrap(),
        nets(&["10.0.0.0/27"])
    );
}

#[test]
fn a_service_range_keeps_every_size_overlapping_it_out() {
    let mut p = sized("10.0.0.0/24", "10.0.0.96/27", 24, 27);
    assert!(alloc(&mut p, "big", Some(110)).is_err());
    assert_eq!(
        alloc(&mut p, "a", Some(64)).unwrap(),
        nets(&["10.0.0.128/25"])
    );
    assert_eq!(
        alloc(&mut p, "b", Some(30)).unwrap(),
        nets(&["10.0.0.0/26"])
    );
    assert_eq!(
        alloc(&mut p, "c", Some(16)).unwrap(),
        nets(&["10.0.0.64/27"])
    );
    assert!(alloc(&mut p, "d", Some(16)).is_err());
}

#[test]
fn any_size_between_the_bounds_is_a_valid_allocation_and_found_in_its_pool() {
    let p = sized("10.0.0.0/16", "", 22, 28);
    for c in ["10.0.4.0/22", "10.0.1.0/24", "10.0.0.16/28"] {
        assert!(p.is_valid_allocation("n", &nets(&[c])), "{c}");
        assert_eq!(p.pool_of(net(c)), Some((DEFAULT_POOL, net("10.0.0.0/16"))));
        assert_eq!(
            p.set_of(net(c))
                .and_then(CidrSet::sizing)
                .map(|z| z.smallest),
            Some(28)
        );
    }
    for c in ["10.0.0.0/21", "10.0.0.0/29", "10.1.0.0/24"] {
        assert!(!p.is_valid_allocation("n", &nets(&[c])), "{c}");
    }
}

#[test]
fn a_held_cidr_is_oversized_only_beyond_the_largest_size() {
    let mut p = sized("10.0.0.0/16", "", 24, 27);
    assert!(p
        .record_and_check("a", &nets(&["10.0.1.0/24"]))
        .findings
        .is_empty());
    assert!(p.oversized(&net("10.0.1.0/24")).is_none());
    let o = p.oversized(&net("10.0.4.0/22")).unwrap();
    assert_eq!((o.node_mask, o.covers), (24, 4));
}

#[test]
fn a_sized_pool_reports_and_ranks_at_its_default_size() {
    let p = sized("10.0.0.0/16", "", 22, 27);
    let report = &p.reports()[0];
    assert_eq!(report.node_masks, [24]);
    assert_eq!(report.capacity, 256);
    let space = PoolSpace::of(&p.stats());
    assert_eq!(
        space[0].free_blocks,
        [
            (22, 64),
            (23, 128),
            (24, 256),
            (25, 512),
            (26, 1024),
            (27, 2048)
        ]
    );
}

#[test]
fn a_fixed_clustercidr_pool_beside_a_sized_flag_pool_ignores_capacity() {
    let mut p = sized("10.0.0.0/16", "", 24, 27);
    p.sync_objects(&[ObjectPool {
        name: "fixed".into(),
        uid: "uid-fixed".into(),
        spec: Ok(PoolSpec {
            selector: NodeSelector::Fallback,
            per_node_host_bits: 6,
            ipv4: Some(net("10.100.0.0/24")),
            ipv6: None,
            sizing: None,
        }),
        deleting: false,
        modified: false,
    }]);
    // The ClusterCIDR pool has fewer node CIDRs in all, so it ranks first among the fallbacks.
    assert_eq!(
        alloc(&mut p, "a", Some(110)).unwrap(),
        nets(&["10.100.0.0/26"])
    );
    assert_eq!(
        alloc(&mut p, "b", Some(8)).unwrap(),
        nets(&["10.100.0.64/26"])
    );
}

proptest! {
    /// Allocations of random capacities, releases and re-holds: no two owners' CIDRs ever overlap, and
    /// every set's bitmap marks exactly the smallest blocks some holding or service range covers.
    #[test]
    fn mixed_sizes_never_overlap_and_the_bitmap_matches_the_ledger(
        ops in proptest::collection::vec((0u8..3, 0usize..12, prop::option::of(0u64..300)), 1..120),
    ) {
        let mut p = sized("10.0.0.0/22", "10.0.3.192/27", 23, 28);
        for (kind, node, pods) in ops {
            let name = format!("n{node}");
            match kind {
                0 | 1 => {
                    let _ = alloc(&mut p, &name, pods);
                }
                _ => {
                    p.release_node(&name);
                }
            }
            let held: Vec<(String, IpNet)> = p
                .holdings()
                .flat_map(|(n, cs)| cs.iter().map(move |c| (n.to_string(), *c)))
                .collect();
            for (i, (a, x)) in held.iter().enumerate() {
                for (b, y) in &held[i + 1..] {
                    prop_assert!(
                        !(x.contains(&y.network()) || y.contains(&x.network())),
                        "{a} {x} overlaps {b} {y}"
                    );
                }
            }
            let set = &p.sets()[0];
            for k in 0..set.max_cidrs() {
                let block = IpNet::new(
                    std::net::Ipv4Addr::from(0x0a00_0000u32 + (k as u32) * 16).into(),
                    28,
                )
                .unwrap();
                let covered = net("10.0.3.192/27").contains(&block.network())
                    || held.iter().any(|(_, c)| c.contains(&block.network()));
                prop_assert_eq!(set.is_occupied(block), covered, "{}", block);
            }
        }
    }
}

/// A ClusterCIDR selecting every Node, with `bits` per Node and the sizing annotation's `range`.
fn sized_object(name: &str, bits: i64, v4: &str, v6: &str, range: Option<&str>) -> ObjectPool {
    ObjectPool {
        name: name.into(),
        uid: format!("uid-{name}"),
        spec: Ok(PoolSpec {
            selector: NodeSelector::Fallback,
            per_node_host_bits: bits,
            ipv4: (!v4.is_empty()).then(|| net(v4)),
            ipv6: (!v6.is_empty()).then(|| net(v6)),
            sizing: range.map(|r| r.parse().unwrap()),
        }),
        deleting: false,
        modified: false,
    }
}

fn fixed_flag_pool() -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: "10.0.0.0/16".into(),
        ..AllocatorFlags::default()
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

#[test]
fn the_annotation_reads_as_host_bits_min_dash_max() {
    let r: HostBitsRange = " 5 - 8 ".parse().unwrap();
    assert_eq!(r, HostBitsRange { min: 5, max: 8 });
    for bad in ["8", "a-b", "5-", ""] {
        let err = bad.parse::<HostBitsRange>().unwrap_err();
        assert!(err.contains("is not <min>-<max> host bits"), "{bad}: {err}");
    }
}

#[test]
fn a_sized_clustercidr_beside_the_fixed_flag_pool_sizes_only_its_own_nodes() {
    let mut p = fixed_flag_pool();
    p.sync_objects(&[sized_object("sized", 8, "10.100.0.0/22", "", Some("5-8"))]);
    let got: Vec<IpNet> = [Some(16), Some(30), Some(64), Some(110), None]
        .into_iter()
        .enumerate()
        .map(|(i, pods)| alloc(&mut p, &format!("n{i}"), pods).unwrap()[0])
        .collect();
    assert_eq!(
        got,
        nets(&[
            "10.100.0.0/27",
            "10.100.0.64/26",
            "10.100.0.128/25",
            "10.100.1.0/24",
            "10.100.2.0/24"
        ])
    );
    let report = p.report("sized").unwrap();
    assert_eq!((report.node_masks.clone(), report.capacity), (vec![24], 4));
    // No /24 left: a Node needing one falls back to the flag pool, which ignores capacity, while a
    // small one still fits the gap the sized pool left.
    assert_eq!(
        alloc(&mut p, "n5", Some(110)).unwrap(),
        nets(&["10.100.3.0/24"])
    );
    assert_eq!(
        alloc(&mut p, "n6", Some(110)).unwrap(),
        nets(&["10.0.0.0/24"])
    );
    assert_eq!(
        alloc(&mut p, "n7", Some(16)).unwrap(),
        nets(&["10.100.0.32/27"])
    );
}

#[test]
fn a_sized_dual_stack_clustercidr_keeps_ipv6_at_per_node_host_bits() {
    let mut p = fixed_flag_pool();
    p.sync_objects(&[sized_object(
        "dual",
        8,
        "10.100.0.0/22",
        "fd00::/112",
        Some("5-8"),
    )]);
    assert_eq!(
        alloc(&mut p, "a", Some(16)).unwrap(),
        nets(&["10.100.0.0/27", "fd00::/120"])
    );
}

#[test]
fn a_sizing_annotation_that_does_not_fit_the_spec_refuses_the_pool() {
    for (range, why) in [
        ("5-7", "perNodeHostBits 8 must lie between 5 and 7"),
        ("3-8", "3 host bits is less than 4"),
        ("5-11", "11 host bits is more than 10.100.0.0/22 has (10)"),
    ] {
        let mut p = fixed_flag_pool();
        p.sync_objects(&[sized_object("bad", 8, "10.100.0.0/22", "", Some(range))]);
        let report = p.report("bad").unwrap();
        let PoolState::Refused(Refusal::Invalid(text)) = &report.state else {
            panic!("{range}: {:?}", report.state);
        };
        assert_eq!(
            text,
            &format!("ipam.netcm.io/node-cidr-size-from-pods: {why}"),
            "{range}"
        );
    }
}

#[test]
fn a_node_back_within_its_release_hold_gets_its_old_cidr_whatever_its_capacity_now() {
    // The hold gives the same CIDR back because routes elsewhere still point at it; a new size would
    // defeat that, so a changed capacity counts only for a Node that gets a new CIDR.
    let mut p = sized("10.0.0.0/22", "", 24, 27);
    assert_eq!(
        alloc(&mut p, "a", Some(16)).unwrap(),
        nets(&["10.0.0.0/27"])
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    p.release_node_with_hold("a", "a", None, until);
    let labels = BTreeMap::new();
    let view = NodeView {
        name: "a",
        labels: &labels,
        provider_id: None,
    };
    let back = p.allocate_sized_for("a-again", &view, Some(110)).unwrap();
    assert_eq!(back.cidrs, nets(&["10.0.0.0/27"]));
    assert!(back.release_hold.is_some());
}

#[test]
fn a_node_whose_size_has_no_free_block_is_told_which_size_in_kcms_words() {
    let mut p = sized("10.0.0.0/24", "", 24, 27);
    alloc(&mut p, "small", Some(16)).unwrap();
    let err = alloc(&mut p, "big", Some(110)).unwrap_err();
    assert_eq!(
        err,
        Error::NoBlockOfSize {
            family: crate::Family::V4,
            prefix_len: 24,
            clusters: nets(&["10.0.0.0/24"]),
        }
    );
    let text = err.to_string();
    assert!(text.starts_with(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
    ));
    assert!(
        text.ends_with("(IPv4 cluster CIDRs: 10.0.0.0/24): no free /24 block"),
        "{text}"
    );
}

//! Property tests: random allocate / hold / release sequences over small pools.

#![allow(clippy::unwrap_used)]

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use ipnet::IpNet;
use netcm_ipam::{AllocatorConfig, AllocatorFlags, Error, Family, Pools, RecordChange};
use proptest::prelude::*;
use proptest::test_runner::{contextualize_config, TestRunner};

#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    Hold(usize, Vec<IpNet>),
    Release(usize),
}

const NODES: usize = 6;

/// Small configurations: (cluster CIDRs, IPv4 mask, IPv6 mask, service ranges).
const CONFIGS: &[(&str, u8, u8, &str)] = &[
    ("10.0.0.0/26", 28, 124, ""),
    ("10.0.0.0/26,10.0.1.0/28", 28, 124, "10.0.0.48/30"),
    (
        "10.0.0.0/26,fd00::/122",
        28,
        124,
        "10.0.0.0/28,fd00::30/124",
    ),
    (
        "fd00::/122,10.0.0.0/27,10.0.0.128/27",
        29,
        124,
        "10.0.0.0/20",
    ),
    ("10.0.0.0/24", 28, 124, "10.0.0.64/26"),
];

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn cidr_strategy() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        // IPv4 inside or around 10.0.0.0/24 and 10.0.1.0/28.
        (0u32..512, 24u8..=30).prop_map(|(off, p)| {
            let addr = std::net::Ipv4Addr::from(0x0a00_0000u32 + off);
            IpNet::new(addr.into(), p).unwrap().trunc()
        }),
        // IPv6 inside or around fd00::/122.
        (0u128..128, 120u8..=126).prop_map(|(off, p)| {
            let addr = std::net::Ipv6Addr::from(0xfd00u128 << 112 | off);
            IpNet::new(addr.into(), p).unwrap().trunc()
        }),
        // Far outside every cluster CIDR.
        Just("192.168.0.0/28".parse().unwrap()),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..NODES).prop_map(Op::Allocate),
        3 => (0..NODES, prop::collection::vec(cidr_strategy(), 0..3))
            .prop_map(|(n, c)| Op::Hold(n, c)),
        2 => (0..NODES).prop_map(Op::Release),
    ]
}

fn build(i: usize) -> (Pools, AllocatorConfig) {
    let (cluster, v4, v6, services) = CONFIGS[i];
    let has_v4 = cluster.contains('.');
    let has_v6 = cluster.contains(':');
    let flags = AllocatorFlags {
        cluster_cidr: cluster.into(),
        node_cidr_mask_size_ipv4: has_v4.then_some(v4),
        node_cidr_mask_size_ipv6: (has_v6 && has_v4).then_some(v6),
        service_cluster_ip_range: services.into(),
        ..AllocatorFlags::default()
    };
    let config = AllocatorConfig::from_flags(&flags).unwrap();
    (Pools::new(&config).unwrap(), config)
}

/// Checks that each set's in-use blocks are exactly those touched by a
/// holding or a service range, and that the counters agree.
fn check_accounting(pools: &Pools) -> Result<(), TestCaseError> {
    let held: Vec<IpNet> = pools
        .holdings()
        .flat_map(|(_, c)| c.iter().copied())
        .chain(pools.service_ranges().iter().copied())
        .collect();
    for set in pools.sets() {
        let mut used = 0u64;
        for block in set.cluster().subnets(set.node_mask()).unwrap() {
            let expect = held.iter().any(|h| overlaps(h, &block));
            prop_assert_eq!(set.is_occupied(block), expect, "block {}", block);
            used += u64::from(expect);
        }
        prop_assert_eq!(set.allocated(), used, "cluster {}", set.cluster());
    }
    let stats: u64 = pools.stats().iter().map(|s| s.allocated).sum();
    let sets: u64 = pools.sets().iter().map(|s| s.allocated()).sum();
    prop_assert_eq!(stats, sets);
    Ok(())
}

/// Whether `family` has a node-sized block that no service range and no CIDR any node holds overlaps,
/// as the test's own model of the holdings says: the allocator may report "full" only when it has none.
fn has_free_block(
    config: &AllocatorConfig,
    model: &HashMap<String, (Vec<IpNet>, bool)>,
    family: Family,
) -> bool {
    let taken: Vec<IpNet> = config
        .service_ranges
        .iter()
        .map(IpNet::trunc)
        .chain(model.values().flat_map(|(c, _)| c.iter().copied()))
        .collect();
    config
        .families
        .iter()
        .filter(|f| f.family == family)
        .flat_map(|f| {
            f.cluster_cidrs
                .iter()
                .flat_map(move |c| c.subnets(f.node_mask).unwrap())
        })
        .any(|block| !taken.iter().any(|t| overlaps(t, &block)))
}

/// Checks that the ledger holds exactly what the model says each node holds, so the overlap check
/// below runs over what the allocator really recorded.
fn check_model(
    pools: &Pools,
    model: &HashMap<String, (Vec<IpNet>, bool)>,
) -> Result<(), TestCaseError> {
    let sorted = |c: &[IpNet]| {
        let mut c = c.to_vec();
        c.sort();
        c.dedup();
        c
    };
    let ledger: BTreeMap<&str, Vec<IpNet>> =
        pools.holdings().map(|(n, c)| (n, sorted(c))).collect();
    let modelled: BTreeMap<&str, Vec<IpNet>> = model
        .iter()
        .map(|(n, (c, _))| (n.as_str(), sorted(c)))
        .collect();
    prop_assert_eq!(ledger, modelled);
    Ok(())
}

/// The share of cases that must check allocated CIDRs of at least two nodes against each other: a
/// property run in which the allocator hands out little checks little, and must fail.
const MIN_SHARE_CHECKING_TWO_NODES: f64 = 0.25;

#[test]
fn random_operations_keep_the_pools_consistent_and_allocate_whenever_a_block_is_free() {
    // What the `proptest!` macro sets up, by hand, so the run can count what its cases checked.
    let mut settings = contextualize_config(ProptestConfig::with_cases(256));
    settings.source_file = Some(file!());
    settings.test_name = Some(concat!(
        module_path!(),
        "::random_operations_keep_the_pools_consistent_and_allocate_whenever_a_block_is_free"
    ));
    let cases = settings.cases;
    let mut runner = TestRunner::new(settings);
    let checking_two_nodes = Cell::new(0u32);
    let result = runner.run(
        &(
            0..CONFIGS.len(),
            prop::collection::vec(op_strategy(), 1..60),
        ),
        |(config, ops)| {
            let most = run_case(config, ops)?;
            if most >= 2 {
                checking_two_nodes.set(checking_two_nodes.get() + 1);
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
    // Over a few cases the share says nothing (`PROPTEST_CASES` may make a run that short).
    let share = f64::from(checking_two_nodes.get()) / f64::from(cases);
    assert!(
        cases < 32 || share >= MIN_SHARE_CHECKING_TWO_NODES,
        "only {} of {cases} cases checked allocated CIDRs of two nodes or more against each other",
        checking_two_nodes.get()
    );
}

/// Runs one case; returns the most nodes whose allocated CIDRs the overlap check compared at once.
fn run_case(config: usize, ops: Vec<Op>) -> Result<usize, TestCaseError> {
    let (mut pools, config) = build(config);
    let mut most = 0;
    // node -> (CIDRs, whether they came from allocate()).
    let mut model: HashMap<String, (Vec<IpNet>, bool)> = HashMap::new();
    for op in ops {
        match op {
            Op::Allocate(n) => {
                let node = format!("n{n}");
                let before = pools.held_by(&node).map(<[IpNet]>::to_vec);
                // Decided before the call, from the model: which families have a free block.
                let full: Vec<Family> = config
                    .families
                    .iter()
                    .map(|f| f.family)
                    .filter(|&f| !has_free_block(&config, &model, f))
                    .collect();
                match pools.allocate_detailed(&node) {
                    Ok(a) if before.is_some() => {
                        prop_assert_eq!(Some(a.cidrs), before);
                        prop_assert!(a.fresh.is_empty());
                    }
                    Ok(a) => {
                        prop_assert!(
                            full.is_empty(),
                            "allocated {:?} although {:?} had no free block",
                            a.cidrs,
                            full
                        );
                        let families: Vec<Family> = a.cidrs.iter().map(Family::of).collect();
                        let want: Vec<Family> = config.families.iter().map(|f| f.family).collect();
                        prop_assert_eq!(families, want);
                        for (c, f) in a.cidrs.iter().zip(&config.families) {
                            prop_assert_eq!(c.prefix_len(), f.node_mask, "{} is not node-sized", c);
                        }
                        for c in &a.cidrs {
                            prop_assert!(pools.sets().iter().any(|s| s.contains(*c)));
                            for svc in pools.service_ranges() {
                                prop_assert!(!overlaps(c, svc), "{} in service {}", c, svc);
                            }
                            for (other, cidrs) in pools.holdings() {
                                if other == node {
                                    continue;
                                }
                                for o in cidrs {
                                    prop_assert!(
                                        !overlaps(c, o),
                                        "{} overlaps {} of {}",
                                        c,
                                        o,
                                        other
                                    );
                                }
                            }
                        }
                        model.insert(node, (a.cidrs, true));
                    }
                    // "Full" only when the model agrees: a family without a free block, named.
                    Err(e) => {
                        prop_assert_eq!(before, None, "{} held CIDRs, yet: {}", node, e);
                        prop_assert_eq!(pools.held_by(&node), None);
                        prop_assert!(
                            matches!(&e, Error::Full { family, .. } if full.contains(family)),
                            "allocation for {} failed with {} while the model has a free block in every family it names (full: {:?})",
                            node, e, full
                        );
                    }
                }
            }
            Op::Hold(n, cidrs) => {
                let node = format!("n{n}");
                let out = pools.record_and_check(&node, &cidrs);
                if cidrs.is_empty() {
                    model.remove(&node);
                } else if out.change != RecordChange::Unchanged {
                    model.insert(node, (cidrs, false));
                }
            }
            Op::Release(n) => {
                let node = format!("n{n}");
                let released = pools.release_node(&node);
                let expected = model.remove(&node).map(|(c, _)| c).unwrap_or_default();
                let mut a = released.clone();
                let mut b = expected;
                b.sort();
                b.dedup();
                a.sort();
                prop_assert_eq!(a, b);
            }
        }
        // No two nodes hold overlapping CIDRs among allocated ones.
        let allocated: Vec<(&String, &IpNet)> = model
            .iter()
            .filter(|(_, (_, fresh))| *fresh)
            .flat_map(|(n, (c, _))| c.iter().map(move |c| (n, c)))
            .collect();
        for (i, (na, a)) in allocated.iter().enumerate() {
            for (nb, b) in &allocated[i + 1..] {
                prop_assert!(
                    na == nb || !overlaps(a, b),
                    "{} of {} overlaps {} of {}",
                    a,
                    na,
                    b,
                    nb
                );
            }
        }
        let nodes: std::collections::HashSet<&String> = allocated.iter().map(|(n, _)| *n).collect();
        most = most.max(nodes.len());
        check_model(&pools, &model)?;
        check_accounting(&pools)?;
    }
    Ok(most)
}

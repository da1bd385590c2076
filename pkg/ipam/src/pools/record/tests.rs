//! Tests of [`Pools::record_and_check`] and what it reports.

use super::*;
use crate::problems::Overlap;
use crate::test_fixtures::{allocated, net, nets, pools};

/// A value that counts how often it is compared for equality.
#[derive(Debug, Clone, Copy)]
struct Counted(u32);

impl std::hash::Hash for Counted {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

thread_local! {
    static EQ_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl PartialEq for Counted {
    fn eq(&self, other: &Counted) -> bool {
        EQ_CALLS.with(|c| c.set(c.get() + 1));
        self.0 == other.0
    }
}

impl Eq for Counted {}

#[test]
fn deduplicating_many_ranges_compares_each_with_a_bounded_number_of_others() {
    // 10,000 values, every one twice: a search of the list per value compares 100 million pairs.
    let items: Vec<Counted> = (0..10_000u32).chain(0..10_000).map(Counted).collect();
    EQ_CALLS.with(|c| c.set(0));
    let unique = first_occurrences(items.iter().copied());
    let compared = EQ_CALLS.with(std::cell::Cell::get);
    assert_eq!(unique.len(), 10_000);
    assert!(
        compared <= 2 * items.len(),
        "{compared} comparisons to deduplicate {} values",
        items.len()
    );
}

#[test]
fn a_hold_records_each_range_once_in_the_order_first_given() {
    let mut p = pools("10.0.0.0/16", "");
    // 10.0.1.5/24 is 10.0.1.0/24 once truncated.
    let given = nets(&[
        "10.0.2.0/24",
        "10.0.1.5/24",
        "10.0.2.0/24",
        "10.0.1.0/24",
        "10.0.3.0/24",
    ]);
    assert_eq!(p.record_and_check("a", &given).change, RecordChange::New);
    assert_eq!(
        p.held_by("a"),
        Some(&nets(&["10.0.2.0/24", "10.0.1.0/24", "10.0.3.0/24"])[..])
    );
    assert_eq!(allocated(&p), 3);
    let reordered = nets(&["10.0.2.0/24", "10.0.1.0/24", "10.0.3.0/24", "10.0.1.0/24"]);
    assert_eq!(
        p.record_and_check("a", &reordered).change,
        RecordChange::Unchanged
    );
}

const LIMITS: Limits = Limits {
    named: 3,
    visited: 10_000,
};

fn is_claim(owner: &str) -> bool {
    owner.starts_with("claim:")
}

#[test]
fn a_node_cidr_covering_the_cluster_cidr_is_oversized_and_to_blame_for_the_nodes_inside_it() {
    let mut p = pools("10.0.0.0/16", "");
    for i in 0..100 {
        p.record(&format!("n{i}"), &nets(&[&format!("10.0.{i}.0/24")]));
    }
    p.record("claim:quarantine", &nets(&["10.0.200.0/24"]));
    p.record("hostile", &nets(&["10.0.0.0/16"]));
    assert_eq!(allocated(&p), 256, "all of it is reserved");
    assert!(p.allocate("new").is_err());

    let hostile = p.problems("hostile", LIMITS, is_claim);
    assert_eq!(
        hostile.oversized,
        [Oversized {
            cidr: net("10.0.0.0/16"),
            pool: "default-cluster-cidr".into(),
            node_mask: 24,
            covers: 256,
        }]
    );
    assert_eq!(
        hostile.oversized[0].to_string(),
        "pod CIDR 10.0.0.0/16 is wider than the /24 node CIDRs of pool default-cluster-cidr and covers 256 of them"
    );
    assert_eq!(
        (
            hostile.inside_oversized.count,
            hostile.inside_oversized.more
        ),
        (100, false)
    );
    assert_eq!(hostile.inside_oversized.named.len(), 3);
    assert!(hostile.conflicts.is_empty() && hostile.is_bad());
    assert!(p.has_problems("hostile", is_claim));

    let inside = p.problems("n7", LIMITS, is_claim);
    assert_eq!(
        inside.covered_by.named,
        [Overlap {
            cidr: net("10.0.7.0/24"),
            other: "hostile".into(),
            other_cidr: net("10.0.0.0/16"),
        }]
    );
    assert!(!inside.is_bad());
    assert!(!p.has_problems("n7", is_claim));
}

#[test]
fn problems_visit_a_bounded_number_of_holdings_and_say_there_may_be_more() {
    let mut p = pools("10.0.0.0/16", "");
    for i in 0..100 {
        p.record(&format!("n{i}"), &nets(&[&format!("10.0.{i}.0/24")]));
    }
    p.record("hostile", &nets(&["10.0.0.0/16"]));
    let limits = Limits {
        named: 3,
        visited: 10,
    };
    let found = p.problems("hostile", limits, is_claim).inside_oversized;
    assert!(found.count <= 10 && found.more, "{found:?}");
}

#[test]
fn nodes_holding_the_same_or_nested_node_sized_cidrs_share_the_blame() {
    let mut p = pools("10.0.0.0/16", "");
    p.record("twin-a", &nets(&["10.0.1.0/24"]));
    p.record("twin-b", &nets(&["10.0.1.0/24"]));
    p.record("small", &nets(&["10.0.1.0/25"]));
    p.record("alone", &nets(&["10.0.2.0/24"]));
    let a = p.problems("twin-a", LIMITS, is_claim);
    assert_eq!(a.conflicts.count, 2);
    assert!(a.is_bad() && a.oversized.is_empty());
    for n in ["twin-a", "twin-b", "small"] {
        assert!(p.has_problems(n, is_claim), "{n}");
    }
    assert!(!p.has_problems("alone", is_claim));
    // A reservation overlapping a Node is no problem of the Node's.
    p.record("claim:quarantine", &nets(&["10.0.2.0/24"]));
    assert!(!p.has_problems("alone", is_claim));
}

#[test]
fn a_node_cidr_no_wider_than_the_widest_node_cidrs_of_pools_sharing_its_range_is_not_oversized() {
    use crate::pool::{ObjectPool, PoolSpec};
    use crate::selector::NodeSelector;
    let mut p = pools("10.244.0.0/16", "");
    let pool = |name: &str, bits| ObjectPool {
        name: name.into(),
        uid: format!("uid-{name}"),
        spec: Ok(PoolSpec {
            selector: NodeSelector::Fallback,
            per_node_host_bits: bits,
            ipv4: Some(net("10.50.0.0/16")),
            ipv6: None,
            sizing: None,
        }),
        deleting: false,
        modified: false,
    };
    p.sync_objects(&[pool("small", 6), pool("large", 10)]);
    assert_eq!(p.oversized(&net("10.50.4.0/22")), None);
    let wide = p.oversized(&net("10.50.0.0/21")).unwrap();
    assert_eq!(
        (wide.pool.as_str(), wide.node_mask, wide.covers),
        ("large", 22, 2)
    );
    assert_eq!(
        p.oversized(&net("10.244.0.0/15")).unwrap().pool,
        "default-cluster-cidr"
    );
    assert_eq!(
        p.oversized(&net("10.0.0.0/8")).unwrap().pool,
        "large",
        "the widest node CIDRs it overlaps"
    );
    assert_eq!(
        p.oversized(&net("192.168.0.0/16")),
        None,
        "outside every pool"
    );
}

//! Tests of [`Pools::hold`] and what it reports.

use super::*;
use crate::config::{AllocatorConfig, AllocatorFlags};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| net(s)).collect()
}

fn pools(cluster: &str, services: &str) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster.to_string(),
        service_cluster_ip_range: services.to_string(),
        ..AllocatorFlags::default()
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

fn allocated(p: &Pools) -> u64 {
    p.stats().iter().map(|s| s.allocated).sum()
}

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
    assert_eq!(p.hold("a", &given).change, HoldChange::New);
    assert_eq!(
        p.held_by("a"),
        Some(&nets(&["10.0.2.0/24", "10.0.1.0/24", "10.0.3.0/24"])[..])
    );
    assert_eq!(allocated(&p), 3);
    let reordered = nets(&["10.0.2.0/24", "10.0.1.0/24", "10.0.3.0/24", "10.0.1.0/24"]);
    assert_eq!(p.hold("a", &reordered).change, HoldChange::Unchanged);
}

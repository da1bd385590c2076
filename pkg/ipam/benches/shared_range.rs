//! What ClusterCIDRs sharing one range cost under the pools lock: run by hand,
//! `cargo bench -p netcm-ipam --bench shared_range`. No cluster needed; prints a markdown table.
//!
//! N ClusterCIDR objects all name 10.0.0.0/8 with /24 node CIDRs (node-ipam-controller's idiom for a
//! different selector or mask per node group), 20,000 Nodes spread over them, 200 of them deleted into
//! release hold. Timed: `reports` (what the allocator's once-a-second pool reconcile asks of every live
//! pool) and `stats` (what the allocator publishes after every allocation and release).
//!
//! Each figure is the fastest of a few rounds; the machine is shared, so treat it as ±25 %.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_ipam::{
    AllocatorConfig, AllocatorFlags, NodeSelector, NodeView, ObjectPool, PoolSpec, Pools,
    Requirement, SelectorTerm,
};

const ROUNDS: usize = 5;
const NODES: usize = 20_000;
const HELD: usize = 200;

/// A UID-shaped owner name for Node `i` (the ledger keys by Node UID).
fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i, i)
}

/// Pool `i`'s selector: Nodes labelled `group=g<i>`.
fn group(i: usize) -> NodeSelector {
    NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: vec![Requirement {
            key: "group".into(),
            operator: "In".parse().unwrap(),
            values: vec![format!("g{i}")],
        }],
        match_fields: vec![],
    }])
}

/// `n` ClusterCIDR objects sharing 10.0.0.0/8, one per group.
fn shared_objects(n: usize) -> Vec<ObjectPool> {
    let range: IpNet = "10.0.0.0/8".parse().unwrap();
    (0..n)
        .map(|i| ObjectPool {
            name: format!("shared-{i:03}"),
            uid: uid(i),
            spec: Ok(PoolSpec {
                selector: group(i),
                per_node_host_bits: 8,
                ipv4: Some(range),
                ipv6: None,
                sizing: None,
            }),
            deleting: false,
            modified: false,
        })
        .collect()
}

/// The pools with `n` shared-range ClusterCIDRs, [`NODES`] Nodes allocated round-robin over them and
/// [`HELD`] of those deleted into release hold.
fn populated(n: usize) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: "192.168.0.0/16".into(),
        node_cidr_mask_size_ipv4: Some(24),
        ..AllocatorFlags::default()
    };
    let mut p = Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap();
    let report = p.sync_objects(&shared_objects(n));
    assert_eq!(report.activated.len(), n);
    for i in 0..NODES {
        let name = format!("node-{i}");
        let labels = BTreeMap::from([("group".to_string(), format!("g{}", i % n))]);
        let view = NodeView {
            name: &name,
            labels: &labels,
            provider_id: None,
        };
        p.allocate_for(&uid(i), &view).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(3600);
    for i in 0..HELD {
        p.release_node_with_hold(&uid(i), &format!("node-{i}"), None, until);
    }
    p
}

fn fastest(mut f: impl FnMut() -> Duration) -> Duration {
    (0..ROUNDS).map(|_| f()).min().unwrap_or_default()
}

fn time(d: Duration) -> String {
    if d < Duration::from_micros(100) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_millis(100) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn main() {
    println!("\nClusterCIDRs sharing 10.0.0.0/8, {NODES} Nodes, {HELD} in release hold (fastest of {ROUNDS} rounds)\n");
    println!("| ClusterCIDRs | reports() per pass | stats() per allocation |");
    println!("|---|---|---|");
    for n in [1, 20, 200] {
        let p = populated(n);
        let reports = fastest(|| {
            let started = Instant::now();
            std::hint::black_box(p.reports());
            started.elapsed()
        });
        let stats = fastest(|| {
            let started = Instant::now();
            std::hint::black_box(p.stats());
            started.elapsed()
        });
        println!("| {n} | {} | {} |", time(reports), time(stats));
    }
}

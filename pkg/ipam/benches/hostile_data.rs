//! What bad data costs the pools, with the pools lock as the allocator holds it: run by hand,
//! `cargo bench -p netcm-ipam --bench hostile_data`. No cluster needed; prints a markdown table.
//!
//! - a pass of `sync_objects` + `reports` (what the allocator's once-a-second pool reconcile does under
//!   the pools lock) with N ClusterCIDR objects refused for overlapping the flag pool, first and unchanged;
//! - one hold of 50,000 ranges (an earlier version's per-CIDR claims, held as the quarantine);
//! - recording a Node whose pod CIDR covers the whole cluster CIDR while 50,000 Nodes hold CIDRs in it:
//!   `hold` (every conflict listed, as `netcm check` asks), and what the allocator asks on each sync
//!   (`record` + `has_problems`) and once per Event window (`problems`, bounded).
//!
//! Each figure is the fastest of a few rounds; the machine is shared, so treat it as ±25 %.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_ipam::{
    AllocatorConfig, AllocatorFlags, Limits, NodeSelector, ObjectPool, PoolSpec, Pools,
};

const ROUNDS: usize = 3;

fn pools(cluster_cidr: &str) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster_cidr.into(),
        node_cidr_mask_size_ipv4: Some(24),
        ..AllocatorFlags::default()
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

/// A UID-shaped owner name for Node `i` (the ledger keys by Node UID).
fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i, i)
}

/// The `i`-th /24 of 10.0.0.0/8.
fn slash24(i: usize) -> IpNet {
    format!("10.{}.{}.0/24", (i >> 8) & 0xff, i & 0xff)
        .parse()
        .unwrap()
}

/// `n` ClusterCIDR objects, each a /24 inside the flag pool's 10.0.0.0/8: all refused.
fn refused_objects(n: usize) -> Vec<ObjectPool> {
    (0..n)
        .map(|i| ObjectPool {
            name: format!("refused-{i:05}"),
            uid: uid(i),
            spec: Ok(PoolSpec {
                selector: NodeSelector::Fallback,
                per_node_host_bits: 4,
                ipv4: Some(slash24(i)),
                ipv6: None,
                sizing: None,
            }),
            deleting: false,
            modified: false,
        })
        .collect()
}

fn fastest(mut f: impl FnMut() -> Duration) -> Duration {
    (0..ROUNDS).map(|_| f()).min().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    if d < Duration::from_micros(100) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn main() {
    println!("\nBad data and the pools lock (fastest of {ROUNDS} rounds)\n");
    println!("| case | first pass | unchanged pass |");
    println!("|---|---|---|");
    for n in [2_000, 5_000, 10_000] {
        let objects = refused_objects(n);
        let mut p = pools("10.0.0.0/8");
        let first = fastest(|| {
            p = pools("10.0.0.0/8");
            let started = Instant::now();
            p.sync_objects(&objects);
            std::hint::black_box(p.reports());
            started.elapsed()
        });
        let again = fastest(|| {
            let started = Instant::now();
            p.sync_objects(&objects);
            std::hint::black_box(p.reports());
            started.elapsed()
        });
        println!(
            "| sync_objects + reports, {n} refused ClusterCIDRs | {} | {} |",
            ms(first),
            ms(again)
        );
    }

    let ranges: Vec<IpNet> = (0..50_000).map(slash24).collect();
    let hold = fastest(|| {
        let mut p = pools("10.0.0.0/8");
        let started = Instant::now();
        p.record_and_check("claim:quarantine", &ranges);
        started.elapsed()
    });
    println!("| hold of 50,000 quarantined ranges | {} | |", ms(hold));

    let mut p = pools("10.0.0.0/8");
    for (i, r) in ranges.iter().enumerate() {
        p.record_and_check(&uid(i), std::slice::from_ref(r));
    }
    let wide: IpNet = "10.0.0.0/8".parse().unwrap();
    let first = fastest(|| {
        p.release_node("hostile");
        let started = Instant::now();
        std::hint::black_box(p.record_and_check("hostile", &[wide]));
        started.elapsed()
    });
    let again = fastest(|| {
        let started = Instant::now();
        std::hint::black_box(p.record_and_check("hostile", &[wide]));
        started.elapsed()
    });
    println!(
        "| hold of a Node's 10.0.0.0/8 over 50,000 Nodes' /24s | {} | {} |",
        ms(first),
        ms(again)
    );

    // What the allocator does on every sync of that Node, and once per window when its Events are due.
    let claim = |owner: &str| owner.starts_with("claim:");
    let every_sync = fastest(|| {
        let started = Instant::now();
        p.record("hostile", &[wide]);
        std::hint::black_box(p.has_problems("hostile", claim));
        started.elapsed()
    });
    let limits = Limits {
        named: 3,
        visited: 10_000,
    };
    let per_window = fastest(|| {
        let started = Instant::now();
        std::hint::black_box(p.problems("hostile", limits, claim));
        started.elapsed()
    });
    println!(
        "| that Node's sync: record + has_problems | {} | |",
        ms(every_sync)
    );
    println!(
        "| that Node's Events due: problems (3 named, 10,000 visited) | {} | |",
        ms(per_window)
    );
    let victim = uid(7);
    let victim_sync = fastest(|| {
        let started = Instant::now();
        p.record(&victim, &ranges[7..8]);
        std::hint::black_box(p.has_problems(&victim, claim));
        started.elapsed()
    });
    println!(
        "| a Node inside it: record + has_problems | {} | |",
        ms(victim_sync)
    );
}

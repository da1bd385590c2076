//! What the allocator's ledger holds per allocated Node (run through `hack/bench.sh ledger`).
//!
//! N Nodes, named by 36-character UIDs as the subnet-allocator keys them, are allocated from a fresh
//! [`Pools`]: an IPv4 /8 of /24s, and dual-stack with an IPv6 /48 of /64s. A counting global allocator
//! (`stats_alloc`) gives the bytes and allocations still held per Node afterwards (each live allocation
//! also costs the system allocator its own header). Time per allocation is the fastest of a few
//! rounds; the machine is shared, so treat it as ±25 %.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::alloc::System;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use netcm_ipam::{AllocatorConfig, AllocatorFlags, NodeView, Pools};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A UID-shaped owner name for Node `i` (the ledger keys by Node UID).
fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i, i)
}

fn pools(cluster_cidr: &str) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster_cidr.into(),
        node_cidr_mask_size: None,
        node_cidr_mask_size_ipv4: Some(24),
        node_cidr_mask_size_ipv6: cluster_cidr.contains(':').then_some(64),
        service_cluster_ip_range: String::new(),
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

struct Measured {
    bytes_per_node: f64,
    allocations_per_node: f64,
    time_per_allocation: Duration,
}

/// Allocates `n` Nodes from a fresh set of pools, `rounds` times.
fn measure(cluster_cidr: &str, n: usize, rounds: usize) -> Measured {
    let names: Vec<String> = (0..n).map(uid).collect();
    let labels = BTreeMap::new();
    let mut fastest = Duration::MAX;
    let mut held = (0i64, 0i64);
    for _ in 0..rounds {
        let region = Region::new(GLOBAL);
        let mut pools = pools(cluster_cidr);
        let base = region.change();
        let base_bytes = base.bytes_allocated as i64 - base.bytes_deallocated as i64
            + base.bytes_reallocated as i64;
        let started = Instant::now();
        for name in &names {
            let view = NodeView {
                name,
                labels: &labels,
                provider_id: None,
            };
            pools.allocate_for(name, &view).expect("the pool has room");
        }
        fastest = fastest.min(started.elapsed());
        let s = region.change();
        held = (
            s.bytes_allocated as i64 - s.bytes_deallocated as i64 + s.bytes_reallocated as i64
                - base_bytes,
            s.allocations as i64
                - s.deallocations as i64
                - (base.allocations as i64 - base.deallocations as i64),
        );
        std::hint::black_box(&pools);
    }
    Measured {
        bytes_per_node: held.0 as f64 / n as f64,
        allocations_per_node: held.1 as f64 / n as f64,
        time_per_allocation: fastest / u32::try_from(n).unwrap(),
    }
}

fn main() {
    let n: usize = std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("\nThe allocator's ledger, {n} Nodes allocated from fresh pools (fastest of {rounds} rounds)\n");
    println!(
        "| cluster CIDRs | bytes held per Node | allocations held per Node | time per allocation |"
    );
    println!("|---|---|---|---|");
    for cluster in ["10.0.0.0/8", "10.0.0.0/8,fd00::/48"] {
        let m = measure(cluster, n, rounds);
        println!(
            "| {cluster} | {:.0} | {:.2} | {:.2} µs |",
            m.bytes_per_node,
            m.allocations_per_node,
            m.time_per_allocation.as_secs_f64() * 1e6
        );
    }
}

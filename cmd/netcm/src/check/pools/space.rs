//! One `space` line per pool and family: the largest block it can still hand out and its free blocks per
//! size — netcm-ipam's `PoolSpace`, the same numbers as the allocator's `netcm_pool_*` gauges. The release
//! hold (`--cidr-release-hold`) is not on it: it lives in the leader's memory, which the API does not
//! show, so its CIDRs count as free here (`netcm_pool_release_hold_cidrs` has them).

use netcm_ipam::{PoolSpace, PoolStats};

use super::super::report::Finding;

/// The `space` lines of the pools in `stats`, in their order. Informational: a full pool already fails
/// on its `pool` line.
pub fn space_findings(stats: &[PoolStats]) -> Vec<Finding> {
    PoolSpace::of(stats)
        .iter()
        .map(|s| Finding::ok("space", space_line(s)))
        .collect()
}

fn space_line(s: &PoolSpace) -> String {
    let largest = match s.largest() {
        Some(prefix) => format!("can hand out a /{prefix} at most"),
        None => "can hand out no block (full, or draining)".to_string(),
    };
    let free: Vec<String> = s
        .free_blocks
        .iter()
        .map(|(prefix, n)| format!("{n} × /{prefix}"))
        .collect();
    format!(
        "pool {} ({}): {largest}; free: {}",
        s.pool,
        s.family,
        free.join(", ")
    )
}

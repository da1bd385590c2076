//! [`PoolSpace`]: what a pool can still hand out, per address family — the largest block and the free
//! blocks of each size — summed over its cluster CIDRs, for the allocator's gauges and `netcm check`
//! alike (both call [`PoolSpace::of`], so they never disagree).

use crate::addr::Family;
use crate::outcome::PoolStats;

/// What one pool can still hand out in one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpace {
    /// The pool's name.
    pub pool: String,
    /// The family.
    pub family: Family,
    /// Free blocks as (prefix length, count), largest block first, one entry per size the pool hands
    /// out (one for a fixed-size pool), counts summed over its cluster CIDRs of this family.
    pub free_blocks: Vec<(u8, u64)>,
    /// CIDRs released by deleted Nodes and not handed out again yet (`--cidr-release-hold`).
    pub release_hold: u64,
}

impl PoolSpace {
    /// Sums `stats` per pool and family, in the order they first appear.
    pub fn of(stats: &[PoolStats]) -> Vec<PoolSpace> {
        let mut out: Vec<PoolSpace> = Vec::new();
        for s in stats {
            let i = match out
                .iter()
                .position(|p| p.pool == s.pool && p.family == s.family)
            {
                Some(i) => i,
                None => {
                    out.push(PoolSpace {
                        pool: s.pool.clone(),
                        family: s.family,
                        free_blocks: Vec::new(),
                        release_hold: 0,
                    });
                    out.len() - 1
                }
            };
            out[i].release_hold += s.release_hold;
            let free = &mut out[i].free_blocks;
            for &(prefix, count) in &s.free_blocks {
                match free.iter_mut().find(|(p, _)| *p == prefix) {
                    Some((_, n)) => *n += count,
                    None => free.push((prefix, count)),
                }
            }
            free.sort_by_key(|(p, _)| *p);
        }
        out
    }

    /// The prefix length of the largest block the pool can still hand out; `None` when it can hand out
    /// nothing in this family (full, or not active).
    pub fn largest(&self) -> Option<u8> {
        self.free_blocks
            .iter()
            .find(|(_, n)| *n > 0)
            .map(|(prefix, _)| *prefix)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pool::{ObjectPool, PoolSpec};
    use crate::selector::NodeSelector;
    use crate::test_fixtures::{net, pools};

    #[test]
    fn a_fresh_flag_pool_has_every_node_cidr_free_in_each_family() {
        let p = pools("10.244.0.0/16,fd00:10::/56", "");
        let space = PoolSpace::of(&p.stats());
        assert_eq!(space.len(), 2);
        assert_eq!(space[0].family, Family::V4);
        assert_eq!(space[0].free_blocks, [(24, 256)]);
        assert_eq!(space[0].largest(), Some(24));
        assert_eq!(space[1].free_blocks, [(64, 256)]);
        assert_eq!(space[0].release_hold, 0);
    }

    #[test]
    fn free_blocks_are_summed_over_a_pools_cluster_cidrs_of_one_family() {
        let mut p = pools("10.244.0.0/23,10.245.0.0/24", "");
        p.allocate("a").unwrap();
        p.allocate("b").unwrap();
        let space = PoolSpace::of(&p.stats());
        assert_eq!(space.len(), 1);
        assert_eq!(space[0].free_blocks, [(24, 1)]);
        assert_eq!(space[0].largest(), Some(24));
    }

    #[test]
    fn a_full_pool_can_hand_out_no_block() {
        let mut p = pools("10.244.0.0/23", "");
        p.allocate("a").unwrap();
        p.allocate("b").unwrap();
        let space = PoolSpace::of(&p.stats());
        assert_eq!(space[0].free_blocks, [(24, 0)]);
        assert_eq!(space[0].largest(), None);
    }

    #[test]
    fn a_service_range_inside_the_pool_is_not_free() {
        let p = pools("10.244.0.0/22", "10.244.3.0/25");
        assert_eq!(PoolSpace::of(&p.stats())[0].free_blocks, [(24, 3)]);
    }

    #[test]
    fn a_draining_pool_hands_out_nothing_though_its_range_has_room() {
        let mut p = pools("10.244.0.0/16", "");
        let gpu = |deleting| ObjectPool {
            name: "gpu".into(),
            uid: "uid-gpu".into(),
            spec: Ok(PoolSpec {
                selector: NodeSelector::Fallback,
                per_node_host_bits: 6,
                ipv4: Some(net("10.100.0.0/16")),
                ipv6: None,
                sizing: None,
            }),
            deleting,
            modified: false,
        };
        p.sync_objects(&[gpu(false)]);
        let of = |p: &crate::Pools| {
            PoolSpace::of(&p.stats())
                .into_iter()
                .find(|s| s.pool == "gpu")
                .unwrap()
        };
        assert_eq!(of(&p).free_blocks, [(26, 1024)]);
        p.sync_objects(&[gpu(true)]);
        assert_eq!(of(&p).free_blocks, [(26, 0)]);
        assert_eq!(of(&p).largest(), None);
    }

    #[test]
    fn sizes_of_a_mixed_pool_are_listed_largest_block_first() {
        let stat = |cidr: &str, prefix: u8, free: u64| PoolStats {
            pool: "mixed".into(),
            cluster_cidr: cidr.into(),
            family: Family::V4,
            allocated: 0,
            max: 0,
            usage: 0.0,
            free_blocks: vec![(prefix, free)],
            release_hold: 0,
        };
        let space = PoolSpace::of(&[
            stat("10.0.0.0/16", 27, 5),
            stat("10.0.0.0/16", 24, 0),
            stat("10.1.0.0/16", 27, 2),
        ]);
        assert_eq!(space[0].free_blocks, [(24, 0), (27, 7)]);
        assert_eq!(space[0].largest(), Some(27), "no /24 is left");
    }
}

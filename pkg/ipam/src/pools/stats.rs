//! [`Pools::stats`]: usage, free blocks and release holds of every cluster CIDR, for the allocator's
//! metrics and `netcm check` (summed per pool by [`crate::PoolSpace::of`]).

use super::Pools;
use crate::outcome::PoolStats;
use crate::pool::PoolState;

impl Pools {
    /// Usage and free blocks of every cluster CIDR of every pool that has sets, the flag pool first
    /// (primary family first); [`crate::PoolSpace::of`] sums them per pool and family.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.pools
            .iter()
            .flat_map(|p| {
                let active = p.state == PoolState::Active;
                p.families.iter().flat_map(move |(_, r)| {
                    r.clone()
                        .map(move |i| (i, &self.sets[i]))
                        .map(move |(i, s)| PoolStats {
                            pool: p.name.clone(),
                            cluster_cidr: s.cluster().to_string(),
                            family: s.family(),
                            allocated: s.allocated(),
                            max: s.max_cidrs(),
                            usage: s.usage(),
                            // Every size the set hands out: one for a fixed-size set.
                            free_blocks: (s.largest()..=s.node_mask())
                                .map(|prefix| {
                                    (prefix, if active { s.free_blocks(prefix) } else { 0 })
                                })
                                .collect(),
                            release_hold: self.release_hold_count(i),
                        })
                })
            })
            .collect()
    }
}

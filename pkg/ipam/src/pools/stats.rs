//! [`Pools::stats`]: usage, free blocks and release holds of every cluster CIDR, for the allocator's
//! metrics and `netcm check` (summed per pool by [`crate::PoolSpace::of`]).

use super::release_hold::release_hold_owner;
use super::Pools;
use crate::outcome::PoolStats;
use crate::pool::PoolState;

impl Pools {
    /// Usage and free blocks of every cluster CIDR of every pool that has sets, the flag pool first
    /// (primary family first); [`crate::PoolSpace::of`] sums them per pool and family.
    ///
    /// Published after every allocation and release: its cost is one look per set and per held CIDR,
    /// however many pools share a range.
    pub fn stats(&self) -> Vec<PoolStats> {
        let held = self.release_holds_per_set();
        self.pools
            .iter()
            .flat_map(|p| {
                let active = p.state == PoolState::Active;
                let held = &held;
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
                            release_hold: held.get(i).copied().unwrap_or(0),
                        })
                })
            })
            .collect()
    }

    /// CIDRs in release hold per set: each counted in the set that contains it of the pool its hold
    /// is credited to, so pools sharing a range count only their own Nodes' holds.
    fn release_holds_per_set(&self) -> Vec<u64> {
        let mut per_set = vec![0; self.sets.len()];
        for (name, cidrs) in self.release_holds() {
            let Some(pool) = self
                .credited_pool(&release_hold_owner(name))
                .and_then(|p| self.pools.get(p))
            else {
                continue;
            };
            for c in cidrs {
                let set = pool
                    .families
                    .iter()
                    .flat_map(|(_, r)| r.clone())
                    .find(|&k| self.sets[k].contains(*c));
                if let Some(k) = set {
                    per_set[k] += 1;
                }
            }
        }
        per_set
    }
}

//! Which pool the CIDRs an owner holds are credited to: the pool that handed them out. ClusterCIDRs may
//! share a range (node-ipam-controller's idiom for another selector or mask per node group), and then a
//! CIDR inside it lies in every one of their sets; each pool still counts, drains for and reuses the
//! release holds of only what it handed out. A pool's holders are a number kept here, not a scan of its
//! range: scanned, pools sharing one range cost pools × holdings on every pass.
//!
//! Only ClusterCIDR pools are credited by name of owner. An owner without a credit belongs to the flag
//! pool when the flag pool hands out one of its CIDRs, so a cluster without ClusterCIDRs keeps no entry
//! per Node.
//!
//! Which pool handed a CIDR out is known when this leader allocates it, when a Node's CIDRs go into
//! release hold and when they come back; a CIDR recorded from the API (written by an earlier leader) is
//! credited to the first pool, in the pools' order, that hands it out. Safety does not depend on any of
//! this: every set is marked from the one ledger.

use std::collections::HashMap;
use std::sync::Arc;

use ipnet::IpNet;

use super::Pools;

/// The flag pool's position in `Pools::pools`: it is built first and never removed.
const FLAG_POOL: usize = 0;

/// The ClusterCIDR pool each credited owner's CIDRs came from, and how many owners each pool has.
#[derive(Debug, Default)]
pub(crate) struct Credits {
    /// The pool (its position in `Pools::pools`) of each owner credited to a ClusterCIDR pool; the
    /// ledger's copy of the owner name.
    pool_of: HashMap<Arc<str>, usize>,
    /// How many owners are credited to each pool, by position.
    holders: Vec<usize>,
}

impl Credits {
    /// How many owners are credited to the pool at `p`.
    pub(crate) fn holders(&self, p: usize) -> usize {
        self.holders.get(p).copied().unwrap_or(0)
    }

    fn set(&mut self, owner: Arc<str>, p: usize) {
        self.remove(&owner);
        if self.holders.len() <= p {
            self.holders.resize(p + 1, 0);
        }
        self.holders[p] += 1;
        netcm_table::make_room_for_one(&mut self.pool_of);
        self.pool_of.insert(owner, p);
    }

    fn remove(&mut self, owner: &str) {
        if let Some(p) = self.pool_of.remove(owner) {
            if let Some(n) = self.holders.get_mut(p) {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Follows the pools' new positions after some were removed (`moved[old]`, `None` if removed);
    /// returns the owners whose pool is gone, now uncredited.
    fn renumber(&mut self, moved: &[Option<usize>]) -> Vec<Arc<str>> {
        let mut orphans = Vec::new();
        let mut holders = vec![0; moved.len()];
        self.pool_of
            .retain(|owner, p| match moved.get(*p).copied().flatten() {
                Some(now) => {
                    *p = now;
                    holders[now] += 1;
                    true
                }
                None => {
                    orphans.push(owner.clone());
                    false
                }
            });
        self.holders = holders;
        orphans
    }
}

impl Pools {
    /// Credits what `owner` holds to the pool at `p` (replacing any credit it had); `p` may be a pool
    /// being installed, not yet in `Pools::pools`.
    pub(crate) fn credit(&mut self, owner: &str, p: usize) {
        if p == FLAG_POOL {
            self.credits.remove(owner);
            return;
        }
        if let Some(owner) = self.ledger.owner(owner) {
            self.credits.set(owner, p);
        }
    }

    /// Credits what `owner` holds to the first pool that hands out one of its CIDRs, else to none.
    pub(crate) fn credit_by_fit(&mut self, owner: &str) {
        match self
            .ledger
            .held_by(owner)
            .and_then(|c| self.first_handing_out(c))
        {
            Some(p) => self.credit(owner, p),
            None => self.credits.remove(owner),
        }
    }

    /// Forgets the credit of `owner`, which holds nothing any more.
    pub(crate) fn uncredit(&mut self, owner: &str) {
        self.credits.remove(owner);
    }

    /// The pool (its position) what `owner` holds is credited to.
    pub(crate) fn credited_pool(&self, owner: &str) -> Option<usize> {
        if let Some(&p) = self.credits.pool_of.get(owner) {
            return Some(p);
        }
        let held = self.ledger.held_by(owner)?;
        self.hands_out_any(FLAG_POOL, held).then_some(FLAG_POOL)
    }

    /// Credits the owners of `held` (ledger owners holding a CIDR inside the pool at `p`'s new set,
    /// as its installation found them) to `p` if they have no pool yet: Nodes recorded before their
    /// ClusterCIDR was.
    pub(crate) fn credit_uncredited(&mut self, p: usize, held: Vec<Arc<str>>) {
        for owner in held {
            if self.credited_pool(&owner).is_none() {
                self.credit(&owner, p);
            }
        }
    }

    /// Follows the pools' new positions after some were removed (`moved[old]`, `None` if removed); the
    /// owners of a removed pool (its object went without waiting for them) go to the first pool that
    /// still hands out one of their CIDRs.
    pub(crate) fn renumber_credits(&mut self, moved: &[Option<usize>]) {
        for owner in self.credits.renumber(moved) {
            self.credit_by_fit(&owner);
        }
    }

    /// The first pool, in the pools' order, with a set that hands out one of `cidrs` at its size.
    fn first_handing_out(&self, cidrs: &[IpNet]) -> Option<usize> {
        (0..self.pools.len()).find(|&p| self.hands_out_any(p, cidrs))
    }

    /// Whether a set of the pool at `p` hands out one of `cidrs` at its size.
    fn hands_out_any(&self, p: usize, cidrs: &[IpNet]) -> bool {
        let Some(pool) = self.pools.get(p) else {
            return false;
        };
        pool.families.iter().any(|(_, r)| {
            self.sets[r.clone()].iter().any(|s| {
                cidrs
                    .iter()
                    .any(|c| s.contains(*c) && s.hands_out(c.prefix_len()))
            })
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

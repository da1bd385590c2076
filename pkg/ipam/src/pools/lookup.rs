//! Which pool a node CIDR belongs to, whether CIDRs another leader claimed are ones this leader's
//! pools could have handed out, and whether CIDRs just freed could serve a waiting Node: the lookups that
//! ask each set whether it [`crate::CidrSet::hands_out`] a size.

use ipnet::IpNet;

use super::{Pool, Pools};
use crate::addr::{Family, Span};
use crate::cidr_set::CidrSet;
use crate::pool::PoolState;
use crate::selector::NodeView;

impl Pools {
    /// The pool `cidrs` (one per family) were allocated from: the first pool with a set containing
    /// the first CIDR at a size it hands out.
    pub fn pool_of_cidrs(&self, cidrs: &[IpNet]) -> Option<String> {
        let first = cidrs.first()?;
        self.pool_of(*first).map(|(p, _)| p.to_string())
    }

    /// The pool and cluster CIDR a node CIDR belongs to: the first set holding it at a size it hands
    /// out, else the first set containing it.
    pub fn pool_of(&self, cidr: IpNet) -> Option<(&str, IpNet)> {
        self.find_set(cidr)
            .map(|(p, s)| (p.name.as_str(), s.cluster()))
    }

    /// The set [`Pools::pool_of`] finds for `cidr`: its cluster CIDR and the sizes it hands out, which
    /// is what claim blocks are cut by.
    pub fn set_of(&self, cidr: IpNet) -> Option<&CidrSet> {
        self.find_set(cidr).map(|(_, s)| s)
    }

    fn find_set(&self, cidr: IpNet) -> Option<(&Pool, &CidrSet)> {
        let cidr = cidr.trunc();
        let owner_of = |exact: bool| {
            self.pools.iter().find_map(|p| {
                p.families.iter().find_map(|(_, r)| {
                    self.sets[r.clone()]
                        .iter()
                        .find(|s| s.contains(cidr) && (!exact || s.hands_out(cidr.prefix_len())))
                        .map(|s| (p, s))
                })
            })
        };
        owner_of(true).or_else(|| owner_of(false))
    }

    /// Whether one of `freed` (CIDRs just released or put in release hold) could give `node` (reporting
    /// `pods` capacity) a CIDR: it overlaps a set of a pool that selects the Node and is no smaller than
    /// the node CIDR that set would hand it. Waking only such Nodes spares a release the syncs (and label
    /// reads) of every other waiting Node.
    pub fn could_serve(&self, node: &NodeView<'_>, pods: Option<u64>, freed: &[IpNet]) -> bool {
        self.candidates(node).into_iter().any(|p| {
            self.pools[p].families.iter().any(|(family, r)| {
                self.sets[r.clone()].iter().any(|s| {
                    let wanted = s
                        .sizing()
                        .map_or(s.node_mask(), |z| z.prefix_for(*family, pods));
                    freed
                        .iter()
                        .any(|c| s.overlaps(*c) && c.prefix_len() <= wanted)
                })
            })
        })
    }

    /// How many node CIDRs `freed` holds at most: each counted at the smallest node CIDR of the sets
    /// it overlaps (one for a CIDR of a set's own size, and for one outside every set).
    pub fn node_cidrs_within(&self, freed: &[IpNet]) -> u64 {
        freed
            .iter()
            .map(|c| {
                self.sets
                    .iter()
                    .filter(|s| s.overlaps(*c))
                    .map(|s| 1u64 << s.node_mask().saturating_sub(c.prefix_len()).min(63))
                    .max()
                    .unwrap_or(1)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Whether `cidrs` is exactly what [`Pools::allocate_for`] could give `owner` from some active pool:
    /// one node CIDR of a size its set hands out per family of the pool in its order, each inside a
    /// cluster CIDR of that family and overlapping neither a service range nor anything held by another
    /// owner. Used before adopting a CIDR another leader claimed, so a Node only ever receives CIDRs
    /// valid for the current pools.
    pub fn is_valid_allocation(&self, owner: &str, cidrs: &[IpNet]) -> bool {
        self.pools
            .iter()
            .filter(|p| p.state == PoolState::Active)
            .any(|p| self.fits_pool(p, owner, cidrs))
    }

    pub(super) fn fits_pool(&self, pool: &Pool, owner: &str, cidrs: &[IpNet]) -> bool {
        self.fits_pool_but_for(pool, owner, cidrs, |_| false)
    }

    /// [`Pools::fits_pool`], holdings of the owners `ignore` selects not counting.
    pub(super) fn fits_pool_but_for(
        &self,
        pool: &Pool,
        owner: &str,
        cidrs: &[IpNet],
        ignore: impl Fn(&str) -> bool,
    ) -> bool {
        if cidrs.len() != pool.families.len() || pool.families.is_empty() {
            return false;
        }
        pool.families
            .iter()
            .zip(cidrs)
            .all(|((family, range), cidr)| {
                let cidr = cidr.trunc();
                Family::of(&cidr) == *family
                    && self.sets[range.clone()]
                        .iter()
                        .any(|s| s.contains(cidr) && s.hands_out(cidr.prefix_len()))
                    && !self
                        .services
                        .iter()
                        .any(|svc| Span::of(svc).overlaps(&Span::of(&cidr)))
                    && self
                        .ledger
                        .overlapping(&Span::of(&cidr))
                        .all(|h| h.node == owner || ignore(h.node))
            })
    }
}

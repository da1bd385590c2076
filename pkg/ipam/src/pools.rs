//! [`Pools`]: allocator state over every cluster CIDR, with an ownership
//! ledger so that a CIDR is never given to two nodes.
//!
//! Invariant: a node block of a [`CidrSet`] is marked in use exactly when it
//! overlaps a service range or a CIDR some node holds. Releasing a CIDR
//! therefore clears its blocks and then re-marks whatever other holdings and
//! service ranges still touch them, so one node letting go never frees
//! addresses another node (even a conflicting one) still holds.

use std::ops::Range;

use ipnet::IpNet;

use crate::addr::{Family, Span};
use crate::cidr_set::CidrSet;
use crate::config::AllocatorConfig;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::outcome::{NodeAllocation, PoolTries};
use crate::pool::{ObjectPool, PoolState, DEFAULT_POOL};
use crate::selector::{NodeSelector, NodeView};

/// One pool: the flag pool (first) or a ClusterCIDR, and the sets it allocates from.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) name: String,
    pub(crate) selector: NodeSelector,
    /// Each family and the range of `sets` it owns, in allocation order; empty for a refused pool.
    pub(crate) families: Vec<(Family, Range<usize>)>,
    pub(crate) state: PoolState,
    /// Whether it comes from a ClusterCIDR object (false for the flag pool).
    pub(crate) is_object: bool,
    /// The ranges it asked for, reported even when refused.
    pub(crate) asked: Vec<IpNet>,
    /// The object's UID (empty for the flag pool).
    pub(crate) uid: String,
    /// The object it was built from (none for the flag pool): a refused pool is built again when its
    /// object changes.
    pub(crate) source: Option<ObjectPool>,
    /// [`Pools::refusal_epoch`]'s parts when it was checked: a refusal is checked again only when what
    /// it depends on has changed since.
    pub(crate) checked: Epochs,
}

/// What pool refusals depend on besides the object itself, as counters that only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Epochs {
    /// Bumped when a pool's sets are added or removed (overlaps between pools).
    pub(crate) shape: u64,
    /// Bumped when a held CIDR outside every set is released (a Node CIDR covering a pool's range).
    pub(crate) outside_released: u64,
}

/// A candidate's sort key: fallback last, more matches first, then capacity, host bits; and its index
/// (ties: [`Pools::tie_break`]).
type Rank = (bool, std::cmp::Reverse<usize>, u64, u8, usize);

/// Every pool's [`CidrSet`]s plus who holds what.
#[derive(Debug)]
pub struct Pools {
    /// All sets: each pool's in a contiguous run, grouped by family, config order within a family.
    pub(crate) sets: Vec<CidrSet>,
    /// The flag pool first, then ClusterCIDR pools in the order they were seen.
    pub(crate) pools: Vec<Pool>,
    pub(crate) services: Vec<IpNet>,
    pub(crate) ledger: Ledger,
    /// The position in `pools` of the pool owning each set.
    pub(crate) set_owner: Vec<usize>,
    /// Each ClusterCIDR pool's position in `pools`, by name.
    pub(crate) index: std::collections::HashMap<String, usize>,
    /// See [`Epochs`].
    pub(crate) epochs: Epochs,
    /// How often a ClusterCIDR object made [`Pools::sync_objects`] search or check the pools: the
    /// bound its tests hold a pass's work to.
    pub(crate) object_scans: u64,
    /// When each deleted Node's release hold ends ([`Pools::release_node_with_hold`]).
    pub(crate) release_holds: ReleaseHolds,
    /// Which ClusterCIDR pool handed out what each owner holds.
    pub(crate) credits: Credits,
    /// While a pod CIDR migration runs, the one pool new CIDRs may come from ([`Pools::open_only`]).
    pub(crate) open_only: Option<String>,
}

impl Pools {
    /// Builds the flag pool ([`DEFAULT_POOL`]): one [`CidrSet`] per cluster CIDR, with the service
    /// ranges marked in use wherever they overlap a cluster CIDR.
    pub fn new(config: &AllocatorConfig) -> Result<Pools, Error> {
        let mut sets = Vec::new();
        let mut families = Vec::new();
        for fam in &config.families {
            let start = sets.len();
            for &cluster in &fam.cluster_cidrs {
                sets.push(match fam.sizing {
                    Some(sizing) => CidrSet::new_sized(cluster, sizing)?,
                    None => CidrSet::new(cluster, fam.node_mask)?,
                });
            }
            families.push((fam.family, start..sets.len()));
        }
        let services: Vec<IpNet> = config.service_ranges.iter().map(IpNet::trunc).collect();
        for svc in &services {
            mark(&mut sets, &Span::of(svc));
        }
        Ok(Pools {
            set_owner: vec![0; sets.len()],
            sets,
            pools: vec![Pool {
                name: DEFAULT_POOL.to_string(),
                selector: NodeSelector::Fallback,
                families,
                state: PoolState::Active,
                is_object: false,
                asked: config
                    .families
                    .iter()
                    .flat_map(|f| f.cluster_cidrs.iter().copied())
                    .collect(),
                uid: String::new(),
                source: None,
                checked: Epochs::default(),
            }],
            services,
            ledger: Ledger::new(),
            index: std::collections::HashMap::new(),
            epochs: Epochs::default(),
            object_scans: 0,
            release_holds: ReleaseHolds::default(),
            credits: Credits::default(),
            open_only: None,
        })
    }

    /// Closes every pool but `pool` to new allocations (`None` opens them all again), as a running
    /// PodCIDRMigration asks: a Node that registers again during it may only be served from the
    /// destination, and a release hold on an origin's CIDRs ends rather than gives them back. What Nodes
    /// hold stays theirs; a closed pool is not draining. Returns whether anything changed.
    pub fn open_only(&mut self, pool: Option<&str>) -> bool {
        if self.open_only.as_deref() == pool {
            return false;
        }
        self.open_only = pool.map(str::to_string);
        true
    }

    /// Whether pool `p` may give out new CIDRs: active, and not closed by a migration.
    fn is_open(&self, p: &Pool) -> bool {
        p.state == PoolState::Active && self.open_only.as_deref().is_none_or(|o| o == p.name)
    }

    /// Allocates for a Node without labels; see [`Pools::allocate_for`].
    pub fn allocate(&mut self, node: &str) -> Result<Vec<IpNet>, Error> {
        self.allocate_detailed(node).map(|a| a.cidrs)
    }

    /// [`Pools::allocate_for`] a Node without labels, named like its ledger owner.
    pub fn allocate_detailed(&mut self, node: &str) -> Result<NodeAllocation, Error> {
        let labels = std::collections::BTreeMap::new();
        self.allocate_for(
            node,
            &NodeView {
                name: node,
                labels: &labels,
                provider_id: None,
            },
        )
    }

    /// Allocates one node CIDR per family of the first pool, in [`Pools::candidates`] order, that has
    /// room in every family, each from the first cluster CIDR of that family with room.
    ///
    /// If `owner` already holds CIDRs (allocated earlier but not yet seen on the API, or recorded by
    /// [`Pools::record_and_check`]) those are returned unchanged. If every candidate pool is full: the pool's
    /// [`Error::Full`] when there is one candidate, [`Error::PoolsFull`] when several, and
    /// [`Error::NoPool`] when no active pool selects the Node.
    pub fn allocate_for(
        &mut self,
        owner: &str,
        node: &NodeView<'_>,
    ) -> Result<NodeAllocation, Error> {
        self.allocate_sized_for(owner, node, None)
    }

    /// [`Pools::allocate_for`] a Node reporting `pods` capacity (`status.capacity.pods`): a sized set
    /// hands it the block [`crate::NodeSizing::prefix_for`] says, a fixed-size one ignores it.
    ///
    /// A Node re-joining as a held Node ([`Pools::release_node_with_hold`]) gets the held CIDRs back; if
    /// another owner reserves them for now it gets [`Error::ReleaseHoldReserved`] and the hold runs on.
    pub fn allocate_sized_for(
        &mut self,
        owner: &str,
        node: &NodeView<'_>,
        pods: Option<u64>,
    ) -> Result<NodeAllocation, Error> {
        self.allocate_holding(owner, node, pods, true)
    }

    /// [`Pools::allocate_sized_for`] for a Node whose held CIDRs are reserved
    /// ([`Error::ReleaseHoldReserved`]) and which cannot wait for them: it gets new CIDRs, and its hold
    /// runs on (it is not handed to another Node while one is free).
    pub fn allocate_sized_past_hold(
        &mut self,
        owner: &str,
        node: &NodeView<'_>,
        pods: Option<u64>,
    ) -> Result<NodeAllocation, Error> {
        self.allocate_holding(owner, node, pods, false)
    }

    fn allocate_holding(
        &mut self,
        owner: &str,
        node: &NodeView<'_>,
        pods: Option<u64>,
        wait_for_reserved: bool,
    ) -> Result<NodeAllocation, Error> {
        if let Some(held) = self.ledger.held_by(owner) {
            return Ok(NodeAllocation {
                cidrs: held.to_vec(),
                fresh: Vec::new(),
                pool: self.pool_of_cidrs(held).unwrap_or_default(),
                release_hold: None,
            });
        }
        let candidates = self.candidates(node);
        if let Some(back) = self.rejoin(owner, node, &candidates, wait_for_reserved)? {
            return Ok(back);
        }
        let mut last_full = None;
        for &p in &candidates {
            match self.allocate_from(p, pods) {
                Ok(fresh) => return Ok(self.allocated(owner, p, fresh, None)),
                Err(e) => last_full = Some(e),
            }
        }
        // Every candidate is full but for what deleted Nodes released: the holds whose ending makes room
        // end, the oldest first, and no other.
        for &p in &candidates {
            if let Some((fresh, used)) = self.make_room(p, pods) {
                return Ok(self.allocated(owner, p, fresh, Some(used)));
            }
        }
        match (candidates.len(), last_full) {
            (1, Some(e)) => Err(e),
            (0, _) | (_, None) => Err(Error::NoPool {
                node: node.name.to_string(),
            }),
            _ => Err(Error::PoolsFull {
                pools: candidates
                    .iter()
                    .map(|&p| self.pools[p].name.clone())
                    .collect(),
            }),
        }
    }

    /// Records `fresh` from pool `p` as `owner`'s.
    fn allocated(
        &mut self,
        owner: &str,
        p: usize,
        fresh: Vec<PoolTries>,
        release_hold: Option<ReleaseHoldUse>,
    ) -> NodeAllocation {
        let cidrs: Vec<IpNet> = fresh.iter().map(|t| t.cidr).collect();
        self.ledger.insert(owner, cidrs.clone());
        self.credit(owner, p);
        NodeAllocation {
            cidrs,
            fresh,
            pool: self.pools[p].name.clone(),
            release_hold,
        }
    }

    /// Whether choosing a pool for a Node needs its labels: some active pool's selector reads one.
    /// Without ClusterCIDR objects (or with selectors on names only) it does not, and the allocator
    /// neither caches nor fetches labels.
    pub fn selects_by_label(&self) -> bool {
        self.pools
            .iter()
            .any(|p| self.is_open(p) && p.selector.reads_labels())
    }

    /// The active pools selecting `node`, most preferred first (KEP-2593's order, as node-ipam-controller
    /// ranks): pools with a selector before the fallback ones, then more matching requirements, fewer node
    /// CIDRs in all, fewer addresses per node, the lower selector text ([`NodeSelector::upstream_string`]),
    /// the lower CIDR text (IPv4 if the pool has it), and the name.
    pub fn candidates(&self, node: &NodeView<'_>) -> Vec<usize> {
        let mut ranked: Vec<Rank> = self
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| self.is_open(p) && !p.families.is_empty())
            .filter_map(|(i, p)| {
                let score = p.selector.score(node)?;
                Some((
                    p.selector.is_fallback(),
                    std::cmp::Reverse(score),
                    self.capacity(i),
                    self.host_bits(i),
                    i,
                ))
            })
            .collect();
        // The texts are built only for pools that tie on everything before them: rare, and never with
        // the flag pool alone.
        ranked.sort_by(|a, b| {
            (a.0, a.1, a.2, a.3)
                .cmp(&(b.0, b.1, b.2, b.3))
                .then_with(|| self.tie_break(a.4).cmp(&self.tie_break(b.4)))
        });
        ranked.into_iter().map(|r| r.4).collect()
    }

    /// node-ipam-controller's last tie-breaks for pool `i` — its selector's text, then its IPv4 range's
    /// text (else IPv6's), compared as strings as upstream does — and the name, so the order is total.
    fn tie_break(&self, i: usize) -> (String, String, &str) {
        let pool = &self.pools[i];
        let family = |f: Family| pool.families.iter().find(|(fam, _)| *fam == f);
        let cidr = family(Family::V4)
            .or_else(|| family(Family::V6))
            .and_then(|(_, r)| self.sets.get(r.start))
            .map(|set| set.cluster().to_string())
            .unwrap_or_default();
        (pool.selector.upstream_string(), cidr, pool.name.as_str())
    }

    /// How many Nodes pool `i` can serve in all: its smallest family's node CIDR count (at the default
    /// size in a sized family, as node-ipam-controller would count from the spec).
    pub(crate) fn capacity(&self, i: usize) -> u64 {
        self.pools[i]
            .families
            .iter()
            .map(|(_, r)| {
                self.sets[r.clone()]
                    .iter()
                    .map(CidrSet::default_cidrs)
                    .sum()
            })
            .min()
            .unwrap_or(0)
    }

    /// Host bits of pool `i`'s node CIDRs (of the default size) in its first family.
    fn host_bits(&self, i: usize) -> u8 {
        self.pools[i]
            .families
            .first()
            .and_then(|(f, r)| self.sets.get(r.start).map(|s| f.bits() - s.default_mask()))
            .unwrap_or(u8::MAX)
    }

    /// One node CIDR per family of pool `p` (sized from `pods` where the set is), or its [`Error::Full`]
    /// (giving back what it took).
    fn allocate_from(&mut self, p: usize, pods: Option<u64>) -> Result<Vec<PoolTries>, Error> {
        let families = self.pools[p].families.clone();
        let mut fresh: Vec<PoolTries> = Vec::with_capacity(families.len());
        for (family, range) in families {
            // The size a sized family asks of each of its sets (one sizing per pool and family).
            let wanted = self.sets[range.clone()]
                .first()
                .and_then(CidrSet::sizing)
                .map(|z| z.prefix_for(family, pods));
            let got = self.sets[range.clone()].iter_mut().find_map(|set| {
                let cluster = set.cluster();
                set.allocate_for_pods(pods).ok().map(|a| PoolTries {
                    cluster,
                    cidr: a.cidr,
                    tries: a.tries,
                })
            });
            match got {
                Some(t) => {
                    // Keeps overlapping sets (pools sharing a range) in step.
                    mark(&mut self.sets, &Span::of(&t.cidr));
                    fresh.push(t);
                }
                None => {
                    for t in &fresh {
                        unmark(
                            &mut self.sets,
                            &self.ledger,
                            &self.services,
                            &Span::of(&t.cidr),
                        );
                    }
                    let clusters = self.sets[range].iter().map(CidrSet::cluster).collect();
                    return Err(match wanted {
                        Some(prefix_len) => Error::NoBlockOfSize {
                            family,
                            prefix_len,
                            clusters,
                        },
                        None => Error::Full { family, clusters },
                    });
                }
            }
        }
        Ok(fresh)
    }

    /// Forgets `node`, returning what it held; blocks another node or a
    /// service range still covers stay in use.
    pub fn release_node(&mut self, node: &str) -> Vec<IpNet> {
        let Some(held) = self.ledger.remove(node) else {
            return Vec::new();
        };
        self.uncredit(node);
        for c in &held {
            let span = Span::of(c);
            if !self.sets.iter().any(|s| s.span().contains(&span)) {
                // It may have kept a ClusterCIDR inside it refused.
                self.epochs.outside_released += 1;
            }
            unmark(&mut self.sets, &self.ledger, &self.services, &span);
        }
        held
    }

    /// The node holding exactly `cidr`, else some node holding a CIDR overlapping it.
    pub fn holder_of(&self, cidr: IpNet) -> Option<&str> {
        self.ledger.holder_of(&cidr.trunc())
    }

    /// The CIDRs recorded for `node` (normalized, in the order given).
    pub fn held_by(&self, node: &str) -> Option<&[IpNet]> {
        self.ledger.held_by(node)
    }

    /// The ledger's own copy of the owner name `node` while it holds CIDRs, so a caller that keeps the
    /// name too (the allocator's UID tracking) shares the string instead of copying it.
    pub fn owner(&self, node: &str) -> Option<std::sync::Arc<str>> {
        self.ledger.owner(node)
    }

    /// Number of nodes holding CIDRs.
    pub fn node_count(&self) -> usize {
        self.ledger.len()
    }

    /// Every node and what it holds, in no particular order.
    pub fn holdings(&self) -> impl Iterator<Item = (&str, &[IpNet])> {
        self.ledger.iter()
    }

    /// The service ranges kept out of every pool.
    pub fn service_ranges(&self) -> &[IpNet] {
        &self.services
    }

    /// The cluster CIDR sets, primary family first.
    pub fn sets(&self) -> &[CidrSet] {
        &self.sets
    }
}

/// Marks the blocks overlapping `span` in use in every set it touches.
pub(crate) fn mark(sets: &mut [CidrSet], span: &Span) {
    for set in sets.iter_mut() {
        if let Some(part) = set.span().intersect(span) {
            // Cannot fail: `part` lies inside the set.
            let _ = set.occupy(part.to_net());
        }
    }
}

/// Clears the blocks overlapping `span`, then re-marks those still covered
/// by a holding in `ledger` or by a service range.
pub(crate) fn unmark(sets: &mut [CidrSet], ledger: &Ledger, services: &[IpNet], span: &Span) {
    for set in sets.iter_mut() {
        let Some(part) = set.span().intersect(span) else {
            continue;
        };
        let region = part.widen_to(set.node_mask());
        let _ = set.release(region.to_net());
        let held = ledger.overlapping(&region).map(|h| h.cidr);
        for other in held.chain(services.iter().copied()) {
            if let Some(keep) = region.intersect(&Span::of(&other)) {
                let _ = set.occupy(keep.to_net());
            }
        }
    }
}

mod credit;
mod lookup;
mod objects;
mod record;
mod release_hold;
mod stats;

use credit::Credits;
use release_hold::ReleaseHolds;
pub use release_hold::{EndedReleaseHold, ReleaseHoldEnd, ReleaseHoldUse};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

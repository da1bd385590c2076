//! Claim blocks: which ranges this leader may hand CIDRs out of, and the quarantine on the ranges earlier
//! leaders claimed. Pure: the allocator holds a [`Blocks`] under a lock and does the writes.
//!
//! A leader claims a *block* of node CIDRs (one PodCIDRClaim, named after the block) before it hands out
//! the first CIDR of it, and hands out CIDRs only from blocks it created itself or may use — so a Node
//! allocation costs one claim write per block (64 to 1,024 CIDRs, a 256th of the cluster CIDR:
//! [`block_of`]) instead of one each.
//!
//! Why that is safe across leaders: an earlier leader's write that lands late was decided before its fence
//! closed, so (a) its block's claim existed before this leader listed the claims, and (b) it targets a
//! Node that existed, without pod CIDRs, before this leader's first list (it names the Node's UID, and pod
//! CIDRs never change once set). So this leader first hands out CIDRs only from blocks it creates (a
//! create of an existing block fails with 409), and keeps the free CIDRs of every listed claim reserved —
//! the quarantine — until each Node that lacked pod CIDRs in its first list has them, is gone, or was
//! touched by this leader. After that no earlier write can land anywhere, and the old blocks are this
//! leader's to use — each once its claim is *adopted*: a write naming this leader's term.
//!
//! Why idle claims need no quarantine: a leader that steps down cleanly (SIGTERM) marks idle, while it
//! still holds the lease, every claim of a block whose allocation writes were all answered
//! (`idle_marks.rs`), so no write of its can land there late; the next leader uses idle blocks at
//! once. A leader that died, or whose write to a block may still land, leaves the claim open, and the next
//! leader quarantines it as above. The idle mark tests the term the claim names, and a leader adopts
//! (renames the term on) every claim it did not create before handing out of its block: so an idle mark
//! that a frozen API server holds until after a later leader took the block into use is refused, and
//! cannot hide that later leader's writes from the one after it. A mark names the term that made it (the
//! Lease holder identity), and a leader trusts only the marks of the leader right before it, as the
//! Lease names it: a leader in between that does not adopt (a rollback to a build before idle claims)
//! could have used an idle block and died with a write on its way. So a leader stepping down marks again
//! the idle claims it was left and did not use.
//!
//! Why a touch settles a Node: every allocation PATCH is a JSON Patch testing the Node's
//! `ipam.netcm.io/fenced-at` annotation as it was decided on, so a touch that rewrites it voids an earlier
//! leader's pending one, and the touch's answer shows any write that landed before it, which is recorded
//! before the Node counts as settled. A leader that finds no free CIDR outside the quarantine touches the
//! Nodes it waits for (`startup.rs`: `void_late_writes`) — without that, once claimed blocks cover every
//! free CIDR, Nodes waiting at a takeover could never be served.

use std::collections::{HashMap, HashSet};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netcm_ipam::{CidrSet, NodeSizing, Pools};

/// The fewest node CIDRs a block covers, as a power of two (64: a /18 of /24s), and the size of a block
/// whose cluster CIDR is unknown.
const MIN_BLOCK_BITS: u8 = 6;

/// The most node CIDRs a block covers, as a power of two (1,024): a takeover quarantines the free CIDRs
/// of earlier leaders' blocks, so a block stays a small part of a large pool.
const MAX_BLOCK_BITS: u8 = 10;

/// A cluster CIDR is cut into about 2^8 blocks: one claim write per 256 allocations in a /8 of /24s
/// (65,536 CIDRs), one per 64 in pools of up to 16,384.
const BLOCKS_PER_POOL_BITS: u8 = 8;

/// How many node CIDRs (as a power of two) a block of a cluster CIDR with `pool_bits` bits of node
/// CIDRs covers: a fixed share of the pool, within [`MIN_BLOCK_BITS`]..=[`MAX_BLOCK_BITS`]. Every
/// leader with the same cluster CIDRs computes the same blocks, so two of them claim a block under one
/// name; a leader of another version may cut other blocks, which the quarantine still covers, since it
/// holds CIDRs by range, not by claim name.
fn block_bits(pool_bits: u8) -> u8 {
    pool_bits
        .saturating_sub(BLOCKS_PER_POOL_BITS)
        .clamp(MIN_BLOCK_BITS, MAX_BLOCK_BITS)
}

/// The annotation a leader sets on a Node it touched to void an earlier leader's late write (RFC 3339).
pub const FENCED_AT_ANNOTATION: &str = "ipam.netcm.io/fenced-at";

/// [`FENCED_AT_ANNOTATION`] as a JSON Pointer (RFC 6901: `/` escaped as `~1`), for the PATCH's test.
pub(crate) const FENCED_AT_POINTER: &str = "/metadata/annotations/ipam.netcm.io~1fenced-at";

/// The ledger owner under which the free CIDRs of quarantined ranges are held (a reservation: the
/// `claim:` prefix keeps it out of conflict Events).
pub(crate) const QUARANTINE_OWNER: &str = "claim:quarantine";

/// The ledger owner under which the free CIDRs of blocks this term found changed by another are held
/// ([`Blocks::refused`]).
pub(crate) const REFUSED_OWNER: &str = "claim:refused";

/// The block a node CIDR is claimed under: the aligned supernet of a 256th of its cluster CIDR's node
/// CIDRs, at least 64 and at most 1,024 (64 when the cluster CIDR is unknown), or the whole cluster CIDR
/// when it is smaller.
pub fn block_of(node_cidr: IpNet, cluster_cidr: Option<IpNet>) -> IpNet {
    let node_cidr = node_cidr.trunc();
    let cluster = cluster_cidr.filter(|c| c.contains(&node_cidr));
    let bits = cluster.map_or(MIN_BLOCK_BITS, |c| {
        block_bits(node_cidr.prefix_len().saturating_sub(c.prefix_len()))
    });
    let mut prefix = node_cidr.prefix_len().saturating_sub(bits);
    if let Some(cluster) = cluster {
        prefix = prefix.max(cluster.prefix_len());
    }
    IpNet::new(node_cidr.addr(), prefix)
        .map(|n| n.trunc())
        .unwrap_or(node_cidr)
}

/// [`block_of`] for a node CIDR of a cluster CIDR whose set hands out several sizes (`sizing`, per-Node
/// size from capacity): blocks are cut from the set's smallest size, and never smaller than its largest,
/// so every size of one cluster CIDR falls on one grid of disjoint blocks — cut by each CIDR's own
/// prefix, a /24's block would contain a /27's. Without `sizing`, or outside a known cluster CIDR, it is
/// [`block_of`].
pub fn block_of_sized(
    node_cidr: IpNet,
    cluster_cidr: Option<IpNet>,
    sizing: Option<NodeSizing>,
) -> IpNet {
    let node_cidr = node_cidr.trunc();
    let cluster = cluster_cidr.filter(|c| c.contains(&node_cidr));
    let (Some(z), Some(cluster)) = (sizing, cluster) else {
        return block_of(node_cidr, cluster_cidr);
    };
    let bits = block_bits(z.smallest.saturating_sub(cluster.prefix_len()));
    let prefix = z
        .smallest
        .saturating_sub(bits)
        .max(cluster.prefix_len())
        .min(z.largest)
        // A CIDR larger than the pool's sizes (held from an earlier configuration) is its own block.
        .min(node_cidr.prefix_len());
    IpNet::new(node_cidr.addr(), prefix)
        .map(|n| n.trunc())
        .unwrap_or(node_cidr)
}

/// The block `cidr` is claimed under, cut by the set `pools` finds for it ([`Pools::set_of`]).
pub(crate) fn block_in(pools: &Pools, cidr: IpNet) -> IpNet {
    let set = pools.set_of(cidr);
    block_of_sized(
        cidr,
        set.map(CidrSet::cluster),
        set.and_then(CidrSet::sizing),
    )
}

/// The block to claim ahead of need when `node_cidr` (of `cluster_cidr`) was just handed out: the next
/// block in address order once `node_cidr` lies in the second half of its own, since a round-robin
/// allocator walks the pool upwards. `None` in the first half, past the pool's end, or when a block is
/// one CIDR. Claiming it early takes the claim's round trip off the workers' path (every worker would
/// otherwise wait on it when the block fills); a wrong guess costs one claim write and no safety, since a
/// claim only widens what this leader may use.
pub fn claim_ahead_block(node_cidr: IpNet, cluster_cidr: IpNet) -> Option<IpNet> {
    claim_ahead_block_sized(node_cidr, cluster_cidr, None)
}

/// [`claim_ahead_block`] on the grid [`block_of_sized`] cuts.
pub fn claim_ahead_block_sized(
    node_cidr: IpNet,
    cluster_cidr: IpNet,
    sizing: Option<NodeSizing>,
) -> Option<IpNet> {
    let node_cidr = node_cidr.trunc();
    let block = block_of_sized(node_cidr, Some(cluster_cidr), sizing);
    if block.prefix_len() >= node_cidr.prefix_len() {
        return None;
    }
    let first_half = IpNet::new(block.addr(), block.prefix_len() + 1).ok()?;
    if first_half.contains(&node_cidr) {
        return None;
    }
    let next_addr = match block.broadcast() {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).checked_add(1)?)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a).checked_add(1)?)),
    };
    let next = IpNet::new(next_addr, block.prefix_len()).ok()?;
    cluster_cidr.contains(&next).then_some(next)
}

/// A claim as the new leader listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedBlock {
    /// The claimed range.
    pub range: IpNet,
    /// The term the claim names ([`crate::claims::TERM_ANNOTATION`]), if any.
    pub term: Option<Box<str>>,
    /// Marked idle by the leader right before this one (stepping down, or while it led: `idle_marks.rs`):
    /// no write of its can land late, and no leader came between. An older leader's mark counts as open.
    pub idle: bool,
    /// The claim's idle mark as listed, trusted or not: what an adoption tests it still carries.
    pub idle_since: Option<Box<str>>,
}

/// A claim as this leader last knew it, before it takes the block into use: an adoption tests that the
/// claim still names `term` and carries `idle_since`, so a write to it by another term since is refused
/// rather than overwritten.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Adoptable {
    /// The term the claim names (`None`: it names none; such a claim is adopted without a test).
    pub term: Option<Box<str>>,
    /// Its idle mark, if it carries one.
    pub idle_since: Option<Box<str>>,
}

impl From<ListedBlock> for Adoptable {
    fn from(b: ListedBlock) -> Adoptable {
        Adoptable {
            term: b.term,
            idle_since: b.idle_since,
        }
    }
}

/// What this leader may allocate from.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    /// Ranges whose claim this leader created or adopted in its term: CIDRs of them may be handed out.
    pub(super) usable: HashSet<IpNet>,
    /// Ranges no earlier write can land in any more (idle claims; earlier leaders' once the quarantine
    /// ended or when none was needed; this term's own once it marked them idle): usable once this leader
    /// adopted their claim, as it last knew it.
    pub(super) adoptable: HashMap<IpNet, Adoptable>,
    /// Until every Node an earlier leader may still be writing to is settled.
    quarantine: Option<Quarantine>,
    /// Allocation PATCHes on their way, per block.
    in_flight: HashMap<IpNet, u32>,
    /// Blocks taken into use or written to since the last sweep for idle marks (`idle_marks.rs`).
    pub(super) used_since_sweep: HashSet<IpNet>,
    /// The blocks of the latest allocation write: the next allocation most likely lands there, so they
    /// stay open however long ago that was.
    pub(super) latest_write: Vec<IpNet>,
    /// Listed blocks whose claim another term changed after this leader listed it: never used in this
    /// term, their free CIDRs held under [`REFUSED_OWNER`].
    pub(super) refused: Vec<IpNet>,
    /// Blocks with a PATCH whose outcome this leader does not know (a timeout, a 5xx, dropped at the
    /// drain): one may still land, so this term never marks them idle.
    uncertain: HashSet<IpNet>,
}

#[derive(Debug)]
struct Quarantine {
    /// Earlier leaders' claimed ranges: their free CIDRs are held under [`QUARANTINE_OWNER`].
    ranges: Vec<IpNet>,
    /// Each quarantined claim as listed.
    listed: HashMap<IpNet, Adoptable>,
    /// Nodes (name → UID) without pod CIDRs in the first list: an earlier leader's PATCH may be on its way.
    nodes: HashMap<Box<str>, Box<str>>,
    /// Those of `nodes` whose touch the API refused for good: no touch voids a PATCH on its way to them.
    touch_refused: HashSet<Box<str>>,
}

impl Blocks {
    /// The state at a leader's start: `listed` claims, and the Nodes without pod CIDRs in the first list.
    /// Idle claims are never quarantined; the others are while a Node is waiting (else no earlier write
    /// can land).
    pub(crate) fn start(listed: Vec<ListedBlock>, waiting: HashMap<Box<str>, Box<str>>) -> Blocks {
        let (idle, open): (Vec<_>, Vec<_>) = listed.into_iter().partition(|b| b.idle);
        let mut adoptable: HashMap<IpNet, Adoptable> =
            idle.into_iter().map(|b| (b.range, b.into())).collect();
        if waiting.is_empty() || open.is_empty() {
            adoptable.extend(open.into_iter().map(|b| (b.range, b.into())));
            return Blocks {
                adoptable,
                ..Blocks::default()
            };
        }
        let ranges = open.iter().map(|b| b.range).collect();
        Blocks {
            adoptable,
            quarantine: Some(Quarantine {
                ranges,
                listed: open.into_iter().map(|b| (b.range, b.into())).collect(),
                nodes: waiting,
                touch_refused: HashSet::new(),
            }),
            ..Blocks::default()
        }
    }

    /// Whether CIDRs of `block` may be handed out without a claim write.
    pub(crate) fn is_usable(&self, block: &IpNet) -> bool {
        self.usable.contains(block)
    }

    /// Whether `block` was listed and may be taken into use by adopting its claim.
    pub(crate) fn is_adoptable(&self, block: &IpNet) -> bool {
        self.adoptable.contains_key(block)
    }

    /// This leader's write to the claim of `block` landed (its create, or its adoption): CIDRs of it may be
    /// handed out.
    pub(crate) fn taken_into_use(&mut self, block: IpNet) {
        self.adoptable.remove(&block);
        self.usable.insert(block);
        self.used_since_sweep.insert(block);
    }

    /// What adopting the claim of `block` tests (`None`: it was not listed, and is adopted as found).
    pub(crate) fn adoption_test(&self, block: &IpNet) -> Option<&Adoptable> {
        self.adoptable.get(block)
    }

    /// The claim of listed `block` changed under another term since this leader knew it (its adoption's
    /// test was refused): the block is not used in this term. Returns every range held under
    /// [`REFUSED_OWNER`].
    pub(crate) fn refused(&mut self, block: IpNet) -> &[IpNet] {
        self.adoptable.remove(&block);
        self.usable.remove(&block);
        if !self.refused.contains(&block) {
            self.refused.push(block);
        }
        &self.refused
    }

    /// The claim of `block` already existed (409). Returns the ranges to hold under
    /// [`QUARANTINE_OWNER`] when the quarantine is on (the block joins it); `None`: to adopt (a claim
    /// this leader did not list cannot carry an earlier leader's write, see the module doc).
    pub(crate) fn found_existing(&mut self, block: IpNet) -> Option<&[IpNet]> {
        let q = self.quarantine.as_mut()?;
        if !q.ranges.contains(&block) {
            q.ranges.push(block);
        }
        Some(&q.ranges)
    }

    /// The ranges held under [`QUARANTINE_OWNER`] (empty when there is no quarantine).
    pub(crate) fn quarantined_ranges(&self) -> &[IpNet] {
        self.quarantine.as_ref().map_or(&[], |q| &q.ranges)
    }

    /// How many Nodes the quarantine still waits for.
    pub(crate) fn waiting_nodes(&self) -> usize {
        self.quarantine.as_ref().map_or(0, |q| q.nodes.len())
    }

    /// What a sync saw of Node `name`: its UID now (`None`: gone) and whether it holds pod CIDRs. A Node
    /// of the quarantine that holds CIDRs, is gone or was re-created is settled; when the last one is,
    /// the quarantine ends and its ranges are returned (to release, and adoptable from now on).
    pub(crate) fn settle(
        &mut self,
        name: &str,
        uid: Option<&str>,
        has_cidrs: bool,
    ) -> Option<Vec<IpNet>> {
        let q = self.quarantine.as_mut()?;
        let settled = match q.nodes.get(name) {
            None => false,
            Some(waiting_uid) => has_cidrs || uid != Some(waiting_uid.as_ref()),
        };
        if settled {
            self.voided(name)
        } else {
            None
        }
    }

    /// Node `name` can no longer receive an earlier leader's write (touched: its fence annotation moved
    /// on, and every allocation PATCH tests the one it was decided on). Ends the quarantine like
    /// [`Blocks::settle`] when it was the last.
    pub(crate) fn voided(&mut self, name: &str) -> Option<Vec<IpNet>> {
        let q = self.quarantine.as_mut()?;
        q.nodes.remove(name);
        q.touch_refused.remove(name);
        if !q.nodes.is_empty() {
            return None;
        }
        let mut q = self.quarantine.take()?;
        for range in &q.ranges {
            // Opened for the last untouchable Node, a range may be adoptable already, or refused.
            if !self.usable.contains(range) && !self.refused.contains(range) {
                let listed = q.listed.remove(range).unwrap_or_default();
                self.adoptable.entry(*range).or_insert(listed);
            }
        }
        Some(q.ranges)
    }

    /// The API refused for good to touch Node `name`, which the quarantine waits for.
    pub(crate) fn touch_refused(&mut self, name: &str) {
        if let Some(q) = self.quarantine.as_mut() {
            if q.nodes.contains_key(name) {
                q.touch_refused.insert(name.into());
            }
        }
    }

    /// How many Nodes the quarantine waits for whose touch the API refused for good.
    pub(crate) fn touch_refused_nodes(&self) -> usize {
        self.quarantine
            .as_ref()
            .map_or(0, |q| q.touch_refused.len())
    }

    /// Whether Node `name` may be given CIDRs of the quarantine: it is the last Node the quarantine waits
    /// for, and its touch was refused. Safe because every other Node an earlier leader may have been
    /// writing to is voided or settled, so an earlier write can land only on this one, and the API server
    /// sets a Node's pod CIDRs once: of this leader's PATCH and any earlier one, exactly one lands, and the
    /// other is refused. Without it the Node could never be settled while the quarantine holds every free
    /// CIDR, and every Node after it would wait. With two such Nodes it is not safe: a CIDR given to one
    /// may be on its way to the other.
    pub(crate) fn is_last_and_untouchable(&self, name: &str) -> bool {
        self.quarantine.as_ref().is_some_and(|q| {
            q.nodes.len() == 1 && q.nodes.contains_key(name) && q.touch_refused.contains(name)
        })
    }

    /// The quarantined claim of `block` may be adopted now, for the Node [`Blocks::is_last_and_untouchable`]
    /// lets take CIDRs of the quarantine: the adoption tests it as listed. Its other free CIDRs stay held.
    pub(crate) fn open_for_last_untouchable(&mut self, block: &IpNet) {
        if let Some(listed) = self
            .quarantine
            .as_mut()
            .and_then(|q| q.listed.remove(block))
        {
            self.adoptable.insert(*block, listed);
        }
    }

    /// The Nodes (name, UID) the quarantine still waits for.
    pub(crate) fn waiting(&self) -> Vec<(String, String)> {
        self.quarantine.as_ref().map_or_else(Vec::new, |q| {
            q.nodes
                .iter()
                .map(|(n, u)| (n.to_string(), u.to_string()))
                .collect()
        })
    }

    /// An allocation PATCH with CIDRs of `blocks` is about to be sent: counted, unless one of the blocks is
    /// no longer usable (marked idle since the CIDRs were chosen: `false`, to claim it again first).
    pub(crate) fn write_started(&mut self, blocks: &[IpNet]) -> bool {
        if !blocks.iter().all(|b| self.usable.contains(b)) {
            return false;
        }
        for b in blocks {
            *self.in_flight.entry(*b).or_default() += 1;
            self.used_since_sweep.insert(*b);
        }
        self.latest_write.clear();
        self.latest_write.extend_from_slice(blocks);
        true
    }

    /// That PATCH was answered (`known`: it landed, or was refused for good) or not (`!known`: it may
    /// still land).
    pub(crate) fn write_ended(&mut self, blocks: &[IpNet], known: bool) {
        for b in blocks {
            if let Some(n) = self.in_flight.get_mut(b) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.in_flight.remove(b);
                }
            }
            if !known {
                self.uncertain.insert(*b);
            }
        }
    }

    /// The claims a leader stepping down marks idle, each with the term it must still name: the blocks
    /// it used with every write answered (its own `term`), and listed claims no earlier write can land
    /// in that it never used, idle ones included (marked again under this term, since the next leader
    /// trusts only this term's marks). Quarantined ones stay as they are: an earlier write may still land
    /// there.
    pub(crate) fn to_mark_idle(&self, term: &str) -> Vec<(IpNet, Box<str>)> {
        let mine = self
            .usable
            .iter()
            .filter(|b| self.every_write_answered(b))
            .map(|b| (*b, Box::from(term)));
        let earlier = self
            .adoptable
            .iter()
            .filter(|(_, a)| !a.is_idle_by(term))
            .filter_map(|(b, a)| Some((*b, a.term.clone()?)));
        mine.chain(earlier).collect()
    }

    /// How many claims a leader stepping down leaves open: used blocks with a write unanswered, and the
    /// quarantine's.
    pub(crate) fn left_open(&self) -> usize {
        let uncertain = self
            .usable
            .iter()
            .filter(|b| !self.every_write_answered(b))
            .count();
        uncertain + self.quarantined_ranges().len()
    }

    /// Whether every allocation PATCH of this term with CIDRs of `block` was answered: none on its way,
    /// none whose outcome is unknown.
    pub(super) fn every_write_answered(&self, block: &IpNet) -> bool {
        !self.uncertain.contains(block) && !self.in_flight.contains_key(block)
    }
}

impl Adoptable {
    /// Whether `term` marked the claim idle and nothing changed it since, as far as this leader knows.
    pub(crate) fn is_idle_by(&self, term: &str) -> bool {
        self.idle_since.is_some() && self.term.as_deref() == Some(term)
    }
}

mod idle;

#[cfg(test)]
mod tests;

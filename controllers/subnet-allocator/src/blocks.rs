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
//! leader's to use.
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

/// What this leader may allocate from.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    /// Ranges this leader created, or found and may use.
    usable: HashSet<IpNet>,
    /// Until every Node an earlier leader may still be writing to is settled.
    quarantine: Option<Quarantine>,
}

#[derive(Debug)]
struct Quarantine {
    /// Earlier leaders' claimed ranges: their free CIDRs are held under [`QUARANTINE_OWNER`].
    ranges: Vec<IpNet>,
    /// Nodes (name → UID) without pod CIDRs in the first list: an earlier leader's PATCH may be on its way.
    nodes: HashMap<Box<str>, Box<str>>,
}

impl Blocks {
    /// The state at a leader's start: `listed` claims, and the Nodes without pod CIDRs in the first list.
    /// No quarantine when no Node is waiting (no earlier write can land) or nothing was claimed.
    pub(crate) fn start(listed: Vec<IpNet>, waiting: HashMap<Box<str>, Box<str>>) -> Blocks {
        if waiting.is_empty() || listed.is_empty() {
            return Blocks {
                usable: listed.into_iter().collect(),
                quarantine: None,
            };
        }
        Blocks {
            usable: HashSet::new(),
            quarantine: Some(Quarantine {
                ranges: listed,
                nodes: waiting,
            }),
        }
    }

    /// Whether CIDRs of `block` may be handed out without a claim write.
    pub(crate) fn is_usable(&self, block: &IpNet) -> bool {
        self.usable.contains(block)
    }

    /// This leader created the claim of `block`.
    pub(crate) fn created(&mut self, block: IpNet) {
        self.usable.insert(block);
    }

    /// The claim of `block` already existed (409). Returns the ranges to hold under
    /// [`QUARANTINE_OWNER`] when the quarantine is on (the block joins it); `None`: usable at once (a
    /// claim this leader did not list cannot carry an earlier leader's write, see the module doc).
    pub(crate) fn found_existing(&mut self, block: IpNet) -> Option<&[IpNet]> {
        match &mut self.quarantine {
            Some(q) => {
                if !q.ranges.contains(&block) {
                    q.ranges.push(block);
                }
                Some(&q.ranges)
            }
            None => {
                self.usable.insert(block);
                None
            }
        }
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
    /// the quarantine ends and its ranges are returned (to release, and usable from now on).
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

    /// Node `name` can no longer receive an earlier leader's write (touched: its resourceVersion moved on,
    /// and every allocation PATCH names the resourceVersion it was decided on). Ends the quarantine like
    /// [`Blocks::settle`] when it was the last.
    pub(crate) fn voided(&mut self, name: &str) -> Option<Vec<IpNet>> {
        let q = self.quarantine.as_mut()?;
        q.nodes.remove(name);
        if !q.nodes.is_empty() {
            return None;
        }
        let q = self.quarantine.take()?;
        self.usable.extend(q.ranges.iter().copied());
        Some(q.ranges)
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
}

#[cfg(test)]
mod tests;

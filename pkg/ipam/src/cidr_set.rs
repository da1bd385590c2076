//! [`CidrSet`]: the node-sized blocks of one cluster CIDR and which are in use.
//!
//! Behaves like kube-controller-manager's `cidrset.CidrSet`: a bitmap with one
//! bit per node CIDR, round-robin allocation starting after the last CIDR
//! handed out, and allocation counts that only move when a bit flips.

use std::fmt;

use ipnet::IpNet;

use crate::addr::{Family, Span};
use crate::error::Error;

/// Most node-mask bits beyond the cluster prefix allowed for IPv6
/// (kube-controller-manager's `clusterSubnetMaxDiff`): at most 2^16 node
/// CIDRs per cluster CIDR.
pub const MAX_NODE_BITS_V6: u8 = 16;

/// Most node-mask bits beyond the cluster prefix allowed for IPv4: at most
/// 2^24 node CIDRs (a 2 MiB bitmap) per cluster CIDR. kube-controller-manager
/// has no IPv4 limit; netcm caps it so a typo (`/0` cluster with `/32` nodes)
/// cannot demand a 512 MiB bitmap. `10.0.0.0/8` with `/32` node CIDRs still fits.
pub const MAX_NODE_BITS_V4: u8 = 24;

/// The largest allowed difference between node mask and cluster prefix for a family.
pub fn max_node_bits(family: Family) -> u8 {
    match family {
        Family::V4 => MAX_NODE_BITS_V4,
        Family::V6 => MAX_NODE_BITS_V6,
    }
}

/// A node CIDR handed out by [`CidrSet::allocate_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The allocated node CIDR.
    pub cidr: IpNet,
    /// Occupied candidates skipped before a free one was found; the value
    /// kube-controller-manager observes in `cidrset_allocation_tries_per_request`.
    pub tries: u64,
}

/// The node-sized blocks of one cluster CIDR, each free or in use.
#[derive(Clone)]
pub struct CidrSet {
    cluster: IpNet,
    span: Span,
    node_mask: u8,
    /// Host bits of one node block (address bits minus node mask).
    shift: u32,
    max: u64,
    /// One bit per node block; bits past `max` in the last word are kept set.
    words: Vec<u64>,
    allocated: u64,
    next_candidate: u64,
    /// Per-Node size from capacity ([`CidrSet::new_sized`]): `node_mask` is then its smallest size.
    sizing: Option<crate::sizing::NodeSizing>,
}

impl fmt::Debug for CidrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CidrSet")
            .field("cluster", &self.cluster)
            .field("node_mask", &self.node_mask)
            .field("allocated", &self.allocated)
            .field("max", &self.max)
            .field("next_candidate", &self.next_candidate)
            .finish()
    }
}

impl CidrSet {
    /// Creates an empty set of `/node_mask` blocks covering `cluster` (host bits of `cluster` are ignored).
    pub fn new(cluster: IpNet, node_mask: u8) -> Result<CidrSet, Error> {
        let cluster = cluster.trunc();
        let family = Family::of(&cluster);
        if node_mask > family.bits() {
            return Err(Error::NodeMaskTooLong { family, node_mask });
        }
        if node_mask < cluster.prefix_len() {
            return Err(Error::NodeMaskSmallerThanCluster { cluster, node_mask });
        }
        let max_diff = max_node_bits(family);
        if node_mask - cluster.prefix_len() > max_diff {
            return Err(Error::NodeCidrTooBig {
                cluster,
                node_mask,
                max_diff,
            });
        }
        let max = 1u64 << (node_mask - cluster.prefix_len());
        let mut words = vec![0u64; max.div_ceil(64) as usize];
        let used_in_last = max % 64;
        if used_in_last != 0 {
            if let Some(last) = words.last_mut() {
                *last = u64::MAX << used_in_last;
            }
        }
        Ok(CidrSet {
            cluster,
            span: Span::of(&cluster),
            node_mask,
            shift: u32::from(family.bits() - node_mask),
            max,
            words,
            allocated: 0,
            next_candidate: 0,
            sizing: None,
        })
    }

    /// The (normalized) cluster CIDR this set covers.
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// The address family of the cluster CIDR.
    pub fn family(&self) -> Family {
        self.span.family
    }

    /// The prefix length of every node CIDR: of a bitmap bit, so the smallest node CIDR of a sized set.
    pub fn node_mask(&self) -> u8 {
        self.node_mask
    }

    /// How many node CIDRs fit in the cluster CIDR.
    pub fn max_cidrs(&self) -> u64 {
        self.max
    }

    /// How many node CIDRs are in use (allocated or occupied).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Fraction of node CIDRs in use, `0.0..=1.0`.
    pub fn usage(&self) -> f64 {
        self.allocated as f64 / self.max as f64
    }

    /// Whether every node CIDR is in use.
    pub fn is_full(&self) -> bool {
        self.allocated >= self.max
    }

    /// Whether `cidr` lies entirely inside the cluster CIDR.
    pub fn contains(&self, cidr: IpNet) -> bool {
        self.span.contains(&Span::of(&cidr))
    }

    /// Whether `cidr` shares at least one address with the cluster CIDR.
    pub fn overlaps(&self, cidr: IpNet) -> bool {
        self.span.overlaps(&Span::of(&cidr))
    }

    /// Whether any node block overlapping `cidr` is in use (false outside the cluster CIDR).
    pub fn is_occupied(&self, cidr: IpNet) -> bool {
        let Ok((begin, end)) = self.indices(cidr) else {
            return false;
        };
        let (bw, ew) = (begin / 64, end / 64);
        (bw..=ew).any(|w| self.words[w as usize] & range_mask(w, begin, end) != 0)
    }

    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Hands out the next free node CIDR, scanning round-robin from just
    /// after the previous allocation, or fails with [`Error::Full`].
    ///
    /// Like kube-controller-manager, a CIDR released just now is not handed
    /// out again until the scan has gone around the whole set.
    pub fn allocate_next(&mut self) -> Result<Allocation, Error> {
        let full = || Error::Full {
            family: self.family(),
            clusters: vec![self.cluster],
        };
        if self.is_full() {
            return Err(full());
        }
        let start = self.next_candidate;
        let found = self.find_free_from(start).ok_or_else(full)?;
        self.words[(found / 64) as usize] |= 1u64 << (found % 64);
        self.allocated += 1;
        self.next_candidate = (found + 1) % self.max;
        Ok(Allocation {
            cidr: self.index_to_cidr(found),
            tries: (found + self.max - start) % self.max,
        })
    }

    /// Marks every node block overlapping `cidr` as in use; `cidr` may be
    /// smaller or larger than a node block, or even than the cluster CIDR
    /// (only the overlapping part is marked). Fails if they share no address.
    pub fn occupy(&mut self, cidr: IpNet) -> Result<(), Error> {
        let (begin, end) = self.indices(cidr)?;
        self.set_range(begin, end, true);
        Ok(())
    }

    /// Frees every node block overlapping `cidr` (the reverse of [`CidrSet::occupy`]).
    pub fn release(&mut self, cidr: IpNet) -> Result<(), Error> {
        let (begin, end) = self.indices(cidr)?;
        self.set_range(begin, end, false);
        Ok(())
    }

    /// First and last block index overlapping `cidr`.
    fn indices(&self, cidr: IpNet) -> Result<(u64, u64), Error> {
        let clip = self
            .span
            .intersect(&Span::of(&cidr))
            .ok_or(Error::OutOfRange {
                cidr,
                cluster: self.cluster,
            })?;
        let index = |addr: u128| {
            (addr - self.span.first)
                .checked_shr(self.shift)
                .unwrap_or(0) as u64
        };
        Ok((index(clip.first), index(clip.last)))
    }

    fn index_to_cidr(&self, index: u64) -> IpNet {
        let offset = u128::from(index).checked_shl(self.shift).unwrap_or(0);
        crate::addr::net_from(self.family(), self.span.first + offset, self.node_mask)
    }

    /// Sets or clears blocks `begin..=end`, counting only bits that flip.
    fn set_range(&mut self, begin: u64, end: u64, value: bool) {
        for w in begin / 64..=end / 64 {
            let mask = range_mask(w, begin, end);
            let word = &mut self.words[w as usize];
            if value {
                self.allocated += u64::from((mask & !*word).count_ones());
                *word |= mask;
            } else {
                self.allocated -= u64::from((mask & *word).count_ones());
                *word &= !mask;
            }
        }
    }

    /// First free block at or after `start`, wrapping around once.
    fn find_free_from(&self, start: u64) -> Option<u64> {
        let n = self.words.len();
        let sw = (start / 64) as usize;
        let first = !self.words[sw] & (u64::MAX << (start % 64));
        if first != 0 {
            return Some(sw as u64 * 64 + u64::from(first.trailing_zeros()));
        }
        // Visiting `sw` again last picks up the bits below `start`.
        (1..=n).map(|i| (sw + i) % n).find_map(|w| {
            let free = !self.words[w];
            (free != 0).then(|| w as u64 * 64 + u64::from(free.trailing_zeros()))
        })
    }
}

mod free;
mod sized;

/// Bits of word `w` that fall in the block range `begin..=end`.
fn range_mask(w: u64, begin: u64, end: u64) -> u64 {
    let lo = if w == begin / 64 { begin % 64 } else { 0 };
    let hi = if w == end / 64 { end % 64 } else { 63 };
    (u64::MAX << lo) & (u64::MAX >> (63 - hi))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn set(cluster: &str, mask: u8) -> CidrSet {
        CidrSet::new(net(cluster), mask).unwrap()
    }

    #[test]
    fn allocation_walks_the_cluster_cidr_in_order() {
        let mut s = set("10.0.0.0/22", 24);
        assert_eq!(s.max_cidrs(), 4);
        let got: Vec<_> = (0..4).map(|_| s.allocate_next().unwrap().cidr).collect();
        let want: Vec<_> = ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"]
            .iter()
            .map(|c| net(c))
            .collect();
        assert_eq!(got, want);
        assert!(s.is_full());
        assert_eq!(s.usage(), 1.0);
    }

    #[test]
    fn host_bits_of_the_cluster_cidr_are_ignored() {
        let s = set("10.0.5.7/16", 24);
        assert_eq!(s.cluster(), net("10.0.0.0/16"));
    }

    #[test]
    fn a_full_set_reports_full_with_kcm_wording() {
        let mut s = set("10.0.0.0/24", 24);
        s.allocate_next().unwrap();
        let err = s.allocate_next().unwrap_err();
        assert!(matches!(
            err,
            Error::Full {
                family: Family::V4,
                ..
            }
        ));
        assert!(err.to_string().starts_with(
            "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
        ));
        assert!(err.to_string().contains("10.0.0.0/24"));
    }

    #[test]
    fn a_just_released_cidr_is_not_handed_out_again_at_once() {
        let mut s = set("10.0.0.0/22", 24);
        let first = s.allocate_next().unwrap().cidr;
        s.release(first).unwrap();
        let second = s.allocate_next().unwrap().cidr;
        assert_ne!(first, second);
        assert_eq!(second, net("10.0.1.0/24"));
    }

    #[test]
    fn allocation_wraps_around_to_free_blocks_before_the_candidate() {
        let mut s = set("10.0.0.0/22", 24);
        for _ in 0..4 {
            s.allocate_next().unwrap();
        }
        s.release(net("10.0.1.0/24")).unwrap();
        let a = s.allocate_next().unwrap();
        assert_eq!(a.cidr, net("10.0.1.0/24"));
        // next_candidate was 0 (after wrapping), so block 0 was skipped once.
        assert_eq!(a.tries, 1);
    }

    #[test]
    fn tries_count_the_occupied_candidates_skipped() {
        let mut s = set("10.0.0.0/16", 24);
        for c in ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"] {
            s.occupy(net(c)).unwrap();
        }
        let a = s.allocate_next().unwrap();
        assert_eq!(a.cidr, net("10.0.3.0/24"));
        assert_eq!(a.tries, 3);
        assert_eq!(s.allocate_next().unwrap().tries, 0);
    }

    #[test]
    fn allocation_skips_whole_words_of_used_blocks() {
        let mut s = set("10.0.0.0/8", 24);
        s.occupy(net("10.0.0.0/9")).unwrap();
        let a = s.allocate_next().unwrap();
        assert_eq!(a.cidr, net("10.128.0.0/24"));
        assert_eq!(a.tries, 32768);
    }

    #[test]
    fn occupying_a_larger_cidr_marks_every_block_inside_it() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.4.0/22")).unwrap();
        assert_eq!(s.allocated(), 4);
        assert!(s.is_occupied(net("10.0.7.0/24")));
        assert!(!s.is_occupied(net("10.0.8.0/24")));
    }

    #[test]
    fn occupying_a_smaller_cidr_marks_its_whole_block() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.3.128/25")).unwrap();
        assert_eq!(s.allocated(), 1);
        assert!(s.is_occupied(net("10.0.3.0/24")));
        assert!(s.is_occupied(net("10.0.3.0/26")));
    }

    #[test]
    fn occupying_a_cidr_larger_than_the_cluster_marks_everything() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.0.0/8")).unwrap();
        assert!(s.is_full());
        assert!(s.allocate_next().is_err());
    }

    #[test]
    fn occupying_twice_counts_once() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.1.0/24")).unwrap();
        s.occupy(net("10.0.1.0/24")).unwrap();
        s.occupy(net("10.0.0.0/23")).unwrap();
        assert_eq!(s.allocated(), 2);
        s.release(net("10.0.1.0/24")).unwrap();
        s.release(net("10.0.1.0/24")).unwrap();
        assert_eq!(s.allocated(), 1);
    }

    #[test]
    fn a_cidr_outside_the_cluster_cannot_be_occupied_or_released() {
        let mut s = set("10.0.0.0/16", 24);
        let err = s.occupy(net("10.1.0.0/24")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cidr 10.1.0.0/24 is out the range of cluster cidr 10.0.0.0/16"
        );
        assert!(s.release(net("fd00::/64")).is_err());
        assert_eq!(s.allocated(), 0);
    }

    #[test]
    fn contains_and_overlaps_distinguish_partial_cover() {
        let s = set("10.0.0.0/16", 24);
        assert!(s.contains(net("10.0.3.0/24")));
        assert!(!s.contains(net("10.0.0.0/8")));
        assert!(s.overlaps(net("10.0.0.0/8")));
        assert!(!s.overlaps(net("fd00::/8")));
    }

    #[test]
    fn node_mask_shorter_than_cluster_prefix_is_rejected_with_kcm_wording() {
        let err = CidrSet::new(net("10.0.0.0/16"), 8).unwrap_err();
        assert!(err.to_string().starts_with(
            "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or \
             equal to --node-cidr-mask-size configured for CIDR family"
        ));
    }

    #[test]
    fn node_mask_longer_than_the_address_is_rejected() {
        assert!(matches!(
            CidrSet::new(net("10.0.0.0/16"), 33),
            Err(Error::NodeMaskTooLong { .. })
        ));
        assert!(CidrSet::new(net("fd00::/120"), 129).is_err());
    }

    #[test]
    fn ipv6_node_cidrs_more_than_16_bits_below_the_cluster_are_rejected() {
        let err = CidrSet::new(net("fd00::/48"), 65).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("New CIDR set failed; the node CIDR size is too big"));
        assert_eq!(
            CidrSet::new(net("fd00::/48"), 64).unwrap().max_cidrs(),
            65536
        );
    }

    #[test]
    fn ipv4_node_cidrs_up_to_24_bits_below_the_cluster_are_allowed() {
        let mut s = CidrSet::new(net("10.0.0.0/8"), 32).unwrap();
        assert_eq!(s.max_cidrs(), 1 << 24);
        assert_eq!(s.allocate_next().unwrap().cidr, net("10.0.0.0/32"));
        assert!(matches!(
            CidrSet::new(net("10.0.0.0/7"), 32),
            Err(Error::NodeCidrTooBig { max_diff: 24, .. })
        ));
    }

    #[test]
    fn a_node_mask_equal_to_the_cluster_prefix_gives_one_cidr() {
        let mut s = set("10.0.0.0/24", 24);
        assert_eq!(s.max_cidrs(), 1);
        assert_eq!(s.allocate_next().unwrap().cidr, net("10.0.0.0/24"));
        let mut all = CidrSet::new(net("::/0"), 0).unwrap();
        assert_eq!(all.allocate_next().unwrap().cidr, net("::/0"));
    }

    #[test]
    fn ipv6_blocks_are_addressed_from_the_cluster_base() {
        let mut s = set("fd00:10::/56", 64);
        s.allocate_next().unwrap();
        assert_eq!(s.allocate_next().unwrap().cidr, net("fd00:10:0:1::/64"));
        s.occupy(net("fd00:10:0:ff::/64")).unwrap();
        assert!(s.is_occupied(net("fd00:10:0:ff::1/128")));
    }

    #[test]
    fn every_block_is_handed_out_exactly_once_before_full() {
        let mut s = set("10.0.0.0/15", 24);
        s.occupy(net("10.0.77.0/24")).unwrap();
        let mut seen = std::collections::HashSet::new();
        while let Ok(a) = s.allocate_next() {
            assert!(seen.insert(a.cidr));
        }
        assert_eq!(seen.len(), 511);
        assert!(!seen.contains(&net("10.0.77.0/24")));
    }
}

//! Blocks of several sizes from one [`CidrSet`] (per-Node size from capacity): the set's node
//! mask is the *smallest* size a pool hands out, and a larger block is an aligned run of `2^k` of its
//! bits. One bitmap for every size keeps the guarantee the fixed-size set gives — a bit is in use
//! exactly when some holding covers it, so no two blocks ever overlap — with nothing new to keep in
//! step: [`CidrSet::occupy`], [`CidrSet::release`], [`CidrSet::is_occupied`] and
//! [`CidrSet::free_blocks`] already take CIDRs of any size.

use ipnet::IpNet;

use super::free::free_groups;
use super::{Allocation, CidrSet};
use crate::addr::net_from;
use crate::error::Error;
use crate::sizing::NodeSizing;

impl CidrSet {
    /// Creates an empty set handing out every size of `sizing` over `cluster`: its bitmap is of
    /// `sizing.smallest` blocks. Fails like [`CidrSet::new`], or when the largest size does not fit
    /// `cluster`.
    pub fn new_sized(cluster: IpNet, sizing: NodeSizing) -> Result<CidrSet, Error> {
        let mut set = CidrSet::new(cluster, sizing.smallest)?;
        if sizing.largest < set.cluster.prefix_len() {
            return Err(Error::NodeMaskSmallerThanCluster {
                cluster: set.cluster,
                node_mask: sizing.largest,
            });
        }
        set.sizing = Some(sizing);
        Ok(set)
    }

    /// The sizes it hands out, if sized from capacity.
    pub fn sizing(&self) -> Option<NodeSizing> {
        self.sizing
    }

    /// Whether a node CIDR of prefix length `prefix_len` is one this set hands out: its node mask, or
    /// any size of its sizing.
    pub fn hands_out(&self, prefix_len: u8) -> bool {
        match self.sizing {
            Some(z) => (z.largest..=z.smallest).contains(&prefix_len),
            None => prefix_len == self.node_mask,
        }
    }

    /// The prefix length of the largest node CIDR it hands out.
    pub fn largest(&self) -> u8 {
        self.sizing.map_or(self.node_mask, |z| z.largest)
    }

    /// The prefix length of a node CIDR for a Node without capacity: what node-ipam-controller would
    /// hand out, and what pools are ranked by.
    pub fn default_mask(&self) -> u8 {
        self.sizing.map_or(self.node_mask, |z| z.default)
    }

    /// How many Nodes without capacity would fill it: [`CidrSet::max_cidrs`] of a fixed-size set.
    pub fn default_cidrs(&self) -> u64 {
        self.max >> (self.node_mask - self.default_mask())
    }

    /// Hands out the node CIDR for a Node with `pods` capacity: [`CidrSet::allocate_next`] for a
    /// fixed-size set (the capacity is not read), [`CidrSet::allocate_next_sized`] at
    /// [`NodeSizing::prefix_for`] for a sized one.
    pub fn allocate_for_pods(&mut self, pods: Option<u64>) -> Result<Allocation, Error> {
        match self.sizing {
            Some(z) => self.allocate_next_sized(z.prefix_for(self.family(), pods)),
            None => self.allocate_next(),
        }
    }

    /// Hands out the next free aligned `/prefix_len` block (any size from the cluster CIDR down to the
    /// node mask), scanning round-robin from the first aligned block at or after the previous
    /// allocation's end, or fails with [`Error::Full`] when no such block is wholly free (even if
    /// enough scattered node CIDRs are: fragmentation) or [`Error::SizeOutsideSet`].
    ///
    /// In a set sized from capacity a block smaller than the largest size goes, best fit, into a
    /// largest-size block already partly used when one has room, and breaks into a wholly free one only
    /// otherwise: round-robin alone scatters small blocks over every largest-size block, and then no
    /// large one fits while half the space is free (5,000 Nodes of a realistic mix in a /16: 393 fitted
    /// before the first refusal with round-robin alone; `hack/bench.sh allocation` `MODE=sizing`).
    ///
    /// At the node mask it hands out exactly what [`CidrSet::allocate_next`] would, with the same
    /// `tries`; for a larger block `tries` counts the aligned candidates of that size skipped.
    pub fn allocate_next_sized(&mut self, prefix_len: u8) -> Result<Allocation, Error> {
        if prefix_len < self.cluster.prefix_len() || prefix_len > self.node_mask {
            return Err(Error::SizeOutsideSet {
                cluster: self.cluster,
                node_mask: self.node_mask,
                prefix_len,
            });
        }
        let full = || Error::Full {
            family: self.family(),
            clusters: vec![self.cluster],
        };
        let k = u32::from(self.node_mask - prefix_len);
        let run = 1u64 << k;
        // `max` is a power of two at least `run` (prefix_len >= the cluster prefix), so `runs >= 1`.
        let runs = self.max >> k;
        if self.max - self.allocated < run {
            return Err(full());
        }
        let start = self.next_candidate.div_ceil(run) % runs;
        let largest = u32::from(self.node_mask - self.largest());
        let found = (k < largest)
            .then(|| self.find_run_in_used_block_from(start, k, largest))
            .flatten()
            .or_else(|| self.find_free_run_from(start, k))
            .ok_or_else(full)?;
        let first = found << k;
        self.set_range(first, first + run - 1, true);
        self.next_candidate = (first + run) % self.max;
        let offset = u128::from(first).checked_shl(self.shift).unwrap_or(0);
        Ok(Allocation {
            cidr: net_from(self.family(), self.span.first + offset, prefix_len),
            tries: (found + runs - start) % runs,
        })
    }

    /// The first wholly free aligned run of `2^k` blocks at or after run `start`, wrapping around once,
    /// that lies in an aligned run of `2^big` blocks (the largest size) with some block in use.
    fn find_run_in_used_block_from(&self, start: u64, k: u32, big: u32) -> Option<u64> {
        if k >= 6 {
            // Runs and largest-size blocks span whole words: check candidates run by run.
            let runs = self.max >> k;
            let (per_run, per_big) = (1usize << (k - 6), 1usize << (big - 6));
            return (0..runs).map(|i| (start + i) % runs).find(|&r| {
                let w = r as usize * per_run;
                let b = w / per_big * per_big;
                self.words[w..w + per_run].iter().all(|x| *x == 0)
                    && self.words[b..b + per_big].iter().any(|x| *x != 0)
            });
        }
        // The free runs of each word, less those inside a wholly free largest-size block.
        let fits = |w: usize| {
            let word = self.words[w];
            let free = free_groups(word, k);
            if free == 0 {
                return 0;
            }
            if big < 6 {
                // Starts of the word's free largest-size blocks, spread over their bits.
                let spread = (1u64 << (1u32 << big)) - 1;
                free & !free_groups(word, big).wrapping_mul(spread)
            } else {
                let per_big = 1usize << (big - 6);
                let b = w / per_big * per_big;
                let used = self.words[b..b + per_big].iter().any(|x| *x != 0);
                if used {
                    free
                } else {
                    0
                }
            }
        };
        let n = self.words.len();
        let begin = start << k;
        let sw = (begin / 64) as usize;
        let first = fits(sw) & (u64::MAX << (begin % 64));
        if first != 0 {
            return Some((sw as u64 * 64 + u64::from(first.trailing_zeros())) >> k);
        }
        // Visiting `sw` again last picks up the runs below `start`.
        (1..=n).map(|i| (sw + i) % n).find_map(|w| {
            let f = fits(w);
            (f != 0).then(|| (w as u64 * 64 + u64::from(f.trailing_zeros())) >> k)
        })
    }

    /// The first wholly free aligned run of `2^k` blocks at or after run `start`, wrapping around once,
    /// as a run index.
    fn find_free_run_from(&self, start: u64, k: u32) -> Option<u64> {
        let runs = self.max >> k;
        if k >= 6 {
            // A run spans whole words: `max` is then a multiple of 64, so there are no padding bits.
            let per = 1usize << (k - 6);
            return (0..runs).map(|i| (start + i) % runs).find(|&r| {
                let w = r as usize * per;
                self.words[w..w + per].iter().all(|word| *word == 0)
            });
        }
        let n = self.words.len();
        let begin = start << k;
        let sw = (begin / 64) as usize;
        // Padding bits past `max` are kept set, so no run there ever counts as free.
        let first = free_groups(self.words[sw], k) & (u64::MAX << (begin % 64));
        if first != 0 {
            return Some((sw as u64 * 64 + u64::from(first.trailing_zeros())) >> k);
        }
        // Visiting `sw` again last picks up the runs below `start`.
        (1..=n).map(|i| (sw + i) % n).find_map(|w| {
            let free = free_groups(self.words[w], k);
            (free != 0).then(|| (w as u64 * 64 + u64::from(free.trailing_zeros())) >> k)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

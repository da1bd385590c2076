//! Free space of a [`CidrSet`] counted in aligned blocks of any size between its cluster CIDR and its
//! node CIDRs: what a pool handing out several sizes over one bitmap would report per size, and what
//! shows fragmentation (free node CIDRs scattered so that no larger block is free).

use super::CidrSet;

impl CidrSet {
    /// How many aligned `/prefix_len` blocks are wholly free; 0 for a size outside
    /// cluster prefix ..= node mask. At the node mask it is `max_cidrs() - allocated()`, in O(1);
    /// a larger size reads the bitmap once.
    pub fn free_blocks(&self, prefix_len: u8) -> u64 {
        if prefix_len < self.cluster.prefix_len() || prefix_len > self.node_mask {
            return 0;
        }
        let k = u32::from(self.node_mask - prefix_len);
        if k == 0 {
            return self.max - self.allocated;
        }
        if k >= 6 {
            // A block spans whole words: `max` is then a multiple of 64, so the chunks are exact.
            let words = 1usize << (k - 6);
            return self
                .words
                .chunks(words)
                .filter(|c| c.iter().all(|w| *w == 0))
                .count() as u64;
        }
        self.words
            .iter()
            .map(|w| u64::from(free_groups(*w, k).count_ones()))
            .sum()
    }
}

/// The bits of `word` that start an aligned group of `2^k` free blocks (`k < 6`: a group lies inside
/// one word): bit `i` is set when `i` is a multiple of `2^k` and bits `i..i + 2^k` are all clear.
pub(super) fn free_groups(word: u64, k: u32) -> u64 {
    let group = 1u32 << k;
    // One bit at the start of every aligned group of the word.
    let starts = (0..64 / group).fold(0u64, |m, i| m | 1u64 << (i * group));
    // After the loop bit i is set when bits i..i+group of the word are all free.
    let mut free = !word;
    let mut width = 1;
    while width < group {
        free &= free >> width;
        width *= 2;
    }
    free & starts
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ipnet::IpNet;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn an_empty_set_has_every_block_of_every_size_free() {
        let s = CidrSet::new(net("10.0.0.0/16"), 26).unwrap();
        assert_eq!(s.free_blocks(26), 1024);
        assert_eq!(s.free_blocks(24), 256);
        assert_eq!(s.free_blocks(20), 16);
        assert_eq!(s.free_blocks(16), 1);
    }

    #[test]
    fn one_node_cidr_in_use_takes_every_larger_block_around_it() {
        let mut s = CidrSet::new(net("10.0.0.0/16"), 26).unwrap();
        s.occupy(net("10.0.17.64/26")).unwrap();
        assert_eq!(s.free_blocks(26), 1023);
        assert_eq!(s.free_blocks(25), 511);
        assert_eq!(s.free_blocks(24), 255);
        assert_eq!(s.free_blocks(20), 15, "10.0.16.0/20 is no longer free");
        assert_eq!(s.free_blocks(16), 0);
    }

    #[test]
    fn scattered_node_cidrs_leave_free_space_but_no_larger_block() {
        // Every other /26 in use: half the space is free, yet not one /25 is.
        let mut s = CidrSet::new(net("10.0.0.0/22"), 26).unwrap();
        for i in (1..16).step_by(2) {
            s.occupy(net(&format!("10.0.{}.{}/26", i / 4, (i % 4) * 64)))
                .unwrap();
        }
        assert_eq!(s.free_blocks(26), 8);
        assert_eq!(s.free_blocks(25), 0);
        assert_eq!(s.free_blocks(22), 0);
    }

    #[test]
    fn blocks_past_a_small_sets_end_never_count_as_free() {
        // 4 node CIDRs: one bitmap word whose 60 high bits are kept set.
        let mut s = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        assert_eq!(s.free_blocks(23), 2);
        assert_eq!(s.free_blocks(22), 1);
        s.occupy(net("10.0.3.0/24")).unwrap();
        assert_eq!(s.free_blocks(24), 3);
        assert_eq!(s.free_blocks(23), 1);
        assert_eq!(s.free_blocks(22), 0);
    }

    #[test]
    fn blocks_spanning_several_bitmap_words_are_free_only_when_every_word_is() {
        // /8 with /24 node CIDRs: a /16 is 256 bits, 4 words.
        let mut s = CidrSet::new(net("10.0.0.0/8"), 24).unwrap();
        assert_eq!(s.free_blocks(16), 256);
        s.occupy(net("10.3.255.0/24")).unwrap();
        s.occupy(net("10.9.0.0/24")).unwrap();
        assert_eq!(s.free_blocks(16), 254);
        assert_eq!(s.free_blocks(14), 62, "10.0.0.0/14 and 10.8.0.0/14");
        assert_eq!(s.free_blocks(10), 3);
    }

    #[test]
    fn a_size_outside_the_set_counts_nothing() {
        let s = CidrSet::new(net("fd00::/112"), 122).unwrap();
        assert_eq!(s.free_blocks(122), 1024);
        assert_eq!(s.free_blocks(123), 0, "smaller than a node CIDR");
        assert_eq!(s.free_blocks(111), 0, "larger than the cluster CIDR");
    }
}

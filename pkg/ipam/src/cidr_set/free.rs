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
        // Called for every size after every allocation (the pools' gauges): an empty word, most of a
        // young pool, is counted without looking at its bits.
        let per_empty_word = 64u64 >> k;
        self.words
            .iter()
            .map(|w| match *w {
                0 => per_empty_word,
                w => u64::from(free_groups(w, k).count_ones()),
            })
            .sum()
    }
}

/// One bit at the start of every aligned group of `2^k` bits of a word, for `k` in `0..6`.
const GROUP_STARTS: [u64; 6] = [
    u64::MAX,
    0x5555_5555_5555_5555,
    0x1111_1111_1111_1111,
    0x0101_0101_0101_0101,
    0x0001_0001_0001_0001,
    0x0000_0001_0000_0001,
];

/// The bits of `word` that start an aligned group of `2^k` free blocks (`k < 6`: a group lies inside
/// one word): bit `i` is set when `i` is a multiple of `2^k` and bits `i..i + 2^k` are all clear.
pub(super) fn free_groups(word: u64, k: u32) -> u64 {
    // After the loop bit i is set when bits i..i+2^k of the word are all free.
    let mut free = !word;
    for shift in 0..k {
        free &= free >> (1u32 << shift);
    }
    free & GROUP_STARTS[k as usize]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_group_starts_are_the_multiples_of_each_group_size() {
        for (k, starts) in GROUP_STARTS.iter().enumerate() {
            let want = (0..64).step_by(1 << k).fold(0u64, |m, i| m | 1 << i);
            assert_eq!(*starts, want, "k = {k}");
        }
    }

    #[test]
    fn free_groups_agree_with_a_bit_by_bit_count() {
        let words = [
            0u64,
            u64::MAX,
            0x8000_0000_0000_0001,
            0x0f0f_00ff_1234_5678,
            1 << 17,
        ];
        for w in words {
            for k in 0..6u32 {
                let g = 1u32 << k;
                let want = (0..64 / g)
                    .map(|i| i * g)
                    .filter(|start| (0..g).all(|b| w & (1u64 << (start + b)) == 0))
                    .fold(0u64, |m, start| m | 1 << start);
                assert_eq!(free_groups(w, k), want, "word {w:#x}, k {k}");
            }
        }
    }
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

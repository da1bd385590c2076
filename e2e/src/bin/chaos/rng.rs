//! A small seeded random number generator (SplitMix64): the fault schedule is a function of the seed
//! alone, so `CHAOS_SEED` replays the same sequence of fault kinds, holds, targets and gaps.

use std::time::Duration;

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, a good enough spread for a schedule.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // 128-bit multiply-shift: unbiased enough for schedules (bias < n / 2^64).
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A duration drawn uniformly from `lo_ms..=hi_ms` milliseconds.
    pub fn millis(&mut self, lo_ms: u64, hi_ms: u64) -> Duration {
        Duration::from_millis(lo_ms + self.below(hi_ms.saturating_sub(lo_ms) + 1))
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn one_seed_gives_one_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..16).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.below(1000)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| *x < 1000));
        assert_ne!(Rng::new(8).next_u64(), Rng::new(7).next_u64());
    }
}

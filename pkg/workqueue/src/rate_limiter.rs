//! Rate limiters deciding how long a failed key waits before it is retried.
//!
//! These mirror client-go's `ItemExponentialFailureRateLimiter`,
//! `BucketRateLimiter` (a [`TokenBucket`]) and `MaxOfRateLimiter`.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use crate::token_bucket::TokenBucket;

/// Base delay of the default controller's per-item exponential backoff.
const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(5);
/// Cap of the default controller's per-item exponential backoff.
const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1000);
/// Sustained rate of the default controller's overall token bucket.
const DEFAULT_QPS: f64 = 10.0;
/// Burst size of the default controller's overall token bucket.
const DEFAULT_BURST: u32 = 100;

/// Decides how long a key waits before it is retried (client-go's `RateLimiter`).
pub struct RateLimiter<K> {
    kind: Kind<K>,
}

/// The concrete limiting strategy.
enum Kind<K> {
    /// Per-key exponential backoff.
    Exponential(ExponentialBackoff<K>),
    /// One token bucket shared by all keys.
    Bucket(TokenBucket),
    /// The largest delay of several limiters.
    MaxOf(Vec<RateLimiter<K>>),
}

impl<K: Clone + Eq + Hash> RateLimiter<K> {
    /// Per-key exponential backoff: `base * 2^failures`, capped at `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Self {
            kind: Kind::Exponential(ExponentialBackoff {
                base,
                max,
                failures: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Overall token bucket refilling `qps` tokens per second, holding at most `burst`.
    ///
    /// An infinite `qps` never delays; a zero, negative or NaN `qps` allows the
    /// burst and then delays for [`Duration::MAX`].
    pub fn bucket(qps: f64, burst: u32) -> Self {
        Self {
            kind: Kind::Bucket(TokenBucket::new(qps, burst)),
        }
    }

    /// The largest delay of all `limiters` (every limiter is consulted on each call).
    pub fn max_of(limiters: Vec<RateLimiter<K>>) -> Self {
        Self {
            kind: Kind::MaxOf(limiters),
        }
    }

    /// client-go's `DefaultControllerRateLimiter`: max of 5ms..1000s backoff and a 10 qps / 100 burst bucket.
    pub fn default_controller() -> Self {
        Self::max_of(vec![
            Self::exponential(DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY),
            Self::bucket(DEFAULT_QPS, DEFAULT_BURST),
        ])
    }

    /// Records one more failure of `key` and returns how long it should wait.
    pub fn when(&self, key: &K) -> Duration {
        match &self.kind {
            Kind::Exponential(backoff) => backoff.when(key),
            Kind::Bucket(bucket) => bucket.reserve(),
            Kind::MaxOf(limiters) => limiters
                .iter()
                .map(|limiter| limiter.when(key))
                .max()
                .unwrap_or(Duration::ZERO),
        }
    }

    /// Stops tracking `key`, resetting its failure count.
    pub fn forget(&self, key: &K) {
        match &self.kind {
            Kind::Exponential(backoff) => {
                backoff.failures.lock().remove(key);
            }
            Kind::Bucket(_) => {}
            Kind::MaxOf(limiters) => limiters.iter().for_each(|limiter| limiter.forget(key)),
        }
    }

    /// How many times `key` has failed since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        match &self.kind {
            Kind::Exponential(backoff) => backoff.failures.lock().get(key).copied().unwrap_or(0),
            Kind::Bucket(_) => 0,
            Kind::MaxOf(limiters) => limiters
                .iter()
                .map(|limiter| limiter.num_requeues(key))
                .max()
                .unwrap_or(0),
        }
    }

    /// Number of keys with a tracked failure count, summed over all limiters.
    #[cfg(test)]
    pub(crate) fn tracked_keys(&self) -> usize {
        match &self.kind {
            Kind::Exponential(backoff) => backoff.failures.lock().len(),
            Kind::Bucket(_) => 0,
            Kind::MaxOf(limiters) => limiters.iter().map(RateLimiter::tracked_keys).sum(),
        }
    }
}

impl<K: Clone + Eq + Hash> Default for RateLimiter<K> {
    fn default() -> Self {
        Self::default_controller()
    }
}

impl<K> fmt::Debug for RateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Exponential(backoff) => f
                .debug_struct("Exponential")
                .field("base", &backoff.base)
                .field("max", &backoff.max)
                .finish_non_exhaustive(),
            Kind::Bucket(bucket) => f.debug_tuple("Bucket").field(bucket).finish(),
            Kind::MaxOf(limiters) => f.debug_tuple("MaxOf").field(limiters).finish(),
        }
    }
}

/// client-go's `ItemExponentialFailureRateLimiter`.
struct ExponentialBackoff<K> {
    /// Delay after the first failure.
    base: Duration,
    /// Largest delay ever returned.
    max: Duration,
    /// Failures per key; one entry per key, removed by `forget`.
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Clone + Eq + Hash> ExponentialBackoff<K> {
    /// Bumps the failure count of `key` and returns the backoff for its previous count.
    fn when(&self, key: &K) -> Duration {
        let mut failures = self.failures.lock();
        let exponent = match failures.get_mut(key) {
            Some(count) => {
                let previous = *count;
                *count = count.saturating_add(1);
                previous
            }
            None => {
                failures.insert(key.clone(), 1);
                0
            }
        };
        drop(failures);
        backoff(self.base, self.max, exponent)
    }
}

/// `base * 2^exponent`, or `max` when that is larger or does not fit.
fn backoff(base: Duration, max: Duration, exponent: u32) -> Duration {
    let scaled = 1u128
        .checked_shl(exponent)
        .and_then(|factor| base.as_nanos().checked_mul(factor));
    match scaled {
        Some(nanos) if nanos < max.as_nanos() => u64::try_from(nanos)
            .map(Duration::from_nanos)
            .unwrap_or(max),
        _ => max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Asserts two durations differ by at most a microsecond (float rounding).
    fn assert_close(actual: Duration, expected: Duration) {
        let diff = actual.abs_diff(expected);
        assert!(
            diff <= Duration::from_micros(1),
            "{actual:?} != {expected:?}"
        );
    }

    #[test]
    fn exponential_delay_doubles_per_failure_and_caps_at_max() {
        let limiter = RateLimiter::exponential(MS, 10 * MS);
        let delays: Vec<_> = (0..6).map(|_| limiter.when(&"a")).collect();
        assert_eq!(delays, vec![MS, 2 * MS, 4 * MS, 8 * MS, 10 * MS, 10 * MS]);
    }

    #[test]
    fn exponential_keys_back_off_independently() {
        let limiter = RateLimiter::exponential(MS, Duration::from_secs(1));
        limiter.when(&"a");
        limiter.when(&"a");
        assert_eq!(limiter.when(&"b"), MS);
        assert_eq!(limiter.when(&"a"), 4 * MS);
    }

    #[test]
    fn exponential_returns_max_instead_of_overflowing() {
        let max = Duration::from_secs(u64::MAX);
        let limiter = RateLimiter::exponential(Duration::from_secs(1), max);
        let last = (0..300).map(|_| limiter.when(&1)).last();
        assert_eq!(last, Some(max));
        assert_eq!(limiter.num_requeues(&1), 300);
    }

    #[test]
    fn forget_resets_the_failure_count_and_frees_the_entry() {
        let limiter = RateLimiter::exponential(MS, Duration::from_secs(1));
        limiter.when(&"a");
        limiter.when(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 2);
        assert_eq!(limiter.tracked_keys(), 1);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.tracked_keys(), 0);
        assert_eq!(limiter.when(&"a"), MS);
    }

    #[test]
    fn the_limiter_keeps_one_entry_per_key() {
        let limiter = RateLimiter::<u32>::default_controller();
        for round in 0..5 {
            for key in 0..10 {
                limiter.when(&key);
            }
            assert_eq!(limiter.tracked_keys(), 10, "round {round}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn default_controller_takes_the_larger_of_backoff_and_bucket() {
        let limiter = RateLimiter::<u32>::default_controller();
        assert_eq!(limiter.when(&0), 5 * MS);
        assert_eq!(limiter.when(&0), 10 * MS);
        assert_eq!(limiter.num_requeues(&0), 2);
        // Use up the rest of the burst (two tokens are gone already).
        for key in 1..99 {
            assert_eq!(limiter.when(&key), 5 * MS, "key {key}");
        }
        // Now the bucket (100ms owed) outweighs a fresh key's 5ms backoff.
        assert_close(limiter.when(&1000), 100 * MS);
        limiter.forget(&0);
        assert_eq!(limiter.num_requeues(&0), 0);
    }

    #[test]
    fn debug_output_names_the_strategy() {
        let limiter = RateLimiter::<u8>::default_controller();
        let text = format!("{limiter:?}");
        assert!(text.contains("MaxOf") && text.contains("Exponential") && text.contains("Bucket"));
    }
}

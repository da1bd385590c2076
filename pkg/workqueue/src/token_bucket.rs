//! The one token bucket of the workspace: `golang.org/x/time/rate`'s limiter used through
//! `Reserve().Delay()`, which is what client-go's `BucketRateLimiter` (the workqueue's overall limit) and
//! its `flowcontrol` QPS/burst limiter (a client's `--kube-api-qps`/`--kube-api-burst`) both are.
//!
//! Time is tokio's clock, so tests run it paused.

use std::fmt;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A token bucket refilling `qps` tokens a second and holding at most `burst`; shareable (`&self`).
pub struct TokenBucket {
    /// Tokens added per second.
    qps: f64,
    /// Largest number of stored tokens.
    burst: f64,
    state: Mutex<State>,
}

struct State {
    /// Tokens available at `last`; negative when reservations are queued.
    tokens: f64,
    /// When `tokens` was last computed; `None` means the bucket is full.
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` per second.
    ///
    /// An infinite `qps` never delays; a zero, negative or NaN `qps` allows the burst and then delays
    /// for [`Duration::MAX`].
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            qps,
            burst: f64::from(burst),
            state: Mutex::new(State {
                tokens: f64::from(burst),
                last: None,
            }),
        }
    }

    /// Reserves one token now and returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    /// Whether the bucket refills at a finite, positive rate.
    fn refills(&self) -> bool {
        self.qps.is_finite() && self.qps > 0.0
    }

    /// Reserves one token at `now` and returns how long until it may be used.
    fn reserve_at(&self, now: Instant) -> Duration {
        if self.qps.is_infinite() && self.qps > 0.0 {
            return Duration::ZERO;
        }
        let mut st = self.state.lock();
        let available = match st.last {
            None => self.burst,
            Some(last) if self.refills() => {
                let elapsed = now.saturating_duration_since(last).as_secs_f64();
                (st.tokens + elapsed * self.qps).min(self.burst)
            }
            Some(_) => st.tokens,
        };
        st.last = Some(now);
        if available >= 1.0 {
            st.tokens = available - 1.0;
            return Duration::ZERO;
        }
        if !self.refills() {
            // Like x/time/rate, an unsatisfiable reservation consumes nothing.
            st.tokens = available;
            return Duration::MAX;
        }
        st.tokens = available - 1.0;
        Duration::try_from_secs_f64(-st.tokens / self.qps).unwrap_or(Duration::MAX)
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
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

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_the_burst_then_spaces_reservations_at_the_qps() {
        let bucket = TokenBucket::new(10.0, 3);
        for i in 0..3 {
            assert_eq!(bucket.reserve(), Duration::ZERO, "call {i}");
        }
        assert_close(bucket.reserve(), 100 * MS);
        assert_close(bucket.reserve(), 200 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_refills_while_time_passes_up_to_the_burst() {
        let bucket = TokenBucket::new(10.0, 5);
        for _ in 0..5 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
        assert_close(bucket.reserve(), 100 * MS);
        // One token is owed; a second refills ten, but the bucket holds at most the burst.
        tokio::time::advance(Duration::from_secs(1)).await;
        for i in 0..5 {
            assert_eq!(bucket.reserve(), Duration::ZERO, "call {i}");
        }
        assert_close(bucket.reserve(), 100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn an_infinite_qps_never_delays() {
        let bucket = TokenBucket::new(f64::INFINITY, 0);
        assert!((0..1000).all(|_| bucket.reserve() == Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_qps_delays_forever_after_the_burst() {
        let bucket = TokenBucket::new(0.0, 2);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::MAX);
    }
}

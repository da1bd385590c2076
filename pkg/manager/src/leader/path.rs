//! How late a write sent now may reach the API server: an upper bound on the one-way delay of the path,
//! learned from round trips, for the fence (`guard.rs`).
//!
//! Why the fence needs it: a write's deadline tells the API server when to give up (`timeout=`), but the
//! server starts that clock when the request *arrives*. A write sent inside the fence over a path that
//! holds packets for longer than the safety margin can arrive — and be applied — after another replica
//! may have taken the Lease (seen in `hack/chaos.sh`, seed 2611: a 1.5 s path delay landed Node PATCHes
//! 0.45 s after their writer's term). A one-way delay is never longer than a round trip over the same path,
//! so the longest recent round trip bounds it — and a request still unanswered after `e` proves the path
//! is at least that slow now, which covers a path that turned slow after the last answer.
//!
//! That bound grows only as fast as the clock: a write sent the moment a path turns lossy is sent with the
//! old, short bound, and TCP's retransmissions can deliver it seconds later (the 30-minute campaign,
//! seed 2611: a PATCH landed 0.54 s after its writer's term behind 1.2 s of delay and 34 % loss). So a
//! request unanswered for far longer than any recent round trip ([`PathDelay::stalled`]) stops new writes
//! until it is answered or abandoned: a path that just changed is not trusted with a write.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How many recent worst round trips a request may wait before the path counts as stalled.
const STALL_FACTOR: u32 = 4;
/// The least wait that counts as a stall, so an idle or very fast path (a few ms) is not stalled by one
/// scheduling hiccup of this process or the API server.
const MIN_STALL: Duration = Duration::from_millis(250);

/// Round trips observed over the last one to two `window`s, and the requests still unanswered.
#[derive(Debug)]
pub(crate) struct PathDelay {
    window: Duration,
    current_since: Option<Instant>,
    current_max: Duration,
    previous_max: Duration,
    /// Start times of requests in flight (writes and lease renewals), with a count per instant.
    in_flight: BTreeMap<Instant, usize>,
}

impl PathDelay {
    /// Remembers a slow round trip for at least `window` (and less than twice that).
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            current_since: None,
            current_max: Duration::ZERO,
            previous_max: Duration::ZERO,
            in_flight: BTreeMap::new(),
        }
    }

    fn rotate(&mut self, now: Instant) {
        let since = *self.current_since.get_or_insert(now);
        let age = now.saturating_duration_since(since);
        if age >= self.window {
            self.previous_max = if age < self.window * 2 {
                self.current_max
            } else {
                Duration::ZERO
            };
            self.current_max = Duration::ZERO;
            self.current_since = Some(now);
        }
    }

    /// A request was sent at `sent`.
    pub(crate) fn started(&mut self, sent: Instant) {
        *self.in_flight.entry(sent).or_default() += 1;
    }

    /// The request sent at `sent` ended at `now`; `answered` when the API server replied (its round trip
    /// is a sample), otherwise (abandoned, transport error) its time in flight still is one: the path
    /// was at least that slow.
    pub(crate) fn ended(&mut self, sent: Instant, now: Instant) {
        if let Some(n) = self.in_flight.get_mut(&sent) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&sent);
            }
        }
        self.rotate(now);
        self.current_max = self.current_max.max(now.saturating_duration_since(sent));
    }

    /// How long the oldest request still in flight has waited.
    fn oldest_unanswered(&self, now: Instant) -> Duration {
        self.in_flight
            .keys()
            .next()
            .map(|sent| now.saturating_duration_since(*sent))
            .unwrap_or_default()
    }

    /// The longest a request sent `now` may take to arrive, as far as this process can tell.
    pub(crate) fn one_way_bound(&mut self, now: Instant) -> Duration {
        self.rotate(now);
        self.current_max
            .max(self.previous_max)
            .max(self.oldest_unanswered(now))
    }

    /// A request has waited more than [`STALL_FACTOR`] times the worst recent round trip (and at least
    /// [`MIN_STALL`]): the path changed since it was last measured, so a write sent now could arrive
    /// later than any bound this process can give.
    pub(crate) fn stalled(&mut self, now: Instant) -> bool {
        self.rotate(now);
        let recent = self.current_max.max(self.previous_max);
        self.oldest_unanswered(now) > (recent * STALL_FACTOR).max(MIN_STALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_path_never_measured_adds_nothing() {
        let mut p = PathDelay::new(1000 * MS);
        assert_eq!(p.one_way_bound(Instant::now()), Duration::ZERO);
    }

    #[test]
    fn the_longest_recent_round_trip_bounds_the_one_way_delay() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(1000 * MS);
        p.started(t0);
        p.ended(t0, t0 + 30 * MS);
        p.started(t0 + 40 * MS);
        p.ended(t0 + 40 * MS, t0 + 45 * MS);
        assert_eq!(p.one_way_bound(t0 + 50 * MS), 30 * MS);
    }

    #[test]
    fn a_request_still_unanswered_proves_the_path_is_at_least_that_slow_now() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(1000 * MS);
        p.started(t0);
        p.ended(t0, t0 + 5 * MS);
        p.started(t0 + 10 * MS);
        p.started(t0 + 20 * MS);
        assert_eq!(p.one_way_bound(t0 + 1510 * MS), 1500 * MS);
    }

    #[test]
    fn two_requests_sent_at_the_same_instant_are_both_tracked() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(10_000 * MS);
        p.started(t0);
        p.started(t0);
        p.ended(t0, t0 + MS);
        assert_eq!(p.one_way_bound(t0 + 900 * MS), 900 * MS);
    }

    #[test]
    fn a_request_waiting_far_beyond_the_recent_round_trips_stalls_the_path() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(10_000 * MS);
        p.started(t0);
        p.ended(t0, t0 + 20 * MS);
        p.started(t0 + 100 * MS);
        assert!(!p.stalled(t0 + 340 * MS), "240 ms: under the 250 ms floor");
        assert!(p.stalled(t0 + 360 * MS), "260 ms against a worst of 20 ms");
        p.ended(t0 + 100 * MS, t0 + 400 * MS);
        assert!(!p.stalled(t0 + 410 * MS), "answered: nothing waits");
    }

    #[test]
    fn a_path_that_has_long_been_slow_is_not_stalled_by_a_request_as_slow_as_its_round_trips() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(10_000 * MS);
        p.started(t0);
        p.ended(t0, t0 + 900 * MS);
        p.started(t0 + 1000 * MS);
        assert!(
            !p.stalled(t0 + 3500 * MS),
            "2.5 s against a worst of 900 ms"
        );
        assert!(p.stalled(t0 + 4700 * MS), "3.7 s: more than 4 x 900 ms");
    }

    #[test]
    fn a_slow_round_trip_is_forgotten_after_two_windows_of_fast_ones() {
        let t0 = Instant::now();
        let mut p = PathDelay::new(1000 * MS);
        p.started(t0);
        p.ended(t0, t0 + 800 * MS);
        assert_eq!(
            p.one_way_bound(t0 + 1500 * MS),
            800 * MS,
            "still in the window"
        );
        p.started(t0 + 1900 * MS);
        p.ended(t0 + 1900 * MS, t0 + 1905 * MS);
        assert_eq!(
            p.one_way_bound(t0 + 2500 * MS),
            800 * MS,
            "the previous window"
        );
        assert_eq!(p.one_way_bound(t0 + 3000 * MS), 5 * MS, "two windows on");
        assert_eq!(p.one_way_bound(t0 + 6000 * MS), Duration::ZERO);
    }
}

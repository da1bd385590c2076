//! The synchronous core of a queue: FIFO, dirty and processing sets, delayed keys.
//!
//! Everything here runs under the queue's mutex; waking waiters is left to
//! the caller, guided by the return values.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::delay::DelayHeap;
use crate::metrics::Recorder;

/// What `add_after` did with a key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scheduled {
    /// Nothing: the queue is shutting down (or the key was already queued).
    Nothing,
    /// The key was pushed onto the FIFO; wake a worker.
    Queued,
    /// The key waits; `true` when the delay timer must re-arm earlier.
    Delayed(bool),
}

/// Once the FIFO has held this many keys, it and the dirty map are shrunk when the FIFO drains: a backlog
/// (every Node queued at once when a leader starts) would otherwise keep their peak size for good.
const SHRINK_DRAINED_ABOVE: usize = 1024;

/// When a key was added or handed out: nanoseconds since the queue's [`State::epoch`]. Half an
/// `Instant`'s 16 bytes, so an entry of the dirty and processing maps is 24 bytes instead of 32: during a
/// backlog every Node's key sits in the dirty map (65,536 slots at 50,000 Nodes). Signed: a caller may
/// pass a time from before the queue was made; 292 years either way.
#[derive(Debug, Clone, Copy)]
struct Stamp(i64);

/// The queue's data; one entry per key in each structure.
pub(crate) struct State<K> {
    /// What every [`Stamp`] counts from.
    epoch: Instant,
    /// Keys ready to be handed out, in order.
    queue: VecDeque<K>,
    /// Keys that need processing (queued, or re-added while processing), each with when it was first
    /// added since it was last handed out (the queue-duration metric's start).
    dirty: HashMap<K, Stamp>,
    /// Keys currently held by a worker, each with when it was handed out.
    processing: HashMap<K, Stamp>,
    /// Keys waiting for their `add_after` time.
    delayed: DelayHeap<K>,
    /// Set by shutdown; no more keys are accepted.
    shutting_down: bool,
    /// Metric recording.
    recorder: Recorder,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// An empty state recording through `recorder`.
    pub(crate) fn new(recorder: Recorder) -> Self {
        Self {
            epoch: Instant::now(),
            queue: VecDeque::new(),
            dirty: HashMap::new(),
            processing: HashMap::new(),
            delayed: DelayHeap::new(),
            shutting_down: false,
            recorder,
        }
    }

    /// Marks `key` dirty; returns true if it was pushed onto the FIFO.
    pub(crate) fn add(&mut self, key: K, now: Instant) -> bool {
        if self.shutting_down || self.dirty.contains_key(&key) {
            return false;
        }
        self.recorder.added();
        let stamp = self.stamp(now);
        if self.processing.contains_key(&key) {
            // It runs again once the current worker calls done.
            self.dirty.insert(key, stamp);
            return false;
        }
        self.dirty.insert(key.clone(), stamp);
        self.push(key);
        true
    }

    /// Hands out the next queued key, moving it from dirty to processing.
    pub(crate) fn pop(&mut self, now: Instant) -> Option<K> {
        let key = self.queue.pop_front()?;
        let stamp = self.stamp(now);
        let added = self.dirty.remove(&key).unwrap_or(stamp);
        self.processing.insert(key.clone(), stamp);
        self.recorder.started(self.instant(added), now);
        self.update_unfinished_work(now);
        if self.queue.is_empty() {
            self.shrink_drained();
        }
        Some(key)
    }

    /// Ends processing of `key`; returns true if it was queued again because it
    /// was re-added meanwhile. Keys not being processed are ignored.
    pub(crate) fn done(&mut self, key: &K, now: Instant) -> bool {
        let Some(started) = self.processing.remove(key) else {
            return false;
        };
        self.recorder.finished(self.instant(started), now);
        self.update_unfinished_work(now);
        if self.dirty.contains_key(key) {
            self.push(key.clone());
            return true;
        }
        false
    }

    /// Adds `key` after `delay` (now if zero), counting a retry.
    pub(crate) fn add_after(&mut self, key: K, delay: Duration, now: Instant) -> Scheduled {
        if self.shutting_down {
            return Scheduled::Nothing;
        }
        self.recorder.retried();
        if delay.is_zero() {
            return if self.add(key, now) {
                Scheduled::Queued
            } else {
                Scheduled::Nothing
            };
        }
        let ready_at = now.checked_add(delay).unwrap_or_else(|| far_future(now));
        Scheduled::Delayed(self.delayed.schedule(key, ready_at))
    }

    /// Adds the delayed keys ready at `now`; returns how many were pushed.
    pub(crate) fn promote_ready(&mut self, now: Instant) -> usize {
        let ready = self.delayed.pop_ready(now);
        ready
            .into_iter()
            .filter(|key| self.add(key.clone(), now))
            .count()
    }

    /// When the next delayed key becomes ready.
    pub(crate) fn next_ready_at(&mut self) -> Option<Instant> {
        self.delayed.next_ready_at()
    }

    /// Stops accepting keys and drops the delayed ones.
    pub(crate) fn shut_down(&mut self) {
        self.shutting_down = true;
        self.delayed.clear();
    }

    /// Refreshes the unfinished-work gauges.
    pub(crate) fn update_unfinished_work(&mut self, now: Instant) {
        let epoch = self.epoch;
        let started = self.processing.values().map(|s| at(epoch, *s));
        self.recorder.update_unfinished_work(now, started);
    }

    /// `now` as a [`Stamp`].
    fn stamp(&self, now: Instant) -> Stamp {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match now.checked_duration_since(self.epoch) {
            Some(after) => Stamp(nanos(after)),
            None => Stamp(-nanos(self.epoch.saturating_duration_since(now))),
        }
    }

    /// The time `stamp` stands for.
    fn instant(&self, stamp: Stamp) -> Instant {
        at(self.epoch, stamp)
    }

    /// Pushes `key` onto the FIFO.
    fn push(&mut self, key: K) {
        self.queue.push_back(key);
        self.recorder.pushed();
    }

    /// Gives back what a drained backlog left allocated: called when the FIFO is empty, so it runs at
    /// most once per time the FIFO grew past [`SHRINK_DRAINED_ABOVE`] (the cost stays amortised O(1)).
    fn shrink_drained(&mut self) {
        if self.queue.capacity() > SHRINK_DRAINED_ABOVE {
            self.queue.shrink_to_fit();
            self.dirty.shrink_to_fit();
        }
    }

    /// The FIFO's and the dirty map's capacity, in keys.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> (usize, usize) {
        (self.queue.capacity(), self.dirty.capacity())
    }

    /// Checks the structural invariants: the FIFO holds distinct dirty keys
    /// that are not processing, and every other dirty key is processing.
    #[cfg(test)]
    pub(crate) fn invariants_hold(&self) -> bool {
        let queued: std::collections::HashSet<&K> = self.queue.iter().collect();
        queued.len() == self.queue.len()
            && queued.iter().all(|key| self.dirty.contains_key(*key))
            && queued.iter().all(|key| !self.processing.contains_key(*key))
            && self
                .dirty
                .keys()
                .all(|key| queued.contains(key) || self.processing.contains_key(key))
    }
}

impl<K> State<K> {
    /// Whether shutdown has begun.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Number of keys ready to be handed out.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no key is held by a worker.
    pub(crate) fn processing_is_empty(&self) -> bool {
        self.processing.is_empty()
    }

    /// Whether metrics are being recorded.
    pub(crate) fn records_metrics(&self) -> bool {
        self.recorder.is_active()
    }
}

/// The time `stamp` counts to from `epoch`.
fn at(epoch: Instant, stamp: Stamp) -> Instant {
    let offset = Duration::from_nanos(stamp.0.unsigned_abs());
    if stamp.0 >= 0 {
        epoch
            .checked_add(offset)
            .unwrap_or_else(|| far_future(epoch))
    } else {
        epoch.checked_sub(offset).unwrap_or(epoch)
    }
}

/// A time so far ahead it never comes (about 30 years), for absurd delays.
fn far_future(now: Instant) -> Instant {
    let thirty_years = Duration::from_secs(86_400 * 365 * 30);
    now.checked_add(thirty_years).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State<&'static str> {
        State::new(Recorder::new(None))
    }

    #[test]
    fn a_stamp_gives_back_the_exact_time_before_and_after_the_queue_was_made() {
        let state = state();
        let epoch = state.epoch;
        let times = [
            epoch,
            epoch + Duration::from_nanos(1),
            epoch + Duration::from_secs(86_400 * 365),
            epoch
                .checked_sub(Duration::from_millis(1500))
                .unwrap_or(epoch),
        ];
        for t in times {
            assert_eq!(state.instant(state.stamp(t)), t);
        }
        // What the stamp is for: a dirty-map entry of an `Arc<str>` key in 24 bytes, not 32.
        assert_eq!(std::mem::size_of::<(std::sync::Arc<str>, Stamp)>(), 24);
    }

    #[test]
    fn adding_a_dirty_key_twice_queues_it_once() {
        let now = Instant::now();
        let mut state = state();
        assert!(state.add("a", now));
        assert!(!state.add("a", now));
        assert_eq!(state.len(), 1);
        assert!(state.invariants_hold());
    }

    #[test]
    fn a_key_readded_while_processing_waits_for_done() {
        let now = Instant::now();
        let mut state = state();
        state.add("a", now);
        assert_eq!(state.pop(now), Some("a"));
        assert!(!state.add("a", now));
        assert_eq!(state.len(), 0);
        assert_eq!(state.pop(now), None);
        assert!(state.invariants_hold());
        assert!(state.done(&"a", now));
        assert_eq!(state.pop(now), Some("a"));
        assert!(!state.done(&"a", now));
        assert!(state.invariants_hold());
    }

    #[test]
    fn done_for_a_key_not_processing_changes_nothing() {
        let now = Instant::now();
        let mut state = state();
        state.add("a", now);
        assert!(!state.done(&"a", now));
        assert_eq!(state.len(), 1);
        assert!(state.invariants_hold());
    }

    #[test]
    fn add_after_zero_queues_immediately_and_positive_delays_wait() {
        let now = Instant::now();
        let mut state = state();
        assert_eq!(state.add_after("a", Duration::ZERO, now), Scheduled::Queued);
        assert_eq!(
            state.add_after("a", Duration::ZERO, now),
            Scheduled::Nothing
        );
        let second = Duration::from_secs(1);
        assert_eq!(state.add_after("b", second, now), Scheduled::Delayed(true));
        assert_eq!(state.next_ready_at(), Some(now + second));
        assert_eq!(state.promote_ready(now), 0);
        assert_eq!(state.promote_ready(now + second), 1);
        assert_eq!(state.len(), 2);
    }

    #[test]
    fn an_absurd_delay_is_clamped_instead_of_overflowing() {
        let now = Instant::now();
        let mut state = state();
        assert_eq!(
            state.add_after("a", Duration::MAX, now),
            Scheduled::Delayed(true)
        );
        assert!(state.next_ready_at().is_some_and(|at| at > now));
    }

    #[test]
    fn a_drained_backlog_gives_its_memory_back_and_a_small_queue_keeps_its_own() {
        let now = Instant::now();
        let mut state = State::new(Recorder::new(None));
        for key in 0..50_000_u32 {
            state.add(key, now);
        }
        let (fifo, dirty) = state.capacity();
        assert!(fifo >= 50_000 && dirty >= 50_000, "{fifo} {dirty}");
        while let Some(key) = state.pop(now) {
            state.done(&key, now);
        }
        let (fifo, dirty) = state.capacity();
        assert!(
            fifo < 64 && dirty < 64,
            "still {fifo} {dirty} after draining"
        );
        assert!(state.invariants_hold());

        for key in 0..100_u32 {
            state.add(key, now);
        }
        let (before, _) = state.capacity();
        while let Some(key) = state.pop(now) {
            state.done(&key, now);
        }
        assert_eq!(
            state.capacity().0,
            before,
            "below the threshold nothing is shrunk"
        );
    }

    #[test]
    fn a_key_readded_while_processing_keeps_its_first_add_time_across_a_shrink() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(5);
        let mut state = State::new(Recorder::new(None));
        for key in 0..2_000_u32 {
            state.add(key, t0);
        }
        assert_eq!(state.pop(t0), Some(0));
        assert!(!state.add(0, later), "processing: it waits for done");
        while let Some(key) = state.pop(later) {
            state.done(&key, later);
        }
        // The FIFO drained and shrank; the re-added key is still dirty and comes back on done.
        assert!(state.done(&0, later));
        assert_eq!(state.pop(later), Some(0));
        assert!(state.invariants_hold());
    }

    #[test]
    fn shut_down_rejects_adds_and_drops_delayed_keys() {
        let now = Instant::now();
        let mut state = state();
        state.add("queued", now);
        state.add_after("delayed", Duration::from_secs(1), now);
        state.shut_down();
        assert!(state.is_shutting_down());
        assert!(!state.add("late", now));
        assert_eq!(
            state.add_after("late", Duration::ZERO, now),
            Scheduled::Nothing
        );
        assert_eq!(state.next_ready_at(), None);
        assert_eq!(state.pop(now), Some("queued"));
        assert_eq!(state.pop(now), None);
    }
}

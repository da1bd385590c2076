//! A deduplicating min-heap of keys waiting for their ready time.
//!
//! Like client-go's delaying queue, a key scheduled twice keeps the earlier
//! ready time. The heap may hold stale entries for rescheduled keys; the
//! `waiting` map is the truth and the heap is compacted when stale entries
//! pile up, so memory stays proportional to the number of waiting keys.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use tokio::time::Instant;

/// Extra stale heap entries tolerated before the heap is rebuilt.
const COMPACTION_SLACK: usize = 32;

/// One scheduled key; ordered so the earliest (then oldest) entry is on top.
struct Entry<K> {
    /// When the key becomes ready.
    ready_at: Instant,
    /// Scheduling sequence number, to tell stale entries from current ones.
    seq: u64,
    /// The scheduled key.
    key: K,
}

impl<K> PartialEq for Entry<K> {
    fn eq(&self, other: &Self) -> bool {
        self.ready_at == other.ready_at && self.seq == other.seq
    }
}

impl<K> Eq for Entry<K> {}

impl<K> PartialOrd for Entry<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Entry<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap and we want the earliest first.
        (other.ready_at, other.seq).cmp(&(self.ready_at, self.seq))
    }
}

/// Keys waiting until a point in time, one entry per key.
pub(crate) struct DelayHeap<K> {
    /// Entries by ready time, possibly including stale ones.
    heap: BinaryHeap<Entry<K>>,
    /// The current ready time and sequence number of every waiting key.
    waiting: HashMap<K, (Instant, u64)>,
    /// Next sequence number to hand out.
    next_seq: u64,
}

impl<K: Clone + Eq + Hash> DelayHeap<K> {
    /// An empty heap.
    pub(crate) fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            waiting: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Schedules `key` for `ready_at` unless it already waits for an earlier time.
    ///
    /// Returns true when the earliest ready time of the heap moved earlier, so
    /// whoever sleeps until that time must wake up and look again.
    pub(crate) fn schedule(&mut self, key: K, ready_at: Instant) -> bool {
        if let Some(&(current, _)) = self.waiting.get(&key) {
            if current <= ready_at {
                return false;
            }
        }
        let previous_earliest = self.next_ready_at();
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.waiting.insert(key.clone(), (ready_at, seq));
        self.heap.push(Entry { ready_at, seq, key });
        self.compact_if_needed();
        previous_earliest.is_none_or(|earliest| ready_at < earliest)
    }

    /// Removes and returns the keys ready at `now`, earliest first.
    pub(crate) fn pop_ready(&mut self, now: Instant) -> Vec<K> {
        let mut ready = Vec::new();
        while self.heap.peek().is_some_and(|top| top.ready_at <= now) {
            let Some(entry) = self.heap.pop() else { break };
            if self.is_current(&entry) {
                self.waiting.remove(&entry.key);
                ready.push(entry.key);
            }
        }
        ready
    }

    /// The earliest ready time of a waiting key, dropping stale entries on top.
    pub(crate) fn next_ready_at(&mut self) -> Option<Instant> {
        while let Some(top) = self.heap.peek() {
            if self.is_current(top) {
                return Some(top.ready_at);
            }
            self.heap.pop();
        }
        None
    }

    /// Forgets every waiting key.
    pub(crate) fn clear(&mut self) {
        self.heap = BinaryHeap::new();
        self.waiting = HashMap::new();
    }

    /// Number of waiting keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Number of heap entries, stale ones included.
    #[cfg(test)]
    fn heap_len(&self) -> usize {
        self.heap.len()
    }

    /// Whether `entry` is the key's current schedule rather than a stale one.
    fn is_current(&self, entry: &Entry<K>) -> bool {
        self.waiting.get(&entry.key) == Some(&(entry.ready_at, entry.seq))
    }

    /// Rebuilds the heap from `waiting` once stale entries outnumber live ones.
    fn compact_if_needed(&mut self) {
        if self.heap.len() > 2 * self.waiting.len() + COMPACTION_SLACK {
            self.heap = self
                .waiting
                .iter()
                .map(|(key, &(ready_at, seq))| Entry {
                    ready_at,
                    seq,
                    key: key.clone(),
                })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn pop_ready_returns_only_due_keys_in_ready_order() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        heap.schedule("c", t0 + secs(3));
        heap.schedule("a", t0 + secs(1));
        heap.schedule("b", t0 + secs(2));
        assert_eq!(heap.pop_ready(t0), Vec::<&str>::new());
        assert_eq!(heap.pop_ready(t0 + secs(2)), vec!["a", "b"]);
        assert_eq!(heap.next_ready_at(), Some(t0 + secs(3)));
        assert_eq!(heap.pop_ready(t0 + secs(10)), vec!["c"]);
        assert_eq!(heap.next_ready_at(), None);
    }

    #[test]
    fn keys_due_at_the_same_time_come_out_in_schedule_order() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        for key in [5, 3, 9, 1] {
            heap.schedule(key, t0);
        }
        assert_eq!(heap.pop_ready(t0), vec![5, 3, 9, 1]);
    }

    #[test]
    fn the_earlier_schedule_wins_for_the_same_key() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        assert!(heap.schedule("a", t0 + secs(5)));
        assert!(heap.schedule("a", t0 + secs(2)));
        assert!(!heap.schedule("a", t0 + secs(9)));
        assert_eq!(heap.len(), 1);
        assert_eq!(heap.next_ready_at(), Some(t0 + secs(2)));
        assert_eq!(heap.pop_ready(t0 + secs(2)), vec!["a"]);
        // The stale entry for 5s must not hand the key out a second time.
        assert_eq!(heap.pop_ready(t0 + secs(10)), Vec::<&str>::new());
        assert_eq!(heap.len(), 0);
    }

    #[test]
    fn schedule_reports_whether_the_earliest_time_moved_earlier() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        assert!(heap.schedule(1, t0 + secs(5)));
        assert!(!heap.schedule(2, t0 + secs(7)));
        assert!(heap.schedule(3, t0 + secs(1)));
        assert!(!heap.schedule(4, t0 + secs(1)));
    }

    #[test]
    fn a_key_can_be_scheduled_again_after_it_fired() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        heap.schedule("a", t0 + secs(5));
        heap.schedule("a", t0 + secs(1));
        assert_eq!(heap.pop_ready(t0 + secs(1)), vec!["a"]);
        heap.schedule("a", t0 + secs(5));
        assert_eq!(heap.pop_ready(t0 + secs(5)), vec!["a"]);
        assert_eq!(heap.next_ready_at(), None);
    }

    #[test]
    fn stale_entries_are_compacted_away() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        for step in 0..10_000u64 {
            heap.schedule("a", t0 + secs(1_000_000 - step));
            assert!(heap.heap_len() <= 2 * heap.len() + COMPACTION_SLACK + 1);
        }
        assert_eq!(heap.len(), 1);
        assert_eq!(heap.pop_ready(t0 + secs(1_000_000)), vec!["a"]);
    }

    #[test]
    fn clear_forgets_every_key() {
        let t0 = Instant::now();
        let mut heap = DelayHeap::new();
        heap.schedule(1, t0);
        heap.schedule(2, t0 + secs(1));
        heap.clear();
        assert_eq!(heap.len(), 0);
        assert_eq!(heap.next_ready_at(), None);
        assert_eq!(heap.pop_ready(t0 + secs(5)), Vec::<i32>::new());
    }
}

//! A small map whose entries expire a fixed time after they were stored, optionally bounded in size:
//! the secure port's review answers, the Events recently recorded, a controller's writes not yet seen
//! in the cache. Ages are read from the monotonic clock (tokio's, so tests run it paused).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Entries valid for `ttl` after they were stored; shareable (`&self`).
pub struct TtlCache<K, V> {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache whose entries live `ttl`, with no bound on their number: expired entries stay
    /// until they are replaced or removed, so the keys must be bounded by what the caller tracks.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            capacity: usize::MAX,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The same cache holding at most `capacity` entries: when full, expired entries are dropped, then
    /// the oldest, so a flood of distinct keys cannot grow memory without bound.
    pub fn bounded(self, capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ..self
        }
    }

    /// The value stored for `key` less than the TTL ago.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.get_with_remaining(key).map(|(v, _)| v)
    }

    /// The value stored for `key` less than the TTL ago, with how long it stays valid.
    pub fn get_with_remaining<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<(V, Duration)>
    where
        K: Borrow<Q>,
    {
        let entries = self.entries.lock();
        let (v, at) = entries.get(key)?;
        let left = self
            .ttl
            .checked_sub(at.elapsed())
            .filter(|l| !l.is_zero())?;
        Some((v.clone(), left))
    }

    /// Stores `value` for `key` from now on, replacing what was there.
    pub fn insert(&self, key: K, value: V) {
        let mut entries = self.entries.lock();
        self.make_room(&mut entries, &key);
        entries.insert(key, (value, Instant::now()));
    }

    /// Stores `value` for `key` unless a valid entry is there already; whether it stored it.
    pub fn insert_if_absent(&self, key: K, value: V) -> bool {
        let mut entries = self.entries.lock();
        if entries
            .get(&key)
            .is_some_and(|(_, at)| at.elapsed() < self.ttl)
        {
            return false;
        }
        self.make_room(&mut entries, &key);
        entries.insert(key, (value, Instant::now()));
        true
    }

    /// Forgets `key`.
    pub fn remove<Q: Hash + Eq + ?Sized>(&self, key: &Q)
    where
        K: Borrow<Q>,
    {
        self.entries.lock().remove(key);
    }

    /// How many entries are stored, expired ones included.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn make_room(&self, entries: &mut HashMap<K, (V, Instant)>, key: &K) {
        if entries.len() < self.capacity || entries.contains_key(key) {
            return;
        }
        entries.retain(|_, (_, at)| at.elapsed() < self.ttl);
        if entries.len() >= self.capacity {
            let oldest = entries
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                entries.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_distinct_fresh_keys_keeps_a_bounded_cache_at_its_capacity_with_the_newest() {
        let cache = TtlCache::new(Duration::from_secs(10)).bounded(8);
        for i in 0..1000u32 {
            cache.insert(i, ());
        }
        assert_eq!(cache.len(), 8);
        assert_eq!(cache.get(&999), Some(()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_is_valid_for_the_ttl_and_then_gone() {
        let cache = TtlCache::new(Duration::from_secs(30));
        cache.insert("a", 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            cache.get_with_remaining(&"a"),
            Some((1, Duration::from_secs(20)))
        );
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(cache.get(&"a"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn insert_if_absent_stores_once_per_ttl() {
        let cache = TtlCache::new(Duration::from_secs(30));
        assert!(cache.insert_if_absent("a", ()));
        assert!(!cache.insert_if_absent("a", ()));
        assert!(cache.insert_if_absent("b", ()));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(cache.insert_if_absent("a", ()));
    }

    #[test]
    fn a_removed_key_is_gone() {
        let cache = TtlCache::new(Duration::from_secs(10));
        cache.insert("a", 1);
        cache.remove(&"a");
        assert_eq!(cache.get(&"a"), None);
        assert!(cache.is_empty());
    }
}

//! Per-Node maps and sets under churn. Start at [`make_room_for_one`].
//!
//! A `HashMap` that holds ~50,000 Nodes sits at 87 % of its buckets, and the tombstones its deletes
//! leave use up the free slots it has left; the next insert then doubles the table though it holds no
//! more Nodes than before, a step up in netcm's RSS minutes into churn (see `MODE=churn hack/bench.sh
//! allocation`; the tests below double a table of 50,000 this way). [`make_room_for_one`] rebuilds
//! such a table at the size its entries need instead, clearing the tombstones. Every per-Node table of
//! the long-lived process calls it before an insert: the ledger, the allocator's tracking, the
//! informer's cache and the annotation syncer's record of its writes.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// A hash table [`make_room_for_one`] can rebuild.
pub trait Table {
    /// How many entries it holds.
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How many entries it holds before an insert of a new key must resize it: its entries plus the
    /// free slots that neither an entry nor a tombstone uses.
    fn capacity(&self) -> usize;
    /// Moves every entry into a fresh table with room for `capacity` entries.
    fn rebuild(&mut self, capacity: usize);
}

impl<K: Eq + Hash, V, S: BuildHasher + Clone> Table for HashMap<K, V, S> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn rebuild(&mut self, capacity: usize) {
        let mut fresh = HashMap::with_capacity_and_hasher(capacity, self.hasher().clone());
        fresh.extend(self.drain());
        *self = fresh;
    }
}

impl<K: Eq + Hash, S: BuildHasher + Clone> Table for HashSet<K, S> {
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn rebuild(&mut self, capacity: usize) {
        let mut fresh = HashSet::with_capacity_and_hasher(capacity, self.hasher().clone());
        fresh.extend(self.drain());
        *self = fresh;
    }
}

/// Call before an insert that may add a key. When the next new key would resize the table, it is
/// rebuilt now with room for its entries and an eighth more: a table full of tombstones keeps its size,
/// a table really full of entries grows as the insert would have grown it. The eighth bounds the cost: the next rebuild is at least `len / 8` inserts away, so a
/// rebuild costs O(1) per insert, amortized.
pub fn make_room_for_one<T: Table>(table: &mut T) {
    let len = table.len();
    if len < table.capacity() {
        return;
    }
    table.rebuild(len + len / 8 + 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Creates and deletes one Node at a time on top of `nodes`, `rounds` times; the capacity at the
    /// start and the largest it reached.
    fn churn(nodes: usize, rounds: usize, make_room: bool) -> (usize, usize) {
        let mut map: HashMap<String, u64> = (0..nodes).map(|i| (format!("node-{i}"), 0)).collect();
        let start = map.capacity();
        let mut largest = start;
        for i in 0..rounds {
            if make_room {
                make_room_for_one(&mut map);
            }
            map.insert(format!("node-{}", nodes + i), 0);
            map.remove(&format!("node-{i}"));
            largest = largest.max(map.capacity());
        }
        assert_eq!(map.len(), nodes);
        (start, largest)
    }

    #[test]
    fn a_map_of_50000_nodes_under_churn_keeps_its_size_instead_of_doubling() {
        let (start, largest) = churn(50_000, 60_000, false);
        assert!(
            largest >= 2 * start,
            "plain churn doubles the table: {start} → {largest}"
        );
        let (start, largest) = churn(50_000, 60_000, true);
        assert_eq!(largest, start, "the table stays at its size");
    }

    #[test]
    fn a_set_of_50000_nodes_under_churn_keeps_its_size_instead_of_doubling() {
        let mut set: HashSet<String> = (0..50_000).map(|i| format!("node-{i}")).collect();
        let start = set.capacity();
        for i in 0..60_000 {
            make_room_for_one(&mut set);
            set.insert(format!("node-{}", 50_000 + i));
            set.remove(&format!("node-{i}"));
            assert!(set.capacity() <= start, "grew at turn {i}");
        }
        assert_eq!(set.len(), 50_000);
    }

    #[test]
    fn a_table_growing_from_empty_is_rebuilt_a_bounded_number_of_times_not_on_every_insert() {
        let mut map: HashMap<u32, u32> = HashMap::new();
        let mut resizes = 0;
        for i in 0..200_000 {
            let before = map.capacity();
            make_room_for_one(&mut map);
            map.insert(i, 0);
            if map.capacity() != before {
                resizes += 1;
            }
        }
        // Plain growth doubles 16 times from 4 to 229,376 slots; each rebuild leaves ≥ len/8 room.
        assert!(resizes <= 20, "{resizes} resizes for 200,000 inserts");
    }

    #[test]
    fn a_map_really_full_grows_like_an_insert_would_grow_it() {
        let mut map: HashMap<u32, u32> = HashMap::with_capacity(50_000);
        while map.len() < map.capacity() {
            map.insert(map.len() as u32, 0);
        }
        let full = map.capacity();
        let mut plain = map.clone();
        plain.insert(u32::MAX, 0);
        make_room_for_one(&mut map);
        map.insert(u32::MAX, 0);
        assert_eq!(map.capacity(), plain.capacity());
        assert!(map.capacity() > full);
    }

    #[test]
    fn a_rebuild_keeps_every_entry() {
        let mut map: HashMap<u32, u32> = (0..50_000).map(|i| (i, i * 2)).collect();
        for i in 0..30_000 {
            make_room_for_one(&mut map);
            map.insert(50_000 + i, (50_000 + i) * 2);
            map.remove(&i);
        }
        assert_eq!(map.len(), 50_000);
        assert!((30_000..80_000).all(|i| map.get(&i) == Some(&(i * 2))));
    }
}

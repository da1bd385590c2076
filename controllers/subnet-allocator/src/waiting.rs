//! [`Waiting`]: the Nodes waiting for a free CIDR, in the order they began to wait, so that a release
//! wakes the Nodes that have waited longest.

use std::collections::HashMap;

/// The waiting Nodes by name, each with its place in line.
#[derive(Default)]
pub(crate) struct Waiting {
    /// Each waiting Node's place: a count of the waits begun before it.
    since: HashMap<String, u64>,
    next: u64,
}

impl Waiting {
    /// `name` waits; a Node already waiting keeps its place.
    pub(crate) fn insert(&mut self, name: &str) {
        if self.since.contains_key(name) {
            return;
        }
        netcm_table::make_room_for_one(&mut self.since);
        self.since.insert(name.to_string(), self.next);
        self.next += 1;
    }

    /// `name` waits no more.
    pub(crate) fn remove(&mut self, name: &str) {
        self.since.remove(name);
    }

    /// Every waiting Node, in no particular order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.since.keys().map(String::as_str)
    }

    /// Every waiting Node, the one waiting longest first.
    pub(crate) fn longest_first(&self) -> Vec<&str> {
        let mut names: Vec<(&str, u64)> =
            self.since.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        names.sort_unstable_by_key(|(_, s)| *s);
        names.into_iter().map(|(n, _)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_come_out_in_the_order_they_began_to_wait_and_a_second_wait_keeps_the_first_place() {
        let mut w = Waiting::default();
        for name in ["c", "a", "b", "c"] {
            w.insert(name);
        }
        assert_eq!(w.longest_first(), ["c", "a", "b"]);
        w.remove("c");
        w.insert("c");
        assert_eq!(w.longest_first(), ["a", "b", "c"]);
    }
}

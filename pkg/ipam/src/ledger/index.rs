//! The per-family overlap index of the [`Ledger`](super::Ledger): every holding keyed by its first address
//! and prefix, so the holdings overlapping a CIDR are one ordered range scan plus one exact lookup per
//! prefix length in use (the parent module's overview says why that finds them all).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::addr::{host_mask, net_from, Family, Span};

use super::Holding;

/// The nodes holding one CIDR: almost always exactly one, so no `Vec` is allocated for it, and the
/// rare many are boxed, keeping an index entry's value at 16 bytes.
#[derive(Debug)]
enum Holders {
    One(Arc<str>),
    /// More than one only after a conflict written by others. Boxed: a bare `Vec` would make every
    /// entry 24 bytes for a case that is rare.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Arc<str>>>),
}

impl Holders {
    fn as_slice(&self) -> &[Arc<str>] {
        match self {
            Holders::One(one) => std::slice::from_ref(one),
            Holders::Many(many) => many,
        }
    }

    fn push(&mut self, node: Arc<str>) {
        match self {
            Holders::One(one) => *self = Holders::Many(Box::new(vec![one.clone(), node])),
            Holders::Many(many) => many.push(node),
        }
    }

    /// Removes `node`; returns whether it was there and whether anyone is left.
    fn remove(&mut self, node: &str) -> (bool, bool) {
        match self {
            Holders::One(one) => (one.as_ref() == node, one.as_ref() != node),
            Holders::Many(many) => match many.iter().position(|h| h.as_ref() == node) {
                Some(pos) => {
                    many.swap_remove(pos);
                    (true, !many.is_empty())
                }
                None => (false, !many.is_empty()),
            },
        }
    }
}

/// How one family's index keys a CIDR: its first address and prefix, ordered by address, then prefix,
/// in as few bytes as the family allows. The index is most of the ledger at 50,000 Nodes, and a
/// `(u128, u8)` key takes 32 bytes where an IPv4 key fits in 8.
pub(super) trait IndexKey: Ord + Copy {
    /// The key of the CIDR `first/prefix`.
    fn pack(first: u128, prefix: u8) -> Self;
    /// The CIDR's first address.
    fn first(self) -> u128;
    /// The CIDR's prefix length.
    fn prefix(self) -> u8;
}

/// IPv4: the 32-bit address above the prefix byte.
impl IndexKey for u64 {
    fn pack(first: u128, prefix: u8) -> u64 {
        // An IPv4 span's addresses fit in the low 32 bits: the cast drops only zeros.
        ((first as u64) << 8) | u64::from(prefix)
    }

    fn first(self) -> u128 {
        u128::from(self >> 8)
    }

    fn prefix(self) -> u8 {
        (self & 0xff) as u8
    }
}

/// IPv6: the address as two words, so the key is 24 bytes (`u128` would align it to 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct V6Key {
    high: u64,
    low: u64,
    prefix: u8,
}

impl IndexKey for V6Key {
    fn pack(first: u128, prefix: u8) -> V6Key {
        V6Key {
            high: (first >> 64) as u64,
            low: first as u64,
            prefix,
        }
    }

    fn first(self) -> u128 {
        (u128::from(self.high) << 64) | u128::from(self.low)
    }

    fn prefix(self) -> u8 {
        self.prefix
    }
}

/// Holdings of one family keyed by `(first address, prefix)`.
#[derive(Debug)]
pub(super) struct FamilyIndex<K> {
    family: Family,
    /// Nodes holding exactly that CIDR.
    entries: BTreeMap<K, Holders>,
    /// How many entries use each prefix length, to skip absent ones.
    prefix_counts: Vec<u32>,
}

impl<K: IndexKey> FamilyIndex<K> {
    pub(super) fn new(family: Family) -> FamilyIndex<K> {
        FamilyIndex {
            family,
            entries: BTreeMap::new(),
            prefix_counts: vec![0; 129],
        }
    }

    pub(super) fn insert(&mut self, span: &Span, node: &Arc<str>) {
        match self.entries.entry(K::pack(span.first, span.prefix)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Holders::One(node.clone()));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().push(node.clone()),
        }
        self.prefix_counts[usize::from(span.prefix)] += 1;
    }

    pub(super) fn remove(&mut self, span: &Span, node: &str) {
        let key = K::pack(span.first, span.prefix);
        if let Some(holders) = self.entries.get_mut(&key) {
            let (was_there, others_left) = holders.remove(node);
            if was_there {
                self.prefix_counts[usize::from(span.prefix)] -= 1;
            }
            if !others_left {
                self.entries.remove(&key);
            }
        }
    }

    pub(super) fn exact(&self, span: &Span) -> Option<&str> {
        let holders = self.entries.get(&K::pack(span.first, span.prefix))?;
        holders.as_slice().first().map(AsRef::as_ref)
    }

    /// The holdings of the entry `key`.
    fn holdings<'a>(&self, key: K, holders: &'a Holders) -> impl Iterator<Item = Holding<'a>> + 'a {
        let cidr = net_from(self.family, key.first(), key.prefix());
        holders
            .as_slice()
            .iter()
            .map(move |n| Holding { cidr, node: n })
    }

    /// Holdings strictly containing the span: one lookup per prefix length in use.
    pub(super) fn containing<'a>(&'a self, span: Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        let family = self.family;
        (0..span.prefix)
            .filter(move |&prefix| self.prefix_counts[usize::from(prefix)] != 0)
            .filter_map(move |prefix| {
                let first = span.first & !host_mask(u32::from(family.bits() - prefix));
                let key = K::pack(first, prefix);
                self.entries
                    .get(&key)
                    .map(|holders| self.holdings(key, holders))
            })
            .flatten()
    }

    /// See [`Ledger::overlapping`].
    pub(super) fn overlapping<'a>(&'a self, span: Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        // Holdings equal to or inside the span.
        let inside = self
            .entries
            .range(K::pack(span.first, span.prefix)..=K::pack(span.last, u8::MAX))
            .flat_map(move |(&key, holders)| self.holdings(key, holders));
        self.containing(span).chain(inside)
    }
}

/// One of two iterators: a family's holdings, as [`Ledger::overlapping`] returns them.
pub(super) enum EitherFamily<A, B> {
    V4(A),
    V6(B),
}

impl<T, A: Iterator<Item = T>, B: Iterator<Item = T>> Iterator for EitherFamily<A, B> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            EitherFamily::V4(a) => a.next(),
            EitherFamily::V6(b) => b.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_order_by_address_then_prefix_in_both_families() {
        let pairs = [
            ((0u128, 0u8), (0u128, 1u8)),
            ((0x0a00_0000, 24), (0x0a00_0000, 25)),
            ((0x0a00_00ff, 32), (0x0a00_0100, 24)),
            ((0x0a00_0000, 32), (0xffff_ffff, 0)),
        ];
        for ((a, ap), (b, bp)) in pairs {
            assert!(
                u64::pack(a, ap) < u64::pack(b, bp),
                "{a:x}/{ap} < {b:x}/{bp}"
            );
            assert_eq!(
                (u64::pack(a, ap).first(), u64::pack(a, ap).prefix()),
                (a, ap)
            );
        }
        let v6 = [
            (1u128 << 64, 64u8),
            ((1u128 << 64) | 1, 128),
            (2u128 << 64, 0),
            (u128::MAX, 128),
        ];
        for w in v6.windows(2) {
            assert!(V6Key::pack(w[0].0, w[0].1) < V6Key::pack(w[1].0, w[1].1));
        }
        for (a, p) in v6 {
            let k = V6Key::pack(a, p);
            assert_eq!((k.first(), k.prefix()), (a, p));
        }
    }
}

//! [`Ledger`]: which node holds which CIDRs, with an interval index per
//! family to find every holding that overlaps a CIDR in `O(log n)`.
//!
//! CIDRs either nest or are disjoint, so the holdings overlapping a query
//! are those starting inside it (found with one ordered range scan) plus
//! those strictly containing it, whose start is the query's start truncated
//! to their prefix: one exact lookup per prefix length in use.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ipnet::IpNet;

use crate::addr::{host_mask, net_from, Family, Span};

/// A CIDR held by a node, as found by [`Ledger::overlapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding<'a> {
    /// The held CIDR.
    pub cidr: IpNet,
    /// The node holding it.
    pub node: &'a str,
}

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
trait IndexKey: Ord + Copy {
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
struct V6Key {
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
struct FamilyIndex<K> {
    family: Family,
    /// Nodes holding exactly that CIDR.
    entries: BTreeMap<K, Holders>,
    /// How many entries use each prefix length, to skip absent ones.
    prefix_counts: Vec<u32>,
}

impl<K: IndexKey> FamilyIndex<K> {
    fn new(family: Family) -> FamilyIndex<K> {
        FamilyIndex {
            family,
            entries: BTreeMap::new(),
            prefix_counts: vec![0; 129],
        }
    }

    fn insert(&mut self, span: &Span, node: &Arc<str>) {
        match self.entries.entry(K::pack(span.first, span.prefix)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Holders::One(node.clone()));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().push(node.clone()),
        }
        self.prefix_counts[usize::from(span.prefix)] += 1;
    }

    fn remove(&mut self, span: &Span, node: &str) {
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

    fn exact(&self, span: &Span) -> Option<&str> {
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
    fn containing<'a>(&'a self, span: Span) -> impl Iterator<Item = Holding<'a>> + 'a {
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
    fn overlapping<'a>(&'a self, span: Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        // Holdings equal to or inside the span.
        let inside = self
            .entries
            .range(K::pack(span.first, span.prefix)..=K::pack(span.last, u8::MAX))
            .flat_map(move |(&key, holders)| self.holdings(key, holders));
        self.containing(span).chain(inside)
    }
}

/// One of two iterators: a family's holdings, as [`Ledger::overlapping`] returns them.
enum EitherFamily<A, B> {
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

/// The CIDRs one node holds: one for a single-stack node, kept in place (a box of one CIDR cost 32 bytes
/// of heap per node at 50,000 Nodes); a dual-stack node's two, or more, boxed.
#[derive(Debug)]
enum HeldCidrs {
    One(IpNet),
    Many(Box<[IpNet]>),
}

impl HeldCidrs {
    fn new(mut cidrs: Vec<IpNet>) -> HeldCidrs {
        match (cidrs.pop(), cidrs.is_empty()) {
            (Some(one), true) => HeldCidrs::One(one),
            (Some(last), false) => {
                cidrs.push(last);
                HeldCidrs::Many(cidrs.into_boxed_slice())
            }
            (None, _) => HeldCidrs::Many(Box::default()),
        }
    }

    fn as_slice(&self) -> &[IpNet] {
        match self {
            HeldCidrs::One(one) => std::slice::from_ref(one),
            HeldCidrs::Many(many) => many,
        }
    }
}

/// Node → held CIDRs, plus the per-family overlap index. A node's name is stored once and shared by
/// both (at 50,000 Nodes every byte per holding counts).
#[derive(Debug)]
pub(crate) struct Ledger {
    nodes: HashMap<Arc<str>, HeldCidrs>,
    v4: FamilyIndex<u64>,
    v6: FamilyIndex<V6Key>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger {
            nodes: HashMap::new(),
            v4: FamilyIndex::new(Family::V4),
            v6: FamilyIndex::new(Family::V6),
        }
    }

    /// The CIDRs recorded for `node`.
    pub fn held_by(&self, node: &str) -> Option<&[IpNet]> {
        self.nodes.get(node).map(HeldCidrs::as_slice)
    }

    /// The ledger's own copy of the name `node`, for callers that keep it too (one string, not two).
    pub fn owner(&self, node: &str) -> Option<Arc<str>> {
        self.nodes.get_key_value(node).map(|(k, _)| k.clone())
    }

    /// Number of nodes holding CIDRs.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Every node and what it holds, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[IpNet])> {
        self.nodes.iter().map(|(n, c)| (n.as_ref(), c.as_slice()))
    }

    /// Records that `node` holds `cidrs` (normalized), replacing nothing:
    /// callers remove a previous record first.
    pub fn insert(&mut self, node: &str, cidrs: Vec<IpNet>) {
        let node: Arc<str> = Arc::from(node);
        for cidr in &cidrs {
            let span = Span::of(cidr);
            match span.family {
                Family::V4 => self.v4.insert(&span, &node),
                Family::V6 => self.v6.insert(&span, &node),
            }
        }
        self.nodes.insert(node, HeldCidrs::new(cidrs));
    }

    /// Forgets `node`, returning what it held.
    pub fn remove(&mut self, node: &str) -> Option<Vec<IpNet>> {
        let cidrs = self.nodes.remove(node)?;
        for cidr in cidrs.as_slice() {
            let span = Span::of(cidr);
            match span.family {
                Family::V4 => self.v4.remove(&span, node),
                Family::V6 => self.v6.remove(&span, node),
            }
        }
        Some(match cidrs {
            HeldCidrs::One(one) => vec![one],
            HeldCidrs::Many(many) => many.into_vec(),
        })
    }

    /// Every holding sharing at least one address with `span`, visited in place: a pool-wide span at
    /// 50,000 Nodes would otherwise build a 50,000-entry list to count or scan once.
    pub fn overlapping<'a>(&'a self, span: &Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        match span.family {
            Family::V4 => EitherFamily::V4(self.v4.overlapping(*span)),
            Family::V6 => EitherFamily::V6(self.v6.overlapping(*span)),
        }
    }

    /// Every holding strictly containing `span`, without visiting those inside it.
    pub fn containing<'a>(&'a self, span: &Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        match span.family {
            Family::V4 => EitherFamily::V4(self.v4.containing(*span)),
            Family::V6 => EitherFamily::V6(self.v6.containing(*span)),
        }
    }

    /// A node holding exactly `cidr`, else one holding a CIDR overlapping it.
    pub fn holder_of(&self, cidr: &IpNet) -> Option<&str> {
        let span = Span::of(cidr);
        let exact = match span.family {
            Family::V4 => self.v4.exact(&span),
            Family::V6 => self.v6.exact(&span),
        };
        exact.or_else(|| self.overlapping(&span).next().map(|h| h.node))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn nodes_overlapping(l: &Ledger, cidr: &str) -> Vec<(String, String)> {
        let mut v: Vec<_> = l
            .overlapping(&Span::of(&net(cidr)))
            .map(|h| (h.node.to_string(), h.cidr.to_string()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_single_stack_node_holds_its_cidr_in_place_and_any_count_reads_back_in_order() {
        let mut l = Ledger::new();
        let held = [
            vec![],
            vec![net("10.0.1.0/24")],
            vec![net("10.0.2.0/24"), net("fd00::/64")],
            vec![net("10.0.3.0/24"), net("fd00:1::/64"), net("10.0.4.0/24")],
        ];
        for (i, cidrs) in held.iter().enumerate() {
            l.insert(&format!("n{i}"), cidrs.clone());
        }
        for (i, cidrs) in held.iter().enumerate() {
            assert_eq!(l.held_by(&format!("n{i}")), Some(cidrs.as_slice()));
        }
        assert_eq!(l.remove("n2"), Some(held[2].clone()));
        assert_eq!(l.remove("n1"), Some(held[1].clone()));
        assert_eq!(l.holder_of(&net("10.0.1.0/24")), None);
        assert!(matches!(l.nodes.get("n3"), Some(HeldCidrs::Many(_))));
        // One CIDR in place: the entry grows by 8 bytes and the 32-byte box is gone.
        assert_eq!(std::mem::size_of::<HeldCidrs>(), 24);
    }

    #[test]
    fn overlap_finds_equal_contained_and_containing_holdings() {
        let mut l = Ledger::new();
        l.insert("big", vec![net("10.0.0.0/16")]);
        l.insert("same", vec![net("10.0.1.0/24")]);
        l.insert("small", vec![net("10.0.1.128/25")]);
        l.insert("other", vec![net("10.0.2.0/24")]);
        l.insert("v6", vec![net("::a00:100/120")]);
        assert_eq!(
            nodes_overlapping(&l, "10.0.1.0/24"),
            vec![
                ("big".into(), "10.0.0.0/16".into()),
                ("same".into(), "10.0.1.0/24".into()),
                ("small".into(), "10.0.1.128/25".into()),
            ]
        );
        assert!(nodes_overlapping(&l, "10.1.0.0/16").is_empty());
    }

    #[test]
    fn holdings_just_outside_the_query_are_not_reported() {
        let mut l = Ledger::new();
        l.insert("before", vec![net("10.0.0.255/32")]);
        l.insert("after", vec![net("10.0.2.0/24")]);
        assert!(nodes_overlapping(&l, "10.0.1.0/24").is_empty());
    }

    #[test]
    fn removing_one_holder_keeps_the_other_holder_of_the_same_cidr() {
        let mut l = Ledger::new();
        l.insert("a", vec![net("10.0.1.0/24")]);
        l.insert("b", vec![net("10.0.1.0/24")]);
        assert_eq!(l.remove("a"), Some(vec![net("10.0.1.0/24")]));
        assert_eq!(l.holder_of(&net("10.0.1.0/24")), Some("b"));
        l.remove("b");
        assert_eq!(l.holder_of(&net("10.0.1.0/24")), None);
        assert!(nodes_overlapping(&l, "0.0.0.0/0").is_empty());
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn the_owner_name_is_one_shared_string_while_it_holds_cidrs() {
        let mut l = Ledger::new();
        assert!(l.owner("a").is_none());
        l.insert("a", vec![net("10.0.1.0/24")]);
        let (one, two) = (l.owner("a").unwrap(), l.owner("a").unwrap());
        assert!(Arc::ptr_eq(&one, &two));
        assert_eq!(one.as_ref(), "a");
        l.remove("a");
        assert!(l.owner("a").is_none());
    }

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

    #[test]
    fn ipv6_overlap_finds_containing_and_contained_holdings_up_to_the_last_address() {
        let mut l = Ledger::new();
        l.insert("all", vec![net("::/0")]);
        l.insert("node", vec![net("fd00::/64")]);
        l.insert("inside", vec![net("fd00::80/121")]);
        l.insert(
            "last",
            vec![net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")],
        );
        l.insert("v4", vec![net("0.0.0.0/0")]);
        assert_eq!(
            nodes_overlapping(&l, "fd00::/64"),
            vec![
                ("all".into(), "::/0".into()),
                ("inside".into(), "fd00::80/121".into()),
                ("node".into(), "fd00::/64".into()),
            ]
        );
        assert_eq!(
            nodes_overlapping(&l, "ffff:ffff:ffff:ffff::/64"),
            vec![
                ("all".into(), "::/0".into()),
                (
                    "last".into(),
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128".into()
                ),
            ]
        );
        assert_eq!(l.holder_of(&net("fd00::/64")), Some("node"));
        l.remove("all");
        assert_eq!(l.holder_of(&net("fd01::/64")), None);
        assert_eq!(nodes_overlapping(&l, "255.255.255.255/32").len(), 1);
    }

    #[test]
    fn holder_of_prefers_the_exact_cidr() {
        let mut l = Ledger::new();
        l.insert("big", vec![net("10.0.0.0/8")]);
        l.insert("exact", vec![net("10.0.1.0/24")]);
        assert_eq!(l.holder_of(&net("10.0.1.0/24")), Some("exact"));
        assert_eq!(l.holder_of(&net("10.0.2.0/24")), Some("big"));
    }
}

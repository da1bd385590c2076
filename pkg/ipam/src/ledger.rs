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

use crate::addr::{host_mask, net_from, Span};

/// A CIDR held by a node, as found by [`Ledger::overlapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding<'a> {
    /// The held CIDR.
    pub cidr: IpNet,
    /// The node holding it.
    pub node: &'a str,
}

/// The nodes holding one CIDR: almost always exactly one, so no `Vec` is allocated for it.
#[derive(Debug)]
enum Holders {
    One(Arc<str>),
    /// More than one only after a conflict written by others.
    Many(Vec<Arc<str>>),
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
            Holders::One(one) => *self = Holders::Many(vec![one.clone(), node]),
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

/// Holdings of one family keyed by `(first address, prefix)`.
#[derive(Debug)]
struct FamilyIndex {
    /// Nodes holding exactly that CIDR.
    entries: BTreeMap<(u128, u8), Holders>,
    /// How many entries use each prefix length, to skip absent ones.
    prefix_counts: Vec<u32>,
}

impl FamilyIndex {
    fn new() -> FamilyIndex {
        FamilyIndex {
            entries: BTreeMap::new(),
            prefix_counts: vec![0; 129],
        }
    }
}

/// Node → held CIDRs, plus the per-family overlap index. A node's name is stored once and shared by
/// both (at 50,000 Nodes every byte per holding counts).
#[derive(Debug)]
pub(crate) struct Ledger {
    nodes: HashMap<Arc<str>, Box<[IpNet]>>,
    index: [FamilyIndex; 2],
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger {
            nodes: HashMap::new(),
            index: [FamilyIndex::new(), FamilyIndex::new()],
        }
    }

    /// The CIDRs recorded for `node`.
    pub fn held_by(&self, node: &str) -> Option<&[IpNet]> {
        self.nodes.get(node).map(AsRef::as_ref)
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
        self.nodes.iter().map(|(n, c)| (n.as_ref(), c.as_ref()))
    }

    /// Records that `node` holds `cidrs` (normalized), replacing nothing:
    /// callers remove a previous record first.
    pub fn insert(&mut self, node: &str, cidrs: Vec<IpNet>) {
        let node: Arc<str> = Arc::from(node);
        for cidr in &cidrs {
            let span = Span::of(cidr);
            let idx = &mut self.index[span.family.index()];
            match idx.entries.entry((span.first, span.prefix)) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(Holders::One(node.clone()));
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    o.get_mut().push(node.clone())
                }
            }
            idx.prefix_counts[usize::from(span.prefix)] += 1;
        }
        self.nodes.insert(node, cidrs.into_boxed_slice());
    }

    /// Forgets `node`, returning what it held.
    pub fn remove(&mut self, node: &str) -> Option<Vec<IpNet>> {
        let cidrs = self.nodes.remove(node)?;
        for cidr in cidrs.iter() {
            let span = Span::of(cidr);
            let idx = &mut self.index[span.family.index()];
            let key = (span.first, span.prefix);
            if let Some(holders) = idx.entries.get_mut(&key) {
                let (was_there, others_left) = holders.remove(node);
                if was_there {
                    idx.prefix_counts[usize::from(span.prefix)] -= 1;
                }
                if !others_left {
                    idx.entries.remove(&key);
                }
            }
        }
        Some(cidrs.into_vec())
    }

    /// Every holding sharing at least one address with `span`, visited in place: a pool-wide span at
    /// 50,000 Nodes would otherwise build a 50,000-entry list to count or scan once.
    pub fn overlapping<'a>(&'a self, span: &Span) -> impl Iterator<Item = Holding<'a>> + 'a {
        let span = *span;
        let family = span.family;
        let idx = &self.index[family.index()];
        // Holdings strictly containing the span.
        let containing = (0..span.prefix)
            .filter(move |&prefix| idx.prefix_counts[usize::from(prefix)] != 0)
            .filter_map(move |prefix| {
                let first = span.first & !host_mask(u32::from(family.bits() - prefix));
                let holders = idx.entries.get(&(first, prefix))?;
                let cidr = net_from(family, first, prefix);
                Some(
                    holders
                        .as_slice()
                        .iter()
                        .map(move |n| Holding { cidr, node: n }),
                )
            })
            .flatten();
        // Holdings equal to or inside the span.
        let inside = idx
            .entries
            .range((span.first, span.prefix)..=(span.last, u8::MAX))
            .flat_map(move |(&(first, prefix), holders)| {
                let cidr = net_from(family, first, prefix);
                holders
                    .as_slice()
                    .iter()
                    .map(move |n| Holding { cidr, node: n })
            });
        containing.chain(inside)
    }

    /// A node holding exactly `cidr`, else one holding a CIDR overlapping it.
    pub fn holder_of(&self, cidr: &IpNet) -> Option<&str> {
        let span = Span::of(cidr);
        let idx = &self.index[span.family.index()];
        if let Some(first) = idx
            .entries
            .get(&(span.first, span.prefix))
            .and_then(|h| h.as_slice().first())
        {
            return Some(first);
        }
        self.overlapping(&span).next().map(|h| h.node)
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
    fn holder_of_prefers_the_exact_cidr() {
        let mut l = Ledger::new();
        l.insert("big", vec![net("10.0.0.0/8")]);
        l.insert("exact", vec![net("10.0.1.0/24")]);
        assert_eq!(l.holder_of(&net("10.0.1.0/24")), Some("exact"));
        assert_eq!(l.holder_of(&net("10.0.2.0/24")), Some("big"));
    }
}

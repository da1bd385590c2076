//! [`Ledger`]: which node holds which CIDRs, with an interval index per
//! family to find every holding that overlaps a CIDR in `O(log n)`.
//!
//! CIDRs either nest or are disjoint, so the holdings overlapping a query
//! are those starting inside it (found with one ordered range scan) plus
//! those strictly containing it, whose start is the query's start truncated
//! to their prefix: one exact lookup per prefix length in use.

use std::collections::HashMap;
use std::sync::Arc;

use ipnet::IpNet;

use crate::addr::{Family, Span};

mod index;
use index::{EitherFamily, FamilyIndex, V6Key};

/// A CIDR held by a node, as found by [`Ledger::overlapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding<'a> {
    /// The held CIDR.
    pub cidr: IpNet,
    /// The node holding it.
    pub node: &'a str,
}

/// The CIDRs one node holds: one for a single-stack node, kept in place (a box of one CIDR cost 32 bytes
/// of heap per node at 50,000 Nodes); a dual-stack node's two, or more, boxed.
#[derive(Debug)]
enum HeldCidrs {
    One(IpNet),
    Many(Box<[IpNet]>),
}

impl HeldCidrs {
    fn new(cidrs: Vec<IpNet>) -> HeldCidrs {
        match <[IpNet; 1]>::try_from(cidrs) {
            Ok([one]) => HeldCidrs::One(one),
            Err(cidrs) => HeldCidrs::Many(cidrs.into_boxed_slice()),
        }
    }

    fn into_vec(self) -> Vec<IpNet> {
        match self {
            HeldCidrs::One(one) => vec![one],
            HeldCidrs::Many(many) => many.into_vec(),
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
        netcm_table::make_room_for_one(&mut self.nodes);
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
        Some(cidrs.into_vec())
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

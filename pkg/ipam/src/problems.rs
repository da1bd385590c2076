//! What is wrong with what one owner holds, at a cost bounded by its own CIDRs: for callers that ask on
//! every sync of a Node ([`crate::Pools::has_problems`], [`crate::Pools::problems`]), where
//! [`crate::Pools::record_and_check`]'s list of every conflict would cost a Node whose CIDR covers the cluster CIDR
//! one entry per other Node.
//!
//! A CIDR wider than the node CIDRs of a pool it overlaps is *oversized*: the ledger keeps all of it
//! reserved, as it keeps every CIDR a Node holds, so the pool hands out no address inside it. The
//! Nodes whose CIDRs lie inside an oversized CIDR are not to blame for that overlap: the holder of the
//! oversized CIDR is.

use std::fmt;

use ipnet::IpNet;

/// How much [`crate::Pools::problems`] may look at and report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Overlapping owners named, per kind.
    pub named: usize,
    /// Overlapping holdings visited per CIDR of the owner: past it, counts are "at least".
    pub visited: usize,
}

/// A CIDR wider than the node CIDRs of a pool it overlaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// The CIDR.
    pub cidr: IpNet,
    /// The pool with the widest node CIDRs among those it overlaps (the first such).
    pub pool: String,
    /// That pool's node CIDR prefix length (its largest, where it hands out several).
    pub node_mask: u8,
    /// How many of that pool's (largest) node CIDRs it covers (none of which is handed out while it is held).
    pub covers: u64,
}

impl fmt::Display for Oversized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Oversized {
            cidr,
            pool,
            node_mask,
            covers,
        } = self;
        write!(
            f,
            "pod CIDR {cidr} is wider than the /{node_mask} node CIDRs of pool {pool} and covers {covers} of them"
        )
    }
}

/// One CIDR of the owner overlapping another owner's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The owner's CIDR.
    pub cidr: IpNet,
    /// The other owner.
    pub other: String,
    /// The other owner's CIDR.
    pub other_cidr: IpNet,
}

/// Other owners overlapping the owner's CIDRs, counted and the first few named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlaps {
    /// Distinct other owners found.
    pub count: usize,
    /// Whether the search stopped at [`Limits::visited`], so there may be more.
    pub more: bool,
    /// The first [`Limits::named`] of them, each once.
    pub named: Vec<Overlap>,
}

impl Overlaps {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// What is wrong with what one owner holds; see [`crate::Pools::problems`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems {
    /// Its CIDRs wider than the node CIDRs of a pool they overlap.
    pub oversized: Vec<Oversized>,
    /// Its CIDRs not inside any cluster CIDR.
    pub out_of_range: Vec<IpNet>,
    /// Its CIDRs overlapping a service range, with the range.
    pub service_overlaps: Vec<(IpNet, IpNet)>,
    /// Owners whose CIDRs lie inside one of its oversized CIDRs: they are not to blame.
    pub inside_oversized: Overlaps,
    /// Owners sharing the blame for an overlap: the same CIDR, or nested CIDRs neither of them
    /// oversized.
    pub conflicts: Overlaps,
    /// Owners of oversized CIDRs that contain one of its CIDRs: they are to blame, not it.
    pub covered_by: Overlaps,
}

impl Problems {
    /// Whether the owner's own data is bad: oversized, out of range, overlapping a service range, or in
    /// a conflict it shares the blame for. Lying inside another's oversized CIDR is not.
    pub fn is_bad(&self) -> bool {
        !self.oversized.is_empty()
            || !self.out_of_range.is_empty()
            || !self.service_overlaps.is_empty()
            || !self.conflicts.is_empty()
    }
}

/// Counts distinct owners into an [`Overlaps`], naming the first few.
#[derive(Debug)]
pub(crate) struct Tally<'a> {
    pub(crate) out: Overlaps,
    seen: std::collections::HashSet<&'a str>,
}

impl<'a> Tally<'a> {
    pub(crate) fn new() -> Tally<'a> {
        Tally {
            out: Overlaps::default(),
            seen: std::collections::HashSet::new(),
        }
    }

    pub(crate) fn add(&mut self, named: usize, cidr: IpNet, other: &'a str, other_cidr: IpNet) {
        if !self.seen.insert(other) {
            return;
        }
        self.out.count += 1;
        if self.out.named.len() < named {
            self.out.named.push(Overlap {
                cidr,
                other: other.to_string(),
                other_cidr,
            });
        }
    }
}

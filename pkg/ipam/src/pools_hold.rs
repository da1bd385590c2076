//! What Nodes hold: [`Pools::hold`] records the CIDRs a Node carries and reports what is wrong with
//! them.

use ipnet::IpNet;

use super::{mark, Pools};
use crate::addr::Span;
use crate::outcome::{HoldChange, HoldFinding, HoldOutcome};

impl Pools {
    /// Records that `node` holds `cidrs` (as read from the API) and reports
    /// conflicts, CIDRs outside every cluster CIDR and service-range overlaps.
    ///
    /// Holding the same CIDRs again changes nothing; different CIDRs replace
    /// the old ones; an empty list forgets the node. Conflicting CIDRs are
    /// still recorded, so nothing overlapping any of them is handed out.
    ///
    /// Every conflict is listed: a CIDR covering the cluster CIDR lists every other holder. The
    /// allocator, which records on every sync, uses [`Pools::record`] and bounded reports instead.
    pub fn hold(&mut self, node: &str, cidrs: &[IpNet]) -> HoldOutcome {
        let change = self.record(node, cidrs);
        HoldOutcome {
            change,
            findings: self.findings_of(node),
        }
    }

    /// Records that `node` holds `cidrs`, as [`Pools::hold`] does, without looking for problems.
    pub fn record(&mut self, node: &str, cidrs: &[IpNet]) -> HoldChange {
        let wanted = first_occurrences(cidrs.iter().map(IpNet::trunc));
        let change = match self.ledger.held_by(node) {
            Some(held) if held == wanted.as_slice() => HoldChange::Unchanged,
            None if wanted.is_empty() => HoldChange::Unchanged,
            Some(_) => {
                let previous = self.release_node(node);
                HoldChange::Replaced { previous }
            }
            None => HoldChange::New,
        };
        if change != HoldChange::Unchanged && !wanted.is_empty() {
            for c in &wanted {
                mark(&mut self.sets, &Span::of(c));
            }
            self.ledger.insert(node, wanted);
        }
        change
    }

    /// Every problem with what `node` holds, as [`Pools::hold`] reports it.
    pub fn findings_of(&self, node: &str) -> Vec<HoldFinding> {
        self.ledger
            .held_by(node)
            .unwrap_or_default()
            .iter()
            .flat_map(|c| self.findings(node, c))
            .collect()
    }

    /// Problems with `cidr` as held by `node`.
    fn findings(&self, node: &str, cidr: &IpNet) -> Vec<HoldFinding> {
        let span = Span::of(cidr);
        let mut out: Vec<HoldFinding> = self
            .ledger
            .overlapping(&span)
            .filter(|h| h.node != node)
            .map(|h| HoldFinding::Conflict {
                cidr: *cidr,
                other_node: h.node.to_string(),
                other_cidr: h.cidr,
            })
            .collect();
        if !self.sets.iter().any(|s| s.span().contains(&span)) {
            out.push(HoldFinding::OutOfRange { cidr: *cidr });
        }
        out.extend(
            self.services
                .iter()
                .filter(|svc| Span::of(svc).overlaps(&span))
                .map(|&service_range| HoldFinding::ServiceRangeOverlap {
                    cidr: *cidr,
                    service_range,
                }),
        );
        out
    }
}

/// `items` without repeats, each where it first appears. A set beside the list above a few items: a
/// search of the list per item is quadratic, and a quarantine of 50,000 ranges (an earlier version's
/// per-CIDR claims) took 1.2 s that way with the pools and blocks locks held.
pub(crate) fn first_occurrences<T: Copy + Eq + std::hash::Hash>(
    items: impl IntoIterator<Item = T>,
) -> Vec<T> {
    /// Up to this many items a search of the list is cheaper than hashing (a Node has one or two).
    const SEARCH_UP_TO: usize = 8;
    let items = items.into_iter();
    let mut out: Vec<T> = Vec::with_capacity(items.size_hint().0);
    let mut seen: std::collections::HashSet<T> = std::collections::HashSet::new();
    for c in items {
        if out.len() < SEARCH_UP_TO {
            if !out.contains(&c) {
                out.push(c);
            }
            continue;
        }
        if seen.is_empty() {
            seen.extend(out.iter().copied());
        }
        if seen.insert(c) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pools_hold_tests.rs"]
mod tests;

//! What Nodes hold: [`Pools::record_and_check`] records the CIDRs a Node carries and reports what is wrong with
//! them.

use ipnet::IpNet;

use super::{mark, Pools};
use crate::addr::Span;
use crate::outcome::{CidrFinding, RecordChange, RecordOutcome};
use crate::problems::{Limits, Oversized, Problems, Tally};

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
    pub fn record_and_check(&mut self, node: &str, cidrs: &[IpNet]) -> RecordOutcome {
        let change = self.record(node, cidrs);
        RecordOutcome {
            change,
            findings: self.findings_of(node),
        }
    }

    /// Records that `node` holds `cidrs`, as [`Pools::record_and_check`] does, without looking for problems.
    pub fn record(&mut self, node: &str, cidrs: &[IpNet]) -> RecordChange {
        let wanted = first_occurrences(cidrs.iter().map(IpNet::trunc));
        let change = match self.ledger.held_by(node) {
            Some(held) if held == wanted.as_slice() => RecordChange::Unchanged,
            None if wanted.is_empty() => RecordChange::Unchanged,
            Some(_) => {
                let previous = self.release_node(node);
                RecordChange::Replaced { previous }
            }
            None => RecordChange::New,
        };
        if change != RecordChange::Unchanged && !wanted.is_empty() {
            for c in &wanted {
                mark(&mut self.sets, &Span::of(c));
            }
            self.ledger.insert(node, wanted);
            self.credit_by_fit(node);
        }
        change
    }

    /// [`Pools::record`] for a Node as the API shows it: what it holds there wins over a release hold,
    /// which ends instead of making a conflict. (Reservations such as the quarantine use `record`: they
    /// may cover held CIDRs.)
    pub fn record_node(&mut self, node: &str, cidrs: &[IpNet]) -> RecordChange {
        self.end_release_holds_overlapping(cidrs);
        self.record(node, cidrs)
    }

    /// Every problem with what `node` holds, as [`Pools::record_and_check`] reports it.
    pub fn findings_of(&self, node: &str) -> Vec<CidrFinding> {
        self.ledger
            .held_by(node)
            .unwrap_or_default()
            .iter()
            .flat_map(|c| self.findings(node, c))
            .collect()
    }

    /// Whether what `owner` holds is bad data ([`Problems::is_bad`]), others that `ignore` selects
    /// not counting: cheap enough for every sync, since it stops at the first problem and looks at
    /// other owners only for a CIDR inside a pool and no wider than its node CIDRs (one inside a pool
    /// can hold only smaller ones; a wider one, or one outside every pool, is bad already).
    pub fn has_problems(&self, owner: &str, ignore: impl Fn(&str) -> bool) -> bool {
        let Some(held) = self.ledger.held_by(owner) else {
            return false;
        };
        held.iter().any(|c| {
            let span = Span::of(c);
            self.oversized(c).is_some()
                || !self.sets.iter().any(|s| s.span().contains(&span))
                || self
                    .services
                    .iter()
                    .any(|svc| Span::of(svc).overlaps(&span))
                || self
                    .ledger
                    .overlapping(&span)
                    .filter(|h| h.node != owner && !ignore(h.node))
                    .any(|h| !self.covers(h.cidr, *c))
        })
    }

    /// What is wrong with what `owner` holds, others that `ignore` selects not counting, within
    /// `limits`: each overlapping owner is counted once and the first few named, and at most
    /// [`Limits::visited`] holdings are visited per CIDR of `owner`, so the cost is bounded by its own
    /// CIDRs, not by how many Nodes an oversized one covers.
    pub fn problems(&self, owner: &str, limits: Limits, ignore: impl Fn(&str) -> bool) -> Problems {
        let mut out = Problems::default();
        let (mut inside, mut conflicts, mut covered) = (Tally::new(), Tally::new(), Tally::new());
        for c in self.ledger.held_by(owner).unwrap_or_default() {
            let span = Span::of(c);
            let oversized = self.oversized(c);
            if !self.sets.iter().any(|s| s.span().contains(&span)) {
                out.out_of_range.push(*c);
            }
            out.service_overlaps.extend(
                self.services
                    .iter()
                    .filter(|svc| Span::of(svc).overlaps(&span))
                    .map(|svc| (*c, *svc)),
            );
            let mut holdings = self.ledger.overlapping(&span);
            for h in holdings.by_ref().take(limits.visited) {
                if h.node == owner || ignore(h.node) {
                    continue;
                }
                let tally = if oversized.is_some() && h.cidr != *c && c.contains(&h.cidr) {
                    &mut inside
                } else if self.covers(h.cidr, *c) {
                    &mut covered
                } else {
                    &mut conflicts
                };
                tally.add(limits.named, *c, h.node, h.cidr);
            }
            if holdings.next().is_some() {
                for t in [&mut inside, &mut conflicts, &mut covered] {
                    t.out.more = true;
                }
            }
            out.oversized.extend(oversized);
        }
        out.inside_oversized = inside.out;
        out.conflicts = conflicts.out;
        out.covered_by = covered.out;
        out
    }

    /// Whether `wide` is oversized and strictly contains `cidr`.
    fn covers(&self, wide: IpNet, cidr: IpNet) -> bool {
        wide != cidr && wide.contains(&cidr) && self.oversized(&wide).is_some()
    }

    /// `cidr` as an [`Oversized`] CIDR, if it is wider than the widest node CIDRs of the pools it
    /// overlaps (pools sharing a range may hand out different sizes: wider than the widest is wrong for
    /// all of them). A scan of the sets.
    pub fn oversized(&self, cidr: &IpNet) -> Option<Oversized> {
        let span = Span::of(cidr);
        let (k, set) = self
            .sets
            .iter()
            .enumerate()
            .filter(|(_, s)| s.span().overlaps(&span))
            .min_by_key(|(k, s)| (s.largest(), *k))?;
        if span.prefix >= set.largest() {
            return None;
        }
        let part = set.span().intersect(&span)?;
        let covers = 1u64
            .checked_shl(u32::from(set.largest().saturating_sub(part.prefix)))
            .unwrap_or(u64::MAX);
        let pool = self
            .set_owner
            .get(k)
            .and_then(|&p| self.pools.get(p))
            .map(|p| p.name.clone())
            .unwrap_or_default();
        Some(Oversized {
            cidr: *cidr,
            pool,
            node_mask: set.largest(),
            covers,
        })
    }

    /// Problems with `cidr` as held by `node`.
    fn findings(&self, node: &str, cidr: &IpNet) -> Vec<CidrFinding> {
        let span = Span::of(cidr);
        let mut out: Vec<CidrFinding> = self
            .ledger
            .overlapping(&span)
            .filter(|h| h.node != node)
            .map(|h| CidrFinding::Conflict {
                cidr: *cidr,
                other_node: h.node.to_string(),
                other_cidr: h.cidr,
            })
            .collect();
        if !self.sets.iter().any(|s| s.span().contains(&span)) {
            out.push(CidrFinding::OutOfRange { cidr: *cidr });
        }
        out.extend(
            self.services
                .iter()
                .filter(|svc| Span::of(svc).overlaps(&span))
                .map(|&service_range| CidrFinding::ServiceRangeOverlap {
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
mod tests;

//! [`Pools`]: allocator state over every cluster CIDR, with an ownership
//! ledger so that a CIDR is never given to two nodes.
//!
//! Invariant: a node block of a [`CidrSet`] is marked in use exactly when it
//! overlaps a service range or a CIDR some node holds. Releasing a CIDR
//! therefore clears its blocks and then re-marks whatever other holdings and
//! service ranges still touch them, so one node letting go never frees
//! addresses another node (even a conflicting one) still holds.

use std::ops::Range;

use ipnet::IpNet;

use crate::addr::{Family, Span};
use crate::cidr_set::CidrSet;
use crate::config::AllocatorConfig;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::outcome::{HoldChange, HoldFinding, HoldOutcome, NodeAllocation, PoolStats, PoolTries};

/// Every cluster CIDR's [`CidrSet`] plus who holds what.
#[derive(Debug)]
pub struct Pools {
    /// All sets, grouped by family (primary first), config order within a family.
    sets: Vec<CidrSet>,
    /// Each family and the range of `sets` it owns, primary first.
    families: Vec<(Family, Range<usize>)>,
    services: Vec<IpNet>,
    ledger: Ledger,
}

impl Pools {
    /// Builds one [`CidrSet`] per cluster CIDR and marks the service ranges
    /// in use wherever they overlap a cluster CIDR.
    pub fn new(config: &AllocatorConfig) -> Result<Pools, Error> {
        let mut sets = Vec::new();
        let mut families = Vec::new();
        for fam in &config.families {
            let start = sets.len();
            for &cluster in &fam.cluster_cidrs {
                sets.push(CidrSet::new(cluster, fam.node_mask)?);
            }
            families.push((fam.family, start..sets.len()));
        }
        let services: Vec<IpNet> = config.service_ranges.iter().map(IpNet::trunc).collect();
        for svc in &services {
            mark(&mut sets, &Span::of(svc));
        }
        Ok(Pools {
            sets,
            families,
            services,
            ledger: Ledger::new(),
        })
    }

    /// Records that `node` holds `cidrs` (as read from the API) and reports
    /// conflicts, CIDRs outside every cluster CIDR and service-range overlaps.
    ///
    /// Holding the same CIDRs again changes nothing; different CIDRs replace
    /// the old ones; an empty list forgets the node. Conflicting CIDRs are
    /// still recorded, so nothing overlapping any of them is handed out.
    pub fn hold(&mut self, node: &str, cidrs: &[IpNet]) -> HoldOutcome {
        let mut wanted: Vec<IpNet> = Vec::with_capacity(cidrs.len());
        for c in cidrs.iter().map(IpNet::trunc) {
            if !wanted.contains(&c) {
                wanted.push(c);
            }
        }
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
            self.ledger.insert(node, wanted.clone());
        }
        let findings = wanted.iter().flat_map(|c| self.findings(node, c)).collect();
        HoldOutcome { change, findings }
    }

    /// Problems with `cidr` as held by `node`.
    fn findings(&self, node: &str, cidr: &IpNet) -> Vec<HoldFinding> {
        let span = Span::of(cidr);
        let mut out: Vec<HoldFinding> = self
            .ledger
            .overlapping(&span)
            .into_iter()
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

    /// Allocates one node CIDR per family, primary first, each from the
    /// first cluster CIDR of that family with room; see [`Pools::allocate_detailed`].
    pub fn allocate(&mut self, node: &str) -> Result<Vec<IpNet>, Error> {
        self.allocate_detailed(node).map(|a| a.cidrs)
    }

    /// Like [`Pools::allocate`], also reporting which cluster CIDR each
    /// fresh CIDR came from and how many candidates were skipped.
    ///
    /// If `node` already holds CIDRs (allocated earlier but not yet seen on
    /// the API, or recorded by [`Pools::hold`]) those are returned unchanged.
    /// If a family is exhausted, CIDRs taken for earlier families are
    /// released and [`Error::Full`] names the family and its cluster CIDRs.
    pub fn allocate_detailed(&mut self, node: &str) -> Result<NodeAllocation, Error> {
        if let Some(held) = self.ledger.held_by(node) {
            return Ok(NodeAllocation {
                cidrs: held.to_vec(),
                fresh: Vec::new(),
            });
        }
        let mut fresh: Vec<PoolTries> = Vec::with_capacity(self.families.len());
        for (family, range) in self.families.clone() {
            let got = self.sets[range.clone()].iter_mut().find_map(|set| {
                let cluster = set.cluster();
                set.allocate_next().ok().map(|a| PoolTries {
                    cluster,
                    cidr: a.cidr,
                    tries: a.tries,
                })
            });
            match got {
                Some(t) => {
                    // Keeps overlapping sets (if a hand-built config has any) in step.
                    mark(&mut self.sets, &Span::of(&t.cidr));
                    fresh.push(t);
                }
                None => {
                    for t in &fresh {
                        unmark(
                            &mut self.sets,
                            &self.ledger,
                            &self.services,
                            &Span::of(&t.cidr),
                        );
                    }
                    return Err(Error::Full {
                        family,
                        clusters: self.sets[range].iter().map(CidrSet::cluster).collect(),
                    });
                }
            }
        }
        let cidrs: Vec<IpNet> = fresh.iter().map(|t| t.cidr).collect();
        self.ledger.insert(node, cidrs.clone());
        Ok(NodeAllocation { cidrs, fresh })
    }

    /// Whether `cidrs` is exactly what [`Pools::allocate`] could give `owner` under today's configuration:
    /// one node-sized CIDR per family in family order, each inside a cluster CIDR of that family and
    /// overlapping neither a service range nor anything held by another owner. Used before adopting a
    /// CIDR another leader claimed, so a Node only ever receives CIDRs valid for the current flags.
    pub fn is_valid_allocation(&self, owner: &str, cidrs: &[IpNet]) -> bool {
        if cidrs.len() != self.families.len() {
            return false;
        }
        self.families
            .iter()
            .zip(cidrs)
            .all(|((family, range), cidr)| {
                let cidr = cidr.trunc();
                Family::of(&cidr) == *family
                    && self.sets[range.clone()]
                        .iter()
                        .any(|s| s.contains(cidr) && s.node_mask() == cidr.prefix_len())
                    && !self
                        .services
                        .iter()
                        .any(|svc| Span::of(svc).overlaps(&Span::of(&cidr)))
                    && self
                        .ledger
                        .overlapping(&Span::of(&cidr))
                        .iter()
                        .all(|h| h.node == owner)
            })
    }

    /// Forgets `node`, returning what it held; blocks another node or a
    /// service range still covers stay in use.
    pub fn release_node(&mut self, node: &str) -> Vec<IpNet> {
        let Some(held) = self.ledger.remove(node) else {
            return Vec::new();
        };
        for c in &held {
            unmark(&mut self.sets, &self.ledger, &self.services, &Span::of(c));
        }
        held
    }

    /// The node holding exactly `cidr`, else some node holding a CIDR overlapping it.
    pub fn holder_of(&self, cidr: IpNet) -> Option<&str> {
        self.ledger.holder_of(&cidr.trunc())
    }

    /// The CIDRs recorded for `node` (normalized, in the order given).
    pub fn held_by(&self, node: &str) -> Option<&[IpNet]> {
        self.ledger.held_by(node)
    }

    /// Number of nodes holding CIDRs.
    pub fn node_count(&self) -> usize {
        self.ledger.len()
    }

    /// Every node and what it holds, in no particular order.
    pub fn holdings(&self) -> impl Iterator<Item = (&str, &[IpNet])> {
        self.ledger.iter()
    }

    /// The service ranges kept out of every pool.
    pub fn service_ranges(&self) -> &[IpNet] {
        &self.services
    }

    /// The cluster CIDR sets, primary family first.
    pub fn sets(&self) -> &[CidrSet] {
        &self.sets
    }

    /// Usage of every cluster CIDR, primary family first.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.sets
            .iter()
            .map(|s| PoolStats {
                cluster_cidr: s.cluster().to_string(),
                family: s.family(),
                allocated: s.allocated(),
                max: s.max_cidrs(),
                usage: s.usage(),
            })
            .collect()
    }
}

/// Marks the blocks overlapping `span` in use in every set it touches.
fn mark(sets: &mut [CidrSet], span: &Span) {
    for set in sets.iter_mut() {
        if let Some(part) = set.span().intersect(span) {
            // Cannot fail: `part` lies inside the set.
            let _ = set.occupy(part.to_net());
        }
    }
}

/// Clears the blocks overlapping `span`, then re-marks those still covered
/// by a holding in `ledger` or by a service range.
fn unmark(sets: &mut [CidrSet], ledger: &Ledger, services: &[IpNet], span: &Span) {
    for set in sets.iter_mut() {
        let Some(part) = set.span().intersect(span) else {
            continue;
        };
        let region = part.widen_to(set.node_mask());
        let _ = set.release(region.to_net());
        let held = ledger.overlapping(&region).into_iter().map(|h| h.cidr);
        for other in held.chain(services.iter().copied()) {
            if let Some(keep) = region.intersect(&Span::of(&other)) {
                let _ = set.occupy(keep.to_net());
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pools_tests.rs"]
mod tests;

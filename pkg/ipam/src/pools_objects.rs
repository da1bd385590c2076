//! ClusterCIDR pools at runtime: added, refused, drained and dropped as the objects come and go.
//!
//! Safety does not depend on any of this: every pool's sets are marked from the one ledger, so a CIDR
//! any owner holds is in use in every set it touches, whichever pool it came from. The refusal rules
//! are about intent: two pools share a range only when it is the same range (node-ipam-controller's
//! idiom for a different mask per node group); a partial overlap is almost always a typo.

use std::collections::HashSet;

use ipnet::IpNet;

use super::{Pool, Pools};
use crate::addr::{Family, Span};
use crate::cidr_set::CidrSet;
use crate::pool::{ObjectPool, PoolRange, PoolReport, PoolSpec, PoolState, Refusal, SyncReport};

impl Pools {
    /// Brings the ClusterCIDR pools in line with `objects` (every object, oldest first): new ones are
    /// checked and added, deleted ones drain, refused ones are checked again, absent ones are dropped.
    /// A pool once active stays active until its object is deleted.
    pub fn sync_objects(&mut self, objects: &[ObjectPool]) -> SyncReport {
        let mut report = SyncReport::default();
        let present: HashSet<(&str, &str)> = objects
            .iter()
            .map(|o| (o.name.as_str(), o.uid.as_str()))
            .collect();
        let gone: Vec<String> = self
            .pools
            .iter()
            .filter(|p| p.is_object && !present.contains(&(p.name.as_str(), p.uid.as_str())))
            .map(|p| p.name.clone())
            .collect();
        for name in gone {
            self.remove_pool(&name);
            report.removed.push(name);
        }
        for obj in objects {
            let known = self
                .pools
                .iter()
                .position(|p| p.is_object && p.name == obj.name);
            match known {
                Some(i) => match (&self.pools[i].state, obj.deleting) {
                    (PoolState::Active, true) => self.pools[i].state = PoolState::Draining,
                    (PoolState::Refused(_), false) => {
                        self.remove_pool(&obj.name);
                        if self.add(obj) {
                            report.activated.push(obj.name.clone());
                        }
                    }
                    _ => {}
                },
                None => {
                    if self.add(obj) {
                        report.activated.push(obj.name.clone());
                    }
                }
            }
        }
        report
    }

    /// Adds `obj` as a pool: active if it passes [`Pools::check`], draining if it is being deleted (a
    /// new leader must still see which Nodes hold CIDRs from it), else refused. True if active.
    fn add(&mut self, obj: &ObjectPool) -> bool {
        let spec = obj.spec.clone().map_err(Refusal::Invalid);
        let checked = spec.as_ref().map_err(Clone::clone).and_then(|s| {
            if obj.modified {
                return Err(Refusal::Modified);
            }
            s.ranges()
        });
        let selector = spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or(crate::selector::NodeSelector::Terms(Vec::new()));
        let asked = spec.as_ref().map(asked_ranges).unwrap_or_default();
        let ranges = match checked {
            Ok(r) if obj.deleting => Ok(r),
            Ok(r) => self.check(&r).map(|()| r),
            Err(e) => Err(e),
        };
        match ranges {
            Ok(ranges) => {
                let state = if obj.deleting {
                    PoolState::Draining
                } else {
                    PoolState::Active
                };
                let active = state == PoolState::Active;
                self.install(obj, selector, &ranges, state);
                active
            }
            Err(refusal) => {
                self.pools.push(Pool {
                    name: obj.name.clone(),
                    selector,
                    families: Vec::new(),
                    state: PoolState::Refused(refusal),
                    is_object: true,
                    asked,
                    uid: obj.uid.clone(),
                });
                false
            }
        }
    }

    /// Why a pool with these ranges may not allocate: a partial overlap with another pool's range, a
    /// service range, or a Node CIDR that covers more than the range outside every pool.
    fn check(&self, ranges: &[PoolRange]) -> Result<(), Refusal> {
        for r in ranges {
            let span = Span::of(&r.cidr);
            for p in self.pools.iter().filter(|p| !p.families.is_empty()) {
                for (_, sets) in &p.families {
                    let clash = self.sets[sets.clone()]
                        .iter()
                        .find(|s| s.span().overlaps(&span) && s.cluster() != r.cidr);
                    if let Some(s) = clash {
                        return Err(Refusal::PoolOverlap {
                            range: r.cidr,
                            pool: p.name.clone(),
                            other: s.cluster(),
                        });
                    }
                }
            }
            if let Some(svc) = self.services.iter().find(|s| Span::of(s).overlaps(&span)) {
                return Err(Refusal::ServiceRangeOverlap {
                    range: r.cidr,
                    service_range: *svc,
                });
            }
            let covering = self.ledger.overlapping(&span).find(|h| {
                !span.contains(&Span::of(&h.cidr))
                    && !self
                        .sets
                        .iter()
                        .any(|s| s.span().contains(&Span::of(&h.cidr)))
            });
            if let Some(h) = covering {
                return Err(Refusal::NodeCidrOverlap {
                    range: r.cidr,
                    cidr: h.cidr,
                    owner: h.node.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Adds a pool with one set per range, marking what the ledger and the service ranges already use.
    fn install(
        &mut self,
        obj: &ObjectPool,
        selector: crate::selector::NodeSelector,
        ranges: &[PoolRange],
        state: PoolState,
    ) {
        let mut families = Vec::new();
        for r in ranges {
            // Cannot fail: `PoolSpec::ranges` checked mask and size.
            let Ok(mut set) = CidrSet::new(r.cidr, r.node_mask) else {
                continue;
            };
            let span = *set.span();
            for svc in &self.services {
                if let Some(part) = span.intersect(&Span::of(svc)) {
                    let _ = set.occupy(part.to_net());
                }
            }
            for h in self.ledger.overlapping(&span) {
                if let Some(part) = span.intersect(&Span::of(&h.cidr)) {
                    let _ = set.occupy(part.to_net());
                }
            }
            let at = self.sets.len();
            self.sets.push(set);
            families.push((r.family, at..at + 1));
        }
        self.pools.push(Pool {
            name: obj.name.clone(),
            selector,
            families,
            state,
            is_object: true,
            asked: ranges.iter().map(|r| r.cidr).collect(),
            uid: obj.uid.clone(),
        });
    }

    /// Drops the object pool `name` and its sets. What Nodes hold stays in the ledger.
    fn remove_pool(&mut self, name: &str) {
        let Some(i) = self
            .pools
            .iter()
            .position(|p| p.is_object && p.name == name)
        else {
            return;
        };
        let pool = self.pools.remove(i);
        let Some(start) = pool.families.iter().map(|(_, r)| r.start).min() else {
            return;
        };
        let end = pool
            .families
            .iter()
            .map(|(_, r)| r.end)
            .max()
            .unwrap_or(start);
        self.sets.drain(start..end);
        let removed = end - start;
        for p in &mut self.pools {
            for (_, r) in &mut p.families {
                if r.start >= end {
                    *r = r.start - removed..r.end - removed;
                }
            }
        }
    }

    /// Owners holding a CIDR from pool `i`: inside one of its sets at that set's node mask.
    fn holders(&self, i: usize) -> usize {
        let mut owners: HashSet<&str> = HashSet::new();
        for (_, r) in &self.pools[i].families {
            for s in &self.sets[r.clone()] {
                for h in self.ledger.overlapping(s.span()) {
                    if s.contains(h.cidr) && h.cidr.prefix_len() == s.node_mask() {
                        owners.insert(h.node);
                    }
                }
            }
        }
        owners.len()
    }

    /// Whether the ClusterCIDR pool `name` is draining and no owner holds a CIDR from it any more:
    /// its finalizer may go.
    pub fn drained(&self, name: &str) -> bool {
        self.pools
            .iter()
            .position(|p| p.is_object && p.name == name)
            .is_some_and(|i| match self.pools[i].state {
                PoolState::Draining => self.holders(i) == 0,
                PoolState::Refused(_) => true,
                PoolState::Active => false,
            })
    }

    /// The name of the pool at `i` (as [`Pools::candidates`] numbers them).
    pub fn name_of(&self, i: usize) -> Option<&str> {
        self.pools.get(i).map(|p| p.name.as_str())
    }

    /// Every pool, the flag pool first.
    pub fn reports(&self) -> Vec<PoolReport> {
        (0..self.pools.len())
            .map(|i| {
                let p = &self.pools[i];
                let sets: Vec<&CidrSet> = p
                    .families
                    .iter()
                    .flat_map(|(_, r)| self.sets[r.clone()].iter())
                    .collect();
                PoolReport {
                    name: p.name.clone(),
                    is_object: p.is_object,
                    state: p.state.clone(),
                    ranges: if sets.is_empty() {
                        p.asked.clone()
                    } else {
                        sets.iter().map(|s| s.cluster()).collect()
                    },
                    node_masks: sets.iter().map(|s| s.node_mask()).collect(),
                    selector: p.selector.summary(),
                    // A scan of the pool's holdings: only ClusterCIDR objects show it (status), and
                    // this runs every second, so the flag pool of a 50,000-Node cluster is not scanned.
                    holders: if p.is_object { self.holders(i) } else { 0 },
                    capacity: self.capacity(i),
                }
            })
            .collect()
    }

    /// The families pool `name` gives a Node, in order (empty if unknown or refused).
    pub fn pool_families(&self, name: &str) -> Vec<Family> {
        self.pools
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.families.iter().map(|(f, _)| *f).collect())
            .unwrap_or_default()
    }
}

/// The ranges a spec names, for reporting a refused pool.
fn asked_ranges(spec: &PoolSpec) -> Vec<IpNet> {
    spec.ipv4.iter().chain(spec.ipv6.iter()).copied().collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pools_objects_tests.rs"]
mod tests;

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
    ///
    /// Linear in the objects: pools are found by name, and a refused pool is built again only when its
    /// object changed or what its refusal depends on did ([`Pools::refusal_epoch`]), so a pass over
    /// unchanged objects checks nothing. Refused pools are checked again in one more round if a pool
    /// was added in this pass, so the reasons returned are those of the pools as they now stand.
    pub fn sync_objects(&mut self, objects: &[ObjectPool]) -> SyncReport {
        let mut report = SyncReport::default();
        let present: HashSet<(&str, &str)> = objects
            .iter()
            .map(|o| (o.name.as_str(), o.uid.as_str()))
            .collect();
        report.removed =
            self.remove_pools(|p| !present.contains(&(p.name.as_str(), p.uid.as_str())));
        let shape = self.epochs.shape;
        for obj in objects {
            match self.index.get(obj.name.as_str()) {
                Some(&i) => self.update(i, obj, &mut report),
                None => {
                    let pool = self.build(obj, self.pools.len());
                    if pool.state == PoolState::Active {
                        report.activated.push(obj.name.clone());
                    }
                    self.index.insert(obj.name.clone(), self.pools.len());
                    self.pools.push(pool);
                }
            }
        }
        if self.epochs.shape != shape {
            for obj in objects {
                if let Some(&i) = self.index.get(obj.name.as_str()) {
                    self.update(i, obj, &mut report);
                }
            }
        }
        report
    }

    /// A number that changes whenever something a refusal depends on besides the object may have
    /// changed: a pool's ranges were added or removed, or a Node CIDR outside every pool was released.
    /// [`Pools::sync_objects`] with the same objects at the same epoch changes nothing, so a caller that
    /// knows its objects are unchanged may skip the call.
    pub fn refusal_epoch(&self) -> u64 {
        self.epochs.shape + self.epochs.outside_released
    }

    /// Brings the known pool `i` in line with `obj`: an active one drains once `obj` is deleted; a
    /// refused one is built again if `obj` changed or its refusal may have.
    fn update(&mut self, i: usize, obj: &ObjectPool, report: &mut SyncReport) {
        let pool = &self.pools[i];
        match (&pool.state, obj.deleting) {
            (PoolState::Active, true) => {
                self.pools[i].state = PoolState::Draining;
                // A pool being deleted waits for its holders; release holds would only delay it.
                while self.end_oldest_release_hold_in(i).is_some() {}
            }
            (PoolState::Refused(why), false) => {
                let stale = match why {
                    Refusal::Invalid(_) | Refusal::Modified => false,
                    Refusal::PoolOverlap { .. } | Refusal::ServiceRangeOverlap { .. } => {
                        pool.checked.shape != self.epochs.shape
                    }
                    Refusal::NodeCidrOverlap { .. } => pool.checked != self.epochs,
                };
                if !stale && pool.source.as_ref() == Some(obj) {
                    return;
                }
                let rebuilt = self.build(obj, i);
                if rebuilt.state == PoolState::Active {
                    report.activated.push(obj.name.clone());
                }
                self.pools[i] = rebuilt;
            }
            _ => {}
        }
    }

    /// The pool `obj` describes, to be placed at `at` in `pools`: active if it passes [`Pools::check`]
    /// (its sets added), draining if it is being deleted (a new leader must still see which Nodes hold
    /// CIDRs from it), else refused.
    fn build(&mut self, obj: &ObjectPool, at: usize) -> Pool {
        self.object_scans += 1;
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
        let epochs = self.epochs;
        let (families, state, asked) = match ranges {
            Ok(ranges) => {
                let state = if obj.deleting {
                    PoolState::Draining
                } else {
                    PoolState::Active
                };
                let families = self.install(&ranges, at);
                (families, state, ranges.iter().map(|r| r.cidr).collect())
            }
            Err(refusal) => (Vec::new(), PoolState::Refused(refusal), asked),
        };
        Pool {
            name: obj.name.clone(),
            selector,
            families,
            state,
            is_object: true,
            asked,
            uid: obj.uid.clone(),
            source: Some(obj.clone()),
            checked: epochs,
        }
    }

    /// Why a pool with these ranges may not allocate: a partial overlap with another pool's range, a
    /// service range, or a Node CIDR that covers more than the range outside every pool. Visits the
    /// sets (active and draining pools' ranges), never the refused pools.
    fn check(&self, ranges: &[PoolRange]) -> Result<(), Refusal> {
        for r in ranges {
            let span = Span::of(&r.cidr);
            let clash = self
                .sets
                .iter()
                .enumerate()
                .filter(|(_, s)| s.span().overlaps(&span) && s.cluster() != r.cidr)
                .filter_map(|(k, s)| Some((*self.set_owner.get(k)?, s.cluster())))
                .min_by_key(|(p, _)| *p);
            if let Some((p, other)) = clash {
                return Err(Refusal::PoolOverlap {
                    range: r.cidr,
                    pool: self.pools[p].name.clone(),
                    other,
                });
            }
            if let Some(svc) = self.services.iter().find(|s| Span::of(s).overlaps(&span)) {
                return Err(Refusal::ServiceRangeOverlap {
                    range: r.cidr,
                    service_range: *svc,
                });
            }
            // A holding overlapping the range but not inside it contains it (CIDRs nest).
            let covering = self.ledger.containing(&span).find(|h| {
                !self
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

    /// Adds one set per range for the pool at `at`, marking what the ledger and the service ranges
    /// already use, and credits it the owners of what it hands out that no pool has yet; returns the
    /// families as the pool records them.
    fn install(
        &mut self,
        ranges: &[PoolRange],
        at: usize,
    ) -> Vec<(Family, std::ops::Range<usize>)> {
        let mut families = Vec::new();
        for r in ranges {
            // Cannot fail: `PoolSpec::ranges` checked mask and size.
            let set = match r.sizing {
                Some(sizing) => CidrSet::new_sized(r.cidr, sizing),
                None => CidrSet::new(r.cidr, r.node_mask),
            };
            let Ok(mut set) = set else {
                continue;
            };
            let span = *set.span();
            for svc in &self.services {
                if let Some(part) = span.intersect(&Span::of(svc)) {
                    let _ = set.occupy(part.to_net());
                }
            }
            let mut handed_out = Vec::new();
            for h in self.ledger.overlapping(&span) {
                if let Some(part) = span.intersect(&Span::of(&h.cidr)) {
                    let _ = set.occupy(part.to_net());
                }
                if set.contains(h.cidr) && set.hands_out(h.cidr.prefix_len()) {
                    handed_out.extend(self.ledger.owner(h.node));
                }
            }
            let k = self.sets.len();
            self.sets.push(set);
            self.set_owner.push(at);
            families.push((r.family, k..k + 1));
            self.credit_uncredited(at, handed_out);
        }
        if !families.is_empty() {
            self.epochs.shape += 1;
        }
        families
    }

    /// Drops the ClusterCIDR pools `gone` selects, with their sets, in one pass over the pools; returns
    /// their names. What Nodes hold stays in the ledger.
    fn remove_pools(&mut self, gone: impl Fn(&Pool) -> bool) -> Vec<String> {
        if !self.pools.iter().any(|p| p.is_object && gone(p)) {
            return Vec::new();
        }
        let mut old_sets: Vec<Option<CidrSet>> = std::mem::take(&mut self.sets)
            .into_iter()
            .map(Some)
            .collect();
        self.set_owner.clear();
        let mut removed = Vec::new();
        let mut moved = Vec::with_capacity(self.pools.len());
        for mut pool in std::mem::take(&mut self.pools) {
            if pool.is_object && gone(&pool) {
                if !pool.families.is_empty() {
                    self.epochs.shape += 1;
                }
                removed.push(pool.name);
                moved.push(None);
                continue;
            }
            moved.push(Some(self.pools.len()));
            for (_, r) in &mut pool.families {
                let start = self.sets.len();
                self.sets
                    .extend(r.clone().filter_map(|k| old_sets.get_mut(k)?.take()));
                *r = start..self.sets.len();
                let owner = self.pools.len();
                self.set_owner.resize(self.sets.len(), owner);
            }
            self.pools.push(pool);
        }
        self.index = self
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_object)
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        self.renumber_credits(&moved);
        removed
    }

    /// Owners holding CIDRs pool `i` handed out (see [`super::credit`]).
    fn holders(&self, i: usize) -> usize {
        self.credits.holders(i)
    }

    /// Whether the ClusterCIDR pool `name` is draining and no owner holds a CIDR from it any more:
    /// its finalizer may go.
    pub fn drained(&self, name: &str) -> bool {
        self.index
            .get(name)
            .is_some_and(|&i| match self.pools[i].state {
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
        (0..self.pools.len()).map(|i| self.report_at(i)).collect()
    }

    /// The ClusterCIDR pool `name` as [`Pools::reports`] describes it, found by name.
    pub fn report(&self, name: &str) -> Option<PoolReport> {
        self.index.get(name).map(|&i| self.report_at(i))
    }

    fn report_at(&self, i: usize) -> PoolReport {
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
            node_masks: sets.iter().map(|s| s.default_mask()).collect(),
            selector: p.selector.summary(),
            // Only ClusterCIDR objects show it (status); the flag pool's owners are not counted.
            holders: if p.is_object { self.holders(i) } else { 0 },
            capacity: self.capacity(i),
        }
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
mod tests;

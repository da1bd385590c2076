//! The release hold (`--cidr-release-hold`): CIDRs a deleted Node held stay out of allocation for a
//! while, because routes, neighbour entries, conntrack and flannel leases elsewhere still point at their
//! old owner. Held CIDRs stay in the ledger under an owner of their own (`release-hold:<node name>`), so
//! every guarantee of the ledger covers them. A Node that comes back under the same name within the hold
//! gets its CIDRs back (sticky re-join) — or, while another owner reserves them (a new leader's
//! quarantine), waits for them with the hold running on ([`Error::ReleaseHoldReserved`]). Only where the
//! operator turned it on ([`Pools::set_rejoin_by_provider_id`]) does a Node under another name with the
//! deleted Node's `spec.providerID` get them too: a providerID is the Node's own word, which any kubelet
//! can copy. A pool with nothing else free ends holds early, the oldest first, but only holds whose
//! ending makes room for the Node asking, and says so ([`ReleaseHoldUse::early`]). Every hold that ends,
//! and why, is kept for the caller to count and report ([`Pools::take_ended_release_holds`]).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ipnet::IpNet;

use super::record::first_occurrences;
use super::{unmark, Pools};
use crate::addr::Span;
use crate::error::Error;
use crate::outcome::{NodeAllocation, PoolTries};
use crate::selector::NodeView;

/// How the ledger owner of a release hold starts: no Node UID has this shape.
const OWNER_PREFIX: &str = "release-hold:";

/// The most ended holds kept for [`Pools::take_ended_release_holds`]: a user of the pools that never
/// takes them (a one-shot check) must not grow them without bound; the allocator takes them after every
/// change, so it never comes near.
const ENDED_KEPT: usize = 4096;

/// The ledger owner of what the Node `name` left behind.
pub(crate) fn release_hold_owner(name: &str) -> String {
    format!("{OWNER_PREFIX}{name}")
}

/// When each Node's release hold ends, by Node name; the CIDRs are in the ledger.
#[derive(Debug, Default)]
pub(crate) struct ReleaseHolds {
    ends: HashMap<String, Instant>,
    /// The held Node's name by its `spec.providerID`, for the Nodes that had one, while re-joining by
    /// providerID is on.
    by_provider_id: HashMap<String, String>,
    /// Whether a Node re-joins by `spec.providerID` too ([`Pools::set_rejoin_by_provider_id`]).
    rejoin_by_provider_id: bool,
    /// Holds that ended since the caller last took them, oldest first.
    ended: VecDeque<EndedReleaseHold>,
}

/// How an allocation used a release hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseHoldUse {
    /// The Node whose released CIDRs these were (another name than the receiver's when it came back
    /// with the same `spec.providerID`).
    pub released_by: String,
    /// The hold had not ended: the pool had nothing else free (another Node's CIDRs, given early).
    /// False when a Node re-joining under its name got its own CIDRs back.
    pub early: bool,
}

/// Why a release hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseHoldEnd {
    /// It ran its time.
    Expired,
    /// Its CIDRs went back to the Node re-joining as the held one.
    GivenBack,
    /// Its CIDRs, or part of the room they left, went to another Node: every pool selecting that Node
    /// was full, and ending this hold made room for it.
    HandedOut,
    /// The Node re-joining as the held one could not take them back: no longer a valid allocation from
    /// a pool that selects it.
    NoLongerValid,
    /// A Node the API shows holds one of its CIDRs: what the API says wins.
    NodeHoldsCidr,
    /// Its pool's ClusterCIDR is being deleted: only Nodes keep a deleted pool draining.
    PoolDeleted,
    /// The Node's name was released into a hold again, with other CIDRs: one hold per name.
    Replaced,
}

impl ReleaseHoldEnd {
    /// A metric label for it, in snake_case.
    pub fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::GivenBack => "given_back",
            Self::HandedOut => "handed_out",
            Self::NoLongerValid => "no_longer_valid",
            Self::NodeHoldsCidr => "node_holds_cidr",
            Self::PoolDeleted => "pool_deleted",
            Self::Replaced => "replaced",
        }
    }

    /// Whether the hold ended before its time without going back to its Node: its CIDRs are free, or
    /// another Node's, while routes elsewhere may still point at the deleted Node.
    pub fn is_early(self) -> bool {
        !matches!(self, Self::Expired | Self::GivenBack)
    }
}

/// A release hold that ended ([`Pools::take_ended_release_holds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedReleaseHold {
    /// The deleted Node whose hold it was.
    pub node: String,
    /// The CIDRs it held.
    pub cidrs: Vec<IpNet>,
    /// The pool they belong to (empty if none).
    pub pool: String,
    /// Why it ended.
    pub why: ReleaseHoldEnd,
}

impl Pools {
    /// Whether a Node under another name with a held Node's `spec.providerID` re-joins as it (off by
    /// default). A providerID is what the kubelet registered, not something the API server checks: on,
    /// a Node that copies another machine's providerID (or an image baked with one) takes its held CIDRs.
    pub fn set_rejoin_by_provider_id(&mut self, on: bool) {
        self.release_holds.rejoin_by_provider_id = on;
        if !on {
            self.release_holds.by_provider_id.clear();
        }
    }

    /// Forgets `owner` (a Node's UID) as [`Pools::release_node`] does, but keeps its CIDRs out of
    /// allocation until `until`, under the Node's `name` and its `provider_id`. A hold the name still had
    /// ends first ([`ReleaseHoldEnd::Replaced`]).
    pub fn release_node_with_hold(
        &mut self,
        owner: &str,
        name: &str,
        provider_id: Option<&str>,
        until: Instant,
    ) -> Vec<IpNet> {
        let Some(held) = self.ledger.held_by(owner).map(<[IpNet]>::to_vec) else {
            return Vec::new();
        };
        self.end_release_hold(name, ReleaseHoldEnd::Replaced);
        let pool = self.credited_pool(owner);
        self.release_node(owner);
        self.start_release_hold(name, provider_id, &held, until);
        if let Some(p) = pool {
            self.credit(&release_hold_owner(name), p);
        }
        held
    }

    fn start_release_hold(
        &mut self,
        name: &str,
        provider_id: Option<&str>,
        cidrs: &[IpNet],
        until: Instant,
    ) {
        self.record(&release_hold_owner(name), cidrs);
        self.release_holds.ends.insert(name.to_string(), until);
        let id = provider_id.filter(|id| !id.is_empty());
        if let (Some(id), true) = (id, self.release_holds.rejoin_by_provider_id) {
            // A providerID names one machine: its latest Node's hold is the one to give back.
            self.release_holds
                .by_provider_id
                .insert(id.to_string(), name.to_string());
        }
    }

    /// Ends every release hold due by `now`; returns each Node name with the CIDRs now free.
    pub fn end_release_holds(&mut self, now: Instant) -> Vec<(String, Vec<IpNet>)> {
        let due: Vec<String> = self
            .release_holds
            .ends
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(name, _)| name.clone())
            .collect();
        due.into_iter()
            .map(|name| {
                let freed = self.end_release_hold(&name, ReleaseHoldEnd::Expired);
                (name, freed)
            })
            .collect()
    }

    /// When the next release hold ends, if any is running.
    pub fn next_release_hold_end(&self) -> Option<Instant> {
        self.release_holds.ends.values().min().copied()
    }

    /// The `spec.providerID` of the held Node `name`, if it had one and re-joining by providerID is on.
    pub fn release_hold_provider_id(&self, name: &str) -> Option<&str> {
        self.release_holds
            .by_provider_id
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| id.as_str())
    }

    /// The CIDRs in release hold, with the Node that released them.
    pub fn release_holds(&self) -> impl Iterator<Item = (&str, &[IpNet])> {
        self.release_holds.ends.keys().map(|name| {
            let cidrs = self
                .ledger
                .held_by(&release_hold_owner(name))
                .unwrap_or_default();
            (name.as_str(), cidrs)
        })
    }

    /// The release holds that ended since the last call, oldest first, each with why: for the caller to
    /// count and report, since a hold ended early leaves routes elsewhere pointing at its CIDRs.
    pub fn take_ended_release_holds(&mut self) -> Vec<EndedReleaseHold> {
        self.release_holds.ended.drain(..).collect()
    }

    /// Restores a hold an earlier leader recorded: `name` keeps `cidrs` out of allocation until `until`,
    /// if it has no hold yet and they are free (no Node holds any of them) and still a valid allocation.
    pub fn restore_release_hold(
        &mut self,
        name: &str,
        provider_id: Option<&str>,
        cidrs: &[IpNet],
        until: Instant,
    ) -> bool {
        let hold_owner = release_hold_owner(name);
        if self.release_holds.ends.contains_key(name)
            || !self.is_valid_allocation(&hold_owner, cidrs)
        {
            return false;
        }
        self.start_release_hold(name, provider_id, cidrs, until);
        true
    }

    /// Ends every release hold overlapping `cidrs`, which a Node the API shows holds.
    pub(crate) fn end_release_holds_overlapping(&mut self, cidrs: &[IpNet]) {
        if self.release_holds.ends.is_empty() {
            return;
        }
        let names: Vec<String> = cidrs
            .iter()
            .flat_map(|c| self.ledger.overlapping(&Span::of(&c.trunc())))
            .filter_map(|h| h.node.strip_prefix(OWNER_PREFIX).map(str::to_string))
            .collect();
        for name in names {
            self.end_release_hold(&name, ReleaseHoldEnd::NodeHoldsCidr);
        }
    }

    fn end_release_hold(&mut self, name: &str, why: ReleaseHoldEnd) -> Vec<IpNet> {
        if self.release_holds.ends.remove(name).is_none() {
            return Vec::new();
        }
        if !self.release_holds.by_provider_id.is_empty() {
            self.release_holds.by_provider_id.retain(|_, n| n != name);
        }
        let owner = release_hold_owner(name);
        let pool = self
            .ledger
            .held_by(&owner)
            .and_then(|cidrs| self.pool_of_cidrs(cidrs))
            .unwrap_or_default();
        let freed = self.release_node(&owner);
        self.log_ended(name, freed.clone(), pool, why);
        freed
    }

    fn log_ended(&mut self, name: &str, cidrs: Vec<IpNet>, pool: String, why: ReleaseHoldEnd) {
        let ended = &mut self.release_holds.ended;
        if ended.len() >= ENDED_KEPT {
            ended.pop_front();
        }
        ended.push_back(EndedReleaseHold {
            node: name.to_string(),
            cidrs,
            pool,
            why,
        });
    }

    /// The held Node a Node re-joins as: one under its name, else, where re-joining by providerID is on,
    /// one with its `spec.providerID`.
    pub(crate) fn rejoins(&self, node: &NodeView<'_>) -> Option<String> {
        if self.release_holds.ends.is_empty() {
            return None;
        }
        if self.release_holds.ends.contains_key(node.name) {
            return Some(node.name.to_string());
        }
        if !self.release_holds.rejoin_by_provider_id {
            return None;
        }
        let id = node.provider_id.filter(|id| !id.is_empty())?;
        self.release_holds.by_provider_id.get(id).cloned()
    }

    /// Gives `owner` what the held Node it re-joins as released, if that is still a valid allocation from
    /// a pool that selects it today (`candidates`). A hold that would be but for what other owners reserve
    /// over it runs on: [`Error::ReleaseHoldReserved`] while `wait_for_reserved`, else `None` (new CIDRs
    /// for the Node). A hold no longer valid ends here. `None`: no hold to give back.
    pub(crate) fn rejoin(
        &mut self,
        owner: &str,
        node: &NodeView<'_>,
        candidates: &[usize],
        wait_for_reserved: bool,
    ) -> Result<Option<NodeAllocation>, Error> {
        let Some(name) = self.rejoins(node) else {
            return Ok(None);
        };
        let hold_owner = release_hold_owner(&name);
        let held = self
            .ledger
            .held_by(&hold_owner)
            .map(<[IpNet]>::to_vec)
            .unwrap_or_default();
        let fits = |pools: &Pools, ignore_others: bool| {
            candidates.iter().copied().find(|&p| {
                pools.fits_pool_but_for(&pools.pools[p], &hold_owner, &held, |_| ignore_others)
            })
        };
        if let Some(p) = fits(self, false) {
            let pool = self.pools[p].name.clone();
            self.end_release_hold(&name, ReleaseHoldEnd::GivenBack);
            self.record(owner, &held);
            self.credit(owner, p);
            return Ok(Some(NodeAllocation {
                cidrs: held,
                fresh: Vec::new(),
                pool,
                release_hold: Some(ReleaseHoldUse {
                    released_by: name,
                    early: false,
                }),
            }));
        }
        if fits(self, true).is_none() {
            self.end_release_hold(&name, ReleaseHoldEnd::NoLongerValid);
            return Ok(None);
        }
        if !wait_for_reserved {
            return Ok(None);
        }
        let by = first_occurrences(
            held.iter()
                .flat_map(|c| self.ledger.overlapping(&Span::of(c)))
                .filter(|h| h.node != hold_owner)
                .map(|h| h.node),
        )
        .into_iter()
        .map(str::to_string)
        .collect();
        Err(Error::ReleaseHoldReserved {
            node: node.name.to_string(),
            released_by: name,
            cidrs: held,
            by,
        })
    }

    /// Ends the release holds credited to pool `p` whose ending makes room there for one more Node with
    /// `pods` capacity, and takes that room: for a pool with nothing else free. The oldest holds go first,
    /// and only holds the room needs: not one another owner (a quarantine) covers, of another family, or
    /// too small for the size asked. Returns the fresh CIDRs and the hold they came from.
    pub(crate) fn make_room(
        &mut self,
        p: usize,
        pods: Option<u64>,
    ) -> Option<(Vec<PoolTries>, ReleaseHoldUse)> {
        if self.release_holds.ends.is_empty() {
            return None;
        }
        let mut holds: Vec<(Instant, String)> = self
            .release_holds
            .ends
            .iter()
            // A pool makes room only from the holds it handed out: on a range pools share, another
            // pool's hold is that pool's to give.
            .filter(|(name, _)| {
                self.credited_pool(&release_hold_owner(name)) == Some(p)
                    && self.may_make_room(name, p)
            })
            .map(|(name, end)| (*end, name.clone()))
            .collect();
        holds.sort_unstable();
        // Lift holds out of the ledger, oldest first, until the pool has room ...
        let mut lifted: Vec<(String, Vec<IpNet>)> = Vec::new();
        let mut room = false;
        for (_, name) in holds {
            let cidrs = self.lift(&release_hold_owner(&name));
            lifted.push((name, cidrs));
            if self.has_room(p, pods) {
                room = true;
                break;
            }
        }
        // ... then put back each the room does not need, the youngest first, so the oldest go.
        let mut needed = Vec::new();
        while let Some((name, cidrs)) = lifted.pop() {
            self.record(&release_hold_owner(&name), &cidrs);
            if !room || self.has_room(p, pods) {
                continue;
            }
            self.lift(&release_hold_owner(&name));
            needed.push((name, cidrs));
        }
        if needed.is_empty() {
            return None;
        }
        let Ok(fresh) = self.allocate_from(p, pods) else {
            // Cannot happen (the room was there); the holds run on rather than end for nothing.
            for (name, cidrs) in needed {
                self.record(&release_hold_owner(&name), &cidrs);
            }
            return None;
        };
        let pool = self.pools[p].name.clone();
        let overlaps = |cidrs: &[IpNet]| {
            fresh.iter().any(|t| {
                cidrs
                    .iter()
                    .any(|c| Span::of(c).overlaps(&Span::of(&t.cidr)))
            })
        };
        let released_by = needed
            .iter()
            .find(|(_, cidrs)| overlaps(cidrs))
            .unwrap_or(&needed[0])
            .0
            .clone();
        needed.reverse();
        for (name, cidrs) in needed {
            self.release_holds.ends.remove(&name);
            if !self.release_holds.by_provider_id.is_empty() {
                self.release_holds.by_provider_id.retain(|_, n| *n != name);
            }
            if cidrs
                .iter()
                .any(|c| !self.sets.iter().any(|s| s.span().contains(&Span::of(c))))
            {
                // As `release_node` does: it may have kept a ClusterCIDR inside it refused.
                self.epochs.outside_released += 1;
            }
            self.log_ended(&name, cidrs, pool.clone(), ReleaseHoldEnd::HandedOut);
        }
        Some((
            fresh,
            ReleaseHoldUse {
                released_by,
                early: true,
            },
        ))
    }

    /// Whether lifting the hold of `name` may free room in pool `p`: one of its CIDRs lies in one of
    /// the pool's sets and no other owner or service range covers it whole (a quarantine does).
    fn may_make_room(&self, name: &str, p: usize) -> bool {
        let owner = release_hold_owner(name);
        let Some(cidrs) = self.ledger.held_by(&owner) else {
            return false;
        };
        let sets = self.pools[p]
            .families
            .iter()
            .flat_map(|(_, r)| self.sets[r.clone()].iter());
        let in_pool: Vec<&IpNet> = cidrs
            .iter()
            .filter(|c| sets.clone().any(|s| s.overlaps(**c)))
            .collect();
        in_pool.into_iter().any(|c| {
            let span = Span::of(c);
            !self
                .ledger
                .overlapping(&span)
                .any(|h| h.node != owner && h.cidr.contains(c))
                && !self.services.iter().any(|svc| svc.contains(c))
        })
    }

    /// Takes what `owner` holds out of the ledger and the sets, without counting a release: undone by
    /// [`Pools::record`].
    fn lift(&mut self, owner: &str) -> Vec<IpNet> {
        let Some(held) = self.ledger.remove(owner) else {
            return Vec::new();
        };
        for c in &held {
            unmark(&mut self.sets, &self.ledger, &self.services, &Span::of(c));
        }
        held
    }

    /// Whether pool `p` could hand a Node with `pods` capacity one node CIDR per family now.
    fn has_room(&self, p: usize, pods: Option<u64>) -> bool {
        self.pools[p].families.iter().all(|(family, range)| {
            self.sets[range.clone()].iter().any(|set| {
                let size = set
                    .sizing()
                    .map_or(set.node_mask(), |z| z.prefix_for(*family, pods));
                set.free_blocks(size) > 0
            })
        })
    }

    /// Ends release holds with CIDRs in pool `p` one at a time, the oldest first, for a pool being deleted
    /// ([`ReleaseHoldEnd::PoolDeleted`]); returns the Node whose hold ended.
    pub(crate) fn end_oldest_release_hold_in(&mut self, p: usize) -> Option<String> {
        let oldest = self
            .release_holds
            .ends
            .iter()
            .filter(|(name, _)| self.credited_pool(&release_hold_owner(name)) == Some(p))
            .min_by_key(|(name, end)| (**end, name.as_str()))
            .map(|(name, _)| name.clone())?;
        self.end_release_hold(&oldest, ReleaseHoldEnd::PoolDeleted);
        Some(oldest)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

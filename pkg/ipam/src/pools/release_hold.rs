//! The release hold (`--cidr-release-hold`): CIDRs a deleted Node held stay out of allocation for a
//! while, because routes, neighbour entries, conntrack and flannel leases elsewhere still point at their
//! old owner. Held CIDRs stay in the ledger under an owner of their own (`release-hold:<node name>`), so
//! every guarantee of the ledger covers them. A Node that comes back under the same name within the hold
//! gets its CIDRs back (sticky re-join), and so does a Node under another name with the deleted Node's
//! `spec.providerID` (the same machine, registered again under a new name); a pool with nothing else free
//! hands out held CIDRs, the oldest hold first, and says so ([`ReleaseHoldUse::early`]).

use std::collections::HashMap;
use std::time::Instant;

use ipnet::IpNet;

use super::Pools;
use crate::addr::Span;
use crate::selector::NodeView;

/// How the ledger owner of a release hold starts: no Node UID has this shape.
const OWNER_PREFIX: &str = "release-hold:";

/// The ledger owner of what the Node `name` left behind.
pub(crate) fn release_hold_owner(name: &str) -> String {
    format!("{OWNER_PREFIX}{name}")
}

/// When each Node's release hold ends, by Node name; the CIDRs are in the ledger.
#[derive(Debug, Default)]
pub(crate) struct ReleaseHolds {
    ends: HashMap<String, Instant>,
    /// The held Node's name by its `spec.providerID`, for the Nodes that had one.
    by_provider_id: HashMap<String, String>,
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

impl Pools {
    /// Forgets `owner` (a Node's UID) as [`Pools::release_node`] does, but keeps its CIDRs out of
    /// allocation until `until`, under the Node's `name` and its `provider_id`. A hold the name still had
    /// ends first.
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
        self.end_release_hold(name);
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
        if let Some(id) = provider_id.filter(|id| !id.is_empty()) {
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
                let freed = self.end_release_hold(&name);
                (name, freed)
            })
            .collect()
    }

    /// When the next release hold ends, if any is running.
    pub fn next_release_hold_end(&self) -> Option<Instant> {
        self.release_holds.ends.values().min().copied()
    }

    /// The `spec.providerID` of the held Node `name`, if it had one.
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

    /// Ends every release hold overlapping `cidrs`.
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
            self.end_release_hold(&name);
        }
    }

    fn end_release_hold(&mut self, name: &str) -> Vec<IpNet> {
        if self.release_holds.ends.remove(name).is_none() {
            return Vec::new();
        }
        if !self.release_holds.by_provider_id.is_empty() {
            self.release_holds.by_provider_id.retain(|_, n| n != name);
        }
        self.release_node(&release_hold_owner(name))
    }

    /// The held Node a Node re-joins as: one under its name, else one with its `spec.providerID`.
    pub(crate) fn rejoins(&self, node: &NodeView<'_>) -> Option<String> {
        if self.release_holds.ends.is_empty() {
            return None;
        }
        if self.release_holds.ends.contains_key(node.name) {
            return Some(node.name.to_string());
        }
        let id = node.provider_id.filter(|id| !id.is_empty())?;
        self.release_holds.by_provider_id.get(id).cloned()
    }

    /// Gives `owner` what the Node `name` released, if that is still a valid allocation from a pool that
    /// selects it today (`candidates`); a hold that is no longer valid ends here.
    pub(crate) fn reclaim_release_hold(
        &mut self,
        owner: &str,
        name: &str,
        candidates: &[usize],
    ) -> Option<(Vec<IpNet>, String)> {
        if !self.release_holds.ends.contains_key(name) {
            return None;
        }
        let hold_owner = release_hold_owner(name);
        let held = self.ledger.held_by(&hold_owner)?.to_vec();
        let pool = candidates
            .iter()
            .copied()
            .find(|&p| self.fits_pool(&self.pools[p], &hold_owner, &held));
        // Given back or no longer valid, the hold ends either way.
        self.end_release_hold(name);
        let pool = pool?;
        self.record(owner, &held);
        self.credit(owner, pool);
        Some((held, self.pools[pool].name.clone()))
    }

    /// Ends the oldest release hold credited to pool `p` (its Node's pool), for a pool that has nothing
    /// else free; returns the Node that released them.
    pub(crate) fn end_oldest_release_hold_in(&mut self, p: usize) -> Option<String> {
        let oldest = self
            .release_holds
            .ends
            .iter()
            .filter(|(name, _)| self.credited_pool(&release_hold_owner(name)) == Some(p))
            .min_by_key(|(name, end)| (**end, name.as_str()))
            .map(|(name, _)| name.clone())?;
        self.end_release_hold(&oldest);
        Some(oldest)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

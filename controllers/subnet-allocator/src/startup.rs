//! What a new leader does with the PodCIDRClaims earlier leaders left, before its first allocation.
//!
//! A claim whose Node still exists without pod CIDRs may have a PATCH in flight (the scenario claims
//! exist for), so it stays reserved for that Node — adopted as the Node's pending allocation when it fits
//! today's configuration, else kept as a bare reservation. A claim whose Node holds other CIDRs, or
//! whose Node is provably gone, is deleted: no late write can use it any more.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use crate::allocator::{facts, lock, reservation_owner, Allocator, NAME};
use crate::claims::{Claim, ClaimError, Claims};

/// What to do with one claim at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimFate {
    /// The Node holds the claimed CIDR: nothing to do.
    Held,
    /// The Node exists without pod CIDRs: keep the CIDR for it.
    Pending,
    /// The Node holds other CIDRs: the claim is stale.
    Stale,
    /// The cache has no Node of that name and UID: ask the API before deleting.
    Unknown,
}

/// Decides a claim's fate from the cached Node of its name (`None` if absent): its UID and pod CIDRs.
pub(crate) fn claim_fate(claim: &Claim, node: Option<(&str, &[IpNet])>) -> ClaimFate {
    match node {
        Some((uid, cidrs)) if uid == claim.node_uid => {
            if cidrs.is_empty() {
                ClaimFate::Pending
            } else if cidrs.iter().any(|c| c.trunc() == claim.cidr) {
                ClaimFate::Held
            } else {
                ClaimFate::Stale
            }
        }
        _ => ClaimFate::Unknown,
    }
}

impl Allocator {
    /// Lists the claims (retrying until it works or `shutdown` fires) and applies their fates.
    /// Returns false if shut down first.
    pub(crate) async fn reconcile_claims(
        &self,
        claims: &Claims,
        shutdown: &CancellationToken,
    ) -> bool {
        let mut delay = Duration::from_millis(500);
        let list = loop {
            match claims.list().await {
                Ok(list) => break list,
                Err(e @ ClaimError::NotInstalled) => {
                    tracing::error!(controller = NAME, error = %e, "cannot allocate until PodCIDRClaims can be listed");
                }
                Err(e) => {
                    tracing::warn!(controller = NAME, error = %e, "listing PodCIDRClaims failed; retrying");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        };
        let mut pending: BTreeMap<(String, String), Vec<IpNet>> = BTreeMap::new();
        let (mut stale, mut kept) = (0usize, 0usize);
        for claim in &list {
            let cached = self.nodes.get(&claim.node_name);
            let cached_facts = cached.as_deref().map(facts);
            let parsed: Vec<IpNet> = cached_facts
                .as_ref()
                .map(|f| netcm_node::PodCidrs::parse(&f.pod_cidrs).cidrs)
                .unwrap_or_default();
            let node = cached_facts
                .as_ref()
                .map(|f| (f.uid.as_str(), parsed.as_slice()));
            let fate = match claim_fate(claim, node) {
                ClaimFate::Unknown => {
                    match self.node_is_gone(&claim.node_name, &claim.node_uid).await {
                        Ok(true) => ClaimFate::Stale,
                        Ok(false) => ClaimFate::Pending,
                        Err(e) => {
                            tracing::warn!(controller = NAME, cidr = %claim.cidr, error = %e, "could not check a PodCIDRClaim's node; keeping the CIDR reserved");
                            ClaimFate::Pending
                        }
                    }
                }
                fate => fate,
            };
            match fate {
                ClaimFate::Held => {}
                ClaimFate::Pending => {
                    kept += 1;
                    pending
                        .entry((claim.node_name.clone(), claim.node_uid.clone()))
                        .or_default()
                        .push(claim.cidr);
                }
                ClaimFate::Stale | ClaimFate::Unknown => {
                    stale += 1;
                    let deleted = match self.guard.ensure_leader() {
                        Ok(()) => claims.delete_claim(claim).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = deleted {
                        tracing::warn!(controller = NAME, cidr = %claim.cidr, error = %e, "could not delete a stale PodCIDRClaim; keeping the CIDR reserved");
                        let mut pools = lock(&self.pools);
                        pools.hold(&reservation_owner(&claim.cidr), &[claim.cidr]);
                    }
                }
            }
        }
        self.adopt(pending);
        tracing::info!(
            controller = NAME,
            claims = list.len(),
            kept_for_nodes_without_cidrs = kept,
            stale_deleted = stale,
            "reconciled PodCIDRClaims left by earlier leaders"
        );
        true
    }

    /// Keeps claimed CIDRs for Nodes that have none yet: as their pending allocation when it is exactly
    /// what this configuration would allocate, else as bare reservations (the Node gets fresh CIDRs).
    fn adopt(&self, pending: BTreeMap<(String, String), Vec<IpNet>>) {
        let mut pools = lock(&self.pools);
        for ((name, uid), mut cidrs) in pending {
            let families: Vec<_> = pools.sets().iter().map(|s| s.family()).collect();
            cidrs.sort_by_key(|c| {
                families
                    .iter()
                    .position(|f| *f == netcm_node::Family::of(c))
            });
            if pools.held_by(&uid).is_none() && pools.is_valid_allocation(&uid, &cidrs) {
                pools.hold(&uid, &cidrs);
                let owner = pools.owner(&uid).unwrap_or_else(|| uid.as_str().into());
                lock(&self.tracking).track(&name, owner);
                tracing::info!(controller = NAME, node = %name, cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(), "adopted CIDRs an earlier leader claimed for this node");
            } else {
                for c in &cidrs {
                    pools.hold(&reservation_owner(c), &[*c]);
                }
            }
        }
        self.publish_usage(&pools);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(cidr: &str, uid: &str) -> Claim {
        Claim {
            cidr: cidr.parse().expect("cidr"),
            node_name: "a".into(),
            node_uid: uid.into(),
            object_uid: "o".into(),
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("cidr")).collect()
    }

    #[test]
    fn a_claim_for_a_node_without_cidrs_is_kept_because_its_patch_may_be_in_flight() {
        let c = claim("10.0.1.0/24", "a1");
        assert_eq!(claim_fate(&c, Some(("a1", &[]))), ClaimFate::Pending);
    }

    #[test]
    fn a_claim_for_a_node_holding_other_cidrs_is_stale() {
        let c = claim("10.0.1.0/24", "a1");
        let held = nets(&["10.0.2.0/24"]);
        assert_eq!(claim_fate(&c, Some(("a1", &held))), ClaimFate::Stale);
        let held = nets(&["10.0.1.0/24"]);
        assert_eq!(claim_fate(&c, Some(("a1", &held))), ClaimFate::Held);
    }

    #[test]
    fn a_claim_for_an_absent_or_recreated_node_is_checked_against_the_api() {
        let c = claim("10.0.1.0/24", "a1");
        assert_eq!(claim_fate(&c, None), ClaimFate::Unknown);
        assert_eq!(claim_fate(&c, Some(("a2", &[]))), ClaimFate::Unknown);
    }
}

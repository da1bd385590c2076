//! Giving a Node its CIDRs: take them from the pools, claim each one (PodCIDRClaim), then one PATCH of
//! `spec.podCIDR(s)` that names the Node's UID, so it can only land on the Node the CIDRs were chosen for.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use kube::api::{Patch, PatchParams};
use netcm_manager::CachedNode;
use netcm_manager::{EventType, SyncOutcome};

use crate::allocator::{lock, reservation_owner, Allocator, SyncError, NAME};
use crate::claims::{Claim, ClaimOutcome, Claims};

/// How many CIDRs claimed by other Nodes one sync steps over before it backs off.
const MAX_TAKEN_CLAIMS_PER_SYNC: usize = 16;

/// How a PATCH error is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchFailure {
    /// The Node is gone (404) or changed under us (409): release.
    NodeGone,
    /// The API refuses this write for good (400, 403, 422, admission): release, Event, back off.
    Rejected,
    /// Anything else (5xx, 429, timeouts, transport, fence): keep the allocation and retry with backoff.
    Transient,
}

/// Classifies a failed PATCH by its status code.
pub(crate) fn classify_patch_error(e: &kube::Error) -> PatchFailure {
    match e {
        kube::Error::Api(s) if s.code == 404 || s.code == 409 => PatchFailure::NodeGone,
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => PatchFailure::Rejected,
        _ => PatchFailure::Transient,
    }
}

/// The PATCH: `metadata.uid` makes the API server refuse it (422, uid is immutable) if the Node was
/// re-created meanwhile, so an allocation can only land on the Node it was chosen for.
pub(crate) fn pod_cidr_patch(uid: &str, cidrs: &[String]) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "uid": uid },
        "spec": { "podCIDR": cidrs.first(), "podCIDRs": cidrs }
    })
}

/// What choosing a pool needs of a Node's labels.
pub(crate) enum PoolLabels {
    /// No active pool selects by label: the cache keeps no labels and none are fetched.
    NotNeeded,
    /// The Node's labels, read from the API.
    Live(BTreeMap<String, String>),
    /// The Node is gone or was re-created: the next sync decides from the cache.
    NodeGone,
}

impl Allocator {
    /// The Node's labels, read from the API (metadata only) when a ClusterCIDR pool selects by label.
    /// The cache keeps no labels: at 50,000 Nodes every Node's labels would cost more than the rest of
    /// the cached Node, and they matter only once per Node, when it is allocated — and only with such pools.
    pub(crate) async fn labels_for_pools(
        &self,
        name: &str,
        uid: &str,
    ) -> Result<PoolLabels, SyncError> {
        if !lock(&self.pools).selects_by_label() {
            return Ok(PoolLabels::NotNeeded);
        }
        let live = self
            .api
            .get_metadata_opt(name)
            .await
            .map_err(SyncError::ReadLabels)?;
        Ok(match live {
            Some(m) if m.metadata.uid.as_deref() == Some(uid) => {
                PoolLabels::Live(m.metadata.labels.unwrap_or_default())
            }
            _ => PoolLabels::NodeGone,
        })
    }

    /// Allocates (or re-uses the pending allocation of) the Node `uid`, claims and writes it.
    pub(crate) async fn allocate_and_write(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
    ) -> Result<SyncOutcome, SyncError> {
        let mut taken = 0usize;
        let labels = match self.labels_for_pools(name, uid).await? {
            PoolLabels::NotNeeded => None,
            PoolLabels::Live(labels) => Some(labels),
            PoolLabels::NodeGone => return Ok(SyncOutcome::RetryAfter(Duration::from_millis(200))),
        };
        let no_labels = BTreeMap::new();
        let cidrs = loop {
            let allocation = {
                let mut pools = lock(&self.pools);
                let view = netcm_ipam::NodeView {
                    name,
                    labels: labels.as_ref().unwrap_or(&no_labels),
                };
                let a = pools.allocate_for(uid, &view);
                if let Ok(a) = &a {
                    self.metrics.allocated(&a.pool, &a.fresh);
                    self.publish_usage(&pools);
                }
                a.map(|a| (a, pools.owner(uid)))
            };
            let (allocation, owner) = match allocation {
                Ok(a) => a,
                Err(
                    e @ (netcm_ipam::Error::Full { .. }
                    | netcm_ipam::Error::PoolsFull { .. }
                    | netcm_ipam::Error::NoPool { .. }),
                ) => {
                    if let Some(labels) = &labels {
                        lock(&self.waiting_labels).insert(name.to_string(), labels.clone());
                    }
                    return Err(self.wait_for_cidr(node, name, e).await);
                }
                Err(e) => return Err(SyncError::NoCidrAvailable(e)),
            };
            lock(&self.tracking).track(name, owner.unwrap_or_else(|| uid.into()));
            let Some(claims) = &self.claims else {
                break allocation.cidrs;
            };
            match self.claim_all(claims, &allocation.cidrs, name, uid).await? {
                None => break allocation.cidrs,
                Some(theirs) => {
                    taken += 1;
                    self.step_over(claims, name, uid, &theirs).await?;
                    if taken >= MAX_TAKEN_CLAIMS_PER_SYNC {
                        return Err(SyncError::ClaimsExhausted(taken));
                    }
                }
            }
        };
        self.write(node, name, uid, &cidrs).await
    }

    /// Claims every CIDR; returns the first claim another Node holds, if any.
    async fn claim_all(
        &self,
        claims: &Claims,
        cidrs: &[IpNet],
        name: &str,
        uid: &str,
    ) -> Result<Option<Claim>, SyncError> {
        for cidr in cidrs {
            self.guard.ensure_leader()?;
            match claims.claim(cidr, name, uid).await? {
                ClaimOutcome::Ours => {}
                ClaimOutcome::Taken(theirs) => return Ok(Some(theirs)),
            }
        }
        Ok(None)
    }

    /// Another Node's claim covers a CIDR we chose: give ours back and keep theirs reserved — or, if the
    /// Node it names is provably gone, delete that stale claim so the CIDR is free again.
    async fn step_over(
        &self,
        claims: &Claims,
        name: &str,
        uid: &str,
        theirs: &Claim,
    ) -> Result<(), SyncError> {
        tracing::info!(controller = NAME, node = name, cidr = %theirs.cidr, claimed_for = %theirs.node_name, "CIDR already claimed for another node; choosing another");
        self.release(name, uid).await?;
        let gone = self
            .node_is_gone(&theirs.node_name, &theirs.node_uid)
            .await?;
        if gone {
            self.guard.ensure_leader()?;
            claims.delete_claim(theirs).await?;
            tracing::info!(controller = NAME, cidr = %theirs.cidr, node = %theirs.node_name, "deleted a stale PodCIDRClaim of a node that no longer exists");
        } else {
            let mut pools = lock(&self.pools);
            pools.hold(&reservation_owner(&theirs.cidr), &[theirs.cidr]);
            self.publish_usage(&pools);
        }
        Ok(())
    }

    /// Whether no Node `name` with UID `uid` exists, asked of the API (the cache may lag behind).
    pub(crate) async fn node_is_gone(&self, name: &str, uid: &str) -> Result<bool, kube::Error> {
        if let Some(cached) = self.nodes.get(name) {
            if cached.uid() == uid {
                return Ok(false);
            }
        }
        let live = self.api.get_opt(name).await?;
        Ok(live.is_none_or(|n| n.metadata.uid.as_deref() != Some(uid)))
    }

    /// The one PATCH of the allocation, and what its failure means.
    async fn write(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
        cidrs: &[IpNet],
    ) -> Result<SyncOutcome, SyncError> {
        let cidrs: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        self.guard.ensure_leader()?;
        let patch = pod_cidr_patch(uid, &cidrs);
        let result = netcm_manager::client::unread::patch_unread(
            &self.api,
            name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await;
        let e = match result {
            Ok(_) => {
                self.mark_written(name, uid);
                tracing::info!(controller = NAME, node = name, cidrs = %cidrs.join(","), "assigned pod CIDRs");
                if self.record_assigned {
                    self.recorder
                        .publish(
                            &node.object_ref(),
                            EventType::Normal,
                            "CIDRAssigned",
                            "AllocateCIDR",
                            format!("Node {name} was assigned pod CIDRs {}", cidrs.join(",")),
                        )
                        .await;
                }
                return Ok(SyncOutcome::Done);
            }
            Err(e) => e,
        };
        match classify_patch_error(&e) {
            PatchFailure::NodeGone => {
                tracing::info!(controller = NAME, node = name, error = %e, "node is gone or was re-created; released its allocation");
                self.release(name, uid).await?;
                Ok(SyncOutcome::RetryAfter(Duration::from_millis(200)))
            }
            PatchFailure::Rejected => self.rejected(node, name, uid, &cidrs, e).await,
            PatchFailure::Transient => {
                // The allocation and its claims stay recorded for this Node, so the retry writes the same
                // CIDRs and nothing leaks: a Node that disappears releases them.
                self.assignment_failed(node, name, &e.to_string()).await;
                Err(SyncError::Patch(e))
            }
        }
    }

    /// KCM's `CIDRAssignmentFailed` Warning on the Node, with why.
    async fn assignment_failed(&self, node: &CachedNode, name: &str, why: &str) {
        self.recorder
            .publish(
                &node.object_ref(),
                EventType::Warning,
                "CIDRAssignmentFailed",
                "AllocateCIDR",
                format!("Node {name} status is now: CIDRAssignmentFailed ({why})"),
            )
            .await;
    }

    /// The API refused the write for good: give the CIDRs back (metrics stay consistent), tell the
    /// Node why, and let the workqueue back off per key. If the refusal was because another writer set
    /// the Node's CIDRs meanwhile, that is no failure: the cache's update records theirs.
    async fn rejected(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
        cidrs: &[String],
        e: kube::Error,
    ) -> Result<SyncOutcome, SyncError> {
        self.release(name, uid).await?;
        // A Node re-created meanwhile also ends here: the API refuses a changed metadata.uid with 422.
        let live = self.api.get_opt(name).await.ok().flatten();
        let same_node = live
            .as_ref()
            .is_some_and(|n| n.metadata.uid.as_deref() == Some(uid));
        if !same_node {
            tracing::info!(
                controller = NAME,
                node = name,
                "node was deleted or re-created during the write; released its allocation"
            );
            return Ok(SyncOutcome::RetryAfter(Duration::from_millis(200)));
        }
        if live.is_some_and(|n| !netcm_node::raw_pod_cidrs(&n).is_empty()) {
            tracing::info!(
                controller = NAME,
                node = name,
                "node got pod CIDRs from elsewhere; released ours"
            );
            return Ok(SyncOutcome::RetryAfter(Duration::from_secs(1)));
        }
        let message = match &e {
            kube::Error::Api(s) => s.message.clone(),
            other => other.to_string(),
        };
        tracing::warn!(controller = NAME, node = name, cidrs = %cidrs.join(","), error = %message, "the API server rejected the pod CIDRs; released them, retrying with backoff");
        self.assignment_failed(node, name, &message).await;
        Err(SyncError::Rejected {
            cidrs: cidrs.join(","),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn refusals_for_good_are_told_apart_from_gone_nodes_and_transient_errors() {
        let cases = [
            (422, PatchFailure::Rejected),
            (403, PatchFailure::Rejected),
            (400, PatchFailure::Rejected),
            (404, PatchFailure::NodeGone),
            (409, PatchFailure::NodeGone),
            (503, PatchFailure::Transient),
            (429, PatchFailure::Transient),
        ];
        for (code, want) in cases {
            assert_eq!(classify_patch_error(&api_error(code)), want, "HTTP {code}");
        }
    }

    #[test]
    fn the_patch_names_the_node_uid_and_both_pod_cidr_fields() {
        let p = pod_cidr_patch("u1", &["10.0.0.0/24".into(), "fd00::/64".into()]);
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["spec"]["podCIDR"], "10.0.0.0/24");
        assert_eq!(p["spec"]["podCIDRs"][1], "fd00::/64");
    }
}

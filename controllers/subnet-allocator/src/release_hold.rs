//! The release hold in the allocator (`--cidr-release-hold`; the pools keep it, `netcm_ipam`'s
//! `pools/release_hold.rs`): a deleted Node's CIDRs are held rather than released, a task ends each hold
//! on time and wakes the Nodes waiting for a CIDR, and a CIDR handed out before its hold ended gets a
//! Warning Event on the Node that received it.
//!
//! Every hold that ends is counted (`netcm_pool_release_holds_ended_total{pool,reason}`), and one that
//! ends early — its CIDRs free or another Node's while routes elsewhere may still point at the deleted
//! Node — gets a Warning Event `CIDRReleaseHoldEnded` on that Node's name.
//!
//! Holds outlive this leader: each is written on the PodCIDRClaim of its CIDRs' blocks
//! ([`crate::release_hold_record`]) and a new leader with the flag on restores the ones still running
//! before it hands anything out, as far as it trusts their records. Without claims
//! (`--pod-cidr-claims=false`) holds live in memory only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ObjectReference;
use netcm_ipam::{EndedReleaseHold, Pools, ReleaseHoldEnd, ReleaseHoldUse};
use netcm_manager::{CachedNode, EventType};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, ReleaseReason, SyncError, NAME};
use crate::blocks::block_in;
use crate::claims::Claim;
use crate::release_hold_record::{self as record, ReleaseHoldRecord};

impl Allocator {
    /// Releases what a deleted (or re-created) Node held: into the release hold when one is configured.
    pub(crate) async fn release_deleted(
        &self,
        name: &str,
        uid: &str,
    ) -> Result<Vec<IpNet>, SyncError> {
        let held_until = (!self.release_hold.is_zero()).then(|| Instant::now() + self.release_hold);
        self.release_until(name, uid, held_until, ReleaseReason::NodeDeleted)
            .await
    }

    /// Says how an allocation used the release hold: a Node given back its own CIDRs is logged; CIDRs
    /// handed out before their hold ended (the pool had nothing else free) get a Warning Event.
    pub(crate) async fn report_release_hold_use(
        &self,
        node: &CachedNode,
        name: &str,
        pool: &str,
        used: &ReleaseHoldUse,
    ) {
        if !used.early {
            if used.released_by == name {
                tracing::info!(
                    controller = NAME,
                    node = name,
                    pool,
                    "a node that came back under its name gets the pod CIDRs it held before"
                );
            } else {
                let provider_id = node.provider_id().unwrap_or_default();
                tracing::info!(controller = NAME, node = name, pool, released_by = %used.released_by, provider_id, "a node that came back on the same machine (spec.providerID) under another name gets the pod CIDRs its machine held before");
                // Its providerID is its own word (--cidr-release-hold-rejoin-by-provider-id): say so on it.
                let note = format!(
                    "This Node gets the pod CIDRs Node {} released, because it registered the same spec.providerID ({provider_id}) within --cidr-release-hold (--cidr-release-hold-rejoin-by-provider-id)",
                    used.released_by
                );
                self.recorder
                    .publish(
                        &node.object_ref(),
                        EventType::Normal,
                        "CIDRReleaseHoldRejoinedByProviderID",
                        "AllocateCIDR",
                        note,
                    )
                    .await;
            }
            return;
        }
        self.metrics.release_hold_cut_short(pool);
        let note = format!(
            "Pool {pool} had no free CIDR: this Node gets CIDRs that Node {} released less than {:?} ago (--cidr-release-hold); routes, neighbour entries and flannel leases elsewhere may still point at {}",
            used.released_by, self.release_hold, used.released_by
        );
        tracing::warn!(controller = NAME, node = name, pool, released_by = %used.released_by, "handed out pod CIDRs before their release hold ended: the pool had nothing else free");
        self.recorder
            .publish(
                &node.object_ref(),
                EventType::Warning,
                "CIDRReleaseHoldCutShort",
                "AllocateCIDR",
                note,
            )
            .await;
    }

    /// The block of each of `cidrs` (its claim carries the record).
    fn blocks_of(&self, cidrs: &[IpNet]) -> Vec<(IpNet, IpNet)> {
        let state = self.state.lock();
        cidrs
            .iter()
            .map(|c| (*c, block_in(&state.pools, *c)))
            .collect()
    }

    /// Writes the hold `name` just started for `cidrs` on their blocks' claims, so a new leader finds it.
    /// A failed write is logged: the hold goes on in this leader's memory.
    pub(crate) async fn record_release_hold(
        &self,
        name: &str,
        provider_id: Option<String>,
        cidrs: &[IpNet],
    ) {
        let Some(claims) = &self.claims else {
            return;
        };
        let Ok(until) = jiff::Timestamp::now().checked_add(self.release_hold) else {
            return;
        };
        let value = record::value(&ReleaseHoldRecord {
            node: name.to_string(),
            provider_id,
            until,
            cidrs: cidrs.to_vec(),
        });
        for (cidr, block) in self.blocks_of(cidrs) {
            let written = match self.guard.ensure_leader() {
                Ok(()) => claims
                    .annotate(&block, &record::key(&cidr), Some(&value))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = written {
                tracing::warn!(controller = NAME, node = name, cidr = %cidr, block = %block, %error, "could not record a release hold on its PodCIDRClaim: a new leader would not keep it");
            }
        }
    }

    /// Removes the records of holds that ended on time. Failures only leave a record a new leader
    /// will find ended.
    async fn forget_release_hold_records(&self, ended: &[(String, Vec<IpNet>)]) {
        let Some(claims) = &self.claims else {
            return;
        };
        for (name, cidrs) in ended {
            for (cidr, block) in self.blocks_of(cidrs) {
                if self.guard.ensure_leader().is_err() {
                    return;
                }
                if let Err(error) = claims.annotate(&block, &record::key(&cidr), None).await {
                    tracing::debug!(controller = NAME, node = %name, cidr = %cidr, %error, "could not remove an ended release hold's record; it is ignored once ended");
                }
            }
        }
    }

    /// Restores the holds earlier leaders recorded on `claims` that have not ended, before anything is
    /// handed out, as far as their records are trusted ([`record::restorable`]: a record outside its
    /// claim's block or missing from the claim of another of its CIDRs is ignored, an `until` beyond a
    /// hold started now is cut down, and a name's stale record never hides its live one). Each is checked
    /// again ([`netcm_ipam::Pools::restore_release_hold`]).
    pub(crate) fn restore_release_holds(&self, claims: &[Claim]) {
        let now = jiff::Timestamp::now();
        let listed: Vec<record::ClaimAnnotations<'_>> =
            claims.iter().map(|c| (c.cidr, &c.annotations)).collect();
        let (candidates, findings) = record::restorable(&listed, now, self.release_hold);
        self.say_distrusted(&findings);
        let mut restored = 0usize;
        let mut state = self.state.lock();
        let pools = &mut state.pools;
        for per_name in candidates {
            for (r, until) in per_name {
                let Ok(left) = Duration::try_from(now.duration_until(until)) else {
                    continue;
                };
                if left.is_zero() {
                    continue;
                }
                let until = Instant::now() + left;
                if pools.restore_release_hold(&r.node, r.provider_id.as_deref(), &r.cidrs, until) {
                    restored += 1;
                    break;
                }
            }
        }
        self.publish_usage(pools);
        drop(state);
        if restored > 0 {
            tracing::info!(
                controller = NAME,
                holds = restored,
                "restored the release holds earlier leaders recorded"
            );
            self.release_hold_started.notify_one();
        }
    }

    /// Counts every record not taken as written and logs the first few (a claim writer could leave
    /// thousands).
    fn say_distrusted(&self, findings: &[record::Finding]) {
        const LOGGED: usize = 16;
        for (i, f) in findings.iter().enumerate() {
            self.metrics.release_hold_record_distrusted(f.why.label());
            if i < LOGGED {
                tracing::warn!(controller = NAME, claim = %f.claim, annotation = %f.key, reason = f.why.label(), "{}", f.why.describe());
            }
        }
        if findings.len() > LOGGED {
            tracing::warn!(
                controller = NAME,
                records = findings.len(),
                "release-hold records not taken as written; the first are logged above, netcm_pod_cidr_release_hold_records_distrusted_total counts each"
            );
        }
    }

    /// Takes the holds that ended from `pools` (under the state lock), counts each, counts the CIDRs of
    /// each that went back into the pool as released, and publishes the pools' usage if any ended;
    /// returns those that ended early, for [`Allocator::report_ended_holds`] once the lock is dropped.
    pub(crate) fn take_ended_holds(&self, pools: &mut Pools) -> Vec<EndedReleaseHold> {
        let mut ended = pools.take_ended_release_holds();
        for e in &ended {
            self.metrics.release_hold_ended(&e.pool, e.why.label());
            // Released into the pool (a hand-out counts as a fresh allocation); not when the CIDRs
            // went straight to a Node.
            if !matches!(
                e.why,
                ReleaseHoldEnd::GivenBack | ReleaseHoldEnd::NodeHoldsCidr
            ) {
                for cidr in &e.cidrs {
                    if let Some((pool, cluster)) = pools.pool_of(*cidr) {
                        self.metrics.released(pool, &cluster.to_string());
                    }
                }
            }
        }
        if !ended.is_empty() {
            self.publish_usage(pools);
        }
        ended.retain(|e| e.why.is_early());
        ended
    }

    /// Says that each of `ended` (from [`Allocator::take_ended_holds`]) ended early: a warning and a
    /// Warning Event `CIDRReleaseHoldEnded` about the deleted Node's name, naming `to`, the Node whose sync
    /// ended it, if one did. Wakes the Nodes waiting for a CIDR when CIDRs came free.
    pub(crate) async fn report_ended_holds(&self, ended: Vec<EndedReleaseHold>, to: Option<&str>) {
        /// The most Events one batch publishes: a deleted ClusterCIDR may end thousands of holds in one
        /// pass, which must not wait on thousands of writes; the log and the metric have every one.
        const EVENTS: usize = 16;
        if ended.is_empty() {
            return;
        }
        let to = to.unwrap_or("another node");
        for (i, e) in ended.iter().enumerate() {
            let cidrs = e
                .cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let why = match e.why {
                ReleaseHoldEnd::HandedOut => format!(
                    "pool {} had nothing else free, and ending it made room for Node {to}",
                    e.pool
                ),
                ReleaseHoldEnd::NoLongerValid => format!(
                    "Node {to} came back as it, but they are no longer a valid allocation for it (its pools changed); it gets new ones"
                ),
                ReleaseHoldEnd::NodeHoldsCidr => format!(
                    "Node {to} holds one of them, as the API shows it, and what the API shows wins"
                ),
                ReleaseHoldEnd::PoolDeleted => {
                    format!("ClusterCIDR {} is being deleted", e.pool)
                }
                ReleaseHoldEnd::Replaced => format!(
                    "Node {} was deleted again, holding other CIDRs, which are held instead",
                    e.node
                ),
                ReleaseHoldEnd::Expired | ReleaseHoldEnd::GivenBack => continue,
            };
            tracing::warn!(controller = NAME, node = %e.node, cidrs, pool = %e.pool, reason = e.why.label(), why, "a release hold ended before its time");
            if i >= EVENTS {
                continue;
            }
            let note = format!(
                "The release hold (--cidr-release-hold) of pod CIDRs {cidrs} that Node {} released ended early: {why}. Routes, neighbour entries and flannel leases elsewhere may still point at {}",
                e.node, e.node
            );
            self.recorder
                .publish(
                    &held_node(&e.node),
                    EventType::Warning,
                    "CIDRReleaseHoldEnded",
                    "ReleaseCIDR",
                    note,
                )
                .await;
        }
        if ended.len() > EVENTS {
            tracing::warn!(
                controller = NAME,
                holds = ended.len(),
                events = EVENTS,
                "more release holds ended early at once than Events are published for; the log and netcm_pool_release_holds_ended_total have each"
            );
        }
        let freed = ended.iter().any(|e| {
            matches!(
                e.why,
                ReleaseHoldEnd::NoLongerValid
                    | ReleaseHoldEnd::PoolDeleted
                    | ReleaseHoldEnd::Replaced
            )
        });
        if freed {
            self.wake_waiting();
        }
    }

    /// Ends the release holds that are due; wakes the Nodes waiting for a CIDR when any ended.
    fn end_due_release_holds(&self) -> Vec<(String, Vec<IpNet>)> {
        let ended = {
            let mut state = self.state.lock();
            let pools = &mut state.pools;
            let ended = pools.end_release_holds(Instant::now());
            // Counted, their CIDRs as released, and published there; none ended early.
            self.take_ended_holds(pools);
            ended
        };
        if ended.is_empty() {
            return ended;
        }
        for (node, cidrs) in &ended {
            tracing::info!(controller = NAME, node = %node, cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(), "the release hold of a deleted node's pod CIDRs ended; they can be handed out again");
        }
        let freed: Vec<IpNet> = ended.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        self.wake_waiting_for(&freed);
        if let Some(changed) = &self.pools_changed {
            changed.notify_one();
        }
        ended
    }
}

/// What Events about the deleted Node `name` are about: the name alone (its UID is gone with it, and a
/// Node re-created under the name shows them too).
fn held_node(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// The task ending release holds on time, until `shutdown`.
pub(crate) async fn run(allocator: Arc<Allocator>, shutdown: CancellationToken) {
    loop {
        let next = allocator.state.lock().pools.next_release_hold_end();
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = allocator.release_hold_started.notified() => {}
            _ = sleep => {
                let ended = allocator.end_due_release_holds();
                allocator.forget_release_hold_records(&ended).await;
            }
        }
    }
}

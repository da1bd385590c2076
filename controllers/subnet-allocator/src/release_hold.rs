//! The release hold in the allocator (`--cidr-release-hold`; the pools keep it, `netcm_ipam`'s
//! `pools/release_hold.rs`): a deleted Node's CIDRs are held rather than released, a task ends each hold
//! on time and wakes the Nodes waiting for a CIDR, and a CIDR handed out before its hold ended gets a
//! Warning Event on the Node that received it.
//!
//! Holds outlive this leader: each is written on the PodCIDRClaim of its CIDRs' blocks
//! ([`crate::release_hold_record`]) and a new leader with the flag on restores the ones still running
//! before it hands anything out. Without claims (`--pod-cidr-claims=false`) holds live in memory only.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_ipam::ReleaseHoldUse;
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
                tracing::info!(controller = NAME, node = name, pool, released_by = %used.released_by, provider_id = node.provider_id().unwrap_or_default(), "a node that came back on the same machine (spec.providerID) under another name gets the pod CIDRs its machine held before");
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
    /// handed out. Each is checked again ([`netcm_ipam::Pools::restore_release_hold`]).
    pub(crate) fn restore_release_holds(&self, claims: &[Claim]) {
        let now = jiff::Timestamp::now();
        let mut seen = HashSet::new();
        let mut restored = 0usize;
        let mut state = self.state.lock();
        let pools = &mut state.pools;
        for claim in claims {
            let (records, unreadable) = record::parse(&claim.annotations);
            for key in unreadable {
                tracing::warn!(controller = NAME, claim = %claim.cidr, annotation = %key, "ignoring a release-hold annotation netcm cannot read");
            }
            for r in records {
                if !seen.insert(r.node.clone()) {
                    continue;
                }
                let left = now.duration_until(r.until);
                let Ok(left) = Duration::try_from(left) else {
                    continue;
                };
                if left.is_zero() {
                    continue;
                }
                let until = Instant::now() + left;
                if pools.restore_release_hold(&r.node, r.provider_id.as_deref(), &r.cidrs, until) {
                    restored += 1;
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

    /// Ends the release holds that are due; wakes the Nodes waiting for a CIDR when any ended.
    fn end_due_release_holds(&self) -> Vec<(String, Vec<IpNet>)> {
        let ended = {
            let mut state = self.state.lock();
            let pools = &mut state.pools;
            let ended = pools.end_release_holds(Instant::now());
            for (_, cidrs) in &ended {
                self.count_released(pools, cidrs);
            }
            self.publish_usage(pools);
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

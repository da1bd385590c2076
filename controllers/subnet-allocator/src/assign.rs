//! Giving a Node its CIDRs: take them from the pools, make sure each lies in a block this leader claimed
//! (a PodCIDRClaim per block of CIDRs, [`crate::blocks`]), then one PATCH of `spec.podCIDR(s)` that names
//! the Node's UID, so it can only land on the Node the CIDRs were chosen for.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use kube::api::{Patch, PatchParams};
use netcm_manager::CachedNode;
use netcm_manager::{EventType, SyncOutcome};

use crate::allocator::{Allocator, ReleaseReason, SyncError, NAME};
use crate::blocks::{block_in, FENCED_AT_ANNOTATION, QUARANTINE_OWNER, REFUSED_OWNER};
use crate::claims::{BlockClaim, ClaimError, ClaimWrite, Claims};
use crate::decision::{after_failed_write, AfterFailedWrite, FailedWrite, LiveNode};
use crate::pod_cidr_patch::{
    classify_patch_error, pod_cidr_patch, FencePrecondition, PatchFailure,
};

/// How many blocks found claimed by earlier leaders one sync steps over before it backs off.
const MAX_TAKEN_CLAIMS_PER_SYNC: usize = 16;

/// What choosing a pool needs of a Node's labels.
pub(crate) enum PoolLabels {
    /// No active pool selects by label: the cache keeps no labels and none are fetched.
    NotNeeded,
    /// The Node's labels, read from the API.
    Live(BTreeMap<String, String>),
    /// The Node is gone or was re-created: the next sync decides from the cache.
    NodeGone,
}

/// Whether the quarantine of earlier leaders' blocks may be what `e` waits on, so voiding their late
/// writes (which ends it) may let the allocation through: a full pool, or CIDRs held for the Node that
/// the quarantine reserves.
fn quarantine_may_hold_back(e: &netcm_ipam::Error) -> bool {
    match e {
        netcm_ipam::Error::Full { .. }
        | netcm_ipam::Error::NoBlockOfSize { .. }
        | netcm_ipam::Error::PoolsFull { .. } => true,
        netcm_ipam::Error::ReleaseHoldReserved { by, .. } => {
            by.iter().any(|owner| owner == QUARANTINE_OWNER)
        }
        _ => false,
    }
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
        if !self.state.lock().pools.selects_by_label() {
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
        let mut voided = false;
        // Set once the CIDRs held for this Node (it re-joins as a deleted one) turn out reserved past
        // what voiding the quarantine ends: it gets new ones, and its hold runs on.
        let mut past_hold = false;
        let mut from_quarantine;
        let cidrs = loop {
            let (allocation, ended_holds) = {
                let mut guard = self.state.lock();
                let state = &mut *guard;
                let pools = &mut state.pools;
                let view = netcm_ipam::NodeView {
                    name,
                    labels: labels.as_ref().unwrap_or(&no_labels),
                    provider_id: node.provider_id(),
                };
                // Read only here: pod CIDRs never change once set, so a later capacity change is moot.
                let pods = node.capacity_pods().map(u64::from);
                let allocate = |pools: &mut netcm_ipam::Pools| {
                    if past_hold {
                        pools.allocate_sized_past_hold(uid, &view, pods)
                    } else {
                        pools.allocate_sized_for(uid, &view, pods)
                    }
                };
                let mut a = allocate(pools);
                from_quarantine = false;
                if is_full(&a) && state.blocks.is_last_and_untouchable(name) {
                    // Its own allocation voids what its refused touch could not: the bound on how long
                    // one Node holds the quarantine for everyone (`Blocks::is_last_and_untouchable`).
                    // Released and held again under the one lock: no other Node sees the free CIDRs.
                    let ranges = state.blocks.quarantined_ranges().to_vec();
                    pools.release_node(QUARANTINE_OWNER);
                    a = allocate(pools);
                    pools.record_and_check(QUARANTINE_OWNER, &ranges);
                    from_quarantine = a.is_ok();
                }
                if let Ok(a) = &a {
                    self.metrics.allocated(&a.pool, &a.fresh);
                    self.publish_usage(pools);
                }
                let ended = self.take_ended_holds(pools);
                (a.map(|a| (a, pools.owner(uid))), ended)
            };
            self.report_ended_holds(ended_holds, Some(name)).await;
            let (allocation, owner) = match allocation {
                Ok((a, owner)) => {
                    if let Some(used) = &a.release_hold {
                        self.report_release_hold_use(node, name, &a.pool, used)
                            .await;
                    }
                    (a, owner)
                }
                // Full but for earlier leaders' blocks, or the CIDRs held for this Node lie in them: void
                // their late writes, which ends the quarantine.
                Err(e)
                    if !voided
                        && quarantine_may_hold_back(&e)
                        && self.state.lock().blocks.waiting_nodes() > 0 =>
                {
                    let was_waiting = self.quarantine_waits_for(name);
                    self.void_late_writes().await?;
                    if was_waiting && !self.quarantine_waits_for(name) {
                        // This very Node was touched after the cache handed out `node`: a PATCH tested
                        // against it would be refused. The touch's watch event syncs it again from the
                        // newer Node; this retry is only the fallback.
                        return Ok(SyncOutcome::RetryAfter(Duration::from_secs(1)));
                    }
                    voided = true;
                    continue;
                }
                // Reserved past the quarantine (a block refused this term, or touches refused): new
                // CIDRs now rather than a wait of unknown length; the hold is not handed to another.
                Err(netcm_ipam::Error::ReleaseHoldReserved {
                    released_by, by, ..
                }) => {
                    tracing::info!(controller = NAME, node = name, released_by = %released_by, reserved_by = ?by, "the pod CIDRs held for this node are reserved; it gets new ones, and its release hold runs on");
                    past_hold = true;
                    continue;
                }
                Err(
                    e @ (netcm_ipam::Error::Full { .. }
                    | netcm_ipam::Error::NoBlockOfSize { .. }
                    | netcm_ipam::Error::PoolsFull { .. }
                    | netcm_ipam::Error::NoPool { .. }),
                ) => {
                    if let Some(labels) = &labels {
                        self.state
                            .lock()
                            .waiting_labels
                            .insert(name.to_string(), labels.clone());
                    }
                    return Err(self.wait_for_cidr(node, name, e).await);
                }
                Err(e) => return Err(SyncError::NoCidrAvailable(e)),
            };
            self.state
                .lock()
                .tracking
                .track(name, owner.unwrap_or_else(|| uid.into()));
            let Some(claims) = &self.claims else {
                break allocation.cidrs;
            };
            match self
                .claim_blocks(claims, &allocation.cidrs, from_quarantine)
                .await?
            {
                None => {
                    self.request_claim_ahead(&allocation.cidrs);
                    break allocation.cidrs;
                }
                Some(block) => {
                    taken += 1;
                    tracing::info!(controller = NAME, node = name, block = %block, "an earlier leader claimed this block; choosing a CIDR elsewhere until it is usable");
                    self.release(name, uid, ReleaseReason::BlockClaimedEarlier)
                        .await?;
                    if taken >= MAX_TAKEN_CLAIMS_PER_SYNC {
                        return Err(SyncError::ClaimsExhausted(taken));
                    }
                }
            }
        };
        self.write(node, name, uid, &cidrs).await
    }

    /// Makes sure every CIDR lies in a block this leader may use, claiming blocks it has not yet; returns
    /// a block found claimed while earlier leaders' blocks are quarantined (now quarantined too).
    /// `from_quarantine`: the CIDRs were taken from the quarantine for the last Node it waits for, whose
    /// touch was refused, and their quarantined blocks are adopted.
    async fn claim_blocks(
        &self,
        claims: &Claims,
        cidrs: &[IpNet],
        from_quarantine: bool,
    ) -> Result<Option<IpNet>, SyncError> {
        for cidr in cidrs {
            let block = {
                let mut state = self.state.lock();
                let block = block_in(&state.pools, *cidr);
                if from_quarantine {
                    state.blocks.open_for_last_untouchable(&block);
                }
                block
            };
            if let Some(quarantined) = self.claim_block(claims, block, from_quarantine).await? {
                return Ok(Some(quarantined));
            }
        }
        Ok(None)
    }

    /// Makes `block` usable by this leader unless it is already: adopts its claim when it was listed and no
    /// earlier write can land in it, else creates it, or finds it existing (then, while earlier leaders'
    /// blocks are quarantined, it joins the quarantine and is returned; else it is adopted). Workers and
    /// the claim-ahead task both come through here. `from_quarantine`: see [`Allocator::claim_blocks`]; a
    /// block found claimed is adopted then, not quarantined.
    pub(crate) async fn claim_block(
        &self,
        claims: &Claims,
        block: IpNet,
        from_quarantine: bool,
    ) -> Result<Option<IpNet>, SyncError> {
        if self.state.lock().blocks.is_usable(&block) {
            return Ok(None);
        }
        // One create per block: a second worker's create of the same block would find it existing.
        let _creating = self.block_create.lock().await;
        if self.state.lock().blocks.is_usable(&block) {
            return Ok(None);
        }
        self.guard.ensure_leader()?;
        let adoptable = self.state.lock().blocks.is_adoptable(&block);
        if adoptable {
            match self.adopt(claims, block).await? {
                ClaimWrite::Landed => return Ok(None),
                // Deleted since it was listed (by hand): created again below.
                ClaimWrite::NotLanded => self.state.lock().blocks.claim_gone(&block),
                ClaimWrite::Refused => return Ok(Some(self.refuse_block(block))),
            }
        }
        self.guard.ensure_leader()?;
        match claims.claim_block(&block, &self.term).await? {
            BlockClaim::Created => {
                self.state.lock().blocks.taken_into_use(block);
                tracing::info!(controller = NAME, block = %block, "claimed a block of pod CIDRs");
            }
            BlockClaim::Existed => {
                {
                    let mut guard = self.state.lock();
                    let state = &mut *guard;
                    let quarantined = if from_quarantine {
                        None
                    } else {
                        state.blocks.found_existing(block)
                    };
                    if let Some(quarantined) = quarantined {
                        state.pools.record_and_check(QUARANTINE_OWNER, quarantined);
                        self.publish_usage(&state.pools);
                        return Ok(Some(block));
                    }
                }
                match self.adopt(claims, block).await? {
                    ClaimWrite::Landed => {}
                    // Deleted between the create and the adoption: the next sync claims it afresh.
                    ClaimWrite::NotLanded => {
                        return Err(SyncError::Claim(ClaimError::Vanished(block)))
                    }
                    ClaimWrite::Refused => return Ok(Some(self.refuse_block(block))),
                }
            }
        }
        Ok(None)
    }

    /// Takes a claim this leader did not create, or marked idle, into its term ([`Claims::adopt`], testing
    /// it is as this leader last knew it) and makes its block usable.
    async fn adopt(&self, claims: &Claims, block: IpNet) -> Result<ClaimWrite, SyncError> {
        let known = self.state.lock().blocks.adoption_test(&block).cloned();
        let (named, idle_since) = known.map_or((None, None), |k| (k.term, k.idle_since));
        let adopted = claims
            .adopt(&block, &self.term, named.as_deref(), idle_since.as_deref())
            .await?;
        if adopted == ClaimWrite::Landed {
            self.state.lock().blocks.taken_into_use(block);
            // Under churn a leader re-adopts blocks it marked idle itself many times; saying "an earlier
            // leader's" then would send an operator looking for a leader change that never happened.
            if named.as_deref() == Some(&*self.term) {
                tracing::info!(controller = NAME, block = %block, "took a block of pod CIDRs this leader had marked idle back into use");
            } else {
                tracing::info!(controller = NAME, block = %block, "took an earlier leader's block of pod CIDRs into use");
            }
        }
        Ok(adopted)
    }

    /// The claim of `block` was written by another term since this leader knew it: a leader that should no
    /// longer be writing is, so the block is left to it for the rest of this term (its free CIDRs held);
    /// returns the block, for the worker to choose elsewhere.
    pub(crate) fn refuse_block(&self, block: IpNet) -> IpNet {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let refused = state.blocks.refused(block);
        state.pools.record_and_check(REFUSED_OWNER, refused);
        self.publish_usage(&state.pools);
        tracing::warn!(controller = NAME, block = %block, "another term wrote this block's claim after this leader listed or marked it; its free CIDRs are not used in this term");
        block
    }

    /// The one PATCH of the allocation, and what its failure means.
    async fn write(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
        chosen: &[IpNet],
    ) -> Result<SyncOutcome, SyncError> {
        let cidrs: Vec<String> = chosen.iter().map(ToString::to_string).collect();
        self.guard.ensure_leader()?;
        let patch: json_patch::Patch =
            serde_json::from_value(pod_cidr_patch(uid, FencePrecondition::of(node), &cidrs))
                .map_err(SyncError::BuildPatch)?;
        let Some(mut in_flight) = self.write_in_flight(chosen) else {
            // A block of these CIDRs was marked idle since they were chosen: claimed again first.
            return Ok(SyncOutcome::RetryAfter(Duration::ZERO));
        };
        let result = netcm_manager::client::unread::patch_unread(
            &self.api,
            name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await;
        in_flight.answered = result.as_ref().map_or_else(
            |e| classify_patch_error(e) != PatchFailure::Transient,
            |_| true,
        );
        drop(in_flight);
        let e = match result {
            Ok(_) => {
                self.mark_written(name, uid);
                self.settle_written(name, uid);
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
            PatchFailure::Gone => {
                tracing::info!(controller = NAME, node = name, error = %e, "node is gone; released its allocation");
                self.release(name, uid, ReleaseReason::NodeGone).await?;
                Ok(SyncOutcome::RetryAfter(Duration::from_secs(1)))
            }
            PatchFailure::Conflict => {
                self.failed_write(node, name, uid, &cidrs, FailedWrite::Conflict, e)
                    .await
            }
            PatchFailure::Rejected => {
                self.failed_write(node, name, uid, &cidrs, FailedWrite::Refused, e)
                    .await
            }
            PatchFailure::Transient => {
                // The allocation and its claims stay recorded for this Node, so the retry writes the same
                // CIDRs and nothing leaks: a Node that disappears releases them.
                self.assignment_failed(node, name, &e.to_string()).await;
                Err(SyncError::Patch(e))
            }
        }
    }

    /// Settles in the quarantine a Node this leader's PATCH gave pod CIDRs: they are in the ledger, and
    /// the API server refuses any change of pod CIDRs once set, so no earlier leader's write can land on
    /// it. Without this the Node would wait for its watch event, queued behind the whole backlog, and a
    /// leader that ran out of free CIDRs would touch every Node it had just written.
    fn settle_written(&self, name: &str, uid: &str) {
        self.settle_quarantine(name, Some(uid), true);
    }

    /// Counts an allocation PATCH with `cidrs` against their blocks until it is answered; `None` when a
    /// block is no longer usable (its idle mark was taken since the CIDRs were chosen).
    fn write_in_flight(&self, cidrs: &[IpNet]) -> Option<WriteInFlight<'_>> {
        let blocks: Vec<IpNet> = if self.claims.is_some() {
            let mut state = self.state.lock();
            let blocks: Vec<IpNet> = cidrs.iter().map(|c| block_in(&state.pools, *c)).collect();
            if !state.blocks.write_started(&blocks) {
                return None;
            }
            blocks
        } else {
            Vec::new()
        };
        Some(WriteInFlight {
            allocator: self,
            blocks,
            answered: false,
        })
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

    /// The API refused the write (or it conflicted): the Node as the API shows it now decides, before
    /// anything is released. It may hold the very CIDRs chosen — an earlier attempt landed although its
    /// answer was lost — and then they stay recorded: released, they would be free to hand out while the
    /// Node holds them. Else give the CIDRs back (metrics stay consistent) and, when nothing else explains
    /// the refusal, tell the Node why and let the workqueue back off per key.
    async fn failed_write(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
        cidrs: &[String],
        failure: FailedWrite,
        e: kube::Error,
    ) -> Result<SyncOutcome, SyncError> {
        let live = match self.api.get_opt(name).await {
            Ok(live) => live,
            Err(read) => {
                // Whether an earlier attempt landed is unknown: the allocation stays recorded (nothing
                // leaks, nothing is handed out twice) and the sync is retried with backoff.
                tracing::warn!(controller = NAME, node = name, error = %e, read_error = %read, "the pod CIDR write failed and the node could not be read; keeping the allocation and retrying");
                return Err(SyncError::Patch(e));
            }
        };
        let facts = live.as_ref().map(|n| {
            let annotations = n.metadata.annotations.as_ref();
            let live_fence = FencePrecondition {
                has_annotations: annotations.is_some_and(|a| !a.is_empty()),
                fenced_at: annotations
                    .and_then(|a| a.get(FENCED_AT_ANNOTATION))
                    .map(String::as_str),
            };
            LiveNode {
                uid: n.metadata.uid.clone().unwrap_or_default(),
                pod_cidrs: netcm_node::raw_pod_cidrs(n),
                fence_moved: live_fence != FencePrecondition::of(node),
            }
        });
        let after = after_failed_write(failure, facts.as_ref(), uid, cidrs);
        if after != AfterFailedWrite::Written {
            self.release(name, uid, ReleaseReason::WriteNotLanded)
                .await?;
        }
        let retry = match after {
            AfterFailedWrite::Written => {
                self.mark_written(name, uid);
                self.settle_written(name, uid);
                tracing::info!(controller = NAME, node = name, cidrs = %cidrs.join(","), error = %e, "the node holds the pod CIDRs chosen for it: an earlier attempt landed; they stay recorded");
                return Ok(SyncOutcome::Done);
            }
            AfterFailedWrite::NodeGone => {
                tracing::info!(
                    controller = NAME,
                    node = name,
                    "node was deleted or re-created during the write; released its allocation"
                );
                Duration::from_millis(200)
            }
            AfterFailedWrite::OtherCidrs => {
                tracing::info!(
                    controller = NAME,
                    node = name,
                    "node got pod CIDRs from elsewhere; released ours"
                );
                Duration::from_secs(1)
            }
            AfterFailedWrite::FenceMoved => {
                // The test of the fence failed: a leader touched the Node (or its first annotation came)
                // after the cache saw it. The watch brings the newer Node, and the next sync writes again.
                tracing::info!(controller = NAME, node = name, "the node's fence changed since the cache saw it; released our CIDRs and retrying");
                Duration::from_secs(1)
            }
            AfterFailedWrite::Retry => {
                tracing::info!(controller = NAME, node = name, error = %e, "the write conflicted; released its allocation and retrying");
                Duration::from_secs(1)
            }
            AfterFailedWrite::Refused => {
                let message = match &e {
                    kube::Error::Api(s) => s.message.clone(),
                    other => other.to_string(),
                };
                tracing::warn!(controller = NAME, node = name, cidrs = %cidrs.join(","), error = %message, "the API server rejected the pod CIDRs; released them, retrying with backoff");
                self.assignment_failed(node, name, &message).await;
                return Err(SyncError::Rejected {
                    cidrs: cidrs.join(","),
                    message,
                });
            }
        };
        Ok(SyncOutcome::RetryAfter(retry))
    }
}

/// Whether an allocation failed only because no free CIDR is left for the Node.
fn is_full<T>(allocation: &Result<T, netcm_ipam::Error>) -> bool {
    matches!(
        allocation,
        Err(netcm_ipam::Error::Full { .. }
            | netcm_ipam::Error::NoBlockOfSize { .. }
            | netcm_ipam::Error::PoolsFull { .. })
    )
}

/// An allocation PATCH on its way. Dropped unanswered — a timeout, a 5xx, or the drain cutting its sync
/// short — it leaves its blocks uncertain: it may still land, so this term never marks them idle.
struct WriteInFlight<'a> {
    allocator: &'a Allocator,
    blocks: Vec<IpNet>,
    /// The PATCH landed or was refused for good.
    answered: bool,
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            self.allocator
                .state
                .lock()
                .blocks
                .write_ended(&self.blocks, self.answered);
        }
    }
}

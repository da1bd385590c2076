//! What a new leader does with the PodCIDRClaims earlier leaders left, before its first allocation: the
//! claimed ranges are usable at once when no Node is waiting for pod CIDRs, else their free CIDRs are
//! quarantined until every waiting Node is settled ([`crate::blocks`] says why that is enough) — or, when
//! no free CIDR is left outside them, touched. Claims a leader marked idle when it stepped down are never
//! quarantined.

use std::collections::HashMap;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use netcm_manager::supervision::ControllerHealth;
use netcm_manager::{CachedNode, EventType, Prepared};

use crate::allocator::{Allocator, SyncError, NAME};
use crate::blocks::{Blocks, ListedBlock, QUARANTINE_OWNER};
use crate::claims::{ClaimError, Claims};
use crate::pod_cidr_patch::{classify_patch_error, fence_touch, PatchFailure};
use crate::start_lists::FailingList;

/// How many Nodes of the quarantine are touched at once.
pub(crate) const CONCURRENT_TOUCHES: usize = 32;

impl Allocator {
    /// Lists the claims (retrying until it works or `shutdown` fires) and starts this leader's blocks.
    /// While the CRD is missing, `readiness` (this controller's `/readyz` check) fails with the same
    /// reason the log gives, and nothing is allocated: claims are what keep two leaders apart. Any other
    /// failure does the same and, past a bound, fails the replica ([`crate::start_lists`]): a standby has
    /// the same missing CRD, but not necessarily the same broken API server.
    pub(crate) async fn reconcile_claims(
        &self,
        claims: &Claims,
        readiness: &ControllerHealth,
        shutdown: &CancellationToken,
    ) -> Prepared {
        let mut delay = Duration::from_millis(500);
        let mut failing = FailingList::new(
            "PodCIDRClaims",
            readiness,
            self.metrics
                .start_list_failures
                .with_label_values(&["podcidrclaims"]),
        );
        let list = loop {
            match claims.list().await {
                Ok(list) => {
                    readiness.clear();
                    failing.succeeded();
                    break list;
                }
                Err(e @ ClaimError::NotInstalled) => {
                    let reason = format!("cannot allocate pod CIDRs: {e}");
                    tracing::error!(controller = NAME, error = %e, "cannot allocate until PodCIDRClaims can be listed");
                    readiness.set_broken(reason);
                }
                Err(e) => {
                    if let Err(reason) = failing.failed(&e) {
                        return Prepared::Failed(reason);
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Prepared::ShutDown,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        };
        // Before the quarantine, which may cover the held CIDRs of earlier leaders' blocks.
        if !self.release_hold.is_zero() {
            self.restore_release_holds(&list);
        }
        // Only the leader right before this one vouches for an idle mark (`None`: unknown, none trusted).
        let takeover = self.guard.takeover();
        let predecessor = takeover.as_deref().and_then(|t| t.previous_identity());
        let listed: Vec<ListedBlock> = list
            .iter()
            .map(|c| ListedBlock {
                range: c.cidr,
                term: c.term().map(Box::from),
                idle: c.is_idle_by(predecessor),
                idle_since: c.idle_since().map(Box::from),
            })
            .collect();
        let untrusted =
            list.iter().filter(|c| c.is_idle()).count() - listed.iter().filter(|b| b.idle).count();
        if untrusted > 0 {
            tracing::info!(
                controller = NAME,
                claims = untrusted,
                predecessor = predecessor.unwrap_or("unknown"),
                "idle marks of a term other than the leader right before this one are not trusted: a leader in between may have used those blocks without a trace, so they are quarantined like open claims"
            );
        }
        let idle = listed.iter().filter(|b| b.idle).count();
        let waiting = self.record_and_find_waiting(idle < listed.len()).await;
        let blocks = Blocks::start(listed, waiting);
        let waiting_nodes = blocks.waiting_nodes();
        {
            let mut state = self.state.lock();
            let quarantined = blocks.quarantined_ranges();
            if !quarantined.is_empty() {
                state.pools.record_and_check(QUARANTINE_OWNER, quarantined);
            }
            self.publish_usage(&state.pools);
            state.blocks = blocks;
        }
        self.metrics.quarantine_nodes.set(waiting_nodes as i64);
        if waiting_nodes > 0 {
            tracing::info!(
                controller = NAME,
                claims = list.len(),
                idle_claims = idle,
                waiting_nodes,
                "earlier leaders' open claimed blocks keep their free CIDRs until every node that was waiting for pod CIDRs has them or is gone: one of those leaders may still have a write on its way"
            );
        } else if list.is_empty() {
            tracing::info!(
                controller = NAME,
                "no PodCIDRClaims yet: nothing an earlier leader may still be writing from"
            );
        } else {
            tracing::info!(
                controller = NAME,
                claims = list.len(),
                idle_claims = idle,
                "earlier leaders' claimed blocks are usable: no node is waiting for pod CIDRs, or they stepped down with every write answered"
            );
        }
        Prepared::Ready
    }

    /// One snapshot of the cache decides both what the ledger holds and which Nodes the quarantine waits
    /// for (`quarantine`: only with open claims to protect; at a first start with a backlog every Node
    /// is waiting). The ledger was filled from an earlier snapshot, before the claims list, which may
    /// retry for seconds: an earlier leader's write the watch brought in between would be in neither —
    /// its Node not waiting, its CIDR free once the quarantine ends, until that Node's own key syncs. So
    /// every Node of this snapshot with pod CIDRs not recorded yet is recorded now, and a write landing
    /// after it finds its Node waiting.
    async fn record_and_find_waiting(&self, quarantine: bool) -> HashMap<Box<str>, Box<str>> {
        let mut waiting = HashMap::new();
        for node in self.nodes.list() {
            let (name, uid) = (node.name(), node.uid());
            if node.raw_pod_cidrs().next().is_none() {
                if quarantine {
                    waiting.insert(name.into(), uid.into());
                }
                continue;
            }
            let recorded = self.state.lock().tracking.recorded(name).uid;
            if recorded.as_deref() != Some(uid) {
                let raw: Vec<String> = node.raw_pod_cidrs().map(str::to_string).collect();
                tracing::info!(controller = NAME, node = name, cidrs = %raw.join(","), "a node got pod CIDRs after the first record and before the quarantine started; recorded");
                self.record_existing(&node, name, uid, &raw).await;
            }
        }
        waiting
    }

    /// Settles Node `name` in the quarantine from what the cache shows; ends the quarantine with the last.
    /// Every sync calls it: without a quarantine it only takes the lock.
    pub(crate) fn settle_quarantine(&self, name: &str, uid: Option<&str>, has_cidrs: bool) {
        let ended = {
            let mut state = self.state.lock();
            if state.blocks.waiting_nodes() == 0 {
                return;
            }
            state.blocks.settle(name, uid, has_cidrs)
        };
        self.after_settling(ended);
    }

    /// Whether the quarantine still waits for Node `name` (a scan: only a sync that found no free CIDR
    /// outside the quarantine asks).
    pub(crate) fn quarantine_waits_for(&self, name: &str) -> bool {
        self.state
            .lock()
            .blocks
            .waiting()
            .iter()
            .any(|(n, _)| n == name)
    }

    /// Touches every Node the quarantine waits for, so no earlier leader's PATCH can land on it any more
    /// (each tests the fence annotation as its cache saw it), and so ends the quarantine: for when no free
    /// CIDR is left outside it. One write per waiting Node, once per term at most.
    ///
    /// An earlier write may have landed before the touch: the touch's answer is the Node as it is now,
    /// and its pod CIDRs are recorded before the Node counts as voided — else the last touch would free
    /// the quarantine's ranges with that CIDR in them, for another worker to hand out. A Node whose touch
    /// the API refuses for good (an admission policy, the annotation size limit) and which still has no
    /// pod CIDRs is not voided: the quarantine keeps waiting for it until it has CIDRs or is gone — and,
    /// once it is the last Node waiting, its own sync gives it CIDRs of the quarantine
    /// ([`crate::blocks::Blocks::is_last_and_untouchable`]), so it cannot hold the quarantine for others.
    pub(crate) async fn void_late_writes(&self) -> Result<(), SyncError> {
        let _one_pass = self.voiding.lock().await;
        let waiting = self.state.lock().blocks.waiting();
        if waiting.is_empty() {
            return Ok(());
        }
        tracing::info!(
            controller = NAME,
            nodes = waiting.len(),
            "no free CIDR outside earlier leaders' blocks: touching the nodes one of them may still be writing to, which voids its late writes"
        );
        let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
        // Every worker that finds no free CIDR waits for this pass: one touch at a time, 30,000 waiting
        // Nodes took minutes; the API server takes a few dozen at once.
        for chunk in waiting.chunks(CONCURRENT_TOUCHES) {
            self.guard.ensure_leader()?;
            let touched = futures::future::join_all(
                chunk
                    .iter()
                    .map(|(name, uid)| self.void_late_writes_to(name, uid, &stamp)),
            )
            .await;
            touched.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        Ok(())
    }

    /// Touches one Node the quarantine waits for and, unless the API refused it for good, settles it —
    /// after recording any pod CIDRs the touch's answer shows, so the last Node settled never frees the
    /// quarantine's ranges with such a CIDR in them.
    async fn void_late_writes_to(
        &self,
        name: &str,
        uid: &str,
        stamp: &str,
    ) -> Result<(), SyncError> {
        match self.touch(name, uid, stamp).await? {
            Touch::Answered(node) => self.record_touched(name, uid, &node).await,
            Touch::Gone => {}
            Touch::Refused(node, e) => {
                self.touch_refused(name, &node, &e).await;
                return Ok(());
            }
        }
        let ended = self.state.lock().blocks.voided(name);
        self.after_settling(ended);
        Ok(())
    }

    /// One touch: the fence annotation set to `stamp`, testing the Node's UID.
    pub(crate) async fn touch(
        &self,
        name: &str,
        uid: &str,
        stamp: &str,
    ) -> Result<Touch, SyncError> {
        let patch = fence_touch(uid, stamp);
        let e = match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            // The touch tests the UID: an answer for another Node is no answer for this one.
            Ok(node) if node.metadata.uid.as_deref() == Some(uid) => {
                return Ok(Touch::Answered(Box::new(node)))
            }
            Ok(_) => return Ok(Touch::Gone),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Touch::Gone),
            Err(e) if classify_patch_error(&e) == PatchFailure::Rejected => e,
            Err(e) => return Err(SyncError::VoidLateWrites(e)),
        };
        // A changed UID is refused with 422, and so is a touch an admission policy or the annotation size
        // limit refuses: only the live Node tells them apart.
        match self.api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid.as_deref() == Some(uid) => {
                if netcm_node::raw_pod_cidrs(&live).is_empty() {
                    Ok(Touch::Refused(Box::new(live), e))
                } else {
                    // Pod CIDRs never change once set: nothing else can land on it.
                    Ok(Touch::Answered(Box::new(live)))
                }
            }
            Ok(_) => Ok(Touch::Gone),
            Err(read) => Err(SyncError::VoidLateWrites(read)),
        }
    }

    /// Records the pod CIDRs a touched Node holds (an earlier leader's write landed before the touch).
    /// The cache may not show them yet, so the Node is marked written (no sync writes it meanwhile), and its
    /// key is queued, so a sync from the cache releases the record if the Node is gone by now.
    pub(crate) async fn record_touched(&self, name: &str, uid: &str, node: &Node) {
        let raw = netcm_node::raw_pod_cidrs(node);
        if raw.is_empty() {
            return;
        }
        tracing::info!(controller = NAME, node = name, cidrs = %raw.join(","), "a node the quarantine waited for holds pod CIDRs an earlier leader wrote; recorded");
        self.record_existing(&CachedNode::from(node), name, uid, &raw)
            .await;
        self.mark_written(name, uid);
        self.queue.add(name.to_string().into());
    }

    /// The API refused a touch for good: the Node stays in the quarantine, and it says why. Its key is
    /// queued: once it is the last Node the quarantine waits for, its own sync gives it CIDRs of the
    /// quarantine, which voids what the touch could not ([`crate::blocks::Blocks::is_last_and_untouchable`]).
    async fn touch_refused(&self, name: &str, node: &Node, e: &kube::Error) {
        {
            let mut state = self.state.lock();
            state.blocks.touch_refused(name);
            self.metrics
                .quarantine_touch_refused
                .set(state.blocks.touch_refused_nodes() as i64);
        }
        self.queue.add(name.to_string().into());
        self.say_touch_refused(
            name,
            node,
            e,
            "CIDRQuarantineTouchRefused",
            "it is given pod CIDRs of earlier leaders' claimed blocks before any other node once it is the last node they wait for; until then they stay quarantined",
        )
        .await;
    }

    /// A touch of Node `name` refused for good (`e`): a warning and a Warning Event with `reason`, saying
    /// what stays held meanwhile (`held`).
    pub(crate) async fn say_touch_refused(
        &self,
        name: &str,
        node: &Node,
        e: &kube::Error,
        reason: &str,
        held: &str,
    ) {
        let message = match e {
            kube::Error::Api(s) => s.message.clone(),
            other => other.to_string(),
        };
        tracing::warn!(controller = NAME, node = name, error = %message, reason, "the API refused to touch a node an earlier leader may still be writing to: {held}");
        let note = format!("node {name} could not be touched ({message}); {held}");
        self.recorder
            .publish(
                &CachedNode::from(node).object_ref(),
                EventType::Warning,
                reason,
                "VoidLateWrites",
                note,
            )
            .await;
    }

    /// Publishes how many Nodes the quarantine waits for; when it has `ended`, frees its ranges.
    fn after_settling(&self, ended: Option<Vec<IpNet>>) {
        {
            let state = self.state.lock();
            self.metrics
                .quarantine_nodes
                .set(state.blocks.waiting_nodes() as i64);
            self.metrics
                .quarantine_touch_refused
                .set(state.blocks.touch_refused_nodes() as i64);
        }
        let Some(ranges) = ended else {
            return;
        };
        {
            let mut state = self.state.lock();
            state.pools.release_node(QUARANTINE_OWNER);
            self.publish_usage(&state.pools);
        }
        tracing::info!(
            controller = NAME,
            ranges = ranges.len(),
            "every node an earlier leader may have been writing to is settled: its claimed blocks are usable"
        );
        self.wake_waiting();
    }
}

/// What touching one Node of the quarantine found.
pub(crate) enum Touch {
    /// The Node as the API answered the touch (or, refused, as it is with pod CIDRs): no earlier write
    /// can land on it any more.
    Answered(Box<Node>),
    /// The Node is gone or was re-created: nothing of the Node the quarantine waited for can land.
    Gone,
    /// The API refused the touch for good and the Node (same UID) still has no pod CIDRs.
    Refused(Box<Node>, kube::Error),
}

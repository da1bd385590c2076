//! What a new leader does with the PodCIDRClaims earlier leaders left, before its first allocation: the
//! claimed ranges are usable at once when no Node is waiting for pod CIDRs, else their free CIDRs are
//! quarantined until every waiting Node is settled ([`crate::blocks`] says why that is enough) — or, when
//! no free CIDR is left outside them, touched.

use std::collections::HashMap;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use kube::api::{Patch, PatchParams};

use crate::allocator::{lock, Allocator, SyncError, NAME};
use crate::blocks::{Blocks, FENCED_AT_ANNOTATION, QUARANTINE_OWNER};
use crate::claims::{ClaimError, Claims};

impl Allocator {
    /// Lists the claims (retrying until it works or `shutdown` fires) and starts this leader's blocks.
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
        let ranges: Vec<IpNet> = list.iter().map(|c| c.cidr).collect();
        // Only with claims to protect: at a first start with a backlog every Node is waiting.
        let waiting: HashMap<Box<str>, Box<str>> = if ranges.is_empty() {
            HashMap::new()
        } else {
            self.nodes
                .list()
                .iter()
                .filter(|n| n.raw_pod_cidrs().next().is_none())
                .map(|n| (n.name().into(), n.uid().into()))
                .collect()
        };
        let blocks = Blocks::start(ranges, waiting);
        let waiting_nodes = blocks.waiting_nodes();
        {
            let mut pools = lock(&self.pools);
            let quarantined = blocks.quarantined_ranges();
            if !quarantined.is_empty() {
                pools.hold(QUARANTINE_OWNER, quarantined);
            }
            self.publish_usage(&pools);
        }
        *lock(&self.blocks) = blocks;
        self.metrics.quarantine_nodes.set(waiting_nodes as i64);
        if waiting_nodes > 0 {
            tracing::info!(
                controller = NAME,
                claims = list.len(),
                waiting_nodes,
                "earlier leaders' claimed blocks keep their free CIDRs until every node that was waiting for pod CIDRs has them or is gone: one of those leaders may still have a write on its way"
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
                "no node is waiting for pod CIDRs: earlier leaders' claimed blocks are usable"
            );
        }
        true
    }

    /// Settles Node `name` in the quarantine from what the cache shows; ends the quarantine with the last.
    /// Every sync calls it: without a quarantine it only takes the lock.
    pub(crate) fn settle_quarantine(&self, name: &str, uid: Option<&str>, has_cidrs: bool) {
        let ended = {
            let mut blocks = lock(&self.blocks);
            if blocks.waiting_nodes() == 0 {
                return;
            }
            blocks.settle(name, uid, has_cidrs)
        };
        self.after_settling(ended);
    }

    /// Touches every Node the quarantine waits for, so no earlier leader's PATCH can land on it any more
    /// (each names the resourceVersion it was decided on), and so ends the quarantine: for when no free
    /// CIDR is left outside it. One write per waiting Node, once per term at most.
    pub(crate) async fn void_late_writes(&self) -> Result<(), SyncError> {
        let _one_pass = self.voiding.lock().await;
        let waiting = lock(&self.blocks).waiting();
        if waiting.is_empty() {
            return Ok(());
        }
        tracing::info!(
            controller = NAME,
            nodes = waiting.len(),
            "no free CIDR outside earlier leaders' blocks: touching the nodes one of them may still be writing to, which voids its late writes"
        );
        let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
        for (name, uid) in waiting {
            self.guard.ensure_leader()?;
            let patch = serde_json::json!({
                "metadata": { "uid": uid, "annotations": { FENCED_AT_ANNOTATION: stamp } }
            });
            match netcm_manager::client::unread::patch_unread(
                &self.api,
                &name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            {
                Ok(_) => {}
                // Gone, or re-created (a changed uid is refused): nothing of the old Node can land.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {}
                Err(e) => return Err(SyncError::VoidLateWrites(e)),
            }
            let ended = lock(&self.blocks).voided(&name);
            self.after_settling(ended);
        }
        Ok(())
    }

    /// Publishes how many Nodes the quarantine waits for; when it has `ended`, frees its ranges.
    fn after_settling(&self, ended: Option<Vec<IpNet>>) {
        self.metrics
            .quarantine_nodes
            .set(lock(&self.blocks).waiting_nodes() as i64);
        let Some(ranges) = ended else {
            return;
        };
        {
            let mut pools = lock(&self.pools);
            pools.release_node(QUARANTINE_OWNER);
            self.publish_usage(&pools);
        }
        tracing::info!(
            controller = NAME,
            ranges = ranges.len(),
            "every node an earlier leader may have been writing to is settled: its claimed blocks are usable"
        );
        self.wake_waiting();
    }
}

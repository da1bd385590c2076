//! The release hold in the allocator (`--cidr-release-hold`; the pools keep it, `netcm_ipam`'s
//! `pools_release_hold.rs`): a deleted Node's CIDRs are held rather than released, a task ends each hold
//! on time and wakes the Nodes waiting for a CIDR, and a CIDR handed out before its hold ended gets a
//! Warning Event on the Node that received it.
//!
//! A hold lives in this leader's memory: a new leader starts without the holds of the one before it,
//! and the CIDRs they kept are free to it at once, as without the flag.

use std::sync::Arc;
use std::time::Instant;

use netcm_ipam::ReleaseHoldUse;
use netcm_manager::{CachedNode, EventType};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, SyncError, NAME};

impl Allocator {
    /// Releases what a deleted (or re-created) Node held: into the release hold when one is configured.
    pub(crate) async fn release_deleted(&self, name: &str, uid: &str) -> Result<(), SyncError> {
        let held_until = (!self.release_hold.is_zero()).then(|| Instant::now() + self.release_hold);
        self.release_until(name, uid, held_until).await
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
            tracing::info!(
                controller = NAME,
                node = name,
                pool,
                "a node that came back under its name gets the pod CIDRs it held before"
            );
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

    /// Ends the release holds that are due; wakes the Nodes waiting for a CIDR when any ended.
    fn end_due_release_holds(&self) {
        let ended = {
            let mut pools = self.pools.lock();
            let ended = pools.end_release_holds(Instant::now());
            for (_, cidrs) in &ended {
                self.count_released(&pools, cidrs);
            }
            self.publish_usage(&pools);
            ended
        };
        if ended.is_empty() {
            return;
        }
        for (node, cidrs) in &ended {
            tracing::info!(controller = NAME, node = %node, cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(), "the release hold of a deleted node's pod CIDRs ended; they can be handed out again");
        }
        self.wake_waiting();
        if let Some(cc) = &self.cluster_cidrs {
            cc.changed.notify_one();
        }
    }
}

/// The task ending release holds on time, until `shutdown`.
pub(crate) async fn run(allocator: Arc<Allocator>, shutdown: CancellationToken) {
    loop {
        let next = allocator.pools.lock().next_release_hold_end();
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = allocator.release_hold_started.notified() => {}
            _ = sleep => allocator.end_due_release_holds(),
        }
    }
}

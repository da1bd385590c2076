//! subnet-allocator: gives every Node its pod CIDR(s) from the cluster CIDR(s), like
//! kube-controller-manager's nodeipam range allocator, and never hands one CIDR to two Nodes.
//!
//! Watches Nodes through the manager's shared informer; writes only `spec.podCIDR` and `spec.podCIDRs`
//! (one strategic-merge PATCH per Node, behind the leader fence, naming the Node's UID), after claiming
//! each CIDR with a PodCIDRClaim object named after it ([`claims`]), so two leaders can never both give
//! out one CIDR. Before the first allocation it records every CIDR any Node holds and reconciles the
//! claims earlier leaders left; records are keyed by Node UID, and a Node's CIDRs are released only when
//! that Node (that UID) is gone. Bad
//! data (unparsable, out-of-range or overlapping pod CIDRs) becomes a Warning Event and a metric, never a
//! crash, and nothing overlapping it is ever handed out. The CIDR arithmetic lives in `netcm-ipam`.
//!
//! Start reading at [`allocator::Allocator::sync_node`].

pub mod allocator;
mod assign;
pub mod claims;
mod decision;
pub mod flags;
pub mod metrics;
mod startup;

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::Api;
use netcm_ipam::Pools;
use netcm_manager::{
    Controller, ControllerDescriptor, InitContext, InitError, InitResult, Prepared,
};
use parking_lot::Mutex;

pub use allocator::{Allocator, NAME};
pub use flags::Flags;

/// The registry entry: the allocator under its name and KCM's.
pub fn descriptor(flags: Flags) -> ControllerDescriptor {
    ControllerDescriptor::new(NAME, &["nodeipam", "node-ipam-controller"], flags)
}

/// Builds the allocator, or `None` with `--allocate-node-cidrs=false`. Before its workers start it
/// records every CIDR the cached Nodes hold and reconciles the claims earlier leaders left.
fn init(flags: &Flags, ctx: &InitContext) -> InitResult {
    let Some(config) = flags.config().map_err(InitError::new)? else {
        return Ok(None);
    };
    let pools = Pools::new(&config).map_err(InitError::new)?;
    let metrics = metrics::AllocatorMetrics::register(&ctx.registry).map_err(InitError::new)?;
    metrics.publish(&pools.stats());
    let queue = ctx.node_queue(NAME)?;
    let allocator = Arc::new(Allocator {
        nodes: ctx.nodes.clone(),
        api: Api::all(ctx.client.clone()),
        pools: Mutex::new(pools),
        queue: queue.clone(),
        recorder: ctx.recorder.clone(),
        guard: ctx.leader.clone(),
        metrics,
        claims: flags
            .pod_cidr_claims
            .then(|| claims::Claims::new(ctx.client.clone())),
        tracking: Mutex::new(allocator::Tracking::default()),
        waiting: Mutex::new(BTreeSet::new()),
        flagged: Mutex::new(BTreeSet::new()),
        record_assigned: flags.record_cidr_assigned_events,
    });
    let prepare = allocator.clone();
    Ok(Some(
        Controller::new()
            .prepare(|shutdown| async move {
                prepare.record_all_existing().await;
                match &prepare.claims {
                    Some(claims) if !prepare.reconcile_claims(claims, &shutdown).await => {
                        Prepared::ShutDown
                    }
                    _ => Prepared::Ready,
                }
            })
            .reconciler(allocator, queue, ctx.workers),
    ))
}

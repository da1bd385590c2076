//! subnet-allocator: gives every Node its pod CIDR(s) from the cluster CIDR(s), like
//! kube-controller-manager's nodeipam range allocator, and never hands one CIDR to two Nodes.
//!
//! Watches Nodes through the manager's shared informer; writes only `spec.podCIDR` and `spec.podCIDRs`
//! (one JSON Patch per Node, behind the leader fence, testing the Node's UID), only from blocks
//! of CIDRs it claimed with a PodCIDRClaim object named after the block ([`claims`], [`blocks`]), so two
//! leaders can never both give out one CIDR. Before the first allocation it records every CIDR any Node
//! holds and quarantines the free CIDRs of earlier leaders' blocks while a write of theirs may still land;
//! records are keyed by Node UID, and a Node's CIDRs are released only when that Node (that UID) is gone. Bad
//! data (unparsable, out-of-range or overlapping pod CIDRs) becomes a Warning Event and a metric, never a
//! crash, and nothing overlapping it is ever handed out. The CIDR arithmetic lives in `netcm-ipam`.
//!
//! Pools: `--cluster-cidr` is the flag pool (`default-cluster-cidr`); ClusterCIDR objects
//! (`networking.x-k8s.io/v1`, node-ipam-controller's API) add pools with node selectors and masks of their
//! own, at runtime ([`cluster_cidrs`]).
//!
//! Start reading at [`allocator::Allocator::sync_node`].

pub mod allocator;
mod assign;
mod backlog;
mod bad_data;
pub mod blocks;
mod claim_ahead;
pub mod claims;
pub mod cluster_cidrs;
mod decision;
pub mod flags;
mod idle_marks;
pub mod metrics;
mod migrations;
pub mod pod_cidr_patch;
mod predecessor;
mod release_hold;
mod start_lists;
mod startup;
mod state;
mod tracking;
mod waiting;

#[cfg(test)]
mod tests;

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
/// waits for the first list of ClusterCIDRs (with `--cluster-cidr-objects`), records every CIDR the
/// cached Nodes hold and reconciles the claims earlier leaders left; beside them, the ClusterCIDR watch
/// (a service: the syncs read its pools), the pool reconcile loop, the backlog signal other writers give way to and, with claims, the claim-ahead task
/// (tasks: they write, so they stop at shutdown).
fn init(flags: &Flags, ctx: &InitContext) -> InitResult {
    Ok(build(flags, ctx)?.map(|(_, controller)| controller))
}

/// [`init`], and the allocator its workers sync: the unit tests call its syncs themselves.
fn build(
    flags: &Flags,
    ctx: &InitContext,
) -> Result<Option<(Arc<Allocator>, Controller)>, InitError> {
    let Some(config) = flags.config().map_err(InitError::new)? else {
        return Ok(None);
    };
    let mut pools = Pools::new(&config).map_err(InitError::new)?;
    pools.set_rejoin_by_provider_id(flags.rejoins_by_provider_id());
    let metrics = metrics::AllocatorMetrics::register(&ctx.registry).map_err(InitError::new)?;
    metrics.publish(&pools.stats());
    let predecessor_gauges = predecessor::register_gauges(&ctx.registry).map_err(InitError::new)?;
    let queue = ctx.node_queue(NAME)?;
    let (claim_ahead, claim_ahead_requests) = if flags.pod_cidr_claims {
        let (tx, rx) = tokio::sync::mpsc::channel(claim_ahead::PENDING_REQUESTS);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let cluster_cidrs = flags
        .cluster_cidr_objects
        .then(|| Arc::new(cluster_cidrs::ClusterCidrs::new(ctx.client.clone())));
    let allocator = Arc::new(Allocator {
        nodes: ctx.nodes.clone(),
        api: Api::all(ctx.client.clone()),
        state: Mutex::new(state::State::new(pools)),
        queue: queue.clone(),
        recorder: ctx.recorder.clone(),
        guard: ctx.leader.clone(),
        metrics,
        claims: flags
            .pod_cidr_claims
            .then(|| claims::Claims::new(ctx.client.clone())),
        // The Lease identity, so the next leader can tell from the Lease whether a claim's idle mark is
        // its predecessor's (the only one it trusts).
        term: ctx
            .leader
            .identity()
            .map_or_else(|| term_name().into(), Box::from),
        block_create: tokio::sync::Mutex::new(()),
        claim_ahead,
        voiding: tokio::sync::Mutex::new(()),
        record_assigned: flags.record_cidr_assigned_events,
        pools_changed: cluster_cidrs.as_ref().map(|cc| cc.changed.clone()),
        existing_recorded: Default::default(),
        release_hold: flags.cidr_release_hold,
        rejoin_by_provider_id: flags.rejoins_by_provider_id(),
        release_hold_started: tokio::sync::Notify::new(),
    });
    let mut controller = Controller::new();
    // The first list of ClusterCIDRs is in the pools before any allocation: else a Node a pool selects
    // could get a CIDR from the flag pool.
    let mut pools_listed = None;
    let mut migrations_listed = None;
    if let Some(cc) = cluster_cidrs.clone() {
        let (listed, is_listed) = tokio::sync::watch::channel(false);
        pools_listed = Some(is_listed);
        // A running PodCIDRMigration closes every pool but its destination: known before any
        // allocation too, so a Node registering again is not served from a closed pool.
        let (migrations_sender, is_listed) = tokio::sync::watch::channel(false);
        migrations_listed = Some(is_listed);
        let api = Api::all_with(
            ctx.client.clone(),
            &netcm_api::pod_cidr_migration::api_resource(),
        );
        controller = controller.service(allocator.clone().watch_migrations(api, migrations_sender));
        let reconcile = allocator.clone();
        controller =
            controller
                .service(cc.clone().watch(listed))
                .task(move |shutdown| async move {
                    reconcile.reconcile_pools_loop(&cc, shutdown).await
                });
    }
    if let Some(requests) = claim_ahead_requests {
        let ahead = allocator.clone();
        controller = controller
            .task(move |shutdown| async move { claim_ahead::run(ahead, requests, shutdown).await });
    }
    if allocator.claims.is_some() {
        let marks = allocator.clone();
        controller =
            controller.task(move |shutdown| async move { idle_marks::run(marks, shutdown).await });
    }
    if !flags.cidr_release_hold.is_zero() {
        let holds = allocator.clone();
        controller = controller
            .task(move |shutdown| async move { release_hold::run(holds, shutdown).await });
    }
    let (ready, backlog, workers) = (queue.clone(), ctx.allocation_backlog.clone(), ctx.workers);
    controller = controller.task(move |shutdown| async move {
        backlog::publish(ready, backlog, workers, shutdown).await
    });
    let stepping_down = allocator.clone();
    let prepare = allocator.clone();
    let readiness = ctx.readiness.clone();
    let flags = flags.clone();
    let syncs = allocator.clone();
    Ok(Some((
        syncs,
        controller
            .prepare(|shutdown| async move {
                if let (Some(mut listed), Some(cc)) = (pools_listed, &cluster_cidrs) {
                    tokio::select! {
                        _ = shutdown.cancelled() => return Prepared::ShutDown,
                        _ = listed.wait_for(|l| *l) => {}
                    }
                    prepare.reconcile_pools(cc).await;
                }
                if let Some(mut listed) = migrations_listed {
                    tokio::select! {
                        _ = shutdown.cancelled() => return Prepared::ShutDown,
                        _ = listed.wait_for(|l| *l) => {}
                    }
                }
                prepare.record_all_existing().await;
                // The leader before this one, from the Lease this one took (init may run before it, on a
                // warm standby): waited out if claims cannot cover it.
                let predecessor = predecessor::judge(prepare.guard.takeover().as_deref(), &flags);
                let untouchable = match prepare
                    .wait_out_predecessor(&predecessor, &predecessor_gauges, &readiness, &shutdown)
                    .await
                {
                    predecessor::WaitedOut::Over => None,
                    predecessor::WaitedOut::AllBut(untouchable) => Some(untouchable),
                    predecessor::WaitedOut::Stopped(stopped) => return stopped,
                };
                if let Some(claims) = &prepare.claims {
                    match prepare
                        .reconcile_claims(claims, &readiness, &shutdown)
                        .await
                    {
                        Prepared::Ready => {}
                        stopped => return stopped,
                    }
                }
                // After the claims, so its CIDRs come from a block this leader claimed; before the
                // workers, so no other Node is given a CIDR until what landed on it is recorded.
                match untouchable {
                    Some(untouchable) => {
                        prepare
                            .serve_untouchable_first(untouchable, &predecessor_gauges, &shutdown)
                            .await
                    }
                    None => Prepared::Ready,
                }
            })
            .reconciler(allocator, queue, ctx.workers)
            .when_stopped(async move { stepping_down.mark_claims_idle().await }),
    )))
}

/// A name for this process's term without leader election (no Lease identity), unique across processes:
/// the host, the process and the instant.
fn term_name() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "netcm".into());
    format!(
        "{host}/{}@{}",
        std::process::id(),
        k8s_openapi::jiff::Timestamp::now()
    )
}

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
//! Pools: `--cluster-cidr` is the flag pool (`default-cluster-cidr`); ClusterCIDR objects
//! (`networking.x-k8s.io/v1`, node-ipam-controller's API) add pools with node selectors and masks of their
//! own, at runtime ([`cluster_cidrs`]).
//!
//! Start reading at [`allocator::Allocator::sync_node`].

pub mod allocator;
mod assign;
pub mod claims;
pub mod cluster_cidrs;
mod decision;
pub mod flags;
pub mod metrics;
mod startup;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use kube::api::Api;
use netcm_ipam::Pools;
use netcm_manager::run::CONTROLLER_DRAIN_TIMEOUT;
use netcm_manager::{run_workers, Controller, InitContext, InitError, InitResult};
use tokio_util::sync::CancellationToken;

pub use allocator::{Allocator, NAME};
pub use flags::Flags;

/// The running controller.
pub struct SubnetAllocator {
    allocator: Arc<Allocator>,
    workers: usize,
}

/// The init function: builds the allocator, or `None` with `--allocate-node-cidrs=false`.
pub fn init(ctx: &InitContext, flags: &Flags) -> InitResult {
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
        queue,
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
        cluster_cidrs: flags
            .cluster_cidr_objects
            .then(|| Arc::new(cluster_cidrs::ClusterCidrs::new(ctx.client.clone()))),
    });
    Ok(Some(Box::new(SubnetAllocator {
        allocator,
        workers: flags.concurrent_node_cidr_syncs.max(1),
    })))
}

impl Controller for SubnetAllocator {
    fn run(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let allocator = self.allocator;
            let pools_task = allocator.cluster_cidrs.clone().map(|cc| {
                let (ready, mut is_ready) = tokio::sync::watch::channel(false);
                let a = allocator.clone();
                let stop = shutdown.clone();
                let task =
                    tokio::spawn(async move { a.watch_cluster_cidrs(&cc, ready, stop).await });
                (task, async move { is_ready.wait_for(|r| *r).await.is_ok() })
            });
            let pools_task = match pools_task {
                Some((task, ready)) => {
                    // The first list of ClusterCIDRs comes before any allocation: else a Node a pool
                    // selects could get a CIDR from the flag pool.
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = ready => {}
                    }
                    Some(task)
                }
                None => None,
            };
            allocator.record_all_existing().await;
            if let Some(claims) = allocator.claims.clone() {
                if !allocator.reconcile_claims(&claims, &shutdown).await {
                    return;
                }
            }
            let queue = allocator.queue.clone();
            run_workers(
                NAME,
                queue,
                self.workers,
                shutdown,
                CONTROLLER_DRAIN_TIMEOUT,
                move |key| {
                    let allocator = allocator.clone();
                    async move { allocator.sync_node(&key).await }
                },
            )
            .await;
            if let Some(task) = pools_task {
                let _ = task.await;
            }
        })
    }
}

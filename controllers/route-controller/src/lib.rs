//! route-controller: a kernel route to every Node's pod CIDR via the Node's public IP, and the Node
//! condition `NetworkUnavailable` — the cloud route controller's contract on a Linux routing table.
//!
//! Watches Nodes through the manager's shared informer (pod CIDRs, the lease annotations
//! `<prefix>/public-ip(v6)` node-annotation-syncer writes, and the Node addresses as a fallback). Writes
//! routes in `--route-table` marked with `--route-protocol` through a [`backend::Routes`] backend (only
//! [`netlink`] so far), and the `NetworkUnavailable` condition with a status PATCH behind the leader fence.
//! It creates and deletes only routes inside the cluster CIDRs — `--cluster-cidr`'s and every ClusterCIDR
//! object's ([`pools`]) — never a default-like one or one over the host's own networks ([`ownership`]),
//! and refuses a protocol number others use ([`protocols`]).
//! A pod CIDR that overlaps another Node's in any way is routed only to the Node the API server created
//! first ([`overlap`]), so a kubelet cannot register a pod CIDR inside, around or equal to another
//! Node's and take its pod traffic; creation times are read for the Nodes in an overlap only
//! ([`seniority`]).
//!
//! Event-driven: every Node event queues the Node; its sync ([`table::RouteSyncer::sync_node`]) changes
//! only what differs. The kernel reports every change to the table, so a route someone else removes or
//! re-points is repaired at once ([`table::RouteSyncer::table_changed`]). A full reconcile at start and
//! every `--route-reconciliation-period` ([`table::RouteSyncer::reconcile`]) is the safety net: it deletes
//! routes no Node wants and requeues Nodes whose route differs. Conditions have their own queue
//! ([`condition`]), so routes never wait on the API server.
//!
//! `--route-mode` says whose condition is reported: `gateway` (one host routes every pod CIDR and
//! reports every Node, leader-elected or not) or `node` (a DaemonSet: each host routes to its peers and
//! reports only its own Node, which is NoRouteCreated only when the host's own routing fails; a bad peer
//! is reported on the peer). The Node netcm runs on never gets a route. A leader-elected process that is
//! not leading yet removes the routes it left for Nodes that no longer exist ([`standby`]).

pub mod backend;
pub mod condition;
pub mod desired;
pub mod flags;
pub mod metrics;
pub mod netlink;
pub mod options;
pub mod overlap;
pub mod ownership;
pub mod pools;
pub mod protocols;
pub mod seniority;
pub mod standby;
pub mod table;
mod worker;

use std::sync::Arc;

use futures::stream::BoxStream;
use kube::api::Api;
use netcm_manager::sync_metrics::{REASON_ERROR, REASON_FENCED};
use netcm_manager::{
    Controller, ControllerDescriptor, Fenced, InitContext, InitError, InitResult, Prepared,
};

use crate::condition::ConditionWriter;
use crate::flags::FlagError;
use crate::ownership::Ownership;
use crate::seniority::ApiBirths;
use crate::table::{Parts, RouteSyncer};

pub use flags::{Config, Flags, RouteMode};
pub use options::Options;
pub use standby::StartupSweep;

/// The controller's canonical name: its workqueue, metrics label and log field.
pub const NAME: &str = "route-controller";
/// The workqueue of condition writes.
pub const CONDITIONS_QUEUE: &str = "route-controller-conditions";
/// Condition PATCHes in flight: enough to keep up with the client's QPS at API round-trip latency.
const CONDITION_WORKERS: usize = 16;

/// Why a Node sync is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// This process may not change routes now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// Some pod CIDRs have no route, or an unwanted route could not be deleted.
    #[error("{0} route operation(s) failed")]
    Routes(usize),
}

impl netcm_manager::SyncError for SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Routes(_) => REASON_ERROR,
        }
    }
}

/// Why the controller cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A flag value (cmd checks them first; this guards other callers).
    #[error(transparent)]
    Flags(#[from] FlagError),
    /// Node mode needs to know which Node it reports.
    #[error("--route-mode=node needs the Node this pod runs on: set NODE_NAME (the downward API's spec.nodeName)")]
    NoNodeName,
}

/// The registry entry. The route controller owns only routes inside the allocator's
/// `--cluster-cidr` (and its ClusterCIDR objects' ranges, with `cluster_cidr_objects`) and reads gateways
/// under the syncer's `--annotation-prefix` (given with the flag `prefix_flag`), so the registry hands it
/// those values.
pub fn descriptor(
    flags: Flags,
    cluster_cidr: &str,
    cluster_cidr_objects: bool,
    annotation_prefix: &str,
    prefix_flag: &'static str,
) -> ControllerDescriptor {
    let options = Options {
        flags,
        cluster_cidr: cluster_cidr.to_string(),
        cluster_cidr_objects,
        annotation_prefix: annotation_prefix.to_string(),
        annotation_prefix_flag: prefix_flag,
        sweep: StartupSweep::new(),
    };
    ControllerDescriptor::new(NAME, &["route", "node-route-controller"], options)
}

/// Checks the flags with `--cluster-cidr`, `--leader-elect` and `--annotation-prefix`, opens the backend (a clear error without
/// CAP_NET_ADMIN) and the kernel's change notifications, and subscribes to Nodes. Once the cache has
/// synced it stops the standby's sweep and reconciles the whole table before the first Node sync, so
/// syncs change only what differs.
fn init(options: &Options, ctx: &InitContext) -> InitResult {
    let config = checked_config(options, ctx)?;
    let (backend, connection) =
        netlink::NetlinkRoutes::open(config.table, config.protocol).map_err(InitError::new)?;
    let (mut controller, changes) =
        with_table_changes(Controller::new().service(connection), &config);
    let routes = route_reconciler(ctx, &config, backend)?;
    let (first, sweep) = (routes.clone(), options.sweep.clone());
    // Without ClusterCIDR objects there is no list to wait for.
    let (listed, pools_listed) = tokio::sync::watch::channel(!options.cluster_cidr_objects);
    if options.cluster_cidr_objects {
        let api = Api::all_with(ctx.client.clone(), &pools::api_resource());
        let watched = routes.clone();
        controller = controller.service(pools::watch_pools(api, watched, listed));
    }
    controller = controller
        .prepare(|_| async move {
            // A standby's sweep must not delete anything once this process programs routes.
            sweep.finish().await;
            pools::first_list(pools_listed).await;
            first.reconcile().await;
            Prepared::Ready
        })
        .reconciler(routes.clone(), routes.queue.clone(), ctx.workers);
    if let Some(writer) = routes.conditions.clone() {
        let queue = writer.queue.clone();
        controller = controller.reconciler(writer, queue, CONDITION_WORKERS);
    }
    let period = config.period;
    let periodic = routes.clone();
    controller = controller.task(move |shutdown| worker::periodic(periodic, period, shutdown));
    if let Some(changes) = changes {
        controller =
            controller.task(move |shutdown| worker::watch_table(routes, changes, shutdown));
    }
    Ok(Some(controller))
}

/// The flags checked under `--leader-elect`, and the mode checked against what the process knows: a
/// Node to report in node mode. Warns of the setups that run but are rarely meant.
fn checked_config(options: &Options, ctx: &InitContext) -> Result<Config, InitError> {
    let config = options
        .flags
        .config(options.context(ctx.leader_elected))
        .map_err(|e| InitError::new(StartError::from(e)))?;
    match config.mode {
        RouteMode::Node if ctx.node_name.is_none() => {
            return Err(InitError::new(StartError::NoNodeName));
        }
        RouteMode::Node if config.cluster_cidrs.is_empty() => tracing::warn!(
            controller = NAME,
            "--route-mode=node without --cluster-cidr: every route of protocol {} in table {} counts as netcm's",
            config.protocol,
            config.table
        ),
        RouteMode::Gateway if !ctx.leader_elected => tracing::info!(
            controller = NAME,
            "--route-mode=gateway without leader election: this process routes to and reports every Node; run exactly one replica"
        ),
        _ => {}
    }
    Ok(config)
}

/// `controller` with the kernel's notifications of changes to the table as a service, and their stream;
/// no stream when they cannot be had.
fn with_table_changes(
    controller: Controller,
    config: &Config,
) -> (Controller, Option<BoxStream<'static, backend::TableChange>>) {
    match netlink::watch(config.table, config.protocol) {
        Ok((changes, watch_connection)) => (
            controller.service(watch_connection),
            Some(Box::pin(changes)),
        ),
        Err(e) => {
            // Without notifications routes are still repaired, at the next full reconcile.
            tracing::warn!(controller = NAME, error = %e, "no route notifications; routes changed by others are repaired at the next reconcile");
            (controller, None)
        }
    }
}

/// The Node syncs over `backend`, with the Node queue and, under `--set-node-network-unavailable`, the
/// condition writer.
fn route_reconciler(
    ctx: &InitContext,
    config: &Config,
    backend: netlink::NetlinkRoutes,
) -> Result<Arc<worker::RouteReconciler>, InitError> {
    let own_node = ctx.node_name.clone();
    let metrics = metrics::RouteMetrics::register(&ctx.registry).map_err(InitError::new)?;
    let backend = backend.with_gauges(metrics.nexthops.clone());
    let syncer = Arc::new(RouteSyncer::new(Parts {
        backend: Arc::new(backend),
        keys: config.keys.clone(),
        own_node: own_node.clone(),
        ownership: Ownership::new(config.cluster_cidrs.clone()),
        guard: ctx.leader.clone(),
        metrics,
        births: Arc::new(ApiBirths::new(ctx.client.clone())),
    }));
    let queue = ctx.node_queue(NAME)?;
    let conditions = config.set_node_network_unavailable.then(|| {
        Arc::new(ConditionWriter::new(
            Api::all(ctx.client.clone()),
            ctx.nodes.clone(),
            ctx.leader.clone(),
            ctx.new_queue(CONDITIONS_QUEUE),
        ))
    });
    let reports = match config.mode {
        RouteMode::Gateway => worker::Reports::EveryNode,
        RouteMode::Node => worker::Reports::OwnNode(own_node.unwrap_or_default()),
    };
    Ok(Arc::new(worker::RouteReconciler {
        syncer,
        nodes: ctx.nodes.clone(),
        queue,
        conditions,
        recorder: ctx.recorder.clone(),
        reports,
        resync: Arc::new(tokio::sync::Notify::new()),
        lease_prefix: config.keys.prefix.clone(),
    }))
}

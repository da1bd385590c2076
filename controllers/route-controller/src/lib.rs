//! route-controller: a kernel route to every Node's pod CIDR via the Node's public IP, and the Node
//! condition `NetworkUnavailable` — the cloud route controller's contract on a Linux routing table.
//!
//! Watches Nodes through the manager's shared informer (pod CIDRs, the lease annotations
//! `<prefix>/public-ip(v6)` node-annotation-syncer writes, and the Node addresses as a fallback). Writes
//! routes in `--route-table` marked with `--route-protocol` through a [`backend::Routes`] backend (only
//! [`netlink`] so far), and the `NetworkUnavailable` condition with a status PATCH behind the leader fence.
//!
//! Event-driven: every Node event queues the Node; its sync ([`table::RouteSyncer::sync_node`]) changes
//! only what differs. A full reconcile at start and every `--route-reconciliation-period`
//! ([`table::RouteSyncer::reconcile`]) deletes routes no Node wants and requeues Nodes whose route went
//! missing. Conditions have their own queue ([`condition`]), so routes never wait on the API server.
//!
//! Two deployment modes: leader-elected (one gateway host routes every pod CIDR; it writes every Node's
//! condition), and `--leader-elect=false` as a DaemonSet (each node routes to its peers; it writes only
//! its own Node's condition: RouteCreated once all its peer routes are in place, NoRouteCreated while
//! one fails). The Node netcm runs on never gets a route.

pub mod backend;
pub mod condition;
pub mod desired;
pub mod flags;
pub mod metrics;
pub mod netlink;
pub mod table;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use netcm_manager::run::CONTROLLER_DRAIN_TIMEOUT;
use netcm_manager::{
    run_workers, Controller, EventRecorder, EventType, Fenced, InitContext, InitError, InitResult,
    SharedInformer, SyncOutcome,
};
use netcm_workqueue::Queue;
use tokio_util::sync::CancellationToken;

use crate::condition::{ConditionWriter, Verdict, NO_ROUTE_CREATED, ROUTE_CREATED};
use crate::desired::AnnotationKeys;
use crate::table::{NodeOutcome, RouteSyncer};

pub use flags::Flags;

/// The controller's canonical name: its workqueue, metrics label and log field.
pub const NAME: &str = "route-controller";
/// The workqueue of condition writes.
pub const CONDITIONS_QUEUE: &str = "route-controller-conditions";
/// Node syncs in flight: each is a few microseconds of kernel work, pipelined on one netlink socket.
const ROUTE_WORKERS: usize = 16;
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

/// The running controller.
pub struct RouteController {
    syncer: Arc<RouteSyncer>,
    nodes: SharedInformer<Node>,
    queue: Queue<String>,
    conditions: Option<Arc<ConditionWriter>>,
    recorder: EventRecorder,
    period: Duration,
    /// The Node whose condition this process writes in DaemonSet mode.
    own_condition: Option<String>,
    leader_elected: bool,
    connection: Option<BoxFuture<'static, ()>>,
}

/// The init function: opens the backend (a clear error without CAP_NET_ADMIN) and subscribes to Nodes.
pub fn init(ctx: &InitContext, flags: &Flags) -> InitResult {
    flags.validate().map_err(|e| InitError::new(FlagError(e)))?;
    let keys = flags::lease_keys(&flags.route_lease_annotation_prefix).map_err(InitError::new)?;
    let (backend, connection) =
        netlink::NetlinkRoutes::open(flags.route_table, flags.route_protocol)
            .map_err(InitError::new)?;
    let metrics = metrics::RouteMetrics::register(&ctx.registry).map_err(InitError::new)?;
    let syncer = Arc::new(RouteSyncer::new(
        Arc::new(backend),
        AnnotationKeys::new(&keys),
        ctx.node_name.clone(),
        ctx.leader.clone(),
        metrics,
    ));
    let queue = ctx.node_queue(NAME)?;
    let conditions = flags.set_node_network_unavailable.then(|| {
        Arc::new(ConditionWriter::new(
            Api::all(ctx.client.clone()),
            ctx.nodes.clone(),
            ctx.leader.clone(),
            ctx.new_queue(CONDITIONS_QUEUE),
        ))
    });
    let own_condition = (!ctx.leader_elected)
        .then(|| ctx.node_name.clone())
        .flatten();
    if !ctx.leader_elected && ctx.node_name.is_none() {
        tracing::warn!(
            controller = NAME,
            "running without leader election and without NODE_NAME: every Node gets a route, including this host's own"
        );
    }
    Ok(Some(Box::new(RouteController {
        syncer,
        nodes: ctx.nodes.clone(),
        queue,
        conditions,
        recorder: ctx.recorder.clone(),
        period: flags.route_reconciliation_period,
        own_condition,
        leader_elected: ctx.leader_elected,
        connection: Some(Box::pin(connection)),
    })))
}

/// A flag value rejected at init (cmd validates first; this guards other callers).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct FlagError(String);

/// The shared parts a worker needs.
#[derive(Clone)]
struct Shared {
    syncer: Arc<RouteSyncer>,
    nodes: SharedInformer<Node>,
    queue: Queue<String>,
    conditions: Option<Arc<ConditionWriter>>,
    recorder: EventRecorder,
    own_condition: Option<String>,
    leader_elected: bool,
}

impl Shared {
    /// The route sync of one Node key.
    async fn sync_node(&self, name: String) -> Result<SyncOutcome, SyncError> {
        let node = self.nodes.get(&name);
        let sync = self.syncer.sync_node(&name, node.as_deref()).await?;
        let mut failed = sync.delete_errors.len();
        for e in &sync.delete_errors {
            tracing::warn!(controller = NAME, node = %name, error = %e, "failed to delete a route the node no longer wants");
        }
        if let (NodeOutcome::Failed(failures), Some(node)) = (&sync.outcome, &node) {
            failed += failures.len();
            for f in failures {
                let via = f.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
                tracing::warn!(controller = NAME, node = %name, destination = %f.destination, gateway = ?f.gateway, reason = %f.reason, "failed to create route");
                self.recorder
                    .publish(
                        node,
                        EventType::Warning,
                        "FailedToCreateRoute",
                        "CreateRoute",
                        format!(
                            "Could not create route {}{via} for node {name}: {}",
                            f.destination, f.reason
                        ),
                    )
                    .await;
            }
        }
        // Leader-elected: this process is the router for every Node and reports on each. In DaemonSet
        // mode only the own Node's condition is written, from the full reconcile.
        if self.leader_elected {
            if let Some(conditions) = &self.conditions {
                let verdict = match sync.outcome {
                    NodeOutcome::NotApplicable | NodeOutcome::Waiting => None,
                    NodeOutcome::Routed => Some(ROUTE_CREATED),
                    NodeOutcome::Failed(_) => Some(NO_ROUTE_CREATED),
                };
                conditions.set(&name, verdict);
            }
        }
        if failed > 0 {
            return Err(SyncError::Routes(failed));
        }
        Ok(SyncOutcome::Done)
    }

    /// One full reconcile: delete what no Node wants, requeue Nodes whose routes differ.
    async fn reconcile(&self) {
        let nodes = self.nodes.list();
        match self.syncer.reconcile(&nodes).await {
            Ok(report) => {
                tracing::debug!(
                    controller = NAME,
                    nodes = nodes.len(),
                    requeued = report.requeue.len(),
                    deleted = report.deleted.len(),
                    failing = report.failing,
                    "reconciled routes"
                );
                if !report.requeue.is_empty() {
                    tracing::info!(
                        controller = NAME,
                        nodes = report.requeue.len(),
                        "routes differ from the table; syncing those nodes again"
                    );
                }
                let in_sync = report.in_sync();
                let failing = report.failing > 0;
                for name in report.requeue {
                    self.queue.add(name);
                }
                if let (Some(own), Some(conditions)) = (&self.own_condition, &self.conditions) {
                    let verdict: Option<Verdict> = if failing {
                        Some(NO_ROUTE_CREATED)
                    } else if in_sync {
                        Some(ROUTE_CREATED)
                    } else {
                        None
                    };
                    if verdict.is_some() {
                        conditions.set(own, verdict);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(controller = NAME, error = %e, "failed to list routes; retrying at the next reconcile")
            }
        }
    }
}

impl Controller for RouteController {
    fn run(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut this = *self;
            let connection = this.connection.take().map(tokio::spawn);
            let shared = Shared {
                syncer: this.syncer.clone(),
                nodes: this.nodes.clone(),
                queue: this.queue.clone(),
                conditions: this.conditions.clone(),
                recorder: this.recorder.clone(),
                own_condition: this.own_condition.clone(),
                leader_elected: this.leader_elected,
            };
            // Know the table before the first Node sync, so syncs change only what differs.
            shared.reconcile().await;
            let period = this.period;
            let periodic = {
                let shared = shared.clone();
                let shutdown = shutdown.clone();
                async move {
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(period) => shared.reconcile().await,
                        }
                    }
                }
            };
            let routes = {
                let shared = shared.clone();
                run_workers(
                    NAME,
                    this.queue.clone(),
                    ROUTE_WORKERS,
                    shutdown.clone(),
                    CONTROLLER_DRAIN_TIMEOUT,
                    move |key| {
                        let shared = shared.clone();
                        async move { shared.sync_node(key).await }
                    },
                )
            };
            let conditions = async {
                if let Some(writer) = this.conditions.clone() {
                    let queue = writer.queue.clone();
                    run_workers(
                        CONDITIONS_QUEUE,
                        queue,
                        CONDITION_WORKERS,
                        shutdown.clone(),
                        CONTROLLER_DRAIN_TIMEOUT,
                        move |key| {
                            let writer = writer.clone();
                            async move { writer.sync(&key).await }
                        },
                    )
                    .await;
                }
            };
            tokio::join!(periodic, routes, conditions);
            if let Some(c) = connection {
                c.abort();
            }
        })
    }
}

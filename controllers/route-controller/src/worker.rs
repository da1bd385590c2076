//! The running controller's parts: the Node reconciler, the periodic reconcile, the kernel's change
//! reports, and who gets which condition and Event from their results.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use netcm_manager::Key;
use netcm_manager::{
    CachedNode, EventRecorder, EventType, NodeFields, Reconciler, SharedInformer, SyncOutcome,
};
use netcm_workqueue::Queue;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backend::TableChange;
use crate::condition::{ConditionWriter, Verdict, NO_ROUTE_CREATED, ROUTE_CREATED};
use crate::table::{NodeOutcome, NodeSync, RouteSyncer};
use crate::{SyncError, NAME};

/// How soon a Node whose pod CIDR waits for creation times is synced again.
const UNDECIDED_RETRY: Duration = Duration::from_secs(2);

/// Whose `NetworkUnavailable` condition this process reports.
#[derive(Debug, Clone)]
pub enum Reports {
    /// Gateway mode: every Node's, from the sync of its own routes.
    EveryNode,
    /// Node mode: only this Node's, from the state of this host's own routing.
    OwnNode(String),
}

/// The Node reconciler (one Node's routes per sync), shared with the periodic reconcile and the
/// kernel watch.
pub struct RouteReconciler {
    /// netcm's routes and the backend.
    pub syncer: Arc<RouteSyncer>,
    /// The Node cache.
    pub nodes: SharedInformer<CachedNode>,
    /// Node names to sync.
    pub queue: Queue<Key>,
    /// The condition writer, unless `--set-node-network-unavailable=false`.
    pub conditions: Option<Arc<ConditionWriter>>,
    /// Events on Nodes.
    pub recorder: EventRecorder,
    /// Whose condition this process reports.
    pub reports: Reports,
    /// Asks for a full reconcile now (lost notifications, changed host networks).
    pub resync: Arc<Notify>,
    /// The lease annotations' prefix (`<prefix>public-ip`, `<prefix>public-ipv6`).
    pub lease_prefix: String,
}

impl RouteReconciler {
    /// The route sync of one Node key.
    async fn sync_node(&self, name: String) -> Result<SyncOutcome, SyncError> {
        let node = self.nodes.get(&name);
        let sync = self.syncer.sync_node(&name, node.as_deref()).await?;
        for other in &sync.requeue {
            self.queue.add(other.as_str().into());
        }
        let mut failed = sync.delete_errors.len();
        for e in &sync.delete_errors {
            tracing::warn!(controller = NAME, node = %name, error = %e, "failed to delete a route the node no longer wants");
        }
        if let (NodeOutcome::Failed(failures), Some(node)) = (&sync.outcome, &node) {
            failed += failures.len();
            for f in failures {
                let via = f.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
                let reason = f.cause.event_reason();
                tracing::warn!(controller = NAME, node = %name, destination = %f.destination, gateway = ?f.gateway, reason = %f.reason, on_this_host = f.on_this_host, event = reason, "failed to create route");
                // The Event goes on the Node whose route is missing, also in node mode: a bad peer is
                // reported on the peer, never on its neighbours, and a later Node whose pod CIDR
                // overlaps an earlier one's is reported, never the earlier.
                self.recorder
                    .publish(
                        &node.object_ref(),
                        EventType::Warning,
                        reason,
                        "CreateRoute",
                        format!(
                            "Could not create route {}{via} for node {name}: {}",
                            f.destination, f.reason
                        ),
                    )
                    .await;
            }
        }
        self.report_sync(&name, &sync);
        if failed > 0 {
            return Err(SyncError::Routes(failed));
        }
        if sync.undecided {
            return Ok(SyncOutcome::RetryAfter(UNDECIDED_RETRY));
        }
        Ok(SyncOutcome::Done)
    }

    fn report_sync(&self, name: &str, sync: &NodeSync) {
        let Some(conditions) = &self.conditions else {
            return;
        };
        match &self.reports {
            Reports::EveryNode => {
                let verdict = match sync.outcome {
                    NodeOutcome::NotApplicable | NodeOutcome::Waiting => None,
                    NodeOutcome::Routed => Some(ROUTE_CREATED),
                    NodeOutcome::Failed(_) => Some(NO_ROUTE_CREATED),
                };
                conditions.set(name, verdict);
            }
            // A peer's failure is the peer's; only a failure of this host's routing marks this Node.
            Reports::OwnNode(own) if sync.host_fault() => {
                conditions.set(own, Some(NO_ROUTE_CREATED));
            }
            Reports::OwnNode(_) => {}
        }
    }

    /// One full reconcile: delete what no Node wants, requeue Nodes whose routes differ.
    pub async fn reconcile(&self) {
        let own_verdict: Verdict = match self.syncer.reconcile_with(|| self.nodes.list()).await {
            Ok(report) => {
                tracing::debug!(
                    controller = NAME,
                    nodes = report.nodes,
                    requeued = report.requeue.len(),
                    deleted = report.deleted.len(),
                    failing = report.failing,
                    host_faults = report.host_faults,
                    "reconciled routes"
                );
                if !report.requeue.is_empty() {
                    tracing::info!(
                        controller = NAME,
                        nodes = report.requeue.len(),
                        "routes differ from the table or failed; syncing those nodes again"
                    );
                }
                for name in &report.requeue {
                    self.queue.add(name.as_str().into());
                }
                if report.host_faults > 0 {
                    NO_ROUTE_CREATED
                } else {
                    ROUTE_CREATED
                }
            }
            Err(e) => {
                tracing::warn!(controller = NAME, error = %e, "failed to list routes; retrying at the next reconcile");
                NO_ROUTE_CREATED
            }
        };
        // Node mode: this host's routing works when it can list its table and no change failed for a
        // reason of the host since the last pass.
        if let (Reports::OwnNode(own), Some(conditions)) = (&self.reports, &self.conditions) {
            conditions.set(own, Some(own_verdict));
        }
    }

    /// Applies one change the kernel reported.
    async fn table_changed(&self, change: TableChange) {
        match change {
            TableChange::Lost => {
                tracing::warn!(
                    controller = NAME,
                    "route notifications were lost; reconciling the whole table"
                );
                self.resync.notify_one();
            }
            TableChange::Addresses => {
                if self.syncer.refresh_connected().await {
                    tracing::info!(
                        controller = NAME,
                        "the host's networks changed; reconciling the whole table"
                    );
                    self.resync.notify_one();
                }
            }
            change => {
                if let Some(node) = self.syncer.table_changed(&change).await {
                    self.queue.add(node.into());
                }
            }
        }
    }
}

impl Reconciler for RouteReconciler {
    type Error = SyncError;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Pod CIDRs, the lease's public IPs and the addresses they fall back to; also what the periodic
    /// reconcile reads.
    fn node_fields(&self) -> NodeFields {
        NodeFields::none()
            .pod_cidrs()
            .addresses()
            .annotations(&self.lease_prefix)
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, SyncError> {
        self.sync_node(key.to_string()).await
    }
}

/// The full reconcile every `period` and whenever a resync is asked for, until `shutdown`.
pub async fn periodic(shared: Arc<RouteReconciler>, period: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(period) => shared.reconcile().await,
            _ = shared.resync.notified() => shared.reconcile().await,
        }
    }
}

/// Applies the kernel's change reports until `shutdown` or until they stop.
pub async fn watch_table(
    shared: Arc<RouteReconciler>,
    mut changes: BoxStream<'static, TableChange>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            change = changes.next() => match change {
                Some(change) => shared.table_changed(change).await,
                None => {
                    tracing::warn!(controller = NAME, "route notifications stopped; only the periodic reconcile repairs routes now");
                    break;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;

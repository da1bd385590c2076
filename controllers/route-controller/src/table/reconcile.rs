//! The full reconcile: the listing of the table against every Node, the safety net under the
//! event-driven syncs and the kernel's change reports.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use netcm_node::CachedNode;

use super::{Asked, RouteSyncer};
use crate::backend::{BackendError, Operation, Route};
use crate::overlap::{standing, Contenders, Standing};

/// Deletes of a full reconcile in flight at once (the cloud route controller's
/// `maxConcurrentRouteOperations`).
const MAX_CONCURRENT_DELETES: usize = 200;

/// The result of one full reconcile.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Nodes the pass read.
    pub nodes: usize,
    /// Nodes whose routes differ from the table, whose last sync failed, that have a refused pod
    /// CIDR, or whose pod CIDR overlaps another Node's and is not settled: sync them again.
    pub requeue: Vec<String>,
    /// Routes of netcm's that no Node wants, deleted.
    pub deleted: Vec<Route>,
    /// Deletes that failed (retried on the next pass).
    pub delete_errors: usize,
    /// Nodes whose last sync failed.
    pub failing: usize,
    /// Failures of this host's routing since the previous reconcile, this one's included.
    pub host_faults: usize,
}

impl ReconcileReport {
    /// The table holds exactly what every Node asks for.
    pub fn in_sync(&self) -> bool {
        self.requeue.is_empty() && self.failing == 0 && self.delete_errors == 0
    }
}

/// What every Node asks for, as one full reconcile reads the Nodes.
#[derive(Default)]
struct EveryNodeWants {
    /// Every destination some Node may have a route to: not one a Node yields to an earlier Node, unless
    /// another Node holds it.
    destinations: HashSet<IpNet>,
    /// The Nodes to sync again.
    requeue: Vec<String>,
    /// What each Node asks for and claims (Nodes without either left out).
    asked: HashMap<String, Asked>,
    /// Every Node's claims.
    contenders: Contenders,
}

impl RouteSyncer {
    /// A full reconcile against the listing of the table: deletes routes of netcm's that no Node wants
    /// (only those netcm is responsible for) and reports the Nodes to sync again. `Err` when the table
    /// cannot be listed.
    pub async fn reconcile(
        &self,
        nodes: &[Arc<CachedNode>],
    ) -> Result<ReconcileReport, BackendError> {
        self.reconcile_with(|| nodes.to_vec()).await
    }

    /// [`RouteSyncer::reconcile`] over the Nodes `list` returns. It is called once the pass holds the
    /// table exclusively, so no Node sync that ran before it saw a newer Node than the pass records as
    /// asking for each destination.
    pub async fn reconcile_with(
        &self,
        list: impl FnOnce() -> Vec<Arc<CachedNode>>,
    ) -> Result<ReconcileReport, BackendError> {
        // As cloud-provider v0.36's reconcileNodeRoutes: every pass counts, one whose listing fails too.
        self.metrics.sync_total.inc();
        let _exclusive = self.table.write().await;
        self.refresh_connected().await;
        let nodes = list();
        let listed = self.backend.list_routes().await.inspect_err(|_| {
            self.metrics.error(Operation::List);
        });
        let actual: HashMap<IpNet, IpAddr> = listed
            .iter()
            .flatten()
            .map(|r| (r.destination, r.gateway))
            .collect();
        let wants = self.every_node_wants(&nodes, &actual);
        let mut report = ReconcileReport {
            nodes: nodes.len(),
            requeue: wants.requeue,
            ..ReconcileReport::default()
        };
        // Also when the table cannot be listed: the first syncs must know every Node that asks for a
        // destination.
        self.record_wants(wants.asked, wants.contenders);
        let listed = listed?;
        let orphans: Vec<Route> = listed
            .iter()
            .filter(|r| {
                !wants.destinations.contains(&r.destination)
                    && self.ownership.is_responsible(&r.destination)
            })
            .copied()
            .collect();
        let mut programmed = actual;
        let mut host_faults = 0;
        for (route, result) in self.delete_orphans(orphans).await {
            match result {
                Ok(()) => {
                    programmed.remove(&route.destination);
                    tracing::info!(controller = crate::NAME, route = %route, "deleted route no node wants");
                    report.deleted.push(route);
                }
                Err(e) => {
                    self.metrics.error(Operation::Delete);
                    tracing::warn!(controller = crate::NAME, route = %route, error = %e, "failed to delete a route no node wants");
                    report.delete_errors += 1;
                    host_faults += usize::from(e.on_this_host());
                }
            }
        }
        let mut st = self.state();
        st.programmed = programmed;
        report.failing = st.failing.len();
        report.host_faults = std::mem::take(&mut st.host_faults) + host_faults;
        self.publish_gauges(&st);
        Ok(report)
    }

    /// What every Node in `nodes` asks for, and which of them to sync again: those whose routes differ
    /// from the table (`actual`), whose last sync failed, that have a refused pod CIDR, or whose pod CIDR
    /// overlaps another Node's and is not settled (it yields, or it is undecided). A pod
    /// CIDR that yields to an earlier Node is not wanted, so its route is deleted here, unless another
    /// Node holds the same destination. Decided with the creation times the view knows; an undecided
    /// route in the table stays.
    fn every_node_wants(
        &self,
        nodes: &[Arc<CachedNode>],
        actual: &HashMap<IpNet, IpAddr>,
    ) -> EveryNodeWants {
        let mut wants = EveryNodeWants::default();
        let mut every = Vec::with_capacity(nodes.len());
        for node in nodes {
            let name = node.name().to_string();
            let want = self.wanted(&name, Some(node));
            let claims = self.claims(Some(node));
            let owned: Vec<IpNet> = want.destinations().collect();
            wants.contenders.enter(&name, &claims);
            if !owned.is_empty() || !claims.is_empty() {
                let uid = node.uid().to_string();
                wants
                    .asked
                    .insert(name.clone(), Asked { uid, owned, claims });
            }
            every.push((name, want));
        }
        let st = self.state();
        let born = |n: &str| {
            let uid = &wants.asked.get(n)?.uid;
            st.born.get(n).filter(|s| &s.uid == uid)
        };
        let mut destinations = HashSet::new();
        let mut requeue = Vec::new();
        for (name, want) in &every {
            let mut again = st.failing.contains(name) || !want.refused.is_empty();
            destinations.extend(want.unroutable.iter().map(|u| u.destination));
            destinations.extend(want.waiting.iter().copied());
            for r in &want.routes {
                let overlapping = wants.contenders.overlapping(&r.destination);
                let found = standing(
                    name,
                    born(name),
                    overlapping.iter().map(|(net, n)| (*net, *n, born(n))),
                );
                let in_table = actual.get(&r.destination) == Some(&r.gateway);
                match found {
                    Standing::Holds => {
                        destinations.insert(r.destination);
                        again |= !in_table;
                    }
                    Standing::Yields(_) => again = true,
                    // Its sync reads the creation times; the route stays until they are known.
                    Standing::Undecided { .. } => {
                        destinations.insert(r.destination);
                        again = true;
                    }
                }
            }
            if again {
                requeue.push(name.clone());
            }
        }
        drop(st);
        wants.destinations = destinations;
        wants.requeue = requeue;
        wants
    }

    /// Deletes `orphans`, up to [`MAX_CONCURRENT_DELETES`] at once, each behind the leader fence; every
    /// route with its result.
    async fn delete_orphans(&self, orphans: Vec<Route>) -> Vec<(Route, Result<(), BackendError>)> {
        futures::stream::iter(orphans)
            .map(|route| async move {
                if let Err(e) = self.guard.ensure_leader() {
                    return (
                        route,
                        Err(BackendError::Refused {
                            operation: "delete",
                            subject: route.to_string(),
                            message: e.to_string(),
                        }),
                    );
                }
                (route, self.backend.delete_route(route).await)
            })
            .buffer_unordered(MAX_CONCURRENT_DELETES)
            .collect()
            .await
    }

    /// Replaces what each Node asks for with what every Node asks for now, forgets who a destination
    /// is routed to once that Node no longer asks for it (its holder is decided afresh), and the
    /// creation times of Nodes that are gone or were created again.
    fn record_wants(&self, asked: HashMap<String, Asked>, contenders: Contenders) {
        let mut st = self.state();
        st.routed_for
            .retain(|d, routed| asked.get(&routed.node).is_some_and(|a| a.owned.contains(d)));
        st.born
            .retain(|n, s| asked.get(n).is_some_and(|a| a.uid == s.uid));
        st.asked = asked;
        st.contenders = contenders;
    }
}

//! The route table logic, independent of Kubernetes plumbing: per-Node syncs (event-driven) and the full
//! reconcile (periodic safety net), both against a [`Routes`] backend.
//!
//! netcm keeps a view of its own routes in the table (destination → gateway). A full reconcile replaces
//! the view with a fresh listing, deletes routes no Node wants (Node deleted, pod CIDR gone, or left over
//! from an earlier run), and names the Nodes whose routes differ from the table so their syncs repair
//! them. A Node sync compares the Node's wanted routes with the view and creates, replaces or deletes
//! only what differs, so a sync of an unchanged Node costs no backend call. Reconciles take the table
//! exclusively; Node syncs share it, so a listing never interleaves with a change.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use netcm_manager::{Fenced, LeaderGuard};

use crate::backend::{BackendError, Operation, Route, Routes};
use crate::desired::{node_routes, AnnotationKeys, NodeRoutes};
use crate::metrics::RouteMetrics;

/// Deletes of a full reconcile in flight at once (the cloud route controller's
/// `maxConcurrentRouteOperations`).
const MAX_CONCURRENT_DELETES: usize = 200;

/// One pod CIDR of a Node that has no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The pod CIDR.
    pub destination: IpNet,
    /// The gateway tried, if the Node has one.
    pub gateway: Option<IpAddr>,
    /// Why there is no route.
    pub reason: String,
}

/// How a Node's routes stand after its sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOutcome {
    /// The Node has no pod CIDR (or is gone, or is the Node netcm runs on): not the controller's concern.
    NotApplicable,
    /// Every pod CIDR has its route.
    Routed,
    /// The routes that can be built are in place; the Node has not reported its addresses yet.
    Waiting,
    /// Some pod CIDRs have no route.
    Failed(Vec<Failure>),
}

/// The result of one Node sync.
#[derive(Debug)]
pub struct NodeSync {
    /// How the Node's routes stand.
    pub outcome: NodeOutcome,
    /// Routes the Node no longer wants that could not be deleted (retried).
    pub delete_errors: Vec<BackendError>,
}

/// The result of one full reconcile.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Nodes whose routes differ from the table, or whose last sync failed: sync them again.
    pub requeue: Vec<String>,
    /// Routes of netcm's that no Node wants, deleted.
    pub deleted: Vec<Route>,
    /// Deletes that failed (retried on the next pass).
    pub delete_errors: usize,
    /// Nodes whose last sync failed.
    pub failing: usize,
}

impl ReconcileReport {
    /// The table holds exactly what every Node asks for.
    pub fn in_sync(&self) -> bool {
        self.requeue.is_empty() && self.failing == 0 && self.delete_errors == 0
    }
}

#[derive(Default)]
struct State {
    /// netcm's routes in the table as far as netcm knows: destination → gateway.
    programmed: HashMap<IpNet, IpAddr>,
    /// The Node each destination is programmed (or tried) for.
    claims: HashMap<IpNet, String>,
    /// The destinations each Node asked for at its last sync.
    owned: HashMap<String, Vec<IpNet>>,
    /// Nodes whose last sync left a pod CIDR without a route.
    failing: HashSet<String>,
}

/// What to do for one wanted route, decided under the state lock.
enum Step {
    Keep,
    Create,
    Replace,
    Conflict(String),
}

/// netcm's routes: the view, who claims what, and the backend.
pub struct RouteSyncer {
    backend: Arc<dyn Routes>,
    keys: AnnotationKeys,
    own_node: Option<String>,
    guard: LeaderGuard,
    metrics: RouteMetrics,
    table: tokio::sync::RwLock<()>,
    state: Mutex<State>,
}

impl RouteSyncer {
    /// A syncer over `backend`; `own_node` (the Node netcm runs on) never gets a route.
    pub fn new(
        backend: Arc<dyn Routes>,
        keys: AnnotationKeys,
        own_node: Option<String>,
        guard: LeaderGuard,
        metrics: RouteMetrics,
    ) -> Self {
        Self {
            backend,
            keys,
            own_node,
            guard,
            metrics,
            table: tokio::sync::RwLock::new(()),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a Node asks for; nothing for the Node netcm runs on (its pod CIDR is local).
    pub fn wanted(&self, name: &str, node: Option<&Node>) -> NodeRoutes {
        match node {
            Some(n) if self.own_node.as_deref() != Some(name) => node_routes(n, &self.keys),
            _ => NodeRoutes::default(),
        }
    }

    fn publish_gauges(&self, st: &State) {
        self.metrics.programmed.set(st.programmed.len() as i64);
        self.metrics.failing_nodes.set(st.failing.len() as i64);
    }

    /// Syncs one Node's routes with what it asks for (`node` is `None` once it is deleted). Returns
    /// `Err` only when the leader fence refuses a change.
    pub async fn sync_node(&self, name: &str, node: Option<&Node>) -> Result<NodeSync, Fenced> {
        let _shared = self.table.read().await;
        let wanted = self.wanted(name, node);
        let wanted_dsts: Vec<IpNet> = wanted.destinations().collect();

        // Routes the Node asked for before and no longer does.
        let stale: Vec<Route> = {
            let mut st = self.state();
            let before = st.owned.remove(name).unwrap_or_default();
            let mut stale = Vec::new();
            for dst in before.into_iter().filter(|d| !wanted_dsts.contains(d)) {
                if st.claims.get(&dst).map(String::as_str) != Some(name) {
                    continue;
                }
                st.claims.remove(&dst);
                if let Some(gw) = st.programmed.get(&dst) {
                    stale.push(Route {
                        destination: dst,
                        gateway: *gw,
                    });
                }
            }
            if !wanted_dsts.is_empty() {
                st.owned.insert(name.to_string(), wanted_dsts.clone());
            }
            stale
        };
        let mut delete_errors = Vec::new();
        for route in stale {
            self.guard.ensure_leader()?;
            match self.backend.delete_route(route).await {
                Ok(()) => {
                    let mut st = self.state();
                    if st.programmed.get(&route.destination) == Some(&route.gateway) {
                        st.programmed.remove(&route.destination);
                    }
                    tracing::info!(controller = crate::NAME, node = name, route = %route, "deleted route");
                }
                Err(e) => {
                    self.metrics.error(Operation::Delete);
                    // Keep the claim so the next sync tries again.
                    let mut st = self.state();
                    st.claims.insert(route.destination, name.to_string());
                    st.owned
                        .entry(name.to_string())
                        .or_default()
                        .push(route.destination);
                    delete_errors.push(e);
                }
            }
        }

        let mut failures: Vec<Failure> = wanted
            .unroutable
            .iter()
            .map(|u| Failure {
                destination: u.destination,
                gateway: None,
                reason: u.reason.clone(),
            })
            .collect();
        for route in &wanted.routes {
            if let Err(reason) = self.program(name, *route).await? {
                failures.push(Failure {
                    destination: route.destination,
                    gateway: Some(route.gateway),
                    reason,
                });
            }
        }

        let outcome = if !wanted.wants_routes() {
            NodeOutcome::NotApplicable
        } else if !failures.is_empty() {
            NodeOutcome::Failed(failures)
        } else if !wanted.waiting.is_empty() {
            NodeOutcome::Waiting
        } else {
            NodeOutcome::Routed
        };
        let mut st = self.state();
        if matches!(outcome, NodeOutcome::Failed(_)) {
            st.failing.insert(name.to_string());
        } else {
            st.failing.remove(name);
        }
        self.publish_gauges(&st);
        Ok(NodeSync {
            outcome,
            delete_errors,
        })
    }

    /// Makes one wanted route true in the table. The inner `Err` is why it could not be.
    async fn program(&self, name: &str, route: Route) -> Result<Result<(), String>, Fenced> {
        let step = {
            let mut st = self.state();
            match st.claims.get(&route.destination) {
                Some(other) if other != name => Step::Conflict(format!(
                    "pod CIDR {} is also claimed by node {other}",
                    route.destination
                )),
                _ => {
                    st.claims.insert(route.destination, name.to_string());
                    match st.programmed.get(&route.destination) {
                        Some(gw) if *gw == route.gateway => Step::Keep,
                        Some(_) => Step::Replace,
                        None => Step::Create,
                    }
                }
            }
        };
        let result = match step {
            Step::Keep => return Ok(Ok(())),
            Step::Conflict(reason) => return Ok(Err(reason)),
            Step::Create => {
                self.guard.ensure_leader()?;
                match self.backend.create_route(route).await {
                    Err(BackendError::Exists(_)) => self.adopt_or_refuse(route).await?,
                    other => other.map_err(|e| {
                        self.metrics.error(Operation::Create);
                        e.to_string()
                    }),
                }
            }
            Step::Replace => self.replace(route).await?,
        };
        if result.is_ok() {
            self.state()
                .programmed
                .insert(route.destination, route.gateway);
            tracing::info!(controller = crate::NAME, node = name, route = %route, "programmed route");
        }
        Ok(result)
    }

    async fn replace(&self, route: Route) -> Result<Result<(), String>, Fenced> {
        self.guard.ensure_leader()?;
        Ok(self.backend.replace_route(route).await.map_err(|e| {
            self.metrics.error(Operation::Replace);
            e.to_string()
        }))
    }

    /// A create found a route to the destination already there: if it is netcm's (the view was behind the
    /// table), point it at the wanted gateway; if it belongs to someone else, leave it alone.
    async fn adopt_or_refuse(&self, route: Route) -> Result<Result<(), String>, Fenced> {
        let listed = match self.backend.list_routes().await {
            Ok(l) => l,
            Err(e) => {
                self.metrics.error(Operation::List);
                return Ok(Err(e.to_string()));
            }
        };
        match listed.iter().find(|r| r.destination == route.destination) {
            Some(ours) if ours.gateway == route.gateway => Ok(Ok(())),
            Some(_) => self.replace(route).await,
            None => Ok(Err(format!(
                "a route to {} that netcm does not own (another protocol or table) is in the way",
                route.destination
            ))),
        }
    }

    /// A full reconcile against the listing of the table: deletes routes no Node wants and reports the
    /// Nodes to sync again. `Err` when the table cannot be listed.
    pub async fn reconcile(&self, nodes: &[Arc<Node>]) -> Result<ReconcileReport, BackendError> {
        // As cloud-provider v0.36's reconcileNodeRoutes: every pass counts, one whose listing fails too.
        self.metrics.sync_total.inc();
        let _exclusive = self.table.write().await;
        let listed = self.backend.list_routes().await.inspect_err(|_| {
            self.metrics.error(Operation::List);
        })?;
        let mut report = ReconcileReport::default();
        let mut wanted: HashSet<IpNet> = HashSet::new();
        let actual: HashMap<IpNet, IpAddr> =
            listed.iter().map(|r| (r.destination, r.gateway)).collect();
        let failing = self.state().failing.clone();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let want = self.wanted(&name, Some(node));
            wanted.extend(want.destinations());
            let differs = want
                .routes
                .iter()
                .any(|r| actual.get(&r.destination) != Some(&r.gateway));
            if differs || failing.contains(&name) {
                report.requeue.push(name);
            }
        }
        let orphans: Vec<Route> = listed
            .iter()
            .filter(|r| !wanted.contains(&r.destination))
            .copied()
            .collect();
        let results: Vec<(Route, Result<(), BackendError>)> = futures::stream::iter(orphans)
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
            .await;
        let mut programmed = actual;
        for (route, result) in results {
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
                }
            }
        }
        let mut st = self.state();
        st.programmed = programmed;
        report.failing = st.failing.len();
        self.publish_gauges(&st);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeRoutes;
    use crate::desired::tests::{keys, node};

    fn syncer(own: Option<&str>) -> (Arc<FakeRoutes>, RouteSyncer) {
        let backend = Arc::new(FakeRoutes::default());
        let registry = prometheus::Registry::new();
        let s = RouteSyncer::new(
            backend.clone(),
            keys(),
            own.map(str::to_string),
            LeaderGuard::disabled(&registry).expect("guard"),
            RouteMetrics::register(&registry).expect("metrics"),
        );
        (backend, s)
    }

    fn route(dst: &str, gw: &str) -> Route {
        Route {
            destination: dst.parse().expect("dst"),
            gateway: gw.parse().expect("gw"),
        }
    }

    fn n(name: &str, cidr: &str, ip: &str) -> Node {
        node(name, &[cidr], &[("InternalIP", ip)], &[])
    }

    #[tokio::test]
    async fn a_new_node_gets_its_route_and_a_second_sync_calls_nothing() {
        let (backend, s) = syncer(None);
        let a = n("a", "10.244.1.0/24", "192.0.2.1");
        let r = s.sync_node("a", Some(&a)).await.expect("sync");
        assert_eq!(r.outcome, NodeOutcome::Routed);
        assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
        backend.take_calls();
        s.sync_node("a", Some(&a)).await.expect("sync");
        assert!(backend.take_calls().is_empty());
    }

    #[tokio::test]
    async fn a_changed_address_replaces_the_gateway_and_a_deleted_node_loses_its_route() {
        let (backend, s) = syncer(None);
        s.sync_node("a", Some(&n("a", "10.244.1.0/24", "192.0.2.1")))
            .await
            .expect("sync");
        s.sync_node("a", Some(&n("a", "10.244.1.0/24", "192.0.2.9")))
            .await
            .expect("sync");
        assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.9")]);
        let r = s.sync_node("a", None).await.expect("sync");
        assert_eq!(r.outcome, NodeOutcome::NotApplicable);
        assert!(backend.table().is_empty());
    }

    #[tokio::test]
    async fn the_node_netcm_runs_on_gets_no_route() {
        let (backend, s) = syncer(Some("self"));
        let r = s
            .sync_node("self", Some(&n("self", "10.244.1.0/24", "192.0.2.1")))
            .await
            .expect("sync");
        assert_eq!(r.outcome, NodeOutcome::NotApplicable);
        assert!(backend.table().is_empty());
    }

    #[tokio::test]
    async fn an_unreachable_gateway_fails_that_node_only() {
        let (backend, s) = syncer(None);
        backend
            .unreachable
            .lock()
            .expect("lock")
            .insert("203.0.113.5".parse().expect("ip"));
        let bad = s
            .sync_node("bad", Some(&n("bad", "10.244.1.0/24", "203.0.113.5")))
            .await
            .expect("sync");
        let good = s
            .sync_node("good", Some(&n("good", "10.244.2.0/24", "192.0.2.2")))
            .await
            .expect("sync");
        match bad.outcome {
            NodeOutcome::Failed(f) => assert!(f[0].reason.contains("invalid gateway"), "{f:?}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(good.outcome, NodeOutcome::Routed);
        assert_eq!(backend.table(), [route("10.244.2.0/24", "192.0.2.2")]);
    }

    #[tokio::test]
    async fn someone_elses_route_to_the_same_destination_is_left_alone_and_reported() {
        let (backend, s) = syncer(None);
        backend
            .foreign
            .lock()
            .expect("lock")
            .insert("10.244.1.0/24".parse().expect("net"));
        let r = s
            .sync_node("a", Some(&n("a", "10.244.1.0/24", "192.0.2.1")))
            .await
            .expect("sync");
        match r.outcome {
            NodeOutcome::Failed(f) => assert!(f[0].reason.contains("does not own"), "{f:?}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert!(backend.table().is_empty());
    }

    #[tokio::test]
    async fn a_route_netcm_made_before_a_restart_is_adopted_not_duplicated() {
        let (backend, s) = syncer(None);
        backend.ours.lock().expect("lock").insert(
            "10.244.1.0/24".parse().expect("net"),
            "192.0.2.7".parse().expect("ip"),
        );
        let r = s
            .sync_node("a", Some(&n("a", "10.244.1.0/24", "192.0.2.1")))
            .await
            .expect("sync");
        assert_eq!(r.outcome, NodeOutcome::Routed);
        assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
    }

    #[tokio::test]
    async fn reconcile_deletes_routes_no_node_wants_and_requeues_nodes_whose_route_went_missing() {
        let (backend, s) = syncer(None);
        let a = Arc::new(n("a", "10.244.1.0/24", "192.0.2.1"));
        let b = Arc::new(n("b", "10.244.2.0/24", "192.0.2.2"));
        s.sync_node("a", Some(&a)).await.expect("sync");
        s.sync_node("b", Some(&b)).await.expect("sync");
        backend.ours.lock().expect("lock").insert(
            "10.99.0.0/24".parse().expect("net"),
            "192.0.2.99".parse().expect("ip"),
        );
        backend
            .ours
            .lock()
            .expect("lock")
            .remove(&"10.244.2.0/24".parse().expect("net"));
        let report = s
            .reconcile(&[a.clone(), b.clone()])
            .await
            .expect("reconcile");
        assert_eq!(report.deleted, [route("10.99.0.0/24", "192.0.2.99")]);
        assert_eq!(report.requeue, ["b"]);
        assert!(!report.in_sync());
        // The view now knows the route is gone, so b's sync recreates it.
        s.sync_node("b", Some(&b)).await.expect("sync");
        assert_eq!(
            backend.table(),
            [
                route("10.244.1.0/24", "192.0.2.1"),
                route("10.244.2.0/24", "192.0.2.2")
            ]
        );
        assert!(s.reconcile(&[a, b]).await.expect("reconcile").in_sync());
    }

    #[tokio::test]
    async fn two_nodes_claiming_one_pod_cidr_do_not_fight_over_the_route() {
        let (backend, s) = syncer(None);
        s.sync_node("a", Some(&n("a", "10.244.1.0/24", "192.0.2.1")))
            .await
            .expect("sync");
        let r = s
            .sync_node("b", Some(&n("b", "10.244.1.0/24", "192.0.2.2")))
            .await
            .expect("sync");
        assert!(matches!(r.outcome, NodeOutcome::Failed(_)), "{r:?}");
        assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.1")]);
        // Once a is gone, b takes the destination over.
        s.sync_node("a", None).await.expect("sync");
        let r = s
            .sync_node("b", Some(&n("b", "10.244.1.0/24", "192.0.2.2")))
            .await
            .expect("sync");
        assert_eq!(r.outcome, NodeOutcome::Routed);
        assert_eq!(backend.table(), [route("10.244.1.0/24", "192.0.2.2")]);
    }

    #[tokio::test]
    async fn a_pod_cidr_without_an_address_of_its_family_fails_without_a_backend_call() {
        let (backend, s) = syncer(None);
        let v6_only = node(
            "a",
            &["10.244.1.0/24"],
            &[("InternalIP", "2001:db8::1")],
            &[],
        );
        let r = s.sync_node("a", Some(&v6_only)).await.expect("sync");
        assert!(matches!(r.outcome, NodeOutcome::Failed(_)), "{r:?}");
        assert!(backend.take_calls().is_empty());
    }

    #[tokio::test]
    async fn route_sync_total_counts_every_pass_even_one_whose_listing_fails_and_has_no_labels() {
        let registry = prometheus::Registry::new();
        let metrics = RouteMetrics::register(&registry).expect("metrics");
        let backend = Arc::new(FakeRoutes::default());
        let s = RouteSyncer::new(
            backend.clone(),
            keys(),
            None,
            LeaderGuard::disabled(&registry).expect("guard"),
            metrics.clone(),
        );
        s.reconcile(&[]).await.expect("reconcile");
        backend
            .list_fails
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(s.reconcile(&[]).await.is_err());
        assert_eq!(metrics.sync_total.get(), 2);
        let family = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "route_controller_route_sync_total")
            .expect("registered");
        assert_eq!(
            family.help(),
            "A metric counting the amount of times routes have been synced with the cloud provider."
        );
        assert_eq!(family.get_metric().len(), 1);
        assert!(family.get_metric()[0].get_label().is_empty());
    }
}

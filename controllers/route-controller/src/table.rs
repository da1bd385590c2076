//! The route table logic, independent of Kubernetes plumbing: per-Node syncs (event-driven), the full
//! reconcile (periodic safety net, [`reconcile`]) and the kernel's reports of changes others make
//! ([`watch`]), all against a [`Routes`] backend.
//!
//! netcm keeps a view of its own routes in the table (destination → gateway). A full reconcile replaces
//! the view with a fresh listing, deletes routes of netcm's that no Node wants (Node deleted, pod CIDR
//! gone or refused, left over from an earlier run) as long as they are netcm's to judge (see
//! [`crate::ownership`]), and names the Nodes whose routes differ from the table so their syncs repair
//! them. A Node sync compares the Node's wanted routes with the view and creates, replaces or deletes
//! only what differs, so a sync of an unchanged Node costs no backend call. A destination several Nodes
//! ask for is routed to one of them only, its holder ([`crate::holder`]): the view keeps every Node that
//! asks for each destination, seeded by each full reconcile and kept current by the syncs. A change
//! someone else makes is applied to the view as the kernel reports it, and the Node it concerns is
//! synced at once.
//! Reconciles take the table exclusively; Node syncs and reported changes share it, so a listing never
//! interleaves with a change.

mod reconcile;
mod watch;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use netcm_manager::{Fenced, LeaderGuard};
use netcm_node::CachedNode;
use netcm_node::Keys;
use parking_lot::{Mutex, MutexGuard};

use crate::backend::{BackendError, Operation, Route, Routes};
use crate::desired::{node_routes, NodeRoutes};
use crate::holder::{holder, Contenders};
use crate::metrics::RouteMetrics;
use crate::ownership::Ownership;

pub use reconcile::ReconcileReport;

/// One pod CIDR of a Node that has no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The pod CIDR.
    pub destination: IpNet,
    /// The gateway tried, if the Node has one.
    pub gateway: Option<IpAddr>,
    /// Why there is no route.
    pub reason: String,
    /// The cause is this host's routing (every route would fail), not the Node or its route.
    pub on_this_host: bool,
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

impl NodeOutcome {
    /// How a Node that asks for `wanted` stands with `failures` left after its sync.
    fn of(wanted: &NodeRoutes, failures: Vec<Failure>) -> Self {
        if !wanted.wants_routes() {
            Self::NotApplicable
        } else if !failures.is_empty() {
            Self::Failed(failures)
        } else if !wanted.waiting.is_empty() {
            Self::Waiting
        } else {
            Self::Routed
        }
    }
}

/// The result of one Node sync.
#[derive(Debug)]
pub struct NodeSync {
    /// How the Node's routes stand.
    pub outcome: NodeOutcome,
    /// Routes the Node no longer wants that could not be deleted (retried).
    pub delete_errors: Vec<BackendError>,
}

impl NodeSync {
    /// Whether anything in this sync failed because of this host's routing.
    pub fn host_fault(&self) -> bool {
        self.delete_errors.iter().any(BackendError::on_this_host)
            || matches!(&self.outcome, NodeOutcome::Failed(f) if f.iter().any(|f| f.on_this_host))
    }
}

/// The Node netcm routes a destination for (or tries to), and the gateway that Node wants: the
/// `routed_for` of [`holder`].
#[derive(Debug, Clone)]
struct RoutedFor {
    node: String,
    gateway: IpAddr,
}

#[derive(Default)]
struct State {
    /// netcm's routes in the table as far as netcm knows: destination → gateway.
    programmed: HashMap<IpNet, IpAddr>,
    /// Who each destination is programmed (or tried) for.
    routed_for: HashMap<IpNet, RoutedFor>,
    /// The destinations each Node asked for at its last sync or the last full reconcile, and those it
    /// no longer asks for whose route's delete failed.
    owned: HashMap<String, Vec<IpNet>>,
    /// Every Node that asks for each destination, as in `owned`.
    contenders: Contenders,
    /// Nodes whose last sync left a pod CIDR without a route.
    failing: HashSet<String>,
    /// Failures of this host's routing since the last full reconcile.
    host_faults: usize,
}

/// What to do for one wanted route, decided under the state lock.
enum Step {
    Keep,
    Create,
    Replace,
    Conflict(String),
}

/// Why one wanted route is not in the table.
struct NotRouted {
    reason: String,
    on_this_host: bool,
}

impl From<BackendError> for NotRouted {
    fn from(e: BackendError) -> Self {
        Self {
            on_this_host: e.on_this_host(),
            reason: e.to_string(),
        }
    }
}

impl NotRouted {
    fn of_node(reason: String) -> Self {
        Self {
            reason,
            on_this_host: false,
        }
    }
}

/// netcm's routes: the view, whom each is routed for, what is netcm's, and the backend.
pub struct RouteSyncer {
    backend: Arc<dyn Routes>,
    keys: Keys,
    own_node: Option<String>,
    ownership: Ownership,
    guard: LeaderGuard,
    metrics: RouteMetrics,
    table: tokio::sync::RwLock<()>,
    state: Mutex<State>,
}

impl RouteSyncer {
    /// A syncer over `backend`; `own_node` (the Node netcm runs on) never gets a route, and only what
    /// `ownership` allows is routed or deleted.
    pub fn new(
        backend: Arc<dyn Routes>,
        keys: Keys,
        own_node: Option<String>,
        ownership: Ownership,
        guard: LeaderGuard,
        metrics: RouteMetrics,
    ) -> Self {
        Self {
            backend,
            keys,
            own_node,
            ownership,
            guard,
            metrics,
            table: tokio::sync::RwLock::new(()),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// What a Node asks for, with the pod CIDRs netcm refuses to route set apart; nothing for the Node
    /// netcm runs on (its pod CIDR is local).
    pub fn wanted(&self, name: &str, node: Option<&CachedNode>) -> NodeRoutes {
        let mut wanted = match node {
            Some(n) if self.own_node.as_deref() != Some(name) => node_routes(n, &self.keys),
            _ => NodeRoutes::default(),
        };
        wanted.refuse(|d| self.ownership.refusal(d).map(|r| r.to_string()));
        wanted
    }

    /// Reads the host's connected networks again; true when they changed.
    pub async fn refresh_connected(&self) -> bool {
        match self.backend.connected_networks().await {
            Ok(networks) => self.ownership.set_connected(networks),
            Err(e) => {
                self.metrics.error(Operation::List);
                tracing::warn!(controller = crate::NAME, error = %e, "failed to list the host's addresses; keeping the networks known before");
                false
            }
        }
    }

    fn publish_gauges(&self, st: &State) {
        self.metrics.programmed.set(st.programmed.len() as i64);
        self.metrics.failing_nodes.set(st.failing.len() as i64);
    }

    /// Syncs one Node's routes with what it asks for (`node` is `None` once it is deleted). Returns
    /// `Err` only when the leader fence refuses a change.
    pub async fn sync_node(
        &self,
        name: &str,
        node: Option<&CachedNode>,
    ) -> Result<NodeSync, Fenced> {
        let _shared = self.table.read().await;
        let wanted = self.wanted(name, node);
        let stale = self.record_node_wants(name, &wanted);
        let delete_errors = self.delete_stale(name, stale).await?;
        let failures = self.program_wanted(name, &wanted).await?;
        let sync = NodeSync {
            outcome: NodeOutcome::of(&wanted, failures),
            delete_errors,
        };
        self.record_sync(name, &sync);
        Ok(sync)
    }

    /// Records what the Node asks for now and returns the routes it asked for before and no longer does
    /// (or that netcm now refuses), among those netcm routes for it.
    fn record_node_wants(&self, name: &str, wanted: &NodeRoutes) -> Vec<Route> {
        let wanted_dsts: Vec<IpNet> = wanted.destinations().collect();
        let mut st = self.state();
        let before = st.owned.remove(name).unwrap_or_default();
        st.contenders.withdraw(name, &before);
        st.contenders.enter(name, wanted);
        let mut stale = Vec::new();
        for dst in before.into_iter().filter(|d| !wanted_dsts.contains(d)) {
            if st.routed_for.get(&dst).map(|c| c.node.as_str()) != Some(name) {
                continue;
            }
            st.routed_for.remove(&dst);
            if let Some(gw) = st.programmed.get(&dst) {
                stale.push(Route {
                    destination: dst,
                    gateway: *gw,
                });
            }
        }
        if !wanted_dsts.is_empty() {
            st.owned.insert(name.to_string(), wanted_dsts);
        }
        stale
    }

    /// Deletes the Node's stale routes; the deletes that failed, whose routes stay the Node's.
    async fn delete_stale(
        &self,
        name: &str,
        stale: Vec<Route>,
    ) -> Result<Vec<BackendError>, Fenced> {
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
                    // The route stays the Node's so the next sync tries again.
                    let mut st = self.state();
                    st.routed_for.insert(
                        route.destination,
                        RoutedFor {
                            node: name.to_string(),
                            gateway: route.gateway,
                        },
                    );
                    st.owned
                        .entry(name.to_string())
                        .or_default()
                        .push(route.destination);
                    delete_errors.push(e);
                }
            }
        }
        Ok(delete_errors)
    }

    /// Programs every route the Node wants; the pod CIDRs left without a route, refused and unroutable
    /// ones first.
    async fn program_wanted(
        &self,
        name: &str,
        wanted: &NodeRoutes,
    ) -> Result<Vec<Failure>, Fenced> {
        let mut failures: Vec<Failure> = wanted
            .refused
            .iter()
            .chain(&wanted.unroutable)
            .map(|u| Failure {
                destination: u.destination,
                gateway: u.gateway,
                reason: u.reason.clone(),
                on_this_host: false,
            })
            .collect();
        for route in &wanted.routes {
            if let Err(e) = self.program(name, *route).await? {
                failures.push(Failure {
                    destination: route.destination,
                    gateway: Some(route.gateway),
                    reason: e.reason,
                    on_this_host: e.on_this_host,
                });
            }
        }
        Ok(failures)
    }

    /// Counts the sync's result in the failing Nodes, this host's faults and the gauges.
    fn record_sync(&self, name: &str, sync: &NodeSync) {
        let mut st = self.state();
        if matches!(sync.outcome, NodeOutcome::Failed(_)) {
            st.failing.insert(name.to_string());
        } else {
            st.failing.remove(name);
        }
        if sync.host_fault() {
            st.host_faults += 1;
        }
        self.publish_gauges(&st);
    }

    /// Makes one wanted route true in the table, if the Node holds its destination. The inner `Err` is
    /// why it could not be.
    async fn program(&self, name: &str, route: Route) -> Result<Result<(), NotRouted>, Fenced> {
        let step = {
            let mut st = self.state();
            let dst = route.destination;
            let held_by_other = holder(
                st.contenders.of(&dst),
                st.routed_for.get(&dst).map(|c| c.node.as_str()),
                st.programmed.get(&dst).copied(),
            )
            .filter(|h| h.node != name)
            .map(|h| {
                format!(
                    "pod CIDR {dst} is also node {}'s, which keeps the route: {}",
                    h.node, h.ground
                )
            });
            match held_by_other {
                Some(reason) => Step::Conflict(reason),
                None => {
                    st.routed_for.insert(
                        route.destination,
                        RoutedFor {
                            node: name.to_string(),
                            gateway: route.gateway,
                        },
                    );
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
            Step::Conflict(reason) => return Ok(Err(NotRouted::of_node(reason))),
            Step::Create => {
                self.guard.ensure_leader()?;
                match self.backend.create_route(route).await {
                    Err(BackendError::Exists(_)) => self.adopt_or_refuse(route).await?,
                    other => other.map_err(|e| {
                        self.metrics.error(Operation::Create);
                        NotRouted::from(e)
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

    async fn replace(&self, route: Route) -> Result<Result<(), NotRouted>, Fenced> {
        self.guard.ensure_leader()?;
        Ok(self.backend.replace_route(route).await.map_err(|e| {
            self.metrics.error(Operation::Replace);
            NotRouted::from(e)
        }))
    }

    /// A create found a route to the destination already there: if it is netcm's (the view was behind the
    /// table), point it at the wanted gateway; if it belongs to someone else, leave it alone.
    async fn adopt_or_refuse(&self, route: Route) -> Result<Result<(), NotRouted>, Fenced> {
        let listed = match self.backend.list_routes().await {
            Ok(l) => l,
            Err(e) => {
                self.metrics.error(Operation::List);
                return Ok(Err(NotRouted::from(e)));
            }
        };
        match listed.iter().find(|r| r.destination == route.destination) {
            Some(ours) if ours.gateway == route.gateway => Ok(Ok(())),
            Some(_) => self.replace(route).await,
            None => Ok(Err(NotRouted::of_node(format!(
                "a route to {} that netcm does not own (another protocol or table) is in the way",
                route.destination
            )))),
        }
    }
}

#[cfg(test)]
mod tests;

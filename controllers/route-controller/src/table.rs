//! The route table logic, independent of Kubernetes plumbing: per-Node syncs (event-driven), the full
//! reconcile (periodic safety net, [`reconcile`]) and the kernel's reports of changes others make
//! ([`watch`]), all against a [`Routes`] backend.
//!
//! netcm keeps a view of its own routes in the table (destination → gateway). A full reconcile replaces
//! the view with a fresh listing, deletes routes of netcm's that no Node wants (Node deleted, pod CIDR
//! gone or refused, left over from an earlier run) as long as they are netcm's to judge (see
//! [`crate::ownership`]), and names the Nodes whose routes differ from the table so their syncs repair
//! them. A Node sync compares the Node's wanted routes with the view and creates, replaces or deletes
//! only what differs, so a sync of an unchanged Node costs no backend call. A pod CIDR that overlaps
//! another Node's (contains it, lies inside it, equals it) is routed only if its Node is the earlier
//! one ([`crate::overlap`]): the view keeps every Node's pod CIDRs in one index ordered for overlap
//! queries, seeded by each full reconcile and kept current by the syncs, and the creation times of the
//! Nodes in an overlap ([`births`]). A sync that changes who holds a range names the Nodes to sync
//! again: a later Node whose route the earlier one displaces, a Node held back by a pod CIDR that is
//! gone. A change someone else makes is applied to the view as the kernel reports it, and the Node it
//! concerns is synced at once.
//! Reconciles take the table exclusively; Node syncs and reported changes share it, so a listing never
//! interleaves with a change.

mod births;
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
use crate::desired::{node_routes, pod_cidrs, NodeRoutes};
use crate::metrics::RouteMetrics;
use crate::overlap::{standing, Contenders, Seniority, Standing};
use crate::ownership::Ownership;
use crate::seniority::Births;

pub use reconcile::ReconcileReport;

/// The reason of the Warning Event about a pod CIDR without a route: the cloud route controller's.
pub const FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
/// The reason of the Warning Event about a pod CIDR that overlaps an earlier Node's: the allocator's
/// word for overlapping CIDRs (`CIDRConflict`), about the route.
pub const ROUTE_CIDR_CONFLICT: &str = "RouteCIDRConflict";

/// Why a pod CIDR has no route, as far as its Warning Event tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The route could not be created, or netcm refuses the pod CIDR.
    Failed,
    /// The pod CIDR overlaps the pod CIDR of a Node created earlier, which keeps its route.
    Conflict,
}

impl Cause {
    /// The Event's reason.
    pub fn event_reason(self) -> &'static str {
        match self {
            Self::Failed => FAILED_TO_CREATE_ROUTE,
            Self::Conflict => ROUTE_CIDR_CONFLICT,
        }
    }
}

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
    /// What the Event says.
    pub cause: Cause,
}

/// How a Node's routes stand after its sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOutcome {
    /// The Node has no pod CIDR (or is gone, or is the Node netcm runs on): not the controller's concern.
    NotApplicable,
    /// Every pod CIDR has its route.
    Routed,
    /// The routes that can be built are in place; the Node has not reported its addresses yet, or a
    /// pod CIDR waits to learn whether its Node is earlier than another whose pod CIDR overlaps it.
    Waiting,
    /// Some pod CIDRs have no route.
    Failed(Vec<Failure>),
}

impl NodeOutcome {
    /// How a Node that asks for `wanted` stands with `failures` left after its sync, and pod CIDRs
    /// without a route that wait for creation times (`undecided`).
    fn of(wanted: &NodeRoutes, failures: Vec<Failure>, undecided: bool) -> Self {
        if !wanted.wants_routes() {
            Self::NotApplicable
        } else if !failures.is_empty() {
            Self::Failed(failures)
        } else if !wanted.waiting.is_empty() || undecided {
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
    /// Routes the Node no longer wants, or may no longer have, that could not be deleted (retried).
    pub delete_errors: Vec<BackendError>,
    /// Other Nodes whose routes this sync may have changed the standing of: sync them again.
    pub requeue: Vec<String>,
    /// A pod CIDR overlaps another Node's and which Node is the earlier is not known yet: sync again
    /// soon, without a failure.
    pub undecided: bool,
}

impl NodeSync {
    /// Whether anything in this sync failed because of this host's routing.
    pub fn host_fault(&self) -> bool {
        self.delete_errors.iter().any(BackendError::on_this_host)
            || matches!(&self.outcome, NodeOutcome::Failed(f) if f.iter().any(|f| f.on_this_host))
    }
}

/// The Node netcm routes a destination for (or tries to), and the gateway that Node wants: the
/// `routed_for` of [`overlap`].
#[derive(Debug, Clone)]
struct RoutedFor {
    node: String,
    gateway: IpAddr,
}

/// What one Node asked for at its last sync or the last full reconcile.
#[derive(Debug, Default)]
struct Asked {
    /// Its uid then: a new one is a new Node, created later.
    uid: String,
    /// The destinations it may have a route for, and those it no longer asks for whose route's delete
    /// failed.
    owned: Vec<IpNet>,
    /// Its pod CIDRs that count against other Nodes' ([`RouteSyncer::claims`]).
    claims: Vec<IpNet>,
}

#[derive(Default)]
struct State {
    /// netcm's routes in the table as far as netcm knows: destination → gateway.
    programmed: HashMap<IpNet, IpAddr>,
    /// Who each destination is programmed (or tried) for.
    routed_for: HashMap<IpNet, RoutedFor>,
    /// What each Node asked for.
    asked: HashMap<String, Asked>,
    /// Every Node's claims, for overlap queries.
    contenders: Contenders,
    /// When the API server created the Nodes whose pod CIDRs overlap another's, by name.
    born: HashMap<String, Seniority>,
    /// Nodes whose last sync left a pod CIDR without a route.
    failing: HashSet<String>,
    /// Those of them held back by an earlier Node's overlapping pod CIDR.
    conflicting: HashSet<String>,
    /// Failures of this host's routing since the last full reconcile.
    host_faults: usize,
}

impl State {
    /// When the Node `name` was created, if known for the Node the view holds under that name.
    fn seniority(&self, name: &str) -> Option<&Seniority> {
        let uid = &self.asked.get(name)?.uid;
        self.born.get(name).filter(|s| &s.uid == uid)
    }

    /// Whether netcm routes `destination` for `node`, or routes it for nobody it knows (a route left
    /// by an earlier run, which `node` may have made).
    fn routes_for(&self, destination: &IpNet, node: &str) -> bool {
        match self.routed_for.get(destination) {
            Some(r) => r.node == node,
            None => self.programmed.contains_key(destination),
        }
    }

    /// How `name`'s pod CIDR `dst` stands against every overlapping claim.
    fn decide(&self, name: &str, dst: &IpNet) -> Decision {
        let overlapping = self.contenders.overlapping(dst);
        let found = standing(
            name,
            self.seniority(name),
            overlapping
                .iter()
                .map(|(net, node)| (*net, *node, self.seniority(node))),
        );
        match found {
            Standing::Holds => Decision::Holds {
                displaced: overlapping
                    .iter()
                    .filter(|(net, node)| *node != name && self.routes_for(net, node))
                    .map(|(_, node)| node.to_string())
                    .collect(),
            },
            Standing::Yields(earlier) => Decision::Yields {
                reason: format!(
                    "pod CIDR {dst} overlaps {earlier}; only the earlier Node gets a route"
                ),
                // It takes the destination over once this Node's route is gone.
                takes_over: (earlier.cidr == *dst
                    && self.routed_for.get(dst).map(|r| r.node.as_str()) != Some(earlier.node))
                .then(|| earlier.node.to_string()),
            },
            Standing::Undecided { with } => Decision::Undecided {
                with: with.to_string(),
            },
        }
    }
}

/// How one wanted route stands, decided under the state lock.
enum Decision {
    /// The Node holds it; `displaced` are Nodes with routes overlapping it, which lose them.
    Holds { displaced: Vec<String> },
    /// An earlier Node's pod CIDR overlaps; `takes_over` is that Node when it asks for this very
    /// destination and is not routed to it yet.
    Yields {
        reason: String,
        takes_over: Option<String>,
    },
    /// Not known yet which Node is the earlier: `with` lacks a creation time.
    Undecided { with: String },
}

/// What to do for one wanted route, decided under the state lock.
enum Step {
    Keep,
    Create,
    Replace,
    /// No route: an earlier Node's pod CIDR overlaps. `delete` is this Node's route there, if any.
    Yield {
        reason: String,
        delete: Option<Route>,
    },
    /// No route yet, none removed.
    Wait,
}

/// What programming a Node's wanted routes left.
#[derive(Default)]
struct Programmed {
    failures: Vec<Failure>,
    delete_errors: Vec<BackendError>,
    requeue: Vec<String>,
    /// Some pod CIDR is undecided.
    undecided: bool,
    /// Some undecided pod CIDR has no route.
    undecided_unrouted: bool,
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
    births: Arc<dyn Births>,
    table: tokio::sync::RwLock<()>,
    state: Mutex<State>,
}

/// The parts of a [`RouteSyncer`].
pub struct Parts {
    /// The routes.
    pub backend: Arc<dyn Routes>,
    /// The lease annotations' keys, for gateways.
    pub keys: Keys,
    /// The Node netcm runs on: never gets a route.
    pub own_node: Option<String>,
    /// What is netcm's to route or delete.
    pub ownership: Ownership,
    /// The leader fence, before every change.
    pub guard: LeaderGuard,
    /// The gauges and counters.
    pub metrics: RouteMetrics,
    /// When the Nodes in an overlap were created.
    pub births: Arc<dyn Births>,
}

impl RouteSyncer {
    /// A syncer over `parts.backend`; the Node netcm runs on never gets a route, and only what the
    /// ownership rules allow is routed or deleted.
    pub fn new(parts: Parts) -> Self {
        let Parts {
            backend,
            keys,
            own_node,
            ownership,
            guard,
            metrics,
            births,
        } = parts;
        Self {
            backend,
            keys,
            own_node,
            ownership,
            guard,
            metrics,
            births,
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

    /// The pod CIDRs of `node` that count against other Nodes' when they overlap: all of them but
    /// those no host routes (default-like, IPv4-mapped, outside the cluster CIDRs), so a wide or
    /// disguised pod CIDR holds nobody back. A pod CIDR only this host refuses still counts, and so do
    /// the pod CIDRs of the Node netcm runs on, which gets no route: every host must find the same
    /// Nodes later than it.
    pub fn claims(&self, node: Option<&CachedNode>) -> Vec<IpNet> {
        let Some(node) = node else {
            return Vec::new();
        };
        pod_cidrs(node)
            .into_iter()
            .filter(|d| self.ownership.refusal(d).is_none_or(|r| r.is_this_hosts()))
            .collect()
    }

    /// Replaces the ClusterCIDR objects' ranges this host routes pod CIDRs inside; true when they
    /// changed ([`crate::pools`]).
    pub fn set_pool_ranges(&self, ranges: Vec<IpNet>) -> bool {
        self.ownership.set_pool_ranges(ranges)
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
        self.metrics
            .conflicting_nodes
            .set(st.conflicting.len() as i64);
    }

    /// Syncs one Node's routes with what it asks for (`node` is `None` once it is deleted). Returns
    /// `Err` only when the leader fence refuses a change.
    pub async fn sync_node(
        &self,
        name: &str,
        node: Option<&CachedNode>,
    ) -> Result<NodeSync, Fenced> {
        let uid = node.map(CachedNode::uid).unwrap_or_default();
        let wanted = self.wanted(name, node);
        let claims = self.claims(node);
        // Before the table lock: an API server slow to answer never holds up a full reconcile.
        self.learn_births(name, uid, &claims).await;
        let _shared = self.table.read().await;
        let (stale, mut requeue) = self.record_node_wants(name, uid, &wanted, claims);
        let mut delete_errors = self.delete_stale(name, stale).await?;
        let programmed = self.program_wanted(name, &wanted).await?;
        delete_errors.extend(programmed.delete_errors);
        requeue.extend(programmed.requeue);
        requeue.sort();
        requeue.dedup();
        requeue.retain(|n| n != name);
        let sync = NodeSync {
            outcome: NodeOutcome::of(&wanted, programmed.failures, programmed.undecided_unrouted),
            delete_errors,
            requeue,
            undecided: programmed.undecided,
        };
        self.record_sync(name, &sync);
        Ok(sync)
    }

    /// Records what the Node asks for now and claims against others. Returns the routes it asked for
    /// before and no longer does (or that netcm now refuses), among those netcm routes for it, and the
    /// Nodes an earlier claim of it held back that may hold now: it claims less, or it is a new Node
    /// under the same name, created later.
    fn record_node_wants(
        &self,
        name: &str,
        uid: &str,
        wanted: &NodeRoutes,
        claims: Vec<IpNet>,
    ) -> (Vec<Route>, Vec<String>) {
        let wanted_dsts: Vec<IpNet> = wanted.destinations().collect();
        let mut st = self.state();
        let before = st.asked.remove(name).unwrap_or_default();
        st.contenders.withdraw(name, &before.claims);
        st.contenders.enter(name, &claims);
        let recreated = before.uid != uid;
        let mut requeue = Vec::new();
        for d in before
            .claims
            .iter()
            .filter(|d| recreated || !claims.contains(d))
        {
            requeue.extend(
                st.contenders
                    .overlapping(d)
                    .into_iter()
                    .filter(|(_, other)| st.conflicting.contains(*other))
                    .map(|(_, other)| other.to_string()),
            );
        }
        let mut stale = Vec::new();
        for dst in before
            .owned
            .into_iter()
            .filter(|d| !wanted_dsts.contains(d))
        {
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
        if wanted_dsts.is_empty() && claims.is_empty() {
            st.born.remove(name);
        } else {
            st.asked.insert(
                name.to_string(),
                Asked {
                    uid: uid.to_string(),
                    owned: wanted_dsts,
                    claims,
                },
            );
        }
        (stale, requeue)
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
                    st.asked
                        .entry(name.to_string())
                        .or_default()
                        .owned
                        .push(route.destination);
                    delete_errors.push(e);
                }
            }
        }
        Ok(delete_errors)
    }

    /// Programs every route the Node wants, among them those it holds; the pod CIDRs left without a
    /// route (refused and unroutable ones first) and the other Nodes to sync again.
    async fn program_wanted(&self, name: &str, wanted: &NodeRoutes) -> Result<Programmed, Fenced> {
        let mut done = Programmed {
            failures: wanted
                .refused
                .iter()
                .chain(&wanted.unroutable)
                .map(|u| Failure {
                    destination: u.destination,
                    gateway: u.gateway,
                    reason: u.reason.clone(),
                    on_this_host: false,
                    cause: Cause::Failed,
                })
                .collect(),
            ..Programmed::default()
        };
        for route in &wanted.routes {
            self.program(name, *route, &mut done).await?;
        }
        Ok(done)
    }

    /// Counts the sync's result in the failing and conflicting Nodes, this host's faults and the gauges.
    fn record_sync(&self, name: &str, sync: &NodeSync) {
        let mut st = self.state();
        match &sync.outcome {
            NodeOutcome::Failed(failures) => {
                st.failing.insert(name.to_string());
                if failures.iter().any(|f| f.cause == Cause::Conflict) {
                    st.conflicting.insert(name.to_string());
                } else {
                    st.conflicting.remove(name);
                }
            }
            _ => {
                st.failing.remove(name);
                st.conflicting.remove(name);
            }
        }
        if sync.host_fault() {
            st.host_faults += 1;
        }
        self.publish_gauges(&st);
    }

    /// What to do for `route`, which `name` wants: decided against every overlapping claim, under the
    /// state lock. Records whom the destination is routed for and who to sync again in `done`.
    fn step(&self, name: &str, route: Route, done: &mut Programmed) -> Step {
        let mut st = self.state();
        let dst = route.destination;
        match st.decide(name, &dst) {
            Decision::Holds { displaced } => done.requeue.extend(displaced),
            Decision::Yields { reason, takes_over } => {
                done.requeue.extend(takes_over);
                let delete = match st.routed_for.get(&dst) {
                    Some(r) if r.node == name => {
                        st.routed_for.remove(&dst);
                        st.programmed.get(&dst).copied()
                    }
                    None => st
                        .programmed
                        .get(&dst)
                        .copied()
                        .filter(|gw| *gw == route.gateway),
                    Some(_) => None,
                };
                return Step::Yield {
                    reason,
                    delete: delete.map(|gateway| Route {
                        destination: dst,
                        gateway,
                    }),
                };
            }
            Decision::Undecided { with } => {
                done.undecided = true;
                // Until it is known, what netcm routes stays as it is, and nothing new is routed.
                let routed = match st.routed_for.get(&dst) {
                    Some(r) => r.node == name,
                    None => st.programmed.get(&dst) == Some(&route.gateway),
                };
                if !routed {
                    done.undecided_unrouted = true;
                    tracing::debug!(controller = crate::NAME, node = name, destination = %dst, other = %with, "pod CIDR overlaps another node's; waiting to learn which node the API server created first");
                    return Step::Wait;
                }
            }
        }
        st.routed_for.insert(
            dst,
            RoutedFor {
                node: name.to_string(),
                gateway: route.gateway,
            },
        );
        match st.programmed.get(&dst) {
            Some(gw) if *gw == route.gateway => Step::Keep,
            Some(_) => Step::Replace,
            None => Step::Create,
        }
    }

    /// Makes one wanted route true in the table, if the Node holds its destination; what it leaves goes
    /// into `done`.
    async fn program(&self, name: &str, route: Route, done: &mut Programmed) -> Result<(), Fenced> {
        let result = match self.step(name, route, done) {
            Step::Keep | Step::Wait => return Ok(()),
            Step::Yield { reason, delete } => {
                done.failures.push(Failure {
                    destination: route.destination,
                    gateway: Some(route.gateway),
                    reason,
                    on_this_host: false,
                    cause: Cause::Conflict,
                });
                if let Some(ours) = delete {
                    if let Err(e) = self.delete_yielded(name, ours).await? {
                        done.delete_errors.push(e);
                    }
                }
                return Ok(());
            }
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
        match result {
            Ok(()) => {
                self.state()
                    .programmed
                    .insert(route.destination, route.gateway);
                tracing::info!(controller = crate::NAME, node = name, route = %route, "programmed route");
            }
            Err(e) => done.failures.push(Failure {
                destination: route.destination,
                gateway: Some(route.gateway),
                reason: e.reason,
                on_this_host: e.on_this_host,
                cause: Cause::Failed,
            }),
        }
        Ok(())
    }

    /// Deletes the route of `name` to a pod CIDR it yields to an earlier Node; on failure the route
    /// stays the Node's, so its next sync tries again.
    async fn delete_yielded(
        &self,
        name: &str,
        route: Route,
    ) -> Result<Result<(), BackendError>, Fenced> {
        self.guard.ensure_leader()?;
        match self.backend.delete_route(route).await {
            Ok(()) => {
                let mut st = self.state();
                if st.programmed.get(&route.destination) == Some(&route.gateway) {
                    st.programmed.remove(&route.destination);
                }
                tracing::warn!(controller = crate::NAME, node = name, route = %route, "deleted the route of a node whose pod CIDR overlaps an earlier node's");
                Ok(Ok(()))
            }
            Err(e) => {
                self.metrics.error(Operation::Delete);
                self.state().routed_for.insert(
                    route.destination,
                    RoutedFor {
                        node: name.to_string(),
                        gateway: route.gateway,
                    },
                );
                Ok(Err(e))
            }
        }
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

//! The controller: it carries out, against the API, what [`crate::plan::plan`] decides for the one
//! migration that runs.
//!
//! One key per PodCIDRMigration. A watch keeps every migration object ([`watch_migrations`]) and queues
//! its name on each change; a Node's change queues the running migration's name (batched: a pass reads
//! every Node anyway), and a running migration asks for itself again every few seconds, since its
//! timeouts and its pods' evictions move without any Node changing.
//!
//! A pass ([`Migrator::sync`]):
//! 1. decides whether this migration runs: one at a time, the oldest first; the others are Pending;
//! 2. reads the pools (the ClusterCIDR objects and `--cluster-cidr`) and the destination's families; a
//!    destination no pool has makes the migration Invalid, which closes no pool;
//! 3. builds each Node's facts from the shared Node cache (the pods left only for Nodes being drained:
//!    one LIST by `spec.nodeName` each), plans, and
//! 4. writes the status — the progress a new leader resumes from — *before* any action, so an action is
//!    never taken that the status does not show; then takes the actions. An action whose answer is lost
//!    is taken again on a later pass, and each is harmless twice (a UID precondition on every Node
//!    write; an eviction of a pod already gone is a 404).
//!
//! The first status written as Progressing is what closes the other pools in the allocator
//! ([`netcm_api::pod_cidr_migration::open_pool`]); no Node is deleted before a later pass (its pods must
//! be gone first), so the allocator has seen the closing before any Node can register again.

use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, Preconditions,
};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use netcm_api::pod_cidr_migration::{
    self as api, in_run_order, Migration, MigrationPhase, MigrationSpec, MigrationStatus,
};
use netcm_manager::informer::watch_backoff;
use netcm_manager::sync_metrics::{api_reason, REASON_ERROR, REASON_FENCED};
use netcm_manager::{
    CachedNode, EventRecorder, EventType, Fenced, InformerEvent, LeaderGuard, NodeFields,
    Reconciler, SharedInformer, SyncOutcome,
};
use netcm_workqueue::Queue;
use serde::Deserialize;
use serde_json::json;

use crate::plan::{self, Action, NodeFacts, Phase, Plan, Spec};
use crate::pools::KnownPools;
use crate::progress::{failure_word, from_status, to_status, BadEntry};
use crate::NAME;

/// How often a running migration is passed over with no change: the drain and register timeouts are
/// minutes, and the pods a drain waits for leave without a Node event.
pub const RUNNING_RESYNC: Duration = Duration::from_secs(5);
/// How many Nodes' actions a pass takes at once: a wave's round trips overlap, and the API server
/// still sees a bounded burst (its own priority and fairness, and the client's token bucket, pace the rest).
const CONCURRENT_NODES: usize = 16;
/// How soon a pass planned from a stale read of its migration runs again.
const STALE_READ_RETRY: Duration = Duration::from_millis(200);
/// How long one eviction may take, the client's retries of a 429 included (see [`Migrator::evict`]).
const EVICTION_ATTEMPT: Duration = Duration::from_secs(3);
/// How long a Node change waits before it queues the running migration: one pass reads every Node, so
/// a burst of changes is one pass.
const NODE_CHANGE_BATCH: Duration = Duration::from_millis(500);

/// Why a pass failed; it is retried with the queue's backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// A request failed.
    #[error("{what}: {source}")]
    Api {
        /// What the request was for.
        what: &'static str,
        /// The error.
        source: kube::Error,
    },
    /// The status holds an entry that does not read.
    #[error(transparent)]
    BadStatus(#[from] BadEntry),
}

impl netcm_manager::SyncError for SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Api { source, .. } => api_reason(source),
            Self::BadStatus(_) => REASON_ERROR,
        }
    }
}

/// A JSON patch from its JSON form; built here from known shapes, so an error is a bug, reported as one.
fn json_patch(ops: serde_json::Value) -> Result<json_patch::Patch, kube::Error> {
    serde_json::from_value(ops).map_err(kube::Error::SerdeError)
}

fn api_error(what: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Api { what, source }
}

/// Every PodCIDRMigration object, as the watch last showed it (kube's reflector: a relist replaces it
/// whole once complete).
pub type Store = kube::runtime::reflector::Store<DynamicObject>;

/// The pods a drain must still evict, by the name of the draining Node, as one pass listed them.
type PodsLeft = std::collections::BTreeMap<String, Vec<Pod>>;

/// The reconciler of PodCIDRMigrations.
pub struct Migrator {
    /// The shared Node cache.
    pub nodes: SharedInformer<CachedNode>,
    /// The migrations the watch keeps.
    pub store: Store,
    /// PodCIDRMigrations (status writes).
    pub migrations: Api<DynamicObject>,
    /// ClusterCIDRs (read once a pass while a migration runs).
    pub cluster_cidrs: Api<DynamicObject>,
    /// Nodes (cordon, uncordon, delete).
    pub node_api: Api<Node>,
    /// Pods of every namespace (listed by Node, evicted).
    pub pods: Api<Pod>,
    /// The leader fence.
    pub guard: LeaderGuard,
    /// Events on the migration.
    pub recorder: EventRecorder,
    /// `--cluster-cidr`, parsed: the flag pool's ranges.
    pub flag_ranges: Vec<IpNet>,
    /// Where the running migration stands, and the actions taken.
    pub metrics: crate::metrics::MigrationMetrics,
}

/// The Node fields the controller reads: pod CIDRs (which pool each is from) and `spec.unschedulable`
/// (never uncordon an operator's cordon).
pub fn node_fields() -> NodeFields {
    let mut fields = NodeFields::none().pod_cidrs();
    fields.unschedulable = true;
    fields
}

/// The handler that queues the running migration on a Node's change.
pub fn on_node_change(
    store: Store,
    queue: Queue<netcm_manager::Key>,
) -> impl Fn(&InformerEvent<CachedNode>) + Send + Sync + 'static {
    move |_ev| {
        // Called on every Node event: the phase is read where it lies, not the whole status parsed (a
        // running migration's lists every moving Node). A migration queued for nothing is a pass
        // that decides nothing.
        for obj in store.state() {
            let running = MigrationPhase::deserialize(&obj.data["status"]["phase"])
                .is_ok_and(MigrationPhase::closes_pools);
            if let (true, None, Some(name)) = (
                running,
                obj.metadata.deletion_timestamp.as_ref(),
                obj.metadata.name.as_deref(),
            ) {
                queue.add_after(name.into(), NODE_CHANGE_BATCH);
            }
        }
    }
}

/// Keeps the store (`writer`'s) in line with the API and queues each changed migration, and every one
/// after a relist. A missing CRD or RBAC is logged once and retried with backoff: nothing to migrate
/// until it can be read.
pub async fn watch_migrations(
    api: Api<DynamicObject>,
    writer: kube::runtime::reflector::store::Writer<DynamicObject>,
    queue: Queue<netcm_manager::Key>,
) {
    let store = writer.as_reader();
    let stream = kube::runtime::reflector(writer, watcher(api, watcher::Config::default()))
        .backoff(watch_backoff());
    let mut stream = std::pin::pin!(stream);
    let mut refused_logged = false;
    while let Some(item) = stream.next().await {
        match item {
            Err(e) => {
                if !refused_logged {
                    tracing::warn!(controller = NAME, error = %e, "cannot watch PodCIDRMigrations (is the CRD podcidrmigrations.ipam.netcm.io installed, and may this process list it?); retrying with backoff");
                    refused_logged = true;
                }
            }
            Ok(Event::InitDone) => {
                refused_logged = false;
                for obj in store.state() {
                    if let Some(name) = obj.metadata.name.as_deref() {
                        queue.add(name.into());
                    }
                }
            }
            Ok(Event::Apply(obj)) => {
                if let Some(name) = obj.metadata.name.as_deref() {
                    queue.add(name.into());
                }
            }
            Ok(Event::Init | Event::InitApply(_) | Event::Delete(_)) => {}
        }
    }
}

/// Whether `name` runs now, or the message saying what it waits for.
fn turn(name: &str, all: &[Migration]) -> Result<(), String> {
    if let Some(other) = all.iter().find(|m| m.name != name && m.closes_pools()) {
        if !all.iter().any(|m| m.name == name && m.closes_pools()) {
            return Err(format!(
                "waits for PodCIDRMigration {} to complete",
                other.name
            ));
        }
    }
    let mut candidates: Vec<Migration> = all
        .iter()
        .filter(|m| m.spec.is_ok())
        .filter(|m| {
            !matches!(
                m.phase(),
                Some(MigrationPhase::Complete | MigrationPhase::Invalid)
            )
        })
        .cloned()
        .collect();
    in_run_order(&mut candidates);
    match candidates
        .iter()
        .find(|m| m.closes_pools())
        .or(candidates.first())
    {
        Some(first) if first.name != name => Err(format!(
            "waits for PodCIDRMigration {}, which runs first",
            first.name
        )),
        _ => Ok(()),
    }
}

/// The planner's spec from the object's, with the destination's family count.
fn plan_spec(spec: &MigrationSpec, families: usize) -> Spec {
    let secs = |s: Option<u64>, default: u64| {
        SignedDuration::from_secs(i64::try_from(s.unwrap_or(default)).unwrap_or(i64::MAX))
    };
    Spec {
        destination: spec.destination.clone(),
        destination_families: families,
        max_unavailable: spec
            .max_unavailable
            .unwrap_or(api::DEFAULT_MAX_UNAVAILABLE)
            .max(1) as usize,
        drain_timeout: secs(
            spec.drain_timeout_seconds,
            api::DEFAULT_DRAIN_TIMEOUT_SECONDS,
        ),
        register_timeout: secs(
            spec.register_timeout_seconds,
            api::DEFAULT_REGISTER_TIMEOUT_SECONDS,
        ),
    }
}

/// Whether a drain must evict `pod`: not a DaemonSet's (a drain leaves those), not a mirror pod, not
/// terminating already, not finished.
pub fn must_evict(pod: &Pod) -> bool {
    let meta = &pod.metadata;
    let daemon = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !daemon && !mirror && meta.deletion_timestamp.is_none() && !finished
}

impl Migrator {
    fn reference(obj: &DynamicObject) -> ObjectReference {
        ObjectReference {
            api_version: Some(format!("{}/{}", api::GROUP, api::VERSION)),
            kind: Some(api::KIND.into()),
            name: obj.metadata.name.clone(),
            uid: obj.metadata.uid.clone(),
            ..Default::default()
        }
    }

    /// Replaces the whole status (one JSON patch, so Nodes gone from the progress leave it), testing the
    /// resourceVersion `obj` was read at. `false`: the object changed since — the cache was behind,
    /// even behind this controller's own last write — and nothing was written; the pass is planned
    /// again from a newer read, so no action is ever taken on a stale progress.
    async fn write_status(
        &self,
        obj: &DynamicObject,
        status: &MigrationStatus,
    ) -> Result<bool, SyncError> {
        let patch = json_patch(json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": obj.metadata.resource_version },
            { "op": "add", "path": "/status", "value": status }
        ]))
        .map_err(api_error("building the status patch"))?;
        self.guard.ensure_leader()?;
        let written = self
            .migrations
            .patch_status(
                obj.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if matches!(s.code, 409 | 422) => Ok(false),
            Err(e) => Err(api_error("writing the status")(e)),
        }
    }

    /// Writes a status that is not a plan's (Pending, Invalid), unless it says so already.
    async fn write_phase(
        &self,
        obj: &DynamicObject,
        current: &MigrationStatus,
        phase: MigrationPhase,
        message: String,
    ) -> Result<(), SyncError> {
        if current.phase == Some(phase) && current.message.as_deref() == Some(message.as_str()) {
            return Ok(());
        }
        if phase == MigrationPhase::Invalid {
            self.recorder
                .publish(
                    &Self::reference(obj),
                    EventType::Warning,
                    "InvalidMigration",
                    "Validate",
                    message.clone(),
                )
                .await;
        }
        let status = MigrationStatus {
            phase: Some(phase),
            conditions: api::conditions_for(
                phase,
                &message,
                obj.metadata.generation,
                &current.conditions,
                Time(Timestamp::now()),
            ),
            message: Some(message),
            observed_generation: obj.metadata.generation,
            ..current.clone()
        };
        // A stale read is planned again when the watch brings the newer object.
        self.write_status(obj, &status).await.map(|_| ())
    }

    /// The pods on `node` a drain must evict.
    async fn pods_to_evict(&self, node: &str) -> Result<Vec<Pod>, SyncError> {
        let listed = self
            .pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(api_error("listing a draining Node's pods"))?;
        Ok(listed.items.into_iter().filter(must_evict).collect())
    }

    /// What the API shows of every Node, and the pods left on those being drained (listed
    /// concurrently, [`CONCURRENT_NODES`] at a time; the pass's evictions use the same lists).
    async fn facts(
        &self,
        pools: &KnownPools,
        destination: &str,
        progress: &plan::Progress,
    ) -> Result<(Vec<NodeFacts>, PodsLeft), SyncError> {
        let nodes = self.nodes.list();
        let draining: Vec<String> = nodes
            .iter()
            .filter(|node| {
                matches!(
                    progress.nodes.get(node.name()),
                    Some(plan::NodeStep::Draining { uid, .. }) if uid == node.uid()
                )
            })
            .map(|node| node.name().to_string())
            .collect();
        let listed: Vec<Result<(String, Vec<Pod>), SyncError>> = futures::stream::iter(draining)
            .map(|name| async move {
                let pods = self.pods_to_evict(&name).await?;
                Ok((name, pods))
            })
            .buffer_unordered(CONCURRENT_NODES)
            .collect()
            .await;
        let pods_left: PodsLeft = listed.into_iter().collect::<Result<_, _>>()?;
        let facts = nodes
            .iter()
            .map(|node| {
                let cidrs = node.pod_cidrs();
                let mut node_pools: Vec<Option<String>> = cidrs
                    .cidrs
                    .iter()
                    .map(|c| pools.pool_of(c, destination))
                    .collect();
                node_pools.extend(cidrs.unparsable.iter().map(|_| None));
                NodeFacts {
                    name: node.name().to_string(),
                    uid: node.uid().to_string(),
                    pools: node_pools,
                    unschedulable: node.unschedulable(),
                    pods_to_evict: pods_left.get(node.name()).map_or(0, Vec::len),
                }
            })
            .collect();
        Ok((facts, pods_left))
    }

    /// Takes one action. Answers that mean it is done already (404, a UID that no longer matches) are
    /// not failures; an eviction a PodDisruptionBudget refuses (429) is tried again on a later pass.
    async fn act(&self, action: &Action, pods_left: &PodsLeft) -> Result<(), SyncError> {
        self.guard.ensure_leader()?;
        let done_already = |e: &kube::Error| matches!(e, kube::Error::Api(s) if matches!(s.code, 404 | 409 | 422 | 429));
        let schedulable = |node: &str, uid: &str, unschedulable: bool| {
            // The test makes the write land on this Node only, not on one registered again under the
            // name since the plan was made.
            let patch = json_patch(json!([
                { "op": "test", "path": "/metadata/uid", "value": uid },
                { "op": "add", "path": "/spec/unschedulable", "value": unschedulable }
            ]));
            let node = node.to_string();
            async move {
                self.node_api
                    .patch(&node, &PatchParams::default(), &Patch::<()>::Json(patch?))
                    .await
                    .map(|_| ())
            }
        };
        let result = match action {
            Action::Cordon { node, uid } => schedulable(node, uid, true).await,
            Action::Uncordon { node, uid } => schedulable(node, uid, false).await,
            Action::Delete { node, uid } => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                self.node_api.delete(node, &params).await.map(|_| ())
            }
            Action::Evict { node, .. } => {
                // The pass's own list, else (a drain that starts now) a new one.
                let pods = match pods_left.get(node) {
                    Some(pods) => pods.clone(),
                    None => self.pods_to_evict(node).await?,
                };
                let evictions = pods.into_iter().filter_map(|pod| {
                    let (ns, name) = (pod.metadata.namespace?, pod.metadata.name?);
                    Some(self.evict(node, ns, name))
                });
                for result in futures::future::join_all(evictions).await {
                    result?;
                }
                Ok(())
            }
        };
        match result {
            Err(e) if !done_already(&e) => Err(SyncError::Api {
                what: "changing a Node",
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

impl Migrator {
    /// Asks the Eviction API to evict one pod, for at most [`EVICTION_ATTEMPT`]: the client retries a
    /// 429 with the server's Retry-After, and a PodDisruptionBudget that allows no disruption answers
    /// every attempt with one, so a pass would wait minutes on a pod the next pass asks for again.
    /// Not evicted now (429, gone, the attempt's time up) is not a failure: the drain's timeout decides.
    async fn evict(&self, node: &str, ns: String, name: String) -> Result<(), SyncError> {
        self.guard.ensure_leader()?;
        let api = Api::<Pod>::namespaced(self.pods.clone().into_client(), &ns);
        let attempt =
            tokio::time::timeout(EVICTION_ATTEMPT, api.evict(&name, &EvictParams::default())).await;
        match attempt {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if matches!(s.code, 404 | 409 | 429) => {
                tracing::info!(controller = NAME, node, pod = %format!("{ns}/{name}"), code = s.code, reason = %s.message, "pod not evicted now; asked again on the next pass");
                Ok(())
            }
            Ok(Err(source)) => Err(SyncError::Api {
                what: "evicting a pod",
                source,
            }),
            Err(_) => {
                tracing::info!(controller = NAME, node, pod = %format!("{ns}/{name}"), "pod not evicted within {EVICTION_ATTEMPT:?} (a PodDisruptionBudget allowing none, most likely); asked again on the next pass");
                Ok(())
            }
        }
    }
}

impl Migrator {
    /// Puts the finalizer on a migration about to run, before its first action: deleting it then
    /// waits for [`Migrator::finish_deletion`].
    async fn keep_finalizer(&self, obj: &DynamicObject) -> Result<(), SyncError> {
        let mut finalizers = obj.metadata.finalizers.clone().unwrap_or_default();
        if finalizers.iter().any(|f| f == api::FINALIZER) {
            return Ok(());
        }
        finalizers.push(api::FINALIZER.to_string());
        self.set_finalizers(obj, finalizers).await
    }

    /// A migration being deleted: every Node it cordoned for a drain still under way is put back in
    /// service (a Node an operator had cordoned stays cordoned; a Node already deleted registers again
    /// from whichever pool serves it, the pools being open again), then the finalizer goes.
    async fn finish_deletion(&self, obj: &DynamicObject) -> Result<SyncOutcome, SyncError> {
        let finalizers = obj.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == api::FINALIZER) {
            return Ok(SyncOutcome::Done);
        }
        if let Ok(status) = &Migration::from_object(obj).status {
            let progress = from_status(&status.nodes)?;
            for (name, step) in &progress.nodes {
                let plan::NodeStep::Draining {
                    uid,
                    was_unschedulable: false,
                    ..
                } = step
                else {
                    continue;
                };
                if self.nodes.get(name).is_some_and(|n| n.uid() == uid) {
                    self.act(
                        &Action::Uncordon {
                            node: name.clone(),
                            uid: uid.clone(),
                        },
                        &PodsLeft::new(),
                    )
                    .await?;
                }
            }
        }
        self.drop_finalizer(obj).await?;
        Ok(SyncOutcome::Done)
    }

    /// Removes the finalizer, if the object has it.
    async fn drop_finalizer(&self, obj: &DynamicObject) -> Result<(), SyncError> {
        let finalizers = obj.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == api::FINALIZER) {
            return Ok(());
        }
        let rest = finalizers
            .into_iter()
            .filter(|f| f != api::FINALIZER)
            .collect();
        self.set_finalizers(obj, rest).await
    }

    /// Replaces the finalizers, testing the resourceVersion they were read at (a 422 on a change
    /// since: the watch brings the object again).
    async fn set_finalizers(
        &self,
        obj: &DynamicObject,
        finalizers: Vec<String>,
    ) -> Result<(), SyncError> {
        let patch = json_patch(json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": obj.metadata.resource_version },
            { "op": "add", "path": "/metadata/finalizers", "value": finalizers }
        ]))
        .map_err(api_error("building the finalizer patch"))?;
        self.guard.ensure_leader()?;
        self.migrations
            .patch(
                obj.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
            .map_err(api_error("setting the finalizer"))?;
        Ok(())
    }
}

impl Migrator {
    /// Takes a plan's actions: each Node's in order (a cordon before its evictions), up to
    /// [`CONCURRENT_NODES`] Nodes at once, so a wave of `maxUnavailable` Nodes costs about one
    /// round trip per step rather than one per Node (`hack/bench.sh migration`). The first error is
    /// returned once every Node's actions ended: the pass is retried, and each action is safe twice.
    async fn act_on_nodes(
        &self,
        migration: &str,
        actions: &[Action],
        pods_left: &PodsLeft,
    ) -> Result<(), SyncError> {
        let mut by_node: Vec<Vec<Action>> = Vec::new();
        for action in actions {
            let node = action_node(action);
            match by_node
                .iter_mut()
                .find(|list| list.first().is_some_and(|a| action_node(a) == node))
            {
                Some(list) => list.push(action.clone()),
                None => by_node.push(vec![action.clone()]),
            }
        }
        let results: Vec<Result<(), SyncError>> = futures::stream::iter(by_node)
            .map(|list| self.act_in_order(migration, list, pods_left))
            .buffer_unordered(CONCURRENT_NODES)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// One Node's actions, in order, stopping at the first that fails.
    async fn act_in_order(
        &self,
        migration: &str,
        actions: Vec<Action>,
        pods_left: &PodsLeft,
    ) -> Result<(), SyncError> {
        for action in &actions {
            tracing::info!(controller = NAME, migration, action = ?action, "migration step");
            let result = self.act(action, pods_left).await;
            self.metrics.action(action, result.is_ok());
            result?;
        }
        Ok(())
    }
}

/// The Node an action is for.
fn action_node(action: &Action) -> &str {
    match action {
        Action::Cordon { node, .. }
        | Action::Evict { node, .. }
        | Action::Delete { node, .. }
        | Action::Uncordon { node, .. } => node,
    }
}

/// The status a plan reports; its conditions keep their transition times from `previous`.
fn planned_status(
    obj: &DynamicObject,
    plan: &Plan,
    previous: &MigrationStatus,
    now: Timestamp,
) -> MigrationStatus {
    let (phase, message) = match &plan.phase {
        Phase::Progressing => (MigrationPhase::Progressing, None),
        Phase::Complete => (
            MigrationPhase::Complete,
            Some(
                "every Node holds CIDRs from the destination alone; the other pools are open again"
                    .into(),
            ),
        ),
        Phase::Stalled(names) => {
            let why: Vec<String> = names
                .iter()
                .map(|n| match plan.progress.nodes.get(n) {
                    Some(plan::NodeStep::Failed { reason, .. }) => {
                        format!("{n} ({})", failure_word(reason))
                    }
                    _ => n.clone(),
                })
                .collect();
            (
                MigrationPhase::Stalled,
                Some(format!(
                    "no further Node starts: {} failed; mend them and remove their entries from status.nodes, or set spec.destination back to roll back",
                    why.join(", ")
                )),
            )
        }
    };
    let c = plan.counts;
    MigrationStatus {
        phase: Some(phase),
        conditions: api::conditions_for(
            phase,
            message.as_deref().unwrap_or_default(),
            obj.metadata.generation,
            &previous.conditions,
            Time(now),
        ),
        message,
        observed_generation: obj.metadata.generation,
        waiting: c.waiting as u64,
        draining: c.draining as u64,
        registering: c.registering as u64,
        done: c.done as u64,
        failed: c.failed as u64,
        unallocated: c.unallocated as u64,
        nodes: to_status(&plan.progress),
    }
}

impl Reconciler for Migrator {
    type Error = SyncError;

    fn name(&self) -> &'static str {
        NAME
    }

    fn node_fields(&self) -> NodeFields {
        node_fields()
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, SyncError> {
        let objects = self.store.state();
        let Some(obj) = objects
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(key))
            .map(|o| DynamicObject::clone(o))
        else {
            return Ok(SyncOutcome::Done);
        };
        let all: Vec<Migration> = objects.iter().map(|o| Migration::from_object(o)).collect();
        let migration = Migration::from_object(&obj);
        if migration.deleting {
            return self.finish_deletion(&obj).await;
        }
        let status = match &migration.status {
            Ok(s) => s.clone(),
            Err(why) => {
                // Someone else wrote it: act on nothing rather than guess (see `progress`).
                self.recorder
                    .publish(
                        &Self::reference(&obj),
                        EventType::Warning,
                        "UnreadableStatus",
                        "Sync",
                        why.clone(),
                    )
                    .await;
                return Ok(SyncOutcome::Done);
            }
        };
        let spec = match &migration.spec {
            Ok(spec) => spec.clone(),
            Err(why) => {
                self.write_phase(&obj, &status, MigrationPhase::Invalid, why.clone())
                    .await?;
                return Ok(SyncOutcome::Done);
            }
        };
        let unchanged = status.observed_generation == migration.generation;
        if unchanged && status.phase == Some(MigrationPhase::Complete) {
            self.drop_finalizer(&obj).await?;
            return Ok(SyncOutcome::Done);
        }
        if let Err(why) = turn(&migration.name, &all) {
            self.write_phase(&obj, &status, MigrationPhase::Pending, why)
                .await?;
            return Ok(SyncOutcome::Done);
        }
        let objects = self
            .cluster_cidrs
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .or_else(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => Ok(Vec::new()),
                _ => Err(e),
            })
            .map_err(api_error("listing ClusterCIDRs"))?;
        let pools = KnownPools::new(&self.flag_ranges, &objects);
        let Some(families) = pools.families(&spec.destination) else {
            let why = format!(
                "destination {:?} is no pool: neither a ClusterCIDR with a range nor {} (--cluster-cidr)",
                spec.destination,
                netcm_ipam::DEFAULT_POOL
            );
            self.write_phase(&obj, &status, MigrationPhase::Invalid, why)
                .await?;
            return Ok(SyncOutcome::Done);
        };
        let progress = from_status(&status.nodes)?;
        self.keep_finalizer(&obj).await?;
        let (facts, pods_left) = self.facts(&pools, &spec.destination, &progress).await?;
        let now = Timestamp::now();
        let plan_spec = plan_spec(&spec, families);
        let plan = plan::plan(&plan_spec, &facts, &progress, now);
        let next = planned_status(&obj, &plan, &status, now);
        if next != status && !self.write_status(&obj, &next).await? {
            return Ok(SyncOutcome::RetryAfter(STALE_READ_RETRY));
        }
        self.metrics.publish(&plan.counts, &plan.phase);
        // A Node that was registering again and left the progress is back in the destination.
        for (name, step) in &progress.nodes {
            if let plan::NodeStep::Registering { since, .. } = step {
                let back = facts
                    .iter()
                    .any(|f| f.name == *name && plan::is_done(&plan_spec, f));
                if back && !plan.progress.nodes.contains_key(name) {
                    self.metrics
                        .registered(now.duration_since(*since).as_secs_f64().max(0.0));
                }
            }
        }
        self.act_on_nodes(&migration.name, &plan.actions, &pods_left)
            .await?;
        if plan.phase == Phase::Complete {
            // Nothing is left to put back in service: deleting a finished migration needs no
            // controller.
            self.drop_finalizer(&obj).await?;
            return Ok(SyncOutcome::Done);
        }
        Ok(SyncOutcome::RetryAfter(RUNNING_RESYNC))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(name: &str, created: &str, phase: Option<&str>) -> Migration {
        let mut obj = DynamicObject::new(name, &api::api_resource())
            .data(json!({ "spec": { "destination": "new" } }));
        obj.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().expect("a time")),
        );
        if let Some(p) = phase {
            obj.data["status"] = json!({ "phase": p });
        }
        Migration::from_object(&obj)
    }

    #[test]
    fn one_migration_runs_at_a_time_the_oldest_first() {
        let old = migration("old", "2026-01-01T00:00:00Z", None);
        let new = migration("new", "2026-02-01T00:00:00Z", None);
        let all = [old.clone(), new.clone()];
        assert_eq!(turn("old", &all), Ok(()));
        assert!(turn("new", &all).is_err());
    }

    #[test]
    fn a_running_migration_keeps_its_turn_over_an_older_one_created_after_it_started() {
        let running = migration("b", "2026-02-01T00:00:00Z", Some("Progressing"));
        let older = migration("a", "2026-01-01T00:00:00Z", None);
        let all = [running, older];
        assert_eq!(turn("b", &all), Ok(()));
        assert!(turn("a", &all).is_err());
    }

    #[test]
    fn finished_and_invalid_migrations_wait_for_nobody_and_block_nobody() {
        let done = migration("a", "2026-01-01T00:00:00Z", Some("Complete"));
        let invalid = migration("b", "2026-01-02T00:00:00Z", Some("Invalid"));
        let next = migration("c", "2026-01-03T00:00:00Z", None);
        let all = [done, invalid, next];
        assert_eq!(turn("c", &all), Ok(()));
    }

    #[test]
    fn a_drain_leaves_daemonset_mirror_terminating_and_finished_pods() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).expect("a pod") };
        assert!(must_evict(&pod(json!({"metadata": {"name": "p"}}))));
        assert!(!must_evict(&pod(
            json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}})
        )));
        assert!(!must_evict(&pod(json!({"metadata": {"name": "p",
            "annotations": {"kubernetes.io/config.mirror": "x"}}}))));
        assert!(!must_evict(&pod(json!({"metadata": {"name": "p",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}}))));
        assert!(!must_evict(&pod(
            json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}})
        )));
    }
}

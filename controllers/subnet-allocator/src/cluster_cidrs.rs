//! ClusterCIDR objects (`clustercidrs.networking.x-k8s.io/v1`, node-ipam-controller's API) as pools.
//!
//! One watch of its own (the kind is the allocator's alone; a service of the allocator's controller)
//! keeps a store; after every change, on every Node release (a draining pool may be free now) and once a
//! second (status counts), a task of the controller runs [`Allocator::reconcile_pools`], which
//! brings the `netcm-ipam` pools in line with the store and writes what follows: the finalizer on every
//! pool (removed once a deleted pool is drained), a Warning Event on a refused one, and the status where
//! the CRD is netcm's (it has a status subresource; node-ipam-controller's does not). A pool that starts
//! allocating wakes the Nodes waiting for a CIDR at once.
//!
//! The store keeps each object read once (`store.rs`), and a pass looks only at what changed since the
//! last one (`pass.rs`): with thousands of objects, a pass that cloned and re-checked every one held the
//! allocator's state lock (then the pools lock), which every allocation waits on, for a third of a
//! second each second.

mod convert;
mod pass;
mod store;

pub use convert::{object_pool, sort_oldest_first};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use netcm_ipam::{NodeView, PoolReport, PoolState};
use netcm_manager::informer::watch_backoff;
use netcm_manager::EventType;
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, NAME};
use pass::{Publish, Seen};
use store::{Store, Stored};

/// node-ipam-controller's finalizer, so objects moved over from it keep theirs.
pub const FINALIZER: &str = "networking.x-k8s.io/cluster-cidr-finalizer";

/// The ClusterCIDR API resource.
pub fn api_resource() -> ApiResource {
    ApiResource::erase::<ClusterCidr>(&())
}

/// A ClusterCIDR's identity, the kind in Rust's types: what Events name as their subject. The watch
/// reads objects as [`DynamicObject`]s, since the spec is parsed by hand ([`convert`]).
#[derive(Debug, Clone, Default)]
pub struct ClusterCidr {
    /// Name and uid are what an Event's `regarding` takes.
    pub metadata: ObjectMeta,
}

impl ClusterCidr {
    /// The identity of `obj`.
    fn about(obj: &Stored) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(obj.name.clone()),
                uid: obj.uid.clone(),
                ..ObjectMeta::default()
            },
        }
    }
}

impl kube::Resource for ClusterCidr {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ClusterCIDR".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "networking.x-k8s.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "clustercidrs".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The watch's store and what wakes the reconciler.
pub(crate) struct ClusterCidrs {
    api: Api<DynamicObject>,
    store: Mutex<Store>,
    /// Wakes the reconciler (a Node released its CIDRs); shared with [`Allocator::pools_changed`].
    pub(crate) changed: Arc<Notify>,
    /// False once a status write found no status subresource (node-ipam-controller's CRD).
    status_supported: AtomicBool,
    /// False once a status write came back without its conditions: the installed CRD predates them and
    /// prunes them (Helm never upgrades `crds/`). Written on, they would differ from what is read back
    /// every pass and be written every second.
    conditions_supported: AtomicBool,
    /// What the last pass saw, so the next one skips what did not change.
    seen: Mutex<Seen>,
}

impl ClusterCidrs {
    /// A store for `client`'s ClusterCIDRs.
    pub(crate) fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all_with(client, &api_resource()),
            store: Mutex::new(Store::default()),
            changed: Arc::new(Notify::new()),
            status_supported: AtomicBool::new(true),
            conditions_supported: AtomicBool::new(true),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Puts what a write returned ([`Store::put_written`]).
    fn put_written(&self, obj: &DynamicObject) {
        self.store.lock().put_written(obj);
    }
}

/// Whether a watch error means the API has no such resource (the CRD is not installed).
fn not_installed(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

impl ClusterCidrs {
    /// Keeps the store in line with the API's ClusterCIDRs and wakes the reconcile loop on every change;
    /// `listed` turns true once the first list is in the store (or the CRD is found missing), before
    /// which nothing is allocated. It writes nothing, so it may run until the controller drops it.
    pub(crate) async fn watch(self: Arc<Self>, listed: watch::Sender<bool>) {
        let stream = watcher(self.api.clone(), watcher::Config::default()).backoff(watch_backoff());
        let mut stream = std::pin::pin!(stream);
        let mut relist: Option<Vec<DynamicObject>> = None;
        let mut missing_logged = false;
        while let Some(item) = stream.next().await {
            match item {
                Err(e) if not_installed(&e) => {
                    if !missing_logged {
                        tracing::warn!(controller = NAME, error = %e, "the ClusterCIDR CRD (clustercidrs.networking.x-k8s.io) is not installed; allocating from --cluster-cidr only until it is");
                        missing_logged = true;
                    }
                    listed.send_replace(true);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(controller = NAME, error = %e, "watching ClusterCIDRs failed; retrying with backoff");
                    continue;
                }
                Ok(Event::Init) => {
                    relist = Some(Vec::new());
                    continue;
                }
                Ok(Event::InitApply(obj)) => {
                    if let Some(r) = relist.as_mut() {
                        r.push(obj);
                    }
                    continue;
                }
                Ok(Event::InitDone) => {
                    self.store.lock().replace(relist.take().unwrap_or_default());
                    missing_logged = false;
                    listed.send_replace(true);
                }
                Ok(Event::Apply(obj)) => self.store.lock().put(&obj),
                Ok(Event::Delete(obj)) => {
                    self.store
                        .lock()
                        .remove(obj.metadata.name.as_deref().unwrap_or_default());
                }
            }
            self.changed.notify_one();
        }
    }
}

impl Allocator {
    /// Reconciles the pools after every ClusterCIDR change, every Node release and once a second
    /// (status counts), until `shutdown`. Started after the first reconcile, once the first list is in.
    pub(crate) async fn reconcile_pools_loop(
        &self,
        cc: &ClusterCidrs,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = cc.changed.notified() => {}
                _ = tick.tick() => {}
            }
            self.reconcile_pools(cc).await;
        }
    }

    /// Brings the pools in line with the store and writes finalizers, Events and status.
    ///
    /// Runs every second, so what it does under the state lock is bounded by what changed: the pools
    /// are synced only when an object's pool or the pools' refusal epoch changed (else nothing but two
    /// numbers is read), and reports are made only of the pools it looks at — objects put since the
    /// last pass, live pools (their counts move with the Nodes) and refusals whose Event is due.
    pub(crate) async fn reconcile_pools(&self, cc: &ClusterCidrs) {
        let snap = cc.store.lock().snapshot();
        let now = Instant::now();
        let (report, ended_holds) = {
            let mut state = self.state.lock();
            let pools = &mut state.pools;
            let must_sync = cc
                .seen
                .lock()
                .must_sync(snap.pools_version, pools.refusal_epoch());
            let report = must_sync.then(|| {
                let report = pools.sync_objects(&snap.pools);
                self.publish_usage(pools);
                cc.seen
                    .lock()
                    .synced(snap.pools_version, pools.refusal_epoch());
                report
            });
            // A pool being deleted ends its release holds.
            (report, self.take_ended_holds(pools))
        };
        self.report_ended_holds(ended_holds, None).await;
        if let Some(report) = &report {
            for name in &report.removed {
                tracing::info!(controller = NAME, pool = %name, "ClusterCIDR is gone; its pool is dropped");
            }
            if !report.activated.is_empty() {
                tracing::info!(controller = NAME, pools = ?report.activated, "ClusterCIDR pools allocate now; waking the nodes waiting for a CIDR");
                self.wake_waiting();
            }
        }
        let synced = report.is_some();
        let (since, due) = {
            let seen = cc.seen.lock();
            (
                seen.version,
                if synced { Vec::new() } else { seen.due(now) },
            )
        };
        let entries: Vec<Arc<Stored>> = {
            let store = cc.store.lock();
            let mut entries = store.newer_than(since, synced);
            let have: HashSet<String> = entries.iter().map(|e| e.name.clone()).collect();
            entries.extend(
                due.iter()
                    .filter(|n| !have.contains(n.as_str()))
                    .filter_map(|n| store.get(n)),
            );
            entries
        };
        let reports: HashMap<&str, PoolReport> = {
            let state = self.state.lock();
            let pools = &state.pools;
            entries
                .iter()
                .filter_map(|e| Some((e.name.as_str(), pools.report(&e.name)?)))
                .collect()
        };
        let waiting = if reports
            .values()
            .any(|r| !matches!(r.state, PoolState::Refused(_)))
        {
            self.waiting_per_pool()
        } else {
            HashMap::new()
        };
        for obj in &entries {
            let Some(rep) = reports.get(obj.name.as_str()) else {
                continue;
            };
            let settled = self.reconcile_pool(cc, obj, rep, &waiting, now).await;
            cc.seen.lock().looked_at(&obj.name, &rep.state, settled);
        }
        let mut seen = cc.seen.lock();
        seen.version = snap.version;
        if synced {
            let store = cc.store.lock();
            seen.retain(|n| store.contains(n));
        }
    }

    /// The finalizer, the refusal's Event and the status of one ClusterCIDR; false if a write it needs
    /// failed or was not allowed, so the next pass looks at it again.
    async fn reconcile_pool(
        &self,
        cc: &ClusterCidrs,
        obj: &Stored,
        rep: &PoolReport,
        waiting: &HashMap<String, usize>,
        now: Instant,
    ) -> bool {
        let name = &obj.name;
        let has = obj.has_finalizer();
        if !obj.deleting && !has {
            let mut f = obj.finalizers.clone();
            f.push(FINALIZER.to_string());
            // Written or not, the object is looked at again: its update comes back through the store.
            self.set_finalizers(cc, obj, f, "add").await;
            return false;
        }
        if !self.existing_recorded.load(Ordering::SeqCst) {
            // Before the Nodes' CIDRs are recorded every pool looks empty: a deleted one would lose its
            // finalizer while Nodes still hold its CIDRs, and the status would count nothing. Look again.
            return false;
        }
        if obj.deleting && has && self.state.lock().pools.drained(name) {
            let f: Vec<String> = obj
                .finalizers
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            if self.set_finalizers(cc, obj, f, "remove").await {
                tracing::info!(controller = NAME, pool = %name, "no node holds a CIDR from the deleted ClusterCIDR any more; released its finalizer");
            }
            return false;
        }
        if let PoolState::Refused(refusal) = &rep.state {
            let text = refusal.to_string();
            let publish = cc.seen.lock().publish(name, &text, now);
            if publish == Publish::New {
                tracing::warn!(controller = NAME, pool = %name, reason = refusal.reason(), why = %text, "ClusterCIDR refused; nothing is allocated from it");
            }
            if publish != Publish::No {
                self.recorder
                    .publish(
                        &netcm_manager::events::reference(&ClusterCidr::about(obj)),
                        EventType::Warning,
                        refusal.reason(),
                        "AllocateCIDR",
                        format!("ClusterCIDR {name} is refused: {text}"),
                    )
                    .await;
            }
        }
        if cc.status_supported.load(Ordering::Relaxed) {
            let status = convert::status(
                rep,
                waiting.get(name).copied().unwrap_or(0),
                obj.generation,
                obj.status.as_ref(),
                &Time(Timestamp::now()),
                cc.conditions_supported.load(Ordering::Relaxed),
            );
            if obj.status.as_ref() != Some(&status) {
                return self.write_status(cc, name, status).await;
            }
        }
        true
    }

    /// How many waiting Nodes each pool selects.
    fn waiting_per_pool(&self) -> HashMap<String, usize> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let names: Vec<String> = state.waiting.names().map(str::to_string).collect();
        // Drop the labels of Nodes no longer waiting.
        let labels = &mut state.waiting_labels;
        {
            let still_waiting: HashSet<&str> = names.iter().map(String::as_str).collect();
            labels.retain(|name, _| still_waiting.contains(name.as_str()));
        }
        let no_labels = BTreeMap::new();
        let pools = &state.pools;
        let mut out: HashMap<String, usize> = HashMap::new();
        for name in names {
            if self.nodes.get(&name).is_none() {
                continue;
            }
            for i in pools.candidates(&NodeView {
                name: &name,
                labels: labels.get(&name).unwrap_or(&no_labels),
                provider_id: None,
            }) {
                if let Some(name) = pools.name_of(i) {
                    *out.entry(name.to_string()).or_default() += 1;
                }
            }
        }
        out
    }

    /// Sets the object's finalizers (merge patch with its resourceVersion: a concurrent change wins and
    /// the next reconcile decides again). True if written.
    async fn set_finalizers(
        &self,
        cc: &ClusterCidrs,
        obj: &Stored,
        finalizers: Vec<String>,
        what: &str,
    ) -> bool {
        let name = &obj.name;
        if self.guard.ensure_leader().is_err() {
            return false;
        }
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version}});
        match cc
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                cc.put_written(&updated);
                true
            }
            Err(e) => {
                tracing::warn!(controller = NAME, pool = %name, error = %e, "could not {what} the finalizer of a ClusterCIDR; retrying");
                false
            }
        }
    }

    /// Writes the status; false if that failed or was not allowed.
    async fn write_status(&self, cc: &ClusterCidrs, name: &str, status: serde_json::Value) -> bool {
        if self.guard.ensure_leader().is_err() {
            return false;
        }
        let patch = json!({ "status": &status });
        match cc
            .api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                if convert::conditions_pruned(&status, &updated)
                    && cc.conditions_supported.swap(false, Ordering::Relaxed)
                {
                    tracing::warn!(controller = NAME, "the installed ClusterCIDR CRD prunes status.conditions (it predates them): writing the status without conditions, so `kubectl wait --for=condition=Ready` and GitOps health checks cannot read it; update the CRD (kubectl apply --server-side -f charts/netcm/crds/clustercidrs.yaml) and restart netcm");
                }
                cc.put_written(&updated);
                true
            }
            // 404 from the status subresource of an object that exists: the CRD has none.
            Err(kube::Error::Api(s))
                if s.code == 404 && matches!(cc.api.get_opt(name).await, Ok(Some(_))) =>
            {
                cc.status_supported.store(false, Ordering::Relaxed);
                tracing::info!(controller = NAME, "the installed ClusterCIDR CRD has no status subresource (node-ipam-controller's); writing no status");
                true
            }
            // The object is gone: its deletion comes through the watch.
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                tracing::warn!(controller = NAME, pool = %name, error = %e, "could not update a ClusterCIDR's status; retrying");
                false
            }
        }
    }
}

//! The sync handler: one Node key at a time, level-triggered from the cache, which also holds who else
//! owns the lease keys; at most one merge PATCH of the lease annotations that differ, behind the leader
//! fence and on the cached version — and none on a Node whose lease a node agent publishes (`owner.rs`).
//! No read of its own: a Node costs the syncer one write.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_manager::client::unread::patch_unread;
use netcm_manager::sync_metrics::{api_reason, REASON_FENCED};
use netcm_manager::{
    AllocationBacklog, CachedNode, EventRecorder, EventType, Fenced, LeaderGuard, NodeFields,
    Reconciler, SharedInformer, SyncOutcome,
};
use parking_lot::{Mutex, MutexGuard};

use crate::flags::Config;
use crate::metrics::SyncerMetrics;
use crate::owner::{self, AgentLease, FIELD_MANAGER};
use crate::subnet_lease::{self, Instead, InvalidOverwrite, Plan, Waiting};

/// The controller's name: its workqueue, metrics label and log field.
pub const NAME: &str = "node-annotation-syncer";

/// How long a lease write waits for the subnet-allocator's backlog to end before it is written anyway:
/// with the default 16 workers the syncer then writes ~8 leases a second during a backlog instead of
/// taking a third of the API server's writes, and never stops.
pub const GIVE_WAY: std::time::Duration = std::time::Duration::from_secs(2);

/// The Event reason for an unusable overwrite annotation.
pub const REASON_INVALID_OVERWRITE: &str = "InvalidPublicIPOverwrite";

/// A sync that must be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The Node changed after the cached version the PATCH was decided on (409): decided again, from
    /// the cache once it has the change, after a backoff.
    #[error("the node changed while its lease was being written; deciding again")]
    Conflict(#[source] kube::Error),
    /// The PATCH failed.
    #[error("patching lease annotations: {0}")]
    Patch(#[source] kube::Error),
}

impl netcm_manager::SyncError for SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Conflict(e) | Self::Patch(e) => api_reason(e),
        }
    }
}

/// Per-Node memory; everything here is dropped when the Node is gone.
#[derive(Default)]
struct State {
    /// netcm's last write per Node that the cache may not show yet: by [`name_key`], the
    /// [`write_digest`] of the cached version the write was planned on and the values written. Hashes,
    /// not the values: during a backlog every Node has an entry (16 bytes instead of ~360).
    written: HashMap<u64, u64>,
    /// Invalid overwrite values already reported, per Node: key → value.
    reported: HashMap<String, BTreeMap<String, String>>,
    /// Why a Node has nothing published, for the gauge, by [`name_key`]: while a backlog waits for its
    /// pod CIDRs every Node has an entry, so a hash keeps the map small where a copy of each name would
    /// not (`hack/bench.sh allocation` measures the peak; two names of one hash would only share one count
    /// of the gauge).
    waiting: HashMap<u64, &'static str>,
    /// Nodes whose lease differs from netcm's and is left to their node agent (who owns what), for the
    /// gauge and to log a verdict once.
    deferred: HashMap<String, AgentLease>,
}

/// The syncer's shared state.
pub struct Syncer {
    pub(crate) nodes: SharedInformer<CachedNode>,
    pub(crate) api: Api<Node>,
    pub(crate) config: Config,
    pub(crate) recorder: EventRecorder,
    pub(crate) guard: LeaderGuard,
    pub(crate) metrics: SyncerMetrics,
    /// The subnet-allocator's backlog, which lease writes give way to.
    pub(crate) allocation_backlog: AllocationBacklog,
    state: Mutex<State>,
}

impl Syncer {
    /// Builds the syncer (spawns nothing).
    pub(crate) fn new(
        nodes: SharedInformer<CachedNode>,
        api: Api<Node>,
        config: Config,
        recorder: EventRecorder,
        guard: LeaderGuard,
        metrics: SyncerMetrics,
        allocation_backlog: AllocationBacklog,
    ) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            api,
            config,
            recorder,
            guard,
            metrics,
            allocation_backlog,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Forgets a Node that is gone.
    fn forget(&self, name: &str) {
        let key = name_key(name);
        let mut st = self.state();
        st.written.remove(&key);
        st.reported.remove(name);
        let from = st.waiting.remove(&key);
        st.deferred.remove(name);
        let deferred = st.deferred.len();
        drop(st);
        self.metrics.waiting_moved(from, None);
        self.metrics.set_agent_managed(deferred);
    }

    /// Leaves the Node's lease to its agent; logs when that is news.
    fn defer(&self, name: &str, agent: AgentLease, would: &Plan) {
        let mut st = self.state();
        let news = st.deferred.get(name) != Some(&agent);
        st.deferred.insert(name.to_string(), agent.clone());
        let deferred = st.deferred.len();
        drop(st);
        self.metrics.set_agent_managed(deferred);
        if news {
            let differs: Vec<&str> = would.changes.keys().map(String::as_str).collect();
            tracing::info!(controller = NAME, node = name, agent = %agent, differs = %differs.join(","), "a node agent publishes this node's lease; leaving it alone");
        }
    }

    /// The Node's lease is netcm's again (or agrees with netcm's); logs when it was deferred before.
    fn undefer(&self, name: &str) {
        let mut st = self.state();
        let Some(was) = st.deferred.remove(name) else {
            return;
        };
        let deferred = st.deferred.len();
        drop(st);
        self.metrics.set_agent_managed(deferred);
        tracing::info!(controller = NAME, node = name, was = %was, "no node agent owns a differing lease on this node any more");
    }

    fn set_waiting(&self, name: &str, waiting: Option<&Waiting>) {
        let to = waiting.map(Waiting::label);
        let mut st = self.state();
        let from = match to {
            Some(r) => st.waiting.insert(name_key(name), r),
            None => st.waiting.remove(&name_key(name)),
        };
        drop(st);
        self.metrics.waiting_moved(from, to);
    }

    /// Whether `changes`, planned from the cached `node`, were already written by netcm onto this very
    /// version: the write's watch event has not reached the cache yet, so a second event queued before it
    /// would otherwise PATCH the same values again. A write whose version the cache has moved past is
    /// forgotten. The plan is a function of the cached Node, so the same version plans the same changes.
    fn already_written(
        &self,
        name: &str,
        node: &CachedNode,
        changes: &BTreeMap<String, String>,
    ) -> bool {
        let key = name_key(name);
        let mut st = self.state();
        let Some(&digest) = st.written.get(&key) else {
            return false;
        };
        if digest == write_digest(name, node.resource_version(), changes) {
            return true;
        }
        st.written.remove(&key);
        false
    }

    /// Reports each invalid overwrite value once per Node: a Warning Event, a log line and the counter.
    async fn report_invalid(&self, node: &CachedNode, name: &str, invalid: &[InvalidOverwrite]) {
        let fresh: Vec<&InvalidOverwrite> = {
            let mut st = self.state();
            if invalid.is_empty() {
                st.reported.remove(name);
                Vec::new()
            } else {
                let seen = st.reported.entry(name.to_string()).or_default();
                seen.retain(|k, _| invalid.iter().any(|i| &i.key == k));
                invalid
                    .iter()
                    .filter(|i| {
                        seen.insert(i.key.clone(), i.value.clone()).as_ref() != Some(&i.value)
                    })
                    .collect()
            }
        };
        for i in fresh {
            self.metrics.invalid_overwrite(i.family);
            let instead = match &i.instead {
                Instead::Kept(v) => format!("the last good value {v} stays"),
                Instead::FromAddresses(v) => format!("{v} from the node's addresses is used"),
                Instead::Nothing => "nothing is published until the node has an address".into(),
            };
            tracing::warn!(controller = NAME, node = name, annotation = %i.key, value = %i.value, reason = i.why, "ignoring invalid public IP overwrite");
            let note = format!(
                "annotation {} = {:?} is not a usable {} address ({}); {instead}",
                i.key,
                i.value,
                i.family.label(),
                i.why
            );
            self.recorder
                .publish(
                    &node.object_ref(),
                    EventType::Warning,
                    REASON_INVALID_OVERWRITE,
                    "PublishLease",
                    note,
                )
                .await;
        }
    }

    /// The sync handler: publish the lease of one Node if anything differs. Decides from the cache alone.
    /// While the subnet-allocator has a backlog a write gives way to it for up to [`GIVE_WAY`], then is
    /// decided again from the cache as it is by then.
    pub async fn sync_node(&self, name: &str) -> Result<SyncOutcome, SyncError> {
        if let Some(done) = self.decide_and_publish(name, true).await? {
            return Ok(done);
        }
        self.metrics.given_way.inc();
        self.allocation_backlog.give_way(GIVE_WAY).await;
        Ok(self
            .decide_and_publish(name, false)
            .await?
            .unwrap_or(SyncOutcome::Done))
    }

    /// Publishes the lease of one Node if anything differs; `None` if a write was due and, `may_give_way`,
    /// it gave way to the allocator's backlog instead.
    async fn decide_and_publish(
        &self,
        name: &str,
        may_give_way: bool,
    ) -> Result<Option<SyncOutcome>, SyncError> {
        let Some(node) = self.nodes.get(name) else {
            self.forget(name);
            return Ok(Some(SyncOutcome::Done));
        };
        if node.is_deleting() {
            // Going away: a lease for it would only make peers route to it a little longer.
            return Ok(Some(SyncOutcome::Done));
        }
        let current: BTreeMap<String, String> = node
            .annotations()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut plan = subnet_lease::plan(&self.config, &node, &current);
        if self.already_written(name, &node, &plan.changes) {
            plan.changes.clear();
        }
        self.set_waiting(name, plan.waiting.as_ref());
        if plan.waiting.is_some() || plan.changes.is_empty() {
            // Nothing to write, so nothing is left to an agent, and what the Event says about an invalid
            // overwrite is what the Node carries.
            self.undefer(name);
            self.report_invalid(&node, name, &plan.invalid).await;
            if let Some(w) = &plan.waiting {
                // Nothing to retry on a timer: the change that fixes it (pod CIDR, address) is a Node update.
                tracing::debug!(controller = NAME, node = name, reason = %w, "not publishing a lease yet");
            }
            return Ok(Some(SyncOutcome::Done));
        }
        // An agent's lease: netcm has no say in it, not even about the agent's overwrites. Who else owns
        // a lease key is in the cache (the declared annotation owners, netcm's own left out).
        if let Some(agent) = owner::agent_lease(&self.config.keys, node.annotation_owners()) {
            self.defer(name, agent, &plan);
            return Ok(Some(SyncOutcome::Done));
        }
        self.undefer(name);
        self.report_invalid(&node, name, &plan.invalid).await;
        if may_give_way && self.allocation_backlog.is_busy() {
            return Ok(None);
        }
        self.guard.ensure_leader()?;
        // Onto the cached version only: a Node changed since — an agent writing its lease — makes the PATCH
        // fail with 409 and be decided again, instead of being overwritten.
        let patch = serde_json::json!({ "metadata": {
            "annotations": &plan.changes,
            "resourceVersion": node.resource_version(),
        } });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.metrics.writes.inc();
        // The answer (the whole Node) is not read: decoding it into a `Node` only to drop it would make
        // hundreds of short-lived allocations per lease during a backlog, between the cache's long-lived
        // ones.
        let written = patch_unread(&self.api, name, &params, &Patch::Merge(&patch)).await;
        match written {
            Ok(_) => {
                let changed: Vec<String> = plan
                    .changes
                    .iter()
                    .map(|(k, v)| {
                        let short = k.strip_prefix(&self.config.keys.prefix).unwrap_or(k);
                        format!("{short}={v}")
                    })
                    .collect();
                tracing::info!(controller = NAME, node = name, changed = %changed.join(","), "published lease annotations");
                let digest = write_digest(name, node.resource_version(), &plan.changes);
                let mut st = self.state();
                netcm_table::make_room_for_one(&mut st.written);
                st.written.insert(name_key(name), digest);
                Ok(Some(SyncOutcome::Done))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.forget(name);
                Ok(Some(SyncOutcome::Done))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Err(SyncError::Conflict(kube::Error::Api(s)))
            }
            Err(e) => Err(SyncError::Patch(e)),
        }
    }
}

impl Reconciler for Syncer {
    type Error = SyncError;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Pod CIDRs, addresses, the annotations under the lease prefix (the lease and its overwrites) and
    /// which field managers other than netcm own them.
    fn node_fields(&self) -> NodeFields {
        NodeFields::none()
            .pod_cidrs()
            .addresses()
            .annotations(&self.config.keys.prefix)
            .annotation_owners(&self.config.keys.prefix, FIELD_MANAGER)
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, SyncError> {
        self.sync_node(key).await
    }
}

#[cfg(test)]
mod tests;

/// The key of a Node's entry in the syncer's per-Node memory of writes. Two names sharing a key only cost
/// a repeated PATCH: each write's digest names its Node.
fn name_key(name: &str) -> u64 {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

/// What identifies one write: the Node, the cached version it was planned on, and the values.
fn write_digest(name: &str, resource_version: &str, changes: &BTreeMap<String, String>) -> u64 {
    let mut h = DefaultHasher::new();
    (name, resource_version, changes).hash(&mut h);
    h.finish()
}

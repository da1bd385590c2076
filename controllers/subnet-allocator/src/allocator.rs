//! The sync handler: one Node key at a time, level-triggered from the cache.
//!
//! The ledger (`netcm_ipam::Pools`) is keyed by Node UID, never by name: a Node deleted and re-created
//! under its name — inside a watch gap, or while its key waited in a backlog — is a new Node, and what
//! was recorded for the old one (held, pending or claimed) is released, not inherited; with
//! `--cidr-release-hold` it is held for the name, and given back only if it is still a valid allocation
//! for the new Node ([`crate::release_hold`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use netcm_ipam::{Error as IpamError, NodeView, Pools};
use netcm_manager::sync_metrics::{api_reason, REASON_ERROR, REASON_FENCED};
use netcm_manager::CachedNode;
use netcm_manager::Key;
use netcm_manager::{
    EventRecorder, EventType, LeaderGuard, NodeFields, Reconciler, SharedInformer, SyncOutcome,
};
use netcm_node::PodCidrs;
use netcm_workqueue::Queue;
use parking_lot::Mutex;

use crate::bad_data::{assess, name_nodes, BadData, Subject};
use crate::claims::{ClaimError, Claims};
use crate::decision::{decide, Action, NodeFacts};
use crate::metrics::AllocatorMetrics;
use crate::state::State;

/// The controller's name: its workqueue, metrics label and log field.
pub const NAME: &str = "subnet-allocator";

/// A sync that must be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Every CIDR of a family is taken.
    #[error("{0}")]
    NoCidrAvailable(IpamError),
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] netcm_manager::Fenced),
    /// The PATCH failed and may succeed later; the allocation stays recorded for the Node.
    #[error("patching spec.podCIDRs: {0}")]
    Patch(#[from] kube::Error),
    /// The API refused the PATCH for good; the allocation was released.
    #[error("the API server rejected spec.podCIDRs {cidrs}: {message}")]
    Rejected {
        /// The CIDRs that were refused.
        cidrs: String,
        /// The API's message.
        message: String,
    },
    /// Claiming a block of CIDRs failed.
    #[error("PodCIDRClaim: {0}")]
    Claim(#[from] ClaimError),
    /// The PATCH could not be built (a bug: its parts are always valid JSON Patch).
    #[error("building the pod CIDR patch: {0}")]
    BuildPatch(serde_json::Error),
    /// Touching a Node to void an earlier leader's late write failed.
    #[error("touching a node an earlier leader may still be writing to: {0}")]
    VoidLateWrites(kube::Error),
    /// Reading the Node's labels for a ClusterCIDR pool's selector failed.
    #[error("reading the node's labels: {0}")]
    ReadLabels(kube::Error),
    /// Every block tried was claimed by an earlier leader while its blocks are quarantined.
    #[error("{0} blocks in a row were claimed by earlier leaders; retrying")]
    ClaimsExhausted(usize),
}

impl netcm_manager::SyncError for SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Patch(e) | Self::ReadLabels(e) | Self::VoidLateWrites(e) => api_reason(e),
            Self::Claim(e) => e.reason(),
            Self::NoCidrAvailable(_)
            | Self::Rejected { .. }
            | Self::ClaimsExhausted(_)
            | Self::BuildPatch(_) => REASON_ERROR,
        }
    }
}

/// The allocator's shared state.
///
/// Locks, the one rule: the data that changes is one `State` (`state.rs`) behind one lock, `state`, a
/// parking_lot mutex held for a few steps of bookkeeping — never across an `.await` (its guard is not
/// `Send`, so the spawned futures would not compile) and never while calling a method of `Allocator`
/// that takes it again (it is not reentrant). The two tokio mutexes guard no data: each makes one
/// sequence of API calls run once at a time — `block_create` a block's claim create, `voiding` a pass
/// touching the quarantine's Nodes — so `state` is taken inside them, never they inside `state`. Locks
/// of other parts taken while `state` is held (the ClusterCIDR store's, the Node cache's, the
/// metrics') are leaves: nothing takes `state` while holding one of them.
pub struct Allocator {
    pub(crate) nodes: SharedInformer<CachedNode>,
    pub(crate) api: Api<Node>,
    /// The ledger, the blocks, the tracked, waiting and bad-data Nodes: see the rule above.
    pub(crate) state: Mutex<State>,
    pub(crate) queue: Queue<Key>,
    pub(crate) recorder: EventRecorder,
    pub(crate) guard: LeaderGuard,
    pub(crate) metrics: AllocatorMetrics,
    /// PodCIDRClaims, unless `--pod-cidr-claims=false`.
    pub(crate) claims: Option<Claims>,
    /// This leader's term as the claims it creates, adopts or marks idle name it
    /// ([`crate::claims::TERM_ANNOTATION`]): its holder identity on the Lease.
    pub(crate) term: Box<str>,
    /// Held while a block's claim is created, so two workers never race to create one block.
    pub(crate) block_create: tokio::sync::Mutex<()>,
    /// Requests to the claim-ahead task (`claim_ahead.rs`), unless `--pod-cidr-claims=false`.
    pub(crate) claim_ahead: Option<tokio::sync::mpsc::Sender<ipnet::IpNet>>,
    /// Held while the Nodes of the quarantine are touched, so one pass runs at a time.
    pub(crate) voiding: tokio::sync::Mutex<()>,
    pub(crate) record_assigned: bool,
    /// Wakes the ClusterCIDR pool reconciler, unless `--cluster-cidr-objects=false`: a Node release may
    /// have drained a deleted pool. A bare signal, so this module needs nothing of `cluster_cidrs`, which
    /// builds on it.
    pub(crate) pools_changed: Option<Arc<tokio::sync::Notify>>,
    /// `--cidr-release-hold`: how long a deleted Node's CIDRs stay out of allocation (zero: not at all).
    pub(crate) release_hold: std::time::Duration,
    /// `--cidr-release-hold-rejoin-by-provider-id` (with a hold): a Node under another name with a held
    /// Node's `spec.providerID` re-joins as it. Off, providerIDs are neither cached nor kept.
    pub(crate) rejoin_by_provider_id: bool,
    /// Wakes the task that ends release holds ([`crate::release_hold`]) when one starts.
    pub(crate) release_hold_started: tokio::sync::Notify,
    /// Set once the CIDRs every cached Node held at the start are in the ledger: until then an empty
    /// pool says nothing (a new leader loads the pools *before* it records the Nodes).
    pub(crate) existing_recorded: std::sync::atomic::AtomicBool,
}

/// What the decision step needs of a cached Node.
pub(crate) fn facts(node: &CachedNode) -> NodeFacts {
    NodeFacts {
        uid: node.uid().to_string(),
        pod_cidrs: node.raw_pod_cidrs().map(str::to_string).collect(),
        deleting: node.is_deleting(),
    }
}

/// Why a Node's CIDRs were released, as the log says it: a write refused is not a Node deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReason {
    /// The Node was deleted (or re-created under its name with another UID).
    NodeDeleted,
    /// The API said the Node is gone when its CIDRs were written.
    NodeGone,
    /// The write was refused or could not be confirmed; the Node is synced again.
    WriteNotLanded,
    /// An earlier leader claimed the chosen CIDR's block; another CIDR is chosen.
    BlockClaimedEarlier,
}

impl ReleaseReason {
    /// The log's words for it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::NodeDeleted => "the node was deleted",
            ReleaseReason::NodeGone => "the node was gone when its CIDRs were written",
            ReleaseReason::WriteNotLanded => {
                "the write of its CIDRs did not land; the node is synced again"
            }
            ReleaseReason::BlockClaimedEarlier => {
                "an earlier leader claimed the block; choosing elsewhere"
            }
        }
    }
}

impl Allocator {
    pub(crate) fn publish_usage(&self, pools: &Pools) {
        self.metrics.publish(&pools.stats());
    }

    fn publish_bad_data(&self, bad_data: &BadData) {
        self.metrics.conflicts.set(bad_data.flagged() as i64);
        self.metrics.oversized.set(bad_data.oversized() as i64);
    }

    /// Counts `released` CIDRs in the metrics of the pools and cluster CIDRs they came from.
    pub(crate) fn count_released(&self, pools: &Pools, released: &[IpNet]) {
        for cidr in released {
            if let Some((pool, cluster)) = pools.pool_of(*cidr) {
                self.metrics.released(pool, &cluster.to_string());
            }
        }
        self.publish_usage(pools);
    }

    /// Releases what the Node `name` with UID `uid` held or had pending, `why` (for the log), and wakes the
    /// waiting Nodes the CIDRs could serve. Its block stays claimed: the CIDRs go back to this leader's blocks.
    pub(crate) async fn release(
        &self,
        name: &str,
        uid: &str,
        why: ReleaseReason,
    ) -> Result<(), SyncError> {
        self.release_until(name, uid, None, why).await.map(drop)
    }

    /// [`Allocator::release`], or with `held_until` the release hold: the CIDRs stay out of allocation
    /// until then, except for a Node that comes back under `name` or a pool with nothing else free.
    /// Returns the CIDRs put in release hold (whose waking is the caller's: not on a re-creation).
    pub(crate) async fn release_until(
        &self,
        name: &str,
        uid: &str,
        held_until: Option<Instant>,
        why: ReleaseReason,
    ) -> Result<Vec<IpNet>, SyncError> {
        let mut held = Vec::new();
        let mut held_provider_id = None;
        let mut ended_holds = Vec::new();
        let released = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let pools = &mut state.pools;
            let released = match held_until {
                Some(until) => {
                    let provider_id = state.provider_ids.get(name).map(|id| &**id);
                    held = pools.release_node_with_hold(uid, name, provider_id, until);
                    held_provider_id = provider_id.map(str::to_string);
                    ended_holds = self.take_ended_holds(pools);
                    self.publish_usage(pools);
                    if !held.is_empty() {
                        self.release_hold_started.notify_one();
                        tracing::info!(controller = NAME, node = name, uid, cidrs = ?held.iter().map(ToString::to_string).collect::<Vec<_>>(), hold = ?self.release_hold, "holding the pod CIDRs of a deleted node before they are handed out again");
                    }
                    Vec::new()
                }
                None => pools.release_node(uid),
            };
            if held_until.is_none() {
                self.count_released(pools, &released);
            }
            released
        };
        self.report_ended_holds(ended_holds, None).await;
        if !held.is_empty() {
            self.record_release_hold(name, held_provider_id, &held)
                .await;
        }
        {
            let mut state = self.state.lock();
            state.tracking.forget(name, uid);
            state.bad_data.forget(name);
            self.publish_bad_data(&state.bad_data);
            state.waiting.remove(name);
            if self.nodes.get(name).is_none_or(|n| n.uid() == uid) {
                state.provider_ids.remove(name);
            }
        }
        if released.is_empty() {
            return Ok(held);
        }
        tracing::info!(controller = NAME, node = name, uid, cidrs = ?released.iter().map(ToString::to_string).collect::<Vec<_>>(), reason = why.as_str(), "released pod CIDRs");
        self.wake_waiting_for(&released);
        // A draining ClusterCIDR may have lost its last holder: its finalizer can go now.
        if let Some(changed) = &self.pools_changed {
            changed.notify_one();
        }
        Ok(held)
    }

    /// Requeues every Node waiting for a CIDR: for what may serve any of them (a new pool, the end of the
    /// quarantine).
    pub(crate) fn wake_waiting(&self) {
        let waiting: Vec<String> = self
            .state
            .lock()
            .waiting
            .names()
            .map(str::to_string)
            .collect();
        for w in waiting {
            self.queue.add(w.into());
        }
    }

    /// Requeues the waiting Nodes that `freed` (CIDRs just released, or put in release hold) could serve
    /// ([`netcm_ipam::Pools::could_serve`], by the labels each was last allocated with), the longest
    /// waiting first, as many as `freed` holds node CIDRs. Each woken Node reads its labels from the API
    /// (the cache keeps none), so waking every waiting Node would cost a read per Node for one CIDR; one
    /// woken that no longer takes it (its labels changed) leaves the rest to the next release or their
    /// backoff.
    pub(crate) fn wake_waiting_for(&self, freed: &[IpNet]) {
        if freed.is_empty() {
            return;
        }
        let woken: Vec<String> = {
            let state = self.state.lock();
            let pools = &state.pools;
            let room = usize::try_from(pools.node_cidrs_within(freed)).unwrap_or(usize::MAX);
            // A Node that waited before a pool read labels has none kept: it may be served.
            let unknown = pools.selects_by_label();
            let no_labels = BTreeMap::new();
            state
                .waiting
                .longest_first()
                .into_iter()
                .filter(|name| {
                    let labels = state.waiting_labels.get(*name);
                    if unknown && labels.is_none() {
                        return true;
                    }
                    let node = self.nodes.get(name);
                    let view = NodeView {
                        name,
                        labels: labels.unwrap_or(&no_labels),
                        provider_id: None,
                    };
                    let pods = node.as_deref().and_then(CachedNode::capacity_pods);
                    pools.could_serve(&view, pods.map(u64::from), freed)
                })
                .take(room)
                .map(str::to_string)
                .collect()
        };
        for w in woken {
            self.queue.add(w.into());
        }
    }

    /// Records the CIDRs a Node already has and reports bad data on it.
    pub(crate) async fn record_existing(
        &self,
        node: &CachedNode,
        name: &str,
        uid: &str,
        raw: &[String],
    ) {
        let PodCidrs {
            cidrs: parsed,
            unparsable,
        } = PodCidrs::parse(raw);
        let subject = Subject { name, uid };
        let (assessed, ended_holds) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            state.pools.record_node(uid, &parsed);
            let ended_holds = self.take_ended_holds(&mut state.pools);
            self.publish_usage(&state.pools);
            let owner = state.pools.owner(uid).unwrap_or_else(|| uid.into());
            state.tracking.track(name, owner);
            state.tracking.shown(name);
            let assessed = assess(
                &state.pools,
                &mut state.bad_data,
                subject,
                &unparsable,
                Instant::now(),
            );
            self.publish_bad_data(&state.bad_data);
            (assessed, ended_holds)
        };
        self.report_ended_holds(ended_holds, Some(name)).await;
        // A turn of its own: when Events are due, naming the Nodes scans every tracked one.
        let plan = {
            let mut state = self.state.lock();
            let plan = name_nodes(
                assessed,
                &state.tracking,
                &state.bad_data,
                subject,
                &unparsable,
            );
            state.waiting.remove(name);
            plan
        };
        if plan.bad && plan.events.is_empty() {
            tracing::debug!(
                controller = NAME,
                node = name,
                "bad pod CIDRs on node; its Events were published within the window"
            );
        }
        for other in plan.requeue {
            self.queue.add(other.into());
        }
        let about = node.object_ref();
        for event in plan.events {
            tracing::warn!(controller = NAME, node = %event.node, reason = event.reason, note = %event.note, "bad pod CIDR on node");
            self.recorder
                .publish(
                    &about,
                    EventType::Warning,
                    event.reason,
                    "RecordCIDR",
                    event.note,
                )
                .await;
        }
    }

    /// The sync handler: allocate for a Node without pod CIDRs, record a Node that has them, release a
    /// Node that is gone or was re-created under its name. Decides from the cache alone.
    pub async fn sync_node(&self, name: &str) -> Result<SyncOutcome, SyncError> {
        let node = self.nodes.get(name);
        let facts = node.as_deref().map(facts);
        let recorded = self.state.lock().tracking.recorded(name);
        let decision = decide(facts.as_ref(), &recorded);
        // A Node of the quarantine that holds CIDRs is settled only once they are recorded (below):
        // settled first, the last one would free the quarantine's ranges with its CIDR in them.
        if decision.action != Action::Record {
            self.settle_quarantine(name, facts.as_ref().map(|f| f.uid.as_str()), false);
        }
        if let Some(previous) = &decision.release_previous {
            tracing::info!(controller = NAME, node = name, old_uid = %previous, "node was re-created under its name; releasing what the old node held");
            self.release_deleted(name, previous).await?;
        }
        match &node {
            Some(node) => self.remember_provider_id(name, node.provider_id()),
            // Gone before it held anything: nothing to hold, nothing to remember.
            None if recorded.uid.is_none() => self.remember_provider_id(name, None),
            // Its release below records the providerID with the hold, then forgets it.
            None => {}
        }
        match (decision.action, node, facts) {
            (Action::Release, _, _) => {
                if let Some(uid) = &recorded.uid {
                    let held = self.release_deleted(name, uid).await?;
                    // A Node waiting on a full pool may take CIDRs just put in release hold (its pool
                    // has nothing else); without this it waits out its backoff, up to the queue's
                    // longest. Not on a re-creation: the new Node under the name takes them back first.
                    self.wake_waiting_for(&held);
                }
                Ok(SyncOutcome::Done)
            }
            (Action::Record, Some(node), Some(facts)) => {
                self.record_existing(&node, name, &facts.uid, &facts.pod_cidrs)
                    .await;
                self.settle_quarantine(name, Some(&facts.uid), true);
                Ok(SyncOutcome::Done)
            }
            (Action::Allocate, Some(node), Some(facts)) => {
                self.allocate_and_write(&node, name, &facts.uid).await
            }
            _ => Ok(SyncOutcome::Done),
        }
    }

    /// Keeps the Node's `spec.providerID` for its release hold, when holds go back by providerID.
    fn remember_provider_id(&self, name: &str, provider_id: Option<&str>) {
        if !self.rejoin_by_provider_id {
            return;
        }
        let mut state = self.state.lock();
        match provider_id.filter(|id| !id.is_empty()) {
            Some(id) if state.provider_ids.get(name).map(|k| &**k) != Some(id) => {
                state.provider_ids.insert(name.into(), id.into());
            }
            Some(_) => {}
            None => {
                state.provider_ids.remove(name);
            }
        }
    }

    /// Marks the Node's successful write, so a sync before the cache shows it does not write again.
    pub(crate) fn mark_written(&self, name: &str, uid: &str) {
        self.state.lock().tracking.mark_written(name, uid);
    }

    /// Marks every CIDR any cached Node holds before the first allocation.
    pub async fn record_all_existing(self: &Arc<Self>) {
        let nodes = self.nodes.list();
        let mut recorded = 0usize;
        for node in nodes {
            let name = node.name().to_string();
            let f = facts(&node);
            if !f.pod_cidrs.is_empty() {
                self.record_existing(&node, &name, &f.uid, &f.pod_cidrs)
                    .await;
                recorded += 1;
            }
        }
        self.existing_recorded
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let stats = self.state.lock().pools.stats();
        for s in &stats {
            tracing::info!(controller = NAME, cluster_cidr = %s.cluster_cidr, allocated = s.allocated, max = s.max, "cluster CIDR usage after recording existing nodes");
        }
        tracing::info!(
            controller = NAME,
            nodes_with_cidrs = recorded,
            "recorded the pod CIDRs nodes already hold"
        );
    }

    /// Records that the Node `uid` is waiting for a free CIDR and tells the Node why.
    pub(crate) async fn wait_for_cidr(
        &self,
        node: &CachedNode,
        name: &str,
        e: IpamError,
    ) -> SyncError {
        self.state.lock().waiting.insert(name);
        tracing::warn!(controller = NAME, node = name, error = %e, "no pod CIDR available");
        // A pool may be full because a Node holds a pod CIDR wider than a node CIDR: name it here too.
        let blocking = {
            let state = self.state.lock();
            let bad_data = &state.bad_data;
            let (named, all) = (bad_data.oversized_nodes(3), bad_data.oversized());
            if named.is_empty() {
                String::new()
            } else {
                format!(
                    "; {all} Node(s) hold a pod CIDR wider than a node CIDR, which netcm keeps reserved whole: {}{} (see their CIDROversized Events)",
                    named.join(", "),
                    if all > named.len() { ", …" } else { "" }
                )
            }
        };
        self.recorder
            .publish(
                &node.object_ref(),
                EventType::Warning,
                "CIDRNotAvailable",
                "AllocateCIDR",
                format!("Node {name} status is now: CIDRNotAvailable ({e}){blocking}"),
            )
            .await;
        SyncError::NoCidrAvailable(e)
    }
}

impl Reconciler for Allocator {
    type Error = SyncError;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Pod CIDRs, also for [`Allocator::record_all_existing`], and the fence annotation its PATCH tests
    /// (set only on Nodes a leader touched); Events name the Node by its identity.
    /// No labels: a ClusterCIDR pool's selector reads them from the API, once per allocation
    /// ([`Allocator::labels_for_pools`]). The pod capacity, for pools sized from it: declared whatever
    /// the flags, because a ClusterCIDR can ask for sizing at any time, and it costs no memory (it fills
    /// the cached Node's padding).
    /// With a release hold that goes back by providerID, `spec.providerID` too: a Node re-created under
    /// another name on the same machine gets back what its machine held.
    fn node_fields(&self) -> NodeFields {
        let fields = NodeFields::none()
            .pod_cidrs()
            .annotations(crate::blocks::FENCED_AT_ANNOTATION)
            .capacity_pods();
        if self.rejoin_by_provider_id {
            fields.provider_id()
        } else {
            fields
        }
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, SyncError> {
        self.sync_node(key).await
    }
}

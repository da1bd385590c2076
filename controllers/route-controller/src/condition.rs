//! The Node condition `NetworkUnavailable`, with the cloud route controller's exact strings, written by
//! its own small queue so route programming never waits on the API server.
//!
//! The write is cloud-provider's `SetNodeCondition`: a strategic-merge PATCH of
//! `{"status":{"conditions":[cond]}}` on `nodes/<name>/status` (conditions merge by `type`), made only
//! when the status or reason differs from what the Node already says, behind the leader fence.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use netcm_manager::sync_metrics::{api_reason, REASON_FENCED};
use netcm_manager::ttl_cache::TtlCache;
use netcm_manager::Key;
use netcm_manager::{
    CachedNode, Fenced, LeaderGuard, NodeFields, Reconciler, SharedInformer, SyncOutcome,
};
use netcm_workqueue::Queue;

/// How long a condition write may take to show up in the cache before it is written again.
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// The condition type.
pub const CONDITION_TYPE: &str = "NetworkUnavailable";

/// A condition value: status, reason and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// `True` (unavailable) or `False`.
    pub status: &'static str,
    /// The machine-readable reason.
    pub reason: &'static str,
    /// The human-readable message.
    pub message: &'static str,
}

/// Every pod CIDR of the Node has its route.
pub const ROUTE_CREATED: Verdict = Verdict {
    status: "False",
    reason: "RouteCreated",
    message: "RouteController created a route",
};

/// Some pod CIDR of the Node has no route.
pub const NO_ROUTE_CREATED: Verdict = Verdict {
    status: "True",
    reason: "NoRouteCreated",
    message: "RouteController failed to create a route",
};

/// Why a condition write failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The PATCH failed.
    #[error("patching the NetworkUnavailable condition: {0}")]
    Patch(#[from] kube::Error),
}

impl netcm_manager::SyncError for ConditionError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Patch(e) => api_reason(e),
        }
    }
}

/// Whether the Node's condition differs from `verdict` in status or reason (the message and times do
/// not count, as in the cloud route controller).
pub fn needs_write(node: &CachedNode, verdict: &Verdict) -> bool {
    match node.condition(CONDITION_TYPE) {
        Some(c) => c.status != verdict.status || c.reason != Some(verdict.reason),
        None => true,
    }
}

/// The PATCH body: one condition with transition and heartbeat time `now`.
pub fn patch_body(verdict: &Verdict, now: jiff::Timestamp) -> serde_json::Value {
    let condition = NodeCondition {
        type_: CONDITION_TYPE.to_string(),
        status: verdict.status.to_string(),
        reason: Some(verdict.reason.to_string()),
        message: Some(verdict.message.to_string()),
        last_transition_time: Some(Time(now)),
        last_heartbeat_time: Some(Time(now)),
    };
    serde_json::json!({ "status": { "conditions": [condition] } })
}

/// Holds the verdict of each Node's last route sync and writes it to the Node when it changes.
pub struct ConditionWriter {
    api: Api<Node>,
    nodes: SharedInformer<CachedNode>,
    guard: LeaderGuard,
    /// Node names whose condition may need a write.
    pub queue: Queue<Key>,
    verdicts: Mutex<HashMap<String, Verdict>>,
    /// Writes not yet seen in the cache (client-go's "expectations"): until the cache shows a Node's
    /// write, or [`EXPECTATION_TTL`] passes, the same verdict is not written again. Without this, an
    /// update by someone else that reaches the cache before our own write would cause a second PATCH.
    pending: TtlCache<String, Verdict>,
}

impl ConditionWriter {
    /// A writer with its own queue.
    pub fn new(
        api: Api<Node>,
        nodes: SharedInformer<CachedNode>,
        guard: LeaderGuard,
        queue: Queue<Key>,
    ) -> Self {
        Self {
            api,
            nodes,
            guard,
            queue,
            verdicts: Mutex::new(HashMap::new()),
            pending: TtlCache::new(EXPECTATION_TTL),
        }
    }

    /// Records a Node's verdict (`None`: the Node is not the controller's concern) and queues a write
    /// if the cached Node says otherwise.
    pub fn set(&self, node: &str, verdict: Option<Verdict>) {
        let mut verdicts = self.verdicts.lock();
        match verdict {
            Some(v) => {
                verdicts.insert(node.to_string(), v);
                drop(verdicts);
                if self.nodes.get(node).is_some_and(|n| needs_write(&n, &v)) {
                    self.queue.add(node.into());
                }
            }
            None => {
                verdicts.remove(node);
                drop(verdicts);
                self.pending.remove(node);
            }
        }
    }

    /// Writes the Node's condition if its status or reason differs from the verdict.
    pub async fn sync(&self, name: &str) -> Result<SyncOutcome, ConditionError> {
        let verdict = self.verdicts.lock().get(name).copied();
        let (Some(verdict), Some(node)) = (verdict, self.nodes.get(name)) else {
            return Ok(SyncOutcome::Done);
        };
        if !needs_write(&node, &verdict) {
            self.pending.remove(name);
            return Ok(SyncOutcome::Done);
        }
        if let Some((written, left)) = self.pending.get_with_remaining(name) {
            if written == verdict {
                // Our own write is on its way to the cache; look again once it must have arrived.
                return Ok(SyncOutcome::RetryAfter(left));
            }
        }
        self.guard.ensure_leader()?;
        let body = patch_body(&verdict, jiff::Timestamp::now());
        match self
            .api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            Ok(_) => {
                self.pending.insert(name.to_string(), verdict);
                tracing::info!(
                    controller = crate::NAME,
                    node = name,
                    status = verdict.status,
                    reason = verdict.reason,
                    "set condition NetworkUnavailable"
                );
                Ok(SyncOutcome::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(SyncOutcome::Done),
            Err(e) => Err(ConditionError::Patch(e)),
        }
    }
}

impl Reconciler for ConditionWriter {
    type Error = ConditionError;

    fn name(&self) -> &'static str {
        crate::CONDITIONS_QUEUE
    }

    fn node_fields(&self) -> NodeFields {
        NodeFields::none().condition(CONDITION_TYPE)
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, ConditionError> {
        ConditionWriter::sync(self, key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_condition(status: &str, reason: &str) -> CachedNode {
        let mut b = CachedNode::builder("n1", "u1", "1");
        b.condition(netcm_node::Condition {
            type_: CONDITION_TYPE,
            status,
            reason: Some(reason),
            message: Some("whatever"),
        });
        b.build()
    }

    #[test]
    fn the_strings_are_the_cloud_route_controllers() {
        assert_eq!(
            (
                ROUTE_CREATED.status,
                ROUTE_CREATED.reason,
                ROUTE_CREATED.message
            ),
            ("False", "RouteCreated", "RouteController created a route")
        );
        assert_eq!(
            (
                NO_ROUTE_CREATED.status,
                NO_ROUTE_CREATED.reason,
                NO_ROUTE_CREATED.message
            ),
            (
                "True",
                "NoRouteCreated",
                "RouteController failed to create a route"
            )
        );
    }

    #[test]
    fn a_write_is_needed_only_when_status_or_reason_differ() {
        assert!(needs_write(
            &CachedNode::builder("n1", "u1", "1").build(),
            &ROUTE_CREATED
        ));
        assert!(!needs_write(
            &with_condition("False", "RouteCreated"),
            &ROUTE_CREATED
        ));
        assert!(needs_write(
            &with_condition("True", "NoRouteCreated"),
            &ROUTE_CREATED
        ));
        // flannel's own condition has the same status but another reason: netcm takes the condition over.
        assert!(needs_write(
            &with_condition("False", "FlannelIsUp"),
            &ROUTE_CREATED
        ));
    }

    #[test]
    fn the_patch_carries_one_condition_under_status() {
        let now: jiff::Timestamp = "2025-01-02T03:04:05Z".parse().expect("time");
        let body = patch_body(&NO_ROUTE_CREATED, now);
        let conds = body["status"]["conditions"].as_array().expect("array");
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["type"], "NetworkUnavailable");
        assert_eq!(conds[0]["status"], "True");
        assert_eq!(conds[0]["reason"], "NoRouteCreated");
        assert_eq!(
            conds[0]["message"],
            "RouteController failed to create a route"
        );
        assert_eq!(conds[0]["lastTransitionTime"], "2025-01-02T03:04:05Z");
    }
}

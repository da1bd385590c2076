//! KEP-1623 conditions of a ClusterCIDR's status (`metav1.Condition`), for kstatus, Argo CD and
//! `kubectl wait`. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use netcm_ipam::PoolState;
use serde_json::{json, Value};

/// Condition types netcm writes, in the order written.
pub(crate) const READY: &str = "Ready";
/// True while the pool is refused.
pub(crate) const REFUSED: &str = "Refused";
/// True while the pool is deleted and held by its finalizer.
pub(crate) const DRAINING: &str = "Draining";
/// kstatus's abnormal-true condition: present (True) only while the pool is refused, which nothing but
/// a change to the pools (or the Nodes) undoes; kstatus then reads the pool as Failed, not InProgress.
pub(crate) const STALLED: &str = "Stalled";

/// The conditions of a pool in `state` (KEP-1623, `metav1.Condition`):
///
/// | state | Ready | Refused | Draining | Stalled |
/// |---|---|---|---|---|
/// | Active | True `Allocating` | False `Accepted` | False `NotDeleted` | — |
/// | Refused | False, the refusal's reason | True, the reason | False `NotDeleted` | True, the reason |
/// | Draining | False `Draining` | False `Deleted` | True `Deleted` | — |
///
/// Each condition's `lastTransitionTime` is the one in `previous` while its status stays, else `now`.
pub(crate) fn conditions(
    state: &PoolState,
    message: &str,
    generation: i64,
    previous: Option<&Value>,
    now: &Time,
) -> Value {
    let (ready, refused, draining, stalled) = match state {
        PoolState::Active => (
            ("True", "Allocating", "the pool gives pod CIDRs to the Nodes it selects"),
            (
                "False",
                "Accepted",
                "the spec is valid; its ranges overlap no other pool's, the service range or a Node's CIDR",
            ),
            ("False", "NotDeleted", "the pool is not deleted"),
            None,
        ),
        PoolState::Refused(r) => (
            ("False", r.reason(), message),
            ("True", r.reason(), message),
            ("False", "NotDeleted", "the pool is not deleted"),
            Some(("True", r.reason(), message)),
        ),
        PoolState::Draining => (
            ("False", "Draining", message),
            ("False", "Deleted", "a deleted pool gives out nothing new and is not checked again"),
            ("True", "Deleted", message),
            None,
        ),
    };
    let list = [
        Some((READY, ready)),
        Some((REFUSED, refused)),
        Some((DRAINING, draining)),
        stalled.map(|s| (STALLED, s)),
    ];
    Value::Array(
        list.into_iter()
            .flatten()
            .map(|(type_, (status, reason, message))| {
                json!({
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": bounded(message),
                    "lastTransitionTime": transition_time(previous, type_, status, now),
                    "observedGeneration": generation,
                })
            })
            .collect(),
    )
}

/// Whether the API server dropped the conditions of `written` (a status) from `returned` (the object
/// the write returned): the installed CRD has no `conditions` in its status schema and prunes them.
pub(crate) fn conditions_pruned(written: &Value, returned: &DynamicObject) -> bool {
    written.get("conditions").is_some()
        && returned
            .data
            .get("status")
            .is_none_or(|s| s.get("conditions").is_none())
}

/// `metav1.Condition`'s limit on `message`, in bytes: a longer one would fail the whole status write.
pub(super) const MAX_MESSAGE: usize = 32768;

/// `message` cut to [`MAX_MESSAGE`] bytes, at a character boundary.
pub(super) fn bounded(message: &str) -> &str {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// The `lastTransitionTime` of condition `type_` with `status`: kept from `previous` if it had the
/// same status there (verbatim, so an unchanged status compares equal and is not written again),
/// else `now`.
fn transition_time(previous: Option<&Value>, type_: &str, status: &str, now: &Time) -> Value {
    previous
        .and_then(|p| p["conditions"].as_array())
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .filter(|c| c["status"] == status)
        .map(|c| c["lastTransitionTime"].clone())
        .filter(Value::is_string)
        .unwrap_or_else(|| json!(now))
}

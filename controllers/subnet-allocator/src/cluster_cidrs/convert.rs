//! ClusterCIDR objects (`networking.x-k8s.io/v1`, read as dynamic objects) into `netcm-ipam` pools, and
//! the status netcm writes back. Pure.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector as K8sSelector, NodeSelectorRequirement};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use netcm_ipam::{
    NodeSelector, ObjectPool, PoolReport, PoolSpec, PoolState, Requirement, SelectorTerm,
    SIZE_FROM_PODS_ANNOTATION,
};
use serde_json::{json, Value};

mod conditions;
use conditions::conditions;
pub(crate) use conditions::conditions_pruned;

/// Sorts ClusterCIDR objects into the order pools are ranked in: oldest first, then by name, so every
/// leader (and `netcm check`) agrees without having seen them arrive.
pub fn sort_oldest_first(objects: &mut [DynamicObject]) {
    objects.sort_by_cached_key(|o| {
        (
            o.metadata.creation_timestamp.as_ref().map(|t| t.0),
            o.metadata.name.clone(),
        )
    });
}

/// The pool a ClusterCIDR object describes (also what `netcm check` counts by).
pub fn object_pool(obj: &DynamicObject) -> ObjectPool {
    ObjectPool {
        name: obj.metadata.name.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        spec: spec(&obj.data["spec"]).and_then(|s| sized(s, obj)),
        deleting: obj.metadata.deletion_timestamp.is_some(),
        modified: obj.metadata.generation.unwrap_or(1) > unmodified_generation(obj),
    }
}

/// The generation of an object whose spec was never changed: 1, and 2 once it is being deleted (the API
/// server bumps `generation` when it sets `deletionTimestamp`) — else a new leader would read every
/// draining pool as modified, refuse it and release its finalizer while Nodes still hold its CIDRs.
fn unmodified_generation(obj: &DynamicObject) -> i64 {
    if obj.metadata.deletion_timestamp.is_some() {
        2
    } else {
        1
    }
}

/// `spec` with the object's [`SIZE_FROM_PODS_ANNOTATION`], if any: a value that does not parse makes the
/// spec unusable (the pool is refused with the reason) rather than silently fixed-size.
fn sized(mut spec: PoolSpec, obj: &DynamicObject) -> Result<PoolSpec, String> {
    let value = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIZE_FROM_PODS_ANNOTATION));
    if let Some(value) = value {
        let range = value
            .parse()
            .map_err(|e| format!("{SIZE_FROM_PODS_ANNOTATION}: {e}"))?;
        spec.sizing = Some(range);
    }
    Ok(spec)
}

/// Reads a ClusterCIDR spec; an error says what is wrong with it.
pub(crate) fn spec(v: &Value) -> Result<PoolSpec, String> {
    let per_node_host_bits = v["perNodeHostBits"]
        .as_i64()
        .ok_or("perNodeHostBits is missing")?;
    let cidr = |field: &str| -> Result<Option<IpNet>, String> {
        match v[field].as_str().map(str::trim) {
            None | Some("") => Ok(None),
            Some(s) => s
                .parse::<IpNet>()
                .map(|n| Some(n.trunc()))
                .map_err(|e| format!("{field} {s:?}: {e}")),
        }
    };
    let selector = match v.get("nodeSelector") {
        None | Some(Value::Null) => NodeSelector::Fallback,
        Some(ns) => {
            let ns: K8sSelector =
                serde_json::from_value(ns.clone()).map_err(|e| format!("nodeSelector: {e}"))?;
            selector(&ns)?
        }
    };
    Ok(PoolSpec {
        selector,
        per_node_host_bits,
        ipv4: cidr("ipv4")?,
        ipv6: cidr("ipv6")?,
        sizing: None,
    })
}

fn selector(ns: &K8sSelector) -> Result<NodeSelector, String> {
    let reqs = |list: &Option<Vec<NodeSelectorRequirement>>| -> Result<Vec<Requirement>, String> {
        list.iter()
            .flatten()
            .map(|r| {
                Ok(Requirement {
                    key: r.key.clone(),
                    operator: r.operator.parse()?,
                    values: r.values.clone().unwrap_or_default(),
                })
            })
            .collect()
    };
    let terms = ns
        .node_selector_terms
        .iter()
        .map(|t| {
            Ok(SelectorTerm {
                match_expressions: reqs(&t.match_expressions)?,
                match_fields: reqs(&t.match_fields)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(NodeSelector::Terms(terms))
}

/// The status netcm writes for a pool: phase, why it is refused, the selector in short, counts, and
/// the KEP-1623 conditions GitOps tools read ([`conditions`]). `previous` is the object's status as
/// read, so a condition whose status did not change keeps its `lastTransitionTime`; `now` is the time
/// of a transition. Without `with_conditions` (a CRD that prunes them) none are written.
pub(crate) fn status(
    report: &PoolReport,
    waiting: usize,
    generation: Option<i64>,
    previous: Option<&Value>,
    now: &Time,
    with_conditions: bool,
) -> Value {
    let message = message(report);
    let generation = generation.unwrap_or(1);
    let mut status = json!({
        "phase": report.state.phase(),
        "message": message,
        "selector": report.selector,
        "allocated": report.holders,
        "capacity": report.capacity,
        "waiting": waiting,
        "observedGeneration": generation,
    });
    if with_conditions {
        status["conditions"] = conditions(&report.state, &message, generation, previous, now);
    }
    status
}

/// What `status.message` says: why the pool is refused, or what holds a deleted one.
fn message(report: &PoolReport) -> String {
    match &report.state {
        PoolState::Refused(r) => r.to_string(),
        PoolState::Draining => format!(
            "deleted; the finalizer stays until no Node holds a CIDR from this pool ({} do)",
            report.holders
        ),
        PoolState::Active => String::new(),
    }
}

#[cfg(test)]
mod tests;

//! ClusterCIDR objects (`networking.x-k8s.io/v1`, read as dynamic objects) into `netcm-ipam` pools, and
//! the status netcm writes back. Pure.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector as K8sSelector, NodeSelectorRequirement};
use kube::api::DynamicObject;
use netcm_ipam::{NodeSelector, ObjectPool, PoolReport, PoolSpec, PoolState, Requirement, Term};
use serde_json::{json, Value};

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
        spec: spec(&obj.data["spec"]),
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
            Ok(Term {
                match_expressions: reqs(&t.match_expressions)?,
                match_fields: reqs(&t.match_fields)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(NodeSelector::Terms(terms))
}

/// The status netcm writes for a pool: phase, why it is refused, the selector in short, and counts.
pub(crate) fn status(report: &PoolReport, waiting: usize, generation: Option<i64>) -> Value {
    let message = match &report.state {
        PoolState::Refused(r) => r.to_string(),
        PoolState::Draining => format!(
            "deleted; the finalizer stays until no Node holds a CIDR from this pool ({} do)",
            report.holders
        ),
        PoolState::Active => String::new(),
    };
    json!({
        "phase": report.state.phase(),
        "message": message,
        "selector": report.selector,
        "allocated": report.holders,
        "capacity": report.capacity,
        "waiting": waiting,
        "observedGeneration": generation.unwrap_or(1),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn object(generation: i64, deleting: bool) -> DynamicObject {
        let mut meta = json!({"name": "p", "uid": "u", "generation": generation});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-11-25T21:05:04Z");
        }
        serde_json::from_value(json!({
            "apiVersion": "networking.x-k8s.io/v1",
            "kind": "ClusterCIDR",
            "metadata": meta,
            "spec": {"perNodeHostBits": 8, "ipv4": "10.71.0.0/16"},
        }))
        .unwrap()
    }

    #[test]
    fn a_pool_being_deleted_is_not_read_as_modified_for_the_generation_its_deletion_added() {
        assert!(!object_pool(&object(1, false)).modified);
        assert!(object_pool(&object(2, false)).modified);
        assert!(!object_pool(&object(2, true)).modified);
        assert!(object_pool(&object(3, true)).modified);
    }

    #[test]
    fn an_upstream_example_spec_reads_as_a_pool() {
        let s = spec(&json!({
            "perNodeHostBits": 8,
            "ipv4": "10.244.0.0/16",
            "ipv6": "2001:db8::/110",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "platform.node_group/worker-medium", "operator": "Exists"}
            ]}]}
        }))
        .unwrap();
        assert_eq!(s.per_node_host_bits, 8);
        assert_eq!(s.ipv6.unwrap().to_string(), "2001:db8::/110");
        assert_eq!(s.selector.summary(), "platform.node_group/worker-medium");
    }

    #[test]
    fn no_selector_is_the_fallback_and_bad_data_says_what_is_wrong() {
        let s = spec(&json!({"perNodeHostBits": 8, "ipv4": "10.0.0.0/8"})).unwrap();
        assert_eq!(s.selector, NodeSelector::Fallback);
        assert!(spec(&json!({"ipv4": "10.0.0.0/8"}))
            .unwrap_err()
            .contains("perNodeHostBits"));
        assert!(spec(&json!({"perNodeHostBits": 8, "ipv4": "banana"}))
            .unwrap_err()
            .contains("ipv4"));
        let near = json!({"perNodeHostBits": 8, "ipv4": "10.0.0.0/8", "nodeSelector": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "a", "operator": "Near"}]}]}});
        assert!(spec(&near).unwrap_err().contains("Near"));
    }
}

//! One Node's protobuf (`read_node`), written as JSON (`write_json`): every field read comes back from
//! the JSON with the same value (strings escaped right, `omitempty` as the API server has it), and the
//! informer decodes and caches it as it would the API server's own JSON.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use netcm_protobuf::node::read_node;

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// An `omitempty` field: written when it was read and is not empty.
fn omitempty(s: Option<&str>) -> Option<String> {
    s.and_then(nonempty)
}

fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    let m: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (!m.is_empty()).then_some(m)
}

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(view) = read_node(data) else {
        return;
    };
    let mut json = Vec::new();
    if let Err(e) = view.write_json(&mut json) {
        assert!(
            json.is_empty(),
            "{e} after writing {:?}",
            String::from_utf8_lossy(&json)
        );
        assert!(
            view.deletion_seconds.is_some(),
            "only a timestamp can fail: {e}"
        );
        return;
    }
    let node: Node = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("not a Node: {}: {e}", String::from_utf8_lossy(&json)));
    let m = &node.metadata;
    assert_eq!(m.name, nonempty(view.name));
    assert_eq!(m.uid, nonempty(view.uid));
    assert_eq!(m.resource_version, nonempty(view.resource_version));
    assert_eq!(
        m.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        view.deletion_seconds
    );
    assert_eq!(m.labels, map(&view.labels));
    assert_eq!(m.annotations, map(&view.annotations));
    let spec = node.spec.clone().unwrap_or_default();
    assert_eq!(spec.pod_cidr, nonempty(view.pod_cidr));
    let cidrs: Vec<String> = view.pod_cidrs.iter().map(|s| s.to_string()).collect();
    assert_eq!(spec.pod_cidrs.unwrap_or_default(), cidrs);
    assert_eq!(spec.provider_id, nonempty(view.provider_id));
    assert_eq!(spec.unschedulable.unwrap_or(false), view.unschedulable);
    let taints: Vec<_> = spec.taints.unwrap_or_default();
    assert_eq!(taints.len(), view.taints.len());
    for (t, v) in taints.iter().zip(&view.taints) {
        assert_eq!((t.key.as_str(), t.effect.as_str()), (v.key, v.effect));
        assert_eq!(t.value, omitempty(v.value));
    }
    let status = node.status.clone().unwrap_or_default();
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    let want: Vec<(String, String)> = view
        .addresses
        .iter()
        .map(|a| (a.type_.to_string(), a.address.to_string()))
        .collect();
    assert_eq!(addresses, want);
    let conditions = status.conditions.unwrap_or_default();
    assert_eq!(conditions.len(), view.conditions.len());
    for (c, v) in conditions.iter().zip(&view.conditions) {
        assert_eq!((c.type_.as_str(), c.status.as_str()), (v.type_, v.status));
        assert_eq!(c.reason, omitempty(v.reason));
        assert_eq!(c.message, omitempty(v.message));
    }
    crate::check_informer_node(&json);
}

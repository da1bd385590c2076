//! Another allocator at work: `metadata.managedFields` of every Node name the field managers that wrote
//! `spec.podCIDR`/`spec.podCIDRs`. netcm writes as `netcm` (the API server takes the manager from the
//! user agent); anyone else writing pod CIDRs beside it is the most common way to get duplicates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::report::Finding;
use super::snapshot::{ago, name, Snapshot};

/// netcm's field manager.
pub const NETCM_MANAGER: &str = "netcm";

/// One manager that wrote pod CIDRs on one Node, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// The field manager.
    pub manager: String,
    /// When it last wrote the Node's managed fields.
    pub time: Option<jiff::Timestamp>,
}

/// The managers that own `spec.podCIDR` or `spec.podCIDRs` on `node`.
pub fn pod_cidr_writers(node: &Node) -> Vec<Writer> {
    node.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref().unwrap_or("").is_empty())
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                let spec = &f.0["f:spec"];
                !spec["f:podCIDR"].is_null() || !spec["f:podCIDRs"].is_null()
            })
        })
        .map(|m| Writer {
            manager: m.manager.clone().unwrap_or_else(|| "<unnamed>".into()),
            time: m.time.as_ref().map(|t| t.0),
        })
        .collect()
}

/// How to stop a manager from allocating.
pub fn how_to_stop(manager: &str) -> String {
    match manager {
        "kube-controller-manager" => "turn off kube-controller-manager's allocator: --allocate-node-cidrs=false (or --controllers=*,-node-ipam-controller) in its manifest (e.g. /etc/kubernetes/manifests/kube-controller-manager.yaml); only one allocator may write pod CIDRs".into(),
        "cloud-controller-manager" => "turn off cloud-controller-manager's node IPAM: --allocate-node-cidrs=false (or drop node-ipam-controller from its --controllers)".into(),
        m => format!("stop {m:?} from writing spec.podCIDR(s) (find it by that field manager / user agent); only one allocator may write pod CIDRs"),
    }
}

/// One finding per foreign manager (with the Nodes it wrote), or one ✓ line.
pub fn check(s: &Snapshot) -> Vec<Finding> {
    let mut by_manager: BTreeMap<String, Vec<(String, Option<jiff::Timestamp>)>> = BTreeMap::new();
    for node in &s.nodes {
        for w in pod_cidr_writers(node) {
            if w.manager != NETCM_MANAGER {
                by_manager
                    .entry(w.manager)
                    .or_default()
                    .push((name(node).to_string(), w.time));
            }
        }
    }
    if by_manager.is_empty() {
        let with_cidrs: Vec<&Node> = s
            .nodes
            .iter()
            .filter(|n| !netcm_node::raw_pod_cidrs(n).is_empty())
            .collect();
        let tracked = with_cidrs
            .iter()
            .filter(|n| !pod_cidr_writers(n).is_empty())
            .count();
        // The API server tracks no fields of an object created with none set (a bare Node), so
        // such Nodes cannot tell who wrote their CIDRs; kubelets always register with labels.
        let untracked = with_cidrs.len() - tracked;
        let note = if untracked > 0 {
            format!("; {untracked} Node(s) with pod CIDRs carry no managedFields to tell")
        } else {
            String::new()
        };
        return vec![Finding::ok(
            "allocators",
            format!("only netcm wrote pod CIDRs ({tracked} Node(s) by managedFields{note})"),
        )];
    }
    by_manager
        .into_iter()
        .map(|(manager, nodes)| {
            let latest = nodes.iter().filter_map(|(_, t)| *t).max();
            let when = latest.map(|t| format!(", last {} ago", ago(s.now, t))).unwrap_or_default();
            let names: Vec<String> = nodes.into_iter().map(|(n, _)| n).collect();
            let shown = if names.len() > 5 {
                format!("{} and {} more", names[..5].join(", "), names.len() - 5)
            } else {
                names.join(", ")
            };
            Finding::fail(
                "allocators",
                format!("another allocator at work: field manager {manager:?} wrote spec.podCIDR(s) of {} Node(s) ({shown}{when})", names.len()),
                how_to_stop(&manager),
            )
            .about(names)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::*;
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    fn wrote(node: &mut Node, manager: &str, fields: serde_json::Value, ago_secs: i64) {
        node.metadata
            .managed_fields
            .get_or_insert_with(Vec::new)
            .push(ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some("Update".into()),
                time: Some(Time(before(ago_secs))),
                fields_v1: Some(FieldsV1(fields)),
                ..Default::default()
            });
    }

    #[test]
    fn pod_cidrs_written_only_by_netcm_are_fine() {
        let mut a = node("a", "192.0.2.1", &["10.244.0.0/24"]);
        wrote(
            &mut a,
            "netcm",
            serde_json::json!({"f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}}}}),
            60,
        );
        wrote(
            &mut a,
            "kubelet",
            serde_json::json!({"f:status": {"f:addresses": {}}}),
            10,
        );
        let f = check(&snapshot("10.244.0.0/16", vec![a]));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok, "{f:#?}");
    }

    #[test]
    fn kube_controller_manager_writing_pod_cidrs_is_named_with_its_nodes_and_how_to_turn_it_off() {
        let mut a = node("a", "192.0.2.1", &["10.244.0.0/24"]);
        wrote(
            &mut a,
            "kube-controller-manager",
            serde_json::json!({"f:spec": {"f:podCIDR": {}}}),
            30,
        );
        let mut b = node("b", "192.0.2.2", &["10.244.1.0/24"]);
        wrote(
            &mut b,
            "netcm",
            serde_json::json!({"f:spec": {"f:podCIDRs": {}}}),
            90,
        );
        let f = check(&snapshot("10.244.0.0/16", vec![a, b]));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Fail);
        assert_eq!(f[0].nodes, ["a"]);
        assert!(
            f[0].message.contains("\"kube-controller-manager\"")
                && f[0].message.contains("30s ago"),
            "{}",
            f[0].message
        );
        assert!(f[0]
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("--allocate-node-cidrs=false"));
    }

    #[test]
    fn status_subresource_writes_are_not_pod_cidr_writes() {
        let mut a = node("a", "192.0.2.1", &["10.244.0.0/24"]);
        a.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubelet".into()),
            subresource: Some("status".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:podCIDR": {}}}))),
            ..Default::default()
        }]);
        assert!(pod_cidr_writers(&a).is_empty());
    }
}

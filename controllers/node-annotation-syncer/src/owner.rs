//! Who manages a Node's lease: netcm, or a node agent (a flanneld in kube-subnet-manager mode) that wrote
//! it on its own Node. Pure: decided from `metadata.managedFields` alone, as the informer's cache keeps
//! it (`CachedNode::annotation_owners`: who owns which key under the prefix, netcm's own left out).
//!
//! The API server records, per field manager, the fields that manager's writes last changed (an Update
//! takes a field over only when it changes its value). netcm writes under [`FIELD_MANAGER`]; a flanneld
//! under its binary name (client-go derives it from the user agent: `flanneld`, or `k3s` where flannel is
//! embedded). So a lease key owned by any other manager means someone else publishes this Node's lease,
//! and netcm leaves the whole lease to them rather than fight over it.

use std::collections::BTreeSet;

use netcm_node::Keys;

/// The field manager of netcm's lease writes. It is also what the API server derives from netcm's user
/// agent (`netcm/<version> …`), so leases written by earlier versions, which sent no field manager, still
/// count as netcm's.
pub const FIELD_MANAGER: &str = "netcm";

/// A lease that another field manager publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLease {
    /// The other field managers (usually one: the node's flanneld).
    pub managers: BTreeSet<String>,
    /// The lease keys they own.
    pub keys: BTreeSet<String>,
}

impl std::fmt::Display for AgentLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let managers: Vec<&str> = self.managers.iter().map(String::as_str).collect();
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        write!(
            f,
            "field manager {} owns {}",
            managers.join(", "),
            keys.join(", ")
        )
    }
}

/// `Some` when a field manager other than netcm owns any key of the lease (`keys.lease()`: the keys netcm
/// would write, plus `backend-data` / `backend-v6-data`, which only an agent writes for backends other
/// than host-gw). Overwrite annotations and other keys under the prefix say nothing about who publishes.
/// `owners` are (annotation key, field manager) pairs, as [`netcm_node::CachedNode::annotation_owners`]
/// gives them.
pub fn agent_lease<'a>(
    keys: &Keys,
    owners: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<AgentLease> {
    let lease = keys.lease();
    let mut found = AgentLease {
        managers: BTreeSet::new(),
        keys: BTreeSet::new(),
    };
    for (key, manager) in owners {
        if manager != FIELD_MANAGER && lease.contains(&key) {
            found.managers.insert(manager.to_string());
            found.keys.insert(key.to_string());
        }
    }
    (!found.keys.is_empty()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use netcm_node::CachedNode;

    use netcm_node::test_support::flannel_keys as keys;

    /// A managed-fields entry as the API server writes it for an Update of these annotations.
    fn entry(manager: &str, subresource: Option<&str>, annotations: &[&str]) -> ManagedFieldsEntry {
        let owned: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|a| (format!("f:{a}"), serde_json::json!({})))
            .collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            subresource: subresource.map(str::to_string),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": { "f:annotations": owned }
            }))),
            ..Default::default()
        }
    }

    const P: &str = "flannel.alpha.coreos.com/";

    /// The verdict on a Node with these managed fields, read as the cache holds them (from a full Node).
    fn agent_lease(k: &Keys, managed_fields: &[ManagedFieldsEntry]) -> Option<AgentLease> {
        let mut node = Node::default();
        node.metadata.managed_fields = Some(managed_fields.to_vec());
        super::agent_lease(k, CachedNode::from(&node).annotation_owners())
    }

    #[test]
    fn a_lease_that_only_netcm_wrote_is_netcms() {
        let k = keys();
        let fields = [
            entry("kubelet", None, &["node.alpha.kubernetes.io/ttl"]),
            entry(FIELD_MANAGER, None, &k.lease()),
        ];
        assert_eq!(agent_lease(&k, &fields), None);
        assert_eq!(agent_lease(&k, &[]), None);
    }

    #[test]
    fn a_flanneld_that_wrote_its_lease_through_the_status_subresource_manages_it() {
        let k = keys();
        let flanneld = entry(
            "flanneld",
            Some("status"),
            &[&k.backend_type, &k.backend_data, &k.public_ip],
        );
        let fields = [
            entry(FIELD_MANAGER, None, &[&k.kube_subnet_manager]),
            flanneld,
        ];
        let agent = agent_lease(&k, &fields).expect("agent-managed");
        assert_eq!(agent.managers, BTreeSet::from(["flanneld".to_string()]));
        assert_eq!(agent.keys.len(), 3);
        assert_eq!(
            agent.to_string(),
            format!("field manager flanneld owns {P}backend-data, {P}backend-type, {P}public-ip")
        );
    }

    #[test]
    fn an_agent_that_only_added_its_vxlan_backend_data_manages_the_lease() {
        // netcm had published the rest with the same values, so flanneld's PATCH changed only this key.
        let k = keys();
        let fields = [
            entry(FIELD_MANAGER, None, &[&k.backend_type, &k.public_ip]),
            entry("k3s", Some("status"), &[&k.backend_data]),
        ];
        assert!(agent_lease(&k, &fields).is_some());
    }

    #[test]
    fn overwrites_and_other_annotations_under_the_prefix_say_nothing_about_the_publisher() {
        let k = keys();
        let user = entry(
            "kubectl-annotate",
            None,
            &[
                &k.public_ip_overwrite,
                &k.public_ipv6_overwrite,
                &format!("{P}custom"),
                &format!("{P}node-public-ip"),
            ],
        );
        assert_eq!(agent_lease(&k, &[user]), None);
    }

    #[test]
    fn keys_under_another_prefix_are_someone_elses_business() {
        let k = Keys::new("--annotation-prefix", "netcm.example.com/lease").expect("valid");
        let flanneld = entry("flanneld", Some("status"), &[&format!("{P}public-ip")]);
        assert_eq!(agent_lease(&k, &[flanneld]), None);
    }

    #[test]
    fn entries_without_annotations_or_fields_are_ignored() {
        let k = keys();
        let bare = ManagedFieldsEntry {
            manager: Some("flanneld".into()),
            ..Default::default()
        };
        let spec_only = ManagedFieldsEntry {
            manager: Some("flanneld".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:podCIDR": {}}}))),
            ..Default::default()
        };
        assert_eq!(agent_lease(&k, &[bare, spec_only]), None);
    }
}

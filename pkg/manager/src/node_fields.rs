//! What of a Node a reconciler reads. Each reconciler declares its [`NodeFields`]; the manager caches
//! only the union of the enabled controllers' declarations ([`NodeFields::keep`]), so at thousands of
//! Nodes the cache stays a small fraction of a full Node list — and a controller that reads a field
//! says so, instead of finding it silently dropped.
//!
//! Identity is always kept: name, uid, resourceVersion and whether deletion has started.
//!
//! The informer never builds the rest: it decodes each Node as a [`WireNode`] (only the fields a
//! declaration can keep) and caches the [`CachedNode`] that [`NodeFields::keep`] makes of it.
//! [`NodeFields::trim`] says the same of a full `Node` (the reference the tests hold `keep` to).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use netcm_node::{owned_annotation_keys, CachedNode};

use crate::informer::Cached;

mod wire;
pub use wire::WireNode;

impl Cached for CachedNode {
    fn name(&self) -> &str {
        CachedNode::name(self)
    }
    fn uid(&self) -> &str {
        CachedNode::uid(self)
    }
    fn resource_version(&self) -> &str {
        CachedNode::resource_version(self)
    }
}

/// The parts of a Node a reconciler reads from the cache, beyond its identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFields {
    /// `spec.podCIDR` and `spec.podCIDRs`.
    pub pod_cidrs: bool,
    /// `spec.taints`.
    pub taints: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.providerID`.
    pub provider_id: bool,
    /// `status.addresses`.
    pub addresses: bool,
    /// `status.capacity.pods` (the other resources of the capacity are never kept).
    pub capacity_pods: bool,
    /// `status.conditions` of these types.
    pub condition_types: BTreeSet<String>,
    /// Annotations whose key starts with one of these prefixes (`""` keeps every annotation).
    pub annotation_prefixes: BTreeSet<String>,
    /// Who owns annotations under a prefix (`metadata.managedFields`), as (prefix, own field manager):
    /// every other manager of a key under the prefix is kept. The declaring controller's own manager is
    /// left out, because its own writes are what it knows already and most Nodes carry nothing else.
    pub annotation_owners: BTreeSet<(String, String)>,
    /// Labels whose key starts with one of these prefixes (`""` keeps every label).
    pub label_prefixes: BTreeSet<String>,
}

impl NodeFields {
    /// Nothing beyond the Node's identity.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds `spec.podCIDR(s)`.
    pub fn pod_cidrs(mut self) -> Self {
        self.pod_cidrs = true;
        self
    }

    /// Adds `spec.taints`.
    pub fn taints(mut self) -> Self {
        self.taints = true;
        self
    }

    /// Adds `spec.providerID`.
    pub fn provider_id(mut self) -> Self {
        self.provider_id = true;
        self
    }

    /// Adds `status.addresses`.
    pub fn addresses(mut self) -> Self {
        self.addresses = true;
        self
    }

    /// Adds `status.capacity.pods`.
    pub fn capacity_pods(mut self) -> Self {
        self.capacity_pods = true;
        self
    }

    /// Adds the condition of type `type_`.
    pub fn condition(mut self, type_: &str) -> Self {
        self.condition_types.insert(type_.to_string());
        self
    }

    /// Adds the annotations under `prefix`.
    pub fn annotations(mut self, prefix: &str) -> Self {
        self.annotation_prefixes.insert(prefix.to_string());
        self
    }

    /// Adds who owns annotations under `prefix`, except the field manager `own`.
    pub fn annotation_owners(mut self, prefix: &str, own: &str) -> Self {
        self.annotation_owners
            .insert((prefix.to_string(), own.to_string()));
        self
    }

    /// Whether the declaration keeps that field manager `manager` owns annotation `key`.
    pub fn keeps_annotation_owner(&self, key: &str, manager: &str) -> bool {
        self.annotation_owners
            .iter()
            .any(|(prefix, own)| key.starts_with(prefix.as_str()) && manager != own)
    }

    /// Adds the labels under `prefix`.
    pub fn labels(mut self, prefix: &str) -> Self {
        self.label_prefixes.insert(prefix.to_string());
        self
    }

    /// Everything either declaration reads.
    pub fn union(mut self, other: &NodeFields) -> Self {
        self.pod_cidrs |= other.pod_cidrs;
        self.taints |= other.taints;
        self.unschedulable |= other.unschedulable;
        self.provider_id |= other.provider_id;
        self.addresses |= other.addresses;
        self.capacity_pods |= other.capacity_pods;
        self.condition_types
            .extend(other.condition_types.iter().cloned());
        self.annotation_prefixes
            .extend(other.annotation_prefixes.iter().cloned());
        self.annotation_owners
            .extend(other.annotation_owners.iter().cloned());
        self.label_prefixes
            .extend(other.label_prefixes.iter().cloned());
        self
    }

    /// The Node the cache holds for a decoded [`WireNode`]: its identity and the declared fields, copied
    /// into one compact [`CachedNode`]; the decoded strings are dropped with `wire`.
    pub fn keep(&self, wire: WireNode) -> CachedNode {
        let WireNode {
            metadata,
            annotations,
            annotation_owners,
            labels,
            spec,
            status,
        } = wire;
        let mut b = CachedNode::builder(
            metadata.name.as_deref().unwrap_or_default(),
            metadata.uid.as_deref().unwrap_or_default(),
            metadata.resource_version.as_deref().unwrap_or_default(),
        );
        b.deleting(metadata.deletion_timestamp.is_some());
        b.has_annotations(!annotations.is_empty());
        for (k, v) in annotations
            .iter()
            .filter(|(k, _)| keeps(&self.annotation_prefixes, k))
        {
            b.annotation(k, v);
        }
        // After the annotations, so an owned key that is also kept is stored once.
        for (manager, keys) in &annotation_owners {
            for key in keys {
                if self.keeps_annotation_owner(key, manager) {
                    b.annotation_owner(key, manager);
                }
            }
        }
        for (k, v) in labels
            .iter()
            .filter(|(k, _)| keeps(&self.label_prefixes, k))
        {
            b.label(k, v);
        }
        if self.pod_cidrs {
            b.pod_cidrs(
                spec.pod_cidrs.as_deref().unwrap_or_default(),
                spec.pod_cidr.as_deref(),
            );
        }
        if self.taints {
            for t in spec.taints.iter().flatten() {
                b.taint(t.map(String::as_str));
            }
        }
        if self.unschedulable {
            b.unschedulable(spec.unschedulable.unwrap_or(false));
        }
        if let Some(id) = spec.provider_id.as_deref().filter(|_| self.provider_id) {
            b.provider_id(id);
        }
        if self.addresses {
            for a in status.addresses.iter().flatten() {
                b.address(a.map(String::as_str));
            }
        }
        if let Some(pods) = status.capacity.and_then(|c| c.pods) {
            if self.capacity_pods {
                b.capacity_pods(&pods);
            }
        }
        for c in status.conditions.iter().flatten() {
            if self.condition_types.contains(&c.type_) {
                b.condition(c.map(String::as_str));
            }
        }
        b.build()
    }

    /// Keeps the Node's identity and the declared fields, drops the rest. A keep-list, not a drop-list:
    /// a field Kubernetes adds later is not cached until someone declares it.
    pub fn trim(&self, node: &mut Node) {
        let old = std::mem::take(node);
        let meta = old.metadata;
        node.metadata = ObjectMeta {
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            annotations: keep_declared_annotations(meta.annotations, &self.annotation_prefixes),
            labels: keep_prefixed(meta.labels, &self.label_prefixes),
            managed_fields: self.keep_annotation_owners(meta.managed_fields),
            ..ObjectMeta::default()
        };
        node.spec = old.spec.map(|s| NodeSpec {
            pod_cidr: s.pod_cidr.filter(|_| self.pod_cidrs),
            pod_cidrs: s.pod_cidrs.filter(|_| self.pod_cidrs),
            taints: s.taints.filter(|_| self.taints),
            unschedulable: s.unschedulable.filter(|_| self.unschedulable),
            provider_id: s.provider_id.filter(|_| self.provider_id),
            ..NodeSpec::default()
        });
        node.status = old.status.map(|s| NodeStatus {
            capacity: s
                .capacity
                .filter(|_| self.capacity_pods)
                .map(|mut c| {
                    c.retain(|resource, _| resource == "pods");
                    c
                })
                .filter(|c| !c.is_empty()),
            addresses: s.addresses.filter(|_| self.addresses),
            conditions: s
                .conditions
                .map(|mut c| {
                    c.retain(|c| self.condition_types.contains(&c.type_));
                    c
                })
                .filter(|c| !c.is_empty()),
            ..NodeStatus::default()
        });
    }
}

impl NodeFields {
    /// The managed-fields entries reduced to the annotation ownership the declaration keeps: each entry's
    /// manager and its declared annotation keys; `None` when none is left.
    fn keep_annotation_owners(
        &self,
        entries: Option<Vec<ManagedFieldsEntry>>,
    ) -> Option<Vec<ManagedFieldsEntry>> {
        let kept: Vec<ManagedFieldsEntry> = entries?
            .into_iter()
            .filter_map(|e| {
                let manager = e.manager.unwrap_or_default();
                let keys: serde_json::Map<String, serde_json::Value> = e
                    .fields_v1
                    .iter()
                    .flat_map(|f| owned_annotation_keys(&f.0))
                    .filter(|k| self.keeps_annotation_owner(k, &manager))
                    .map(|k| (format!("f:{k}"), serde_json::json!({})))
                    .collect();
                (!keys.is_empty()).then(|| ManagedFieldsEntry {
                    manager: Some(manager),
                    fields_v1: Some(FieldsV1(serde_json::json!({
                        "f:metadata": { "f:annotations": keys }
                    }))),
                    ..ManagedFieldsEntry::default()
                })
            })
            .collect();
        (!kept.is_empty()).then_some(kept)
    }
}

/// Whether a key under one of `prefixes` is kept.
fn keeps(prefixes: &BTreeSet<String>, key: &str) -> bool {
    prefixes.iter().any(|p| key.starts_with(p.as_str()))
}

/// The entries whose key starts with one of `prefixes`; `None` when none is left.
/// The declared annotations; an empty map (not none) when the Node had only others, because whether a Node
/// has annotations at all is kept ([`CachedNode::has_annotations`]).
fn keep_declared_annotations(
    map: Option<BTreeMap<String, String>>,
    prefixes: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    let had = map.as_ref().is_some_and(|m| !m.is_empty());
    keep_prefixed(map, prefixes).or_else(|| had.then(BTreeMap::new))
}

fn keep_prefixed(
    map: Option<BTreeMap<String, String>>,
    prefixes: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    let kept: BTreeMap<String, String> = map?
        .into_iter()
        .filter(|(k, _)| keeps(prefixes, k))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn full_node() -> Node {
        let cond = |t: &str| NodeCondition {
            type_: t.into(),
            status: "False".into(),
            ..Default::default()
        };
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                uid: Some("u1".into()),
                resource_version: Some("7".into()),
                deletion_timestamp: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
                annotations: Some(
                    [
                        ("flannel.alpha.coreos.com/public-ip", "192.0.2.1"),
                        ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                    ]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
                ),
                labels: Some(
                    [("example.io/a", "1"), ("kubernetes.io/hostname", "n1")]
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .into(),
                ),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.0.0.0/24".into()),
                pod_cidrs: Some(vec!["10.0.0.0/24".into()]),
                taints: Some(vec![Taint {
                    key: "k".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                provider_id: Some("p".into()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: "192.0.2.1".into(),
                }]),
                conditions: Some(vec![cond("Ready"), cond("NetworkUnavailable")]),
                capacity: Some(
                    [("cpu", "4"), ("pods", "110")]
                        .map(|(r, q)| (r.to_string(), Quantity(q.into())))
                        .into(),
                ),
                ..Default::default()
            }),
        }
    }

    fn trimmed(fields: &NodeFields) -> Node {
        let mut node = full_node();
        fields.trim(&mut node);
        node
    }

    #[test]
    fn without_declarations_only_the_nodes_identity_is_kept() {
        let node = trimmed(&NodeFields::none());
        let m = &node.metadata;
        assert_eq!(m.name.as_deref(), Some("n1"));
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        assert!(m.deletion_timestamp.is_some());
        assert!(m.labels.is_none() && m.managed_fields.is_none());
        assert_eq!(
            m.annotations,
            Some(Default::default()),
            "no annotation is kept, only that there were some"
        );
        let spec = node.spec.expect("spec");
        assert!(spec.pod_cidrs.is_none() && spec.taints.is_none() && spec.provider_id.is_none());
        let status = node.status.expect("status");
        assert!(status.addresses.is_none() && status.conditions.is_none());
    }

    #[test]
    fn declared_fields_survive_and_prefixes_select_annotations_and_labels() {
        let fields = NodeFields::none()
            .pod_cidrs()
            .addresses()
            .condition("NetworkUnavailable")
            .annotations("flannel.alpha.coreos.com/")
            .labels("example.io/");
        let node = trimmed(&fields);
        let annotations = node.metadata.annotations.expect("annotations");
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["flannel.alpha.coreos.com/public-ip"]
        );
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels.keys().collect::<Vec<_>>(), ["example.io/a"]);
        let spec = node.spec.expect("spec");
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.0.0.0/24"));
        assert_eq!(spec.pod_cidrs.map(|c| c.len()), Some(1));
        assert!(spec.taints.is_none());
        let status = node.status.expect("status");
        assert_eq!(status.addresses.map(|a| a.len()), Some(1));
        let conditions = status.conditions.expect("conditions");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "NetworkUnavailable");
    }

    #[test]
    fn a_union_reads_what_either_side_reads() {
        let a = NodeFields::none().pod_cidrs().annotations("a/");
        let b = NodeFields::none().taints().annotations("b/").labels("");
        let both = a.clone().union(&b);
        assert!(both.pod_cidrs && both.taints && !both.addresses);
        assert_eq!(both.annotation_prefixes.len(), 2);
        let node = trimmed(&both);
        assert_eq!(node.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
        // An empty prefix keeps every label.
        assert_eq!(node.metadata.labels.map(|l| l.len()), Some(2));
        assert_eq!(
            a.union(&NodeFields::none()),
            NodeFields::none().pod_cidrs().annotations("a/")
        );
    }

    #[test]
    fn of_the_capacity_only_pods_is_kept_and_only_when_declared() {
        let capacity = |fields: &NodeFields| trimmed(fields).status.and_then(|s| s.capacity);
        assert_eq!(capacity(&NodeFields::none()), None);
        let kept = capacity(&NodeFields::none().capacity_pods()).expect("capacity");
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["pods"]);
        assert_eq!(
            CachedNode::from(&trimmed(&NodeFields::none())).capacity_pods(),
            None
        );
        assert_eq!(
            CachedNode::from(&trimmed(&NodeFields::none().capacity_pods())).capacity_pods(),
            Some(110)
        );
    }
}

//! [`WireNode`]: a Node decoded straight from the API server's JSON, reading only the fields a
//! [`NodeFields`](super::NodeFields) declaration can keep. serde skips everything else
//! (`managedFields`, `images`, `nodeInfo`, `capacity`, …) without building it, so a list page or watch
//! event costs a few dozen allocations per Node instead of hundreds; the informer then copies what the
//! enabled controllers' declaration keeps into a [`CachedNode`](netcm_node::CachedNode)
//! ([`NodeFields::keep`](super::NodeFields::keep)) and drops the rest.
//!
//! When [`NodeFields`](super::NodeFields) learns a new field, the wire structs below must name it too;
//! the tests below compare both decodings for every declaration, so a forgotten one fails there. An
//! address, condition or taint is decoded as `netcm-protobuf`'s one definition of it, with `String`s.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::ClusterResourceScope;
use kube::Resource;
use netcm_protobuf::entries::{Address, Condition, Taint};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A Node decoded with only the fields [`NodeFields`](super::NodeFields) can keep; the informer's wire
/// type. Its `metadata` carries what the watcher reads (the resourceVersion) and the Node's identity.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "WireObject")]
pub struct WireNode {
    pub(super) metadata: ObjectMeta,
    pub(super) annotations: Vec<(String, String)>,
    /// (field manager, the annotation keys it owns) from `metadata.managedFields`, for entries that own any.
    pub(super) annotation_owners: Vec<(String, Vec<String>)>,
    pub(super) labels: Vec<(String, String)>,
    pub(super) spec: WireSpec,
    pub(super) status: WireStatus,
}

// Same kind, version and path as `Node`: the watcher and the probe build their URLs from these.
impl Resource for WireNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Node::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        Node::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        Node::version(&())
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Node::api_version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Node::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

// The wire structs: serde ignores every key they do not name (no `deny_unknown_fields`), and an
// ignored value is only scanned, never allocated.

#[derive(Deserialize)]
struct WireObject {
    metadata: Option<WireMeta>,
    spec: Option<WireSpec>,
    status: Option<WireStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    annotations: Option<Pairs>,
    labels: Option<Pairs>,
    managed_fields: Option<Vec<WireManagedFields>>,
}

/// One `metadata.managedFields` entry: its manager and the annotation keys its `fieldsV1` owns; the rest
/// of the field set (a kubelet's `f:status` with every image) is scanned, not built.
#[derive(Deserialize)]
struct WireManagedFields {
    manager: Option<String>,
    #[serde(rename = "fieldsV1")]
    fields_v1: Option<WireFieldsV1>,
}

#[derive(Deserialize)]
struct WireFieldsV1 {
    #[serde(rename = "f:metadata")]
    metadata: Option<WireFieldsMeta>,
}

#[derive(Deserialize)]
struct WireFieldsMeta {
    #[serde(rename = "f:annotations")]
    annotations: Option<FieldKeys>,
}

/// The keys of a field set's `f:annotations`: each `f:<key>` member without its `f:` (the map's own `.`
/// member is not a key); the members' values are scanned, not built.
struct FieldKeys(Vec<String>);

impl<'de> Deserialize<'de> for FieldKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = FieldKeys;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field set")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FieldKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some(member) = map.next_key::<Cow<'de, str>>()? {
                    map.next_value::<IgnoredAny>()?;
                    if let Some(key) = member.strip_prefix("f:") {
                        keys.push(key.to_string());
                    }
                }
                Ok(FieldKeys(keys))
            }
        }
        d.deserialize_map(KeysVisitor)
    }
}

/// A JSON object of strings as (key, value) pairs in the order sent: no map is built for entries the
/// declaration is about to drop.
struct Pairs(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        d.deserialize_map(PairsVisitor)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct WireSpec {
    #[serde(rename = "podCIDR")]
    pub(super) pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pub(super) pod_cidrs: Option<Vec<String>>,
    pub(super) taints: Option<Vec<Taint<String>>>,
    pub(super) unschedulable: Option<bool>,
    #[serde(rename = "providerID")]
    pub(super) provider_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct WireStatus {
    pub(super) capacity: Option<WireCapacity>,
    pub(super) addresses: Option<Vec<Address<String>>>,
    pub(super) conditions: Option<Vec<Condition<String>>>,
}

/// `status.capacity`, of which only `pods` can be declared (the other resources are skipped unread).
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct WireCapacity {
    pub(super) pods: Option<String>,
}

impl From<WireObject> for WireNode {
    fn from(w: WireObject) -> Self {
        let (metadata, annotations, labels, annotation_owners) = match w.metadata {
            Some(m) => (
                ObjectMeta {
                    name: m.name,
                    uid: m.uid,
                    resource_version: m.resource_version,
                    deletion_timestamp: m.deletion_timestamp,
                    ..ObjectMeta::default()
                },
                m.annotations.map(|p| p.0).unwrap_or_default(),
                m.labels.map(|p| p.0).unwrap_or_default(),
                m.managed_fields
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        let keys = e.fields_v1?.metadata?.annotations?.0;
                        (!keys.is_empty()).then(|| (e.manager.unwrap_or_default(), keys))
                    })
                    .collect(),
            ),
            None => Default::default(),
        };
        Self {
            metadata,
            annotations,
            annotation_owners,
            labels,
            spec: w.spec.unwrap_or_default(),
            status: w.status.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_fields::NodeFields;
    use kube::core::{ObjectList, WatchEvent};
    use netcm_node::CachedNode;
    use proptest::prelude::*;
    use serde_json::json;

    /// A Node as a kubelet leaves it, with every field `NodeFields` can keep and much it cannot.
    fn kubelet_node() -> serde_json::Value {
        let now = "2025-01-02T03:04:05Z";
        let cond = |t: &str, s: &str| {
            json!({"type": t, "status": s, "reason": format!("{t}Reason"), "message": "a \"quoted\" message",
                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "7", "generation": 3,
                "creationTimestamp": now, "deletionTimestamp": now, "deletionGracePeriodSeconds": 0,
                "finalizers": ["example.io/f"],
                "annotations": {
                    "flannel.alpha.coreos.com/public-ip": "192.0.2.1",
                    "flannel.alpha.coreos.com/backend-data": "{\"VNI\":1}",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true"
                },
                "labels": {"kubernetes.io/hostname": "n1", "example.io/a": "1", "topology.kubernetes.io/zone": "z\u{e9}"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "ou"}],
                "managedFields": [
                    {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
                                                                   "f:volumes.kubernetes.io/controller-managed-attach-detach": {}}},
                                  "f:status": {"f:images": {}}}},
                    {"manager": "netcm", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:flannel.alpha.coreos.com/public-ip": {}}},
                                  "f:spec": {"f:podCIDR": {}}}},
                    {"manager": "flanneld", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                     "subresource": "status",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:flannel.alpha.coreos.com/backend-data": {}}}}}
                ]
            },
            "spec": {
                "podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24", "fd00::/64"],
                "taints": [{"key": "k", "value": "v", "effect": "NoSchedule", "timeAdded": now}],
                "unschedulable": true, "providerID": "aws:///zone/i-1", "externalID": "legacy",
                "configSource": {"configMap": {"name": "c", "namespace": "kube-system", "kubeletConfigKey": "k"}}
            },
            "status": {
                "conditions": [cond("Ready", "True"), cond("NetworkUnavailable", "False"), cond("MemoryPressure", "False")],
                "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}, {"type": "Hostname", "address": "n1"}],
                "capacity": {"cpu": "16", "pods": "110"}, "allocatable": {"cpu": "15800m"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                             "osImage": "Debian", "containerRuntimeVersion": "containerd://1.7",
                             "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"},
                "images": [{"names": ["registry.example.com/a@sha256:00", "registry.example.com/a:v1"], "sizeBytes": 1}],
                "volumesInUse": ["v"], "phase": "Running"
            }
        })
    }

    /// What the cache would hold the old way: the full Node, trimmed, then everything it still says.
    fn via_full_node(json: &str, fields: &NodeFields) -> CachedNode {
        let mut node: Node = serde_json::from_str(json).expect("a full Node");
        fields.trim(&mut node);
        CachedNode::from(&node)
    }

    fn via_wire(json: &str, fields: &NodeFields) -> CachedNode {
        fields.keep(serde_json::from_str(json).expect("a wire Node"))
    }

    fn everything() -> NodeFields {
        let mut f = NodeFields::none()
            .pod_cidrs()
            .taints()
            .addresses()
            .capacity_pods();
        f.unschedulable = true;
        f.provider_id = true;
        ["Ready", "NetworkUnavailable", "MemoryPressure"]
            .into_iter()
            .fold(f, |f, t| f.condition(t))
            .annotations("")
            .labels("")
            .annotation_owners("", "netcm")
    }

    #[test]
    fn declaring_everything_a_wire_node_caches_exactly_what_the_trimmed_full_node_did() {
        let json = kubelet_node().to_string();
        let wire = via_wire(&json, &everything());
        assert_eq!(wire, via_full_node(&json, &everything()));
        // Not vacuous: every keepable field is there.
        assert_eq!(wire.raw_pod_cidrs().count(), 2);
        assert_eq!(wire.taints().count(), 1);
        assert_eq!(wire.provider_id(), Some("aws:///zone/i-1"));
        assert!(wire.unschedulable() && wire.is_deleting());
        assert_eq!(wire.capacity_pods(), Some(110));
        assert_eq!(wire.conditions().count(), 3);
        assert_eq!(wire.addresses().count(), 2);
        assert_eq!(wire.annotations().count(), 4);
        assert_eq!(wire.labels().count(), 3);
        assert_eq!(
            wire.annotation_owners().collect::<Vec<_>>(),
            [
                ("flannel.alpha.coreos.com/backend-data", "flanneld"),
                ("node.alpha.kubernetes.io/ttl", "kubelet"),
                (
                    "volumes.kubernetes.io/controller-managed-attach-detach",
                    "kubelet"
                ),
            ],
            "every manager but the declaration's own"
        );
        assert_eq!(wire.label("topology.kubernetes.io/zone"), Some("z\u{e9}"));
        let c = wire.condition("Ready").expect("Ready");
        assert_eq!(c.message, Some("a \"quoted\" message"));
    }

    #[test]
    fn a_wire_node_reads_nothing_a_declaration_cannot_keep() {
        let node =
            serde_json::from_str::<WireNode>(&kubelet_node().to_string()).expect("a wire Node");
        let m = &node.metadata;
        assert_eq!(
            (
                m.name.as_deref(),
                m.uid.as_deref(),
                m.resource_version.as_deref()
            ),
            (Some("n1"), Some("u1"), Some("7"))
        );
        assert!(
            m.managed_fields.is_none() && m.finalizers.is_none() && m.owner_references.is_none()
        );
        assert!(
            m.annotations.is_none() && m.labels.is_none(),
            "kept beside, as pairs"
        );
        assert_eq!((node.annotations.len(), node.labels.len()), (4, 3));
        assert_eq!(
            node.annotation_owners
                .iter()
                .map(|(m, keys)| (m.as_str(), keys.len()))
                .collect::<Vec<_>>(),
            [("kubelet", 2), ("netcm", 1), ("flanneld", 1)],
            "of managedFields only who owns which annotation"
        );
    }

    #[test]
    fn missing_and_null_parts_decode_as_they_do_for_a_full_node() {
        for json in [
            json!({"metadata": {"name": "bare"}}),
            json!({"metadata": {"name": "n", "annotations": null, "labels": {}}, "spec": null, "status": {}}),
            json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": null}, "status": {"conditions": []}}),
        ] {
            let json = json.to_string();
            assert_eq!(
                via_wire(&json, &everything()),
                via_full_node(&json, &everything()),
                "{json}"
            );
        }
    }

    #[test]
    fn kubes_watch_events_and_list_pages_decode_into_wire_nodes() {
        let node = kubelet_node();
        // "type" first, as the API server writes it (serde then decodes the object without buffering it).
        let line = format!(r#"{{"type":"MODIFIED","object":{node}}}"#);
        match serde_json::from_str::<WatchEvent<WireNode>>(&line).expect("a watch event") {
            WatchEvent::Modified(w) => assert_eq!(w.meta().resource_version.as_deref(), Some("7")),
            other => panic!("not a MODIFIED event: {other:?}"),
        }
        let page = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "9", "continue": "c"},
                          "items": [node.clone(), node]})
        .to_string();
        let list: ObjectList<WireNode> = serde_json::from_str(&page).expect("a list page");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.metadata.continue_.as_deref(), Some("c"));
    }

    fn some_of(options: &'static [&'static str]) -> impl Strategy<Value = Vec<&'static str>> {
        proptest::sample::subsequence(options, 0..=options.len())
    }

    proptest! {
        #[test]
        fn for_any_declaration_the_wire_node_caches_what_the_trimmed_full_node_did(
            flags in proptest::array::uniform6(any::<bool>()),
            conditions in some_of(&["Ready", "NetworkUnavailable", "DiskPressure"]),
            annotations in some_of(&["", "flannel.alpha.coreos.com/", "node.alpha.", "absent/"]),
            labels in some_of(&["", "example.io/", "topology.", "absent/"]),
            owners in some_of(&["", "flannel.alpha.coreos.com/", "node.alpha.", "absent/"]),
            own in proptest::sample::select(&["netcm", "kubelet", "flanneld", ""][..]),
        ) {
            let mut fields = NodeFields::none();
            [fields.pod_cidrs, fields.taints, fields.unschedulable, fields.provider_id, fields.addresses, fields.capacity_pods] = flags;
            let fields = conditions.into_iter().fold(fields, |f, c| f.condition(c));
            let fields = annotations.into_iter().fold(fields, |f, p| f.annotations(p));
            let fields = labels.into_iter().fold(fields, |f, p| f.labels(p));
            let fields = owners.into_iter().fold(fields, |f, p| f.annotation_owners(p, own));
            let json = kubelet_node().to_string();
            prop_assert_eq!(via_wire(&json, &fields), via_full_node(&json, &fields));
        }
    }
}

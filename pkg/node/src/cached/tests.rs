//! Unit tests of the cached Node: what each accessor reads, built both ways.

use super::*;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint as K8sTaint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, Time,
};
use k8s_openapi::serde_json;

fn net(s: &str) -> IpNet {
    s.parse().expect("net")
}

fn full() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            deletion_timestamp: Some(Time(Default::default())),
            annotations: Some(
                [("b/x", "2"), ("a/x", "1")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            labels: Some([("zone".to_string(), "z1".to_string())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some("10.0.0.0/24".into()),
            pod_cidrs: Some(vec!["10.0.0.7/24".into(), "banana".into()]),
            taints: Some(vec![K8sTaint {
                key: "k".into(),
                value: Some("v".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            unschedulable: Some(true),
            provider_id: Some("p".into()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.1".into(),
            }]),
            conditions: Some(vec![NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                reason: Some("RouteCreated".into()),
                message: None,
                ..Default::default()
            }]),
            capacity: Some(
                [
                    ("cpu".to_string(), Quantity("4".into())),
                    ("pods".to_string(), Quantity("110".into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
    }
}

#[test]
fn a_node_read_from_the_api_keeps_everything_a_cached_node_can_hold() {
    let n = CachedNode::from(&full());
    assert_eq!((n.name(), n.uid(), n.resource_version()), ("n1", "u1", "7"));
    assert!(n.is_deleting() && n.unschedulable());
    assert_eq!(n.provider_id(), Some("p"));
    assert_eq!(n.capacity_pods(), Some(110));
    assert_eq!(
        n.raw_pod_cidrs().collect::<Vec<_>>(),
        ["10.0.0.7/24", "banana"]
    );
    let parsed = n.pod_cidrs();
    assert_eq!(parsed.cidrs, [net("10.0.0.7/24")]);
    assert_eq!(parsed.unparsable[0].raw, "banana");
    assert_eq!(parsed, PodCidrs::of(&full()), "parsed as a full Node is");
    assert_eq!(
        n.addresses().collect::<Vec<_>>(),
        [Address {
            type_: "InternalIP",
            address: "192.0.2.1"
        }]
    );
    assert_eq!(
        n.annotations().collect::<Vec<_>>(),
        [("a/x", "1"), ("b/x", "2")]
    );
    assert_eq!((n.annotation("b/x"), n.annotation("c")), (Some("2"), None));
    assert_eq!(n.label("zone"), Some("z1"));
    let c = n.condition("NetworkUnavailable").expect("condition");
    assert_eq!(
        (c.status, c.reason, c.message),
        ("False", Some("RouteCreated"), None)
    );
    assert!(n.condition("Ready").is_none());
    assert_eq!(
        n.taints().collect::<Vec<_>>(),
        [Taint {
            key: "k",
            value: Some("v"),
            effect: "NoSchedule"
        }]
    );
}

#[test]
fn the_single_pod_cidr_field_counts_only_when_the_list_is_empty() {
    let build = |list: &[&str], single: Option<&str>| {
        let mut b = CachedNode::builder("n", "u", "1");
        b.pod_cidrs(list, single);
        b.build()
            .raw_pod_cidrs()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(build(&[], Some("10.0.0.0/24")), ["10.0.0.0/24"]);
    assert_eq!(build(&["fd00::/64"], Some("10.0.0.0/24")), ["fd00::/64"]);
    assert!(build(&[], Some("")).is_empty());
    assert!(build(&[], None).is_empty());
}

#[test]
fn annotations_are_looked_up_by_key_and_a_repeated_key_keeps_its_last_value() {
    let mut b = CachedNode::builder("n", "u", "1");
    for (k, v) in [
        ("c", "3"),
        ("a", "1"),
        ("b", "old"),
        ("b", "new"),
        ("", "empty"),
    ] {
        b.annotation(k, v);
    }
    let n = b.build();
    assert_eq!(
        n.annotations().collect::<Vec<_>>(),
        [("", "empty"), ("a", "1"), ("b", "new"), ("c", "3")]
    );
    for (k, v) in [("a", "1"), ("b", "new"), ("c", "3"), ("", "empty")] {
        assert_eq!(n.annotation(k), Some(v), "{k}");
    }
    assert_eq!(n.annotation("d"), None);
    assert_eq!(n.label("a"), None);
}

#[test]
fn equal_nodes_compare_equal_however_their_strings_were_laid_out() {
    let mut a = CachedNode::builder("n", "u", "1");
    a.annotation("x", "1").address(internal_ip());
    let mut b = CachedNode::builder("n", "u", "1");
    b.address(internal_ip()).annotation("x", "1");
    assert_eq!(a.build(), b.build());
    let mut c = CachedNode::builder("n", "u", "2");
    c.address(internal_ip()).annotation("x", "1");
    let mut d = CachedNode::builder("n", "u", "1");
    d.address(internal_ip()).annotation("x", "1");
    assert_ne!(c.build(), d.build());
}

#[test]
fn the_event_reference_names_the_node_by_kind_name_and_uid_without_a_version() {
    let r = CachedNode::from(&full()).object_ref();
    assert_eq!(r.api_version.as_deref(), Some("v1"));
    assert_eq!(r.kind.as_deref(), Some("Node"));
    assert_eq!(
        (r.name.as_deref(), r.uid.as_deref()),
        (Some("n1"), Some("u1"))
    );
    assert!(r.resource_version.is_none() && r.namespace.is_none());
}

#[test]
fn a_cached_node_is_a_small_struct() {
    // The cost of every Node in the cache before its strings and table: two boxes (a struct of its
    // declared fields was 72 bytes, boxed apart when there were any).
    assert_eq!(std::mem::size_of::<CachedNode>(), 32);
}

/// A managed-fields entry of `manager` owning these annotations (and a label, which is not kept as owned).
fn owning(manager: &str, annotations: &[&str]) -> ManagedFieldsEntry {
    let owned: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|a| (format!("f:{a}"), serde_json::json!({})))
        .chain([(".".to_string(), serde_json::json!({}))])
        .collect();
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(serde_json::json!({
            "f:metadata": { "f:annotations": owned, "f:labels": { "f:zone": {} } },
            "f:spec": { "f:podCIDR": {} }
        }))),
        ..Default::default()
    }
}

#[test]
fn a_node_read_from_the_api_keeps_who_owns_each_annotation_sorted() {
    let mut node = full();
    node.metadata.managed_fields = Some(vec![
        owning("netcm", &["a/x"]),
        owning("flanneld", &["b/x", "a/x"]),
        ManagedFieldsEntry {
            manager: Some("kubelet".into()),
            ..Default::default()
        },
    ]);
    let n = CachedNode::from(&node);
    assert_eq!(
        n.annotation_owners().collect::<Vec<_>>(),
        [("a/x", "flanneld"), ("a/x", "netcm"), ("b/x", "flanneld")]
    );
    assert!(CachedNode::from(&full()).annotation_owners().len() == 0);
}

#[test]
fn annotation_keys_and_their_owners_are_held_once_per_process_not_in_each_nodes_buffer() {
    let bare = CachedNode::builder("n", "u", "1").build().text.len();
    let mut b = CachedNode::builder("n", "u", "1");
    b.annotation("flannel.alpha.coreos.com/public-ip", "192.0.2.1")
        .annotation_owner("flannel.alpha.coreos.com/public-ip", "flanneld")
        .annotation_owner("flannel.alpha.coreos.com/public-ip", "flanneld")
        .annotation_owner("flannel.alpha.coreos.com/gone", "flanneld");
    let n = b.build();
    assert_eq!(
        n.text.len() - bare,
        "192.0.2.1".len(),
        "only the annotation's value is the Node's own"
    );
    assert_eq!(
        n.annotation("flannel.alpha.coreos.com/public-ip"),
        Some("192.0.2.1")
    );
    assert_eq!(
        n.annotation_owners().collect::<Vec<_>>(),
        [
            ("flannel.alpha.coreos.com/gone", "flanneld"),
            ("flannel.alpha.coreos.com/public-ip", "flanneld")
        ],
        "a repeated pair is kept once; a key owned but no longer set is kept too"
    );
}

fn internal_ip() -> Address<&'static str> {
    Address {
        type_: "InternalIP",
        address: "192.0.2.1",
    }
}

#[test]
fn a_stored_entry_costs_what_the_caches_own_entry_types_did() {
    // At 50,000 Nodes every byte of an entry counts; these were the sizes of the cache's own
    // (key, value), condition and taint structs before it stored the shared entries.
    use std::mem::size_of;
    assert_eq!(size_of::<Address<Span>>(), size_of::<Pair>());
    assert_eq!(size_of::<Address<Span>>(), 16);
    assert_eq!(size_of::<Condition<Span>>(), 40);
    assert_eq!(size_of::<Taint<Span>>(), 28);
}

#[test]
fn the_four_lists_of_pairs_share_one_table_and_each_reads_back_only_its_own() {
    let mut b = CachedNode::builder("n", "u", "1");
    b.label("zone", "z1")
        .annotation_owner("flannel.alpha.coreos.com/public-ip", "flanneld")
        .annotation("flannel.alpha.coreos.com/public-ip", "10.0.0.1")
        .address(internal_ip())
        .annotation("a", "1")
        .label("os", "linux");
    let n = b.build();
    assert_eq!(
        n.tables.len(),
        4 + 4 + 6 * 4,
        "one table: the header, then the six pairs of all four lists"
    );
    assert_eq!(n.addresses().collect::<Vec<_>>(), vec![internal_ip()]);
    assert_eq!(
        n.annotations().collect::<Vec<_>>(),
        vec![
            ("a", "1"),
            ("flannel.alpha.coreos.com/public-ip", "10.0.0.1")
        ]
    );
    assert_eq!(
        n.annotation_owners().collect::<Vec<_>>(),
        vec![("flannel.alpha.coreos.com/public-ip", "flanneld")]
    );
    assert_eq!(
        n.labels().collect::<Vec<_>>(),
        vec![("os", "linux"), ("zone", "z1")]
    );
    assert_eq!(n.annotation("a"), Some("1"));
    assert_eq!(n.label("a"), None, "an annotation is not read as a label");
    assert_eq!(n.label("zone"), Some("z1"));
    // A Node with labels alone: the other lists read empty.
    let mut b = CachedNode::builder("m", "u", "1");
    b.label("zone", "z1");
    let m = b.build();
    assert_eq!(m.addresses().count() + m.annotations().count(), 0);
    assert_eq!(m.annotation_owners().count(), 0);
    assert_eq!(m.label("zone"), Some("z1"));
}

#[test]
fn pod_capacity_is_kept_only_as_a_plain_count() {
    let with = |quantity: &str| {
        let mut b = CachedNode::builder("n", "u", "1");
        b.capacity_pods(quantity);
        b.build().capacity_pods()
    };
    assert_eq!(with("110"), Some(110));
    assert_eq!(with(" 16 "), Some(16));
    for odd in ["1k", "-1", "", "1e3", "4294967296", "0"] {
        assert_eq!(with(odd), None, "{odd:?}");
    }
    let n = CachedNode::builder("n", "u", "1").build();
    assert_eq!(n.capacity_pods(), None, "not declared or absent");
    let mut b = CachedNode::builder("n", "u", "1");
    b.capacity_pods("110");
    assert_eq!(b.build().tables.len(), 4 + 1, "the header and the count");
}

#[test]
fn the_strings_every_node_repeats_are_read_back_but_not_kept_in_its_buffer() {
    let bare = CachedNode::builder("n", "u", "1").build().text.len();
    let ready = Condition {
        type_: "Ready",
        status: "True",
        reason: Some("KubeletReady"),
        message: Some("kubelet is posting ready status"),
    };
    let not_ready = Taint {
        key: "node.kubernetes.io/not-ready",
        value: None,
        effect: "NoSchedule",
    };
    let mut b = CachedNode::builder("n", "u", "1");
    b.address(internal_ip())
        .condition(ready)
        .taint(not_ready)
        .label("kubernetes.io/os", "linux");
    let n = b.build();
    assert_eq!(
        n.text.len() - bare,
        "192.0.2.1".len() + "kubelet is posting ready status".len() + "linux".len(),
        "only the address, the message and the label's value are the Node's own"
    );
    assert_eq!(n.addresses().collect::<Vec<_>>(), [internal_ip()]);
    assert_eq!(n.condition("Ready"), Some(ready));
    assert_eq!(n.taints().collect::<Vec<_>>(), [not_ready]);
    assert_eq!(n.label("kubernetes.io/os"), Some("linux"));
}

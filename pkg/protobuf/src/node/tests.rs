use super::*;
use crate::wire::encode;

/// A Node's protobuf written field by field, with fields netcm skips around the ones it reads.
fn node_bytes() -> Vec<u8> {
    let entry = |k: &str, v: &str| {
        let mut e = Vec::new();
        encode::bytes(&mut e, 1, k.as_bytes());
        encode::bytes(&mut e, 2, v.as_bytes());
        e
    };
    let mut meta = Vec::new();
    encode::bytes(&mut meta, 1, b"n1");
    encode::bytes(&mut meta, 2, b"");
    encode::bytes(&mut meta, 5, b"u1");
    encode::bytes(&mut meta, 6, b"42");
    encode::uint(&mut meta, 7, 3);
    let mut time = Vec::new();
    encode::uint(&mut time, 1, 1_735_787_045);
    encode::uint(&mut time, 2, 0);
    encode::bytes(&mut meta, 9, &time);
    encode::bytes(&mut meta, 11, &entry("zone", "a"));
    encode::bytes(
        &mut meta,
        12,
        &entry("flannel.alpha.coreos.com/public-ip", "192.0.2.1"),
    );
    let managed = |manager: &str, fields: &str| {
        let mut raw = Vec::new();
        encode::bytes(&mut raw, 1, fields.as_bytes());
        let mut e = Vec::new();
        encode::bytes(&mut e, 1, manager.as_bytes());
        encode::bytes(&mut e, 2, b"Update");
        encode::bytes(&mut e, 6, b"FieldsV1");
        encode::bytes(&mut e, 7, &raw);
        encode::bytes(&mut e, 8, b"status");
        e
    };
    // A kubelet's field set is never parsed (it names no annotations: not valid JSON, and no error).
    encode::bytes(
        &mut meta,
        17,
        &managed("kubelet", r#"{"f:status": not JSON"#),
    );
    encode::bytes(
        &mut meta,
        17,
        &managed(
            "flanneld",
            r#"{"f:metadata":{"f:annotations":{".":{},"f:flannel.alpha.coreos.com/public-ip":{},"f:a\"b":{}}},"f:status":{"f:images":{}}}"#,
        ),
    );
    let mut spec = Vec::new();
    encode::bytes(&mut spec, 1, b"");
    encode::bytes(&mut spec, 3, b"");
    encode::uint(&mut spec, 4, 0);
    encode::bytes(&mut spec, 7, b"10.0.0.0/24");
    encode::bytes(&mut spec, 7, b"fd00::/64");
    let mut status = Vec::new();
    encode::bytes(&mut status, 8, b"images are skipped");
    for (resource, quantity) in [("cpu", "4"), ("pods", "110")] {
        let mut q = Vec::new();
        encode::bytes(&mut q, 1, quantity.as_bytes());
        let mut entry = Vec::new();
        encode::bytes(&mut entry, 1, resource.as_bytes());
        encode::bytes(&mut entry, 2, &q);
        encode::bytes(&mut status, 1, &entry);
    }
    let mut cond = Vec::new();
    encode::bytes(&mut cond, 1, b"Ready");
    encode::bytes(&mut cond, 2, b"True");
    encode::bytes(&mut cond, 5, b"");
    encode::bytes(&mut status, 4, &cond);
    let mut addr = Vec::new();
    encode::bytes(&mut addr, 1, b"InternalIP");
    encode::bytes(&mut addr, 2, b"192.0.2.1");
    encode::bytes(&mut status, 5, &addr);
    let mut node = Vec::new();
    encode::bytes(&mut node, 1, &meta);
    encode::bytes(&mut node, 2, &spec);
    encode::bytes(&mut node, 3, &status);
    node
}

#[test]
fn a_node_reads_the_fields_the_informer_decodes_and_skips_the_rest() {
    let bytes = node_bytes();
    let node = read_node(&bytes).expect("a Node");
    assert_eq!(
        (node.name, node.uid, node.resource_version),
        ("n1", "u1", "42")
    );
    assert_eq!(node.deletion_seconds, Some(1_735_787_045));
    assert_eq!(node.labels, vec![("zone", "a")]);
    assert_eq!(node.annotations.len(), 1);
    assert_eq!(
        node.annotation_owners,
        vec![AnnotationOwner {
            manager: "flanneld",
            keys: vec!["flannel.alpha.coreos.com/public-ip".into(), "a\"b".into()],
        }],
        "only the entries that own annotations, with their keys unescaped"
    );
    assert_eq!(node.pod_cidrs, vec!["10.0.0.0/24", "fd00::/64"]);
    assert!(!node.unschedulable && node.pod_cidr.is_empty());
    assert_eq!(
        node.addresses,
        vec![Address {
            type_: "InternalIP",
            address: "192.0.2.1"
        }]
    );
    assert_eq!(node.conditions[0].reason, Some(""), "sent, if empty");
    assert_eq!(node.conditions[0].type_, "Ready");
    assert_eq!(
        node.capacity_pods,
        Some("110"),
        "of the capacity, pods only"
    );
}

#[test]
fn the_json_leaves_out_what_the_api_server_leaves_out() {
    let bytes = node_bytes();
    let mut out = Vec::new();
    read_node(&bytes)
        .expect("a Node")
        .write_json(&mut out)
        .expect("JSON");
    let json: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    assert_eq!(
        json,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "42",
                         "deletionTimestamp": "2025-01-02T03:04:05Z",
                         "labels": {"zone": "a"},
                         "annotations": {"flannel.alpha.coreos.com/public-ip": "192.0.2.1"},
                         "managedFields": [{"manager": "flanneld", "fieldsV1": {"f:metadata": {"f:annotations": {
                             "f:flannel.alpha.coreos.com/public-ip": {}, "f:a\"b": {}}}}}]},
            "spec": {"podCIDRs": ["10.0.0.0/24", "fd00::/64"]},
            "status": {"capacity": {"pods": "110"},
                       "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })
    );
}

#[test]
fn a_field_of_the_wrong_wire_type_is_an_error_not_a_guess() {
    let mut spec = Vec::new();
    encode::uint(&mut spec, 7, 1);
    let mut node = Vec::new();
    encode::bytes(&mut node, 2, &spec);
    assert!(matches!(
        read_node(&node),
        Err(ProtobufError::FieldType {
            message: "NodeSpec",
            field: 7,
            ..
        })
    ));
}

#[test]
fn a_deletion_time_out_of_range_fails_before_anything_is_written() {
    let node = NodeView {
        deletion_seconds: Some(i64::MAX),
        ..NodeView::default()
    };
    let mut out = b"kept".to_vec();
    assert_eq!(
        node.write_json(&mut out),
        Err(ProtobufError::Timestamp(i64::MAX))
    );
    assert_eq!(out, b"kept");
}

#[test]
fn a_field_set_that_names_annotations_but_is_not_json_is_an_error() {
    let mut raw = Vec::new();
    encode::bytes(&mut raw, 1, br#"{"f:metadata":{"f:annotations":"#);
    let mut entry = Vec::new();
    encode::bytes(&mut entry, 1, b"flanneld");
    encode::bytes(&mut entry, 7, &raw);
    let mut meta = Vec::new();
    encode::bytes(&mut meta, 17, &entry);
    let mut node = Vec::new();
    encode::bytes(&mut node, 1, &meta);
    assert!(matches!(read_node(&node), Err(ProtobufError::FieldSet(_))));
}

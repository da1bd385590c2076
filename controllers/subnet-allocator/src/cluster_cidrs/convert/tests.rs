//! The conversions and the conditions, without an API server.

#![allow(clippy::unwrap_used)]

use super::conditions::*;
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

fn report(state: PoolState, holders: usize) -> PoolReport {
    PoolReport {
        name: "p".into(),
        is_object: true,
        state,
        ranges: vec!["10.71.0.0/16".parse().unwrap()],
        node_masks: vec![24],
        selector: "pool=p".into(),
        holders,
        capacity: 256,
    }
}

fn overlap() -> PoolState {
    PoolState::Refused(netcm_ipam::Refusal::PoolOverlap {
        range: "10.71.128.0/17".parse().unwrap(),
        pool: "a".into(),
        other: "10.71.0.0/16".parse().unwrap(),
    })
}

fn at(t: &str) -> Time {
    Time(t.parse().unwrap())
}

const T1: &str = "2026-11-25T21:00:00Z";
const T2: &str = "2026-11-25T22:00:00Z";

/// (type, status, reason) of every condition, in order.
fn summary(status: &Value) -> Vec<(String, String, String)> {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[test]
fn an_active_pool_is_ready_and_neither_refused_nor_draining_nor_stalled() {
    let s = status(
        &report(PoolState::Active, 3),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    assert_eq!(
        summary(&s),
        owned(&[
            ("Ready", "True", "Allocating"),
            ("Refused", "False", "Accepted"),
            ("Draining", "False", "NotDeleted"),
        ])
    );
    assert_eq!(s["phase"], "Active");
    assert_eq!(s["allocated"], 3);
}

#[test]
fn a_refused_pool_is_not_ready_refused_and_stalled_with_the_refusals_reason_and_text() {
    let s = status(&report(overlap(), 0), 0, Some(1), None, &at(T1), true);
    assert_eq!(
        summary(&s),
        owned(&[
            ("Ready", "False", "ClusterCIDROverlap"),
            ("Refused", "True", "ClusterCIDROverlap"),
            ("Draining", "False", "NotDeleted"),
            ("Stalled", "True", "ClusterCIDROverlap"),
        ])
    );
    assert_eq!(s["phase"], "Refused");
    let text = "10.71.128.0/17 overlaps 10.71.0.0/16 of pool a; pools must use the same range or disjoint ones";
    assert_eq!(s["message"], text);
    assert_eq!(condition(&s, "Ready")["message"], text);
    assert_eq!(condition(&s, "Stalled")["message"], text);
}

#[test]
fn a_modified_or_invalid_pool_is_not_ready_with_its_own_reason() {
    let modified = status(
        &report(PoolState::Refused(netcm_ipam::Refusal::Modified), 0),
        0,
        Some(2),
        None,
        &at(T1),
        true,
    );
    assert_eq!(
        condition(&modified, "Ready")["reason"],
        "ClusterCIDRModified"
    );
    assert_eq!(condition(&modified, "Ready")["observedGeneration"], 2);
    let invalid = status(
        &report(
            PoolState::Refused(netcm_ipam::Refusal::Invalid("no range".into())),
            0,
        ),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    assert_eq!(
        condition(&invalid, "Stalled")["reason"],
        "InvalidClusterCIDR"
    );
}

#[test]
fn a_draining_pool_is_not_ready_for_reason_draining_and_says_how_many_nodes_hold_it() {
    let s = status(
        &report(PoolState::Draining, 2),
        0,
        Some(2),
        None,
        &at(T1),
        true,
    );
    assert_eq!(
        summary(&s),
        owned(&[
            ("Ready", "False", "Draining"),
            ("Refused", "False", "Deleted"),
            ("Draining", "True", "Deleted"),
        ])
    );
    assert!(condition(&s, "Draining")["message"]
        .as_str()
        .unwrap()
        .contains("(2 do)"));
}

#[test]
fn every_condition_carries_the_generation_it_was_computed_for_and_the_shape_of_metav1_condition() {
    let s = status(
        &report(PoolState::Active, 0),
        0,
        Some(7),
        None,
        &at(T1),
        true,
    );
    for c in s["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], 7);
        assert_eq!(c["lastTransitionTime"], T1);
        let parsed: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
            serde_json::from_value(c.clone()).unwrap();
        assert!(!parsed.reason.is_empty() && !parsed.message.is_empty());
    }
    assert_eq!(s["observedGeneration"], 7);
}

#[test]
fn an_unchanged_status_keeps_its_transition_times_so_the_next_pass_writes_nothing() {
    let first = status(
        &report(PoolState::Active, 1),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    let again = status(
        &report(PoolState::Active, 1),
        0,
        Some(1),
        Some(&first),
        &at(T2),
        true,
    );
    assert_eq!(again, first);
}

#[test]
fn a_count_that_moves_changes_no_transition_time() {
    let first = status(
        &report(PoolState::Active, 1),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    let later = status(
        &report(PoolState::Active, 5),
        2,
        Some(1),
        Some(&first),
        &at(T2),
        true,
    );
    assert_ne!(later, first);
    assert_eq!(later["conditions"], first["conditions"]);
}

#[test]
fn only_the_conditions_whose_status_changes_get_a_new_transition_time() {
    let refused = status(&report(overlap(), 0), 0, Some(1), None, &at(T1), true);
    let active = status(
        &report(PoolState::Active, 0),
        0,
        Some(1),
        Some(&refused),
        &at(T2),
        true,
    );
    assert_eq!(condition(&active, "Ready")["lastTransitionTime"], T2);
    assert_eq!(condition(&active, "Refused")["lastTransitionTime"], T2);
    assert_eq!(condition(&active, "Draining")["lastTransitionTime"], T1);
    // Stalled is abnormal-true: gone, not False, once the pool is no longer refused.
    assert!(active["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["type"] != "Stalled"));
}

#[test]
fn a_reason_that_changes_while_the_status_stays_keeps_the_transition_time() {
    let refused = status(&report(overlap(), 0), 0, Some(1), None, &at(T1), true);
    let draining = status(
        &report(PoolState::Draining, 1),
        0,
        Some(2),
        Some(&refused),
        &at(T2),
        true,
    );
    let ready = condition(&draining, "Ready");
    assert_eq!(ready["reason"], "Draining");
    assert_eq!(ready["lastTransitionTime"], T1);
    assert_eq!(condition(&draining, "Draining")["lastTransitionTime"], T2);
}

#[test]
fn a_previous_condition_without_a_usable_time_gets_now() {
    let previous = json!({"conditions": [
        {"type": "Ready", "status": "True", "reason": "Allocating", "message": ""}
    ]});
    let s = status(
        &report(PoolState::Active, 0),
        0,
        Some(1),
        Some(&previous),
        &at(T2),
        true,
    );
    assert_eq!(condition(&s, "Ready")["lastTransitionTime"], T2);
}

#[test]
fn without_conditions_the_status_is_the_one_written_before_conditions_existed() {
    let s = status(
        &report(PoolState::Active, 3),
        1,
        Some(1),
        None,
        &at(T1),
        false,
    );
    assert_eq!(
        s,
        json!({
            "phase": "Active",
            "message": "",
            "selector": "pool=p",
            "allocated": 3,
            "capacity": 256,
            "waiting": 1,
            "observedGeneration": 1,
        })
    );
}

#[test]
fn a_message_longer_than_a_condition_may_hold_is_cut_at_a_character_boundary() {
    let long = format!("é{}", "x".repeat(40_000));
    let s = status(
        &report(
            PoolState::Refused(netcm_ipam::Refusal::Invalid(long.clone())),
            0,
        ),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    let m = condition(&s, "Ready")["message"].as_str().unwrap();
    assert!(m.len() <= 32768 && m.len() > 32000, "{}", m.len());
    assert!(m.starts_with("invalid ClusterCIDR: é"));
    assert_eq!(bounded("ok"), "ok");
}

#[test]
fn conditions_missing_from_what_the_write_returned_were_pruned_by_an_older_crd() {
    let written = status(
        &report(PoolState::Active, 0),
        0,
        Some(1),
        None,
        &at(T1),
        true,
    );
    let mut returned = object(1, false);
    returned.data["status"] = written.clone();
    assert!(!conditions_pruned(&written, &returned));
    returned.data["status"]
        .as_object_mut()
        .unwrap()
        .remove("conditions");
    assert!(conditions_pruned(&written, &returned));
    let without = status(
        &report(PoolState::Active, 0),
        0,
        Some(1),
        None,
        &at(T1),
        false,
    );
    assert!(!conditions_pruned(&without, &returned));
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

fn annotated(value: &str) -> DynamicObject {
    let mut obj = object(1, false);
    obj.metadata.annotations = Some(
        [(SIZE_FROM_PODS_ANNOTATION.to_string(), value.to_string())]
            .into_iter()
            .collect(),
    );
    obj
}

#[test]
fn the_sizing_annotation_sizes_the_pool_and_leaves_the_spec_as_upstream_reads_it() {
    let pool = object_pool(&annotated("5-8"));
    let spec = pool.spec.unwrap();
    assert_eq!(
        spec.sizing,
        Some(netcm_ipam::HostBitsRange { min: 5, max: 8 })
    );
    assert_eq!(spec.per_node_host_bits, 8);
    assert!(!pool.modified, "an annotation is not a spec change");
    assert_eq!(object_pool(&object(1, false)).spec.unwrap().sizing, None);
}

#[test]
fn a_sizing_annotation_that_does_not_parse_makes_the_spec_unusable() {
    let err = object_pool(&annotated("eight")).spec.unwrap_err();
    assert!(
        err.starts_with("ipam.netcm.io/node-cidr-size-from-pods: \"eight\" is not"),
        "{err}"
    );
}

//! `CachedNodeBuilder` and `CachedNode::from(&Node)` given the same fields build the same Node, and it
//! answers as a plain model does: annotations and labels sorted with the last of a repeated key kept,
//! pod CIDRs from the list else the single field, each parsed once, public IPs by the one rule.

use std::collections::BTreeMap;

use crate::{AddrText, CidrText};
use arbitrary::Arbitrary;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use netcm_node::{parse_pod_cidr, pick_pod_cidrs, Address, CachedNode, Condition};

/// What libFuzzer's bytes decode to.
#[derive(Debug, Arbitrary)]
pub struct Input {
    name: String,
    uid: String,
    resource_version: String,
    deleting: bool,
    annotations: Option<Vec<(String, String)>>,
    labels: Vec<(String, String)>,
    pod_cidrs: Vec<CidrText>,
    pod_cidr: Option<CidrText>,
    provider_id: Option<String>,
    unschedulable: bool,
    addresses: Vec<(String, AddrText)>,
    taints: Vec<(String, Option<String>, String)>,
    conditions: Vec<(String, String, Option<String>, Option<String>)>,
    lookups: Vec<String>,
}

/// The checks, on one decoded input.
pub fn run(input: Input) {
    let pod_cidrs: Vec<String> = input.pod_cidrs.iter().map(ToString::to_string).collect();
    let pod_cidr = input.pod_cidr.as_ref().map(ToString::to_string);
    let addresses: Vec<(String, String)> = input
        .addresses
        .iter()
        .map(|(t, a)| (t.clone(), a.to_string()))
        .collect();

    let mut b = CachedNode::builder(&input.name, &input.uid, &input.resource_version);
    b.deleting(input.deleting);
    b.has_annotations(input.annotations.is_some());
    for (k, v) in input.annotations.iter().flatten() {
        b.annotation(k, v);
    }
    for (k, v) in &input.labels {
        b.label(k, v);
    }
    b.pod_cidrs(&pod_cidrs, pod_cidr.as_deref());
    if let Some(id) = &input.provider_id {
        b.provider_id(id);
    }
    b.unschedulable(input.unschedulable);
    for (t, a) in &addresses {
        b.address(Address {
            type_: t,
            address: a,
        });
    }
    for (k, v, e) in &input.taints {
        b.taint(netcm_node::Taint {
            key: k,
            value: v.as_deref(),
            effect: e,
        });
    }
    for (t, s, r, m) in &input.conditions {
        b.condition(Condition {
            type_: t,
            status: s,
            reason: r.as_deref(),
            message: m.as_deref(),
        });
    }
    let built = b.build();

    let annotations: Option<BTreeMap<String, String>> = input
        .annotations
        .as_ref()
        .map(|a| a.iter().cloned().collect());
    let labels: BTreeMap<String, String> = input.labels.iter().cloned().collect();
    let full = Node {
        metadata: ObjectMeta {
            name: Some(input.name.clone()),
            uid: Some(input.uid.clone()),
            resource_version: Some(input.resource_version.clone()),
            deletion_timestamp: input.deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
            annotations: annotations.clone(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidr.clone(),
            pod_cidrs: Some(pod_cidrs.clone()),
            provider_id: input.provider_id.clone(),
            unschedulable: Some(input.unschedulable),
            taints: Some(
                input
                    .taints
                    .iter()
                    .map(|(k, v, e)| Taint {
                        key: k.clone(),
                        value: v.clone(),
                        effect: e.clone(),
                        time_added: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.clone(),
                        address: a.clone(),
                    })
                    .collect(),
            ),
            conditions: Some(
                input
                    .conditions
                    .iter()
                    .map(|(t, s, r, m)| NodeCondition {
                        type_: t.clone(),
                        status: s.clone(),
                        reason: r.clone(),
                        message: m.clone(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
    };
    assert_eq!(
        built,
        CachedNode::from(&full),
        "builder and From<&Node> differ"
    );

    // The model.
    assert_eq!(
        (built.name(), built.uid(), built.resource_version()),
        (
            input.name.as_str(),
            input.uid.as_str(),
            input.resource_version.as_str()
        )
    );
    assert_eq!(built.is_deleting(), input.deleting);
    assert_eq!(built.has_annotations(), annotations.is_some());
    let kept: Vec<(&str, &str)> = annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(built.annotations().eq(kept.iter().copied()));
    let kept: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(built.labels().eq(kept.iter().copied()));
    for key in input.lookups.iter().chain(labels.keys()) {
        assert_eq!(
            built.label(key),
            labels.get(key).map(String::as_str),
            "{key:?}"
        );
        let want = annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str);
        assert_eq!(built.annotation(key), want, "{key:?}");
    }
    let want: Vec<&str> = pick_pod_cidrs(&pod_cidrs, pod_cidr.as_deref()).collect();
    assert!(built.raw_pod_cidrs().eq(want.iter().copied()));
    for e in built.pod_cidr_entries() {
        assert_eq!(e.net, parse_pod_cidr(e.raw).ok());
    }
    assert_eq!(built.provider_id(), input.provider_id.as_deref());
    assert_eq!(built.unschedulable(), input.unschedulable);
    assert!(built
        .addresses()
        .map(|a| (a.type_, a.address))
        .eq(addresses.iter().map(|(t, a)| (t.as_str(), a.as_str()))));
    assert_eq!(built.taints().len(), input.taints.len());
    assert_eq!(built.conditions().len(), input.conditions.len());
    crate::check_cached_node(&built);
}

/// The checks, on one input as libFuzzer hands it over: [`run`] on what it decodes to, decoded as
/// `fuzz_target!` decodes it ([`crate::arbitrary_input`]).
pub fn check(data: &[u8]) {
    if let Some(input) = crate::arbitrary_input(data) {
        run(input);
    }
}

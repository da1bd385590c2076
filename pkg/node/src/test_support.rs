//! Node fixtures for the unit tests of every crate that reads Nodes. Compiled for this crate's own tests
//! and, through the `test-support` feature, for other crates' tests only: each enables it from its
//! `[dev-dependencies]`, so the production binary never carries it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{CachedNode, Keys};

/// A full Node named `name` with `pod_cidrs` (the list, its first also in the single field),
/// `addresses` as (type, address) in order, and `annotations` as (key, value).
pub fn full_node(
    name: &str,
    pod_cidrs: &[&str],
    addresses: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidrs.first().map(|s| s.to_string()),
            pod_cidrs: Some(pod_cidrs.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

/// [`full_node`] as the informer caches it, every field kept.
pub fn node(
    name: &str,
    pod_cidrs: &[&str],
    addresses: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> CachedNode {
    CachedNode::from(&full_node(name, pod_cidrs, addresses, annotations))
}

/// flannel's lease keys under its own default prefix, `flannel.alpha.coreos.com`.
pub fn flannel_keys() -> Keys {
    Keys::new("--annotation-prefix", "flannel.alpha.coreos.com").expect("flannel's prefix is valid")
}

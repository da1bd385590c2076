//! Reading the Node fields several controllers share.

use k8s_openapi::api::core::v1::Node;

/// What a Node says about its pod CIDRs, unparsed: `spec.podCIDRs`, else `spec.podCIDR` (as KCM and
/// flannel read them).
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    let list = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if !list.is_empty() {
        return list;
    }
    spec.and_then(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(pod_cidr: Option<&str>, pod_cidrs: Option<Vec<&str>>) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidr: pod_cidr.map(str::to_string),
                pod_cidrs: pod_cidrs.map(|v| v.into_iter().map(str::to_string).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_cidrs_come_from_the_list_and_fall_back_to_the_single_field() {
        assert_eq!(pod_cidrs(&node(Some("10.0.0.0/24"), None)), ["10.0.0.0/24"]);
        assert_eq!(
            pod_cidrs(&node(
                Some("10.0.0.0/24"),
                Some(vec!["10.0.0.0/24", "fd00::/64"])
            )),
            ["10.0.0.0/24", "fd00::/64"]
        );
        assert!(pod_cidrs(&node(Some(""), Some(vec![]))).is_empty());
        assert!(pod_cidrs(&Node::default()).is_empty());
    }
}

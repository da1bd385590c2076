//! A Node's JSON as the API server (or the transcoder) hands it to the informer: when it is a Node at
//! all, the informer's wire decoding must cache exactly what the trimmed full Node does, its pod CIDRs
//! parsed as every controller parses them (`PodCidrs::of` agrees), public IPs by the one rule.

use k8s_openapi::api::core::v1::Node;
use netcm_manager::node_fields::WireNode;
use netcm_node::{raw_pod_cidrs, PodCidrs};

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(mut full) = serde_json::from_slice::<Node>(data) else {
        return;
    };
    let raw = raw_pod_cidrs(&full);
    let parsed = PodCidrs::of(&full);
    assert_eq!(parsed.len(), raw.len());
    for net in &parsed.cidrs {
        let text = net.to_string();
        assert_eq!(netcm_node::parse_pod_cidr(&text), Ok(*net), "{text}");
    }
    for (n, net) in parsed.networks().zip(&parsed.cidrs) {
        assert!(n.contains(net) && n.prefix_len() == net.prefix_len());
    }
    let Ok(wire) = serde_json::from_slice::<WireNode>(data) else {
        // The wire type reads a subset of the fields, and refuses repeated keys the full Node lets
        // the last one win: not a decoding the API server produces.
        return;
    };
    let cached = crate::same_cache(wire, &mut full);
    assert_eq!(
        cached.pod_cidrs(),
        parsed,
        "the cache parses pod CIDRs as PodCidrs does"
    );
}

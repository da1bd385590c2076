//! What a node's namespace holds: netcm's routes (protocol 199) of both families, and the CNI config.

use std::collections::BTreeSet;

use netcm_e2e::multinode::in_node;
use serde_json::Value;

/// netcm's routes in the node's namespace as "destination via gateway", both families.
pub async fn netcm_routes(node: &str) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for family in ["-4", "-6"] {
        let (ok, out) = in_node(node, &["ip", "-j", family, "route", "show", "proto", "199"]).await;
        assert!(ok, "ip route in {node}: {out}");
        let list: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
        for r in list {
            routes.insert(format!(
                "{} via {}",
                r["dst"].as_str().unwrap_or("?"),
                r["gateway"].as_str().unwrap_or("?")
            ));
        }
    }
    routes
}

/// The routes a node must hold: every other node's pod CIDRs via that node's address of the family.
pub fn expected_routes(
    node: &str,
    cidrs: &std::collections::BTreeMap<String, Vec<ipnet::IpNet>>,
    addresses: &std::collections::BTreeMap<String, (String, String)>,
) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for (peer, peer_cidrs) in cidrs.iter().filter(|(n, _)| n.as_str() != node) {
        let (v4, v6) = &addresses[peer];
        for cidr in peer_cidrs {
            let via = if cidr.addr().is_ipv4() { v4 } else { v6 };
            routes.insert(format!("{cidr} via {via}"));
        }
    }
    routes
}

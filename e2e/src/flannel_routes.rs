//! What flanneld programs into a node of `hack/cluster.sh` for each peer's lease, read back from the
//! node's network namespace, and what it must program, computed from the leases on the Nodes in the API:
//! host-gw, a route per peer pod CIDR via the peer's public address on `eth0`; vxlan, per
//! peer and family a route via the peer's VTEP address (its CIDR's network address) on `flannel.1` /
//! `flannel-v6.1`, a permanent neighbour entry giving that address the peer's VTEP MAC, and an FDB entry
//! sending that MAC to the peer's public address. One line per kernel entry, so a set difference names
//! exactly what is missing or left over.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde_json::Value;

use crate::flannel_daemonset::Backend;
use crate::multinode::in_node_json;
use crate::pod_network::cidrs_of;

/// flannel's annotation prefix (kube-subnet-manager mode).
pub const PREFIX: &str = "flannel.alpha.coreos.com";

/// The node's link towards its peers on `hack/cluster.sh`, where host-gw routes point.
const NODE_LINK: &str = "eth0";

/// A Node's subnet lease as flanneld reads it from the Node's annotations and `spec.podCIDRs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetLease {
    pub node: String,
    pub cidrs: Vec<IpNet>,
    pub public_ip: String,
    pub public_ipv6: String,
    /// vxlan: the VTEP MACs (`backend-data` / `backend-v6-data`'s `VtepMAC`), empty otherwise.
    pub vtep_mac: String,
    pub vtep_mac6: String,
}

/// The leases of every Node of `kubectl get nodes -o json` that has a complete one (CIDRs and a public
/// address of each family).
pub fn subnet_leases(nodes: &Value) -> Vec<SubnetLease> {
    let mut out = Vec::new();
    for n in nodes["items"].as_array().into_iter().flatten() {
        let annotation = |key: &str| {
            n["metadata"]["annotations"][format!("{PREFIX}/{key}")]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let mac = |key: &str| {
            serde_json::from_str::<Value>(&annotation(key))
                .ok()
                .and_then(|d| d["VtepMAC"].as_str().map(str::to_lowercase))
                .unwrap_or_default()
        };
        let lease = SubnetLease {
            node: n["metadata"]["name"].as_str().unwrap_or_default().into(),
            cidrs: cidrs_of(n),
            public_ip: annotation("public-ip"),
            public_ipv6: annotation("public-ipv6"),
            vtep_mac: mac("backend-data"),
            vtep_mac6: mac("backend-v6-data"),
        };
        if !lease.cidrs.is_empty() && !lease.public_ip.is_empty() && !lease.public_ipv6.is_empty() {
            out.push(lease);
        }
    }
    out
}

/// The entries `node` must hold for the leases of its peers (a lease of `node` itself is skipped).
pub fn expected(node: &str, backend: Backend, leases: &[SubnetLease]) -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    for peer in leases.iter().filter(|l| l.node != node) {
        for cidr in &peer.cidrs {
            let v4 = cidr.addr().is_ipv4();
            let public = if v4 {
                &peer.public_ip
            } else {
                &peer.public_ipv6
            };
            match backend {
                Backend::HostGw => {
                    want.insert(format!("route {cidr} via {public} dev {NODE_LINK}"));
                }
                Backend::Vxlan => {
                    let (dev, mac) = if v4 {
                        ("flannel.1", &peer.vtep_mac)
                    } else {
                        ("flannel-v6.1", &peer.vtep_mac6)
                    };
                    let vtep = cidr.network();
                    want.insert(format!("route {cidr} via {vtep} dev {dev}"));
                    want.insert(format!("neigh {dev} {vtep} {mac}"));
                    want.insert(format!("fdb {dev} {mac} dst {public}"));
                }
            }
        }
    }
    want
}

/// What the node's namespace holds now: routes via a gateway into `cluster_cidrs`, and
/// for vxlan the permanent neighbour and FDB entries of flannel's VXLAN devices.
pub async fn programmed(node: &str, backend: Backend, cluster_cidrs: &[IpNet]) -> BTreeSet<String> {
    let mut have = BTreeSet::new();
    for family in ["-4", "-6"] {
        for r in in_node_json(node, &["ip", "-j", family, "route", "show"]).await {
            let Some(dst) = r["dst"].as_str().and_then(|d| d.parse::<IpNet>().ok()) else {
                continue;
            };
            // flannel's routes all have a gateway; the node's connected subnet (inside the cluster CIDR
            // on hack/cluster.sh) and its own pods' bridge have none.
            let (Some(via), Some(dev)) = (r["gateway"].as_str(), r["dev"].as_str()) else {
                continue;
            };
            if !cluster_cidrs.iter().any(|c| c.contains(&dst)) {
                continue;
            }
            have.insert(format!("route {dst} via {via} dev {dev}"));
        }
    }
    if backend == Backend::Vxlan {
        for dev in ["flannel.1", "flannel-v6.1"] {
            for n in in_node_json(
                node,
                &["ip", "-j", "neigh", "show", "dev", dev, "nud", "permanent"],
            )
            .await
            {
                have.insert(format!(
                    "neigh {dev} {} {}",
                    n["dst"].as_str().unwrap_or("?"),
                    n["lladdr"].as_str().unwrap_or("?")
                ));
            }
            for f in in_node_json(node, &["bridge", "-j", "fdb", "show", "dev", dev]).await {
                if let Some(dst) = f["dst"].as_str() {
                    have.insert(format!(
                        "fdb {dev} {} dst {dst}",
                        f["mac"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
    }
    have
}

/// Waits until the node's namespace holds exactly `want`, or panics naming what is missing and what is
/// left over.
pub async fn wait_programmed(
    node: &str,
    backend: Backend,
    cluster_cidrs: &[IpNet],
    want: &BTreeSet<String>,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let have = programmed(node, backend, cluster_cidrs).await;
        if have == *want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{node}'s flannel {} state after {timeout:?}: missing {:?}, left over {:?}",
            backend.name(),
            want.difference(&have).collect::<Vec<_>>(),
            have.difference(want).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(node: &str, x: u8) -> SubnetLease {
        SubnetLease {
            node: node.into(),
            cidrs: vec![
                format!("198.19.{}.0/24", 128 + x).parse().unwrap(),
                format!("fd00:198:19:100{x}::/64").parse().unwrap(),
            ],
            public_ip: format!("198.19.254.{}", 10 + x),
            public_ipv6: format!("fd00:198:19:254::{}", 10 + x),
            vtep_mac: format!("aa:00:00:00:00:0{x}"),
            vtep_mac6: format!("bb:00:00:00:00:0{x}"),
        }
    }

    #[test]
    fn host_gw_wants_a_route_per_peer_cidr_via_its_public_address_of_the_family() {
        let want = expected("n1", Backend::HostGw, &[lease("n1", 1), lease("n2", 2)]);
        assert_eq!(
            want,
            BTreeSet::from([
                "route 198.19.130.0/24 via 198.19.254.12 dev eth0".to_string(),
                "route fd00:198:19:1002::/64 via fd00:198:19:254::12 dev eth0".to_string(),
            ])
        );
    }

    #[test]
    fn vxlan_wants_a_route_neighbour_and_fdb_entry_per_peer_and_family() {
        let want = expected("n1", Backend::Vxlan, &[lease("n1", 1), lease("n2", 2)]);
        assert!(want.contains("route 198.19.130.0/24 via 198.19.130.0 dev flannel.1"));
        assert!(want.contains("neigh flannel.1 198.19.130.0 aa:00:00:00:00:02"));
        assert!(want.contains("fdb flannel.1 aa:00:00:00:00:02 dst 198.19.254.12"));
        assert!(
            want.contains("route fd00:198:19:1002::/64 via fd00:198:19:1002:: dev flannel-v6.1")
        );
        assert!(want.contains("fdb flannel-v6.1 bb:00:00:00:00:02 dst fd00:198:19:254::12"));
        assert_eq!(want.len(), 6);
    }

    #[test]
    fn a_node_without_a_public_address_of_each_family_has_no_lease() {
        let nodes = serde_json::json!({"items": [
            {"metadata": {"name": "a", "annotations": {
                "flannel.alpha.coreos.com/public-ip": "198.19.254.11",
                "flannel.alpha.coreos.com/public-ipv6": "fd00::11",
                "flannel.alpha.coreos.com/backend-data": "{\"VNI\":1,\"VtepMAC\":\"AA:BB:CC:DD:EE:FF\"}"}},
             "spec": {"podCIDRs": ["198.19.129.0/24", "fd00:1::/64"]}},
            {"metadata": {"name": "b", "annotations": {"flannel.alpha.coreos.com/public-ip": "198.19.254.12"}},
             "spec": {"podCIDRs": ["198.19.130.0/24"]}}]});
        let got = subnet_leases(&nodes);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].node, "a");
        assert_eq!(got[0].vtep_mac, "aa:bb:cc:dd:ee:ff");
        assert_eq!(got[0].vtep_mac6, "");
    }
}

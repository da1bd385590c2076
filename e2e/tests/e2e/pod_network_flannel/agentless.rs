//! A Node without flanneld (netcm publishes leases for Nodes without an agent): a Node
//! object with no kubelet behind it, dual-stack `InternalIP`s set through the status subresource as a
//! kubelet would, and a `NoExecute` taint no DaemonSet tolerates, so no flanneld ever runs for it. netcm
//! gives it CIDRs and publishes its host-gw lease; the real flanneld on every other node must accept that
//! lease and route the Node's pod CIDRs to its address. Deleting the Node takes those routes away again.

use std::time::Duration;

use ipnet::IpNet;
use netcm_e2e::flannel_daemonset::Backend;
use netcm_e2e::flannel_routes::{self, PREFIX};
use netcm_e2e::multinode::{eventually, Cluster};
use netcm_e2e::pod_network::{cidrs_of, dual_stack};

const NAME: &str = "ncm-agentless";
/// On the node bridge's subnets, so a host-gw route via them is valid (nothing answers there: only the
/// routes are checked, not packets).
const IPV4: &str = "198.19.254.200";
const IPV6: &str = "fd00:198:19:254::200";

/// Creates the agentless Node, checks netcm's lease on it and every flanneld's routes to it, deletes it
/// and checks the routes leave. `nodes` are the nodes running flanneld.
pub async fn netcms_lease_for_a_node_without_flanneld_is_routed_by_every_flanneld(
    cluster: &Cluster,
    nodes: &[String],
    cluster_cidrs: &[IpNet],
) {
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {NAME}, labels: {{kubernetes.io/hostname: {NAME}}}}}\n\
             spec: {{taints: [{{key: netcm.test/no-agent, value: \"true\", effect: NoExecute}}]}}\n"
        ))
        .await;
    cluster
        .kubectl(&[
            "patch",
            "node",
            NAME,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{IPV4}"}},{{"type":"InternalIP","address":"{IPV6}"}}]}}}}"#
            ),
        ])
        .await;

    // netcm's lease: CIDRs of both families, the Node's addresses, host-gw with its null backend data.
    let node = eventually(
        &format!("netcm's host-gw lease on {NAME}"),
        Duration::from_secs(30),
        || async {
            let node = cluster.get_json(&["node", NAME]).await;
            let a = &node["metadata"]["annotations"];
            (dual_stack(&cidrs_of(&node))
                && a[format!("{PREFIX}/kube-subnet-manager")] == "true"
                && a[format!("{PREFIX}/backend-type")] == "host-gw"
                && a[format!("{PREFIX}/backend-data")] == "null"
                && a[format!("{PREFIX}/public-ip")] == IPV4
                && a[format!("{PREFIX}/public-ipv6")] == IPV6)
                .then_some(node)
        },
    )
    .await;
    let pods = cluster
        .get_json(&[
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={NAME}"),
        ])
        .await;
    assert_eq!(
        pods["items"].as_array().map(Vec::len),
        Some(0),
        "a pod was bound to {NAME}, which must have no flanneld: {pods}"
    );
    eprintln!(
        "{NAME}: netcm's lease for {:?} at {IPV4}, {IPV6}",
        cidrs_of(&node)
    );

    // Every flanneld routes the agentless Node's CIDRs, and still every peer's.
    routes_match_the_leases(cluster, nodes, cluster_cidrs, Some(NAME)).await;
    cluster.kubectl(&["delete", "node", NAME]).await;
    routes_match_the_leases(cluster, nodes, cluster_cidrs, None).await;
}

/// Waits until every node's flannel routes are exactly those of the leases in the API (host-gw), which
/// include `must_include`'s when given.
async fn routes_match_the_leases(
    cluster: &Cluster,
    nodes: &[String],
    cluster_cidrs: &[IpNet],
    must_include: Option<&str>,
) {
    let leases = flannel_routes::subnet_leases(&cluster.get_json(&["nodes"]).await);
    assert_eq!(
        leases.iter().any(|l| Some(l.node.as_str()) == must_include),
        must_include.is_some(),
        "the leases in the API: {leases:?}"
    );
    for n in nodes {
        let want = flannel_routes::expected(n, Backend::HostGw, &leases);
        flannel_routes::wait_programmed(
            n,
            Backend::HostGw,
            cluster_cidrs,
            &want,
            Duration::from_secs(30),
        )
        .await;
    }
}

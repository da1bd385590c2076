//! The route controller's DaemonSet mode on a real node: routes to peer Nodes in a table of its own, in
//! the node's network namespace.

use super::*;

/// IPv4 routes of a table in the node's namespace (with a protocol, if given), as `DST via GW dev DEV …`
/// lines; none while the table does not exist (`ip` then fails: "FIB table does not exist").
async fn routes(node: &str, table: &str, protocol: Option<&str>) -> Vec<String> {
    let mut args = vec!["ip", "-4", "route", "show", "table", table];
    if let Some(p) = protocol {
        args.extend(["proto", p]);
    }
    let (_, out) = in_node(node, &args).await;
    out.lines()
        .map(without_nexthop_id)
        .filter(|l| !l.is_empty())
        .collect()
}

/// A line of `ip route` with single spaces and without its `nhid N` (netcm's routes name a nexthop
/// object; which id the kernel gave it is not the test's business).
fn without_nexthop_id(line: &str) -> String {
    let mut words = Vec::new();
    let mut tokens = line.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == "nhid" {
            tokens.next();
        } else {
            words.push(t);
        }
    }
    words.join(" ")
}

/// The value of `--NAME=` in an argument list.
fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_controllers_daemonset_routes_to_peer_nodes_in_a_table_of_its_own_with_host_network_and_net_admin(
) {
    // One node (`NODES=1`): one replica, and the DaemonSet's pod beside it.
    let (cluster, client, image) = fresh_cluster(1).await;
    let node = cluster.nodes().remove(0);
    let node_name = node.name.clone();
    let audit_start = audit_mark(&cluster);
    // Peers without a kubelet, at addresses on the nodes' bridge network (on-link from the node, which
    // cluster.sh numbers from .11 up), both families as the cluster is dual-stack.
    let peers = [
        ("netcm-peer-1", "198.19.254.201"),
        ("netcm-peer-2", "198.19.254.202"),
        ("netcm-peer-3", "198.19.254.203"),
    ];
    let ipv6 = |ip: &str| ip.replace("198.19.254.", "fd00:198:19:254::");
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, _) in peers {
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
    for (n, ip) in peers {
        create_node(
            &client,
            &NodeFixture::named(n).internal_ip(ip).internal_ip(&ipv6(ip)),
        )
        .await;
    }
    // A table nobody uses: the chart's value, read back below from what the chart rendered.
    let table_value = "4242";
    assert!(
        routes(&node_name, table_value, None).await.is_empty(),
        "table {table_value} is in use in {node_name}"
    );

    cluster
        .install_netcm(
            &image,
            &[
                "replicaCount=1".to_string(),
                "daemonSet.enabled=true".to_string(),
                format!("daemonSet.bindAddress={}", node.ipv4),
                format!("daemonSet.nodeSelector.kubernetes\\.io/hostname={node_name}"),
                format!("routeController.table={table_value}"),
            ],
        )
        .await;

    // What the chart rendered for the DaemonSet's pod, as it runs.
    let ds_pod = ready_pods(&client, DAEMONSET_PODS, 1).await.remove(0);
    let spec = ds_pod.spec.clone().expect("pod spec");
    assert_eq!(spec.node_name.as_deref(), Some(node_name.as_str()));
    assert_eq!(
        spec.host_network,
        Some(true),
        "the DaemonSet's pod is not on the host network"
    );
    let container = &spec.containers[0];
    let added = container
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    assert!(
        added.iter().any(|c| c == "NET_ADMIN"),
        "no NET_ADMIN: {added:?}"
    );
    let args = container.args.clone().unwrap_or_default();
    let table = arg(&args, "route-table").unwrap_or("main");
    let protocol = arg(&args, "route-protocol").unwrap_or("199");
    assert!(
        !matches!(
            table,
            "main" | "254" | "local" | "255" | "default" | "253" | "0"
        ),
        "the DaemonSet routes in table {table}: {args:?}"
    );
    assert_eq!(
        table, table_value,
        "the chart did not pass routeController.table: {args:?}"
    );

    // Every peer's pod CIDR (allocated by the Deployment) via the peer's address, in that table only.
    let want: BTreeMap<String, String> =
        wait_for("every peer's pod CIDR and lease", TIMEOUT, || async {
            let mut want = BTreeMap::new();
            for (n, ip) in peers {
                let node = nodes.get(n).await.ok()?;
                let cidr = node.spec?.pod_cidr?;
                node.metadata
                    .annotations?
                    .get("flannel.alpha.coreos.com/public-ip")?;
                want.insert(cidr, ip.to_string());
            }
            Some(want)
        })
        .await;
    let programmed = wait_for(
        &format!("routes to {want:?} in table {table}"),
        TIMEOUT,
        || async {
            let have = routes(&node_name, table, Some(protocol)).await;
            want.iter()
                .all(|(cidr, gw)| {
                    have.iter()
                        .any(|r| r.starts_with(&format!("{cidr} via {gw} dev eth0")))
                })
                .then_some(have)
        },
    )
    .await;
    eprintln!(
        "[real-node] table {table}, proto {protocol}:\n{}",
        programmed.join("\n")
    );
    let own_cidr = nodes
        .get(&node_name)
        .await
        .expect("node")
        .spec
        .and_then(|s| s.pod_cidr)
        .expect("node pod CIDR");
    assert!(
        programmed
            .iter()
            .all(|r| !r.starts_with(&format!("{own_cidr} "))),
        "a route to the node's own pod CIDR {own_cidr}: {programmed:?}"
    );
    let in_main = routes(&node_name, "main", Some(protocol)).await;
    assert!(
        in_main.is_empty(),
        "netcm routes in the main table: {in_main:?}"
    );
    // The pod writes its own Node's condition.
    wait_for("NetworkUnavailable=False on the node", TIMEOUT, || async {
        let n = nodes.get(&node_name).await.ok()?;
        n.status?
            .conditions?
            .iter()
            .find(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
            .map(drop)
    })
    .await;
    let log = kubectl_logs(&cluster, &name(&ds_pod)).await;
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the DaemonSet's pod logged a refusal:\n{log}"
    );
    let refused = refused_writes(&cluster, audit_start);
    assert!(refused.is_empty(), "writes refused with 403: {refused:?}");

    let uninstalling = audit_mark(&cluster);
    cluster
        .helm(&["uninstall", RELEASE, "-n", NS, "--wait"])
        .await;
    // helm deletes the RBAC right after the DaemonSet, while its pod is still terminating: what that pod
    // writes meanwhile is refused. Shown, not failed: it is how helm orders an uninstall.
    let refused = refused_writes(&cluster, uninstalling);
    if !refused.is_empty() {
        eprintln!(
            "[real-node] during helm uninstall, {} writes of terminating pods were refused: {:?}",
            refused.len(),
            refused.first()
        );
    }
    // Nothing to clean on the host: the routes lived in the node's namespace, which `down` removes.
    for (n, _) in peers {
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
}

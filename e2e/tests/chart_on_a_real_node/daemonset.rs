//! The route controller's DaemonSet mode on the real node: routes to peer Nodes in a table of its own.

use super::*;

/// The fake peers' network: a veth pair on the host with an on-link subnet, removed on drop (which also
/// removes every route through it).
struct PeerNetwork {
    link: &'static str,
}

impl PeerNetwork {
    fn create(address: &str) -> PeerNetwork {
        let link = "ncm-peers0";
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("run ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = std::process::Command::new("ip")
            .args(["link", "del", link])
            .output();
        ip(&[
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            "ncm-peers1",
        ]);
        ip(&["addr", "add", address, "dev", link]);
        ip(&["link", "set", link, "up"]);
        ip(&["link", "set", "ncm-peers1", "up"]);
        PeerNetwork { link }
    }
}

impl Drop for PeerNetwork {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", self.link])
            .output();
    }
}

/// IPv4 routes of a table (with a protocol, if given), as `DST via GW dev DEV …` lines.
fn routes(table: &str, protocol: Option<&str>) -> Vec<String> {
    let mut args = vec!["-4", "route", "show", "table", table];
    if let Some(p) = protocol {
        args.extend(["proto", p]);
    }
    let out = std::process::Command::new("ip")
        .args(&args)
        .output()
        .expect("run ip route");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// The value of `--NAME=` in an argument list.
fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_controllers_daemonset_routes_to_peer_nodes_in_a_table_of_its_own_with_host_network_and_net_admin(
) {
    let node = real_node();
    let _lock = lock_node(node).await;
    let client = client_for(&node.kubeconfig).await;
    let node_name = node.fact("NODE_NAME").to_string();
    uninstall_leftovers(node, &client).await;
    let audit_start = audit_mark(node);
    // Peers on a network of the test's own (198.19.254.0/24, inside the node's 198.18.0.0/15 block).
    let _network = PeerNetwork::create("198.19.254.1/24");
    let peers = [
        ("netcm-peer-1", "198.19.254.11"),
        ("netcm-peer-2", "198.19.254.12"),
        ("netcm-peer-3", "198.19.254.13"),
    ];
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, _) in peers {
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
    for (n, ip) in peers {
        create_node(&client, &NodeFixture::named(n).internal_ip(ip)).await;
    }
    // A table nobody uses: the chart's value, read back below from what the chart rendered.
    let table_value = "4242";
    assert!(
        routes(table_value, None).is_empty(),
        "table {table_value} is in use on this machine"
    );

    let mut install = strings(&[
        "install",
        RELEASE,
        "charts/netcm",
        "-n",
        NS,
        "--wait",
        "--timeout",
        "120s",
    ]);
    install.extend(install_values(node));
    install.extend(strings(&[
        "--set",
        "daemonSet.enabled=true",
        "--set",
        &format!("daemonSet.bindAddress={}", node.fact("NODE_ADDRESS")),
        "--set",
        &format!("daemonSet.nodeSelector.kubernetes\\.io/hostname={node_name}"),
        "--set",
        &format!("routeController.table={table_value}"),
    ]));
    node.helm(&install).await;

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
            let have = routes(table, Some(protocol));
            want.iter()
                .all(|(cidr, gw)| {
                    have.iter()
                        .any(|r| r.starts_with(&format!("{cidr} via {gw} dev ncm-peers0")))
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
    let in_main = routes("main", Some(protocol));
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
    let log = kubectl_logs(node, &name(&ds_pod)).await;
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the DaemonSet's pod logged a refusal:\n{log}"
    );
    let refused = refused_writes(node, audit_start);
    assert!(refused.is_empty(), "writes refused with 403: {refused:?}");

    let uninstalling = audit_mark(node);
    node.helm(&strings(&["uninstall", RELEASE, "-n", NS, "--wait"]))
        .await;
    // helm deletes the RBAC right after the DaemonSet, while its pod is still terminating: what that pod
    // writes meanwhile is refused. Shown, not failed: it is how helm orders an uninstall.
    let refused = refused_writes(node, uninstalling);
    if !refused.is_empty() {
        eprintln!(
            "[real-node] during helm uninstall, {} writes of terminating pods were refused: {:?}",
            refused.len(),
            refused.first()
        );
    }
    for (n, _) in peers {
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
    drop(_network);
    let _ = std::process::Command::new("ip")
        .args(["route", "flush", "table", table, "proto", protocol])
        .output();
}

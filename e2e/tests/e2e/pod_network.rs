//! A pod network that runs on netcm alone, from an empty cluster: the multi-node cluster of
//! `hack/cluster.sh` (a real kubelet, containerd and kube-proxy per node, each in its own network
//! namespace on one bridge, dual-stack), netcm installed by `helm install` with the values a user gives
//! when netcm is the source of the pod network, containerd rendering each node's bridge + host-local CNI
//! config from the pod CIDRs netcm put on its Node, and netcm's route-controller DaemonSet routing every
//! node to its peers. Everything is asserted on packets and API state: probe pods on every node reach each
//! other by ICMP and TCP over IPv4 and IPv6, through a ClusterIP Service, across Node removal and addition
//! and across the loss of netcm's leader; Nodes a compromised node registers to take the others' traffic
//! take none (`netcm_e2e::hostile_node`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::multinode::{built_image, Cluster};
use netcm_e2e::pod_network::{
    addresses, assert_full_reachability, condition, leader_loss_drops_no_packet, pod_cidrs,
    print_cluster, probe_pods_on, removing_a_node_removes_only_its_routes,
    service_reaches_backends_on_other_nodes,
};
use netcm_e2e::{hostile_node, probe};
use serde_json::Value;

mod routes;

const NODES: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(120);

/// Every Node Ready with an IPv4 and an IPv6 pod CIDR; checks, each time a Node is first seen with
/// `NetworkUnavailable=False`, that its namespace already routes to every peer holding CIDRs.
async fn wait_for_pod_network(cluster: &Cluster, nodes: &[String]) -> BTreeMap<String, Vec<IpNet>> {
    let started = Instant::now();
    let mut network_seen = BTreeMap::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let list = cluster.get_json(&["nodes"]).await;
        let cidrs = pod_cidrs(cluster).await;
        let addrs = addresses(cluster);
        let mut ready = 0;
        for node in list["items"].as_array().into_iter().flatten() {
            let name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
            if !nodes.contains(&name) {
                continue;
            }
            if condition(node, "NetworkUnavailable") == Some("False")
                && !network_seen.contains_key(&name)
            {
                let want = routes::expected_routes(&name, &cidrs, &addrs);
                let have = routes::netcm_routes(&name).await;
                let missing: Vec<_> = want.difference(&have).collect();
                assert!(
                    missing.is_empty(),
                    "{name} reports NetworkUnavailable=False without routes {missing:?} (it has {have:?})"
                );
                network_seen.insert(name.clone(), started.elapsed());
            }
            let families = cidrs.get(&name).map(|c| {
                (
                    c.iter().any(|c| c.addr().is_ipv4()),
                    c.iter().any(|c| c.addr().is_ipv6()),
                )
            });
            if condition(node, "Ready") == Some("True") && families == Some((true, true)) {
                ready += 1;
            }
        }
        if ready == nodes.len() && network_seen.len() == nodes.len() {
            eprintln!("pod network up on {nodes:?} in {:?} (NetworkUnavailable=False at {network_seen:?})", started.elapsed());
            return cidrs;
        }
        assert!(Instant::now() < deadline, "nodes {nodes:?} not Ready with dual-stack pod CIDRs and routes within {TIMEOUT:?}:\n{}", cluster.diagnostics().await);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn netcm_alone_brings_up_a_dual_stack_pod_network_that_survives_node_churn_and_leader_loss() {
    let cluster = Cluster::fresh(NODES);
    let names: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    assert_eq!(names.len(), NODES, "hack/cluster.sh up made {names:?}");

    // Before netcm: Nodes joined, without pod CIDRs, without a CNI config, so NotReady.
    let list = cluster.get_json(&["nodes"]).await;
    for node in list["items"].as_array().into_iter().flatten() {
        assert_eq!(
            node["spec"]["podCIDRs"],
            Value::Null,
            "a pod CIDR before netcm runs: {node}"
        );
        assert_ne!(
            condition(node, "Ready"),
            Some("True"),
            "Ready before a pod network exists: {node}"
        );
    }
    for node in cluster.nodes() {
        let confs = std::fs::read_dir(node.state_dir.join("cni/net.d"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(
            confs, 0,
            "{} has a CNI config before netcm gave it pod CIDRs",
            node.name
        );
    }

    // The images, as a user without a registry imports them; then the chart with the values of
    // README's "netcm as the source of your pod network".
    let (netcm, netcm_tar) = built_image("build");
    let (probe_image, probe_tar) = built_image("probe");
    cluster.load(&netcm_tar, &netcm);
    cluster.load(&probe_tar, &probe_image);
    let started = Instant::now();
    cluster
        .install_netcm(&netcm, &["daemonSet.enabled=true".to_string()])
        .await;
    let cidrs = wait_for_pod_network(&cluster, &names).await;
    eprintln!("helm install to every Node Ready: {:?}", started.elapsed());
    for node in cluster.nodes() {
        let confs = std::fs::read_dir(node.state_dir.join("cni/net.d")).map_or(0, |d| d.count());
        assert_eq!(
            confs, 1,
            "{} has no CNI config rendered from its pod CIDRs",
            node.name
        );
    }

    // Pods everywhere, every pod reaching every other across nodes, both families, ICMP and TCP.
    cluster.apply(&probe::daemonset(&probe_image)).await;
    let pods = probe_pods_on(&cluster, &names, &cidrs, TIMEOUT).await;
    assert_full_reachability(&cluster, &pods).await;

    // A ClusterIP Service reaches the backends on the other nodes; netcm's leader goes during traffic.
    service_reaches_backends_on_other_nodes(&cluster, &pods).await;
    leader_loss_drops_no_packet(&cluster, &pods, TIMEOUT).await;

    // A node's root registers Nodes built to take the others' traffic or stall allocation: no honest
    // pod's traffic moves, no honest Node's CIDRs change, new Nodes are still allocated.
    hostile_node::campaign(&cluster, &pods, &names[NODES - 1], TIMEOUT).await;

    // Delete a Node: its routes leave every other node; nothing else moves.
    let gone = names[NODES - 1].clone();
    let addrs = addresses(&cluster);
    let (remaining, _) = removing_a_node_removes_only_its_routes(
        &cluster,
        &gone,
        &cidrs,
        &pods,
        |n| async move { routes::netcm_routes(&n).await },
        |n, remaining| routes::expected_routes(n, remaining, &addrs),
    )
    .await;

    // Add a node: it gets CIDRs, a CNI config, routes; its pod reaches every other and is reached.
    let mut now: Vec<String> = remaining.into_keys().collect();
    now.push(cluster.add_node());
    let cidrs = wait_for_pod_network(&cluster, &now).await;
    let pods = probe_pods_on(&cluster, &now, &cidrs, TIMEOUT).await;
    assert_full_reachability(&cluster, &pods).await;
    print_cluster(&cluster).await;
}

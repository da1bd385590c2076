//! A pod network that runs on netcm alone, from an empty cluster (issue 27): the multi-node cluster of
//! `hack/cluster.sh` (a real kubelet, containerd and kube-proxy per node, each in its own network
//! namespace on one bridge, dual-stack), netcm installed by `helm install` with the values a user gives
//! when netcm is the source of the pod network, containerd rendering each node's bridge + host-local CNI
//! config from the pod CIDRs netcm put on its Node, and netcm's route-controller DaemonSet routing every
//! node to its peers. Everything is asserted on packets and API state: probe pods on every node reach each
//! other by ICMP and TCP over IPv4 and IPv6, through a ClusterIP Service, across Node removal and addition
//! and across the loss of netcm's leader.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::multinode::{built_image, eventually, Cluster};
use serde_json::Value;

#[path = "pod_network/probe.rs"]
mod probe;
#[path = "pod_network/routes.rs"]
mod routes;

const NODES: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(120);

/// The Nodes' pod CIDRs, parsed.
async fn pod_cidrs(cluster: &Cluster) -> BTreeMap<String, Vec<IpNet>> {
    let nodes = cluster.get_json(&["nodes"]).await;
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let cidrs = n["spec"]["podCIDRs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str()?.parse().ok())
                .collect();
            (
                n["metadata"]["name"].as_str().unwrap_or("").to_string(),
                cidrs,
            )
        })
        .collect()
}

fn condition<'a>(node: &'a Value, kind: &str) -> Option<&'a str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

/// Node name → (IPv4, IPv6) addresses of the cluster's nodes now.
fn addresses(cluster: &Cluster) -> BTreeMap<String, (String, String)> {
    cluster
        .nodes()
        .into_iter()
        .map(|n| (n.name, (n.ipv4, n.ipv6)))
        .collect()
}

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

/// Waits for a ready probe pod on each of `nodes` and checks every pod IP lies inside its Node's CIDRs.
async fn probe_pods_on(
    cluster: &Cluster,
    nodes: &[String],
    cidrs: &BTreeMap<String, Vec<IpNet>>,
) -> BTreeMap<String, probe::ProbePod> {
    let pods = eventually("a ready probe pod on every node", TIMEOUT, || async {
        // Only the pods of these nodes: a deleted Node's pod stays in the API until the pod GC removes it.
        let mut pods = probe::ready_pods(cluster).await;
        pods.retain(|node, _| nodes.contains(node));
        (pods.len() == nodes.len()).then_some(pods)
    })
    .await;
    for pod in pods.values() {
        assert_eq!(
            pod.ips.len(),
            2,
            "{} has one address per family: {:?}",
            pod.name,
            pod.ips
        );
        for ip in &pod.ips {
            assert!(
                cidrs[&pod.node].iter().any(|c| c.contains(ip)),
                "{} on {} has {ip}, outside its Node's pod CIDRs {:?}",
                pod.name,
                pod.node,
                cidrs[&pod.node]
            );
        }
    }
    pods
}

async fn assert_full_reachability(cluster: &Cluster, pods: &BTreeMap<String, probe::ProbePod>) {
    let (failures, matrix) = probe::matrix(cluster, pods).await;
    eprintln!("reachability matrix:\n{matrix}");
    assert!(
        failures.is_empty(),
        "pods that cannot reach each other:\n{}\n{matrix}",
        failures.join("\n")
    );
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
    let pods = probe_pods_on(&cluster, &names, &cidrs).await;
    assert_full_reachability(&cluster, &pods).await;

    // A ClusterIP Service: from each pod, answers come from backends on the other nodes.
    let service_ip = cluster
        .kubectl(&[
            "get",
            "service",
            "-n",
            "default",
            "probe",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await;
    for from in pods.values() {
        let others: Vec<&str> = pods
            .values()
            .filter(|p| p.node != from.node)
            .map(|p| p.name.as_str())
            .collect();
        let mut answered = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let (ok, out) =
                probe::exec(&cluster, &from.name, &["get", &format!("{service_ip}:80")]).await;
            assert!(ok, "{} -> Service {service_ip}:80: {out}", from.name);
            answered.insert(out);
            if others.iter().all(|o| answered.contains(*o)) {
                break;
            }
        }
        assert!(others.iter().all(|o| answered.contains(*o)), "{} reached through the Service only {answered:?}, not every backend on another node {others:?}", from.name);
    }

    leader_loss_drops_no_packet(&cluster, &pods).await;

    // Delete a Node: its routes leave every other node; nothing else moves.
    let gone = names[NODES - 1].clone();
    let stay: Vec<String> = names.iter().filter(|n| **n != gone).cloned().collect();
    let addrs = addresses(&cluster);
    let mut before = BTreeMap::new();
    for n in &stay {
        before.insert(n.clone(), routes::netcm_routes(n).await);
    }
    cluster.remove_node(&gone);
    let remaining: BTreeMap<String, Vec<IpNet>> = cidrs
        .iter()
        .filter(|(n, _)| **n != gone)
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    for n in &stay {
        let want = routes::expected_routes(n, &remaining, &addrs);
        eventually(
            &format!("{gone}'s routes gone from {n}"),
            Duration::from_secs(30),
            || async { (routes::netcm_routes(n).await == want).then_some(()) },
        )
        .await;
        assert!(
            want.is_subset(&before[n]),
            "{n}'s routes to the remaining nodes changed: {:?} then {want:?}",
            before[n]
        );
    }
    assert_eq!(
        pod_cidrs(&cluster).await,
        remaining,
        "the remaining Nodes' pod CIDRs changed"
    );
    let still: BTreeMap<String, probe::ProbePod> = pods
        .iter()
        .filter(|(n, _)| **n != gone)
        .map(|(n, p)| (n.clone(), p.clone()))
        .collect();
    assert_full_reachability(&cluster, &still).await;

    // Add a node: it gets CIDRs, a CNI config, routes; its pod reaches every other and is reached.
    let added = cluster.add_node();
    let mut now: Vec<String> = stay.clone();
    now.push(added.clone());
    let cidrs = wait_for_pod_network(&cluster, &now).await;
    let pods = probe_pods_on(&cluster, &now, &cidrs).await;
    assert_full_reachability(&cluster, &pods).await;
    for line in [
        &["get", "nodes", "-o", "wide"][..],
        &["get", "pods", "-A", "-o", "wide"][..],
    ] {
        eprintln!(
            "$ kubectl {}\n{}",
            line.join(" "),
            cluster.kubectl(line).await
        );
    }
}

/// Streams of echoes between pods on different nodes (IPv4 one way, IPv6 the other) while the leading
/// netcm pod is deleted: every echo is answered.
async fn leader_loss_drops_no_packet(cluster: &Cluster, pods: &BTreeMap<String, probe::ProbePod>) {
    let list: Vec<&probe::ProbePod> = pods.values().collect();
    let mut streams = Vec::new();
    for (i, from) in list.iter().enumerate() {
        let to = list[(i + 1) % list.len()];
        for ip in &to.ips {
            let (c, from, ip) = (cluster.clone(), from.name.clone(), ip.to_string());
            streams.push(tokio::spawn(async move {
                let (ok, out) = probe::exec(&c, &from, &["stream", &ip, "150", "40"]).await;
                (from, ip, ok, out)
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The Lease names a hostname, which every node of this one-machine cluster shares (hostNetwork pods
    // have the host's UTS namespace): the leader is the pod whose metrics say it leads.
    let holder = lease_holder(cluster).await;
    let leader = leading_pod(cluster).await;
    cluster
        .kubectl(&[
            "delete",
            "pod",
            "-n",
            "kube-system",
            &leader,
            "--wait=false",
        ])
        .await;
    for s in streams {
        let (from, ip, ok, out) = s.await.expect("stream task");
        assert!(ok, "{from} -> {ip}: {out}");
        assert_eq!(
            out, "sent 150 received 150",
            "{from} -> {ip} lost echoes while the leader {leader} was deleted"
        );
    }
    eventually("a new netcm leader", TIMEOUT, || async {
        let h = lease_holder(cluster).await;
        (!h.is_empty() && h != holder).then_some(())
    })
    .await;
}

async fn lease_holder(cluster: &Cluster) -> String {
    let (_, holder, _) = cluster
        .try_kubectl(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            "netcm",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .await;
    holder
}

/// The netcm Deployment pod whose `leader_election_master_status` is 1 (scraped from the host, which is
/// on the node bridge; the pods run on their node's network).
async fn leading_pod(cluster: &Cluster) -> String {
    eventually("a netcm pod that reports leading", TIMEOUT, || async {
        let pods = cluster
            .get_json(&[
                "pods",
                "-n",
                "kube-system",
                "-l",
                "app.kubernetes.io/component=controller-manager",
            ])
            .await;
        for p in pods["items"].as_array().into_iter().flatten() {
            let ip = p["status"]["podIP"].as_str().unwrap_or_default();
            let out = tokio::process::Command::new("curl")
                .args([
                    "-s",
                    "--max-time",
                    "3",
                    &format!("http://{ip}:10271/metrics"),
                ])
                .output()
                .await
                .expect("run curl");
            if String::from_utf8_lossy(&out.stdout)
                .contains("leader_election_master_status{name=\"netcm\"} 1")
            {
                return p["metadata"]["name"].as_str().map(String::from);
            }
        }
        None
    })
    .await
}

//! A pod network of flannel beside netcm, from an empty cluster: the
//! multi-node cluster of `hack/cluster.sh` with `CNI=flannel` (no CNI config until flannel installs one),
//! netcm installed by `helm install` to hand out the Nodes' dual-stack pod CIDRs (and publish leases for
//! Nodes without an agent), and real flanneld v0.28 in kube-subnet-manager mode as the DaemonSet of
//! `e2e/testdata/flannel/` with flannel's own CNI plugin, once with the host-gw backend and once with
//! vxlan, one cluster boot each. Asserted on packets and API state: every pod IP lies inside its Node's
//! CIDRs; each flanneld published its own lease and programmed exactly its peers' routes (vxlan: and
//! their VTEPs' neighbour and FDB entries) in its node's namespace; every pod reaches every pod on the
//! other nodes by ICMP and TCP over IPv4 and IPv6, and the other nodes' backends through a ClusterIP
//! Service; deleting netcm's leader during traffic loses no echo; host-gw: a Node without flanneld gets
//! netcm's lease and every flanneld routes to it; deleting a Node removes its routes (vxlan: and VTEP
//! entries) from every other node and nothing else; an added node's pod reaches, and is reached by, all.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::flannel_daemonset::{self, Backend, Flannel};
use netcm_e2e::flannel_routes::{self, PREFIX};
use netcm_e2e::multinode::{built_image, eventually, hold_the_cluster, in_node, script, Cluster};
use netcm_e2e::pod_network::{
    assert_full_reachability, cidrs_of, condition, dual_stack, leader_loss_drops_no_packet,
    print_cluster, probe_pods_on, removing_a_node_removes_only_its_routes,
    service_reaches_backends_on_other_nodes,
};
use netcm_e2e::probe;
use serde_json::Value;

mod agentless;

const NODES: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(180);

/// A fresh cluster whose nodes wait for flannel's CNI config (`CNI=flannel`).
fn fresh_flannel_cluster() -> Cluster {
    hold_the_cluster();
    script("hack/cluster.sh", &["down"], &[]);
    Cluster::up(NODES, &[("CNI", "flannel")])
}

/// `nodes` all Ready with an IPv4 and an IPv6 pod CIDR and flanneld's lease for `backend`: their CIDRs
/// and Node objects.
async fn wait_for_pod_network(
    cluster: &Cluster,
    nodes: &[String],
    backend: Backend,
) -> (BTreeMap<String, Vec<IpNet>>, Vec<Value>) {
    let started = Instant::now();
    let deadline = started + TIMEOUT;
    loop {
        let list = cluster.get_json(&["nodes"]).await;
        let items: Vec<Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| nodes.iter().any(|x| n["metadata"]["name"] == x.as_str()))
            .cloned()
            .collect();
        let up = items.len() == nodes.len()
            && items.iter().all(|n| {
                condition(n, "Ready") == Some("True")
                    && dual_stack(&cidrs_of(n))
                    && n["metadata"]["annotations"][format!("{PREFIX}/backend-type")]
                        == backend.name()
                    // netcm's syncer may publish a Node's lease before that Node's flanneld starts;
                    // only the agent knows its VTEP's MAC, so a vxlan lease is the agent's once it
                    // carries backend-data.
                    && (backend.name() != "vxlan"
                        || n["metadata"]["annotations"][format!("{PREFIX}/backend-data")]
                            .as_str()
                            .is_some_and(|d| !d.is_empty()))
            });
        if up {
            eprintln!(
                "flannel {} pod network up on {nodes:?} in {:?}",
                backend.name(),
                started.elapsed()
            );
            let cidrs = items
                .iter()
                .map(|n| {
                    (
                        n["metadata"]["name"].as_str().unwrap_or("").to_string(),
                        cidrs_of(n),
                    )
                })
                .collect();
            return (cidrs, items);
        }
        assert!(
            Instant::now() < deadline,
            "Nodes {nodes:?} not Ready with dual-stack pod CIDRs and flannel {} leases within {TIMEOUT:?}:\n{}\n{}",
            backend.name(),
            cluster.diagnostics().await,
            cluster
                .kubectl(&["-n", "kube-flannel", "logs", "-l", "app=flannel", "--tail=20", "--prefix", "--all-containers"])
                .await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What one node's flanneld did from the Node netcm gave CIDRs: its subnet.env names those CIDRs, its
/// conflist names its own subnet.env, its lease names the node's addresses (vxlan: its `flannel.1`'s MAC,
/// which only that flanneld knows, so netcm's syncer did not overwrite it).
async fn node_agent_did_its_part(
    cluster: &Cluster,
    node: &Value,
    cidrs: &BTreeMap<String, Vec<IpNet>>,
    backend: Backend,
) {
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    let annotation = |key: &str| {
        node["metadata"]["annotations"][format!("{PREFIX}/{key}")]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let me = cluster
        .nodes()
        .into_iter()
        .find(|n| n.name == name)
        .expect("a cluster node");
    assert_eq!(annotation("public-ip"), me.ipv4, "{name}'s lease");
    assert_eq!(annotation("public-ipv6"), me.ipv6, "{name}'s lease");
    let dir = me.state_dir;
    let wanted: Vec<String> = cidrs[name]
        .iter()
        .map(|cidr| {
            // flannel's gateway is the CIDR's first address after the network's (ipnet's IPv6 hosts()
            // start at the network address itself).
            let gateway: std::net::IpAddr = match cidr.network() {
                std::net::IpAddr::V4(a) => (u32::from(a) + 1).to_be_bytes().into(),
                std::net::IpAddr::V6(a) => (u128::from(a) + 1).to_be_bytes().into(),
            };
            let key = if cidr.addr().is_ipv4() {
                "FLANNEL_SUBNET"
            } else {
                "FLANNEL_IPV6_SUBNET"
            };
            format!("{key}={gateway}/{}", cidr.prefix_len())
        })
        .collect();
    // flanneld writes subnet.env after publishing its lease, so it may lag the annotations a moment.
    let subnet_env = dir.join("flannel/subnet.env");
    let env = eventually(
        &format!("{name}'s subnet.env naming its pod CIDRs {wanted:?}"),
        Duration::from_secs(30),
        || async {
            let env = std::fs::read_to_string(&subnet_env).unwrap_or_default();
            wanted
                .iter()
                .all(|w| env.lines().any(|l| l == w))
                .then_some(env)
        },
    )
    .await;
    assert!(
        env.contains("FLANNEL_IPMASQ=true"),
        "{name}'s subnet.env:\n{env}"
    );
    // flannel's the only config: with another beside it (a bridge template rendered by containerd) the
    // runtime would pick whichever sorts first.
    let confs: Vec<String> = std::fs::read_dir(dir.join("cni/net.d"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(confs, ["10-flannel.conflist"], "{name}'s CNI configs");
    let conf = std::fs::read_to_string(dir.join("cni/net.d/10-flannel.conflist"))
        .unwrap_or_else(|e| panic!("{name}'s flannel conflist: {e}"));
    assert!(
        conf.contains(&format!("{}/flannel/subnet.env", dir.display())),
        "{name}'s conflist names another node's subnet.env:\n{conf}"
    );
    if backend == Backend::Vxlan {
        let (ok, out) = in_node(name, &["ip", "-d", "link", "show", "flannel.1"]).await;
        assert!(
            ok && out.contains("vxlan id 1"),
            "{name} has no flannel.1 vxlan device: {out}"
        );
        let mac = out
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap_or("?");
        assert!(
            annotation("backend-data").contains(mac),
            "{name}'s lease {} does not carry flannel.1's MAC {mac}",
            annotation("backend-data")
        );
    }
}

/// Every one of `nodes` holds exactly the flannel routes (and VTEP entries) of its peers' leases now in
/// the API.
async fn every_node_routes_its_peers(
    cluster: &Cluster,
    nodes: &[String],
    backend: Backend,
    cluster_cidrs: &[IpNet],
) {
    let leases = flannel_routes::subnet_leases(&cluster.get_json(&["nodes"]).await);
    for n in nodes {
        let want = flannel_routes::expected(n, backend, &leases);
        flannel_routes::wait_programmed(n, backend, cluster_cidrs, &want, Duration::from_secs(30))
            .await;
    }
}

async fn flannel_beside_netcm_carries_pods_through_node_churn_and_leader_loss(backend: Backend) {
    let cluster = fresh_flannel_cluster();
    let names: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    assert_eq!(names.len(), NODES, "hack/cluster.sh up made {names:?}");
    for node in cluster.nodes() {
        // Nothing of an earlier run either: a bridge run's CNI template would be rendered by containerd
        // into a config sorting before flannel's, an old subnet.env would give pods addresses from a
        // CIDR the Node no longer holds (`hack/cluster.sh down` removes both).
        for left in ["cni/template.json", "flannel", "cni/flannel"] {
            assert!(
                !node.state_dir.join(left).exists(),
                "{} holds {left} before flannel runs",
                node.name
            );
        }
        let confs = std::fs::read_dir(node.state_dir.join("cni/net.d")).map_or(0, |d| d.count());
        assert_eq!(
            confs, 0,
            "{} has a CNI config before flannel runs",
            node.name
        );
    }

    let (netcm, netcm_tar) = built_image("build");
    let (probe_image, probe_tar) = built_image("probe");
    let (flanneld, flanneld_tar) = flannel_daemonset::build_image();
    for (tar, image) in [
        (&netcm_tar, &netcm),
        (&probe_tar, &probe_image),
        (&flanneld_tar, &flanneld),
    ] {
        cluster.load(tar, image);
    }

    // netcm as the source of the CIDRs: the allocator, and the annotation syncer told flannel's backend
    // (it leaves every Node whose flanneld publishes its own lease alone); no route controller, since
    // flannel routes.
    let cluster_cidrs: Vec<IpNet> = cluster
        .fact("CLUSTER_CIDR")
        .split(',')
        .map(|c| c.parse().expect("CLUSTER_CIDR"))
        .collect();
    let started = Instant::now();
    cluster
        .install_netcm(
            &netcm,
            &[format!("annotationSyncer.backendType={}", backend.name())],
        )
        .await;
    let flannel = Flannel {
        image: flanneld,
        nodes_dir: PathBuf::from(cluster.fact("STATE_DIR")).join("nodes"),
        cluster_cidrs: cluster_cidrs.clone(),
        backend,
    };
    flannel.apply(&cluster.kubectl, &cluster.kubeconfig);
    let (cidrs, items) = wait_for_pod_network(&cluster, &names, backend).await;
    eprintln!(
        "helm install + flannel apply to every Node Ready: {:?}",
        started.elapsed()
    );
    flannel_daemonset::wait_rolled_out(&cluster.kubectl, &cluster.kubeconfig, TIMEOUT);
    for node in &items {
        node_agent_did_its_part(&cluster, node, &cidrs, backend).await;
    }
    every_node_routes_its_peers(&cluster, &names, backend, &cluster_cidrs).await;

    // Pods everywhere, every pod reaching every other across nodes, both families, ICMP and TCP; the
    // Service's backends on the other nodes; netcm's leader deleted during traffic.
    cluster.apply(&probe::daemonset(&probe_image)).await;
    let pods = probe_pods_on(&cluster, &names, &cidrs, TIMEOUT).await;
    assert_full_reachability(&cluster, &pods).await;
    service_reaches_backends_on_other_nodes(&cluster, &pods).await;
    leader_loss_drops_no_packet(&cluster, &pods, TIMEOUT).await;

    // host-gw: netcm's lease for a Node without an agent is accepted by every real flanneld. (vxlan has
    // none to give: a lease without the VTEP MAC only that Node's agent knows is useless.)
    if backend == Backend::HostGw {
        agentless::netcms_lease_for_a_node_without_flanneld_is_routed_by_every_flanneld(
            &cluster,
            &names,
            &cluster_cidrs,
        )
        .await;
    }

    // Delete a Node: its routes (vxlan: and its VTEP's neighbour and FDB entries) leave every other node,
    // theirs to each other stay; the remaining pods still talk.
    let gone = names[NODES - 1].clone();
    let leases = flannel_routes::subnet_leases(&cluster.get_json(&["nodes"]).await);
    let (remaining, _) = removing_a_node_removes_only_its_routes(
        &cluster,
        &gone,
        &cidrs,
        &pods,
        |n| {
            let cluster_cidrs = cluster_cidrs.clone();
            async move { flannel_routes::programmed(&n, backend, &cluster_cidrs).await }
        },
        |n, remaining| {
            let kept: Vec<_> = leases
                .iter()
                .filter(|l| remaining.contains_key(&l.node))
                .cloned()
                .collect();
            flannel_routes::expected(n, backend, &kept)
        },
    )
    .await;

    // Add a node: its flanneld publishes its lease, every node routes to it, its pod reaches every other
    // and is reached.
    let mut now: Vec<String> = remaining.into_keys().collect();
    now.push(cluster.add_node());
    let (cidrs, items) = wait_for_pod_network(&cluster, &now, backend).await;
    let added = items
        .iter()
        .find(|n| n["metadata"]["name"] == now[now.len() - 1].as_str())
        .expect("the added Node");
    node_agent_did_its_part(&cluster, added, &cidrs, backend).await;
    every_node_routes_its_peers(&cluster, &now, backend, &cluster_cidrs).await;
    let pods = probe_pods_on(&cluster, &now, &cidrs, TIMEOUT).await;
    assert_full_reachability(&cluster, &pods).await;
    print_cluster(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flannel_host_gw_beside_netcm_carries_pods_through_node_churn_and_leader_loss() {
    flannel_beside_netcm_carries_pods_through_node_churn_and_leader_loss(Backend::HostGw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flannel_vxlan_beside_netcm_carries_pods_through_node_churn_and_leader_loss() {
    flannel_beside_netcm_carries_pods_through_node_churn_and_leader_loss(Backend::Vxlan).await;
}

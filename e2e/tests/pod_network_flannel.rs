//! A pod network of flannel beside netcm, from an empty cluster (issue 27 item 2, "flannel"): the
//! multi-node cluster of `hack/cluster.sh` with `CNI=flannel` (no CNI config until flannel installs one),
//! netcm installed by `helm install` to hand out the Nodes' dual-stack pod CIDRs (and publish leases for
//! Nodes without an agent, which here is none), and real flanneld v0.28 in kube-subnet-manager mode as
//! the DaemonSet of `e2e/testdata/flannel/` with flannel's own CNI plugin, once with the host-gw backend
//! and once with vxlan. Asserted on packets and API state: every pod IP lies inside its Node's CIDRs,
//! every pod reaches every pod on the other nodes by ICMP and TCP over IPv4 and IPv6, each flanneld
//! published its own lease (netcm wrote none on its Node) and programmed its backend in its node's
//! namespace.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::flannel_daemonset::{self, Backend, Flannel};
use netcm_e2e::multinode::{
    assignments, built_image, eventually, hold_the_cluster, in_node, script, Cluster,
};
use netcm_e2e::probe;
use serde_json::Value;

const NODES: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(180);
const PREFIX: &str = "flannel.alpha.coreos.com";

/// A fresh cluster whose nodes wait for flannel's CNI config (`CNI=flannel`).
fn fresh_flannel_cluster() -> Cluster {
    hold_the_cluster();
    script("hack/cluster.sh", &["down"], &[]);
    // Node directories survive `down`. A bridge run's CNI template would be rendered by containerd into a
    // config that sorts before flannel's, and an earlier run's subnet.env (on a real node /run/flannel is
    // a tmpfs, gone with a reboot) would give pods addresses from a CIDR the Node no longer holds until
    // flanneld rewrites it: no node of this run may find either.
    let state = assignments(&script("hack/cluster.sh", &["env"], &[]))
        .remove("STATE_DIR")
        .expect("hack/cluster.sh env prints STATE_DIR");
    if let Ok(dirs) = std::fs::read_dir(PathBuf::from(state).join("nodes")) {
        for dir in dirs.flatten() {
            let _ = std::fs::remove_file(dir.path().join("cni/template.json"));
            let _ = std::fs::remove_dir_all(dir.path().join("flannel"));
            let _ = std::fs::remove_dir_all(dir.path().join("cni/flannel"));
        }
    }
    Cluster::up(NODES, &[("CNI", "flannel")])
}

fn condition<'a>(node: &'a Value, kind: &str) -> Option<&'a str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

fn cidrs_of(node: &Value) -> Vec<IpNet> {
    node["spec"]["podCIDRs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str()?.parse().ok())
        .collect()
}

/// Every Node Ready with an IPv4 and an IPv6 pod CIDR and flanneld's lease for `backend`: the CIDRs.
async fn wait_for_pod_network(
    cluster: &Cluster,
    backend: Backend,
) -> (BTreeMap<String, Vec<IpNet>>, Vec<Value>) {
    let started = Instant::now();
    let deadline = started + TIMEOUT;
    loop {
        let list = cluster.get_json(&["nodes"]).await;
        let items: Vec<Value> = list["items"].as_array().cloned().unwrap_or_default();
        let up = items.len() == NODES
            && items.iter().all(|n| {
                let c = cidrs_of(n);
                condition(n, "Ready") == Some("True")
                    && c.iter().any(|c| c.addr().is_ipv4())
                    && c.iter().any(|c| c.addr().is_ipv6())
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
                "flannel {} pod network up in {:?}",
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
            "Nodes not Ready with dual-stack pod CIDRs and flannel {} leases within {TIMEOUT:?}:\n{}\n{}",
            backend.name(),
            cluster.diagnostics().await,
            cluster
                .kubectl(&["-n", "kube-flannel", "logs", "-l", "app=flannel", "--tail=20", "--prefix", "--all-containers"])
                .await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn flannel_brings_up_a_dual_stack_pod_network(backend: Backend) {
    let cluster = fresh_flannel_cluster();
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), NODES, "hack/cluster.sh up made {nodes:?}");
    for node in &nodes {
        let confs = std::fs::read_dir(node.state_dir.join("cni/net.d"))
            .map(|d| d.count())
            .unwrap_or(0);
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
    let cluster_cidr = cluster.fact("CLUSTER_CIDR").to_string();
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
        cluster_cidrs: cluster_cidr
            .split(',')
            .map(|c| c.parse().expect("CLUSTER_CIDR"))
            .collect(),
        backend,
    };
    flannel.apply(&cluster.kubectl, &cluster.kubeconfig);
    let (cidrs, items) = wait_for_pod_network(&cluster, backend).await;
    eprintln!(
        "helm install + flannel apply to every Node Ready: {:?}",
        started.elapsed()
    );
    flannel_daemonset::wait_rolled_out(&cluster.kubectl, &cluster.kubeconfig, TIMEOUT);

    // Each flanneld wrote its node's subnet.env from the CIDRs netcm gave the Node, and its lease names
    // the node's addresses (for vxlan: its own VTEP's MAC, which only that flanneld knows, so netcm's
    // syncer did not overwrite it).
    for node in &items {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let annotation = |key: &str| {
            node["metadata"]["annotations"][format!("{PREFIX}/{key}")]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let me = nodes
            .iter()
            .find(|n| n.name == name)
            .expect("a cluster node");
        assert_eq!(annotation("public-ip"), me.ipv4, "{name}'s lease");
        assert_eq!(annotation("public-ipv6"), me.ipv6, "{name}'s lease");
        let dir = nodes
            .iter()
            .find(|n| n.name == name)
            .expect("a cluster node")
            .state_dir
            .clone();
        // flanneld writes subnet.env after publishing its lease, so it may lag the annotations a moment.
        let wanted: Vec<String> = cidrs[name]
            .iter()
            .map(|cidr| {
                // flannel's gateway is the CIDR's first address after the network's (ipnet's IPv6
                // hosts() start at the network address itself).
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
        let conf = std::fs::read_to_string(dir.join("cni/net.d/10-flannel.conflist"))
            .unwrap_or_else(|e| panic!("{name}'s flannel conflist: {e}"));
        assert!(
            conf.contains(&format!("{}/flannel/subnet.env", dir.display())),
            "{name}'s conflist names another node's subnet.env:\n{conf}"
        );
        // The backend is programmed in the node's namespace: a VXLAN device, or a route per peer.
        match backend {
            Backend::Vxlan => {
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
            Backend::HostGw => {
                let (_, out) = in_node(name, &["ip", "route", "show"]).await;
                for (peer, peer_cidrs) in cidrs.iter().filter(|(p, _)| p.as_str() != name) {
                    let v4 = peer_cidrs
                        .iter()
                        .find(|c| c.addr().is_ipv4())
                        .expect("IPv4 CIDR");
                    assert!(
                        out.contains(&v4.to_string()),
                        "{name} has no host-gw route to {peer}'s {v4}:\n{out}"
                    );
                }
            }
        }
    }

    cluster.apply(&probe::daemonset(&probe_image)).await;
    let pods = eventually("a ready probe pod on every node", TIMEOUT, || async {
        let pods = probe::ready_pods(&cluster).await;
        (pods.len() == NODES).then_some(pods)
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
    let (failures, matrix) = probe::matrix(&cluster, &pods).await;
    eprintln!("flannel {} reachability matrix:\n{matrix}", backend.name());
    assert!(
        failures.is_empty(),
        "pods that cannot reach each other over flannel {}:\n{}\n{matrix}",
        backend.name(),
        failures.join("\n")
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flannel_host_gw_beside_netcm_brings_up_a_dual_stack_pod_network() {
    flannel_brings_up_a_dual_stack_pod_network(Backend::HostGw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flannel_vxlan_beside_netcm_brings_up_a_dual_stack_pod_network() {
    flannel_brings_up_a_dual_stack_pod_network(Backend::Vxlan).await;
}

//! The checks both pod network tests run on the multi-node cluster of `hack/cluster.sh`,
//! whoever routes the pods — netcm's route-controller DaemonSet or flanneld beside netcm: every pod IP
//! inside its Node's CIDRs, the reachability matrix, a ClusterIP Service across nodes, a Node's removal
//! (its routes leave every other node, nothing else moves) and the loss of netcm's leader during traffic.
//! What "a node's routes" are is the caller's: each configuration programs different kernel state.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use ipnet::IpNet;
use serde_json::Value;

use crate::multinode::{eventually, master_status, Cluster};
use crate::probe::{self, ProbePod};

/// The status (`"True"`, `"False"`, …) of the Node's condition `kind`.
pub fn condition<'a>(node: &'a Value, kind: &str) -> Option<&'a str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

/// A Node's `spec.podCIDRs`, parsed.
pub fn cidrs_of(node: &Value) -> Vec<IpNet> {
    node["spec"]["podCIDRs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str()?.parse().ok())
        .collect()
}

/// Whether the CIDRs hold one of each family.
pub fn dual_stack(cidrs: &[IpNet]) -> bool {
    cidrs.iter().any(|c| c.addr().is_ipv4()) && cidrs.iter().any(|c| c.addr().is_ipv6())
}

/// Every Node's pod CIDRs, by name.
pub async fn pod_cidrs(cluster: &Cluster) -> BTreeMap<String, Vec<IpNet>> {
    let nodes = cluster.get_json(&["nodes"]).await;
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            (
                n["metadata"]["name"].as_str().unwrap_or("").to_string(),
                cidrs_of(n),
            )
        })
        .collect()
}

/// Node name → (IPv4, IPv6) addresses of the cluster's nodes now.
pub fn addresses(cluster: &Cluster) -> BTreeMap<String, (String, String)> {
    cluster
        .nodes()
        .into_iter()
        .map(|n| (n.name, (n.ipv4, n.ipv6)))
        .collect()
}

/// Waits for a ready probe pod on each of `nodes` and checks every pod IP lies inside its Node's CIDRs.
pub async fn probe_pods_on(
    cluster: &Cluster,
    nodes: &[String],
    cidrs: &BTreeMap<String, Vec<IpNet>>,
    timeout: Duration,
) -> BTreeMap<String, ProbePod> {
    let pods = eventually("a ready probe pod on every node", timeout, || async {
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

/// Every pod reaches every pod on the other nodes, ICMP and TCP, both families; prints the matrix.
pub async fn assert_full_reachability(cluster: &Cluster, pods: &BTreeMap<String, ProbePod>) {
    let (failures, matrix) = probe::matrix(cluster, pods).await;
    eprintln!("reachability matrix:\n{matrix}");
    assert!(
        failures.is_empty(),
        "pods that cannot reach each other:\n{}\n{matrix}",
        failures.join("\n")
    );
}

/// Through the probe DaemonSet's ClusterIP Service, each pod gets answers from every backend on another
/// node (kube-proxy's DNAT inside the sender's node, then the pod network to the backend's node).
pub async fn service_reaches_backends_on_other_nodes(
    cluster: &Cluster,
    pods: &BTreeMap<String, ProbePod>,
) {
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
        let mut answered = BTreeSet::new();
        for _ in 0..40 {
            let (ok, out) =
                probe::exec(cluster, &from.name, &["get", &format!("{service_ip}:80")]).await;
            assert!(ok, "{} -> Service {service_ip}:80: {out}", from.name);
            answered.insert(out);
            if others.iter().all(|o| answered.contains(*o)) {
                break;
            }
        }
        assert!(
            others.iter().all(|o| answered.contains(*o)),
            "{} reached through the Service only {answered:?}, not every backend on another node {others:?}",
            from.name
        );
    }
}

/// Deletes the Node `gone` (`hack/cluster.sh remove-node`) and checks that what `programmed` reads from
/// each other node's namespace becomes exactly `expected` for the remaining Nodes' CIDRs — the routes
/// towards `gone` leave, the rest stays as it was — that no other Node's CIDRs change, and that the
/// remaining pods still reach each other. Returns the remaining CIDRs and pods.
pub async fn removing_a_node_removes_only_its_routes<P, F, E>(
    cluster: &Cluster,
    gone: &str,
    cidrs: &BTreeMap<String, Vec<IpNet>>,
    pods: &BTreeMap<String, ProbePod>,
    programmed: P,
    expected: E,
) -> (BTreeMap<String, Vec<IpNet>>, BTreeMap<String, ProbePod>)
where
    P: Fn(String) -> F,
    F: Future<Output = BTreeSet<String>>,
    E: Fn(&str, &BTreeMap<String, Vec<IpNet>>) -> BTreeSet<String>,
{
    let stay: Vec<String> = cidrs.keys().filter(|n| *n != gone).cloned().collect();
    let mut before = BTreeMap::new();
    for n in &stay {
        before.insert(n.clone(), programmed(n.clone()).await);
    }
    cluster.remove_node(gone);
    let remaining: BTreeMap<String, Vec<IpNet>> = cidrs
        .iter()
        .filter(|(n, _)| *n != gone)
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    for n in &stay {
        let want = expected(n, &remaining);
        assert!(
            want.is_subset(&before[n]) && want != before[n],
            "{n} held no routes towards {gone} before it went, or lacked some to the others: {:?}, want {want:?} after",
            before[n]
        );
        eventually(
            &format!("{gone}'s routes gone from {n}, the others kept ({want:?})"),
            Duration::from_secs(30),
            || async { (programmed(n.clone()).await == want).then_some(()) },
        )
        .await;
    }
    assert_eq!(
        pod_cidrs(cluster).await,
        remaining,
        "the remaining Nodes' pod CIDRs changed"
    );
    let still: BTreeMap<String, ProbePod> = pods
        .iter()
        .filter(|(n, _)| *n != gone)
        .map(|(n, p)| (n.clone(), p.clone()))
        .collect();
    assert_full_reachability(cluster, &still).await;
    (remaining, still)
}

/// Echoes per stream, one every [`ECHO_INTERVAL_MS`]: 16 s of traffic, so the handover (sub-second once
/// the leader steps down) falls well inside every stream, which the test checks.
const ECHOES: &str = "400";
const ECHO_INTERVAL_MS: &str = "40";

/// Streams of echoes between pods on different nodes (IPv4 one way, IPv6 the other) while the leading
/// netcm pod is deleted: another pod takes the lead while every stream is still running, and every echo
/// is answered.
pub async fn leader_loss_drops_no_packet(
    cluster: &Cluster,
    pods: &BTreeMap<String, ProbePod>,
    timeout: Duration,
) {
    // The Lease names a hostname, which every node of this one-machine cluster shares (hostNetwork pods
    // have the host's UTS namespace): the leader is the pod whose metrics say it leads. Found before the
    // traffic starts: the lookup may poll for as long as the streams last.
    let holder = lease_holder(cluster).await;
    let (leader, _) = leading_pod(cluster, timeout).await;
    let streams = probe::EchoStreams::start(cluster, pods, ECHOES, ECHO_INTERVAL_MS);
    tokio::time::sleep(Duration::from_secs(1)).await;
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
    eventually("a new netcm leader", timeout, || async {
        let h = lease_holder(cluster).await;
        (!h.is_empty() && h != holder).then_some(())
    })
    .await;
    // Else the echoes proved nothing about the handover.
    let (count, ended) = streams.ended();
    assert_eq!(
        ended, 0,
        "{ended} of {count} echo streams had ended before another pod took the lead from {leader}"
    );
    streams
        .assert_every_echo_answered(&format!("the leader {leader} was deleted"))
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
/// on the node bridge; the pods run on their node's network): its name and address.
pub async fn leading_pod(cluster: &Cluster, timeout: Duration) -> (String, String) {
    eventually("a netcm pod that reports leading", timeout, || async {
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
            if master_status(ip).await == Some(1.0) {
                return p["metadata"]["name"]
                    .as_str()
                    .map(|name| (name.to_string(), ip.to_string()));
            }
        }
        None
    })
    .await
}

/// `kubectl get nodes -o wide` and `kubectl get pods -A -o wide`, printed for the closing note.
pub async fn print_cluster(cluster: &Cluster) {
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

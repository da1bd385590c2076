//! Pod network benchmark on the multi-node cluster of `hack/cluster.sh` (run through
//! `hack/bench-pod-network.sh`). For each configuration — flannel host-gw, flannel
//! vxlan (both beside netcm, which hands out the CIDRs) and netcm alone (route-controller DaemonSet,
//! bridge + host-local) — a fresh cluster of two nodes with probe pods, then:
//!
//! - **join**: one more node (`hack/cluster.sh add-node`); the time from its kubelet's start (the mtime
//!   of its pid file) until its probe pod answers ICMP and HTTP from the probe pod of every other node;
//! - **throughput and latency** between the first two nodes over IPv4, pod to pod and node to node on
//!   the same bridge: `probe blast` into `probe sink` for SECONDS, and `probe rtt` (HTTP round trips on
//!   one connection, median of 200).
//!
//! Prints a markdown table. The e2e tests prove the pod network works; this only measures it.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use netcm_e2e::flannel_daemonset::{self, Backend, Flannel};
use netcm_e2e::multinode::{built_image, hold_the_cluster, in_node, script, Cluster};
use netcm_e2e::probe;
use tokio::process::{Child, Command};

const SECONDS: &str = "5";

struct Row {
    config: &'static str,
    join: Duration,
    pod_mbit: String,
    node_mbit: String,
    pod_rtt: String,
    node_rtt: String,
}

/// A cluster of two nodes booted from zero with `cni` (`down` leaves no earlier run's state behind).
fn fresh(cni: &str) -> Cluster {
    hold_the_cluster();
    script("hack/cluster.sh", &["down"], &[]);
    Cluster::up(2, &[("CNI", cni)])
}

async fn install(cluster: &Cluster, backend: Option<Backend>, images: &Images) {
    for (image, tar) in [&images.netcm, &images.probe, &images.flanneld] {
        cluster.load(tar, image);
    }
    let cidr = cluster.fact("CLUSTER_CIDR").to_string();
    let extra = match backend {
        Some(b) => format!("annotationSyncer.backendType={}", b.name()),
        None => "daemonSet.enabled=true".to_string(),
    };
    cluster.install_netcm(&images.netcm.0, &[extra]).await;
    if let Some(backend) = backend {
        Flannel {
            image: images.flanneld.0.clone(),
            nodes_dir: PathBuf::from(cluster.fact("STATE_DIR")).join("nodes"),
            cluster_cidrs: cidr.split(',').map(|c| c.parse().unwrap()).collect(),
            backend,
        }
        .apply(&cluster.kubectl, &cluster.kubeconfig);
    }
    cluster.apply(&probe::daemonset(&images.probe.0)).await;
}

/// The probe pods, once one runs ready on each of `nodes` nodes.
async fn pods(cluster: &Cluster, nodes: usize) -> Vec<probe::ProbePod> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pods = probe::ready_pods(cluster).await;
        if pods.len() == nodes {
            return pods.into_values().collect();
        }
        assert!(
            Instant::now() < deadline,
            "probe pods not ready on {nodes} nodes:\n{}",
            cluster.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn v4(pod: &probe::ProbePod) -> String {
    pod.ips.iter().find(|i| i.is_ipv4()).unwrap().to_string()
}

/// Seconds from the new node's kubelet start until every other node's probe pod reaches its pod.
async fn join(cluster: &Cluster) -> Duration {
    let before = pods(cluster, 2).await;
    let added = cluster.add_node();
    let state = cluster
        .nodes()
        .into_iter()
        .find(|n| n.name == added)
        .unwrap()
        .state_dir;
    let kubelet_start = std::fs::metadata(state.join("kubelet.pid"))
        .and_then(|m| m.modified())
        .unwrap();
    loop {
        if let Some(new) = probe::ready_pods(cluster).await.remove(&added) {
            let ip = v4(&new);
            let mut all = true;
            for from in &before {
                let (icmp, _) = probe::exec(cluster, &from.name, &["ping", &ip]).await;
                let (tcp, out) =
                    probe::exec(cluster, &from.name, &["get", &format!("{ip}:8080")]).await;
                all &= icmp && tcp && out == new.name;
            }
            if all {
                return SystemTime::now().duration_since(kubelet_start).unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn probe_in_node(node: &str, bin: &str, args: &[&str]) -> Child {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{node}"))
        .arg("--")
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn exec_in_pod(cluster: &Cluster, pod: &str, args: &[&str]) -> Child {
    Command::new(&cluster.kubectl)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(["exec", "-n", "default", pod, "--", "/probe"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The value of `key=value` in the probe's output, or the whole output (its error) if there is none.
fn prefixed(out: &str, key: &str) -> String {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .map_or_else(|| format!("? ({})", out.trim()), str::to_string)
}

/// The word after `key` in the probe's output, or the whole output (its error) if there is none.
fn after(out: &str, key: &str) -> String {
    let mut words = out.split_whitespace().skip_while(|w| *w != key);
    words
        .nth(1)
        .map_or_else(|| format!("? ({})", out.trim()), str::to_string)
}

async fn measure(cluster: &Cluster, probe_bin: &str, config: &'static str) -> Row {
    let join = join(cluster).await;
    let nodes = cluster.nodes();
    let (a, b) = (&nodes[0], &nodes[1]);
    let by_node = probe::ready_pods(cluster).await;
    let (pa, pb) = (&by_node[&a.name], &by_node[&b.name]);
    // Pod to pod: a sink in b's pod (kubectl exec keeps it running), the client in a's pod.
    let _sink = exec_in_pod(cluster, &pb.name, &["sink", "5201"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ip = v4(pb);
    let (_, blast) = probe::exec(
        cluster,
        &pa.name,
        &["blast", &format!("{ip}:5201"), SECONDS],
    )
    .await;
    let (_, rtt) = probe::exec(cluster, &pa.name, &["rtt", &format!("{ip}:8080"), "200"]).await;
    // Node to node: the same binary in the nodes' namespaces, over the same bridge.
    let _node_sink = probe_in_node(&b.name, probe_bin, &["sink", "5202"]);
    let _node_serve = probe_in_node(&b.name, probe_bin, &["serve", "8098"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, node_blast) = in_node(
        &a.name,
        &[probe_bin, "blast", &format!("{}:5202", b.ipv4), SECONDS],
    )
    .await;
    let (_, node_rtt) = in_node(
        &a.name,
        &[probe_bin, "rtt", &format!("{}:8098", b.ipv4), "200"],
    )
    .await;
    Row {
        config,
        join,
        pod_mbit: after(&blast, "mbit_per_s"),
        node_mbit: after(&node_blast, "mbit_per_s"),
        pod_rtt: prefixed(&rtt, "median="),
        node_rtt: prefixed(&node_rtt, "median="),
    }
}

struct Images {
    netcm: (String, String),
    probe: (String, String),
    flanneld: (String, String),
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let images = Images {
        netcm: built_image("build"),
        probe: built_image("probe"),
        flanneld: flannel_daemonset::build_image(),
    };
    let cache = std::env::var("NETCM_CACHE_DIR").unwrap_or_else(|_| {
        let base = std::env::var("XDG_CACHE_HOME")
            .unwrap_or_else(|_| format!("{}/.cache", std::env::var("HOME").unwrap()));
        format!("{base}/netcm")
    });
    let key = images.probe.0.rsplit_once(':').unwrap().1;
    let probe_bin = format!("{cache}/probe-{key}/probe");
    assert!(
        PathBuf::from(&probe_bin).exists(),
        "no probe binary at {probe_bin}"
    );
    let only = std::env::var("CONFIGS").unwrap_or_default();
    let mut rows = Vec::new();
    for (config, cni, backend) in [
        ("flannel host-gw", "flannel", Some(Backend::HostGw)),
        ("flannel vxlan", "flannel", Some(Backend::Vxlan)),
        ("netcm alone", "bridge", None),
    ] {
        if !only.is_empty() && !only.split(',').any(|c| config.contains(c)) {
            continue;
        }
        eprintln!("== {config}");
        let cluster = fresh(cni);
        install(&cluster, backend, &images).await;
        let row = measure(&cluster, &probe_bin, config).await;
        eprintln!(
            "{config}: join {:?}, pod {} / node {} Mbit/s, rtt pod {} / node {} us",
            row.join, row.pod_mbit, row.node_mbit, row.pod_rtt, row.node_rtt
        );
        rows.push(row);
    }
    script("hack/cluster.sh", &["down"], &[]);
    println!("| configuration | kubelet start → first pod reachable from every node | TCP pod→pod (Mbit/s) | TCP node→node (Mbit/s) | HTTP RTT pod→pod median (µs) | HTTP RTT node→node median (µs) |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.1} s | {} | {} | {} | {} |",
            r.config,
            r.join.as_secs_f64(),
            r.pod_mbit,
            r.node_mbit,
            r.pod_rtt,
            r.node_rtt
        );
    }
}

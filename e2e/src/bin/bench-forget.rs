//! How long what a surviving node holds about a deleted Node keeps pointing at it (`hack/bench.sh forget`):
//! the measurement `--cidr-release-hold`'s default is chosen from, since a CIDR handed to the
//! next Node while a holder still routes, DNATs or resolves towards the old owner sends the new owner's
//! traffic to a dead machine, or the old owner's flows to the new one.
//!
//! For each configuration — netcm alone (route-controller DaemonSet, bridge + host-local, as
//! `e2e/tests/e2e/pod_network.rs`), flannel host-gw and flannel vxlan beside netcm (as
//! `pod_network_flannel.rs`) — one fresh cluster of two nodes with probe pods, then REPEATS times: a third
//! node joins; from the first node's namespace UDP flows go to that node's probe pod through a Service
//! selecting only it, through one selecting it and the first node's pod, and to its pod IP, all answered
//! (so conntrack keeps them as streams); the node dies as a machine does — kubelet and kube-proxy killed,
//! its link down, its pods still "Running" in the API — and its Node is deleted (time zero: the DELETE is
//! sent; a dead kubelet cannot register it again). The pod-IP flow stops there, the Service flows keep
//! sending, as a client that has not noticed would. Every 250 ms, until all are gone or OBSERVE_SECONDS
//! (default 150) have passed, the first node's namespace is read for each holder's entries about the dead
//! node (`netcm_e2e::forget` says what each is and how it is read). Then the kernel settings that bound
//! the rest, read in the same namespace.
//!
//! Prints markdown tables: per holder and configuration the median and the maximum time until its last
//! entry was gone (`> OBSERVE_SECONDS` when one outlived the observation), and the settings.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netcm_e2e::flannel_daemonset::{self, Backend, Flannel};
use netcm_e2e::flannel_routes::{self, SubnetLease};
use netcm_e2e::forget::{self, Holder, Target, UdpFlow};
use netcm_e2e::multinode::{built_image, eventually, hold_the_cluster, in_node, script, Cluster};
use netcm_e2e::pod_network::pod_cidrs;
use netcm_e2e::probe::{self, ProbePod};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const POLL: Duration = Duration::from_millis(250);
const TIMEOUT: Duration = Duration::from_secs(300);

/// Two Services in front of the probe pod of the node about to die: `forget` of nothing else, so the
/// deletion leaves it without a backend; `forget-shared` also of the survivor's probe pod, so one is left.
const SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: forget, namespace: default}
spec:
  selector: {app: probe, forget: target}
  ports: [{name: udp, protocol: UDP, port: 8080, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: forget-shared, namespace: default}
spec:
  selector: {app: probe, forget-shared: "yes"}
  ports: [{name: udp, protocol: UDP, port: 8080, targetPort: 8080}]
"#;

#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    cni: &'static str,
    backend: Option<Backend>,
}

impl Config {
    fn holders(self) -> Vec<Holder> {
        let mut h = match self.backend {
            None => vec![Holder::NetcmRoutes],
            Some(Backend::HostGw) => vec![Holder::FlannelRoutes],
            Some(Backend::Vxlan) => vec![Holder::FlannelRoutes, Holder::FlannelVtep],
        };
        h.extend([
            Holder::ConntrackService,
            Holder::ConntrackServiceEmptied,
            Holder::ConntrackPod,
            Holder::Neighbour,
        ]);
        h
    }
}

/// What became of one holder's entries after one deletion.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// The last entry was gone this long after the DELETE was sent.
    Gone(f64),
    /// Entries were still there when the observation ended.
    Stayed,
    /// It held nothing about the node before it died (nothing to forget).
    Absent,
}

struct Images {
    netcm: (String, String),
    probe: (String, String),
    flanneld: (String, String),
}

/// A cluster of two nodes booted from zero with `cni`, netcm (and flanneld), the probe pods on both and
/// the Service.
async fn boot(config: Config, images: &Images) -> Cluster {
    hold_the_cluster();
    script("hack/cluster.sh", &["down"], &[]);
    let cluster = Cluster::up(2, &[("CNI", config.cni)]);
    for (image, tar) in [&images.netcm, &images.probe, &images.flanneld] {
        cluster.load(tar, image);
    }
    let extra = match config.backend {
        Some(b) => format!("annotationSyncer.backendType={}", b.name()),
        None => "daemonSet.enabled=true".to_string(),
    };
    cluster.install_netcm(&images.netcm.0, &[extra]).await;
    if let Some(backend) = config.backend {
        Flannel {
            image: images.flanneld.0.clone(),
            nodes_dir: PathBuf::from(cluster.fact("STATE_DIR")).join("nodes"),
            cluster_cidrs: cluster_cidrs(&cluster),
            backend,
        }
        .apply(&cluster.kubectl, &cluster.kubeconfig);
    }
    cluster.apply(&probe::daemonset(&images.probe.0)).await;
    cluster.apply(SERVICES).await;
    let survivor = cluster.nodes()[0].name.clone();
    let pod = eventually("a ready probe pod on both nodes", TIMEOUT, || async {
        let mut pods = probe::ready_pods(&cluster).await;
        (pods.len() == 2).then(|| pods.remove(&survivor)).flatten()
    })
    .await;
    label(&cluster, &pod.name, "forget-shared=yes").await;
    cluster
}

fn cluster_cidrs(cluster: &Cluster) -> Vec<ipnet::IpNet> {
    cluster
        .fact("CLUSTER_CIDR")
        .split(',')
        .map(|c| c.parse().unwrap())
        .collect()
}

fn v4(pod: &ProbePod) -> IpAddr {
    *pod.ips.iter().find(|i| i.is_ipv4()).unwrap()
}

/// A node joined and serving: its probe pod ready and, from `survivor`, routed to by whoever routes;
/// what identifies it for every holder.
async fn join(cluster: &Cluster, config: Config, survivor: &str) -> (String, ProbePod, Target) {
    let doomed = cluster.add_node();
    let pod = eventually(
        &format!("a ready probe pod on {doomed}"),
        TIMEOUT,
        || async { probe::ready_pods(cluster).await.remove(&doomed) },
    )
    .await;
    let cidrs = pod_cidrs(cluster).await.remove(&doomed).unwrap_or_default();
    let node = cluster
        .nodes()
        .into_iter()
        .find(|n| n.name == doomed)
        .unwrap();
    let flannel = match config.backend {
        None => None,
        Some(backend) => Some((
            backend,
            eventually(&format!("{doomed}'s flannel lease"), TIMEOUT, || async {
                lease_of(cluster, &doomed, backend).await
            })
            .await,
        )),
    };
    let target = Target {
        survivor: survivor.to_string(),
        node_ips: vec![node.ipv4.parse().unwrap(), node.ipv6.parse().unwrap()],
        pod_ip: v4(&pod),
        shared_service_ip: cluster_ip(cluster, "forget-shared").await,
        sole_service_ip: cluster_ip(cluster, "forget").await,
        cidrs,
        flannel,
        cluster_cidrs: cluster_cidrs(cluster),
    };
    // Every route (and VTEP entry) towards it programmed in the survivor before it can be forgotten.
    let want = match &target.flannel {
        None => target.cidrs.len(),
        Some((backend, lease)) => {
            flannel_routes::expected(survivor, *backend, std::slice::from_ref(lease)).len()
        }
    };
    let route_holders: Vec<Holder> = config
        .holders()
        .into_iter()
        .filter(|h| {
            matches!(
                h,
                Holder::NetcmRoutes | Holder::FlannelRoutes | Holder::FlannelVtep
            )
        })
        .collect();
    eventually(
        &format!("{survivor}'s routes to {doomed}"),
        TIMEOUT,
        || async {
            let mut n = 0;
            for h in &route_holders {
                n += forget::present(*h, &target).await.len();
            }
            (n == want).then_some(())
        },
    )
    .await;
    (doomed, pod, target)
}

async fn cluster_ip(cluster: &Cluster, service: &str) -> IpAddr {
    cluster
        .kubectl(&[
            "get",
            "service",
            "-n",
            "default",
            service,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await
        .trim()
        .parse()
        .unwrap()
}

async fn label(cluster: &Cluster, pod: &str, label: &str) {
    cluster
        .kubectl(&["label", "pod", "-n", "default", pod, label, "--overwrite"])
        .await;
}

/// The Node's flannel lease once complete (vxlan: with the VTEP MACs only its own flanneld knows).
async fn lease_of(cluster: &Cluster, node: &str, backend: Backend) -> Option<SubnetLease> {
    let lease = flannel_routes::subnet_leases(&cluster.get_json(&["nodes"]).await)
        .into_iter()
        .find(|l| l.node == node)?;
    (backend == Backend::HostGw || (!lease.vtep_mac.is_empty() && !lease.vtep_mac6.is_empty()))
        .then_some(lease)
}

/// A flow that gets answers: a fresh socket until one does (a first datagram sent before kube-proxy
/// programmed the Service makes an entry without DNAT that later datagrams of that socket would keep).
async fn answered_flow(from: &str, to: SocketAddr) -> UdpFlow {
    for _ in 0..20 {
        let flow = UdpFlow::start(from, to);
        tokio::time::sleep(Duration::from_secs(3)).await;
        if flow.replies() > 0 {
            return flow;
        }
    }
    panic!("no UDP echo from {to} to {from} within a minute");
}

/// A flow through the shared Service that kube-proxy DNATed to the doomed pod (each socket's first
/// datagram picks a backend at random).
async fn flow_to_the_doomed_pod(target: &Target) -> UdpFlow {
    let to = SocketAddr::new(target.shared_service_ip, probe::PORT);
    for _ in 0..20 {
        let flow = answered_flow(&target.survivor, to).await;
        if !forget::present(Holder::ConntrackService, target)
            .await
            .is_empty()
        {
            return flow;
        }
    }
    panic!("20 flows to {to} all went to the survivor's pod");
}

/// Kills what would register the Node again or clean up after it, and takes the node off the wire.
async fn die(cluster: &Cluster, node: &str) {
    let state = cluster
        .nodes()
        .into_iter()
        .find(|n| n.name == node)
        .unwrap()
        .state_dir;
    for daemon in ["kubelet", "kube-proxy"] {
        let pid: i32 = std::fs::read_to_string(state.join(format!("{daemon}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    }
    let (ok, out) = in_node(node, &["ip", "link", "set", "eth0", "down"]).await;
    assert!(ok, "link down in {node}: {out}");
}

/// One node joined, died and deleted; what became of each holder.
async fn one_deletion(
    cluster: &Cluster,
    config: Config,
    observe: Duration,
) -> Vec<(Holder, Outcome)> {
    let survivor = cluster.nodes()[0].name.clone();
    let (doomed, pod, target) = join(cluster, config, &survivor).await;
    label(cluster, &pod.name, "forget=target").await;
    label(cluster, &pod.name, "forget-shared=yes").await;
    let mut sole_flow = answered_flow(
        &survivor,
        SocketAddr::new(target.sole_service_ip, probe::PORT),
    )
    .await;
    let mut shared_flow = flow_to_the_doomed_pod(&target).await;
    let mut pod_flow = answered_flow(&survivor, SocketAddr::new(target.pod_ip, probe::PORT)).await;
    // Answered for more than 2 s: the kernel gives a UDP flow the stream timeout only after that.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holders = config.holders();
    let mut left: BTreeMap<Holder, Vec<String>> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for h in &holders {
        let entries = forget::present(*h, &target).await;
        eprintln!("  before: {h:?}: {entries:?}");
        if entries.is_empty() {
            outcomes.push((*h, Outcome::Absent));
        } else {
            left.insert(*h, entries);
        }
    }
    die(cluster, &doomed).await;
    let t0 = Instant::now();
    cluster.kubectl(&["delete", "node", &doomed]).await;
    pod_flow.stop();
    eprintln!(
        "  {doomed} died; DELETE node returned after {:?}",
        t0.elapsed()
    );
    while !left.is_empty() && t0.elapsed() < observe {
        for h in left.keys().copied().collect::<Vec<_>>() {
            let now = forget::present(h, &target).await;
            let at = t0.elapsed().as_secs_f64();
            if now.is_empty() {
                eprintln!("  {at:6.1} s  {h:?} gone");
                left.remove(&h);
                outcomes.push((h, Outcome::Gone(at)));
            } else if changed(&now, &left[&h]) {
                eprintln!("  {at:6.1} s  {h:?}: {now:?}");
                left.insert(h, now);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    for (h, entries) in &left {
        eprintln!("  still there after {observe:?}: {h:?}: {entries:?}");
        outcomes.push((*h, Outcome::Stayed));
    }
    let (v4, v6) = forget::neighbour_count(&survivor).await;
    eprintln!("  {survivor} holds {v4} IPv4 and {v6} IPv6 neighbour entries");
    sole_flow.stop();
    shared_flow.stop();
    // The dead node's pods stay in the API until the pod GC's orphan quarantine ends; the Service must
    // not keep the next node's pod company.
    cluster
        .kubectl(&[
            "delete",
            "pods",
            "-A",
            &format!("--field-selector=spec.nodeName={doomed}"),
            "--force",
            "--grace-period=0",
            "--wait=false",
        ])
        .await;
    cluster.remove_node(&doomed);
    outcomes
}

fn changed(now: &[String], before: &[String]) -> bool {
    let strip =
        |v: &[String]| -> Vec<String> { v.iter().map(|e| forget::without_countdown(e)).collect() };
    strip(now) != strip(before)
}

/// Median and maximum over the deletions that had something to forget; a deletion whose entries
/// outlived the observation counts as longer than any.
fn summary(outcomes: &[Outcome], observe: Duration) -> (String, String) {
    let mut times: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Gone(s) => Some(*s),
            Outcome::Stayed => Some(f64::INFINITY),
            Outcome::Absent => None,
        })
        .collect();
    if times.is_empty() {
        return ("nothing held".into(), "nothing held".into());
    }
    times.sort_by(f64::total_cmp);
    let show = |s: f64| {
        if s.is_finite() {
            format!("{s:.1} s")
        } else {
            format!("> {} s", observe.as_secs())
        }
    };
    // The upper middle of an even count: the table is read for a bound.
    (show(times[times.len() / 2]), show(times[times.len() - 1]))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let repeats = netcm_e2e::env_or::<u64>("REPEATS", 3);
    let observe = Duration::from_secs(netcm_e2e::env_or::<u64>("OBSERVE_SECONDS", 150));
    let only = std::env::var("CONFIGS").unwrap_or_default();
    let images = Images {
        netcm: built_image("build"),
        probe: built_image("probe"),
        flanneld: flannel_daemonset::build_image(),
    };
    let mut results: Vec<(&'static str, Holder, Vec<Outcome>)> = Vec::new();
    let mut sysctls = Vec::new();
    for config in [
        Config {
            name: "netcm alone",
            cni: "bridge",
            backend: None,
        },
        Config {
            name: "flannel host-gw",
            cni: "flannel",
            backend: Some(Backend::HostGw),
        },
        Config {
            name: "flannel vxlan",
            cni: "flannel",
            backend: Some(Backend::Vxlan),
        },
    ] {
        if !only.is_empty() && !only.split(',').any(|c| config.name.contains(c)) {
            continue;
        }
        eprintln!("== {}", config.name);
        let cluster = boot(config, &images).await;
        let mut by_holder: BTreeMap<Holder, Vec<Outcome>> = BTreeMap::new();
        for r in 1..=repeats {
            eprintln!("-- {} deletion {r}/{repeats}", config.name);
            for (h, o) in one_deletion(&cluster, config, observe).await {
                by_holder.entry(h).or_default().push(o);
            }
        }
        sysctls = forget::forget_sysctls(&cluster.nodes()[0].name).await;
        results.extend(by_holder.into_iter().map(|(h, o)| (config.name, h, o)));
    }
    script("hack/cluster.sh", &["down"], &[]);
    println!(
        "| holder | configuration | median | max | method (on the surviving node's namespace) |"
    );
    println!("|---|---|---|---|---|");
    for (config, holder, outcomes) in &results {
        let (median, max) = summary(outcomes, observe);
        println!(
            "| {} | {config} | {median} | {max} | {} |",
            holder.name(),
            holder.method()
        );
    }
    println!("\nREPEATS={repeats}, OBSERVE_SECONDS={}; times from the Node's DELETE being sent, polled every {POLL:?}.\n", observe.as_secs());
    println!("| /proc/sys/net/… (read in the surviving node's namespace) | value |");
    println!("|---|---|");
    for (key, value) in sysctls {
        println!("| {key} | {value} |");
    }
}

//! The hostile-node campaign on the multi-node cluster of `hack/cluster.sh`: an attacker holding node
//! credentials (the `system:nodes` group, for Node names of its choosing, as a bootstrap token's holder
//! can have signed) registers Nodes built to take honest pods' traffic or stall allocation — pod CIDRs
//! copied from, inside, covering and pinned to a victim's pod, huge and zero pod capacity, a copied
//! `spec.providerID`, annotations at the API's size limit, label churn — while honest pods exchange
//! echoes. Each round checks, on kernel routes, packets and API state: every honest pod's address is
//! routed to its own node on every node, no echo is lost, no honest Node's CIDRs change, every hostile
//! Node that overlaps an honest one gets `RouteCIDRConflict`, new honest Nodes are still allocated, CIDRs
//! that overlap nothing, and netcm's leader keeps running. It prints one table row per round (netcm's
//! CPU among them); `hack/hostile-node.sh` runs more rounds than `hack/test.sh`'s one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::multinode::{assignments, eventually, in_node, script, Cluster};
use crate::overlaps::overlapping_pairs;
use crate::pod_network::{addresses, leading_pod, pod_cidrs};
use crate::probe::{EchoStreams, ProbePod};
use crate::proc_stats::proc_stats;

/// Rounds of the campaign: `NETCM_HOSTILE_ROUNDS` (`hack/hostile-node.sh` sets it), else 1.
pub fn rounds() -> usize {
    std::env::var("NETCM_HOSTILE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(1)
}

/// What one round measured, for the table.
#[derive(Debug, Clone)]
pub struct RoundReport {
    pub hostile_nodes: usize,
    pub conflicts_evented: usize,
    pub honest_kept: usize,
    pub new_honest_allocated: usize,
    pub new_honest_seconds: f64,
    pub echoes: String,
    pub netcm_cpu_per_second: f64,
    pub seconds: f64,
}

/// Echoes per stream during a round, one every 40 ms: 30 s, longer than a round's registrations.
const ECHOES: &str = "750";
/// Label patches the churning hostile Node makes in a round.
const LABEL_CHURN: usize = 40;
/// New honest Nodes created while the hostile ones are there.
const NEW_HONEST: usize = 3;
/// A hostile value just under the API server's 256 KiB limit on a Node's annotations.
const ANNOTATION_BYTES: usize = 250 * 1024;
/// netcm's leader may use at most this share of a core through a round (it idles between syncs; a
/// loop on hostile data would hold a core).
const CPU_SHARE_BOUND: f64 = 0.5;

/// Runs the campaign against the honest `pods` (one per honest node), with the node `compromised` as the
/// attacker's machine (its addresses are the hostile Nodes'); prints the table and returns its rows.
pub async fn campaign(
    cluster: &Cluster,
    pods: &BTreeMap<String, ProbePod>,
    compromised: &str,
    timeout: Duration,
) -> Vec<RoundReport> {
    let mut reports = Vec::new();
    for round in 1..=rounds() {
        let report = one_round(cluster, pods, compromised, round, timeout).await;
        eprintln!("hostile-node round {round}: {report:?}");
        reports.push(report);
    }
    eprintln!("{}", table(&reports));
    reports
}

/// The campaign's table, one row per round.
pub fn table(reports: &[RoundReport]) -> String {
    let mut out = String::from(
        "round | hostile Nodes | RouteCIDRConflict | honest Nodes kept | new honest allocated (s) | echoes | netcm CPU s/s | round s\n",
    );
    for (i, r) in reports.iter().enumerate() {
        out.push_str(&format!(
            "{} | {} | {} | {} | {} ({:.1}) | {} | {:.3} | {:.0}\n",
            i + 1,
            r.hostile_nodes,
            r.conflicts_evented,
            r.honest_kept,
            r.new_honest_allocated,
            r.new_honest_seconds,
            r.echoes,
            r.netcm_cpu_per_second,
            r.seconds
        ));
    }
    out
}

/// A hostile Node as its attacker registers it.
struct Hostile {
    name: String,
    pod_cidrs: Vec<IpNet>,
    /// Overlaps an honest Node's CIDRs, so it must get `RouteCIDRConflict` and no route.
    overlaps_honest: bool,
    capacity_pods: Option<&'static str>,
    provider_id: Option<String>,
    annotation_bytes: usize,
}

impl Hostile {
    fn new(name: String) -> Hostile {
        Hostile {
            name,
            pod_cidrs: Vec::new(),
            overlaps_honest: false,
            capacity_pods: None,
            provider_id: None,
            annotation_bytes: 0,
        }
    }

    fn with_cidrs(name: String, cidrs: Vec<IpNet>) -> Hostile {
        Hostile {
            pod_cidrs: cidrs,
            overlaps_honest: true,
            ..Hostile::new(name)
        }
    }

    /// The Node object, status included (a kubelet registers its status with its Node).
    fn manifest(&self, addresses: &(String, String)) -> Value {
        let mut spec = json!({});
        if let Some(first) = self.pod_cidrs.first() {
            spec["podCIDR"] = json!(first.to_string());
            spec["podCIDRs"] = json!(self
                .pod_cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>());
        }
        if let Some(id) = &self.provider_id {
            spec["providerID"] = json!(id);
        }
        let mut annotations = json!({});
        if self.annotation_bytes > 0 {
            annotations["hostile.example/filler"] = json!("x".repeat(self.annotation_bytes));
        }
        let mut capacity = json!({ "cpu": "1", "memory": "1Gi" });
        if let Some(pods) = self.capacity_pods {
            capacity["pods"] = json!(pods);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": { "netcm-e2e/hostile": "true" },
                "annotations": annotations,
            },
            "spec": spec,
            "status": {
                "addresses": [
                    { "type": "InternalIP", "address": addresses.0 },
                    { "type": "InternalIP", "address": addresses.1 },
                ],
                "capacity": capacity,
                "allocatable": capacity,
            },
        })
    }
}

/// The hostile Nodes of a round, aimed at `victim`'s CIDRs and the address of its probe pod.
fn hostile_nodes(
    round: usize,
    victim_cidrs: &[IpNet],
    victim_pod: &ProbePod,
    victim_provider_id: Option<String>,
) -> Vec<Hostile> {
    let name = |kind: &str| format!("hostile-{kind}-{round}");
    let contained = victim_cidrs
        .iter()
        .filter_map(|c| c.subnets(c.prefix_len() + 1).ok()?.nth(1))
        .collect();
    let covering = victim_cidrs.iter().filter_map(IpNet::supernet).collect();
    let pinned = victim_pod
        .ips
        .iter()
        .map(|ip| IpNet::from(*ip))
        .collect::<Vec<_>>();
    let mut all = vec![
        Hostile::with_cidrs(name("copied"), victim_cidrs.to_vec()),
        Hostile::with_cidrs(name("contained"), contained),
        Hostile::with_cidrs(name("covering"), covering),
        Hostile::with_cidrs(name("pinned"), pinned),
    ];
    let mut huge = Hostile::new(name("huge"));
    huge.capacity_pods = Some("1000000");
    let mut zero = Hostile::new(name("zero"));
    zero.capacity_pods = Some("0");
    let mut provider = Hostile::new(name("provider"));
    provider.provider_id =
        Some(victim_provider_id.unwrap_or_else(|| format!("netcm-e2e://{}", victim_pod.node)));
    let mut annotated = Hostile::new(name("annotated"));
    annotated.annotation_bytes = ANNOTATION_BYTES;
    all.extend([huge, zero, provider, annotated, Hostile::new(name("churn"))]);
    all
}

/// A kubeconfig holding node credentials for `name` (`hack/cluster.sh node-credentials`).
fn node_credentials(cluster: &Cluster, name: &str) -> Cluster {
    let out = script("hack/cluster.sh", &["node-credentials", name], &[]);
    let kubeconfig = assignments(&out).remove("KUBECONFIG").unwrap_or_else(|| {
        panic!("hack/cluster.sh node-credentials printed no KUBECONFIG=…: {out:?}")
    });
    Cluster {
        kubeconfig: PathBuf::from(kubeconfig),
        ..cluster.clone()
    }
}

async fn one_round(
    cluster: &Cluster,
    pods: &BTreeMap<String, ProbePod>,
    compromised: &str,
    round: usize,
    timeout: Duration,
) -> RoundReport {
    let started = Instant::now();
    let honest_before = pod_cidrs(cluster).await;
    let addrs = addresses(cluster);
    let attacker_addresses = addrs[compromised].clone();
    let (victim, victim_pod) = pods
        .iter()
        .find(|(node, _)| node.as_str() != compromised)
        .map(|(n, p)| (n.clone(), p.clone()))
        .expect("an honest node besides the compromised one");
    let victim_provider_id = cluster.get_json(&["node", &victim]).await["spec"]["providerID"]
        .as_str()
        .map(String::from);
    let (leader, leader_ip) = leading_pod(cluster, timeout).await;
    let restarts_before = netcm_restarts(cluster).await;
    let leader_node = addrs
        .iter()
        .find(|(_, (v4, v6))| *v4 == leader_ip || *v6 == leader_ip)
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| panic!("no node has the leader's address {leader_ip}: {addrs:?}"));
    let leader_pid = netcm_pid(&leader_node).await;
    let cpu_before = proc_stats(leader_pid).cpu_seconds;

    // Honest traffic through the whole round: every honest pod to the next, both families.
    let streams = EchoStreams::start(cluster, pods, ECHOES, "40");

    // The attack: every hostile Node registered with the attacker's credentials.
    let hostile = hostile_nodes(
        round,
        &honest_before[&victim],
        &victim_pod,
        victim_provider_id,
    );
    for h in &hostile {
        let as_node = node_credentials(cluster, &h.name);
        as_node
            .kubectl_stdin(
                &["create", "-f", "-"],
                &h.manifest(&attacker_addresses).to_string(),
            )
            .await;
    }
    let churn = format!("hostile-churn-{round}");
    let churner = node_credentials(cluster, &churn);
    for i in 0..LABEL_CHURN {
        churner
            .kubectl(&[
                "label",
                "node",
                &churn,
                &format!("hostile.example/churn={i}"),
                "--overwrite",
            ])
            .await;
    }

    // New honest Nodes, registered by the cluster's admin while the hostile ones are there.
    let honest_new: Vec<String> = (1..=NEW_HONEST)
        .map(|i| format!("honest-late-{round}-{i}"))
        .collect();
    let created = Instant::now();
    for name in &honest_new {
        cluster
            .kubectl_stdin(
                &["create", "-f", "-"],
                &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
                    .to_string(),
            )
            .await;
    }
    let allocated = eventually(
        "the new honest Nodes allocated beside the hostile ones",
        timeout,
        || async {
            let now = pod_cidrs(cluster).await;
            honest_new
                .iter()
                .all(|n| now.get(n).is_some_and(|c| c.len() == 2))
                .then_some(now)
        },
    )
    .await;
    let new_honest_seconds = created.elapsed().as_secs_f64();
    // What netcm handed out overlaps nothing: every Node but the hostile ones registered with a CIDR
    // of their own, the new honest ones and the hostile huge, zero, copied-providerID, annotated and
    // churning ones among them.
    let overlapping: BTreeSet<String> = hostile
        .iter()
        .filter(|h| h.overlaps_honest)
        .map(|h| h.name.clone())
        .collect();
    let clashes = overlapping_pairs(
        allocated
            .iter()
            .filter(|(name, _)| !overlapping.contains(*name))
            .flat_map(|(name, cidrs)| cidrs.iter().map(move |c| (*c, name.clone()))),
    );
    assert!(
        clashes.is_empty(),
        "pod CIDRs that overlap beside the hostile Nodes: {clashes:?}"
    );

    // Every hostile Node that overlaps an honest one is told so, and routed nowhere.
    let evented = eventually(
        "RouteCIDRConflict on every overlapping hostile Node",
        timeout,
        || async {
            let seen = conflict_events(cluster).await;
            overlapping.is_subset(&seen).then_some(seen)
        },
    )
    .await;
    let honest_nodes: Vec<String> = pods.keys().cloned().collect();
    for node in &honest_nodes {
        assert_routes_to_owners(node, pods, &addrs).await;
    }

    let echoes = streams
        .assert_every_echo_answered("hostile Nodes registered")
        .await;
    let honest_after = pod_cidrs(cluster).await;
    for node in &honest_nodes {
        assert_eq!(
            honest_after.get(node),
            honest_before.get(node),
            "the honest Node {node}'s pod CIDRs changed during the hostile round"
        );
    }
    let (leader_after, _) = leading_pod(cluster, timeout).await;
    assert_eq!(
        leader_after, leader,
        "netcm's leader changed during the hostile round"
    );
    assert_eq!(
        netcm_restarts(cluster).await,
        restarts_before,
        "a netcm container restarted during the hostile round"
    );
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = proc_stats(leader_pid).cpu_seconds;
    assert!(
        cpu_after > 0.0,
        "the leader's process {leader_pid} is gone or reads no CPU time"
    );
    let cpu = (cpu_after - cpu_before) / seconds;
    assert!(
        cpu < CPU_SHARE_BOUND,
        "netcm's leader used {cpu:.2} of a core through the hostile round (bound {CPU_SHARE_BOUND})"
    );

    // The round's Nodes go, so the next round and the rest of the test start from the honest cluster.
    let mut gone: Vec<&str> = hostile.iter().map(|h| h.name.as_str()).collect();
    gone.extend(honest_new.iter().map(String::as_str));
    let mut args = vec!["delete", "node", "--wait=true"];
    args.extend(gone);
    cluster.kubectl(&args).await;

    RoundReport {
        hostile_nodes: hostile.len(),
        conflicts_evented: evented.intersection(&overlapping).count(),
        honest_kept: honest_nodes.len(),
        new_honest_allocated: honest_new.len(),
        new_honest_seconds,
        echoes,
        netcm_cpu_per_second: cpu,
        seconds,
    }
}

/// The Nodes with a `RouteCIDRConflict` Event.
async fn conflict_events(cluster: &Cluster) -> BTreeSet<String> {
    let events = cluster
        .get_json(&[
            "events",
            "-A",
            "--field-selector",
            "reason=RouteCIDRConflict",
        ])
        .await;
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["involvedObject"]["name"].as_str().map(String::from))
        .collect()
}

/// On `node`, the kernel's route to each other honest pod's address leads to that pod's own node.
async fn assert_routes_to_owners(
    node: &str,
    pods: &BTreeMap<String, ProbePod>,
    addrs: &BTreeMap<String, (String, String)>,
) {
    for pod in pods.values().filter(|p| p.node != node) {
        for ip in &pod.ips {
            let (want, family) = match ip {
                IpAddr::V4(_) => (&addrs[&pod.node].0, "-4"),
                IpAddr::V6(_) => (&addrs[&pod.node].1, "-6"),
            };
            let (ok, out) =
                in_node(node, &["ip", "-j", family, "route", "get", &ip.to_string()]).await;
            assert!(ok, "ip route get {ip} in {node}: {out}");
            let route: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
            let via = route
                .first()
                .and_then(|r| r["gateway"].as_str())
                .unwrap_or_default();
            assert_eq!(
                via, want,
                "on {node}, {ip} (the pod {} on {}) is routed via {via:?}, not its node: {out}",
                pod.name, pod.node
            );
        }
    }
}

/// Restarts of every netcm container (Deployment and DaemonSet).
async fn netcm_restarts(cluster: &Cluster) -> i64 {
    let pods = cluster
        .get_json(&[
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=netcm",
        ])
        .await;
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| c["restartCount"].as_i64())
        .sum()
}

/// The host's pid of the netcm process serving metrics on `node`'s network (port 10271: the host
/// network's pods are in the node's namespace, in the host's pid namespace).
async fn netcm_pid(node: &str) -> u32 {
    let (ok, out) = in_node(node, &["ss", "-ltnpH", "sport = :10271"]).await;
    assert!(ok, "ss in {node}: {out}");
    out.split("pid=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no process listens on port 10271 in {node}: {out:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ips: &[&str]) -> ProbePod {
        ProbePod {
            name: "probe-x".into(),
            node: "ncm-n1".into(),
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
        }
    }

    #[test]
    fn the_hostile_cidrs_sit_inside_around_on_and_at_the_victims() {
        let victim: Vec<IpNet> = vec![
            "198.19.128.0/24".parse().expect("cidr"),
            "fd00:198:19:1000::/64".parse().expect("cidr"),
        ];
        let nodes = hostile_nodes(
            1,
            &victim,
            &pod(&["198.19.128.5", "fd00:198:19:1000::5"]),
            None,
        );
        let cidrs = |kind: &str| -> Vec<String> {
            nodes
                .iter()
                .find(|h| h.name == format!("hostile-{kind}-1"))
                .expect("kind")
                .pod_cidrs
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            cidrs("copied"),
            ["198.19.128.0/24", "fd00:198:19:1000::/64"]
        );
        assert_eq!(
            cidrs("contained"),
            ["198.19.128.128/25", "fd00:198:19:1000:8000::/65"]
        );
        assert_eq!(
            cidrs("covering"),
            ["198.19.128.0/23", "fd00:198:19:1000::/63"]
        );
        assert_eq!(
            cidrs("pinned"),
            ["198.19.128.5/32", "fd00:198:19:1000::5/128"]
        );
        let overlapping: Vec<&str> = nodes
            .iter()
            .filter(|h| h.overlaps_honest)
            .map(|h| h.name.as_str())
            .collect();
        assert_eq!(overlapping.len(), 4);
        let provider = nodes
            .iter()
            .find(|h| h.name == "hostile-provider-1")
            .expect("provider");
        assert_eq!(provider.provider_id.as_deref(), Some("netcm-e2e://ncm-n1"));
    }

    #[test]
    fn a_hostile_manifest_carries_its_status_and_fills_annotations_to_the_bound() {
        let mut h = Hostile::new("hostile-annotated-1".into());
        h.annotation_bytes = ANNOTATION_BYTES;
        let m = h.manifest(&("198.19.254.13".into(), "fd00:198:19:254::13".into()));
        assert_eq!(
            m["metadata"]["annotations"]["hostile.example/filler"]
                .as_str()
                .map(str::len),
            Some(ANNOTATION_BYTES)
        );
        assert_eq!(m["status"]["addresses"][0]["address"], "198.19.254.13");
        assert_eq!(m["spec"], json!({}));
    }

    #[test]
    fn the_table_has_a_row_per_round() {
        let r = RoundReport {
            hostile_nodes: 9,
            conflicts_evented: 4,
            honest_kept: 3,
            new_honest_allocated: 3,
            new_honest_seconds: 1.25,
            echoes: "sent 750 received 750".into(),
            netcm_cpu_per_second: 0.012,
            seconds: 41.0,
        };
        let t = table(&[r.clone(), r]);
        assert_eq!(t.lines().count(), 3);
        assert!(
            t.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("2 | 9 | 4 | 3 | 3 (1.2)")),
            "{t}"
        );
    }
}

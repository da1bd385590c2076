//! netcm as its users run it: installed by `helm install` from `charts/netcm` on a real node (kubelet,
//! containerd, kube-proxy, kube-scheduler and kube-controller-manager from `hack/node.sh`), its image built
//! here by `hack/image.sh` and used with `imagePullPolicy: Never`. What a user does, in order: install, read
//! the logs, scrape the secure metrics port as Prometheus does, delete the leader, upgrade, uninstall; and
//! the route controller's DaemonSet mode programming routes to peer Nodes in a table of its own.
//!
//! The node's ranges come from `hack/node.sh env` (all in 198.18.0.0/15); the peers' network is a veth pair
//! this test makes on the host and removes. Failover times are printed, not just checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, WatchEvent, WatchParams};
use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::realnode::{curl, netcm_image, real_node, RealNode};
use netcm_e2e::{client_for, wait_for};
use serde_json::Value;

const NS: &str = "kube-system";
const RELEASE: &str = "netcm";
const LEASE: &str = "netcm";
const SA_USER: &str = "system:serviceaccount:kube-system:netcm";
const DEPLOYMENT_PODS: &str =
    "app.kubernetes.io/instance=netcm,app.kubernetes.io/component=controller-manager";
const DAEMONSET_PODS: &str =
    "app.kubernetes.io/instance=netcm,app.kubernetes.io/component=node-routes";
const TIMEOUT: Duration = Duration::from_secs(120);
/// The graceful-release bound of the issue: the standby leads within this after `kubectl delete pod`.
const FAILOVER_BOUND: Duration = Duration::from_secs(3);

/// One test at a time on the node (the release name and the Lease are shared), across test binaries.
async fn lock_node(node: &RealNode) -> std::fs::File {
    let path = std::path::Path::new(node.fact("STATE_DIR")).join("e2e.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    tokio::task::spawn_blocking(move || {
        file.lock().expect("lock the node");
        file
    })
    .await
    .expect("lock task")
}

/// `helm install`'s values for this node: the local image, never pulled, and the node's free ranges.
fn install_values(node: &RealNode) -> Vec<String> {
    let (repository, tag) = netcm_image();
    [
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_string(),
        format!("allocator.clusterCIDR={}", node.fact("FREE_CLUSTER_CIDR")),
        format!(
            "allocator.serviceClusterIPRange={}",
            node.fact("SERVICE_CIDR")
        ),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A release left by an earlier, failed run is removed first, with what it made.
async fn uninstall_leftovers(node: &RealNode, client: &kube::Client) {
    let releases = node.helm(&strings(&["list", "-n", NS, "-q"])).await;
    if releases.lines().any(|r| r.trim() == RELEASE) {
        node.helm(&strings(&["uninstall", RELEASE, "-n", NS, "--wait"]))
            .await;
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    wait_for("no netcm pods", TIMEOUT, || async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let lp = ListParams::default().labels("app.kubernetes.io/instance=netcm");
        pods.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;
}

fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

async fn pods(client: &kube::Client, selector: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items
}

/// Waits until exactly `n` pods of the selector are Ready (and none is terminating).
async fn ready_pods(client: &kube::Client, selector: &str, n: usize) -> Vec<Pod> {
    wait_for(
        &format!("{n} Ready pods of {selector}"),
        TIMEOUT,
        || async {
            let all = pods(client, selector).await;
            (all.len() == n && all.iter().all(ready)).then_some(all)
        },
    )
    .await
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The pod a Lease holder identity (`<pod>_<uuid>`) names.
fn holder_pod(holder: &str) -> &str {
    holder.rsplit_once('_').map_or(holder, |(pod, _)| pod)
}

/// `leader_election_master_status{name="netcm"}` of a pod, from its plain metrics port.
async fn master_status(ip: &str) -> Option<f64> {
    let (code, body) = curl(&format!("http://{ip}:10271/metrics"), None).await;
    if code != 200 {
        return None;
    }
    body.lines().find_map(|l| {
        l.strip_prefix("leader_election_master_status{name=\"netcm\"} ")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Every change of the Lease, as seen by a watch that resumes from the last resourceVersion (so no
/// intermediate state is skipped): (when, holder or "" when released).
#[derive(Clone, Default)]
struct LeaseLog(Arc<Mutex<Vec<(Instant, String)>>>);

impl LeaseLog {
    fn start(client: &kube::Client) -> (LeaseLog, tokio::task::JoinHandle<()>) {
        let log = LeaseLog::default();
        let api: Api<Lease> = Api::namespaced(client.clone(), NS);
        let sink = log.clone();
        let task = tokio::spawn(async move {
            let mut version = "0".to_string();
            loop {
                let wp = WatchParams::default()
                    .fields(&format!("metadata.name={LEASE}"))
                    .timeout(290);
                let Ok(stream) = api.watch(&wp, &version).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    let lease = match event {
                        WatchEvent::Added(l) | WatchEvent::Modified(l) => l,
                        WatchEvent::Deleted(l) => {
                            version = l.metadata.resource_version.clone().unwrap_or(version);
                            sink.push(String::new());
                            continue;
                        }
                        WatchEvent::Bookmark(b) => {
                            version = b.metadata.resource_version;
                            continue;
                        }
                        // Too old a version: start over from the current state.
                        WatchEvent::Error(_) => {
                            version = "0".into();
                            break;
                        }
                    };
                    version = lease.metadata.resource_version.clone().unwrap_or(version);
                    let holder = lease
                        .spec
                        .and_then(|s| s.holder_identity)
                        .unwrap_or_default();
                    sink.push(holder);
                }
            }
        });
        (log, task)
    }

    fn push(&self, holder: String) {
        let mut v = self.0.lock().expect("lease log");
        if v.last().map(|(_, h)| h) != Some(&holder) {
            v.push((Instant::now(), holder));
        }
    }

    fn entries(&self) -> Vec<(Instant, String)> {
        self.0.lock().expect("lease log").clone()
    }

    /// Holder changes from one replica straight to another (no release in between): a second leader
    /// took the Lease while the first still held it.
    fn takeovers(&self) -> Vec<(String, String)> {
        self.entries()
            .windows(2)
            .filter(|w| !w[0].1.is_empty() && !w[1].1.is_empty() && w[0].1 != w[1].1)
            .map(|w| (w[0].1.clone(), w[1].1.clone()))
            .collect()
    }
}

/// Samples every running netcm pod's `leader_election_master_status` until stopped; returns the
/// largest number of pods that said "I lead" in one sample, and that sample.
fn sample_leaders(
    client: &kube::Client,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>, usize)> {
    let client = client.clone();
    tokio::spawn(async move {
        let mut worst = (0, Vec::new());
        let mut samples = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let running: Vec<(String, String)> = pods(&client, DEPLOYMENT_PODS)
                .await
                .iter()
                .filter_map(|p| Some((name(p), pod_ip(p)?)))
                .collect();
            let statuses =
                futures::future::join_all(running.iter().map(|(_, ip)| master_status(ip))).await;
            let leaders: Vec<String> = running
                .iter()
                .zip(statuses)
                .filter(|(_, s)| *s == Some(1.0))
                .map(|((n, _), _)| n.clone())
                .collect();
            samples += 1;
            if leaders.len() > worst.0 {
                worst = (leaders.len(), leaders);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (worst.0, worst.1, samples)
    })
}

/// Where the audit log ends now: entries after it are this test's (the log outlives runs and tests).
fn audit_mark(node: &RealNode) -> u64 {
    std::fs::metadata(&node.audit_log).map_or(0, |m| m.len())
}

/// Audit entries written after `mark`.
fn audit_since(node: &RealNode, mark: u64) -> Vec<Value> {
    let log = std::fs::read(&node.audit_log).unwrap_or_default();
    let from = usize::try_from(mark).unwrap_or(0).min(log.len());
    String::from_utf8_lossy(&log[from..])
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// Writes of the chart's ServiceAccount since `mark` that the API server refused with 403 (the audit
/// log records every write to nodes, leases, events and PodCIDRClaims).
fn refused_writes(node: &RealNode, mark: u64) -> Vec<String> {
    audit_since(node, mark)
        .into_iter()
        .filter(|e| e["user"]["username"] == SA_USER && e["responseStatus"]["code"] == 403)
        .map(|e| {
            format!(
                "{} {}/{} {}",
                e["verb"],
                e["objectRef"]["resource"],
                e["objectRef"]["subresource"],
                e["objectRef"]["name"]
            )
        })
        .collect()
}

/// Node writes the chart's ServiceAccount made since `mark` that succeeded: (verb, subresource-or-"",
/// name).
fn sa_node_writes(node: &RealNode, mark: u64) -> Vec<(String, String, String)> {
    audit_since(node, mark)
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == SA_USER
                && e["objectRef"]["resource"] == "nodes"
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["verb"]),
                s(&e["objectRef"]["subresource"]),
                s(&e["objectRef"]["name"]),
            )
        })
        .collect()
}

/// The pod's log through `kubectl logs` (the API server asks the kubelet), as a user reads it.
async fn kubectl_logs(node: &RealNode, pod: &str) -> String {
    node.kubectl(&["-n", NS, "logs", pod]).await
}

/// The one line of a log that contains all of `parts`; fails naming what was looked for.
fn one_line<'a>(log: &'a str, what: &str, parts: &[&str]) -> &'a str {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .collect();
    assert!(
        !lines.is_empty(),
        "no log line with {what} ({parts:?}) in:\n{log}"
    );
    lines[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_installs_netcm_with_helm_reads_its_logs_scrapes_it_fails_it_over_upgrades_and_uninstalls_it(
) {
    let node = real_node();
    let _lock = lock_node(node).await;
    let client = client_for(&node.kubeconfig).await;
    let node_name = node.fact("NODE_NAME").to_string();
    uninstall_leftovers(node, &client).await;
    // A node reused from an earlier run already has its pod CIDR: give netcm a Node as it first joins.
    let nodes: Api<Node> = Api::all(client.clone());
    let joined = nodes.get(&node_name).await.expect("the real node's Node");
    if joined.spec.and_then(|s| s.pod_cidr).is_some() {
        node.reregister().await;
    }
    let audit_start = audit_mark(node);
    let (lease_log, lease_watch) = LeaseLog::start(&client);

    // 1. helm install: both replicas Ready, exactly one leads.
    let started = Instant::now();
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
    node.helm(&install).await;
    let replicas = ready_pods(&client, DEPLOYMENT_PODS, 2).await;
    eprintln!(
        "[real-node] helm install: 2 replicas Ready after {:?}",
        started.elapsed()
    );
    let holder = wait_for("the Lease to be held", TIMEOUT, || lease_holder(&client)).await;
    let leader = holder_pod(&holder).to_string();
    assert!(
        replicas.iter().any(|p| name(p) == leader),
        "the Lease holder {holder} is none of the replicas"
    );
    let statuses = wait_for(
        "both replicas to report leader_election_master_status",
        TIMEOUT,
        || async {
            let mut s = BTreeMap::new();
            for p in &replicas {
                s.insert(name(p), master_status(&pod_ip(p)?).await?);
            }
            Some(s)
        },
    )
    .await;
    assert_eq!(
        statuses.values().filter(|v| **v == 1.0).count(),
        1,
        "exactly one replica must lead: {statuses:?}"
    );
    assert_eq!(
        statuses[&leader], 1.0,
        "the Lease holder must be the replica that says it leads"
    );

    // 2. The node gets its pod CIDR and its lease annotations from netcm in a pod, as the chart's
    // ServiceAccount.
    let cluster_cidr: ipnet::IpNet = node
        .fact("FREE_CLUSTER_CIDR")
        .parse()
        .expect("cluster CIDR");
    let pod_cidr = wait_for("the node's pod CIDR", TIMEOUT, || async {
        nodes.get(&node_name).await.ok()?.spec?.pod_cidr
    })
    .await;
    let parsed: ipnet::IpNet = pod_cidr.parse().expect("pod CIDR");
    assert!(
        cluster_cidr.contains(&parsed),
        "{pod_cidr} is not from {cluster_cidr}"
    );
    let annotations = wait_for("the node's lease annotations", TIMEOUT, || async {
        let a = nodes.get(&node_name).await.ok()?.metadata.annotations?;
        (a.get("flannel.alpha.coreos.com/public-ip")? == node.fact("NODE_ADDRESS")).then_some(a)
    })
    .await;
    for key in ["backend-type", "kube-subnet-manager", "backend-data"] {
        assert!(
            annotations.contains_key(&format!("flannel.alpha.coreos.com/{key}")),
            "no {key} annotation: {annotations:?}"
        );
    }
    let writes = sa_node_writes(node, audit_start);
    assert!(
        writes
            .iter()
            .any(|(verb, sub, n)| verb == "patch" && sub.is_empty() && *n == node_name),
        "the audit log shows no PATCH of {node_name} by {SA_USER}: {writes:?}"
    );

    // 3. kubectl logs of the leader: the effective configuration, the leadership and the allocation,
    // one readable line each.
    let log = wait_for("the allocation in the leader's log", TIMEOUT, || async {
        let log = kubectl_logs(node, &leader).await;
        log.contains("assigned pod CIDRs").then_some(log)
    })
    .await;
    eprintln!(
        "[real-node] kubectl get pods -o wide:\n{}",
        node.kubectl(&["-n", NS, "get", "pods", "-o", "wide"]).await
    );
    eprintln!(
        "[real-node] kubectl logs {leader} | head -20:\n{}",
        log.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    assert!(
        !log.contains('\u{1b}'),
        "terminal escape codes in kubectl logs:\n{log}"
    );
    for line in log.lines() {
        assert!(
            line.len() > 30
                && line.as_bytes()[..4].iter().all(u8::is_ascii_digit)
                && line.contains("Z "),
            "not a readable log line (timestamp, level, message): {line:?}"
        );
    }
    let cluster_cidr_text = node.fact("FREE_CLUSTER_CIDR");
    one_line(
        &log,
        "the effective configuration",
        &[
            "INFO",
            "effective configuration",
            "controllers=subnet-allocator,node-annotation-syncer",
        ],
    );
    one_line(
        &log,
        "the cluster CIDR",
        &[
            "effective configuration",
            "--cluster-cidr",
            cluster_cidr_text,
        ],
    );
    let leadership = one_line(
        &log,
        "the leadership",
        &["INFO", "successfully acquired lease", &holder],
    );
    let allocation = one_line(
        &log,
        "the allocation",
        &["INFO", "assigned pod CIDRs", &node_name, &pod_cidr],
    );
    eprintln!(
        "[real-node] the leader's leadership and allocation lines:\n{leadership}\n{allocation}"
    );

    // 4. A scrape of the secure metrics port as Prometheus does it in-cluster: a ServiceAccount token bound
    // to the chart's metrics-reader ClusterRole; without a token, 401.
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: netcm-e2e-monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: netcm-e2e-monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: netcm-e2e-prometheus-metrics}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: netcm-metrics-reader}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: netcm-e2e-monitoring}]
"#,
    )
    .await;
    let token = node
        .kubectl(&[
            "-n",
            "netcm-e2e-monitoring",
            "create",
            "token",
            "prometheus",
        ])
        .await
        .trim()
        .to_string();
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let svc = services
        .get("netcm-metrics")
        .await
        .expect("the chart's metrics Service");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
    // Prometheus's service discovery: every endpoint of the Service, port https-metrics.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let endpoints = wait_for("2 ready endpoints of netcm-metrics", TIMEOUT, || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=netcm-metrics"))
            .await
            .ok()?;
        let mut targets = Vec::new();
        for s in list.items {
            let port = s
                .ports
                .as_ref()?
                .iter()
                .find(|p| p.name.as_deref() == Some("https-metrics"))?
                .port?;
            for e in s.endpoints {
                if e.conditions.as_ref().and_then(|c| c.ready) == Some(true) {
                    targets.push(format!("{}:{port}", e.addresses[0]));
                }
            }
        }
        (targets.len() == 2).then_some(targets)
    })
    .await;
    for target in endpoints
        .iter()
        .chain(std::iter::once(&format!("{cluster_ip}:10270")))
    {
        let url = format!("https://{target}/metrics");
        let (code, body) = curl(&url, Some(&token)).await;
        assert_eq!(code, 200, "{url} with the metrics-reader token: {body}");
        assert!(
            body.contains("leader_election_master_status"),
            "{url} returned no netcm metrics:\n{body}"
        );
        let (code, body) = curl(&url, None).await;
        assert_eq!(code, 401, "{url} without a token: {body}");
    }
    eprintln!("[real-node] scraped {endpoints:?} and the Service {cluster_ip}:10270 with a metrics-reader token; 401 without");

    // 5. kubectl delete pod <leader>: another replica leads within the bound (graceful release), and the
    // replica that does not lead stands by. Which one leads is a race netcm does not decide: the
    // Deployment starts the replacement pod at once, and when it is up before the old leader's release
    // (seen on a loaded machine: it took the Lease 7 ms after the release), it wins as often as the
    // standby does. Printed, so a run shows which.
    let standby = replicas
        .iter()
        .map(name)
        .find(|n| *n != leader)
        .expect("a standby");
    let deleted = Instant::now();
    node.kubectl(&["-n", NS, "delete", "pod", &leader, "--wait=false"])
        .await;
    let new_holder = wait_for("another replica to take the Lease", TIMEOUT, || async {
        lease_log
            .entries()
            .iter()
            .find(|(t, h)| *t >= deleted && !h.is_empty() && holder_pod(h) != leader)
            .map(|(t, h)| (*t, h.clone()))
    })
    .await;
    let failover = new_holder.0 - deleted;
    let new_leader = holder_pod(&new_holder.1).to_string();
    let which = if new_leader == standby {
        "the standby"
    } else {
        "the replacement pod"
    };
    eprintln!(
        "[real-node] failover: {new_leader} ({which}) leads {failover:?} after `kubectl delete pod {leader}`"
    );
    assert!(
        failover <= FAILOVER_BOUND,
        "another replica took {failover:?} to lead (bound {FAILOVER_BOUND:?}); Lease changes: {:?}",
        lease_log
            .entries()
            .iter()
            .map(|(t, h)| (t.duration_since(deleted), h.clone()))
            .collect::<Vec<_>>()
    );
    let after = ready_pods(&client, DEPLOYMENT_PODS, 2).await;
    let names: Vec<String> = after.iter().map(name).collect();
    assert!(
        names.contains(&new_leader) && !names.contains(&leader),
        "pods after the failover: {names:?}"
    );
    let other = names
        .iter()
        .find(|n| **n != new_leader)
        .expect("a pod that does not lead")
        .clone();
    let other_log = wait_for(
        "the pod that does not lead to stand by",
        TIMEOUT,
        || async {
            let log = kubectl_logs(node, &other).await;
            log.contains("standing by").then_some(log)
        },
    )
    .await;
    let other_ip = after
        .iter()
        .find(|p| name(p) == other)
        .and_then(pod_ip)
        .expect("pod IP");
    assert_eq!(
        master_status(&other_ip).await,
        Some(0.0),
        "{other} says it leads:\n{other_log}"
    );
    assert!(
        !other_log.contains("successfully acquired lease"),
        "{other} led at some point:\n{other_log}"
    );
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some(new_holder.1.as_str()),
        "the Lease changed hands again"
    );

    // 6. helm upgrade with a changed value (JSON logs): the pods roll, no second leader at any moment (the
    // Lease and every pod's own gauge, watched throughout), no write refused for want of RBAC.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_leaders(&client, stop.clone());
    let before: Vec<String> = after.iter().map(name).collect();
    let mut upgrade = strings(&[
        "upgrade",
        RELEASE,
        "charts/netcm",
        "-n",
        NS,
        "--reuse-values",
        "--set",
        "logging.format=json",
        "--wait",
        "--timeout",
        "180s",
    ]);
    upgrade.extend(install_values(node));
    let upgraded = Instant::now();
    node.helm(&upgrade).await;
    node.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/netcm",
        "--timeout=120s",
    ])
    .await;
    let rolled = ready_pods(&client, DEPLOYMENT_PODS, 2).await;
    let holder_after = wait_for("the Lease to be held after the upgrade", TIMEOUT, || {
        lease_holder(&client)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (most_leaders, at_once, samples) = sampler.await.expect("sampler");
    eprintln!(
        "[real-node] helm upgrade rolled {before:?} -> {:?} in {:?}; Lease: {:?}; {samples} samples of every pod's gauge, at most {most_leaders} leader(s) at once",
        rolled.iter().map(name).collect::<Vec<_>>(),
        upgraded.elapsed(),
        lease_log.entries().iter().map(|(_, h)| holder_pod(h).to_string()).collect::<Vec<_>>()
    );
    assert!(
        rolled.iter().all(|p| !before.contains(&name(p))),
        "the upgrade did not replace the pods"
    );
    assert!(most_leaders <= 1, "two replicas led at once: {at_once:?}");
    assert!(
        lease_log.takeovers().is_empty(),
        "the Lease went from one leader to another without a release: {:?}",
        lease_log.takeovers()
    );
    let refused = refused_writes(node, audit_start);
    assert!(refused.is_empty(), "writes refused with 403: {refused:?}");
    let json_leader = holder_pod(&holder_after).to_string();
    let json_log = wait_for(
        "the new leader's allocation or sync in JSON",
        TIMEOUT,
        || async {
            let log = kubectl_logs(node, &json_leader).await;
            log.contains("successfully acquired lease").then_some(log)
        },
    )
    .await;
    for line in json_log.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line:?}"));
        assert!(v.is_object(), "not a JSON object: {line:?}");
    }
    for p in &rolled {
        let log = kubectl_logs(node, &name(p)).await;
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "{} logged a refusal:\n{log}",
            name(p)
        );
    }

    // 8. helm uninstall removes everything the chart created.
    let manifest = node
        .helm(&strings(&["get", "manifest", RELEASE, "-n", NS]))
        .await;
    let created = node
        .kubectl_stdin(&["get", "-f", "-", "-o", "name"], &manifest)
        .await;
    assert!(
        created.lines().count() >= 9,
        "the release made fewer objects than the chart renders:\n{created}"
    );
    node.helm(&strings(&["uninstall", RELEASE, "-n", NS, "--wait"]))
        .await;
    let left = node
        .kubectl_stdin(
            &["get", "-f", "-", "-o", "name", "--ignore-not-found"],
            &manifest,
        )
        .await;
    assert!(left.trim().is_empty(), "left after helm uninstall:\n{left}");
    wait_for("the release's pods to be gone", TIMEOUT, || async {
        pods(&client, "app.kubernetes.io/instance=netcm")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    eprintln!(
        "[real-node] helm uninstall removed {} objects:\n{created}",
        created.lines().count()
    );
    node.kubectl(&[
        "delete",
        "namespace",
        "netcm-e2e-monitoring",
        "--wait=false",
    ])
    .await;
    node.kubectl(&[
        "delete",
        "clusterrolebinding",
        "netcm-e2e-prometheus-metrics",
    ])
    .await;
    lease_watch.abort();
}

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

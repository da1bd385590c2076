//! What the chart tests share: the cluster and netcm's image in it, pods, the leader by its gauge, the
//! Lease and its log, the audit log, `kubectl logs`.

use super::*;

/// A new cluster of `nodes` real nodes (`hack/cluster.sh`), none with a pod CIDR yet, with netcm's image
/// (`hack/image.sh build`, or `NETCM_E2E_IMAGE` from `hack/test.sh`) imported into every node.
pub(super) async fn fresh_cluster(nodes: usize) -> (Cluster, kube::Client, String) {
    let cluster = Cluster::fresh(nodes);
    let (image, tar) = built_image("build");
    cluster.load(&tar, &image);
    let client = client_for(&cluster.kubeconfig).await;
    (cluster, client, image)
}

/// The cluster's IPv4 cluster CIDR (its first).
pub(super) fn cluster_cidr_v4(cluster: &Cluster) -> ipnet::IpNet {
    cluster
        .fact("CLUSTER_CIDR")
        .split(',')
        .next()
        .and_then(|c| c.parse().ok())
        .expect("CLUSTER_CIDR")
}

/// `helm test --logs`: helm fails unless the test pod (`netcm check`) exits 0; every check must be ✓ (or
/// not applicable), none ✗. The Completed pod is deleted afterwards.
pub(super) async fn helm_test(cluster: &Cluster, client: &kube::Client) {
    let tested = cluster
        .helm(&["test", RELEASE, "-n", NS, "--logs", "--timeout", "120s"])
        .await;
    eprintln!("[real-node] helm test:\n{tested}");
    assert!(
        tested.contains("Succeeded") && tested.contains('✓') && !tested.contains('✗'),
        "{tested}"
    );
    delete_test_pods(client).await;
}

/// Deletes the `helm test` pod: like the test pods of `helm create`'s scaffold, it stays Completed for
/// inspection until the next `helm test` replaces it, and `helm uninstall` leaves hooks alone.
pub(super) async fn delete_test_pods(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=test");
    let _ = pods.delete_collection(&DeleteParams::default(), &lp).await;
    wait_for("the helm test pod to be gone", TIMEOUT, || async {
        pods.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;
}

pub(super) fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(super) fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

pub(super) fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

pub(super) async fn pods(client: &kube::Client, selector: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items
}

/// Waits until exactly `n` pods of the selector are Ready (and none is terminating).
pub(super) async fn ready_pods(client: &kube::Client, selector: &str, n: usize) -> Vec<Pod> {
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

pub(super) async fn lease_holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The one pod of `pods` whose gauge says it leads, once exactly one does: the Lease's holder identity
/// (`<hostname>_<uuid>`) cannot name it, since hostNetwork pods have their node's hostname, and every node
/// of this one-machine cluster has the machine's.
pub(super) async fn leading_pod(client: &kube::Client, but_not: Option<&str>) -> Pod {
    wait_for(
        "exactly one netcm pod that reports leading",
        TIMEOUT,
        || async {
            let running: Vec<Pod> = pods(client, DEPLOYMENT_PODS)
                .await
                .into_iter()
                .filter(|p| ready(p) && Some(name(p).as_str()) != but_not)
                .collect();
            let mut leaders = Vec::new();
            for p in running {
                if master_status(&pod_ip(&p)?).await == Some(1.0) {
                    leaders.push(p);
                }
            }
            (leaders.len() == 1).then(|| leaders.remove(0))
        },
    )
    .await
}

/// Every change of the Lease, as seen by a watch that resumes from the last resourceVersion (so no
/// intermediate state is skipped): (when, holder or "" when released).
#[derive(Clone, Default)]
pub(super) struct LeaseLog(Arc<Mutex<Vec<(Instant, String)>>>);

impl LeaseLog {
    pub(super) fn start(client: &kube::Client) -> (LeaseLog, tokio::task::JoinHandle<()>) {
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

    pub(super) fn push(&self, holder: String) {
        let mut v = self.0.lock().expect("lease log");
        if v.last().map(|(_, h)| h) != Some(&holder) {
            v.push((Instant::now(), holder));
        }
    }

    pub(super) fn entries(&self) -> Vec<(Instant, String)> {
        self.0.lock().expect("lease log").clone()
    }

    /// Holder changes from one replica straight to another (no release in between): a second leader
    /// took the Lease while the first still held it.
    pub(super) fn takeovers(&self) -> Vec<(String, String)> {
        self.entries()
            .windows(2)
            .filter(|w| !w[0].1.is_empty() && !w[1].1.is_empty() && w[0].1 != w[1].1)
            .map(|w| (w[0].1.clone(), w[1].1.clone()))
            .collect()
    }
}

/// Samples every running netcm process's `leader_election_master_status` until stopped; returns the
/// largest number of processes that said "I lead" in one sample, and their pods.
///
/// On the host network the metrics port belongs to the node, not the pod: a terminating pod and its
/// replacement on one node share an address, and whichever process holds the port answers for both.
/// So each address is asked once and counts once; two leaders can only be on two addresses.
pub(super) fn sample_leaders(
    client: &kube::Client,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>, usize)> {
    let client = client.clone();
    tokio::spawn(async move {
        let mut worst = (0, Vec::new());
        let mut samples = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut pods_at: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for p in pods(&client, DEPLOYMENT_PODS).await {
                if let Some(ip) = pod_ip(&p) {
                    pods_at.entry(ip).or_default().push(name(&p));
                }
            }
            let statuses =
                futures::future::join_all(pods_at.keys().map(|ip| master_status(ip))).await;
            let leaders: Vec<String> = pods_at
                .into_iter()
                .zip(statuses)
                .filter(|(_, s)| *s == Some(1.0))
                .map(|((ip, names), _)| format!("{ip} ({})", names.join(" or ")))
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
pub(super) fn audit_mark(cluster: &Cluster) -> u64 {
    std::fs::metadata(cluster.audit_log()).map_or(0, |m| m.len())
}

/// Audit entries written after `mark`.
pub(super) fn audit_since(cluster: &Cluster, mark: u64) -> Vec<Value> {
    let log = std::fs::read(cluster.audit_log()).unwrap_or_default();
    let from = usize::try_from(mark).unwrap_or(0).min(log.len());
    String::from_utf8_lossy(&log[from..])
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// Writes of the chart's ServiceAccount since `mark` that the API server refused with 403 (the audit
/// log records every write to nodes, leases, events and PodCIDRClaims).
pub(super) fn refused_writes(cluster: &Cluster, mark: u64) -> Vec<String> {
    audit_since(cluster, mark)
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
pub(super) fn sa_node_writes(cluster: &Cluster, mark: u64) -> Vec<(String, String, String)> {
    audit_since(cluster, mark)
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
pub(super) async fn kubectl_logs(cluster: &Cluster, pod: &str) -> String {
    cluster.kubectl(&["-n", NS, "logs", pod]).await
}

/// The one line of a log that contains all of `parts`; fails naming what was looked for.
pub(super) fn one_line<'a>(log: &'a str, what: &str, parts: &[&str]) -> &'a str {
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

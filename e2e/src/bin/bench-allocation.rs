//! Allocation benchmark on the real control plane (run through `hack/bench-allocation.sh`).
//!
//! For each contender, N Nodes with a realistic status (~8 KB of JSON each) exist without pod CIDRs (a
//! backlog), then the allocator starts; the figure is the time from its process start until the last Node
//! has a CIDR, watched through one Node watch. Contenders, each on a fresh Node set: netcm at its
//! defaults; kube-controller-manager's nodeipam at netcm's QPS and at its own default QPS; and the API
//! server's ceiling: 16 concurrent clients PATCHing podCIDR with no controller. Prints a markdown table.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use netcm_e2e::netcm::netcm_binary;
use netcm_e2e::{audit, control_plane, tool, wait_for, LEASE_NAMESPACE};
use serde_json::json;

const CLUSTER_CIDR: &str = "10.64.0.0/10";
const CREATORS: usize = 16;
/// How long a controller is watched doing nothing after its last allocation.
const IDLE_WINDOW: Duration = Duration::from_secs(20);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A Node status of realistic size: conditions, addresses, capacity, nodeInfo and images.
fn realistic_status(i: usize) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let cond = |t: &str, s: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": msg,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let images: Vec<_> = (0..12)
        .map(|k| {
            json!({"names": [
                format!("registry.example.com/team-{k}/service-{k}@sha256:{:064x}", k * 7919 + i),
                format!("registry.example.com/team-{k}/service-{k}:v1.{k}.{i}")
            ], "sizeBytes": 100_000_000 + k * 1_000_003})
        })
        .collect();
    json!({
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": format!("198.51.{}.{}", (i / 250) % 250, i % 250 + 1)},
            {"type": "Hostname", "address": format!("bench-host-{i}.example.com")}
        ],
        "capacity": {"cpu": "16", "memory": "65843856Ki", "pods": "110", "ephemeral-storage": "203056560Ki",
                     "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
        "allocatable": {"cpu": "15800m", "memory": "63644816Ki", "pods": "110",
                        "ephemeral-storage": "187136900936", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{:032x}", i * 104_729), "systemUUID": format!("ec2{:029x}", i),
                     "bootID": format!("{:08x}-0000-4000-8000-{:012x}", i, i), "kernelVersion": "6.1.0-28-cloud-amd64",
                     "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                     "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "amd64"},
        "images": images,
    })
}

async fn create_backlog(client: &kube::Client, prefix: &str, n: usize) {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i:05}");
            async move {
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {
                        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                        "node.kubernetes.io/instance-type": "m5.4xlarge", "topology.kubernetes.io/zone": "zone-a"}},
                }))
                .unwrap();
                api.create(&PostParams::default(), &node).await.unwrap();
                let status = json!({"status": realistic_status(i)});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(CREATORS)
        .collect::<Vec<_>>()
        .await;
}

async fn delete_all_nodes(client: &kube::Client) {
    let api: Api<Node> = Api::all(client.clone());
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_for("nodes to be deleted", Duration::from_secs(120), || async {
        let left = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let _ = leases
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    // The killed contender's claims name Nodes that are gone; the next one would spend its time
    // proving that and deleting them.
    let _ = netcm_e2e::pod_cidr_claims(client)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}

/// Watches Nodes with `prefix` until all `n` have a pod CIDR; returns when.
fn spawn_completion_watch(
    client: &kube::Client,
    prefix: &str,
    n: usize,
) -> tokio::task::JoinHandle<Instant> {
    let api: Api<Node> = Api::all(client.clone());
    let prefix = prefix.to_string();
    tokio::spawn(async move {
        let mut done: HashSet<String> = HashSet::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            let nodes = match ev {
                Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n)) => vec![n],
                _ => continue,
            };
            for node in nodes {
                let name = node.metadata.name.clone().unwrap_or_default();
                let has = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.pod_cidr.as_ref())
                    .is_some_and(|c| !c.is_empty());
                if has && name.starts_with(&prefix) {
                    done.insert(name);
                }
            }
            if done.len() >= n {
                return Instant::now();
            }
        }
        Instant::now()
    })
}

struct ProcStats {
    peak_rss_mib: f64,
    cpu_seconds: f64,
}

fn proc_stats(pid: u32) -> ProcStats {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    ProcStats {
        peak_rss_mib: hwm_kb / 1024.0,
        cpu_seconds: ticks / 100.0,
    }
}

struct Row {
    contender: String,
    idle_cpu_pct: Option<f64>,
    seconds: f64,
    writes_per_node: Option<f64>,
    claims_per_node: Option<f64>,
    stats: Option<ProcStats>,
}

/// The contender's Node PATCHes and PodCIDRClaim creates since `since`, from the audit log.
fn count_writes(
    audit_log: &std::path::Path,
    ua_contains: &str,
    since: jiff::Timestamp,
) -> (usize, usize) {
    let events = audit::read(audit_log);
    let mine = events
        .iter()
        .filter(|e| e.user_agent.contains(ua_contains))
        .filter(|e| e.received().is_some_and(|t| t >= since));
    let (mut patches, mut claims) = (0, 0);
    for e in mine {
        match (e.verb.as_str(), e.resource().as_str()) {
            ("patch", "nodes") => patches += 1,
            ("create", "podcidrclaims") => claims += 1,
            _ => {}
        }
    }
    (patches, claims)
}

async fn run_controller(
    client: &kube::Client,
    label: &str,
    n: usize,
    mut cmd: Command,
    ua: &str,
) -> Row {
    let slug: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join("-");
    let prefix = format!(
        "bench-{slug}-{}",
        jiff::Timestamp::now().as_second() % 100_000
    );
    create_backlog(client, &prefix, n).await;
    let watch = spawn_completion_watch(client, &prefix, n);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let since = jiff::Timestamp::now();
    let log = std::fs::File::create(format!("/tmp/{prefix}.log")).unwrap();
    let start = Instant::now();
    let mut child: Child = cmd
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(1800), watch)
        .await
        .expect("allocation within 30 min")
        .unwrap();
    let stats = proc_stats(child.id());
    // Idle cost: every Node allocated, nothing to do; the cache of N Nodes stays watched.
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_cpu_pct = (proc_stats(child.id()).cpu_seconds - stats.cpu_seconds)
        / IDLE_WINDOW.as_secs_f64()
        * 100.0;
    let _ = child.kill();
    let _ = child.wait();
    let seconds = finished.duration_since(start).as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (patches, claims) = count_writes(&control_plane().audit_log, ua, since);
    delete_all_nodes(client).await;
    eprintln!(
        "{label}: {seconds:.1} s, {patches} node PATCHes, {claims} claims, peak RSS {:.1} MiB, CPU {:.1} s",
        stats.peak_rss_mib, stats.cpu_seconds
    );
    Row {
        contender: label.to_string(),
        idle_cpu_pct: Some(idle_cpu_pct),
        seconds,
        writes_per_node: Some(patches as f64 / n as f64),
        claims_per_node: Some(claims as f64 / n as f64),
        stats: Some(stats),
    }
}

async fn api_ceiling(client: &kube::Client, n: usize) -> Row {
    let prefix = "bench-ceiling";
    create_backlog(client, prefix, n).await;
    let api: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cidr = format!("10.{}.{}.0/24", 64 + i / 256, i % 256);
                let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                api.patch(
                    &format!("{prefix}-{i:05}"),
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
                .unwrap();
            }
        })
        .buffer_unordered(CREATORS)
        .collect::<Vec<_>>()
        .await;
    let seconds = start.elapsed().as_secs_f64();
    delete_all_nodes(client).await;
    eprintln!("ceiling: {seconds:.1} s");
    Row {
        contender: "API ceiling (16 concurrent PATCHes, no controller)".to_string(),
        idle_cpu_pct: None,
        seconds,
        writes_per_node: Some(1.0),
        claims_per_node: None,
        stats: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// Steady state: with netcm running, Nodes arrive one at a time; how long from the create's response to
/// the Node's pod CIDR, against the round trip of one PATCH of a Node (same client, same moment).
async fn latency(client: &kube::Client, netcm: Command, n: usize) {
    let api: Api<Node> = Api::all(client.clone());
    let seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> =
        Default::default();
    let recorder = seen.clone();
    let watch_api = api.clone();
    let watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(watch_api, watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(node)) = ev {
                let has = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.pod_cidr.as_ref())
                    .is_some();
                if has {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    recorder
                        .lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        }
    });
    let mut netcm = netcm;
    let log = std::fs::File::create("/tmp/bench-latency.log").unwrap();
    let mut child = netcm
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for("netcm to lead", Duration::from_secs(30), || async {
        std::fs::read_to_string("/tmp/bench-latency.log")
            .unwrap_or_default()
            .contains("started controller")
            .then_some(())
    })
    .await;
    let mut created = Vec::new();
    for i in 0..n {
        let name = format!("bench-latency-{i:04}");
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        api.create(&PostParams::default(), &node).await.unwrap();
        created.push((name, Instant::now()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rtts = Vec::new();
    for (name, _) in &created {
        let patch = json!({"metadata": {"annotations": {"bench.netcm.io/ping": "1"}}});
        let t0 = Instant::now();
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        rtts.push(t0.elapsed());
    }
    wait_for(
        "every latency node to be allocated",
        Duration::from_secs(60),
        || async { (seen.lock().unwrap().len() >= n).then_some(()) },
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    let mut lat: Vec<Duration> = created
        .iter()
        .filter_map(|(name, t0)| seen.get(name).map(|t| t.saturating_duration_since(*t0)))
        .collect();
    lat.sort();
    rtts.sort();
    let (p50, p99, rtt50) = (
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&rtts, 0.5),
    );
    println!(
        "\nNode created → pod CIDR set, {n} Nodes arriving one at a time: p50 {:.1} ms, p99 {:.1} ms; \
         one PATCH round trip p50 {:.1} ms; p99 / PATCH = {:.2}×",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        rtt50.as_secs_f64() * 1e3,
        p99.as_secs_f64() / rtt50.as_secs_f64().max(1e-9)
    );
    delete_all_nodes(client).await;
}

fn kcm_command(kubeconfig: &Path, qps: u32, burst: u32) -> Command {
    let mut cmd = Command::new(tool("kube-controller-manager"));
    cmd.args([
        &format!("--kubeconfig={}", kubeconfig.display()),
        "--controllers=nodeipam",
        "--allocate-node-cidrs=true",
        &format!("--cluster-cidr={CLUSTER_CIDR}"),
        "--node-cidr-mask-size=24",
        "--leader-elect=false",
        "--secure-port=0",
        "--use-service-account-credentials=false",
        &format!("--kube-api-qps={qps}"),
        &format!("--kube-api-burst={burst}"),
    ]);
    cmd
}

#[tokio::main]
async fn main() {
    let n = env_usize("NODES", 5000);
    let skip_kcm_default = std::env::var("SKIP_KCM_DEFAULT").is_ok_and(|v| v == "1");
    // ONLY_NETCM=1: the ceiling and netcm only, for quick iterations on netcm itself.
    let only_netcm = std::env::var("ONLY_NETCM").is_ok_and(|v| v == "1");
    // Holds the e2e cluster lock for the whole run, so no test shares the API server with the benchmark.
    let env = netcm_e2e::TestEnv::new().await;
    let cp = control_plane();
    let client = env.client.clone();
    let mut rows = Vec::new();
    rows.push(api_ceiling(&client, n).await);
    let netcm = |extra: &[&str]| {
        let mut cmd = Command::new(netcm_binary());
        cmd.args([
            &format!("--kubeconfig={}", cp.kubeconfig.display()),
            "--controllers=subnet-allocator",
            &format!("--cluster-cidr={CLUSTER_CIDR}"),
            &format!("--leader-elect-resource-namespace={LEASE_NAMESPACE}"),
            "--port=0",
        ]);
        cmd.args(extra);
        cmd
    };
    rows.push(
        run_controller(
            &client,
            "netcm (defaults: qps 500, burst 1000)",
            n,
            netcm(&[]),
            "netcm/",
        )
        .await,
    );
    // The same with the client-side limit out of the way: what the allocator itself can do.
    // What the PodCIDRClaims cost: the same without them.
    rows.push(
        run_controller(
            &client,
            "netcm (defaults, --pod-cidr-claims=false)",
            n,
            netcm(&["--pod-cidr-claims=false"]),
            "netcm/",
        )
        .await,
    );
    rows.push(
        run_controller(
            &client,
            "netcm (qps 5000, burst 5000)",
            n,
            netcm(&["--kube-api-qps=5000", "--kube-api-burst=5000"]),
            "netcm/",
        )
        .await,
    );
    if only_netcm {
        print_table(n, &rows);
        latency(&client, netcm(&[]), 200).await;
        return;
    }
    rows.push(
        run_controller(
            &client,
            "kube-controller-manager nodeipam (qps 500, burst 1000)",
            n,
            kcm_command(&cp.kubeconfig, 500, 1000),
            "kube-controller-manager",
        )
        .await,
    );
    if !skip_kcm_default {
        rows.push(
            run_controller(
                &client,
                "kube-controller-manager nodeipam (defaults: qps 20, burst 30)",
                n,
                kcm_command(&cp.kubeconfig, 20, 30),
                "kube-controller-manager",
            )
            .await,
        );
    }
    print_table(n, &rows);
    latency(&client, netcm(&[]), 200).await;
}

fn print_table(n: usize, rows: &[Row]) {
    let ceiling = rows[0].seconds;
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(0);
    println!("\nAllocation of a {n}-Node backlog (Nodes ~8 KB each), real kube-apiserver, {cores} cores\n");
    println!("| contender | time to allocate all | Nodes/s | × ceiling | node PATCHes per Node | claims per Node | peak RSS MiB | CPU s | idle CPU % |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let (rss, cpu) = r
            .stats
            .as_ref()
            .map(|s| {
                (
                    format!("{:.1}", s.peak_rss_mib),
                    format!("{:.1}", s.cpu_seconds),
                )
            })
            .unwrap_or(("–".into(), "–".into()));
        println!(
            "| {} | {:.1} s | {:.0} | {:.2} | {} | {} | {} | {} | {} |",
            r.contender,
            r.seconds,
            n as f64 / r.seconds,
            r.seconds / ceiling,
            r.writes_per_node
                .map(|w| format!("{w:.2}"))
                .unwrap_or_default(),
            r.claims_per_node
                .map(|w| format!("{w:.2}"))
                .unwrap_or_else(|| "–".into()),
            rss,
            cpu,
            r.idle_cpu_pct
                .map(|p| format!("{p:.2}"))
                .unwrap_or_else(|| "–".into())
        );
    }
    let find = |needle: &str| rows.iter().find(|r| r.contender.contains(needle));
    if let (Some(netcm), Some(kcm)) = (
        find("netcm (defaults"),
        find("kube-controller-manager nodeipam (qps 500"),
    ) {
        println!(
            "\nnetcm / KCM at equal QPS: time {:.2}×",
            netcm.seconds / kcm.seconds
        );
        if let (Some(a), Some(b)) = (&netcm.stats, &kcm.stats) {
            println!(
                "netcm / KCM: peak RSS {:.2}×, CPU {:.2}×",
                a.peak_rss_mib / b.peak_rss_mib,
                a.cpu_seconds / b.cpu_seconds
            );
        }
    }
    if let (Some(netcm), Some(kcm)) = (
        find("netcm (defaults"),
        find("kube-controller-manager nodeipam (defaults"),
    ) {
        println!(
            "KCM at its defaults / netcm at its defaults: {:.1}× slower",
            kcm.seconds / netcm.seconds
        );
    }
}

//! Pools benchmark on the real control plane (run through `hack/bench.sh pools`): what ClusterCIDR pools
//! cost the allocator. N Nodes exist without pod CIDRs (a backlog), spread over ten label values; then
//! netcm starts, and the figure is the time from its process start until the last Node has a CIDR,
//! watched through one Node watch. Two modes on the same Node set, alternated `REPEATS` times:
//!
//! - **1 pool**: the flag pool (`--cluster-cidr`) serves every Node;
//! - **10 pools**: ten ClusterCIDRs, each selecting one label value, serve them (the flag pool is set,
//!   but selects no Node before them); afterwards every Node's CIDR is checked to be in its own pool.
//!
//! Prints a markdown table; the comparison is the ratio of the medians.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use netcm_e2e::{cluster_cidrs, control_plane, Netcm, TestEnv};
use serde_json::json;

const POOLS: usize = 10;
const LABEL: &str = "bench.netcm.io/pool";
/// The flag pool; in 10-pool mode a range beside the objects', so nothing overlaps.
const FLAG_POOL: &str = "10.64.0.0/10";
const OBJECT_POOLS_FLAG_POOL: &str = "10.128.0.0/10";
const CREATORS: usize = 16;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Pool `k`'s range: a /14 (1,024 node /24s) in 10.64.0.0/10.
fn pool_range(k: usize) -> IpNet {
    format!("10.{}.0.0/14", 64 + 4 * k).parse().unwrap()
}

/// A Node status of moderate size (conditions and addresses), so the cache holds something real.
fn status(i: usize) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let cond = |t: &str, s: &str| {
        json!({"type": t, "status": s, "reason": "Bench", "message": "bench",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "conditions": [cond("MemoryPressure", "False"), cond("DiskPressure", "False"), cond("Ready", "True")],
        "addresses": [
            {"type": "InternalIP", "address": format!("198.51.{}.{}", (i / 250) % 250, i % 250 + 1)},
            {"type": "Hostname", "address": format!("bench-host-{i}.example.com")}
        ],
    })
}

async fn create_backlog(client: &kube::Client, n: usize) {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let name = format!("bench-pools-{i:05}");
            async move {
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {
                        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                        LABEL: format!("p{}", i % POOLS)}},
                }))
                .unwrap();
                api.create(&PostParams::default(), &node).await.unwrap();
                let status = json!({"status": status(i)});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(CREATORS)
        .collect::<Vec<_>>()
        .await;
}

async fn create_pools(client: &kube::Client) {
    let api = cluster_cidrs(client);
    for k in 0..POOLS {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
            "metadata": {"name": format!("bench-p{k}")},
            "spec": {
                "perNodeHostBits": 8,
                "ipv4": pool_range(k).to_string(),
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": LABEL, "operator": "In", "values": [format!("p{k}")]}]}]},
            },
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
}

/// Watches the Nodes until all `n` have a pod CIDR; returns when.
fn spawn_completion_watch(client: &kube::Client, n: usize) -> tokio::task::JoinHandle<Instant> {
    let api: Api<Node> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut done: HashSet<String> = HashSet::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            let node = match ev {
                Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n)) => n,
                _ => continue,
            };
            if node
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidr.as_ref())
                .is_some_and(|c| !c.is_empty())
            {
                done.insert(node.metadata.name.clone().unwrap_or_default());
            }
            if done.len() >= n {
                return Instant::now();
            }
        }
        Instant::now()
    })
}

/// Nodes whose CIDR is not inside the pool their label names.
async fn misplaced(client: &kube::Client) -> usize {
    let api: Api<Node> = Api::all(client.clone());
    let nodes = api.list(&ListParams::default()).await.unwrap();
    nodes
        .items
        .iter()
        .filter(|node| {
            let pool = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .and_then(|v| v.strip_prefix('p')?.parse::<usize>().ok());
            let cidr = node
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidr.as_ref())
                .and_then(|c| c.parse::<IpNet>().ok());
            match (pool, cidr) {
                (Some(k), Some(c)) => !pool_range(k).contains(&c),
                _ => true,
            }
        })
        .count()
}

/// One run: a fresh backlog (and the pools), netcm started, the time until every Node has a CIDR.
async fn run(env: &TestEnv, n: usize, pools: bool) -> (f64, usize) {
    env.clean().await;
    let client = &env.client;
    if pools {
        create_pools(client).await;
    }
    create_backlog(client, n).await;
    let watch = spawn_completion_watch(client, n);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flag_pool = format!(
        "--cluster-cidr={}",
        if pools {
            OBJECT_POOLS_FLAG_POOL
        } else {
            FLAG_POOL
        }
    );
    let start = Instant::now();
    let netcm = Netcm::start(
        if pools {
            "bench-10-pools"
        } else {
            "bench-1-pool"
        },
        &control_plane().kubeconfig,
        &["--controllers=subnet-allocator", &flag_pool],
    );
    let finished = tokio::time::timeout(Duration::from_secs(1800), watch)
        .await
        .expect("allocation within 30 min")
        .unwrap();
    let seconds = finished.duration_since(start).as_secs_f64();
    let wrong = if pools { misplaced(client).await } else { 0 };
    drop(netcm);
    (seconds, wrong)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

#[tokio::main]
async fn main() {
    let n = env_usize("NODES", 2000);
    let repeats = env_usize("REPEATS", 2).max(1);
    // Holds the e2e cluster lock for the whole run, so no test shares the API server with the benchmark.
    let env = TestEnv::new().await;
    let (mut one, mut ten) = (Vec::new(), Vec::new());
    let mut wrong = 0;
    for r in 0..repeats {
        // Alternated, so a neighbour's load on the shared machine falls on both modes alike.
        let (s, _) = run(&env, n, false).await;
        eprintln!("run {r}: 1 pool {s:.1} s");
        one.push(s);
        let (s, w) = run(&env, n, true).await;
        eprintln!("run {r}: 10 pools {s:.1} s ({w} Nodes outside their pool)");
        ten.push(s);
        wrong += w;
    }
    env.clean().await;
    let runs = |v: &[f64]| {
        v.iter()
            .map(|s| format!("{s:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (m1, m10) = (median(&mut one.clone()), median(&mut ten.clone()));
    println!("\nAllocation of a {n}-Node backlog, Nodes spread over {POOLS} label values, real kube-apiserver\n");
    println!("| mode | runs (s) | median s | Nodes/s |");
    println!("|---|---|---|---|");
    println!(
        "| 1 pool (--cluster-cidr) | {} | {m1:.1} | {:.0} |",
        runs(&one),
        n as f64 / m1
    );
    println!(
        "| {POOLS} pools (ClusterCIDRs by label) | {} | {m10:.1} | {:.0} |",
        runs(&ten),
        n as f64 / m10
    );
    println!(
        "\n{POOLS} pools / 1 pool: {:.2}× ({wrong} Nodes outside their pool)",
        m10 / m1
    );
}

//! PodCIDRMigration benchmark on the real control plane (run through `hack/bench.sh migration`): N Nodes
//! (`NODES`, 1000) allocated from the flag pool move to a ClusterCIDR at `maxUnavailable`
//! (`MAX_UNAVAILABLE`, 10 % of N), with the kubelets simulated: a Node the migration deletes is created
//! again under its name `REGISTER_DELAY_MS` (0) after the bench sees it gone, as a kubelet restarting
//! at once would. No pod runs on the Nodes, so a drain is one LIST.
//!
//! Prints the wall time from the migration's creation to `Complete`, Nodes moved per second, and per
//! Node the seconds from its delete to its CIDR from the destination (the re-registration, drain
//! excluded) and from its cordon to that CIDR (the whole move), as percentiles.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use netcm_e2e::nodes::{create_nodes, pod_cidrs, wait_all_allocated, NodeFixture};
use netcm_e2e::{cluster_cidrs, pod_cidr_migrations, Netcm, TestEnv};
use serde_json::json;

const FLAG_POOL: &str = "10.64.0.0/10";
const DESTINATION: &str = "10.128.0.0/10";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fixture(name: &str, i: usize) -> NodeFixture {
    NodeFixture::named(name).internal_ip(&format!("198.51.{}.{}", (i / 250) % 250, i % 250 + 1))
}

/// What the bench saw of one Node's move.
#[derive(Default, Clone, Copy)]
struct Seen {
    cordoned: Option<Instant>,
    deleted: Option<Instant>,
    moved: Option<Instant>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn main() {
    let n = env_u64("NODES", 1000) as usize;
    let max_unavailable = env_u64("MAX_UNAVAILABLE", (n as u64 / 10).max(1));
    let register_delay = Duration::from_millis(env_u64("REGISTER_DELAY_MS", 0));
    let env = TestEnv::new().await;
    let netcm = Netcm::start(
        "bench-migration",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator,pod-cidr-migration",
            &format!("--cluster-cidr={FLAG_POOL}"),
        ],
    );
    let names: Vec<String> = (0..n).map(|i| format!("bench-mig-{i:05}")).collect();
    let fixtures: Vec<NodeFixture> = names
        .iter()
        .enumerate()
        .map(|(i, name)| fixture(name, i))
        .collect();
    create_nodes(&env.client, fixtures, 32).await;
    wait_all_allocated(&env.client, n, Duration::from_secs(600)).await;
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
        "metadata": {"name": "bench-destination"},
        "spec": {"perNodeHostBits": 8, "ipv4": DESTINATION}
    }))
    .unwrap();
    cluster_cidrs(&env.client)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let destination: IpNet = DESTINATION.parse().unwrap();
    let index: BTreeMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();

    // The kubelets and the clock: one watch of every Node.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut stream = std::pin::pin!(watcher(nodes.clone(), watcher::Config::default()));
    while let Some(ev) = stream.next().await {
        if matches!(ev, Ok(Event::InitDone)) {
            break;
        }
    }
    let migration: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.netcm.io/v1alpha1", "kind": "PodCIDRMigration",
        "metadata": {"name": "bench"},
        "spec": {"destination": "bench-destination", "maxUnavailable": max_unavailable}
    }))
    .unwrap();
    let started = Instant::now();
    pod_cidr_migrations(&env.client)
        .create(&PostParams::default(), &migration)
        .await
        .unwrap();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut moved: HashSet<String> = HashSet::new();
    let mut most_out = 0usize;
    let deadline = started + Duration::from_secs(env_u64("TIMEOUT_SECONDS", 1800));
    while moved.len() < n {
        let next = tokio::time::timeout_at(deadline.into(), stream.next()).await;
        let Ok(Some(ev)) = next else {
            panic!(
                "{} of {n} Nodes moved when the bench timed out or the watch ended",
                moved.len()
            );
        };
        let now = Instant::now();
        match ev {
            Ok(Event::Apply(node)) | Ok(Event::InitApply(node)) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                let s = seen.entry(name.clone()).or_default();
                let unschedulable = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                if unschedulable && s.cordoned.is_none() {
                    s.cordoned = Some(now);
                }
                let in_destination = pod_cidrs(&node).iter().any(|c| {
                    c.parse::<IpNet>()
                        .is_ok_and(|c: IpNet| destination.contains(&c))
                });
                if in_destination && moved.insert(name) {
                    s.moved = Some(now);
                }
            }
            Ok(Event::Delete(node)) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                seen.entry(name.clone()).or_default().deleted = Some(now);
                let i = index.get(&name).copied().unwrap_or(0);
                let client = env.client.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(register_delay).await;
                    netcm_e2e::nodes::create_node(&client, &fixture(&name, i)).await;
                });
            }
            Ok(_) => {}
            Err(e) => eprintln!("watch: {e}"),
        }
        let out = seen
            .values()
            .filter(|s| s.cordoned.is_some() && s.moved.is_none())
            .count();
        most_out = most_out.max(out);
    }
    let wall = started.elapsed();
    let mut back: Vec<f64> = Vec::new();
    let mut whole: Vec<f64> = Vec::new();
    for s in seen.values() {
        if let (Some(d), Some(m)) = (s.deleted, s.moved) {
            back.push(m.duration_since(d).as_secs_f64());
        }
        if let (Some(c), Some(m)) = (s.cordoned, s.moved) {
            whole.push(m.duration_since(c).as_secs_f64());
        }
    }
    back.sort_by(f64::total_cmp);
    whole.sort_by(f64::total_cmp);
    netcm.assert_running();
    println!(
        "\n| Nodes | maxUnavailable | register delay | wall to every Node moved | Nodes/s | most out of service at once |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {n} | {max_unavailable} | {} ms | {:.1} s | {:.1} | {most_out} |",
        register_delay.as_millis(),
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64()
    );
    println!("\n| per Node | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|");
    for (what, v) in [
        ("delete → CIDR from the destination (drain excluded)", &back),
        ("cordon → CIDR from the destination", &whole),
    ] {
        println!(
            "| {what} | {:.2} s | {:.2} s | {:.2} s | {:.2} s |",
            percentile(v, 0.5),
            percentile(v, 0.9),
            percentile(v, 0.99),
            percentile(v, 1.0)
        );
    }
}

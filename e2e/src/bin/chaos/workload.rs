//! The workload under the faults: Nodes created and deleted continuously (in bursts, so a leader has
//! PATCHes in flight when a fault hits), and two ClusterCIDR pools created and deleted now and then.
//! Every request goes to a random API server with a 3 s timeout, then to the other one.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, PostParams};
use netcm_e2e::cluster_cidrs;
use serde_json::json;
use tokio::sync::watch;

use crate::rng::Rng;

/// Nodes kept at about this many.
const POPULATION: usize = 120;
/// Up to this many Nodes created at each 1 s tick.
const BURST_MAX: u64 = 10;
/// The label that selects [`POOLS`]' first pool.
const POOL_LABEL: &str = "chaos-pool";

/// The ClusterCIDRs the workload creates and deletes: a small pool for labelled Nodes (/24 each) and a
/// fallback pool for every Node (/25 each), which ranks before the flag pool while it exists.
const POOLS: [(&str, &str, u8, bool); 2] = [
    ("chaos-a", "10.200.0.0/22", 8, true),
    ("chaos-b", "10.201.0.0/20", 7, false),
];

/// What the workload did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub nodes_created: usize,
    pub nodes_deleted: usize,
    pub node_requests_failed: usize,
    pub pools_created: usize,
    pub pools_deleted: usize,
}

/// The running workload.
pub struct Workload {
    stop: watch::Sender<bool>,
    nodes: tokio::task::JoinHandle<Stats>,
    pools: tokio::task::JoinHandle<Stats>,
}

impl Workload {
    /// Starts the Node and pool churn through `clients` (one per API server).
    pub fn start(clients: &[kube::Client; 2], seed: u64) -> Workload {
        let (stop, stopped) = watch::channel(false);
        let nodes = tokio::spawn(node_churn(
            clients.clone(),
            Rng::new(seed ^ 0x6e6f_6465),
            stopped.clone(),
        ));
        let pools = tokio::spawn(pool_churn(
            clients.clone(),
            Rng::new(seed ^ 0x706f_6f6c),
            stopped,
        ));
        Workload { stop, nodes, pools }
    }

    /// Stops both churns; what they did.
    pub async fn stop(self) -> Stats {
        let _ = self.stop.send(true);
        let n = self.nodes.await.unwrap_or_default();
        let p = self.pools.await.unwrap_or_default();
        Stats {
            pools_created: p.pools_created,
            pools_deleted: p.pools_deleted,
            ..n
        }
    }
}

/// Runs `op` through a random server, then the other, each bounded by 3 s; whether one succeeded.
async fn either<F, Fut>(clients: &[kube::Client; 2], first: usize, op: F) -> bool
where
    F: Fn(kube::Client) -> Fut,
    Fut: Future<Output = bool>,
{
    for i in [first, 1 - first] {
        let done = tokio::time::timeout(Duration::from_secs(3), op(clients[i].clone())).await;
        if done == Ok(true) {
            return true;
        }
    }
    false
}

/// Whether a request succeeded or failed with `code` (the create's 409, the delete's 404: done before).
fn ok_or<T>(r: &Result<T, kube::Error>, code: u16) -> bool {
    match r {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code == code,
        Err(_) => false,
    }
}

async fn node_churn(
    clients: [kube::Client; 2],
    mut rng: Rng,
    mut stop: watch::Receiver<bool>,
) -> Stats {
    let mut stats = Stats::default();
    let mut live: Vec<String> = Vec::new();
    let mut next = 0usize;
    while !*stop.borrow() {
        // Creates, all at once.
        let burst = rng.below(BURST_MAX + 1);
        let mut batch = Vec::new();
        for _ in 0..burst {
            let name = format!("chaos-{next:06}");
            next += 1;
            let labelled = rng.percent(33);
            batch.push((name, labelled, rng.below(2) as usize));
        }
        let created: Vec<(String, bool)> = futures::stream::iter(batch)
            .map(|(name, labelled, first)| {
                let clients = &clients;
                async move {
                    let ok = either(clients, first, |c| {
                        let name = name.clone();
                        async move {
                            let node = Node {
                                metadata: ObjectMeta {
                                    name: Some(name),
                                    labels: labelled.then(|| {
                                        [(POOL_LABEL.to_string(), "a".to_string())].into()
                                    }),
                                    ..Default::default()
                                },
                                ..Default::default()
                            };
                            let api: Api<Node> = Api::all(c);
                            ok_or(&api.create(&PostParams::default(), &node).await, 409)
                        }
                    })
                    .await;
                    (name, ok)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (name, ok) in created {
            if ok {
                stats.nodes_created += 1;
            } else {
                stats.node_requests_failed += 1;
            }
            // A create that timed out may land later: keep it so it is deleted some day.
            live.push(name);
        }
        // Deletes, oldest first with some at random, down to the population.
        let excess = live.len().saturating_sub(POPULATION);
        let mut doomed = Vec::new();
        for _ in 0..excess {
            let i = if rng.percent(50) {
                0
            } else {
                rng.below(live.len() as u64) as usize
            };
            doomed.push((live.remove(i), rng.below(2) as usize));
        }
        let deleted: Vec<bool> = futures::stream::iter(doomed)
            .map(|(name, first)| {
                let clients = &clients;
                async move {
                    either(clients, first, |c| {
                        let name = name.clone();
                        async move {
                            let api: Api<Node> = Api::all(c);
                            let dp = DeleteParams {
                                grace_period_seconds: Some(0),
                                ..Default::default()
                            };
                            ok_or(&api.delete(&name, &dp).await, 404)
                        }
                    })
                    .await
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for ok in deleted {
            if ok {
                stats.nodes_deleted += 1;
            } else {
                stats.node_requests_failed += 1;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
    }
    stats
}

fn pool_object(name: &str, cidr: &str, host_bits: u8, selector: bool) -> Option<DynamicObject> {
    let mut spec = json!({"perNodeHostBits": host_bits, "ipv4": cidr});
    if selector {
        spec["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": POOL_LABEL, "operator": "In", "values": ["a"]}]}]});
    }
    serde_json::from_value(json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .ok()
}

async fn pool_churn(
    clients: [kube::Client; 2],
    mut rng: Rng,
    mut stop: watch::Receiver<bool>,
) -> Stats {
    let mut stats = Stats::default();
    loop {
        let wait = rng.millis(10_000, 20_000);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return stats,
        }
        let (name, cidr, bits, selector) = POOLS[rng.below(POOLS.len() as u64) as usize];
        let first = rng.below(2) as usize;
        let Some(obj) = pool_object(name, cidr, bits, selector) else {
            continue;
        };
        // Exists and not yet deleting: delete it (its finalizer holds it until its Nodes are gone);
        // gone: create it; deleting: leave it.
        let state = tokio::time::timeout(
            Duration::from_secs(3),
            cluster_cidrs(&clients[first]).get_opt(name),
        )
        .await;
        let Ok(Ok(current)) = state else { continue };
        match current {
            Some(o) if o.metadata.deletion_timestamp.is_none() => {
                let ok = either(&clients, first, |c| async move {
                    cluster_cidrs(&c)
                        .delete(name, &DeleteParams::default())
                        .await
                        .is_ok()
                })
                .await;
                if ok {
                    stats.pools_deleted += 1;
                }
            }
            Some(_) => {}
            None => {
                let ok = either(&clients, first, |c| {
                    let obj = obj.clone();
                    async move {
                        cluster_cidrs(&c)
                            .create(&PostParams::default(), &obj)
                            .await
                            .is_ok()
                    }
                })
                .await;
                if ok {
                    stats.pools_created += 1;
                }
            }
        }
    }
}

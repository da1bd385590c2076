//! The Nodes a run works on: realistic ~8 KB Nodes created concurrently in one POST each, and a clean-up
//! that survives tens of thousands of Nodes (the bench's watches of them: `set_watch.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use netcm_e2e::LEASE_NAMESPACE;

/// The label naming the set a Node belongs to (one set per contender), so a watch sees only its set.
pub const SET_LABEL: &str = "bench.netcm.io/set";
/// The label grouping Nodes by thousands, so clean-up deletes in chunks that each finish well inside
/// the API server's request timeout (one delete-collection of 50,000 Nodes does not).
pub const CHUNK_LABEL: &str = "bench.netcm.io/chunk";
const CHUNK: usize = 1000;

/// Images a Node reports (kubelet reports up to 50): 28 bring a Node created in one POST to ~8 KB as
/// the API server returns it (JSON with managedFields; the run prints the size it measured). Earlier
/// runs made Nodes in two requests (create, then status) with 12 images: ~6.3 KB.
const IMAGES: usize = 28;

/// What tells one bench Node's machine from another's: its pod capacity (`status.capacity.pods`, which
/// the subnet allocator sizes a Node's CIDR from with `--node-cidr-size-from-pods`) and the instance type
/// label a cloud's kubelet sets beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub pods: u32,
    pub instance_type: &'static str,
}

/// The Node every mode but `sizing` creates: kubelet's default max-pods on a large instance.
pub const DEFAULT_SHAPE: Shape = Shape {
    pods: 110,
    instance_type: "m5.4xlarge",
};

/// A Node status of realistic size: conditions, addresses, capacity, nodeInfo and images; `pods` is
/// both its capacity and its allocatable, as a kubelet reports its max-pods.
pub fn realistic_status(i: usize, pods: u32) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let cond = |t: &str, s: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": msg,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let images: Vec<_> = (0..IMAGES)
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
            {"type": "InternalIP", "address": internal_ip(i)},
            {"type": "Hostname", "address": format!("bench-host-{i}.example.com")}
        ],
        "capacity": {"cpu": "16", "memory": "65843856Ki", "pods": pods.to_string(), "ephemeral-storage": "203056560Ki",
                     "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
        "allocatable": {"cpu": "15800m", "memory": "63644816Ki", "pods": pods.to_string(),
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

/// The name of Node `i` of `set`.
pub fn node_name(set: &str, i: usize) -> String {
    format!("{set}-{i:05}")
}

/// Creates Node `name` (index `i` of `set`) of [`DEFAULT_SHAPE`]; see [`create_shaped_node`].
pub async fn create_node(client: &kube::Client, set: &str, i: usize, name: &str) {
    create_shaped_node(client, set, i, name, DEFAULT_SHAPE).await
}

/// Creates Node `name` (index `i` of `set`) with its status in the same POST, as a kubelet registers:
/// the API server keeps a created Node's status, so one request per Node instead of two (and no
/// allocator ever sees the Node without its pod capacity).
pub async fn create_shaped_node(
    client: &kube::Client,
    set: &str,
    i: usize,
    name: &str,
    shape: Shape,
) {
    let body = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": shape.instance_type, "topology.kubernetes.io/zone": "zone-a",
            SET_LABEL: set, CHUNK_LABEL: (i / CHUNK).to_string()}},
        "status": realistic_status(i, shape.pods),
    });
    let body = serde_json::to_vec(&body).unwrap();
    // Under a backlog of tens of thousands the API server may shed load (429) or time out: retry, and
    // take AlreadyExists as the earlier attempt having landed.
    for attempt in 0..8u32 {
        let req = http::Request::post("/api/v1/nodes?fieldManager=bench-allocation")
            .header("content-type", "application/json")
            .body(body.clone())
            .unwrap();
        match client.request_text(req).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(e) if attempt == 7 => panic!("create Node {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200 << attempt)).await,
        }
    }
}

/// Creates Nodes `0..n` of `set` of [`DEFAULT_SHAPE`], `concurrency` POSTs at a time.
pub async fn create_nodes(client: &kube::Client, set: &str, n: usize, concurrency: usize) {
    create_shaped_nodes(client, set, n, concurrency, |_| DEFAULT_SHAPE).await
}

/// Creates Nodes `0..n` of `set`, Node `i` of `shape(i)`, `concurrency` POSTs at a time.
pub async fn create_shaped_nodes(
    client: &kube::Client,
    set: &str,
    n: usize,
    concurrency: usize,
    shape: impl Fn(usize) -> Shape,
) {
    let start = Instant::now();
    let shape = &shape;
    futures::stream::iter(0..n)
        .map(|i| async move {
            create_shaped_node(client, set, i, &node_name(set, i), shape(i)).await
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let secs = start.elapsed().as_secs_f64();
    if n > 0 && NODE_BYTES.load(Ordering::Relaxed) == 0 {
        NODE_BYTES.store(
            stored_size(client, &node_name(set, 0)).await,
            Ordering::Relaxed,
        );
    }
    eprintln!(
        "[bench] created {n} Nodes of set {set} in {secs:.1} s ({:.0}/s)",
        n as f64 / secs
    );
}

static NODE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The size in bytes of the run's first Node as the API server returned it (JSON with managedFields).
pub fn node_bytes() -> usize {
    NODE_BYTES.load(Ordering::Relaxed)
}

async fn stored_size(client: &kube::Client, name: &str) -> usize {
    let req = http::Request::get(format!("/api/v1/nodes/{name}"))
        .body(Vec::new())
        .unwrap();
    client.request_text(req).await.map(|t| t.len()).unwrap_or(0)
}

async fn count_nodes(api: &Api<k8s_openapi::api::core::v1::Node>) -> Option<usize> {
    let page = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .ok()?;
    Some(if page.items.is_empty() {
        0
    } else {
        page.metadata.remaining_item_count.unwrap_or(0).max(0) as usize + 1
    })
}

/// Removes the finalizers of Nodes already deleted: something other than the bench left them held, and
/// no controller here would ever release them.
async fn strip_finalizers_of_deleting(nodes: &Api<k8s_openapi::api::core::v1::Node>) {
    let Ok(list) = nodes.list_metadata(&ListParams::default()).await else {
        return;
    };
    let strip = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for node in list.items {
        let meta = &node.metadata;
        if meta.deletion_timestamp.is_some()
            && meta.finalizers.as_ref().is_some_and(|f| !f.is_empty())
        {
            let name = meta.name.clone().unwrap_or_default();
            eprintln!("[bench] clean-up: removing the finalizers holding deleted Node {name}");
            let _ = nodes
                .patch_metadata(&name, &kube::api::PatchParams::default(), &strip)
                .await;
        }
    }
}

/// Deletes every Node, PodCIDRClaim and netcm Lease, however many.
pub async fn delete_everything(client: &kube::Client, max_nodes: usize) {
    let start = Instant::now();
    delete_nodes(client, max_nodes).await;
    delete_claims(client).await;
    delete_leases(client).await;
    eprintln!(
        "[bench] clean-up done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

/// Deletes every PodCIDRClaim, retrying until none is left.
pub async fn delete_claims(client: &kube::Client) {
    let dp = DeleteParams::default();
    let claims = netcm_e2e::pod_cidr_claims(client);
    for _ in 0..20 {
        match claims.list_metadata(&ListParams::default().limit(1)).await {
            Ok(l) if l.items.is_empty() => break,
            _ => {
                let _ = claims.delete_collection(&dp, &ListParams::default()).await;
            }
        }
    }
}

/// Deletes netcm's Leases (not the API servers' own).
pub async fn delete_leases(client: &kube::Client) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let _ = leases
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("!apiserver.kubernetes.io/identity"),
        )
        .await;
}

/// Deletes every Node, however many. Nodes go by chunk label, 8 chunks at a time, then whatever is left
/// unlabeled; every step is retried until the list is empty, since a delete-collection that outlives its
/// request timeout stops part-way.
pub async fn delete_nodes(client: &kube::Client, max_nodes: usize) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let dp = DeleteParams::default();
    for round in 0..20 {
        let Some(left) = count_nodes(&nodes).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        if left == 0 {
            break;
        }
        if round > 0 {
            eprintln!("[bench] clean-up round {round}: {left} Nodes left");
            strip_finalizers_of_deleting(&nodes).await;
        }
        let chunks = max_nodes.max(left).div_ceil(CHUNK);
        futures::stream::iter(0..chunks)
            .map(|c| {
                let nodes = nodes.clone();
                let dp = dp.clone();
                async move {
                    let lp = ListParams::default().labels(&format!("{CHUNK_LABEL}={c}"));
                    let _ = nodes.delete_collection(&dp, &lp).await;
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let _ = nodes.delete_collection(&dp, &ListParams::default()).await;
    }
    if count_nodes(&nodes).await != Some(0) {
        panic!("Nodes are left after 20 clean-up rounds");
    }
}

/// Compacts etcd to its current revision and defragments it, between contenders: deleted Nodes of
/// ~8 KB otherwise pile up in etcd's history until the API server's next compaction (every 5 min), and
/// three sets of 50,000 would pass etcd's 2 GiB quota. Returns the database size before and after, MiB.
pub fn compact_etcd() -> Option<(f64, f64)> {
    let env = std::process::Command::new("bash")
        .arg(netcm_e2e::repo_root().join("hack/controlplane.sh"))
        .arg("env")
        .output()
        .ok()?;
    let env = String::from_utf8_lossy(&env.stdout).into_owned();
    let port = env.lines().find_map(|l| l.strip_prefix("ETCD_PORT="))?;
    let post = |path: &str, body: serde_json::Value| -> Option<serde_json::Value> {
        let out = std::process::Command::new("curl")
            .args(["-sf", "-X", "POST", "--max-time", "120"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .arg("-d")
            .arg(body.to_string())
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let size = |status: &serde_json::Value| -> Option<f64> {
        Some(status["dbSize"].as_str()?.parse::<f64>().ok()? / 1_048_576.0)
    };
    let status = post("/v3/maintenance/status", json!({}))?;
    let before = size(&status)?;
    let revision = status["header"]["revision"].as_str()?.to_string();
    // The API server compacts on its own schedule too; a compaction to an older revision than ours then
    // fails harmlessly on its side.
    post(
        "/v3/kv/compaction",
        json!({"revision": revision, "physical": true}),
    )?;
    post("/v3/maintenance/defragment", json!({}))?;
    let after = size(&post("/v3/maintenance/status", json!({}))?)?;
    Some((before, after))
}

/// The InternalIP of Node `i` of a set.
pub fn internal_ip(i: usize) -> String {
    format!("198.51.{}.{}", (i / 250) % 250, i % 250 + 1)
}

/// With `RESTART_APISERVER=1`, restarts kube-apiserver and waits until it answers this client again.
pub async fn fresh_apiserver(client: &kube::Client) {
    if !std::env::var("RESTART_APISERVER").is_ok_and(|v| v == "1") {
        return;
    }
    netcm_e2e::restart_apiserver();
    let since = std::time::Instant::now();
    while client.apiserver_version().await.is_err() {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(120),
            "kube-apiserver did not answer within 120 s of its restart"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    eprintln!(
        "[bench] kube-apiserver restarted; answering after {:.1} s",
        since.elapsed().as_secs_f64()
    );
}

//! The API server's ceiling: the writes an allocator makes, sent by the bench's own concurrent clients
//! with no controller, so every contender's time has a floor measured in the same run.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::contenders::{reset, Row};
use crate::fixtures::{create_nodes, internal_ip, node_name};
use crate::measure::{node_cache_checks, proc_stats, AuditMark, MachineCpu};
use crate::set_watch::SetWatch;
use crate::set_watch::LEASE_ANNOTATION;
use crate::Config;
use netcm_e2e::{apiserver_pid, control_plane};

/// The `i`-th /24 of 10.0.0.0/8, the ceiling's stand-in for an allocator's choice.
fn ceiling_cidr(i: usize) -> String {
    format!("10.{}.{}.0/24", (i / 256) % 256, i % 256)
}

/// What the ceiling's PATCHes run beside.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CeilingLoad {
    /// Nothing: the PATCHes alone, timed until the last response.
    Bare,
    /// The bench's own watch of the set, which every contender's run has too; timed as contenders are,
    /// until that watch has seen every Node with a CIDR.
    Observed,
    /// Observed, plus a watch of every Node such as any informer-based allocator holds.
    Informer,
    /// What every allocator must do besides its writes, on the clock: Observed, then a list of every
    /// Node (streaming, in protobuf, as netcm's informer asks) before the first PATCH, its watch kept
    /// open through them. With netcm's JSON Patch this is an allocator's floor: no decision, no cache,
    /// no claim, no queue, only what the API server must serve to any allocator.
    AllocatorFloor,
}

/// How the ceiling's PATCHes are written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CeilingPatch {
    /// A strategic-merge PATCH of `spec.podCIDR(s)`, as KCM writes them: the API server's cheapest.
    Strategic,
    /// A JSON Patch shaped as netcm's (a `test` of the annotations as cached, then the two adds): what
    /// the fence's precondition costs the API server, which must serialize the Node to JSON to apply it.
    /// (netcm also tests the UID, which the bench does not read; a test costs a comparison.)
    JsonAsNetcm,
    /// Strategic, each answer asked for in protobuf, as netcm's unread writes ask
    /// (`client::unread::UNREAD_ANSWER`): what encoding the Node in JSON for each answer costs the API
    /// server.
    StrategicProtobufAnswer,
    /// Both writes the chart's two controllers make per Node, one after the other: the strategic-merge
    /// PATCH of `spec.podCIDR(s)`, then a merge PATCH of flannel's lease annotations as the
    /// node-annotation-syncer writes them at its defaults (host-gw). (The syncer also sends the cached
    /// `resourceVersion`, which the bench does not read; a precondition costs a comparison.)
    TwoWrites,
}

/// The row of an allocator's floor ([`CeilingLoad::AllocatorFloor`] with netcm's PATCHes).
pub const FLOOR_LABEL: &str =
    "an allocator's floor: the bench's watch, every Node listed then watched, PATCHes shaped as netcm's";

/// Appended to a ceiling's row when it runs again after netcm (`FLOOR_AFTER=1`, `BARE_AFTER=1`).
pub const AFTER_NETCM_SUFFIX: &str = ", run again after netcm";

/// When the ceiling of two writes per Node had made them all, if the run has that row: the only ceiling
/// row (no process stats) that times leases.
pub fn two_writes_seconds(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.stats.is_none() && r.leased_seconds.is_some())
        .and_then(|r| r.leased_seconds)
}

/// The merge PATCH of Node `i`'s lease annotations, as the node-annotation-syncer writes them.
fn lease_patch(i: usize) -> serde_json::Value {
    let prefix = LEASE_ANNOTATION
        .strip_suffix("kube-subnet-manager")
        .expect("the lease annotation ends with kube-subnet-manager");
    json!({"metadata": {"annotations": {
        LEASE_ANNOTATION: "true",
        format!("{prefix}backend-type"): "host-gw",
        format!("{prefix}backend-data"): "null",
        format!("{prefix}public-ip"): internal_ip(i),
    }}})
}

/// The API server's ceiling: `cfg.ceiling_clients` concurrent PATCHes of podCIDR (an allocator's floor:
/// `cfg.floor_clients`), no controller, under `load`.
pub async fn api_ceiling(
    client: &kube::Client,
    cfg: &Config,
    load: CeilingLoad,
    shape: CeilingPatch,
) -> Row {
    let n = cfg.nodes;
    let set = "bench-ceiling";
    let clients = match load {
        CeilingLoad::AllocatorFloor => cfg.floor_clients,
        _ => cfg.ceiling_clients,
    };
    create_nodes(client, set, n, cfg.creators).await;
    let api: Api<Node> = Api::all(client.clone());
    let watch = match load {
        CeilingLoad::Bare => None,
        _ => Some(SetWatch::start(client, set).await),
    };
    let informer = match load {
        CeilingLoad::Informer => Some(SetWatch::every_node(client).await),
        _ => None,
    };
    let mark = AuditMark::now(&control_plane().audit_log);
    let apiserver = apiserver_pid();
    let apiserver_cpu = proc_stats(apiserver).cpu_seconds;
    let cache_checks = node_cache_checks(client).await;
    let bench_cpu = proc_stats(std::process::id()).cpu_seconds;
    let machine = MachineCpu::now();
    let start = Instant::now();
    // The floor's list is on the clock, as a contender's is: it starts with nothing cached.
    let informer = match load {
        CeilingLoad::AllocatorFloor => {
            let informer = SetWatch::every_node_streaming(client).await;
            eprintln!(
                "[bench] ceiling (an allocator's floor): every Node listed in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            Some(informer)
        }
        _ => informer,
    };
    let cidrs_written: Vec<Instant> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let client = client.clone();
            async move {
                let cidr = ceiling_cidr(i);
                let name = node_name(set, i);
                let params = PatchParams::default();
                let url = kube::core::Request::new(api.resource_url());
                // Sent as netcm sends its PATCHes: the answer is not decoded (a client that decodes
                // 8 KB per answer would take cores from the API server and lower the ceiling).
                let request = match shape {
                    CeilingPatch::Strategic
                    | CeilingPatch::TwoWrites
                    | CeilingPatch::StrategicProtobufAnswer => {
                        let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                        url.patch(&name, &params, &Patch::Strategic(&patch))
                    }
                    CeilingPatch::JsonAsNetcm => {
                        let patch: json_patch::Patch = serde_json::from_value(json!([
                            {"op": "test", "path": "/metadata/annotations", "value": null},
                            {"op": "add", "path": "/spec/podCIDR", "value": cidr},
                            {"op": "add", "path": "/spec/podCIDRs", "value": [cidr]},
                        ]))
                        .unwrap();
                        url.patch(&name, &params, &Patch::Json::<()>(patch))
                    }
                }
                .unwrap();
                if shape == CeilingPatch::StrategicProtobufAnswer {
                    // As netcm's unread writes send it (a protobuf answer kube cannot decode).
                    let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                    netcm_manager::client::unread::patch_unread(
                        &api,
                        &name,
                        &params,
                        &Patch::Strategic(&patch),
                    )
                    .await
                    .unwrap();
                } else {
                    client
                        .request::<serde::de::IgnoredAny>(request)
                        .await
                        .unwrap();
                }
                let cidr_written = Instant::now();
                if shape == CeilingPatch::TwoWrites {
                    let url = kube::core::Request::new(api.resource_url());
                    let request = url
                        .patch(&name, &params, &Patch::Merge(&lease_patch(i)))
                        .unwrap();
                    client
                        .request::<serde::de::IgnoredAny>(request)
                        .await
                        .unwrap();
                }
                cidr_written
            }
        })
        .buffer_unordered(clients)
        .collect()
        .await;
    let all_written = Instant::now();
    let finished = match &watch {
        // Two writes: the last CIDR is the last CIDR PATCH answered; every write ended at `all_written`.
        None => cidrs_written.iter().max().copied().unwrap_or(all_written),
        Some(w) => w
            .wait_allocated(n, cfg.timeout)
            .await
            .expect("the ceiling's watch sees every PATCH"),
    };
    let seconds = finished.duration_since(start).as_secs_f64();
    let apiserver_cpu_seconds = proc_stats(apiserver).cpu_seconds - apiserver_cpu;
    let apiserver_node_cache_checks = node_cache_checks(client).await - cache_checks;
    let stolen_cpu_pct = MachineCpu::now().stolen_pct_since(&machine);
    // The bench's own CPU over the run: the ceiling's clients and watches, which a contender's row
    // counts as the contender's CPU (the bench's watch of the set runs in both).
    let bench_cpu_seconds = proc_stats(std::process::id()).cpu_seconds - bench_cpu;
    let pace = watch
        .as_ref()
        .map_or_else(|| "not watched".to_string(), SetWatch::allocation_pace);
    drop(informer);
    drop(watch);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = mark.writes("", set);
    let what = match (load, shape) {
        (CeilingLoad::Bare, CeilingPatch::Strategic) => "no watch",
        (CeilingLoad::Bare, CeilingPatch::JsonAsNetcm) => "no watch, JSON Patch as netcm's",
        (CeilingLoad::Bare, CeilingPatch::TwoWrites) => {
            "no watch, two writes per Node: CIDR, then lease"
        }
        (CeilingLoad::Bare, CeilingPatch::StrategicProtobufAnswer) => {
            "no watch, each answer in protobuf"
        }
        (CeilingLoad::Observed, _) => "the bench's watch",
        (CeilingLoad::Informer, _) => "the bench's watch + a watch of every Node",
        (CeilingLoad::AllocatorFloor, _) => FLOOR_LABEL,
    };
    eprintln!(
        "[bench] ceiling ({what}): {seconds:.1} s, {} node writes, every write done at {:.1} s, \
         the bench's CPU {bench_cpu_seconds:.1} s, CIDRs {pace}",
        writes.node,
        all_written.duration_since(start).as_secs_f64()
    );
    reset(client, cfg.nodes).await;
    Row {
        contender: format!("API ceiling ({clients} concurrent PATCHes, {what})"),
        seconds,
        leased_seconds: (shape == CeilingPatch::TwoWrites)
            .then(|| all_written.duration_since(start).as_secs_f64()),
        writes,
        stats: None,
        idle_cpu_pct: None,
        apiserver_cpu_seconds,
        apiserver_node_cache_checks,
        stolen_cpu_pct,
    }
}

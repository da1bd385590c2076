//! How much decoding and caching a Node costs the informer (run through `hack/bench.sh decode`).
//!
//! N realistic Nodes (a kubelet's: ~9 KB of JSON with managedFields, 20 images, nodeInfo, capacity,
//! conditions, flannel's lease annotations) are decoded from watch-event lines, the way a watch or a
//! streaming list delivers them, and stored the way each informer stored them:
//!
//! - full `Node`, trimmed, in kube-runtime's reflector store: `WatchEvent<Node>` (every field built),
//!   `NodeFields::trim`, then the reflector's `Store<Node>` (an `Arc<Node>` keyed by an `ObjectRef`). The
//!   informer before `WireNode` — and, for bytes retained, also the informer with `WireNode` before
//!   `CachedNode`: that one decoded fewer fields but cached the same trimmed `Node` in the same store;
//! - `CachedNode` in the informer's store: `WatchEvent<WireNode>` (only what a declaration can keep is
//!   built), `NodeFields::keep` into a `CachedNode`, then the informer's own `Store` (the `Arc` keyed by
//!   the Node's own name).
//!
//! Each for two declarations: the subnet-allocator's alone (pod CIDRs) and netcm's three controllers at
//! their defaults (pod CIDRs, addresses, flannel's annotations, NetworkUnavailable).
//!
//! A counting global allocator (`stats_alloc`) gives allocations and bytes allocated per Node while decoding
//! and storing, the bytes and allocations still held per cached Node afterwards (the store's table
//! included; each live allocation also costs the system allocator its own header). Time per
//! Node is the fastest of a few rounds; the machine is shared, so treat it as ±25 %.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::core::WatchEvent;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use netcm_manager::informer::store::Store;
use netcm_manager::node_fields::WireNode;
use netcm_manager::{CachedNode, NodeFields};
use serde_json::json;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One managedFields entry; `fields` is the fieldsV1 tree.
fn managed(
    manager: &str,
    subresource: Option<&str>,
    fields: serde_json::Value,
) -> serde_json::Value {
    let mut e = json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                       "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields});
    if let Some(s) = subresource {
        e["subresource"] = json!(s);
    }
    e
}

/// A Node as a kubelet, kube-controller-manager's nodeipam and flanneld leave it, as one watch-event line.
fn kubelet_node_line(i: usize) -> String {
    let name = format!("bench-node-{i:05}");
    let now = "2025-06-01T10:00:00Z";
    let cond = |t: &str, s: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": msg,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let images: Vec<_> = (0..20)
        .map(|k| {
            json!({"names": [
                format!("registry.example.com/team-{k}/service-{k}@sha256:{:064x}", k * 7919 + i),
                format!("registry.example.com/team-{k}/service-{k}:v1.{k}.{i}")
            ], "sizeBytes": 100_000_000 + k * 1_000_003})
        })
        .collect();
    let cidr = format!("10.{}.{}.0/24", 64 + i / 256 % 64, i % 256);
    let ip = format!("198.51.{}.{}", (i / 250) % 250, i % 250 + 1);
    let status_fields = json!({"f:status": {
        "f:allocatable": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {}, "f:pods": {}},
        "f:capacity": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {}, "f:pods": {}},
        "f:conditions": {
            "k:{\"type\":\"DiskPressure\"}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
            "k:{\"type\":\"MemoryPressure\"}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
            "k:{\"type\":\"PIDPressure\"}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
            "k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}}
        },
        "f:daemonEndpoints": {"f:kubeletEndpoint": {"f:Port": {}}},
        "f:images": {}, "f:nodeInfo": {"f:bootID": {}, "f:machineID": {}, "f:systemUUID": {}}
    }});
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("{:08x}-1111-4222-8333-{:012x}", i, i), "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": now,
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": "m5.4xlarge", "topology.kubernetes.io/region": "region-1",
                       "topology.kubernetes.io/zone": "region-1a"},
            "annotations": {"flannel.alpha.coreos.com/backend-data": "{\"VNI\":1,\"VtepMAC\":\"aa:bb:cc:dd:ee:ff\"}",
                            "flannel.alpha.coreos.com/backend-type": "vxlan", "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                            "flannel.alpha.coreos.com/public-ip": ip,
                            "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [
                managed("kubelet", None, json!({"f:metadata": {"f:annotations": {".": {}, "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
                    "f:labels": {".": {}, "f:beta.kubernetes.io/arch": {}, "f:beta.kubernetes.io/os": {}, "f:kubernetes.io/arch": {},
                                 "f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {}, "f:node.kubernetes.io/instance-type": {},
                                 "f:topology.kubernetes.io/region": {}, "f:topology.kubernetes.io/zone": {}}},
                    "f:spec": {"f:providerID": {}}})),
                managed("netcm", None, json!({"f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, format!("v:\"{cidr}\""): {}}}})),
                managed("netcm", None, json!({"f:metadata": {"f:annotations": {"f:flannel.alpha.coreos.com/backend-data": {},
                    "f:flannel.alpha.coreos.com/backend-type": {}, "f:flannel.alpha.coreos.com/kube-subnet-manager": {},
                    "f:flannel.alpha.coreos.com/public-ip": {}}}})),
                managed("kube-controller-manager", None, json!({"f:metadata": {"f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}}})),
                managed("kubelet", Some("status"), status_fields),
            ]
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "providerID": format!("aws:///region-1a/i-{:017x}", i)},
        "status": {
            "conditions": [
                cond("NetworkUnavailable", "False", "RouteCreated", "netcm created a route"),
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": format!("bench-host-{i}.example.com")}],
            "capacity": {"cpu": "16", "memory": "65843856Ki", "pods": "110", "ephemeral-storage": "203056560Ki",
                         "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "15800m", "memory": "63644816Ki", "pods": "110",
                            "ephemeral-storage": "187136900936", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{:032x}", i * 104_729), "systemUUID": format!("ec2{:029x}", i),
                         "bootID": format!("{:08x}-0000-4000-8000-{:012x}", i, i), "kernelVersion": "6.1.0-28-cloud-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.33.3", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        }
    });
    // The API server writes "type" before "object"; serde_json's own maps would sort "object" first and
    // make serde buffer the whole object before decoding it.
    format!(r#"{{"type":"ADDED","object":{node}}}"#)
}

/// What decoding and storing the lines cost one way.
struct Cost {
    allocs: f64,
    bytes: f64,
    retained: f64,
    live: f64,
    time: Duration,
}

/// Decodes and stores every line with `store_all` (which returns what keeps the cache alive), `rounds`
/// times.
fn measure<T>(lines: &[String], rounds: usize, store_all: impl Fn(&[String]) -> T) -> Cost {
    let n = lines.len() as f64;
    let mut best = Duration::MAX;
    let mut cost = None;
    for _ in 0..rounds {
        let region = Region::new(GLOBAL);
        let start = Instant::now();
        let cache = store_all(lines);
        let time = start.elapsed();
        let stats = region.change();
        best = best.min(time);
        // A realloc is one more call to the allocator; stats_alloc counts only its growth as allocated.
        cost.get_or_insert(Cost {
            allocs: (stats.allocations + stats.reallocations) as f64 / n,
            bytes: stats.bytes_allocated as f64 / n,
            retained: (stats.bytes_allocated - stats.bytes_deallocated) as f64 / n,
            live: (stats.allocations as f64 - stats.deallocations as f64) / n,
            time,
        });
        std::hint::black_box(&cache);
    }
    let mut cost = cost.expect("at least one round");
    cost.time = best / lines.len() as u32;
    cost
}

fn decode<T: serde::de::DeserializeOwned>(line: &str) -> T {
    match serde_json::from_str::<WatchEvent<T>>(line).unwrap() {
        WatchEvent::Added(node) => node,
        _ => unreachable!("every line is ADDED"),
    }
}

/// The informer before `CachedNode`: a trimmed `Node` in kube-runtime's reflector store.
fn reflector_of_trimmed_nodes(lines: &[String], fields: &NodeFields) -> reflector::Store<Node> {
    let (store, mut writer) = reflector::store::<Node>();
    for line in lines {
        let mut node: Node = decode(line);
        fields.trim(&mut node);
        writer.apply_watcher_event(&Event::Apply(node));
    }
    store
}

/// The informer now: a `CachedNode` in its own store.
fn store_of_cached_nodes(lines: &[String], fields: &NodeFields) -> Store<CachedNode> {
    let store = Store::new();
    for line in lines {
        store.put(Arc::new(fields.keep(decode::<WireNode>(line))));
    }
    store
}

/// One Node of a real API server in both encodings (netcm-protobuf's testdata: ~8 KB of JSON).
fn wire_fixture(ext: &str) -> Vec<u8> {
    let path = format!(
        "{}/../protobuf/testdata/kubelet-node.{ext}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Decodes `n` copies of one answer into `CachedNode`s with `decode_one`: allocations per Node and the
/// fastest round's time per Node.
fn measure_wire(n: usize, rounds: usize, decode_one: impl Fn() -> CachedNode) -> (f64, Duration) {
    let mut best = Duration::MAX;
    let mut allocs = 0.0;
    for _ in 0..rounds {
        let region = Region::new(GLOBAL);
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(decode_one());
        }
        best = best.min(start.elapsed());
        let stats = region.change();
        allocs = (stats.allocations + stats.reallocations) as f64 / n as f64;
    }
    (allocs, best / n as u32)
}

/// The informer's two encodings side by side: the API server's JSON decoded as a `WireNode`, and its
/// protobuf transcoded by netcm-protobuf, then decoded the same way.
fn compare_encodings(n: usize, rounds: usize, fields: &NodeFields) {
    let json = wire_fixture("json");
    let pb = wire_fixture("pb");
    let via_json = || fields.keep(serde_json::from_slice::<WireNode>(&json).unwrap());
    let via_pb = || {
        let small = netcm_protobuf::transcode_object(&pb).unwrap();
        fields.keep(serde_json::from_slice::<WireNode>(&small).unwrap())
    };
    assert_eq!(via_json(), via_pb(), "both encodings cache the same Node");
    let (ja, jt) = measure_wire(n, rounds, via_json);
    let (pa, pt) = measure_wire(n, rounds, via_pb);
    println!();
    println!("Encodings (one Node of a real API server, all three controllers' declaration):");
    println!();
    println!(
        "| informer asks for | bytes on the wire per Node | allocations per Node | time per Node |"
    );
    println!("|---|---|---|---|");
    println!(
        "| JSON | {} | {ja:.1} | {:.1} µs |",
        json.len(),
        jt.as_secs_f64() * 1e6
    );
    println!(
        "| protobuf, transcoded | {} | {pa:.1} | {:.1} µs |",
        pb.len(),
        pt.as_secs_f64() * 1e6
    );
}

fn main() {
    let n: usize = std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let allocator = NodeFields::none().pod_cidrs();
    // netcm's three controllers at their defaults (subnet-allocator, node-annotation-syncer,
    // route-controller with its NetworkUnavailable writer).
    let three = NodeFields::none()
        .pod_cidrs()
        .addresses()
        .annotations("flannel.alpha.coreos.com/")
        .condition("NetworkUnavailable");
    let lines: Vec<String> = (0..n).map(kubelet_node_line).collect();
    let json_bytes = lines.iter().map(String::len).sum::<usize>() as f64 / n as f64;

    println!(
        "{n} Nodes, {json_bytes:.0} bytes of JSON each; size_of::<CachedNode>() = {} bytes, size_of::<Node>() = {} bytes",
        std::mem::size_of::<CachedNode>(),
        std::mem::size_of::<Node>()
    );
    for (declared, fields) in [
        ("subnet-allocator alone (pod CIDRs)", &allocator),
        (
            "all three controllers (pod CIDRs, addresses, flannel.alpha.coreos.com/ annotations, NetworkUnavailable)",
            &three,
        ),
    ] {
        let before = measure(&lines, rounds, |l| reflector_of_trimmed_nodes(l, fields));
        let after = measure(&lines, rounds, |l| store_of_cached_nodes(l, fields));
        println!();
        println!("Declared: {declared}");
        println!();
        println!("| cache | allocations per Node | bytes allocated per Node | bytes retained per cached Node | allocations alive per cached Node | time per Node |");
        println!("|---|---|---|---|---|---|");
        for (label, c) in [
            ("full `Node`, trimmed, reflector store (before)", &before),
            ("`WireNode` → `CachedNode`, informer store (after)", &after),
        ] {
            println!(
                "| {label} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} µs |",
                c.allocs,
                c.bytes,
                c.retained,
                c.live,
                c.time.as_secs_f64() * 1e6
            );
        }
        println!(
            "| after / before | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            after.allocs / before.allocs,
            after.bytes / before.bytes,
            after.retained / before.retained,
            after.live / before.live,
            after.time.as_secs_f64() / before.time.as_secs_f64()
        );
    }
    compare_encodings(n, rounds, &three);
}

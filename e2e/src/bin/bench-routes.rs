//! Route-controller benchmark on the real control plane (run through `hack/bench-routes.sh`, as root:
//! it creates a network namespace). N Nodes (`NODES`, default 5000) with lease annotations exist before
//! netcm's route controller starts in the route lab's namespace; prints the time from process start to
//! every route programmed (and, from netcm's log, from informer synced to the last route), to every
//! RouteCreated condition, and for a live change of every Node's gateway.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kube::api::{Patch, PatchParams};
use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::route_lab::*;
use netcm_e2e::wait_for;

/// The timestamp of the first (or last) log line containing `needle` (text log format).
fn log_time(logs: &str, needle: &str, last: bool) -> Option<jiff::Timestamp> {
    let mut lines = logs.lines().filter(|l| l.contains(needle));
    let line = if last {
        lines.next_back()
    } else {
        lines.next()
    }?;
    line.split_whitespace().next()?.parse().ok()
}

/// How many Nodes: `NODES` (default 5000).
fn scale_nodes() -> u32 {
    std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000)
}

/// The i-th Node's pod CIDR and an address in 198.18.0.0/15.
fn scale_node(i: u32, bump: u32) -> (String, String) {
    let host = 10 + i + bump;
    (
        format!("10.{}.{}.0/24", i / 256, i % 256),
        format!("198.18.{}.{}", host / 256, host % 256),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let lab = lab().await;
    let n = scale_nodes();
    let fixtures: Vec<NodeFixture> = (0..n)
        .map(|i| {
            let (cidr, public) = scale_node(i, 0);
            NodeFixture::named(format!("scale-{i:05}"))
                .annotation(PUBLIC_IP, &public)
                .pod_cidrs(&[&cidr])
        })
        .collect();
    let t = Instant::now();
    create_nodes(&lab.env.client, fixtures, 16).await;
    println!(
        "created {n} Nodes with lease annotations in {:?}",
        t.elapsed()
    );

    // Backlog: every lease annotation is present before netcm starts (built beforehand, not timed).
    netcm_e2e::netcm::netcm_binary();
    let started = Instant::now();
    let netcm = lab.start(&[], &[]);
    wait_for(
        "every route of the backlog",
        Duration::from_secs(300),
        || async { (lab.route_count() == n as usize).then_some(()) },
    )
    .await;
    let backlog = started.elapsed();
    // From netcm's own log: informer synced → last route programmed (the route work alone).
    let logs = netcm.logs();
    let synced = log_time(&logs, "caches are synced", false);
    let last_route = log_time(&logs, "programmed route", true);
    let programming = synced
        .zip(last_route)
        .map(|(a, b)| {
            format!(
                "{:.0?}",
                Duration::try_from(b.duration_since(a)).unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "?".into());
    let want: BTreeMap<IpNet, IpAddr> = (0..n)
        .map(|i| {
            let (cidr, public) = scale_node(i, 0);
            (net(&cidr), ip(&public))
        })
        .collect();
    assert_eq!(lab.routes(), want);
    wait_for(
        "every Node to get RouteCreated",
        Duration::from_secs(300),
        || async {
            let c = lab.conditions().await;
            (c.len() == n as usize && c.values().all(|v| *v == created())).then_some(())
        },
    )
    .await;
    let conditions = started.elapsed();

    // Live: every Node's public IP changes while netcm runs; the routes follow.
    let nodes = lab.nodes();
    let t = Instant::now();
    futures::StreamExt::collect::<Vec<_>>(futures::StreamExt::buffer_unordered(
        futures::stream::iter((0..n).map(|i| {
            let nodes = nodes.clone();
            async move {
                let (_, public) = scale_node(i, n);
                let patch = serde_json::json!({"metadata": {"annotations": {PUBLIC_IP: public}}});
                nodes
                    .patch(
                        &format!("scale-{i:05}"),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .expect("patch annotation");
            }
        })),
        16,
    ))
    .await;
    let patched = t.elapsed();
    let want: BTreeMap<IpNet, IpAddr> = (0..n)
        .map(|i| {
            let (cidr, public) = scale_node(i, n);
            (net(&cidr), ip(&public))
        })
        .collect();
    lab.wait_routes(&want, Duration::from_secs(300)).await;
    let live = t.elapsed();
    println!(
        "route-controller with {n} Nodes: backlog (all lease annotations present, netcm started) → all {n} routes programmed in {backlog:.2?} from process start ({programming} from informer synced to the last route, per netcm's log); all conditions RouteCreated after {conditions:.2?}; live gateway change of every Node: annotations PATCHed in {patched:.2?}, all routes replaced {live:.2?} after the first PATCH ({:.2?} after the last)",
        live.saturating_sub(patched)
    );
    assert_eq!(
        netcm.metric("netcm_routes_programmed").await,
        Some(n as f64)
    );
}

//! Route-controller benchmark on the real control plane (run through `hack/bench.sh routes`, as root:
//! it creates a network namespace). N Nodes (`NODES`, default 5000) with lease annotations exist before
//! netcm's route controller starts in the route lab's namespace; prints the time from process start to
//! every route programmed (and, from netcm's log, from informer synced to the last route), to every
//! RouteCreated condition, netcm's peak RSS and CPU seconds by then; the CPU the periodic reconcile
//! costs while nothing changes (`IDLE_SECONDS`, 60, at `ROUTE_PERIOD_SECONDS`, 10: the chart's period);
//! how long until `REPAIR_ROUTES` (1,000) routes deleted at once behind netcm's back are back; and a
//! live change of every Node's gateway.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kube::api::{Patch, PatchParams};
use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::proc_stats::proc_stats;
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

/// The i-th Node's pod CIDR and an address in 198.18.0.0/15 (on-link in the lab; room for two
/// addresses for each of 65,000 Nodes).
fn scale_node(i: u32, bump: u32) -> (String, String) {
    let host = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + 10 + i + bump;
    (
        format!("10.{}.{}.0/24", i / 256, i % 256),
        std::net::Ipv4Addr::from(host).to_string(),
    )
}

/// Deletes netcm's routes to the first `count` Nodes' CIDRs at once (one `ip -batch`), as an operator
/// or another agent flushing routes would.
fn delete_routes(lab: &Lab, count: u32) {
    let dir = tempfile::tempdir().expect("tempdir");
    let batch = dir.path().join("delete.batch");
    let lines: Vec<String> = (0..count)
        .map(|i| format!("route del {} table 100 proto 199", scale_node(i, 0).0))
        .collect();
    std::fs::write(&batch, lines.join("\n") + "\n").expect("write the batch");
    lab.ns.ip(&["-batch", &batch.display().to_string()]);
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
    // Five minutes, and more for more Nodes (50,000 conditions at the chart's 500 writes/s take 100 s).
    let patience = Duration::from_secs(300 + u64::from(n) / 100);
    println!(
        "created {n} Nodes with lease annotations in {:?}",
        t.elapsed()
    );

    // Backlog: every lease annotation is present before netcm starts (built beforehand, not timed).
    netcm_e2e::netcm::netcm_binary();
    let started = Instant::now();
    let period = format!(
        "--route-reconciliation-period={}s",
        netcm_e2e::env_or("ROUTE_PERIOD_SECONDS", 10u64)
    );
    // The chart's client rate: every Node's RouteCreated condition is a write.
    let netcm = lab.start(
        &[
            period.as_str(),
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
        ],
        &[],
    );
    wait_for("every route of the backlog", patience, || async {
        (lab.route_count() == n as usize).then_some(())
    })
    .await;
    let backlog = started.elapsed();
    // From netcm's own log: informer synced → last route programmed (the route work alone).
    let logs = netcm.logs();
    let kept = std::env::temp_dir().join(format!("bench-routes-{}.log", std::process::id()));
    if std::fs::write(&kept, &logs).is_ok() {
        println!(
            "netcm's log to the last route: {} ({} full reconciles after lost notifications)",
            kept.display(),
            logs.matches("route notifications were lost").count()
        );
    }
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
    wait_for("every Node to get RouteCreated", patience, || async {
        let c = lab.conditions().await;
        (c.len() == n as usize && c.values().all(|v| *v == created())).then_some(())
    })
    .await;
    let conditions = started.elapsed();
    let at_conditions = proc_stats(netcm.pid());

    // Idle: nothing changes; what the periodic reconcile costs at this size.
    let idle = Duration::from_secs(netcm_e2e::env_or("IDLE_SECONDS", 60u64));
    let before_idle = proc_stats(netcm.pid());
    tokio::time::sleep(idle).await;
    let idle_cpu = proc_stats(netcm.pid()).cpu_seconds - before_idle.cpu_seconds;

    // Repair: routes deleted behind netcm's back come back.
    let repair_count = (netcm_e2e::env_or("REPAIR_ROUTES", 1000u64) as u32).min(n);
    let t = Instant::now();
    delete_routes(&lab, repair_count);
    let deleted_in = t.elapsed();
    let left = lab.route_count();
    wait_for("the deleted routes to be back", patience, || async {
        (lab.route_count() == n as usize).then_some(())
    })
    .await;
    let repaired = t.elapsed();
    println!(
        "netcm at {n} routes: peak RSS {:.1} MiB, {:.1} CPU seconds to every route and condition; idle {:.0?} at the reconcile period: {idle_cpu:.2} CPU seconds ({:.2} % of a core); {repair_count} routes deleted at once ({left} left, the delete took {deleted_in:.2?}) all back {repaired:.2?} after the delete began",
        at_conditions.peak_rss_mib,
        at_conditions.cpu_seconds,
        idle,
        100.0 * idle_cpu / idle.as_secs_f64()
    );

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
    lab.wait_routes(&want, patience).await;
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

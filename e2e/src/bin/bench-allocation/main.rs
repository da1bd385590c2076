//! Allocation benchmark on the real control plane (run through `hack/bench.sh allocation`); prints
//! markdown tables, asserts nothing about speed.
//!
//! Modes (`MODE=`):
//! - `default`: N (5,000) Nodes of ~8 KB without pod CIDRs (a backlog), then the allocator starts; the
//!   time from its process start until the bench's watch has seen every Node with a CIDR. Contenders,
//!   each on a fresh Node set: the API server's ceiling (concurrent PATCHes, no controller: bare, then
//!   with the bench's watch, then also with a watch of every Node as any informer holds), netcm at its
//!   defaults, without claims and at qps 5000, kube-controller-manager's nodeipam at qps 500 and at its
//!   default qps 20. Then 200 Nodes arriving one at a time: create → CIDR latency.
//! - `scale`: the same backlog at N = 50,000: the ceiling, netcm and KCM at one QPS (default 1000),
//!   ROUNDS times (1), then the median of each round's ratios; NETCM_BIN_BEFORE adds a row for another
//!   netcm build before this one's, to measure a change in one run. NETCM_CONTROLLERS (default
//!   `subnet-allocator`, as KCM runs nodeipam alone) runs netcm with others, e.g. the chart's
//!   `subnet-allocator,node-annotation-syncer`: then the ceiling also makes both writes per Node (the
//!   CIDR, then the lease annotations) and netcm is timed until every Node holds its lease as well.
//!   ROTATE=1 rotates the rows' order from round to round (`scale.rs`).
//! - `churn`: N = 5,000 allocated, then Nodes created and deleted at CHURN_RATE/s for CHURN_SECONDS:
//!   create → CIDR latency against one PATCH round trip, and RSS drift (method in `churn.rs`).
//! - `sizing`: N = 5,000 Nodes with a realistic, seeded mix of `status.capacity.pods`; netcm at a fixed
//!   /24 against netcm sizing CIDRs from pods (/24../28), ROUNDS (3) in alternating order: allocation
//!   time, address space used, prefixes handed out, Nodes per /16 (method in `sizing.rs`).
//! - `failover`: N (5,000) Nodes allocated and leased by one replica, then a SIGTERM hand-over and a
//!   kill -9 takeover to a standby: signal → Lease, → a Node registered at the signal holds its CIDR and
//!   its lease annotations (method in `failover.rs`).
//! - `lived-in`: N (5,000) Nodes allocated by an earlier leader, which goes (SIGTERM, then in a second
//!   round kill -9) leaving its claims; its Nodes deleted, a new backlog of N for the next leader: its
//!   time and writes against the fresh run (method in `lived_in.rs`).
//!
//! Per contender: writes per Node from the API server's audit log, peak RSS (VmHWM), CPU seconds
//! (utime + stime) until the last allocation, and idle CPU in the IDLE_SECONDS after it; per row, the
//! kube-apiserver's CPU seconds over the same time (on 2 cores the API server is the bottleneck).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod ceiling;
mod churn;
mod contenders;
mod failover;
mod fixtures;
mod lived_in;
mod measure;
mod scale;
mod set_watch;
mod sizing;
mod summary;

use std::time::Duration;

use ceiling::{api_ceiling, CeilingLoad, CeilingPatch};
use contenders::{kcm, netcm, run_backlog, runs_syncer, Row};
use measure::{ms, percentile};

/// Settings from the environment (names in capitals in the README).
pub struct Config {
    pub nodes: usize,
    /// Concurrent POSTs creating Nodes.
    pub creators: usize,
    /// Concurrent PATCHes of the API ceiling.
    pub ceiling_clients: usize,
    /// Concurrent PATCHes of an allocator's floor: by default as many as netcm's allocation workers.
    pub floor_clients: usize,
    /// 10.0.0.0/8 with /24 per Node: room for 65,536 Nodes.
    pub cluster_cidr: String,
    /// Appended to every netcm command line (split on whitespace).
    pub netcm_extra_args: String,
    /// Scale mode: netcm's `--controllers`.
    pub netcm_controllers: String,
    /// Longest wait for a backlog to be allocated.
    pub timeout: Duration,
    pub idle: Duration,
    /// Scale mode: the QPS and burst both allocators get.
    pub qps: u32,
    pub burst: u32,
    pub churn_rate: f64,
    pub churn_seconds: f64,
    /// When into churn the "early" RSS is taken (at most half of the churn).
    pub rss_early_seconds: f64,
    /// Scale and sizing modes: how many times the whole set of contenders runs; with more than one, the
    /// medians of the per-round ratios are printed after the rounds' tables.
    pub rounds: usize,
    /// Failover mode: how long a standby stands by before the leader is ended.
    pub standby_seconds: u64,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    netcm_e2e::env_or(name, default)
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

impl Config {
    fn from_env(mode: &str) -> Config {
        let qps = env("QPS", 1000);
        Config {
            nodes: env("NODES", if mode == "scale" { 50_000 } else { 5000 }),
            creators: env("CREATORS", 32),
            ceiling_clients: env("CEILING_CLIENTS", 16),
            floor_clients: env("FLOOR_CLIENTS", 32),
            cluster_cidr: env("CLUSTER_CIDR", "10.0.0.0/8".to_string()),
            netcm_extra_args: env("NETCM_EXTRA_ARGS", String::new()),
            netcm_controllers: env("NETCM_CONTROLLERS", "subnet-allocator".to_string()),
            timeout: Duration::from_secs(env("TIMEOUT_SECONDS", 3600)),
            // Sizing mode reports no idle CPU: a short window only lets the peak RSS settle.
            idle: Duration::from_secs(env("IDLE_SECONDS", if mode == "sizing" { 5 } else { 30 })),
            qps,
            burst: env("BURST", qps * 2),
            churn_rate: env("CHURN_RATE", 20.0),
            churn_seconds: env("CHURN_SECONDS", 300.0),
            rss_early_seconds: env("RSS_EARLY_SECONDS", 60.0),
            rounds: env("ROUNDS", if mode == "sizing" { 3 } else { 1usize }).max(1),
            standby_seconds: env("STANDBY_SECONDS", 10),
        }
    }
}

/// Takes the e2e cluster lock, deletes whatever an interrupted run left, and releases it: the harness's
/// own clean-up (one delete-collection) would outlive its request timeout on tens of thousands of Nodes.
async fn preclean(cfg: &Config) {
    let cp = netcm_e2e::control_plane();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cp.kubeconfig.with_file_name("e2e.lock"))
        .expect("open e2e lock");
    let lock = tokio::task::spawn_blocking(move || {
        lock.lock().expect("take e2e lock");
        lock
    })
    .await
    .unwrap();
    let client = netcm_e2e::client_for(&cp.kubeconfig).await;
    contenders::reset(&client, cfg.nodes).await;
    drop(lock);
}

#[tokio::main]
async fn main() {
    let mode = std::env::var("MODE").unwrap_or_else(|_| "default".into());
    let cfg = Config::from_env(&mode);
    preclean(&cfg).await;
    // Holds the e2e cluster lock for the whole run, so no test shares the API server with the benchmark.
    let env = netcm_e2e::TestEnv::new().await;
    let client = env.client.clone();
    match mode.as_str() {
        "default" => default_mode(&client, &cfg).await,
        "scale" => scale::scale_mode(&client, &cfg).await,
        "churn" => churn_mode(&client, &cfg).await,
        "sizing" => sizing::sizing_mode(&client, &cfg).await,
        "failover" => failover::failover_mode(&client, &cfg).await,
        "lived-in" => lived_in::lived_in_mode(&client, &cfg).await,
        other => {
            panic!("MODE={other}: expected default, scale, churn, sizing, failover or lived-in")
        }
    }
}

/// The ceiling rows: bare first (every ratio is against it), then under the loads contenders carry.
/// With CEILING_JSON_PATCH=1, also bare with PATCHes shaped as netcm's; with ALLOCATOR_FLOOR=1, also
/// an allocator's floor (the list and watch of every Node on the clock, netcm's PATCHes); when netcm runs the
/// node-annotation-syncer, also bare with both writes per Node (the CIDR, then the lease).
async fn ceilings(client: &kube::Client, cfg: &Config) -> Vec<Row> {
    let mut rows = Vec::new();
    for (load, patch) in ceiling_rows(cfg) {
        rows.push(api_ceiling(client, cfg, load, patch).await);
    }
    rows
}

/// What [`ceilings`] runs, in order.
fn ceiling_rows(cfg: &Config) -> Vec<(CeilingLoad, CeilingPatch)> {
    let (smp, json) = (CeilingPatch::Strategic, CeilingPatch::JsonAsNetcm);
    let mut rows = vec![(CeilingLoad::Bare, smp)];
    if runs_syncer(&cfg.netcm_controllers) {
        rows.push((CeilingLoad::Bare, CeilingPatch::TwoWrites));
    }
    if flag("CEILING_JSON_PATCH") {
        rows.push((CeilingLoad::Bare, json));
    }
    if flag("CEILING_PROTOBUF_ANSWER") {
        rows.push((CeilingLoad::Bare, CeilingPatch::StrategicProtobufAnswer));
    }
    if flag("ALLOCATOR_FLOOR") {
        rows.push((CeilingLoad::AllocatorFloor, json));
    }
    if !flag("BARE_CEILING_ONLY") {
        rows.push((CeilingLoad::Observed, smp));
        rows.push((CeilingLoad::Informer, smp));
    }
    rows
}

async fn default_mode(client: &kube::Client, cfg: &Config) {
    let mut rows = ceilings(client, cfg).await;
    rows.push(
        run_backlog(
            client,
            cfg,
            netcm(cfg, "netcm (defaults: qps 500, burst 1000)", &[]),
        )
        .await,
    );
    // What the PodCIDRClaims cost: the same without them.
    let label = "netcm (defaults, --pod-cidr-claims=false)";
    rows.push(run_backlog(client, cfg, netcm(cfg, label, &["--pod-cidr-claims=false"])).await);
    // The client-side limit out of the way: what the allocator itself can do.
    let fast = ["--kube-api-qps=5000", "--kube-api-burst=5000"];
    rows.push(
        run_backlog(
            client,
            cfg,
            netcm(cfg, "netcm (qps 5000, burst 5000)", &fast),
        )
        .await,
    );
    if !flag("ONLY_NETCM") {
        let label = "kube-controller-manager nodeipam (qps 500, burst 1000)";
        rows.push(run_backlog(client, cfg, kcm(cfg, label, 500, 1000)).await);
        if !flag("SKIP_KCM_DEFAULT") {
            let label = "kube-controller-manager nodeipam (defaults: qps 20, burst 30)";
            rows.push(run_backlog(client, cfg, kcm(cfg, label, 20, 30)).await);
        }
    }
    print_table(cfg, &rows);
    compare(
        &rows,
        "netcm (defaults",
        "kube-controller-manager nodeipam (qps 500",
    );
    let by = |needle: &str| rows.iter().find(|r| r.contender.contains(needle));
    if let (Some(n), Some(k)) = (by("netcm (defaults"), by("nodeipam (defaults")) {
        println!(
            "KCM at its defaults / netcm at its defaults: {:.1}× slower",
            k.seconds / n.seconds
        );
    }
    // Nodes arriving one at a time on an empty cluster: 20/s for 10 s, none deleted.
    let one_by_one = churn::churn_run(client, cfg, netcm(cfg, "netcm", &[]), 0, 10.0, false).await;
    let (lat, rtt) = (&one_by_one.create_to_cidr, &one_by_one.patch_rtt);
    println!(
        "\nNode created → pod CIDR set, {} Nodes arriving one at a time (create sent → watch sees \
         spec.podCIDRs): p50 {}, p99 {} (API server, create received → Node write done: p50 {}, p99 {}); \
         one PATCH round trip p50 {}; p99 / PATCH = {:.2}×",
        lat.len(),
        ms(percentile(lat, 0.5)),
        ms(percentile(lat, 0.99)),
        ms(percentile(&one_by_one.server.create_to_write, 0.5)),
        ms(percentile(&one_by_one.server.create_to_write, 0.99)),
        ms(percentile(rtt, 0.5)),
        percentile(lat, 0.99).as_secs_f64() / percentile(rtt, 0.5).as_secs_f64().max(1e-9)
    );
}

async fn churn_mode(client: &kube::Client, cfg: &Config) {
    let secs = cfg.churn_seconds;
    let mut results = vec![
        churn::churn_run(
            client,
            cfg,
            netcm(cfg, "netcm (defaults)", &[]),
            cfg.nodes,
            secs,
            true,
        )
        .await,
    ];
    if flag("CHURN_KCM") {
        let label = "kube-controller-manager nodeipam (qps 500, burst 1000)";
        let k = kcm(cfg, label, 500, 1000);
        results.push(churn::churn_run(client, cfg, k, cfg.nodes, secs, true).await);
    }
    churn::print(cfg, &results);
}

fn print_table(cfg: &Config, rows: &[Row]) {
    let n = cfg.nodes;
    let ceiling = rows[0].seconds;
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(0);
    println!(
        "\nAllocation of a {n}-Node backlog (Nodes of {:.1} KB as the API server returns them), real \
         kube-apiserver, {cores} cores\n",
        fixtures::node_bytes() as f64 / 1000.0
    );
    let two_writes = crate::ceiling::two_writes_seconds(rows);
    println!(
        "| contender | time to allocate all | Nodes/s | × ceiling | every Node holds its lease | × ceiling \
         of two writes | node writes per Node | claim writes per Node | peak RSS MiB | CPU s | idle CPU % | \
         API server CPU s | its checks of every Node | CPU the hypervisor took % |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "–".into());
    for r in rows {
        let is_ceiling = r.stats.is_none();
        println!(
            "| {} | {:.1} s | {:.0} | {:.2} | {} | {} | {:.2} | {} | {} | {} | {} | {:.1} | {} | {:.1} |",
            r.contender,
            r.seconds,
            n as f64 / r.seconds,
            r.seconds / ceiling,
            or_dash(r.leased_seconds.map(|l| format!("{l:.1} s"))),
            or_dash(
                r.leased_seconds
                    .zip(two_writes)
                    .map(|(l, c)| format!("{:.2}", l / c))
            ),
            r.writes.node as f64 / n as f64,
            or_dash((!is_ceiling).then(|| format!("{:.3}", r.writes.claim as f64 / n as f64))),
            or_dash(r.stats.map(|s| format!("{:.1}", s.peak_rss_mib))),
            or_dash(r.stats.map(|s| format!("{:.1}", s.cpu_seconds))),
            or_dash(r.idle_cpu_pct.map(|p| format!("{p:.2}"))),
            r.apiserver_cpu_seconds,
            r.apiserver_node_cache_checks,
            r.stolen_cpu_pct,
        );
    }
    if rows.iter().any(|r| r.apiserver_node_cache_checks > 0) {
        println!(
            "\n(its checks of every Node: kube-apiserver's comparison of its Node cache with etcd, a list of \
             every Node every 5 to 10 minutes; a row it fell in paid for it)"
        );
    }
}

/// Prints netcm's time against the ceilings the round ran, then netcm ÷ KCM for time, peak RSS and CPU,
/// the rows found by label prefix.
fn compare(rows: &[Row], netcm_label: &str, kcm_label: &str) {
    let Some(r) = summary::ratios(rows, netcm_label, kcm_label) else {
        return;
    };
    let cell = |v: Option<f64>| v.map_or("not run".to_string(), |v| format!("{v:.2}×"));
    println!(
        "\nnetcm time ÷ API ceiling {:.2}× (÷ the ceiling with the watches every allocator's run \
         carries: {}; ÷ an allocator's floor: {})",
        r.over_bare,
        cell(r.over_watched),
        cell(r.over_floor),
    );
    if let Some(after) = r.over_bare_after {
        println!(
            "netcm time ÷ the bare ceiling run after it {after:.2}× (÷ the mean of the bare ceiling before and after: {})",
            cell(r.over_bare_around)
        );
    }
    if let Some(after) = r.over_floor_after {
        println!(
            "netcm time ÷ the floor run after it {after:.2}× (÷ the mean of the floor before and after: {})",
            cell(r.over_floor_around)
        );
    }
    let by = |needle: &str| rows.iter().find(|r| r.contender.starts_with(needle));
    let Some(n) = by(netcm_label) else {
        return;
    };
    let Some(k) = by(kcm_label) else {
        return;
    };
    println!(
        "netcm ÷ KCM at equal QPS: time {:.2}×",
        n.seconds / k.seconds
    );
    if let (Some(a), Some(b)) = (n.stats, k.stats) {
        println!(
            "netcm ÷ KCM: peak RSS {:.1} / {:.1} MiB = {:.2}×, CPU {:.1} / {:.1} s = {:.2}×",
            a.peak_rss_mib,
            b.peak_rss_mib,
            a.peak_rss_mib / b.peak_rss_mib,
            a.cpu_seconds,
            b.cpu_seconds,
            a.cpu_seconds / b.cpu_seconds
        );
    }
}

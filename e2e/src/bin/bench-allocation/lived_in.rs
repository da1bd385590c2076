//! A new leader on a lived-in cluster: the claims earlier leaders left cover most of the
//! cluster CIDR, and a backlog of N Nodes waits.
//!
//! Method, once per way the earlier leader goes (SIGTERM, as in a rolling update; kill -9): with nothing
//! left from before (Nodes, claims, Leases deleted, etcd compacted), a backlog of N Nodes is allocated by
//! an "earlier leader" (netcm with the subnet-allocator alone, the scale mode's contender), which is then
//! ended with the signal; its Nodes are deleted, its claims stay (a cluster's Nodes come and go, the
//! claims of the blocks they used remain), etcd is compacted, a new backlog of N Nodes is created, and the
//! next leader starts on it. In the kill round every leader runs with a lease of 3 s ([`SHORT_LEASE`]): the
//! Lease stays, naming the killed leader (whose idle marks the next one trusts only so), and the next
//! leader's wait for it to expire lies within its first list of the Nodes, which every run makes. Rows: time from the process start until the
//! bench's watch has seen every Node of the set with a CIDR, node and claim writes from the audit log
//! (a quarantine's touches are node writes), peak RSS and CPU, kube-apiserver's CPU over the run and per
//! node write, and the ratio to the earlier leader's fresh run of the same round. With NETCM_BIN_BEFORE
//! both rounds run first with that binary.
//!
//! Two identical runs of a round differ by up to 20 % here, the later one slower (the API server and etcd
//! carry the earlier runs' history; see the floor before and after netcm in docs/performance.md), so
//! `FRESH_AFTER=1` runs the earlier leader's fresh backlog once more after the lived-in run, on a cluster
//! reset again, and the table gives the lived-in run over the mean of both fresh runs too. `SIGNALS=TERM`
//! (or `KILL`) runs one round per build instead of both. `RESTART_APISERVER=1` restarts kube-apiserver
//! (not etcd, so the claims stay) before each backlog is created, so no run inherits the server process
//! of the one before. `LIVED_IN_FORGET=claims` (or `lease`) deletes that part of what the earlier leader
//! left before the next one starts, to bisect a gap between the runs.

use std::path::Path;

use crate::contenders::{allocate_backlog_ending, netcm_from, reset, set_name, Row};
use crate::fixtures::{
    compact_etcd, create_nodes, delete_claims, delete_leases, delete_nodes, fresh_apiserver,
};
use crate::Config;

/// One round: the earlier leader's fresh run, and the next leader's on the lived-in cluster.
struct Round {
    build: &'static str,
    signal: &'static str,
    fresh: Row,
    lived_in: Row,
    /// The fresh run once more after the lived-in one (`FRESH_AFTER=1`).
    fresh_after: Option<Row>,
    claims_left: usize,
}

/// How many PodCIDRClaims exist, and how many of them are idle.
async fn claims_now(client: &kube::Client) -> (usize, usize) {
    let list = netcm_e2e::pod_cidr_claims(client)
        .list_metadata(&kube::api::ListParams::default())
        .await
        .expect("list claims");
    let idle =
        list.items
            .iter()
            .filter(|c| {
                c.metadata.annotations.as_ref().is_some_and(|a| {
                    a.contains_key(netcm_subnet_allocator::claims::IDLE_ANNOTATION)
                })
            })
            .count();
    (list.items.len(), idle)
}

/// The lease of every leader of a kill round: the next leader waits it out, within its first list.
const SHORT_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=1s",
];

/// The two leaders of a round, both of the binary `bin`.
struct Build<'a> {
    name: &'static str,
    bin: &'a Path,
}

async fn round(
    client: &kube::Client,
    cfg: &Config,
    build: &Build<'_>,
    signal: &'static str,
    fair: &[&str],
    forget: &[Forget],
) -> Round {
    let mut args = fair.to_vec();
    if signal == "KILL" {
        args.extend(SHORT_LEASE);
    }
    let netcm = |label: &str| netcm_from(build.bin, cfg, label, "subnet-allocator", &args);
    reset(client, cfg.nodes).await;
    fresh_apiserver(client).await;
    let set = set_name(&format!("earlier {signal}"));
    create_nodes(client, &set, cfg.nodes, cfg.creators).await;
    let label = format!(
        "{}: earlier leader, fresh cluster, then {signal}",
        build.name
    );
    let fresh = allocate_backlog_ending(client, cfg, netcm(&label), &set, signal).await;
    delete_nodes(client, cfg.nodes).await;
    if let Some((before, after)) = compact_etcd() {
        eprintln!("[bench] etcd compacted and defragmented: {before:.1} → {after:.1} MiB");
    }
    let (claims_left, idle) = claims_now(client).await;
    eprintln!("[bench] after {signal}: {claims_left} claims left, {idle} of them idle");
    forget_for_bisection(client, forget).await;
    fresh_apiserver(client).await;
    let set = set_name(&format!("lived {signal}"));
    create_nodes(client, &set, cfg.nodes, cfg.creators).await;
    let label = format!(
        "{}: next leader, lived-in cluster, after {signal}",
        build.name
    );
    let lived_in = allocate_backlog_ending(client, cfg, netcm(&label), &set, "KILL").await;
    let fresh_after = if fresh_after_wanted() {
        reset(client, cfg.nodes).await;
        fresh_apiserver(client).await;
        let set = set_name(&format!("again {signal}"));
        create_nodes(client, &set, cfg.nodes, cfg.creators).await;
        let label = format!(
            "{}: fresh cluster again, after the lived-in run",
            build.name
        );
        Some(allocate_backlog_ending(client, cfg, netcm(&label), &set, "KILL").await)
    } else {
        None
    };
    Round {
        build: build.name,
        signal,
        fresh,
        lived_in,
        fresh_after,
        claims_left,
    }
}

/// A part of what the earlier leader left that `LIVED_IN_FORGET` deletes before the next leader's backlog.
#[derive(Clone, Copy, Debug)]
enum Forget {
    Claims,
    Lease,
}

/// What `LIVED_IN_FORGET=claims` (or `lease`, or both, comma-separated) asks to delete: to find which part
/// of what the earlier leader left makes the lived-in run slower. Read before the first run, so a typo
/// stops the bench at once, not after the earlier leader's backlog.
fn forget_wanted() -> Vec<Forget> {
    let wanted = std::env::var("LIVED_IN_FORGET").unwrap_or_default();
    wanted
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| match w {
            "claims" => Forget::Claims,
            "lease" => Forget::Lease,
            other => panic!("LIVED_IN_FORGET={other:?}: expected claims, lease or both"),
        })
        .collect()
}

/// Deletes each part of `forget`.
async fn forget_for_bisection(client: &kube::Client, forget: &[Forget]) {
    for what in forget {
        match what {
            Forget::Claims => delete_claims(client).await,
            Forget::Lease => delete_leases(client).await,
        }
        eprintln!("[bench] LIVED_IN_FORGET: deleted the earlier leader's {what:?}");
    }
}

/// Whether `FRESH_AFTER=1` asks for a fresh run after each lived-in one.
fn fresh_after_wanted() -> bool {
    std::env::var("FRESH_AFTER").is_ok_and(|v| v == "1")
}

/// The rounds `SIGNALS` asks for (`TERM`, `KILL` or both, the default).
fn signals() -> Vec<&'static str> {
    let wanted = std::env::var("SIGNALS").unwrap_or_default();
    let all = ["TERM", "KILL"];
    let picked: Vec<&'static str> = all
        .into_iter()
        .filter(|s| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == *s))
        .collect();
    if picked.is_empty() {
        eprintln!("[bench] SIGNALS={wanted:?} names neither TERM nor KILL; running both");
        return all.to_vec();
    }
    picked
}

/// `MODE=lived-in`: a SIGTERM round and a kill -9 round; first with the binary NETCM_BIN_BEFORE, when set,
/// to measure a change in one run.
pub async fn lived_in_mode(client: &kube::Client, cfg: &Config) {
    let fair = [
        format!("--kube-api-qps={}", cfg.qps),
        format!("--kube-api-burst={}", cfg.burst),
    ];
    let fair: Vec<&str> = fair.iter().map(String::as_str).collect();
    let forget = forget_wanted();
    let before = std::env::var("NETCM_BIN_BEFORE").ok();
    let mut builds = Vec::new();
    if let Some(bin) = &before {
        builds.push(Build {
            name: "before",
            bin: Path::new(bin),
        });
    }
    builds.push(Build {
        name: "this build",
        bin: netcm_e2e::netcm::netcm_binary(),
    });
    let mut rounds = Vec::new();
    for build in &builds {
        for signal in signals() {
            rounds.push(round(client, cfg, build, signal, &fair, &forget).await);
        }
    }
    reset(client, cfg.nodes).await;
    let n = cfg.nodes as f64;
    println!(
        "\n### A new leader on a lived-in cluster: {} Nodes waiting, the earlier leader's claims left (qps {}, burst {})\n",
        cfg.nodes, cfg.qps, cfg.burst
    );
    println!("| build | how the earlier leader went | claims left | run | time to allocate all | ÷ fresh | ÷ mean of fresh before and after | node writes / Node | claim writes / Node | peak RSS MiB | CPU s | kube-apiserver CPU s | server ms / node write |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rounds {
        let mut runs = vec![
            ("fresh cluster (earlier leader)", &r.fresh),
            ("lived-in (next leader)", &r.lived_in),
        ];
        if let Some(after) = &r.fresh_after {
            runs.push(("fresh cluster again, after", after));
        }
        let mean_fresh = r
            .fresh_after
            .as_ref()
            .map(|after| (r.fresh.seconds + after.seconds) / 2.0);
        for (run, row) in runs {
            println!(
                "| {} | {} | {} | {run} | {:.1} s | {:.2} | {} | {:.3} | {:.4} | {} | {} | {:.1} | {:.2} |",
                r.build,
                if r.signal == "TERM" {
                    "SIGTERM"
                } else {
                    "kill -9"
                },
                r.claims_left,
                row.seconds,
                row.seconds / r.fresh.seconds,
                mean_fresh.map_or("–".into(), |m| format!("{:.2}", row.seconds / m)),
                row.writes.node as f64 / n,
                row.writes.claim as f64 / n,
                row.stats
                    .map_or("–".into(), |s| format!("{:.1}", s.peak_rss_mib)),
                row.stats
                    .map_or("–".into(), |s| format!("{:.1}", s.cpu_seconds)),
                row.apiserver_cpu_seconds,
                row.apiserver_cpu_seconds * 1000.0 / row.writes.node.max(1) as f64,
            );
        }
    }
}

//! A fault campaign, run through `hack/chaos.sh`: a benchmark-style program that prints
//! numbers, not a test.
//!
//! Three netcm replicas (the subnet-allocator, a 4 s lease) each in a network namespace of its own, split
//! across two kube-apiservers on one etcd; Nodes created and deleted continuously, ClusterCIDRs added and
//! deleted; and one fault after another, drawn from a seeded generator: the leader frozen or killed, an
//! API server or etcd frozen, delay and loss on a replica's path to its API server, a replica restarted
//! with another configuration, a PodCIDRClaim deleted by hand. A checker watches the Nodes and the Lease
//! throughout; at the end the audit logs of both API servers say which writes landed after their
//! writer's term, and which landed once a successor led (stale). Prints a table, one line per finding
//! (`verdict.rs` says what fails a run), and exits 1 on any finding, 2 when the campaign itself could
//! not run, 130 when interrupted.
//!
//! Environment: `CHAOS_MINUTES` (5), `CHAOS_SEED` (from the clock; printed), `CHAOS_FAULTS` (comma
//! separated kinds, default all: leader-stop, leader-kill, leader-term, apiserver-stop, etcd-stop, path, config,
//! claim-delete), `CHAOS_REPLICAS` (3), `CHAOS_SETTLE_SECONDS` (90), `CHAOS_OUT` (where replica logs and
//! the report go; `_out/chaos/seed-<seed>-<UTC time>`).

#![allow(missing_docs)]

mod checker;
mod faults;
mod replicas;
mod report;
mod rng;
mod terms;
mod verdict;
mod workload;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::api_path;
use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::{client_for, repo_root, TestEnv};
use tokio::sync::{watch, Mutex};

use checker::Checker;
use faults::{Kind, Thaw};
use replicas::Replicas;
use report::{FinalList, Summary};
use terms::Mark;

/// The campaign's settings, from the environment.
struct Settings {
    minutes: f64,
    seed: u64,
    kinds: Vec<Kind>,
    replicas: usize,
    settle: Duration,
    out: PathBuf,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parsed<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match env_var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a valid number")),
    }
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let minutes: f64 = parsed("CHAOS_MINUTES", 5.0)?;
        if !(minutes > 0.0 && minutes <= 24.0 * 60.0) {
            return Err(format!("CHAOS_MINUTES={minutes} must be in (0, 1440]"));
        }
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let seed = parsed("CHAOS_SEED", clock % 1_000_000_000)?;
        let kinds = match env_var("CHAOS_FAULTS") {
            None => Kind::ALL.to_vec(),
            Some(list) => list
                .split(',')
                .map(|k| {
                    Kind::parse(k.trim()).ok_or_else(|| {
                        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                        format!(
                            "CHAOS_FAULTS: unknown kind {k:?} (kinds: {})",
                            names.join(", ")
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if kinds.is_empty() {
            return Err("CHAOS_FAULTS names no fault kind".into());
        }
        let replicas = parsed("CHAOS_REPLICAS", 3usize)?;
        if !(2..=4).contains(&replicas) {
            return Err(format!("CHAOS_REPLICAS={replicas} must be 2, 3 or 4"));
        }
        let settle = Duration::from_secs(parsed("CHAOS_SETTLE_SECONDS", 90u64)?);
        let out = env_var("CHAOS_OUT").map(PathBuf::from).unwrap_or_else(|| {
            let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ");
            repo_root().join(format!("_out/chaos/seed-{seed}-{stamp}"))
        });
        Ok(Settings {
            minutes,
            seed,
            kinds,
            replicas,
            settle,
            out,
        })
    }
}

/// `STATE_DIR` of `hack/controlplane.sh env`: where the pid files are.
fn state_dir() -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(repo_root().join("hack/controlplane.sh"))
        .arg("env")
        .output()
        .map_err(|e| format!("running hack/controlplane.sh env: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("STATE_DIR="))
        .map(PathBuf::from)
        .ok_or_else(|| "hack/controlplane.sh env printed no STATE_DIR".into())
}

/// Every Node through whichever API server answers (3 s each).
async fn list_nodes(clients: &[kube::Client; 2]) -> Option<Vec<Node>> {
    for c in clients {
        let api: Api<Node> = Api::all(c.clone());
        let listed =
            tokio::time::timeout(Duration::from_secs(3), api.list(&ListParams::default())).await;
        if let Ok(Ok(list)) = listed {
            return Some(list.items);
        }
    }
    None
}

/// Whether every Node listed has pod CIDRs; a failed list settles nothing.
fn settled(listed: &Option<Vec<Node>>) -> bool {
    listed.as_ref().is_some_and(|n| without_cidrs(n).is_empty())
}

fn without_cidrs(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| netcm_e2e::nodes::pod_cidrs(n).is_empty())
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

async fn campaign(s: &Settings, stop: watch::Receiver<bool>) -> Result<Summary, String> {
    std::fs::create_dir_all(&s.out).map_err(|e| format!("create {}: {e}", s.out.display()))?;
    // The e2e cluster lock for the whole run: no test shares the API servers with the campaign.
    let env = TestEnv::new().await;
    let servers = tokio::task::spawn_blocking(ApiServers::start)
        .await
        .map_err(|e| format!("starting the second kube-apiserver: {e}"))?;
    let thaw = Thaw::new(&state_dir()?);
    let clients = [
        env.client.clone(),
        client_for(servers.kubeconfig(Apiserver::Two)).await,
    ];
    let marks = [
        Mark::now(servers.audit_log(Apiserver::One)),
        Mark::now(servers.audit_log(Apiserver::Two)),
    ];
    let started = jiff::Timestamp::now();
    let t0 = Instant::now();
    let checker = Checker::start(&clients);
    let (replicas, mechanism) = Replicas::start(s.replicas, &servers, &s.out).await?;
    if let api_path::Mechanism::RelayAndIptables(why) = &mechanism {
        eprintln!(
            "[chaos] tc netem unusable here ({why}): path faults delay in the relay and drop with iptables"
        );
    }
    let replicas = Arc::new(Mutex::new(replicas));
    let first_leader = Instant::now();
    while checker.seen().holder.is_none() {
        if first_leader.elapsed() > Duration::from_secs(60) {
            return Err("no replica took the Lease within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let workload = workload::Workload::start(&clients, s.seed);
    let (supervisor_stop, supervisor_stopped) = watch::channel(false);
    let supervisor = tokio::spawn(faults::supervise(replicas.clone(), t0, supervisor_stopped));

    // A few seconds of Nodes and pools before the first fault, so it finds work in flight.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut rng = rng::Rng::new(s.seed);
    let deadline = t0 + Duration::from_secs_f64(s.minutes * 60.0);
    let mut records = Vec::new();
    {
        let mut ctx = faults::Ctx {
            replicas: replicas.clone(),
            checker: &checker,
            thaw: &thaw,
            clients: clients.clone(),
            stop: stop.clone(),
        };
        while Instant::now() < deadline && !*stop.borrow() {
            let plan = faults::draw(&mut rng, &s.kinds);
            let at = t0.elapsed().as_secs_f64();
            let record = faults::run(&mut ctx, records.len() + 1, &plan).await;
            eprintln!(
                "[chaos] {at:>7.1}s fault #{} {}: {}",
                record.n,
                record.kind.name(),
                record.outcome
            );
            records.push(record);
            let mut stopped = stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(plan.gap) => {}
                _ = stopped.changed() => {}
            }
        }
    }
    thaw.all();
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let workload = workload.stop().await;

    // Settle: no faults, no churn; every Node should get its CIDRs.
    let settling = Instant::now();
    let mut listed = list_nodes(&clients).await;
    while !*stop.borrow() && settling.elapsed() < s.settle && !settled(&listed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        listed = list_nodes(&clients).await;
    }
    let settle_secs = settling.elapsed().as_secs_f64();
    let _ = supervisor_stop.send(true);
    let revived = supervisor.await.unwrap_or(0);
    let starts = {
        let mut r = replicas.lock().await;
        r.shutdown();
        r.starts.clone()
    };
    let seen = checker.stop().await;
    // The audit backend writes as it answers; a moment for the last lines.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = terms::read(&marks)?;
    let terms = terms::terms(&writes, &seen, replicas::LEASE_DURATION);
    let (late, late_completions) = terms::late_writes(&writes, &terms, &seen.cidrs_seen);
    let summary = Summary {
        seed: s.seed,
        minutes,
        kinds: s.kinds.clone(),
        mechanism,
        started,
        faults: records,
        early: terms::early_takeovers(&terms),
        terms,
        sampled_changes: seen.changes().iter().filter(|c| c.to.is_some()).count(),
        overlaps: seen.overlaps.into_values().collect(),
        unparsable: seen.unparsable.into_values().collect(),
        late,
        late_completions,
        final_list: listed.map(|nodes| FinalList {
            total: nodes.len(),
            without_cidrs: without_cidrs(&nodes),
        }),
        settle_secs,
        workload,
        revived,
        starts,
        writes,
        lists: (seen.lists, seen.failed_lists),
        interrupted: *stop.borrow(),
    };
    // Leave the cluster as the tests expect it: no Nodes, pools, claims or Lease of this run.
    drop(replicas);
    env.clean().await;
    drop(servers);
    Ok(summary)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let names: Vec<&str> = settings.kinds.iter().map(|k| k.name()).collect();
    println!(
        "chaos: seed {} (CHAOS_SEED={} CHAOS_MINUTES={} replays this schedule), {} replicas, faults: {}; logs in {}",
        settings.seed,
        settings.seed,
        settings.minutes,
        settings.replicas,
        names.join(","),
        settings.out.display()
    );
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("[chaos] interrupted: undoing the fault, stopping the replicas");
        let _ = stop.send(true);
    });
    let interrupted = stopped.clone();
    let settings = Arc::new(settings);
    let run = tokio::spawn({
        let settings = settings.clone();
        async move { campaign(&settings, stopped).await }
    })
    .await;
    let summary = match run {
        Ok(Ok(summary)) => summary,
        Ok(Err(e)) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("chaos: the campaign failed: {e}");
            return ExitCode::from(2);
        }
    };
    let findings = summary.findings();
    let text = format!(
        "{}\n{}\n{}",
        summary.table(),
        summary.details(),
        verdict::lines(&findings)
    );
    println!("\n{text}");
    let report = settings.out.join("report.txt");
    if let Err(e) = std::fs::write(&report, &text) {
        eprintln!("chaos: writing {}: {e}", report.display());
    }
    let was_interrupted = *interrupted.borrow();
    ExitCode::from(verdict::exit_status(&findings, was_interrupted))
}

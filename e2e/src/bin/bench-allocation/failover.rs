//! Failover at scale, as a user feels it: with N Nodes allocated, the leader is ended and a
//! Node registers at that moment; how long until it holds a pod CIDR and its lease annotations.
//!
//! Method. One backlog of N Nodes is allocated by replica A (the chart's default controllers without
//! the route controller: the allocator and the annotation syncer); then, per hand-over, a standby is
//! started and left to stand by for STANDBY_SECONDS (it is at the Lease, polling), the leader is sent
//! the signal, and at that instant the bench creates a new Node of the set; a second one is created the
//! moment the bench sees the Lease change hands, so only the new leader can serve it (the first may be
//! served by a draining leader). Everything is read on the bench's monotonic clock: the Lease's holder
//! polled every 20 ms (signal → Lease held by the standby), the set's watch (→ each new Node seen with
//! `spec.podCIDRs`), and the second Node polled every 20 ms for the syncer's `kube-subnet-manager`
//! annotation. The first hand-over is SIGTERM (the leader drains and
//! releases the Lease), the second kill -9 (the Lease must expire), both at client-go's default lease
//! (15 s, renew deadline 10 s, retry 2 s). What the new leader does between taking the Lease and serving
//! (a warm standby's catch-up, or a cold one's relist of N Nodes; the claims' quarantine) is in its log,
//! whose path is printed. `NETCM_EXTRA_ARGS=--warm-standby=false` measures a cold standby; give a warm one
//! STANDBY_SECONDS enough to list the N Nodes before the signal.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::contenders::{netcm_from, reset, set_name, spawn, stop, Contender};
use crate::fixtures::{create_node, create_nodes, node_name};
use crate::measure::{ms, proc_stats};
use crate::set_watch::{SetWatch, LEASE_ANNOTATION};
use crate::Config;
use netcm_e2e::{lease_holder, LEASE_NAME};

const POLL: Duration = Duration::from_millis(20);
/// The longest any one step may take before the run gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(900);

/// A replica of netcm with the chart's default controllers (no route controller: no host routes here),
/// run as its image runs it.
fn replica(cfg: &Config, label: &str) -> Contender {
    let fair = [
        format!("--kube-api-qps={}", cfg.qps),
        format!("--kube-api-burst={}", cfg.burst),
    ];
    netcm_from(
        netcm_e2e::netcm::netcm_binary(),
        cfg,
        label,
        "subnet-allocator,node-annotation-syncer",
        &[&fair[0], &fair[1]],
    )
}

/// What one hand-over measured.
struct Handover {
    signal: &'static str,
    /// Signal → the standby holds the Lease.
    to_lease: Duration,
    /// Signal → the Node created at the signal holds its CIDR.
    to_cidr: Duration,
    /// Lease seen changing hands → the Node created then holds its CIDR, and its lease annotation.
    lease_to_cidr: Duration,
    lease_to_annotation: Duration,
    /// The standby's resident set just before the signal: what a warm standby's cache costs.
    standby_rss_mib: f64,
    standby_peak_rss_mib: f64,
    /// The leader's peak resident set (VmHWM) just before the signal: for the first hand-over, what the
    /// chart's controllers peaked at over the whole backlog.
    leader_peak_rss_mib: f64,
    log: String,
}

/// Polls until `check` gives a value, every [`POLL`]; panics naming `what` after [`STEP_TIMEOUT`].
async fn poll<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    netcm_e2e::wait_for_every(what, STEP_TIMEOUT, POLL, check).await
}

/// When the set's watch first saw Node `name` with a pod CIDR, counted from `since`.
fn allocated_since(watch: &SetWatch, name: &str, since: Instant) -> Option<Duration> {
    let seen = watch.seen.lock().unwrap();
    seen.allocated.get(name).map(|at| at.duration_since(since))
}

/// Ends `leader` with `signal` while a new standby stands by, registers Node `probe_index` at that
/// instant and Node `probe_index + 1` when the Lease changes hands, and times the Lease, both CIDRs and
/// the second Node's lease annotation. Returns the new leader.
async fn hand_over(
    client: &kube::Client,
    cfg: &Config,
    set: &str,
    watch: &SetWatch,
    leader: Child,
    signal: &'static str,
    probe_index: usize,
) -> (Handover, Child) {
    let old_holder = poll("the leader to hold the Lease", || {
        lease_holder(client, LEASE_NAME)
    })
    .await;
    let label = format!("standby-{}", signal.to_lowercase());
    let mut c = replica(cfg, &label);
    let log = format!("/tmp/{set}-{label}.log");
    let standby = spawn(&mut c, &format!("{set}-{label}"));
    tokio::time::sleep(Duration::from_secs(cfg.standby_seconds)).await;
    let standby_rss_mib = proc_stats(standby.id()).rss_mib;
    let leader_peak_rss_mib = proc_stats(leader.id()).peak_rss_mib;

    let t0 = Instant::now();
    let status = Command::new("kill")
        .args(["-s", signal, &leader.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {signal} the leader");
    let first = node_name(set, probe_index);
    create_node(client, set, probe_index, &first).await;
    poll("the standby to hold the Lease", || async {
        lease_holder(client, LEASE_NAME)
            .await
            .filter(|h| *h != old_holder)
    })
    .await;
    let to_lease = t0.elapsed();
    let t1 = Instant::now();
    let second = node_name(set, probe_index + 1);
    create_node(client, set, probe_index + 1, &second).await;
    let to_cidr = poll("the first new Node's pod CIDR", || async {
        allocated_since(watch, &first, t0)
    })
    .await;
    let lease_to_cidr = poll("the second new Node's pod CIDR", || async {
        allocated_since(watch, &second, t1)
    })
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let lease_to_annotation = poll("the second new Node's lease annotation", || async {
        let node = nodes.get(&second).await.ok()?;
        let annotations = node.metadata.annotations?;
        annotations
            .contains_key(LEASE_ANNOTATION)
            .then(|| t1.elapsed())
    })
    .await;
    stop(leader);
    let h = Handover {
        signal,
        to_lease,
        to_cidr,
        lease_to_cidr,
        lease_to_annotation,
        standby_rss_mib,
        standby_peak_rss_mib: proc_stats(standby.id()).peak_rss_mib,
        leader_peak_rss_mib,
        log,
    };
    eprintln!(
        "[bench] {signal}: Lease after {}; the Node created at the signal holds its CIDR after {}; from the Lease, the Node created then holds its CIDR after {}, its lease annotation after {}",
        ms(h.to_lease),
        ms(h.to_cidr),
        ms(h.lease_to_cidr),
        ms(h.lease_to_annotation)
    );
    (h, standby)
}

/// `MODE=failover`: N Nodes allocated by one replica, then a SIGTERM hand-over and a kill -9 takeover.
pub async fn failover_mode(client: &kube::Client, cfg: &Config) {
    let set = set_name("failover");
    create_nodes(client, &set, cfg.nodes, cfg.creators).await;
    let watch = SetWatch::start(client, &set).await;
    let mut a = replica(cfg, "leader");
    let started = Instant::now();
    let leader = spawn(&mut a, &format!("{set}-leader"));
    if watch.wait_allocated(cfg.nodes, cfg.timeout).await.is_none() {
        stop(leader);
        panic!(
            "the backlog of {} Nodes was not allocated in time",
            cfg.nodes
        );
    }
    eprintln!(
        "[bench] {} Nodes allocated in {:.1} s",
        cfg.nodes,
        started.elapsed().as_secs_f64()
    );
    // Leases come after the backlog's CIDRs (they give way to it): the hand-overs start on a settled
    // cluster, not behind the syncer's own backlog.
    if watch.wait_leased(cfg.nodes, cfg.timeout).await.is_none() {
        stop(leader);
        panic!("the {} Nodes' leases were not published in time", cfg.nodes);
    }
    eprintln!(
        "[bench] {} Nodes' leases published in {:.1} s",
        cfg.nodes,
        started.elapsed().as_secs_f64()
    );
    let (term, leader) = hand_over(client, cfg, &set, &watch, leader, "TERM", cfg.nodes).await;
    let (kill, leader) = hand_over(client, cfg, &set, &watch, leader, "KILL", cfg.nodes + 2).await;
    stop(leader);

    println!(
        "\n### Failover with {} Nodes allocated (controllers subnet-allocator,node-annotation-syncer; lease 15 s, renew 10 s, retry 2 s; standby waiting {} s)\n",
        cfg.nodes, cfg.standby_seconds
    );
    println!("| how the leader goes | signal → standby holds the Lease | signal → CIDR of a Node created at the signal | Lease → CIDR of a Node created then | Lease → its lease annotation | old leader's peak RSS | standby's RSS before the signal | new leader's peak RSS | new leader's log |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for h in [&term, &kill] {
        let how = match h.signal {
            "TERM" => "SIGTERM (drain, release)",
            _ => "kill -9 (the Lease expires)",
        };
        println!(
            "| {how} | {} | {} | {} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | `{}` |",
            ms(h.to_lease),
            ms(h.to_cidr),
            ms(h.lease_to_cidr),
            ms(h.lease_to_annotation),
            h.leader_peak_rss_mib,
            h.standby_rss_mib,
            h.standby_peak_rss_mib,
            h.log
        );
    }
    drop(watch);
    reset(client, cfg.nodes + 4).await;
}

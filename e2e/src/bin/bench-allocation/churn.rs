//! Steady state: on top of N allocated Nodes, Nodes created and deleted at a fixed rate; how long each
//! new Node waits for its pod CIDR, against one PATCH round trip measured in the same run, and whether
//! the allocator's memory drifts.
//!
//! Method. Both ends are read on the bench's own monotonic clock, so no clock skew enters: the start is
//! the instant just before the bench sends the Node's POST (the API server sets `creationTimestamp`
//! after that, and only to the second, too coarse against milliseconds); the end is the instant the
//! bench's watch on the set delivers the Node with `spec.podCIDRs`. The figure thus holds the create's
//! round trip, the allocator's watch delivery, its work and writes, and the bench's watch delivery: what
//! a kubelet registering a Node would wait. "ADDED → CIDR" subtracts the create and the watch's
//! delivery (both ends seen by the same watch). A third figure needs no watch at all: from the API
//! server receiving the create to the contender's Node write completing, both from the audit log on
//! the API server's clock. The PATCH round trip is a merge PATCH of an annotation
//! of one ~8 KB Node of the set (a real write: the value changes every time), every 250 ms during churn,
//! twice: one after the other (closed loop: a stalled PATCH delays the next, so a 5 s stall of the API
//! server is one sample), and sent on a fixed schedule whatever the one before is doing (open loop, as
//! the creates are sent: a 5 s stall is twenty samples, the same share of the run's PATCHes as of its
//! creates). Only the open-loop figure is a fair baseline for the creates' p99; the closed loop's is
//! kept because earlier runs reported it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

use crate::contenders::{reset, set_name, spawn, stop, Contender};
use crate::fixtures::{create_node, create_nodes, node_name};
use crate::measure::{ms, percentile, proc_stats, AuditMark, ProcStats, ServerSpans};
use crate::set_watch::SetWatch;
use crate::Config;
use netcm_e2e::control_plane;

/// How often the contender's memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How long Nodes created during churn may still take to be allocated after it stops.
const DRAIN: Duration = Duration::from_secs(60);

/// What one churn run measured.
pub struct ChurnResult {
    pub label: String,
    pub base: usize,
    /// Seconds to allocate the base backlog.
    pub backlog_seconds: f64,
    pub created: usize,
    pub deleted: usize,
    /// Create sent → CIDR seen, sorted.
    pub create_to_cidr: Vec<Duration>,
    /// ADDED seen → CIDR seen, sorted.
    pub added_to_cidr: Vec<Duration>,
    /// Create received → the contender's Node write complete, and its parts, from the audit log.
    pub server: ServerSpans,
    /// Churned Nodes never seen with a CIDR (not counting those deleted first).
    pub unallocated: usize,
    /// One PATCH round trip, each sent when the one before returned, sorted.
    pub patch_rtt: Vec<Duration>,
    /// One PATCH round trip, sent on a fixed schedule like the creates, sorted.
    pub patch_rtt_scheduled: Vec<Duration>,
    /// (seconds since churn start, stats) every SAMPLE_EVERY, the last at the end of churn.
    pub samples: Vec<(f64, ProcStats)>,
    pub start: ProcStats,
    pub churn_seconds: f64,
    pub node_writes: usize,
    pub claim_writes: usize,
}

impl ChurnResult {
    /// The RSS sample nearest after `secs` into churn, and the last one.
    pub fn rss_at(&self, secs: f64) -> Option<(f64, f64)> {
        let early = self.samples.iter().find(|(t, _)| *t >= secs)?;
        let last = self.samples.last()?;
        Some((early.1.rss_mib, last.1.rss_mib))
    }
}

/// Runs `c` through churn: `base` Nodes as a backlog, then `cfg.churn_rate` Nodes/s created (and as
/// many of the oldest deleted, if `delete`) for `secs`.
pub async fn churn_run(
    client: &kube::Client,
    cfg: &Config,
    mut c: Contender,
    base: usize,
    secs: f64,
    delete: bool,
) -> ChurnResult {
    let set = set_name(&c.label);
    let api: Api<Node> = Api::all(client.clone());
    create_nodes(client, &set, base, cfg.creators).await;
    let ping = format!("{set}-ping");
    create_node(client, &set, base, &ping).await;
    let watch = SetWatch::start(client, &set).await;
    let started = Instant::now();
    let child = spawn(&mut c, &set);
    let pid = child.id();
    if watch.wait_allocated(base + 1, cfg.timeout).await.is_none() {
        stop(child);
        panic!("{}: the base backlog was not allocated in time", c.label);
    }
    let backlog_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "[bench] {}: {base} Nodes allocated in {backlog_seconds:.1} s; churn for {secs} s",
        c.label
    );

    let stopping = Arc::new(AtomicBool::new(false));
    let pinger = tokio::spawn(ping_loop(client.clone(), ping.clone(), stopping.clone()));
    let scheduled_pinger =
        tokio::spawn(scheduled_ping_loop(client.clone(), ping, stopping.clone()));
    let mark = AuditMark::now(&control_plane().audit_log);
    let inflight = Arc::new(tokio::sync::Semaphore::new(256));
    let sent: Arc<Mutex<Vec<(String, Instant)>>> = Default::default();
    let deleted: Arc<Mutex<Vec<String>>> = Default::default();
    let mut fifo: VecDeque<String> = (0..base).map(|i| node_name(&set, i)).collect();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / cfg.churn_rate));
    let start = proc_stats(pid);
    let churn_start = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = SAMPLE_EVERY;
    let mut k = 0;
    while churn_start.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        if churn_start.elapsed() >= next_sample {
            samples.push((churn_start.elapsed().as_secs_f64(), proc_stats(pid)));
            next_sample += SAMPLE_EVERY;
        }
        let i = base + 1 + k;
        k += 1;
        let name = node_name(&set, i);
        fifo.push_back(name.clone());
        let (client2, set2, sent2) = (client.clone(), set.clone(), sent.clone());
        // Permits are taken here, not in the task, so the drain below waits for every request sent.
        let permit = inflight.clone().acquire_owned().await;
        tokio::spawn(async move {
            let _permit = permit;
            let t0 = Instant::now();
            create_node(&client2, &set2, i, &name).await;
            sent2.lock().unwrap().push((name, t0));
        });
        if delete {
            if let Some(victim) = fifo.pop_front() {
                let (api2, deleted2) = (api.clone(), deleted.clone());
                let permit = inflight.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let _permit = permit;
                    match api2.delete(&victim, &DeleteParams::default()).await {
                        Ok(_) => deleted2.lock().unwrap().push(victim),
                        Err(e) => eprintln!("[bench] delete {victim}: {e}"),
                    }
                });
            }
        }
    }
    let churn_seconds = churn_start.elapsed().as_secs_f64();
    // The end of churn is the last sample, replacing a periodic one taken at (nearly) the same moment.
    if samples
        .last()
        .is_some_and(|(t, _)| churn_seconds - t < SAMPLE_EVERY.as_secs_f64() / 2.0)
    {
        samples.pop();
    }
    samples.push((churn_seconds, proc_stats(pid)));
    stopping.store(true, Ordering::Relaxed);
    let _all = inflight.acquire_many(256).await;
    let mut patch_rtt = pinger.await.unwrap_or_default();
    let mut patch_rtt_scheduled = scheduled_pinger.await.unwrap_or_default();

    let sent = sent.lock().unwrap().clone();
    let deleted: std::collections::HashSet<String> =
        deleted.lock().unwrap().iter().cloned().collect();
    let drain_start = Instant::now();
    while drain_start.elapsed() < DRAIN {
        let waiting = {
            let seen = watch.seen.lock().unwrap();
            sent.iter()
                .any(|(n, _)| !deleted.contains(n) && !seen.allocated.contains_key(n))
        };
        if !waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(child);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = mark.writes(c.ua, "");
    let server = mark.create_to_write(&set, c.ua);
    let mut create_to_cidr = Vec::new();
    let mut added_to_cidr = Vec::new();
    let mut unallocated = 0;
    {
        let seen = watch.seen.lock().unwrap();
        for (name, t0) in &sent {
            match (seen.allocated.get(name), seen.added.get(name)) {
                (Some(t1), Some(ta)) => {
                    create_to_cidr.push(t1.saturating_duration_since(*t0));
                    added_to_cidr.push(t1.saturating_duration_since(*ta));
                }
                _ if deleted.contains(name) => {}
                _ => unallocated += 1,
            }
        }
    }
    drop(watch);
    create_to_cidr.sort();
    added_to_cidr.sort();
    patch_rtt.sort();
    patch_rtt_scheduled.sort();
    reset(client, base + 1 + k).await;
    ChurnResult {
        label: c.label,
        base,
        backlog_seconds,
        created: sent.len(),
        deleted: deleted.len(),
        create_to_cidr,
        added_to_cidr,
        server,
        unallocated,
        patch_rtt,
        patch_rtt_scheduled,
        samples,
        start,
        churn_seconds,
        node_writes: writes.node,
        claim_writes: writes.claim,
    }
}

/// How often each pinger sends a PATCH.
const PING_EVERY: Duration = Duration::from_millis(250);

/// PATCHes annotation `key` of `node` to `value`; the round trip, if it succeeded.
async fn ping(client: &kube::Client, node: &str, key: &str, value: u64) -> Option<Duration> {
    let body = format!(r#"{{"metadata":{{"annotations":{{"bench.netcm.io/{key}":"{value}"}}}}}}"#);
    let req = http::Request::patch(format!("/api/v1/nodes/{node}"))
        .header("content-type", "application/merge-patch+json")
        .body(body.into_bytes())
        .ok()?;
    let t0 = Instant::now();
    client.request_text(req).await.ok()?;
    Some(t0.elapsed())
}

/// PATCHes an annotation of `node` every 250 ms after the one before returned, until `stop`; the round
/// trips.
async fn ping_loop(client: kube::Client, node: String, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut rtts = Vec::new();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        rtts.extend(ping(&client, &node, "ping", k).await);
        tokio::time::sleep(PING_EVERY).await;
    }
    rtts
}

/// PATCHes another annotation of `node` every 250 ms on a fixed schedule, each in its own task so a
/// slow one delays none after it, until `stop`; the round trips of all of them.
async fn scheduled_ping_loop(
    client: kube::Client,
    node: String,
    stop: Arc<AtomicBool>,
) -> Vec<Duration> {
    let mut sent = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(PING_EVERY);
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        k += 1;
        let (client, node) = (client.clone(), node.clone());
        sent.spawn(async move { ping(&client, &node, "scheduled-ping", k).await });
    }
    let mut rtts = Vec::new();
    while let Some(done) = sent.join_next().await {
        rtts.extend(done.ok().flatten());
    }
    rtts
}

/// Prints the churn table, one column per contender.
pub fn print(cfg: &Config, results: &[ChurnResult]) {
    let Some(first) = results.first() else { return };
    let early = cfg.rss_early_seconds.min(first.churn_seconds / 2.0);
    println!(
        "\nChurn: {:.0} Nodes/s created and as many deleted for {:.0} s on top of {} allocated Nodes \
         (~8 KB each), real kube-apiserver\n",
        cfg.churn_rate, first.churn_seconds, first.base
    );
    let header: Vec<&str> = results.iter().map(|r| r.label.as_str()).collect();
    println!("| measure | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(results.len()));
    let row = |name: &str, f: &dyn Fn(&ChurnResult) -> String| {
        let cells: Vec<String> = results.iter().map(f).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    row("base backlog allocated in", &|r| {
        format!("{:.1} s", r.backlog_seconds)
    });
    row("Nodes created / deleted during churn", &|r| {
        format!("{} / {}", r.created, r.deleted)
    });
    row("create → CIDR p50 / p99 / max", &|r| {
        let l = &r.create_to_cidr;
        format!(
            "{} / {} / {}",
            ms(percentile(l, 0.5)),
            ms(percentile(l, 0.99)),
            ms(l.last().copied().unwrap_or_default())
        )
    });
    let p50_p99 =
        |l: &[Duration]| format!("{} / {}", ms(percentile(l, 0.5)), ms(percentile(l, 0.99)));
    row("watch ADDED → CIDR p50 / p99", &|r| {
        p50_p99(&r.added_to_cidr)
    });
    row(
        "API server: create received → Node write done p50 / p99",
        &|r| p50_p99(&r.server.create_to_write),
    );
    row("… the create in the API server p50 / p99", &|r| {
        p50_p99(&r.server.create_in_server)
    });
    row(
        "… create done → the contender's write received (watch, queue, decision) p50 / p99",
        &|r| p50_p99(&r.server.created_to_write_received),
    );
    row(
        "… the contender's write in the API server p50 / p99",
        &|r| p50_p99(&r.server.write_in_server),
    );
    row(
        "one PATCH round trip, each after the one before (closed loop) p50 / p99",
        &|r| p50_p99(&r.patch_rtt),
    );
    row(
        "one PATCH round trip, sent on a schedule like the creates (open loop) p50 / p99",
        &|r| p50_p99(&r.patch_rtt_scheduled),
    );
    // create → CIDR p99 over quantile `q` of one PATCH's round trips `patches`.
    let over = |r: &ChurnResult, patches: &[Duration], q: f64| {
        let p = percentile(patches, q).as_secs_f64().max(1e-9);
        format!(
            "{:.1}×",
            percentile(&r.create_to_cidr, 0.99).as_secs_f64() / p
        )
    };
    row("create → CIDR p99 ÷ PATCH p99, open loop", &|r| {
        over(r, &r.patch_rtt_scheduled, 0.99)
    });
    row("create → CIDR p99 ÷ PATCH p99, closed loop", &|r| {
        over(r, &r.patch_rtt, 0.99)
    });
    row("create → CIDR p99 ÷ PATCH p50, closed loop", &|r| {
        over(r, &r.patch_rtt, 0.5)
    });
    row("not allocated (deleted first excluded)", &|r| {
        r.unallocated.to_string()
    });
    row(
        &format!("RSS at {early:.0} s → end (drift)"),
        &|r| match r.rss_at(early) {
            Some((a, b)) => format!(
                "{a:.1} → {b:.1} MiB ({:+.1} %)",
                (b - a) / a.max(1e-9) * 100.0
            ),
            None => "–".into(),
        },
    );
    row("peak RSS", &|r| {
        let peak = r.samples.last().map(|s| s.1.peak_rss_mib).unwrap_or(0.0);
        format!("{peak:.1} MiB")
    });
    row("CPU during churn", &|r| {
        let cpu = r.samples.last().map(|s| s.1.cpu_seconds).unwrap_or(0.0) - r.start.cpu_seconds;
        format!(
            "{cpu:.1} s ({:.1} % of a core)",
            cpu / r.churn_seconds * 100.0
        )
    });
    row("node / claim writes per created Node", &|r| {
        let n = r.created.max(1) as f64;
        format!(
            "{:.2} / {:.3} ({} claim creates)",
            r.node_writes as f64 / n,
            r.claim_writes as f64 / n,
            r.claim_writes
        )
    });
    for r in results {
        let series: Vec<String> = r
            .samples
            .iter()
            .map(|(t, s)| format!("{t:.0}s {:.1}", s.rss_mib))
            .collect();
        println!(
            "\n{} RSS MiB every {SAMPLE_EVERY:?}: {}",
            r.label,
            series.join(", ")
        );
    }
}

//! The contenders and how one backlog run goes: a fresh set of N Nodes without pod CIDRs, the allocator
//! started, the time until the bench's watch has seen every Node with a CIDR, then its idle cost.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::{create_nodes, delete_everything};
use crate::measure::{node_cache_checks, proc_stats, AuditMark, MachineCpu, ProcStats, Writes};
use crate::set_watch::SetWatch;
use crate::Config;
use netcm_e2e::{apiserver_pid, control_plane, tool, LEASE_NAMESPACE};

/// One line of a backlog table.
pub struct Row {
    pub contender: String,
    pub seconds: f64,
    /// Until the last Node held its lease annotations too, for a contender that writes them.
    pub leased_seconds: Option<f64>,
    pub writes: Writes,
    /// Peak RSS (over allocation and the idle window) and CPU seconds until the last allocation (for
    /// a contender that writes leases too, its CPU until the last lease is in the run's log).
    pub stats: Option<ProcStats>,
    pub idle_cpu_pct: Option<f64>,
    /// kube-apiserver's CPU seconds from the start until the last timed write was seen.
    pub apiserver_cpu_seconds: f64,
    /// kube-apiserver's checks of its Node cache against etcd over the same span
    /// ([`crate::measure::node_cache_checks`]).
    pub apiserver_node_cache_checks: u64,
    /// The share of the machine's CPU time the hypervisor took over the same span, in percent.
    pub stolen_cpu_pct: f64,
}

/// A controller to start as a child process.
pub struct Contender {
    pub label: String,
    pub cmd: Command,
    /// What its requests' user agent contains, to find its writes in the audit log.
    pub ua: &'static str,
    /// Whether it writes flannel's lease annotations (runs the node-annotation-syncer): then it is timed
    /// until every Node holds them too.
    pub leases: bool,
}

/// Whether a `--controllers` value starts the node-annotation-syncer.
pub fn runs_syncer(controllers: &str) -> bool {
    let entries: Vec<String> = controllers
        .split(',')
        .map(|e| e.trim().to_owned())
        .collect();
    netcm_node_annotation_syncer::is_enabled(&entries)
}

/// netcm with only the subnet allocator, the bench's cluster CIDR, `extra` args and then NETCM_EXTRA_ARGS.
pub fn netcm(cfg: &Config, label: &str, extra: &[&str]) -> Contender {
    netcm_from(
        netcm_e2e::netcm::netcm_binary(),
        cfg,
        label,
        "subnet-allocator",
        extra,
    )
}

/// netcm from the binary at `bin` (another build, to compare before and after in one run) running
/// `controllers`, as [`netcm`] otherwise.
pub fn netcm_from(
    bin: &std::path::Path,
    cfg: &Config,
    label: &str,
    controllers: &str,
    extra: &[&str],
) -> Contender {
    let mut cmd = Command::new(bin);
    cmd.args([
        &format!("--kubeconfig={}", control_plane().kubeconfig.display()),
        &format!("--controllers={controllers}"),
        &format!("--cluster-cidr={}", cfg.cluster_cidr),
        &format!("--leader-elect-resource-namespace={LEASE_NAMESPACE}"),
        "--port=0",
    ]);
    cmd.args(extra);
    cmd.args(cfg.netcm_extra_args.split_whitespace());
    Contender {
        label: label.to_string(),
        cmd,
        ua: "netcm/",
        leases: runs_syncer(controllers),
    }
}

/// kube-controller-manager running nodeipam alone, at `qps`/`burst`.
pub fn kcm(cfg: &Config, label: &str, qps: u32, burst: u32) -> Contender {
    let mut cmd = Command::new(tool("kube-controller-manager"));
    cmd.args([
        &format!("--kubeconfig={}", control_plane().kubeconfig.display()),
        "--controllers=nodeipam",
        "--allocate-node-cidrs=true",
        &format!("--cluster-cidr={}", cfg.cluster_cidr),
        "--node-cidr-mask-size=24",
        "--leader-elect=false",
        "--secure-port=0",
        "--use-service-account-credentials=false",
        &format!("--kube-api-qps={qps}"),
        &format!("--kube-api-burst={burst}"),
    ]);
    Contender {
        label: label.to_string(),
        cmd,
        ua: "kube-controller-manager",
        leases: false,
    }
}

/// A set name unique to this run and contender: `bench-<slug>-<seconds>`.
pub fn set_name(label: &str) -> String {
    let slug: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join("-");
    format!(
        "bench-{slug}-{}",
        jiff::Timestamp::now().as_second() % 100_000
    )
}

/// Spawns the contender with its output in /tmp/<set>.log.
pub fn spawn(c: &mut Contender, set: &str) -> Child {
    let log_path = format!("/tmp/{set}.log");
    let log = std::fs::File::create(&log_path).unwrap();
    eprintln!("[bench] starting {} (log: {log_path})", c.label);
    c.cmd
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", c.label))
}

/// Ends a contender with `signal` and reaps it (kill -9 after 60 s).
pub fn stop_with(mut child: Child, signal: &str) {
    if signal != "KILL" {
        let _ = Command::new("kill")
            .args(["-s", signal, &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("[bench] still running 60 s after SIGTERM: killing it");
    }
    stop(child);
}

/// Stops a contender and reaps it.
pub fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Between contenders: every Node, claim and Lease deleted, etcd compacted.
/// `max_index`: the highest Node index any set of the run used, so every chunk label is covered.
pub async fn reset(client: &kube::Client, max_index: usize) {
    delete_everything(client, max_index).await;
    match crate::fixtures::compact_etcd() {
        Some((before, after)) => {
            eprintln!("[bench] etcd compacted and defragmented: {before:.1} → {after:.1} MiB")
        }
        None => eprintln!("[bench] etcd compaction skipped (etcd's HTTP gateway did not answer)"),
    }
}

/// Runs one contender on a fresh backlog of `cfg.nodes` Nodes.
pub async fn run_backlog(client: &kube::Client, cfg: &Config, c: Contender) -> Row {
    let set = set_name(&c.label);
    create_nodes(client, &set, cfg.nodes, cfg.creators).await;
    let row = allocate_backlog(client, cfg, c, &set).await;
    reset(client, cfg.nodes).await;
    row
}

/// Starts the contender on the backlog `set` of `cfg.nodes` Nodes, created already, and measures it
/// until every Node has a CIDR and through the idle window; stops it (kill -9) and leaves the Nodes as
/// they are (the caller may read them before [`reset`]).
pub async fn allocate_backlog(client: &kube::Client, cfg: &Config, c: Contender, set: &str) -> Row {
    allocate_backlog_ending(client, cfg, c, set, "KILL").await
}

/// [`allocate_backlog`], the contender ended with `signal` (`TERM`: it steps down as it would in a
/// rolling update; `KILL`: it dies).
pub async fn allocate_backlog_ending(
    client: &kube::Client,
    cfg: &Config,
    mut c: Contender,
    set: &str,
    signal: &str,
) -> Row {
    let n = cfg.nodes;
    let watch = SetWatch::start(client, set).await;
    let mark = AuditMark::now(&control_plane().audit_log);
    let apiserver = apiserver_pid();
    let apiserver_cpu = proc_stats(apiserver).cpu_seconds;
    let cache_checks = node_cache_checks(client).await;
    let machine = MachineCpu::now();
    let start = Instant::now();
    let child = spawn(&mut c, set);
    let Some(finished) = watch.wait_allocated(n, cfg.timeout).await else {
        let done = watch.allocated();
        stop(child);
        panic!(
            "{}: only {done} of {n} Nodes allocated after {:?}",
            c.label, cfg.timeout
        );
    };
    let at_finish = proc_stats(child.id());
    let pace = watch.allocation_pace();
    let leased = if c.leases {
        let Some(leased) = watch.wait_leased(n, cfg.timeout).await else {
            stop(child);
            panic!(
                "{}: not every Node holds its lease after {:?}",
                c.label, cfg.timeout
            );
        };
        Some(leased)
    } else {
        None
    };
    let at_leased = proc_stats(child.id());
    let apiserver_cpu_seconds = proc_stats(apiserver).cpu_seconds - apiserver_cpu;
    let apiserver_node_cache_checks = node_cache_checks(client).await - cache_checks;
    let stolen_cpu_pct = MachineCpu::now().stolen_pct_since(&machine);
    // Idle cost: every Node allocated, nothing to do; the cache of N Nodes stays watched.
    tokio::time::sleep(cfg.idle).await;
    let after_idle = proc_stats(child.id());
    stop_with(child, signal);
    let seconds = finished.duration_since(start).as_secs_f64();
    let leased_seconds = leased.map(|l| l.duration_since(start).as_secs_f64());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = mark.writes(c.ua, "");
    drop(watch);
    let stats = ProcStats {
        peak_rss_mib: after_idle.peak_rss_mib,
        ..at_finish
    };
    let idle_cpu_pct =
        (after_idle.cpu_seconds - at_leased.cpu_seconds) / cfg.idle.as_secs_f64() * 100.0;
    eprintln!(
        "[bench] {}: {seconds:.1} s (leases: {leased_seconds:.1?} s, CPU until then {:.1} s), {} node writes, {} claim writes ({} refused), peak RSS {:.1} MiB, \
         CPU {:.1} s, idle CPU {idle_cpu_pct:.2} %, CIDRs {pace}",
        c.label, at_leased.cpu_seconds, writes.node, writes.claim, writes.failed, stats.peak_rss_mib, stats.cpu_seconds
    );
    Row {
        contender: c.label,
        seconds,
        leased_seconds,
        writes,
        stats: Some(stats),
        idle_cpu_pct: Some(idle_cpu_pct),
        apiserver_cpu_seconds,
        apiserver_node_cache_checks,
        stolen_cpu_pct,
    }
}

#[cfg(test)]
mod tests {
    use super::runs_syncer;

    #[test]
    fn the_charts_controllers_and_every_controller_run_the_syncer() {
        assert!(runs_syncer("subnet-allocator,node-annotation-syncer"));
        assert!(runs_syncer("*"));
        assert!(runs_syncer("*,-route-controller"));
    }

    #[test]
    fn the_allocator_alone_or_the_syncer_turned_off_does_not() {
        assert!(!runs_syncer("subnet-allocator"));
        assert!(!runs_syncer("*,-node-annotation-syncer"));
    }

    #[test]
    fn the_syncer_named_by_its_alias_runs_and_the_first_entry_naming_it_wins() {
        assert!(runs_syncer("subnet-allocator,annotations"));
        assert!(!runs_syncer("*,-annotations"));
        assert!(runs_syncer("node-annotation-syncer,-annotations"));
        assert!(!runs_syncer("-node-annotation-syncer,*"));
    }
}

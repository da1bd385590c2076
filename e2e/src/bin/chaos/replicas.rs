//! The netcm replicas: each in a network namespace of its own (so its path to the API server can be
//! degraded), talking to one of the two API servers; started, signalled, restarted with another
//! configuration, and revived after they exit, as a Deployment would. Every process ever started is
//! remembered with its leader-election identity, so the report can name the replica, API server and
//! configuration behind any write in the audit logs. Each process's log is kept in the output directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::netns::{NetNs, NetnsNetcm};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use netcm_e2e::api_path::{self, apiserver_port, ApiPath, Mechanism};

/// Lease settings short enough for a leader change every few seconds: 4 s lease, 3 s renew deadline, 1 s
/// retry period (whole seconds for the lease, as netcm requires).
pub const LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// The lease duration of [`LEASE`].
pub const LEASE_DURATION: Duration = Duration::from_secs(4);

/// A replica's configuration of the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// The configuration every replica starts with: 10.0.0.0/16, /24 per Node, claims on.
    Base,
    /// `--pod-cidr-claims=false`.
    ClaimsOff,
    /// /25 per Node in the same cluster CIDR.
    Mask25,
    /// A cluster CIDR that contains the base one (10.0.0.0/15).
    WideCidr,
    /// A cluster CIDR beside the base one (10.2.0.0/16).
    OtherCidr,
}

impl Variant {
    /// Every variant other than [`Variant::Base`], for the configuration fault to choose from.
    pub const OTHERS: [Variant; 4] = [
        Variant::ClaimsOff,
        Variant::Mask25,
        Variant::WideCidr,
        Variant::OtherCidr,
    ];

    /// A short name for tables and labels.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Base => "base",
            Variant::ClaimsOff => "claims-off",
            Variant::Mask25 => "mask-25",
            Variant::WideCidr => "cidr-10.0.0.0/15",
            Variant::OtherCidr => "cidr-10.2.0.0/16",
        }
    }

    /// The allocator's flags for this variant.
    fn args(self) -> [&'static str; 3] {
        let cidr = match self {
            Variant::WideCidr => "--cluster-cidr=10.0.0.0/15",
            Variant::OtherCidr => "--cluster-cidr=10.2.0.0/16",
            _ => "--cluster-cidr=10.0.0.0/16",
        };
        let mask = match self {
            Variant::Mask25 => "--node-cidr-mask-size=25",
            _ => "--node-cidr-mask-size=24",
        };
        let claims = match self {
            Variant::ClaimsOff => "--pod-cidr-claims=false",
            _ => "--pod-cidr-claims=true",
        };
        [cidr, mask, claims]
    }
}

/// One process ever started.
#[derive(Debug, Clone)]
pub struct Start {
    pub label: String,
    pub identity: String,
    pub server: Apiserver,
    pub variant: Variant,
}

/// One replica position: a namespace, its path to an API server, and the process running there now.
struct Slot {
    // Dropped in this order: the process, then its path, then the namespace.
    process: Option<NetnsNetcm>,
    path: ApiPath,
    ns: NetNs,
    server: Apiserver,
    kubeconfig: PathBuf,
    variant: Variant,
    identity: String,
    label: String,
    generation: usize,
}

/// Every replica.
pub struct Replicas {
    slots: Vec<Slot>,
    /// Every process started, in order.
    pub starts: Vec<Start>,
    log_dir: PathBuf,
}

impl Replicas {
    /// Creates `count` namespaces (replica i on API server 1 when i is even, 2 when odd) and starts a
    /// base replica in each. The first namespace is also where `tc netem` is probed.
    pub async fn start(
        count: usize,
        servers: &ApiServers,
        log_dir: &Path,
    ) -> Result<(Replicas, Mechanism), String> {
        let mut replicas = Replicas {
            slots: Vec::new(),
            starts: Vec::new(),
            log_dir: log_dir.to_path_buf(),
        };
        let mut mechanism = None;
        for index in 0..count {
            let server = if index % 2 == 0 {
                Apiserver::One
            } else {
                Apiserver::Two
            };
            let kubeconfig = servers.kubeconfig(server).to_path_buf();
            let ns = NetNs::create();
            let m = mechanism
                .get_or_insert_with(|| api_path::probe_netem(&ns))
                .clone();
            let path = ApiPath::open(&ns, apiserver_port(&kubeconfig)?, m)?;
            replicas.slots.push(Slot {
                process: None,
                path,
                ns,
                server,
                kubeconfig,
                variant: Variant::Base,
                identity: String::new(),
                label: String::new(),
                generation: 0,
            });
            replicas.spawn(index, Variant::Base).await?;
        }
        let mechanism = mechanism.ok_or("no replicas")?;
        Ok((replicas, mechanism))
    }

    /// How many replica positions there are.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The position whose current process has `identity`.
    pub fn slot_of(&self, identity: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.process.is_some() && s.identity == identity)
    }

    /// The API server replica `slot` talks to.
    pub fn server(&self, slot: usize) -> Apiserver {
        self.slots[slot].server
    }

    /// The path between replica `slot` and its API server.
    pub fn path(&self, slot: usize) -> &ApiPath {
        &self.slots[slot].path
    }

    /// `r1 (kube-apiserver 2, base)`.
    pub fn describe(&self, slot: usize) -> String {
        let s = &self.slots[slot];
        format!("{} ({}, {})", s.label, s.server, s.variant.name())
    }

    /// Sends `signal` to replica `slot`'s process (a process already gone is no error).
    pub fn signal(&self, slot: usize, signal: Signal) {
        if let Some(p) = &self.slots[slot].process {
            if let Ok(pid) = i32::try_from(p.pid()) {
                let _ = kill(Pid::from_raw(pid), signal);
            }
        }
    }

    /// Ends replica `slot`'s process — SIGTERM first when `graceful` (it may release the Lease), then
    /// SIGKILL after 15 s — and starts `variant` in its place.
    pub async fn restart(
        &mut self,
        slot: usize,
        variant: Variant,
        graceful: bool,
    ) -> Result<(), String> {
        if graceful {
            self.signal(slot, Signal::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(15) {
                let exited = self.slots[slot]
                    .process
                    .as_mut()
                    .is_none_or(|p| p.try_exit().is_some());
                if exited {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.spawn(slot, variant).await
    }

    /// Starts a base replica wherever the process has exited; returns `(slot, exit status)` of each.
    pub async fn revive_exited(&mut self) -> Vec<(usize, String)> {
        let mut revived = Vec::new();
        for slot in 0..self.slots.len() {
            let status = self.slots[slot].process.as_mut().and_then(|p| p.try_exit());
            if let Some(status) = status {
                let was = self.describe(slot);
                match self.spawn(slot, Variant::Base).await {
                    Ok(()) => revived.push((slot, format!("{was} exited ({status})"))),
                    Err(e) => revived.push((slot, format!("{was} exited ({status}); {e}"))),
                }
            }
        }
        revived
    }

    /// Replaces slot `slot`'s process (killed, its log kept) with a new one of `variant`, and waits for
    /// its identity.
    async fn spawn(&mut self, slot: usize, variant: Variant) -> Result<(), String> {
        self.retire(slot);
        let s = &mut self.slots[slot];
        s.generation += 1;
        s.variant = variant;
        s.label = format!(
            "r{slot}-{}-{}",
            s.generation,
            variant.name().replace('/', "_")
        );
        let mut args = vec!["--controllers=subnet-allocator"];
        args.extend_from_slice(&variant.args());
        args.extend_from_slice(&LEASE);
        let process = NetnsNetcm::start(&s.label, &s.ns, &s.kubeconfig, &args, &[]);
        record_pid(process.pid());
        let identity = read_identity(&process).await;
        s.process = Some(process);
        let identity = identity.map_err(|e| format!("{}: {e}", s.label))?;
        s.identity = identity.clone();
        self.starts.push(Start {
            label: s.label.clone(),
            identity,
            server: s.server,
            variant,
        });
        Ok(())
    }

    /// Kills slot `slot`'s process, if any, and keeps its log.
    fn retire(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if let Some(p) = s.process.take() {
            let dest = self.log_dir.join(format!("{}.log", s.label));
            if let Err(e) = std::fs::copy(&p.log_path, &dest) {
                eprintln!(
                    "[chaos] keeping {}'s log as {}: {e}",
                    s.label,
                    dest.display()
                );
            }
            drop(p);
        }
    }

    /// Kills every process and keeps their logs; the namespaces go when `self` is dropped.
    pub fn shutdown(&mut self) {
        for slot in 0..self.slots.len() {
            // A frozen process dies of SIGKILL too, but thaw it so nothing is left half-done.
            self.signal(slot, Signal::SIGCONT);
            self.retire(slot);
        }
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Appends `pid` to the file `CHAOS_PIDS` names, if any: `hack/chaos.sh` ends the replicas listed there
/// if this program is killed before it can.
fn record_pid(pid: u32) {
    use std::io::Write;
    let Some(path) = std::env::var_os("CHAOS_PIDS") else {
        return;
    };
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{pid}"));
    if let Err(e) = appended {
        eprintln!(
            "[chaos] recording pid {pid} in {}: {e}",
            path.to_string_lossy()
        );
    }
}

/// The identity from the process's `starting netcm` log record, waiting up to 15 s.
async fn read_identity(process: &NetnsNetcm) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let found = process.logs().lines().find_map(|l| {
            let rest = l.split(" identity=").nth(1)?;
            Some(
                rest.split_whitespace()
                    .next()?
                    .trim_matches('"')
                    .to_string(),
            )
        });
        if let Some(id) = found {
            return Ok(id);
        }
        if started.elapsed() > Duration::from_secs(15) {
            let logs = process.logs();
            let tail: Vec<&str> = logs.lines().rev().take(5).collect();
            return Err(format!("logged no identity in 15 s; last lines: {tail:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

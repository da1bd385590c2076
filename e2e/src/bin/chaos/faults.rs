//! The faults: one at a time, each drawn from the seeded generator (kind, how long it lasts, target pick, variant,
//! delay, loss, gap — always the same number of draws, so a seed replays the same schedule; which
//! replica leads when a fault comes is the cluster's doing). Every fault is undone before the next one
//! starts and when the campaign stops; [`Thaw`] also thaws etcd and both API servers when dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, ListParams};
use netcm_e2e::apiservers::Apiserver;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::sync::{watch, Mutex};

use crate::checker::Checker;
use crate::replicas::{Replicas, Variant};
use crate::rng::Rng;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    LeaderStop,
    LeaderKill,
    LeaderTerm,
    ApiserverStop,
    EtcdStop,
    Path,
    Config,
    ClaimDelete,
}

impl Kind {
    /// Every kind, in table order.
    pub const ALL: [Kind; 8] = [
        Kind::LeaderStop,
        Kind::LeaderKill,
        Kind::LeaderTerm,
        Kind::ApiserverStop,
        Kind::EtcdStop,
        Kind::Path,
        Kind::Config,
        Kind::ClaimDelete,
    ];

    /// The name `CHAOS_FAULTS` uses.
    pub fn name(self) -> &'static str {
        match self {
            Kind::LeaderStop => "leader-stop",
            Kind::LeaderKill => "leader-kill",
            Kind::LeaderTerm => "leader-term",
            Kind::ApiserverStop => "apiserver-stop",
            Kind::EtcdStop => "etcd-stop",
            Kind::Path => "path",
            Kind::Config => "config",
            Kind::ClaimDelete => "claim-delete",
        }
    }

    /// What it does, for the table.
    pub fn what(self) -> &'static str {
        match self {
            Kind::LeaderStop => "leader SIGSTOP, SIGCONT",
            Kind::LeaderKill => "leader SIGKILL, restarted",
            Kind::LeaderTerm => "leader SIGTERM, restarted",
            Kind::ApiserverStop => "an API server SIGSTOP, SIGCONT",
            Kind::EtcdStop => "etcd SIGSTOP, SIGCONT",
            Kind::Path => "delay/loss replica-API server",
            Kind::Config => "replica restarted, other config",
            Kind::ClaimDelete => "PodCIDRClaim deleted by hand",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// How long it lasts, the range in milliseconds.
    fn duration_range(self) -> (u64, u64) {
        match self {
            Kind::LeaderStop | Kind::ApiserverStop => (1_000, 8_000),
            Kind::EtcdStop => (1_000, 5_000),
            Kind::Path => (4_000, 10_000),
            Kind::LeaderKill | Kind::LeaderTerm | Kind::Config | Kind::ClaimDelete => (0, 0),
        }
    }
}

/// One fault, drawn before it is known who leads.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: Kind,
    pub lasts: Duration,
    /// Chooses the target: mostly the leader or its API server, otherwise by this number.
    pub pick: u64,
    pub variant: Variant,
    pub delay: Duration,
    pub loss_percent: u64,
    /// The pause after this fault ends, before the next one.
    pub gap: Duration,
}

/// Draws the next fault among `kinds`.
pub fn draw(rng: &mut Rng, kinds: &[Kind]) -> Plan {
    let kind = kinds[rng.below(kinds.len() as u64) as usize];
    let frac = rng.below(1001);
    let (lo, hi) = kind.duration_range();
    Plan {
        kind,
        lasts: Duration::from_millis(lo + (hi - lo) * frac / 1000),
        pick: rng.next_u64(),
        variant: Variant::OTHERS[rng.below(Variant::OTHERS.len() as u64) as usize],
        delay: rng.millis(100, 1_500),
        loss_percent: rng.below(41),
        gap: rng.millis(1_000, 3_000),
    }
}

/// A fault that happened.
#[derive(Debug, Clone)]
pub struct Record {
    pub n: usize,
    pub kind: Kind,
    pub start: jiff::Timestamp,
    pub end: jiff::Timestamp,
    pub outcome: Outcome,
}

/// Whether a fault was applied. Kept as data, not folded into a line of text, because a fault that did
/// not apply means the campaign tested less than it says, and the verdict fails the run on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// What was done.
    Applied(String),
    /// Why it could not be done (or undone).
    Failed(String),
}

impl Outcome {
    pub fn failed(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Applied(d) => f.write_str(d),
            Outcome::Failed(e) => write!(f, "FAILED to apply: {e}"),
        }
    }
}

/// Sends SIGCONT to etcd and both API servers when dropped (and on [`Thaw::all`]).
pub struct Thaw {
    state_dir: PathBuf,
}

impl Thaw {
    pub fn new(state_dir: &Path) -> Thaw {
        Thaw {
            state_dir: state_dir.to_path_buf(),
        }
    }

    /// The pid in `<state dir>/<name>.pid`.
    pub fn pid(&self, name: &str) -> Result<Pid, String> {
        let path = self.state_dir.join(format!("{name}.pid"));
        std::fs::read_to_string(&path)
            .map_err(|e| format!("read {}: {e}", path.display()))?
            .trim()
            .parse()
            .map(Pid::from_raw)
            .map_err(|e| format!("pid in {}: {e}", path.display()))
    }

    /// Thaws every control plane process.
    pub fn all(&self) {
        for name in ["etcd", "kube-apiserver", "kube-apiserver2"] {
            if let Ok(pid) = self.pid(name) {
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
    }
}

impl Drop for Thaw {
    fn drop(&mut self) {
        self.all();
    }
}

/// What the faults act on.
pub struct Ctx<'a> {
    pub replicas: Arc<Mutex<Replicas>>,
    pub checker: &'a Checker,
    pub thaw: &'a Thaw,
    pub clients: [kube::Client; 2],
    pub stop: watch::Receiver<bool>,
}

impl Ctx<'_> {
    /// The replica that leads now (per the Lease; waiting up to 8 s for a running one to hold it), or
    /// the one `pick` names; and whether it leads.
    async fn leader_or(&self, pick: u64) -> (usize, bool) {
        let waiting = std::time::Instant::now();
        loop {
            let holder = self.checker.seen().holder.clone();
            let replicas = self.replicas.lock().await;
            if let Some(slot) = holder.and_then(|h| replicas.slot_of(&h)) {
                return (slot, true);
            }
            if waiting.elapsed() > Duration::from_secs(8) || *self.stop.borrow() {
                return ((pick % replicas.len() as u64) as usize, false);
            }
            drop(replicas);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sleeps `d`, or less if the campaign stops.
    async fn last(&mut self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.changed() => {}
        }
    }

    /// Freezes `process` (a control plane pid file name) for `lasts`.
    async fn freeze(&mut self, name: &str, lasts: Duration) -> Result<(), String> {
        let pid = self.thaw.pid(name)?;
        kill(pid, Signal::SIGSTOP).map_err(|e| format!("SIGSTOP {name}: {e}"))?;
        self.last(lasts).await;
        kill(pid, Signal::SIGCONT).map_err(|e| format!("SIGCONT {name}: {e}"))
    }
}

/// Runs fault `n` of `plan`; what it did.
pub async fn run(ctx: &mut Ctx<'_>, n: usize, plan: &Plan) -> Record {
    let start = jiff::Timestamp::now();
    let outcome = match act(ctx, plan).await {
        Ok(d) => Outcome::Applied(d),
        Err(e) => Outcome::Failed(e),
    };
    Record {
        n,
        kind: plan.kind,
        start,
        end: jiff::Timestamp::now(),
        outcome,
    }
}

async fn act(ctx: &mut Ctx<'_>, plan: &Plan) -> Result<String, String> {
    let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    let role = |leads: bool| {
        if leads {
            "leader"
        } else {
            "no known leader; picked"
        }
    };
    match plan.kind {
        Kind::LeaderStop => {
            let (slot, leads) = ctx.leader_or(plan.pick).await;
            let who = {
                let r = ctx.replicas.lock().await;
                r.signal(slot, Signal::SIGSTOP);
                r.describe(slot)
            };
            ctx.last(plan.lasts).await;
            ctx.replicas.lock().await.signal(slot, Signal::SIGCONT);
            Ok(format!("{} {who} for {}", role(leads), secs(plan.lasts)))
        }
        Kind::LeaderKill => {
            let (slot, leads) = ctx.leader_or(plan.pick).await;
            let r = ctx.replicas.lock().await;
            r.signal(slot, Signal::SIGKILL);
            Ok(format!("{} {}", role(leads), r.describe(slot)))
        }
        Kind::LeaderTerm => {
            let (slot, leads) = ctx.leader_or(plan.pick).await;
            let r = ctx.replicas.lock().await;
            r.signal(slot, Signal::SIGTERM);
            Ok(format!("{} {}", role(leads), r.describe(slot)))
        }
        Kind::ApiserverStop => {
            let (slot, leads) = ctx.leader_or(plan.pick).await;
            let leaders = ctx.replicas.lock().await.server(slot);
            let server = if plan.pick % 10 < 7 {
                leaders
            } else {
                leaders.other()
            };
            let name = match server {
                Apiserver::One => "kube-apiserver",
                Apiserver::Two => "kube-apiserver2",
            };
            ctx.freeze(name, plan.lasts).await?;
            let whose = if server == leaders && leads {
                "the leader's"
            } else {
                "not the leader's"
            };
            Ok(format!("{server} ({whose}) for {}", secs(plan.lasts)))
        }
        Kind::EtcdStop => {
            ctx.freeze("etcd", plan.lasts).await?;
            Ok(format!("etcd for {}", secs(plan.lasts)))
        }
        Kind::Path => {
            let (slot, leads) = if plan.pick % 10 < 7 {
                ctx.leader_or(plan.pick).await
            } else {
                let n = ctx.replicas.lock().await.len() as u64;
                ((plan.pick % n) as usize, false)
            };
            let who = {
                let r = ctx.replicas.lock().await;
                r.path(slot).degrade(plan.delay, plan.loss_percent)?;
                r.describe(slot)
            };
            ctx.last(plan.lasts).await;
            ctx.replicas.lock().await.path(slot).heal()?;
            Ok(format!(
                "{} {who}: delay {} ms, loss {}% for {}",
                if leads { "leader" } else { "replica" },
                plan.delay.as_millis(),
                plan.loss_percent,
                secs(plan.lasts)
            ))
        }
        Kind::Config => {
            let (slot, leads) = if plan.pick.is_multiple_of(2) {
                ctx.leader_or(plan.pick / 2).await
            } else {
                let n = ctx.replicas.lock().await.len() as u64;
                (((plan.pick / 2) % n) as usize, false)
            };
            let graceful = !plan.pick.is_multiple_of(3);
            let mut r = ctx.replicas.lock().await;
            let was = r.describe(slot);
            r.restart(slot, plan.variant, graceful).await?;
            Ok(format!(
                "{} {was} {} → {}",
                if leads { "leader" } else { "replica" },
                if graceful { "SIGTERM" } else { "SIGKILL" },
                r.describe(slot)
            ))
        }
        Kind::ClaimDelete => {
            for client in &ctx.clients {
                let claims = netcm_e2e::pod_cidr_claims(client);
                let listed = tokio::time::timeout(
                    Duration::from_secs(3),
                    claims.list(&ListParams::default()),
                )
                .await;
                let Ok(Ok(list)) = listed else { continue };
                if list.items.is_empty() {
                    return Ok("no claim to delete".into());
                }
                let victim = &list.items[(plan.pick % list.items.len() as u64) as usize];
                let name = victim.metadata.name.clone().unwrap_or_default();
                let deleted = tokio::time::timeout(
                    Duration::from_secs(3),
                    claims.delete(&name, &DeleteParams::default()),
                )
                .await;
                return match deleted {
                    Ok(Ok(_)) => Ok(format!("{name} of {}", list.items.len())),
                    Ok(Err(e)) => Err(format!("delete {name}: {e}")),
                    Err(_) => Err(format!("delete {name}: no answer in 3 s")),
                };
            }
            Err("no API server listed the claims".into())
        }
    }
}

/// Revives replicas that exited (every 500 ms) until stopped; prints each revival.
pub async fn supervise(
    replicas: Arc<Mutex<Replicas>>,
    started: std::time::Instant,
    mut stop: watch::Receiver<bool>,
) -> usize {
    let mut revived = 0;
    while !*stop.borrow() {
        for (_, what) in replicas.lock().await.revive_exited().await {
            revived += 1;
            eprintln!(
                "[chaos] {:>7.1}s revived: {what}",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => {}
        }
    }
    revived
}

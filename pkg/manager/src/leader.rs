//! Leader election on a coordination.k8s.io/v1 Lease with client-go's algorithm and defaults, plus what
//! client-go lacks: a fence ([`LeaderGuard::ensure_leader`]) checked immediately before every write, a
//! watch on the Lease so a standby takes over as soon as the leader releases it, and release on shutdown.
//!
//! Why the fence is safe: a renewal counts from the moment its request was *sent*. Other replicas measure
//! expiry from when they *observed* that renewal, which is later. Writes are allowed only while the last
//! successful renewal is younger than the renew deadline (10 s), which is shorter than the lease duration
//! (15 s), so this process stops writing before anyone else may start — also after a SIGSTOP, because the
//! guard reads the monotonic clock, which keeps running while the process is frozen.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use prometheus::{IntCounter, IntGaugeVec, Opts, Registry};
use rand::Rng;
use tokio_util::sync::CancellationToken;

/// client-go's jitter factor for the acquire loop.
const JITTER_FACTOR: f64 = 1.2;
/// client-go's watchdog grace beyond the lease duration (KCM's `NewLeaderHealthzAdaptor(20s)`).
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(20);

/// Leader-election settings (KCM's `--leader-elect-*` flags).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This process's identity, `hostname_uuid`.
    pub identity: String,
    /// How long a lease is valid after its last observed renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

/// A write refused because this process does not (provably) hold the lease.
#[derive(Debug, Clone, thiserror::Error)]
#[error("write refused by the leader fence: {0}")]
pub struct Fenced(pub &'static str);

#[derive(Debug, Default)]
struct GuardState {
    leading: bool,
    /// When the request of the last successful acquire or renewal was sent.
    last_renew_sent: Option<Instant>,
}

#[derive(Debug)]
struct GuardInner {
    enabled: bool,
    renew_deadline: Duration,
    lease_duration: Duration,
    state: Mutex<GuardState>,
    fenced: IntCounter,
}

/// The leader fence, shared by every controller and the API client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LeaderGuard {
    inner: Arc<GuardInner>,
}

impl LeaderGuard {
    /// A guard for a leader-elected process; refuses writes until leadership is won.
    pub fn new(cfg: &LeaderElectionConfig, registry: &Registry) -> Result<Self, prometheus::Error> {
        Self::build(true, cfg.renew_deadline, cfg.lease_duration, registry)
    }

    /// A guard for `--leader-elect=false`: every write is allowed.
    pub fn disabled(registry: &Registry) -> Result<Self, prometheus::Error> {
        Self::build(false, Duration::ZERO, Duration::ZERO, registry)
    }

    fn build(
        enabled: bool,
        renew_deadline: Duration,
        lease_duration: Duration,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let fenced = IntCounter::with_opts(Opts::new(
            "netcm_fenced_writes_total",
            "Writes refused because this process did not hold a fresh leader lease.",
        ))?;
        registry.register(Box::new(fenced.clone()))?;
        Ok(Self {
            inner: Arc::new(GuardInner {
                enabled,
                renew_deadline,
                lease_duration,
                state: Mutex::new(GuardState::default()),
                fenced,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GuardState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Call immediately before every write: refuses unless the lease is held and was renewed within the
    /// renew deadline. Counts refusals in `netcm_fenced_writes_total`.
    pub fn ensure_leader(&self) -> Result<(), Fenced> {
        if !self.inner.enabled {
            return Ok(());
        }
        let st = self.state();
        let verdict = match (st.leading, st.last_renew_sent) {
            (false, _) | (_, None) => Err(Fenced("this process is not the leader")),
            (true, Some(at)) if at.elapsed() >= self.inner.renew_deadline => Err(Fenced(
                "the last lease renewal is older than the renew deadline",
            )),
            _ => Ok(()),
        };
        drop(st);
        if verdict.is_err() {
            self.inner.fenced.inc();
        }
        verdict
    }

    /// Whether this process currently believes it leads (always true without leader election).
    pub fn is_leader(&self) -> bool {
        !self.inner.enabled || self.state().leading
    }

    /// client-go's `leaderElection` watchdog: fails only while leading with no renewal for lease + 20 s.
    pub fn watchdog(&self) -> Result<(), String> {
        if !self.inner.enabled {
            return Ok(());
        }
        let st = self.state();
        match (st.leading, st.last_renew_sent) {
            (true, Some(at)) if at.elapsed() > self.inner.lease_duration + WATCHDOG_TIMEOUT => {
                Err(format!(
                    "leader has not renewed its lease for {:.1}s",
                    at.elapsed().as_secs_f64()
                ))
            }
            _ => Ok(()),
        }
    }

    fn renewed(&self, sent: Instant) {
        let mut st = self.state();
        st.leading = true;
        st.last_renew_sent = Some(sent);
    }

    fn step_down(&self) {
        let mut st = self.state();
        st.leading = false;
    }
}

/// Why a leadership term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// Renewal failed within the renew deadline, or another holder took the lease.
    Lost,
    /// Shutdown was requested while leading.
    Cancelled,
}

/// Runs client-go's acquire / renew / release cycle for one process.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderElectionConfig,
    guard: LeaderGuard,
    master_status: IntGaugeVec,
    /// The last lease record seen and when it was observed locally (client-go's observedTime).
    observed: Option<(LeaseSpec, Instant)>,
}

/// A Lease operation that failed; retried by the loops.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("lease held by {0}")]
    HeldByOther(String),
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("lease request timed out")]
    Timeout,
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

impl LeaderElector {
    /// Creates an elector; registers `leader_election_master_status`.
    pub fn new(
        client: kube::Client,
        cfg: LeaderElectionConfig,
        guard: LeaderGuard,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let master_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(master_status.clone()))?;
        master_status.with_label_values(&[&cfg.name]).set(0);
        Ok(Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            guard,
            master_status,
            observed: None,
        })
    }

    /// This process's identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    fn jittered_retry(&self) -> Duration {
        let extra = rand::rng().random_range(0.0..JITTER_FACTOR);
        self.cfg.retry_period.mul_f64(1.0 + extra)
    }

    /// Blocks until this process holds the lease (true) or `cancel` fires (false). Wakes early whenever
    /// the Lease changes, so a released lease is taken over at once rather than at the next retry.
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
        let lease_watch = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.name)),
        );
        let watch_task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(lease_watch);
            while let Some(ev) = stream.next().await {
                if ev.is_err() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let _ = wake_tx.try_send(());
            }
        });
        let mut logged_holder = String::new();
        let acquired = loop {
            match self.try_acquire_or_renew().await {
                Ok(()) => break true,
                Err(LeaseError::HeldByOther(h)) => {
                    if h != logged_holder {
                        tracing::info!(lease = %self.cfg.name, holder = %h, "standing by: the lease is held by another replica");
                        logged_holder = h;
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.cfg.name, error = %e, "failed to acquire the lease; retrying")
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break false,
                _ = tokio::time::sleep(self.jittered_retry()) => {}
                Some(()) = wake_rx.recv() => {}
            }
        };
        watch_task.abort();
        if acquired {
            self.master_status
                .with_label_values(&[&self.cfg.name])
                .set(1);
            tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), identity = %self.cfg.identity, "successfully acquired lease; this replica now leads");
        }
        acquired
    }

    /// Renews every retry period until renewal fails for the renew deadline (Lost) or `cancel` fires.
    pub async fn renew_until_lost(&mut self, cancel: &CancellationToken) -> TermEnd {
        let mut last_success = Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return TermEnd::Cancelled,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            loop {
                let remaining = self
                    .cfg
                    .renew_deadline
                    .saturating_sub(last_success.elapsed());
                // A process that was frozen past its deadline must not renew: another replica may lead now.
                if remaining.is_zero() {
                    return self.lost("the renew deadline passed without a successful renewal");
                }
                let sent = Instant::now();
                match self.try_acquire_or_renew().await {
                    Ok(()) => {
                        last_success = sent;
                        break;
                    }
                    Err(LeaseError::HeldByOther(h)) => {
                        return self.lost(&format!("the lease is now held by {h}"));
                    }
                    Err(e) => {
                        tracing::warn!(lease = %self.cfg.name, error = %e, "failed to renew the lease; retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return TermEnd::Cancelled,
                            _ = tokio::time::sleep(self.cfg.retry_period.min(remaining)) => {}
                        }
                    }
                }
            }
        }
    }

    fn lost(&mut self, why: &str) -> TermEnd {
        self.guard.step_down();
        self.master_status
            .with_label_values(&[&self.cfg.name])
            .set(0);
        tracing::error!(lease = %self.cfg.name, reason = why, "leaderelection lost");
        TermEnd::Lost
    }

    /// Gives the lease up (holder cleared, duration 1 s) so a standby takes over at once.
    pub async fn release(&mut self) {
        self.guard.step_down();
        self.master_status
            .with_label_values(&[&self.cfg.name])
            .set(0);
        let deadline = self.cfg.renew_deadline;
        let result = tokio::time::timeout(deadline, async {
            loop {
                let mut lease = self.api.get(&self.cfg.name).await?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                if holder(spec) != self.cfg.identity {
                    return Ok::<(), kube::Error>(());
                }
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(now_micro());
                match self
                    .api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match result {
            Ok(Ok(())) => tracing::info!(lease = %self.cfg.name, "released the lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.name, error = %e, "failed to release the lease")
            }
            Err(_) => tracing::warn!(lease = %self.cfg.name, "timed out releasing the lease"),
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<(), LeaseError> {
        let timeout = (self.cfg.renew_deadline / 2).max(Duration::from_secs(1));
        let sent = Instant::now();
        tokio::time::timeout(timeout, self.try_acquire_or_renew_once(sent))
            .await
            .map_err(|_| LeaseError::Timeout)?
    }

    async fn try_acquire_or_renew_once(&mut self, sent: Instant) -> Result<(), LeaseError> {
        let now = now_micro();
        let duration_secs = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let existing = match self.api.get_opt(&self.cfg.name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.cfg.identity.clone()),
                        lease_duration_seconds: Some(duration_secs),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                let created = self.api.create(&PostParams::default(), &lease).await?;
                self.observe(&created);
                self.guard.renewed(sent);
                return Ok(());
            }
        };
        let spec = existing.spec.clone().unwrap_or_default();
        let changed = self
            .observed
            .as_ref()
            .map(|(s, _)| s != &spec)
            .unwrap_or(true);
        if changed {
            self.observed = Some((spec.clone(), Instant::now()));
        }
        let current = holder(&spec).to_string();
        let i_hold = current == self.cfg.identity;
        if !current.is_empty() && !i_hold && self.lease_valid(&spec) {
            return Err(LeaseError::HeldByOther(current));
        }
        let mut new_spec = spec.clone();
        if !i_hold {
            new_spec.acquire_time = Some(now.clone());
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        new_spec.holder_identity = Some(self.cfg.identity.clone());
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(now);
        let mut lease = existing;
        lease.spec = Some(new_spec);
        // The resourceVersion in `lease` makes this an optimistic update: a racing writer gets a 409.
        let updated = self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await?;
        self.observe(&updated);
        self.guard.renewed(sent);
        Ok(())
    }

    fn observe(&mut self, lease: &Lease) {
        self.observed = Some((lease.spec.clone().unwrap_or_default(), Instant::now()));
    }

    /// client-go's `isLeaseValid`: judged by local observation time, not the record's timestamps.
    fn lease_valid(&self, spec: &LeaseSpec) -> bool {
        let secs = spec.lease_duration_seconds.unwrap_or(0).max(0) as u64;
        match &self.observed {
            Some((_, at)) => at.elapsed() < Duration::from_secs(secs),
            None => true,
        }
    }
}

/// KCM's identity: `hostname_uuid`.
pub fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LeaderElectionConfig {
        LeaderElectionConfig {
            name: "netcm".into(),
            namespace: "kube-system".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_millis(50),
            retry_period: Duration::from_millis(10),
        }
    }

    #[test]
    fn the_fence_refuses_writes_before_leadership_is_won() {
        let g = LeaderGuard::new(&cfg(), &Registry::new()).expect("guard");
        assert!(g.ensure_leader().is_err());
        assert_eq!(g.inner.fenced.get(), 1);
    }

    #[test]
    fn the_fence_allows_writes_after_a_fresh_renewal_and_refuses_once_it_is_older_than_the_renew_deadline(
    ) {
        let g = LeaderGuard::new(&cfg(), &Registry::new()).expect("guard");
        g.renewed(Instant::now());
        assert!(g.ensure_leader().is_ok());
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            g.ensure_leader().is_err(),
            "a stale renewal must fence writes"
        );
    }

    #[test]
    fn the_fence_refuses_writes_after_stepping_down() {
        let g = LeaderGuard::new(&cfg(), &Registry::new()).expect("guard");
        g.renewed(Instant::now());
        g.step_down();
        assert!(g.ensure_leader().is_err());
        assert!(!g.is_leader());
    }

    #[test]
    fn without_leader_election_every_write_is_allowed() {
        let g = LeaderGuard::disabled(&Registry::new()).expect("guard");
        assert!(g.ensure_leader().is_ok());
        assert!(g.is_leader());
        assert!(g.watchdog().is_ok());
    }

    #[test]
    fn the_watchdog_passes_for_a_standby_and_a_freshly_renewed_leader() {
        let g = LeaderGuard::new(&cfg(), &Registry::new()).expect("guard");
        assert!(g.watchdog().is_ok());
        g.renewed(Instant::now());
        assert!(g.watchdog().is_ok());
    }

    #[test]
    fn identities_are_hostname_underscore_uuid_and_unique() {
        let a = default_identity();
        assert!(a.contains('_'));
        assert_ne!(a, default_identity());
    }
}

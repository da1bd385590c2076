//! The leader fence: whether this process may write now. Times are read from the monotonic clock
//! (`Instant`), which keeps running while the process is frozen.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, Opts, Registry};

use super::LeaderElectionConfig;

/// client-go's watchdog grace beyond the lease duration (KCM's `NewLeaderHealthzAdaptor(20s)`).
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(20);

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

    /// Records a successful acquire or renewal whose request was sent at `sent`.
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut st = self.state();
        st.leading = true;
        st.last_renew_sent = Some(sent);
    }

    /// Stops leading: every later write is refused.
    pub(crate) fn step_down(&self) {
        let mut st = self.state();
        st.leading = false;
    }
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
}

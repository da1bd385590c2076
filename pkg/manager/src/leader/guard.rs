//! The leader fence: whether this process may start a write now, the deadline by which that write must
//! have ended, and which writes are still in flight (so the lease is released only once none can land).
//!
//! Times are read from the monotonic clock (`Instant`), which keeps running while the process is frozen.
//! A write may start while the last successful renewal was *sent* less than the renew deadline ago, and
//! must end by that renewal + lease duration − safety margin: other replicas may take the lease only a
//! lease duration after they *observed* the renewal, which is later than it was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use prometheus::{IntCounter, Opts, Registry};

use super::path::PathDelay;
use super::takeover::Takeover;
use super::LeaderElectionConfig;

/// client-go's watchdog grace beyond the lease duration (KCM's `NewLeaderHealthzAdaptor(20s)`).
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(20);
/// The shortest deadline worth sending: the API server reads `timeout=0ms` as "no timeout".
const MIN_WRITE_BUDGET: Duration = Duration::from_millis(1);

/// A write refused because this process does not (provably) hold the lease.
#[derive(Debug, Clone, thiserror::Error)]
#[error("write refused by the leader fence: {0}")]
pub struct Fenced(pub &'static str);

/// Writes that may still land, so the lease must not be released yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{in_flight} write(s) still in flight, and abandoned writes may land for another {may_land_for:?}"
)]
pub struct Unsettled {
    /// Writes sent and not yet answered.
    pub in_flight: usize,
    /// How long writes abandoned without an answer may still be applied (until their deadline).
    pub may_land_for: Duration,
}

#[derive(Debug)]
struct GuardState {
    leading: bool,
    /// When the request of the last successful acquire or renewal was sent.
    last_renew_sent: Option<Instant>,
    /// Fenced writes that passed the fence and have not ended.
    in_flight: usize,
    /// The latest deadline of a write that ended without an answer (dropped, transport error, timed
    /// out): the API server may still apply it until then.
    may_land_until: Option<Instant>,
    /// How late a request sent now may arrive: a write must arrive, not only be sent, inside the term.
    path: PathDelay,
    /// When the API server last answered this process (a write, a lease renewal or a probe): the newest
    /// proof that it was running and reading its socket.
    last_answer: Option<Instant>,
}

impl GuardState {
    fn new(path_window: Duration) -> Self {
        Self {
            leading: false,
            last_renew_sent: None,
            in_flight: 0,
            may_land_until: None,
            path: PathDelay::new(path_window),
            last_answer: None,
        }
    }

    /// The API server answered this process at `now`.
    fn answered_at(&mut self, now: Instant) {
        self.last_answer = self.last_answer.max(Some(now));
    }
}

/// When a write must have ended, and the part of that the API server is told (`timeout=`): what is left
/// once the request's worst arrival delay is taken off, since the server's clock starts at arrival.
#[derive(Debug, Clone, Copy)]
struct WriteWindow {
    deadline: Instant,
    server_budget: Duration,
}

#[derive(Debug)]
struct GuardInner {
    renew_deadline: Duration,
    lease_duration: Duration,
    state: Mutex<GuardState>,
    /// Woken whenever a write ends, for [`LeaderGuard::stop_writes_and_settle`].
    write_ended: tokio::sync::Notify,
    fenced: IntCounter,
    /// The leader before this one, from the Lease record this process's winning write replaced.
    takeover: Mutex<Option<Arc<Takeover>>>,
    /// This process's holder identity on the Lease; `None` without leader election, when the fence
    /// lets every write through.
    identity: Option<String>,
}

/// The leader fence, shared by every controller and the API client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LeaderGuard {
    inner: Arc<GuardInner>,
}

impl LeaderGuard {
    /// A guard for a leader-elected process; refuses writes until leadership is won.
    pub fn new(cfg: &LeaderElectionConfig, registry: &Registry) -> Result<Self, prometheus::Error> {
        Self::build(
            Some(cfg.identity.clone()),
            cfg.renew_deadline,
            cfg.lease_duration,
            registry,
        )
    }

    /// A guard for `--leader-elect=false`: every write is allowed, with no deadline.
    pub fn disabled(registry: &Registry) -> Result<Self, prometheus::Error> {
        Self::build(None, Duration::ZERO, Duration::ZERO, registry)
    }

    fn build(
        identity: Option<String>,
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
                renew_deadline,
                lease_duration,
                state: Mutex::new(GuardState::new(renew_deadline / 2)),
                write_ended: tokio::sync::Notify::new(),
                fenced,
                takeover: Mutex::new(None),
                identity,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, GuardState> {
        self.inner.state.lock()
    }

    /// What every write's deadline keeps clear of the earliest takeover: half the gap between the renew
    /// deadline and the lease duration, for network delay and the API server's own lateness. The other
    /// half is the least time a write started at the fence's last moment still gets.
    pub fn safety_margin(&self) -> Duration {
        self.inner
            .lease_duration
            .saturating_sub(self.inner.renew_deadline)
            / 2
    }

    /// The window of a write starting `now`, or why it may not start: it must end by the last renewal +
    /// lease duration − safety margin, and arrive early enough to leave the server some of that.
    fn window(&self, st: &mut GuardState, now: Instant) -> Result<WriteWindow, Fenced> {
        let renewed = match (st.leading, st.last_renew_sent) {
            (true, Some(at)) => at,
            _ => return Err(Fenced("this process is not the leader")),
        };
        if now.saturating_duration_since(renewed) >= self.inner.renew_deadline {
            return Err(Fenced(
                "the last lease renewal is older than the renew deadline",
            ));
        }
        let deadline = renewed + self.inner.lease_duration - self.safety_margin();
        let left = deadline.saturating_duration_since(now);
        if left < MIN_WRITE_BUDGET {
            return Err(Fenced(
                "no time is left before the lease could pass to another replica",
            ));
        }
        if st.path.stalled(now) {
            return Err(Fenced(
                "a request to the API server has waited far longer than its recent round trips: the path may be holding writes that could arrive after another replica may lead",
            ));
        }
        let server_budget = left.saturating_sub(st.path.one_way_bound(now));
        if server_budget < MIN_WRITE_BUDGET {
            return Err(Fenced(
                "the path to the API server is slower than what is left of this term: the write could arrive after another replica may lead",
            ));
        }
        Ok(WriteWindow {
            deadline,
            server_budget,
        })
    }

    fn refused(&self, e: Fenced) -> Fenced {
        self.inner.fenced.inc();
        e
    }

    /// How long a write starting now may take: until the last renewal + lease duration − safety margin.
    /// `Duration::MAX` without leader election. Refusals count in `netcm_fenced_writes_total`.
    pub fn write_budget(&self) -> Result<Duration, Fenced> {
        if self.inner.identity.is_none() {
            return Ok(Duration::MAX);
        }
        let now = Instant::now();
        let mut st = self.state();
        let verdict = self.window(&mut st, now);
        drop(st);
        verdict
            .map(|w| w.deadline.saturating_duration_since(now))
            .map_err(|e| self.refused(e))
    }

    /// Call immediately before every write: refuses unless the lease is held, was renewed within the
    /// renew deadline, and leaves the write some time. The API client does this for every write too.
    pub fn ensure_leader(&self) -> Result<(), Fenced> {
        self.write_budget().map(drop)
    }

    /// Passes the fence for one write and counts it in flight until the returned ticket is dropped; the
    /// ticket carries the write's deadline. Checked and counted under one lock, so once
    /// [`LeaderGuard::stop_writes_and_settle`] has stepped down no write can slip past it.
    pub fn begin_write(&self) -> Result<WriteTicket, Fenced> {
        let now = Instant::now();
        if self.inner.identity.is_none() {
            return Ok(WriteTicket {
                guard: self.clone(),
                sent: now,
                window: None,
                answered: false,
            });
        }
        let mut st = self.state();
        match self.window(&mut st, now) {
            Ok(window) => {
                st.in_flight += 1;
                st.path.started(now);
                Ok(WriteTicket {
                    guard: self.clone(),
                    sent: now,
                    window: Some(window),
                    answered: false,
                })
            }
            Err(e) => {
                drop(st);
                Err(self.refused(e))
            }
        }
    }

    fn end_write(&self, sent: Instant, deadline: Instant, answered: bool) {
        let now = Instant::now();
        let mut st = self.state();
        st.in_flight = st.in_flight.saturating_sub(1);
        st.path.ended(sent, now);
        if answered {
            st.answered_at(now);
        } else {
            st.may_land_until = st.may_land_until.max(Some(deadline));
        }
        drop(st);
        self.inner.write_ended.notify_waiters();
    }

    /// Steps down so no further write passes the fence, then waits up to `within` until no write is in
    /// flight and none abandoned can still land. Only then may the lease be released: a successor must
    /// never lead while one of our writes can still be applied.
    pub async fn stop_writes_and_settle(&self, within: Duration) -> Result<(), Unsettled> {
        self.step_down();
        let give_up = tokio::time::Instant::now() + within;
        loop {
            let ended = self.inner.write_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let now = Instant::now();
            let (in_flight, may_land_for) = {
                let st = self.state();
                let may_land_for = st
                    .may_land_until
                    .map(|u| u.saturating_duration_since(now))
                    .unwrap_or_default();
                (st.in_flight, may_land_for)
            };
            if in_flight == 0 && may_land_for.is_zero() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(Unsettled {
                    in_flight,
                    may_land_for,
                });
            }
            // Abandoned writes settle by the clock alone; in-flight ones wake us when they end.
            let wake = if in_flight == 0 {
                give_up.min(tokio::time::Instant::now() + may_land_for)
            } else {
                give_up
            };
            tokio::select! {
                _ = ended => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Whether this process currently believes it leads (always true without leader election).
    pub fn is_leader(&self) -> bool {
        self.inner.identity.is_none() || self.state().leading
    }

    /// client-go's `leaderElection` watchdog: fails only while leading with no renewal for lease + 20 s.
    pub fn watchdog(&self) -> Result<(), String> {
        if self.inner.identity.is_none() {
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

    /// An acquire or renewal attempt sent at `sent`: while it is unanswered the path is known to be that
    /// slow, and when the returned value is dropped (answered, failed or abandoned) its time in flight is
    /// a sample of the path's delay.
    pub(crate) fn renewal_sent(&self, sent: Instant) -> RequestInFlight {
        self.request_sent(sent)
    }

    /// Records a successful acquire or renewal whose request was sent at `sent`.
    pub(crate) fn renewed(&self, sent: Instant) {
        let now = Instant::now();
        let mut st = self.state();
        st.leading = true;
        st.last_renew_sent = Some(sent);
        st.answered_at(now);
    }

    /// Whether the API server answered this process within `within` (always true without leader
    /// election). A write is sent only on such fresh proof ([`crate::client`]'s layer probes for it
    /// otherwise): a server frozen since its last answer would hold the write and apply it when it
    /// thaws, after another replica may have taken the Lease, and the fence cannot see that coming
    /// until a request has waited [`super::path`]'s stall time.
    pub fn answered_within(&self, within: Duration) -> bool {
        if self.inner.identity.is_none() {
            return true;
        }
        let now = Instant::now();
        self.state()
            .last_answer
            .is_some_and(|at| now.saturating_duration_since(at) <= within)
    }

    /// A probe of the API server sent now: in flight for the path's delay (a probe left unanswered
    /// stalls the path like any request), and [`RequestInFlight::answered`] records the proof.
    pub fn probe_sent(&self) -> RequestInFlight {
        self.request_sent(Instant::now())
    }

    /// A request other than a fenced write (those hold a [`WriteTicket`]) sent at `sent`, tracked on the path.
    fn request_sent(&self, sent: Instant) -> RequestInFlight {
        self.state().path.started(sent);
        RequestInFlight {
            guard: self.clone(),
            sent,
        }
    }

    /// The leader before this one, as the Lease showed it when this process won it; `None` before that,
    /// without leader election, or when nobody is known to have held the Lease.
    pub fn takeover(&self) -> Option<Arc<Takeover>> {
        self.inner.takeover.lock().clone()
    }

    /// This process's holder identity on the Lease; `None` without leader election.
    pub fn identity(&self) -> Option<&str> {
        self.inner.identity.as_deref()
    }

    /// Records who led before this process won the Lease.
    pub(crate) fn took_over(&self, takeover: Option<Takeover>) {
        *self.inner.takeover.lock() = takeover.map(Arc::new);
    }

    /// Stops leading: every later write is refused.
    pub(crate) fn step_down(&self) {
        self.state().leading = false;
    }
}

/// A fence for the unit tests of controllers.
#[cfg(any(test, feature = "test-support"))]
impl LeaderGuard {
    /// A guard that leads as `identity` from now on, having taken the Lease over from `takeover`
    /// (`None`: a first start). Its renew deadline and lease are hours long: the fence reads the monotonic
    /// clock, which a test's paused tokio clock does not move, so no test outlives the term however long
    /// it waits, and one that wants the fence closed steps down
    /// ([`LeaderGuard::stop_writes_and_settle`]).
    pub fn leading(
        identity: &str,
        takeover: Option<Takeover>,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        const HOUR: Duration = Duration::from_secs(3600);
        let guard = Self::build(Some(identity.to_string()), HOUR, 2 * HOUR, registry)?;
        guard.renewed(Instant::now());
        guard.took_over(takeover);
        Ok(guard)
    }
}

/// A lease attempt or a probe of the API server in flight ([`LeaderGuard::renewal_sent`],
/// [`LeaderGuard::probe_sent`]): while unanswered the path is known to be at least that slow, and when
/// dropped (answered, failed or abandoned) its time in flight is a sample of the path's delay.
#[derive(Debug)]
#[must_use = "the request counts as in flight until it is dropped"]
pub struct RequestInFlight {
    guard: LeaderGuard,
    sent: Instant,
}

impl RequestInFlight {
    /// The API server answered: it was running just now. (A renewal's success says so through
    /// [`LeaderGuard::renewed`].)
    pub fn answered(self) {
        self.guard.state().answered_at(Instant::now());
    }
}

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        self.guard.state().path.ended(self.sent, Instant::now());
    }
}

/// One write that passed the fence. Dropping it ends the write: call [`WriteTicket::answered`] first
/// when the API server answered, otherwise the write counts as possibly landing until its deadline.
#[derive(Debug)]
#[must_use = "the write counts as in flight until the ticket is dropped"]
pub struct WriteTicket {
    guard: LeaderGuard,
    sent: Instant,
    window: Option<WriteWindow>,
    answered: bool,
}

impl WriteTicket {
    /// When the write must have ended; `None` without leader election.
    pub fn deadline(&self) -> Option<Instant> {
        self.window.map(|w| w.deadline)
    }

    /// What to tell the API server as `timeout=`: the time to the deadline less the path's worst arrival
    /// delay, as of when the write passed the fence; `None` without leader election.
    pub fn server_timeout(&self) -> Option<Duration> {
        self.window.map(|w| w.server_budget)
    }

    /// The API server answered (any status): the write is settled either way.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        if let Some(window) = self.window {
            self.guard
                .end_write(self.sent, window.deadline, self.answered);
        }
    }
}

#[cfg(test)]
mod tests;

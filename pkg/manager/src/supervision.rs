//! A process that cannot work must not keep the Lease. [`Failure`] is the process-wide "stop, this
//! replica is broken": a panic outside a sync (the panic hook), a worker loop that ended by itself or a
//! queue that made no progress while it had work raise it; the manager then drains, releases the Lease
//! and exits non-zero, so the standby takes over at once and the kubelet restarts this one — as
//! kube-controller-manager does when a goroutine panics. [`ControllerHealth`] is what the controller's
//! own `/healthz` and `/livez` check reports meanwhile, by the controller's name as in KCM.
//!
//! A panic *inside* a sync is not fatal: the controller's worker loop recovers it, counts it
//! (`netcm_sync_total{result="error",reason="panic"}`) and retries the key with backoff, so one Node's
//! bad data never stops the others.

use std::cell::Cell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The first fatal failure of a process, and the token cancelled when it happens.
#[derive(Clone, Default)]
pub struct Failure {
    reason: Arc<Mutex<Option<String>>>,
    token: CancellationToken,
}

impl Failure {
    /// Records `reason` (the first one wins) and wakes everything waiting on [`Failure::failed`].
    pub fn fail(&self, reason: impl Into<String>) {
        let reason = reason.into();
        let mut slot = self.reason.lock();
        if slot.is_none() {
            tracing::error!(reason = %reason, "this replica cannot work; stopping so another takes over");
            *slot = Some(reason);
        }
        drop(slot);
        self.token.cancel();
    }

    /// Why the process failed, if it did.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// Resolves once the process has failed.
    pub async fn failed(&self) {
        self.token.cancelled().await;
    }

    /// Makes every panic of the process outside a recovered sync raise this failure. The hook is
    /// process-wide and installed once; later calls (another manager in the same test process) do nothing.
    pub fn install_panic_hook(&self) {
        static INSTALLED: OnceLock<Failure> = OnceLock::new();
        if INSTALLED.set(self.clone()).is_err() {
            return;
        }
        std::panic::set_hook(Box::new(|info| {
            let message = panic_message(info.payload());
            let place = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            if RECOVERING.with(Cell::get) {
                // A sync's panic: its worker recovers it and logs it with the Node's name.
                return;
            }
            let thread = std::thread::current();
            let reason = format!(
                "panic in thread {} at {place}: {message}",
                thread.name().unwrap_or("unnamed")
            );
            if let Some(failure) = INSTALLED.get() {
                failure.fail(reason);
            }
        }));
    }
}

thread_local! {
    /// Set while a sync that recovers its panics is polled on this thread; the hook then stays quiet.
    static RECOVERING: Cell<bool> = const { Cell::new(false) };
}

/// Polls `sync` to completion, turning a panic in it into `Err(message)` instead of unwinding further.
/// The panic hook stays quiet for it: the caller logs and counts it with the key it was syncing.
pub(crate) async fn recover_panics<F: Future>(sync: F) -> Result<F::Output, String> {
    let mut sync = std::pin::pin!(sync);
    std::future::poll_fn(|cx| {
        let outer = RECOVERING.with(|r| r.replace(true));
        let polled = catch_unwind(AssertUnwindSafe(|| sync.as_mut().poll(cx)));
        RECOVERING.with(|r| r.set(outer));
        match polled {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(&*payload))),
        }
    })
    .await
}

/// A panic's payload as text.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".to_string())
}

/// A controller's own health: ok, or why it cannot work. Cheap to clone.
#[derive(Clone, Default)]
pub struct ControllerHealth {
    broken: Arc<Mutex<Option<String>>>,
}

impl ControllerHealth {
    /// Ok, or the reason the controller cannot work (its health check's answer).
    pub fn check(&self) -> Result<(), String> {
        match &*self.broken.lock() {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    /// Marks the controller broken.
    pub fn set_broken(&self, reason: String) {
        *self.broken.lock() = Some(reason);
    }

    /// Clears the reason: the check passes again (for readiness, which comes and goes).
    pub fn clear(&self) {
        *self.broken.lock() = None;
    }
}

/// What a controller's worker loop reports its state to, built by the manager for each controller.
#[derive(Clone)]
pub struct Supervisor {
    /// The process-wide failure.
    pub failure: Failure,
    /// The controller's health check.
    pub health: ControllerHealth,
    /// A queue with ready keys and no sync started or finished for this long is stalled; `None`: never.
    pub stall_timeout: Option<Duration>,
}

impl Supervisor {
    /// A supervisor whose failures go nowhere else (tests, examples).
    pub fn detached() -> Self {
        Self {
            failure: Failure::default(),
            health: ControllerHealth::default(),
            stall_timeout: None,
        }
    }

    /// The controller cannot work: its health check fails with `reason`, then the process fails.
    pub fn broken(&self, controller: &str, reason: String) {
        self.health.set_broken(reason.clone());
        self.failure
            .fail(format!("controller {controller}: {reason}"));
    }
}

/// When a queue's workers last started or finished a sync.
pub(crate) struct Progress {
    origin: Instant,
    last_ms: AtomicU64,
}

impl Progress {
    /// Progress made now.
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// A sync started or finished.
    pub(crate) fn mark(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long since the last mark.
    pub(crate) fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// Whether a queue with `ready` keys whose workers have been idle for `idle` is stalled.
pub(crate) fn is_stalled(ready: usize, idle: Duration, stall_timeout: Duration) -> bool {
    ready > 0 && idle >= stall_timeout
}

/// Test-only fault hooks, for faults that cannot be caused from outside the process: `sync-panic` (each
/// key's first sync panics), `worker-panic` (a worker loop panics outside any sync), `sync-hang` (every
/// sync hangs). They exist only in a build with the `test-faults` feature (the e2e suite's), read once
/// from `NETCM_TEST_FAULTS` (comma-separated `fault=controller`); the shipped binary has none, so no
/// environment variable can make a production netcm hang or panic on purpose. `netcm --version` names
/// the feature when it is in.
pub mod faults {
    /// The variable the hooks are read from.
    pub const VARIABLE: &str = "NETCM_TEST_FAULTS";

    /// Whether this build has the hooks at all.
    pub const COMPILED_IN: bool = cfg!(feature = "test-faults");

    #[cfg(feature = "test-faults")]
    fn all() -> &'static [(String, String)] {
        use std::sync::OnceLock;
        static FAULTS: OnceLock<Vec<(String, String)>> = OnceLock::new();
        FAULTS.get_or_init(|| {
            std::env::var(VARIABLE)
                .unwrap_or_default()
                .split(',')
                .filter_map(|f| f.split_once('='))
                .map(|(f, c)| (f.trim().to_string(), c.trim().to_string()))
                .collect()
        })
    }

    /// Whether `fault` is injected into `controller`.
    #[cfg(feature = "test-faults")]
    pub(crate) fn injected(fault: &str, controller: &str) -> bool {
        all().iter().any(|(f, c)| f == fault && c == controller)
    }

    /// Without the feature nothing is ever injected, and the check compiles away.
    #[cfg(not(feature = "test-faults"))]
    #[inline(always)]
    pub(crate) fn injected(_fault: &str, _controller: &str) -> bool {
        false
    }

    /// What to say at start-up about `NETCM_TEST_FAULTS` (its value, `None` when unset): hooks in use
    /// are loud, since a netcm running with them is not one to trust with a cluster; a value a build
    /// without hooks ignores is said too, so nobody believes a fault was injected that was not.
    pub fn startup_warning(value: Option<&str>) -> Option<String> {
        let value = value.filter(|v| !v.trim().is_empty())?;
        Some(if COMPILED_IN {
            format!("{VARIABLE}={value:?}: test fault hooks are injected into this process (a build with the test-faults feature, for tests only)")
        } else {
            format!("{VARIABLE}={value:?} is ignored: this build has no test fault hooks")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_or_empty_fault_variable_says_nothing() {
        assert_eq!(faults::startup_warning(None), None);
        assert_eq!(faults::startup_warning(Some(" ")), None);
    }

    #[test]
    fn a_set_fault_variable_is_named_at_start_up_as_injected_or_ignored() {
        let said = faults::startup_warning(Some("sync-hang=subnet-allocator"))
            .expect("a set variable is always named");
        assert!(said.contains("sync-hang=subnet-allocator"), "{said}");
        assert_eq!(said.contains("ignored"), !faults::COMPILED_IN, "{said}");
    }

    /// The unit tests build netcm-manager as the release does, without the feature: were a workspace
    /// member to turn it on for everyone, this fails.
    #[test]
    // A test that fails, not a build: the constant is what feature unification made of this build.
    #[allow(clippy::assertions_on_constants)]
    fn without_the_feature_no_fault_is_ever_injected() {
        assert!(!faults::COMPILED_IN);
        std::env::set_var(faults::VARIABLE, "sync-hang=subnet-allocator");
        assert!(!faults::injected("sync-hang", "subnet-allocator"));
    }

    #[test]
    fn the_first_failure_reason_is_kept_and_wakes_waiters() {
        let f = Failure::default();
        assert_eq!(f.reason(), None);
        f.fail("first");
        f.fail("second");
        assert_eq!(f.reason().as_deref(), Some("first"));
        assert!(f.token.is_cancelled());
    }

    #[test]
    fn a_queue_is_stalled_only_with_ready_keys_and_no_progress_for_the_whole_timeout() {
        let t = Duration::from_secs(60);
        assert!(!is_stalled(0, Duration::from_secs(600), t));
        assert!(!is_stalled(5, Duration::from_secs(59), t));
        assert!(is_stalled(5, Duration::from_secs(60), t));
    }

    #[tokio::test]
    async fn a_panicking_sync_is_recovered_as_its_message_and_the_next_one_runs() {
        let panicked = recover_panics(async {
            tokio::task::yield_now().await;
            if std::hint::black_box(true) {
                panic!("bad node data");
            }
            1
        })
        .await;
        assert_eq!(panicked, Err("bad node data".to_string()));
        assert_eq!(recover_panics(async { 2 }).await, Ok(2));
        assert!(!RECOVERING.with(Cell::get));
    }

    #[test]
    fn a_broken_controller_fails_its_check_and_the_process() {
        let s = Supervisor::detached();
        assert!(s.health.check().is_ok());
        s.broken("subnet-allocator", "worker exited".into());
        assert_eq!(s.health.check(), Err("worker exited".to_string()));
        assert_eq!(
            s.failure.reason().as_deref(),
            Some("controller subnet-allocator: worker exited")
        );
    }
}

//! The worker loop's tests: retries, recovered panics, stalls, prepare and init errors.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, thiserror::Error)]
#[error("refused")]
struct Refused;

impl SyncError for Refused {
    fn reason(&self) -> &'static str {
        "refused"
    }
}

/// Fails each key's first sync, then succeeds.
#[derive(Default)]
struct FlakyOnce {
    calls: AtomicUsize,
}

impl Reconciler for FlakyOnce {
    type Error = Refused;
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn node_fields(&self) -> NodeFields {
        NodeFields::none().pod_cidrs()
    }
    async fn sync(&self, _key: &str) -> Result<SyncOutcome, Refused> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => Err(Refused),
            _ => Ok(SyncOutcome::Done),
        }
    }
}

fn queue() -> Queue<Key> {
    Queue::new("flaky", RateLimiter::default_controller(), None)
}

#[tokio::test]
async fn a_failed_sync_is_retried_until_it_succeeds_and_its_failures_are_then_forgotten() {
    let reconciler = Arc::new(FlakyOnce::default());
    let q = queue();
    q.add("n1".into());
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new()
            .reconciler(reconciler.clone(), q.clone(), 2)
            .run(
                "flaky",
                shutdown.clone(),
                Duration::from_secs(5),
                Supervisor::detached(),
            ),
    );
    let retried = async {
        while reconciler.calls.load(Ordering::SeqCst) < 2 || q.num_requeues(&Key::from("n1")) != 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    // A bound on a hang, not on speed: the retry comes after milliseconds.
    tokio::time::timeout(Duration::from_secs(60), retried)
        .await
        .expect("the failed key is synced again");
    shutdown.cancel();
    run.await.expect("controller stops");
    assert_eq!(reconciler.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_controller_that_shuts_down_while_preparing_starts_no_worker() {
    let reconciler = Arc::new(FlakyOnce::default());
    let q = queue();
    q.add("n1".into());
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    Controller::new()
        .prepare(|token| async move {
            token.cancelled().await;
            Prepared::ShutDown
        })
        .reconciler(reconciler.clone(), q, 1)
        .run(
            "flaky",
            shutdown,
            Duration::from_secs(5),
            Supervisor::detached(),
        )
        .await;
    assert_eq!(reconciler.calls.load(Ordering::SeqCst), 0);
}

/// Panics on each key's first sync, hangs on `"stuck"`, succeeds otherwise.
#[derive(Default)]
struct Troubled {
    calls: AtomicUsize,
}

impl Reconciler for Troubled {
    type Error = Refused;
    fn name(&self) -> &'static str {
        "troubled"
    }
    fn node_fields(&self) -> NodeFields {
        NodeFields::none()
    }
    async fn sync(&self, key: &str) -> Result<SyncOutcome, Refused> {
        if key == "stuck" {
            std::future::pending::<()>().await;
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("bad data on {key}");
        }
        Ok(SyncOutcome::Done)
    }
}

#[tokio::test]
async fn a_sync_that_panics_is_retried_and_the_controller_stays_healthy() {
    let reconciler = Arc::new(Troubled::default());
    let q = Queue::new("troubled", RateLimiter::default_controller(), None);
    q.add("n1".into());
    let shutdown = CancellationToken::new();
    let supervisor = Supervisor::detached();
    let run = tokio::spawn(
        Controller::new()
            .reconciler(reconciler.clone(), q.clone(), 1)
            .run(
                "troubled",
                shutdown.clone(),
                Duration::from_secs(5),
                supervisor.clone(),
            ),
    );
    let retried = async {
        while reconciler.calls.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), retried)
        .await
        .expect("the panicked key is synced again");
    assert!(supervisor.health.check().is_ok());
    assert_eq!(supervisor.failure.reason(), None);
    shutdown.cancel();
    run.await.expect("controller stops");
}

#[tokio::test]
async fn a_queue_with_ready_keys_and_no_progress_breaks_the_controller() {
    let q = Queue::new("troubled", RateLimiter::default_controller(), None);
    q.add("stuck".into());
    q.add("waiting".into());
    let shutdown = CancellationToken::new();
    let supervisor = Supervisor {
        stall_timeout: Some(Duration::from_millis(300)),
        ..Supervisor::detached()
    };
    let run = tokio::spawn(
        Controller::new()
            .reconciler(Arc::new(Troubled::default()), q, 1)
            .run(
                "troubled",
                shutdown.clone(),
                Duration::from_millis(50),
                supervisor.clone(),
            ),
    );
    // A bound on a hang: the stall is reported after 300 ms.
    tokio::time::timeout(Duration::from_secs(60), supervisor.failure.failed())
        .await
        .expect("the stall is reported");
    let reason = supervisor
        .health
        .check()
        .expect_err("the controller is broken");
    assert!(reason.contains("1 keys were ready"), "{reason}");
    shutdown.cancel();
    run.await.expect("controller stops");
}

#[test]
fn an_init_error_says_what_it_wraps_and_keeps_its_sources() {
    #[derive(Debug, thiserror::Error)]
    #[error("opening the backend")]
    struct Open(#[source] Refused);
    let e = InitError::new(Open(Refused));
    assert_eq!(e.to_string(), "opening the backend");
    let source = std::error::Error::source(&e).map(ToString::to_string);
    assert_eq!(source.as_deref(), Some("refused"));
}

#[test]
fn a_controller_reads_what_its_reconcilers_declare() {
    let c = Controller::new().reconciler(Arc::new(FlakyOnce::default()), queue(), 1);
    assert_eq!(c.node_fields(), &NodeFields::none().pod_cidrs());
}

//! What a controller is to the manager: an init function that builds it from an [`InitContext`], and a
//! [`Controller`] that runs until shutdown. Also the shared worker loop over a workqueue.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use netcm_workqueue::{Queue, RateLimiter, WorkqueueMetrics};
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;
use crate::informer::{InformerEvent, SharedInformer};
use crate::leader::LeaderGuard;
use crate::sync_metrics;

/// Everything an init function may use to build its controller. Init functions subscribe to the informer
/// and build queues here; they spawn nothing.
#[derive(Clone)]
pub struct InitContext {
    /// The API client (rate-limited, metered, fenced for writes).
    pub client: kube::Client,
    /// The process-wide Node informer; subscribe before it starts.
    pub nodes: SharedInformer<Node>,
    /// The Prometheus registry served on /metrics.
    pub registry: prometheus::Registry,
    /// The workqueue metric families, shared by every controller's queue.
    pub workqueue_metrics: WorkqueueMetrics,
    /// Records Kubernetes Events on Nodes.
    pub recorder: EventRecorder,
    /// The leader fence: call `ensure_leader()` immediately before every write.
    pub leader: LeaderGuard,
    /// The Node this process runs on (`NODE_NAME`, or looked up from `POD_NAME`), if known.
    pub node_name: Option<String>,
    /// Whether this process runs under leader election (false in DaemonSet mode).
    pub leader_elected: bool,
}

impl InitContext {
    /// A workqueue named after the controller, with client-go's default controller rate limiter and metrics.
    pub fn new_queue(&self, name: &str) -> Queue<String> {
        Queue::new(
            name,
            RateLimiter::default_controller(),
            Some(&self.workqueue_metrics),
        )
    }

    /// [`InitContext::new_queue`], subscribed to the Node informer: every add, update or delete queues
    /// the Node's name (handlers only enqueue; the sync re-reads the cache).
    pub fn node_queue(&self, name: &str) -> Result<Queue<String>, InitError> {
        let queue = self.new_queue(name);
        let handler_queue = queue.clone();
        self.nodes
            .subscribe(Arc::new(move |ev: &InformerEvent<Node>| {
                handler_queue.add(ev.name());
            }))
            .map_err(InitError::new)?;
        Ok(queue)
    }
}

/// A failure an init function reports; the manager treats it as fatal, as KCM does. It is the wrapped
/// error itself to `Display` and `source()`, so the chain below it is kept.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct InitError(pub Box<dyn std::error::Error + Send + Sync>);

impl InitError {
    /// Wraps any error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// What an init function returns: the controller, or `None` when disabled by configuration.
pub type InitResult = Result<Option<Box<dyn Controller>>, InitError>;

/// An init function; it builds a controller from the context and its own captured configuration.
pub type InitFn = Box<dyn Fn(&InitContext) -> InitResult + Send + Sync>;

/// A running controller. `run` is called after leadership is won and the informer has synced; it
/// returns once `shutdown` is cancelled and its in-flight work has finished.
pub trait Controller: Send {
    /// Runs the controller's workers until `shutdown` is cancelled.
    fn run(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()>;
}

/// How a sync ended, for logs and metrics.
#[derive(Debug)]
pub enum SyncOutcome {
    /// Done; forget the key's failures.
    Done,
    /// Not done yet, retry after this long without counting a failure (e.g. waiting on another write).
    RetryAfter(Duration),
}

/// Runs `workers` tasks that take keys from `queue` and call `sync` until `shutdown` is cancelled, then
/// drains in-flight syncs for at most `drain_timeout`. Errors requeue the key with rate-limited backoff.
/// Every finished sync is counted in `netcm_sync_total{controller,result,reason}` and timed in
/// `netcm_sync_duration_seconds{controller}` ([`crate::sync_metrics`]).
pub async fn run_workers<F, Fut, E>(
    controller: &'static str,
    queue: Queue<String>,
    workers: usize,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    sync: F,
) where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<SyncOutcome, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
{
    crate::sync_metrics::init_controller(controller);
    let sync = Arc::new(sync);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let queue = queue.clone();
        let sync = sync.clone();
        let shutdown_seen = shutdown.clone();
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                // After shutdown only in-flight syncs finish; queued keys wait for the next leader.
                if shutdown_seen.is_cancelled() {
                    queue.done(&key);
                    continue;
                }
                let started = Instant::now();
                let outcome = sync(key.clone()).await;
                let (result, reason) = match &outcome {
                    Ok(SyncOutcome::Done) => (sync_metrics::RESULT_SUCCESS, "none"),
                    Ok(SyncOutcome::RetryAfter(_)) => (sync_metrics::RESULT_REQUEUE, "retry_after"),
                    Err(e) => (sync_metrics::RESULT_ERROR, sync_metrics::reason(e)),
                };
                sync_metrics::observe(controller, result, reason, started.elapsed().as_secs_f64());
                match outcome {
                    Ok(SyncOutcome::Done) => queue.forget(&key),
                    Ok(SyncOutcome::RetryAfter(d)) => queue.add_after(key.clone(), d),
                    Err(e) => {
                        let requeues = queue.num_requeues(&key);
                        tracing::warn!(
                            controller,
                            node = %key,
                            retries = requeues,
                            error = %e,
                            "sync failed; requeued with backoff"
                        );
                        queue.add_rate_limited(key.clone());
                    }
                }
                tracing::trace!(controller, node = %key, elapsed_ms = started.elapsed().as_millis() as u64, "synced");
                queue.done(&key);
            }
        });
    }
    shutdown.cancelled().await;
    if tokio::time::timeout(drain_timeout, queue.shut_down_with_drain())
        .await
        .is_err()
    {
        tracing::warn!(
            controller,
            "in-flight syncs did not finish within {drain_timeout:?}; stopping anyway"
        );
    }
    queue.shut_down();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

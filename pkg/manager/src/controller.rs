//! What a controller is to the manager. An init function builds a [`Controller`] from an
//! [`InitContext`]: one or more [`Reconciler`]s, each with its workqueue, and optionally work to do
//! before the workers start and tasks that run beside them. The manager runs it: one generic worker
//! loop per queue owns the workers, the per-key backoff, the drain on shutdown and the sync metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use netcm_node::CachedNode;
use netcm_workqueue::{Queue, RateLimiter, WorkqueueMetrics};
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;
use crate::informer::{InformerEvent, SharedInformer};
use crate::leader::LeaderGuard;
use crate::node_fields::NodeFields;
use crate::supervision::{
    faults, is_stalled, panic_message, recover_panics, ControllerHealth, Progress, Supervisor,
};
use crate::sync_metrics;

/// Everything an init function may use to build its controller. Init functions subscribe to the informer
/// and build queues here; they spawn nothing.
#[derive(Clone)]
pub struct InitContext {
    /// This controller's own API client: its own `--kube-api-qps` token bucket, metered, writes fenced.
    pub client: kube::Client,
    /// The process-wide Node informer; subscribe before it starts.
    pub nodes: SharedInformer<CachedNode>,
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
    /// How many keys the controller's main queue syncs at once (its `--concurrent-*` flag, at least 1).
    pub workers: usize,
    /// The controller's own check on `/readyz`: set a reason while it cannot serve (a missing CRD, say),
    /// clear it once it can. The replica stays alive: not ready is not broken.
    pub readiness: ControllerHealth,
    /// Whether the subnet-allocator has a backlog: it sets it, writers of less urgent data give way.
    pub allocation_backlog: crate::AllocationBacklog,
}

/// A workqueue key: an object's name, one allocation shared by the queue's FIFO and its dirty and
/// processing maps, and by every controller's Node queue ([`crate::informer::NameKeys`]): a backlog
/// queues every Node, and a `String` per queued key would copy every name once per map (see
/// `hack/bench.sh memory-limit`).
pub type Key = Arc<str>;

impl InitContext {
    /// A workqueue named after the controller, with client-go's default controller rate limiter and metrics.
    pub fn new_queue(&self, name: &str) -> Queue<Key> {
        Queue::new(
            name,
            RateLimiter::default_controller(),
            Some(&self.workqueue_metrics),
        )
    }

    /// [`InitContext::new_queue`], subscribed to the Node informer: every add, update or delete queues
    /// the Node's name (handlers only enqueue; the sync re-reads the cache).
    pub fn node_queue(&self, name: &str) -> Result<Queue<Key>, InitError> {
        let queue = self.new_queue(name);
        let handler_queue = queue.clone();
        let keys = self.nodes.name_keys();
        self.nodes
            .subscribe(Arc::new(move |ev: &InformerEvent<CachedNode>| {
                handler_queue.add(keys.key(ev.name()));
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
    /// Wraps any error, keeping its sources.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// What an init function returns: the controller, or `None` when disabled by configuration.
pub type InitResult = Result<Option<Controller>, InitError>;

/// How a sync ended, for logs and metrics.
#[derive(Debug)]
pub enum SyncOutcome {
    /// Done; forget the key's failures.
    Done,
    /// Not done yet, retry after this long without counting a failure (e.g. waiting on another write).
    RetryAfter(Duration),
}

/// An error a sync returns: the key is requeued with backoff, and the error names the `reason` label
/// it is counted under in `netcm_sync_total` (see [`crate::sync_metrics`] for the shared vocabulary).
pub trait SyncError: std::error::Error + Send + Sync + 'static {
    /// A bounded snake_case label: `fenced`, an API status reason, `transport`, or one of the
    /// controller's own.
    fn reason(&self) -> &'static str;
}

/// One level-triggered sync handler over string keys (a Node's name, usually).
pub trait Reconciler: Send + Sync + 'static {
    /// Why a sync failed.
    type Error: SyncError;

    /// The queue's name and the `controller` label of its metrics.
    fn name(&self) -> &'static str;

    /// What of a Node this reconciler — and whatever else of its controller reads the Node cache —
    /// reads; everything else is trimmed from the cache.
    fn node_fields(&self) -> NodeFields;

    /// Brings one key to its desired state, deciding from the cache alone.
    fn sync(&self, key: &str) -> impl Future<Output = Result<SyncOutcome, Self::Error>> + Send;
}

/// What [`Controller::prepare`] found: go on, stop because shutdown came first, or fail the replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// Start the workers.
    Ready,
    /// Shutdown came first; start nothing.
    ShutDown,
    /// The controller cannot start here (what it must read keeps failing): its health check fails with
    /// the reason and the replica steps down and exits, so a standby — maybe through another API server,
    /// with other credentials — can try.
    Failed(String),
}

/// A worker pool that runs until shutdown and drains for at most the given time.
type Workers =
    Box<dyn FnOnce(CancellationToken, Duration, Supervisor) -> BoxFuture<'static, ()> + Send>;
/// A future started with the shutdown token.
type Task<T> = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, T> + Send>;

/// A built controller: its queues with their reconcilers, and the work around them. Built by an init
/// function, started by the manager once the cache has synced.
#[derive(Default)]
pub struct Controller {
    node_fields: NodeFields,
    services: Vec<BoxFuture<'static, ()>>,
    prepare: Option<Task<Prepared>>,
    workers: Vec<Workers>,
    tasks: Vec<Task<()>>,
    stopped: Option<BoxFuture<'static, ()>>,
}

impl Controller {
    /// A controller with nothing to run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `queue` with `workers` tasks that call `reconciler.sync` for each key.
    pub fn reconciler<R: Reconciler>(
        mut self,
        reconciler: Arc<R>,
        queue: Queue<Key>,
        workers: usize,
    ) -> Self {
        self.node_fields = self.node_fields.union(&reconciler.node_fields());
        self.workers
            .push(Box::new(move |shutdown, drain, supervisor| {
                Box::pin(run_workers(
                    reconciler, queue, workers, shutdown, drain, supervisor,
                ))
            }));
        self
    }

    /// Work to finish after the cache synced and before any worker starts (e.g. learning what earlier
    /// leaders left); [`Prepared::ShutDown`] stops the controller there.
    pub fn prepare<F, Fut>(mut self, prepare: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Prepared> + Send + 'static,
    {
        self.prepare = Some(Box::new(move |shutdown| Box::pin(prepare(shutdown))));
        self
    }

    /// A loop beside the workers (a periodic resync, a watch of something else); it must return once
    /// its token is cancelled.
    pub fn task<F, Fut>(mut self, task: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks
            .push(Box::new(move |shutdown| Box::pin(task(shutdown))));
        self
    }

    /// Work after the workers and tasks have stopped, while the lease is still held, so its writes still
    /// pass the fence (e.g. telling the next leader what it need not quarantine); cut short at the drain
    /// timeout. Runs only if the workers ran.
    pub fn when_stopped(mut self, work: impl Future<Output = ()> + Send + 'static) -> Self {
        self.stopped = Some(Box::pin(work));
        self
    }

    /// Something the syncs depend on (a connection's driver): started before [`Controller::prepare`],
    /// dropped once the workers have drained.
    pub fn service(mut self, service: impl Future<Output = ()> + Send + 'static) -> Self {
        self.services.push(Box::pin(service));
        self
    }

    /// The union of what its reconcilers read of a Node.
    pub fn node_fields(&self) -> &NodeFields {
        &self.node_fields
    }

    /// Runs until `shutdown`, then lets in-flight syncs finish for at most `drain`; reports to
    /// `supervisor` when it cannot work (a worker loop ended, a stalled queue, a task that panicked).
    pub(crate) async fn run(
        self,
        name: &'static str,
        shutdown: CancellationToken,
        drain: Duration,
        supervisor: Supervisor,
    ) {
        let services: Vec<_> = self.services.into_iter().map(tokio::spawn).collect();
        let ready = match self.prepare {
            Some(prepare) => prepare(shutdown.clone()).await,
            None => Prepared::Ready,
        };
        if let Prepared::Failed(reason) = &ready {
            supervisor.broken(name, reason.clone());
        }
        if ready == Prepared::Ready {
            let workers = self
                .workers
                .into_iter()
                .map(|w| w(shutdown.clone(), drain, supervisor.clone()));
            let tasks = self.tasks.into_iter().map(|t| {
                let (shutdown, supervisor) = (shutdown.clone(), supervisor.clone());
                async move {
                    t(shutdown.clone()).await;
                    if !shutdown.is_cancelled() {
                        supervisor.broken(name, "a task beside its workers ended".into());
                    }
                }
            });
            futures::future::join(
                futures::future::join_all(workers),
                futures::future::join_all(tasks),
            )
            .await;
            if let Some(stopped) = self.stopped {
                if tokio::time::timeout(drain, stopped).await.is_err() {
                    tracing::warn!(
                        controller = name,
                        "the work after stopping did not finish within {drain:?}; stopping anyway"
                    );
                }
            }
        }
        for s in services {
            s.abort();
        }
    }
}

/// A controller's steps one at a time, for a test that drives its reconcilers' syncs itself.
#[cfg(any(test, feature = "test-support"))]
impl Controller {
    /// What [`Controller::run`] does before its workers start: starts the services (detached: they end
    /// with the test's runtime) and runs the prepare step. Once: a second call finds nothing to run and
    /// answers [`Prepared::Ready`], as does a controller without a prepare step.
    pub async fn prepare_now(&mut self, shutdown: CancellationToken) -> Prepared {
        for service in self.services.drain(..) {
            drop(tokio::spawn(service));
        }
        match self.prepare.take() {
            Some(prepare) => prepare(shutdown).await,
            None => Prepared::Ready,
        }
    }

    /// What [`Controller::run`] does once its workers and tasks stopped ([`Controller::when_stopped`]),
    /// without the drain timeout: the test waits for all of it. Once, like [`Controller::prepare_now`].
    pub async fn stop_now(&mut self) {
        if let Some(stopped) = self.stopped.take() {
            stopped.await;
        }
    }
}

/// Runs `workers` tasks that take keys from `queue` and sync them until `shutdown` is cancelled, then
/// drains in-flight syncs for at most `drain_timeout`; queued keys are left for the next leader. Errors
/// requeue the key with the queue's rate-limited backoff; so does a panic in a sync, recovered and
/// counted as `reason="panic"`. Every finished sync is counted in
/// `netcm_sync_total{controller,result,reason}` and timed in `netcm_sync_duration_seconds{controller}`.
/// A worker loop that ends before shutdown, or a queue with ready keys and no sync started or finished
/// for the stall timeout, breaks the controller (`supervisor`): the process then stops and exits.
async fn run_workers<R: Reconciler>(
    reconciler: Arc<R>,
    queue: Queue<Key>,
    workers: usize,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    supervisor: Supervisor,
) {
    let controller = reconciler.name();
    sync_metrics::init_controller(controller);
    let progress = Arc::new(Progress::new());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let queue = queue.clone();
        let reconciler = reconciler.clone();
        let shutdown_seen = shutdown.clone();
        let progress = progress.clone();
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                if shutdown_seen.is_cancelled() {
                    queue.done(&key);
                    continue;
                }
                if faults::injected("worker-panic", controller) {
                    panic!("injected fault: worker-panic in {controller}");
                }
                progress.mark();
                sync_one(reconciler.as_ref(), &queue, &key).await;
                progress.mark();
                queue.done(&key);
            }
        });
    }
    tokio::select! {
        _ = shutdown.cancelled() => {}
        ended = tasks.join_next() => {
            let why = match ended {
                Some(Err(e)) if e.is_panic() => {
                    format!("a worker panicked: {}", panic_message(&*e.into_panic()))
                }
                _ => "a worker loop ended before shutdown".to_string(),
            };
            supervisor.broken(controller, why);
            shutdown.cancelled().await;
        }
        () = watch_for_stall(&queue, &progress, supervisor.stall_timeout) => {
            let why = format!(
                "no sync started or finished for {:?} while {} keys were ready",
                progress.idle(),
                queue.len()
            );
            supervisor.broken(controller, why);
            shutdown.cancelled().await;
        }
    }
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

/// Resolves once `queue` has had ready keys and no progress for `stall_timeout`; never without one.
async fn watch_for_stall(queue: &Queue<Key>, progress: &Progress, stall_timeout: Option<Duration>) {
    let Some(timeout) = stall_timeout else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval((timeout / 4).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ready = queue.len();
        if ready == 0 {
            // Nothing to do is not a stall: the clock starts when work is waiting.
            progress.mark();
        } else if is_stalled(ready, progress.idle(), timeout) {
            return;
        }
    }
}

/// One sync of one key: counted, timed, and the key forgotten, delayed or requeued with backoff.
async fn sync_one<R: Reconciler>(reconciler: &R, queue: &Queue<Key>, key: &Key) {
    let controller = reconciler.name();
    let started = Instant::now();
    let outcome = recover_panics(async {
        if faults::injected("sync-hang", controller) {
            std::future::pending::<()>().await;
        }
        if faults::injected("sync-panic", controller) && queue.num_requeues(key) == 0 {
            panic!("injected fault: sync-panic in {controller}");
        }
        reconciler.sync(key).await
    })
    .await;
    let (result, reason) = match &outcome {
        Ok(Ok(SyncOutcome::Done)) => (sync_metrics::RESULT_SUCCESS, "none"),
        Ok(Ok(SyncOutcome::RetryAfter(_))) => (sync_metrics::RESULT_REQUEUE, "retry_after"),
        Ok(Err(e)) => (sync_metrics::RESULT_ERROR, e.reason()),
        Err(_) => (sync_metrics::RESULT_ERROR, sync_metrics::REASON_PANIC),
    };
    sync_metrics::observe(controller, result, reason, started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(SyncOutcome::Done)) => queue.forget(key),
        Ok(Ok(SyncOutcome::RetryAfter(d))) => queue.add_after(key.clone(), d),
        Ok(Err(e)) => {
            let requeues = queue.num_requeues(key);
            tracing::warn!(
                controller,
                node = %key,
                retries = requeues,
                error = %e,
                "sync failed; requeued with backoff"
            );
            queue.add_rate_limited(key.clone());
        }
        Err(panic) => {
            tracing::error!(
                controller,
                node = %key,
                retries = queue.num_requeues(key),
                panic = %panic,
                "sync panicked (a bug: please report it); recovered and requeued with backoff"
            );
            queue.add_rate_limited(key.clone());
        }
    }
    tracing::trace!(controller, node = %key, elapsed_ms = started.elapsed().as_millis() as u64, "synced");
}

#[cfg(test)]
mod tests;

//! The async, rate-limited, delaying work queue.

use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

use crate::metrics::{Recorder, WorkqueueMetrics, UNFINISHED_WORK_UPDATE_PERIOD};
use crate::rate_limiter::RateLimiter;
use crate::state::{Scheduled, State};

/// A work queue with client-go's semantics; clones share the same queue.
///
/// A key is never handed to two workers at once, a key added several times
/// before it is handed out is processed once, and a key added while it is
/// processed is handed out again after [`Queue::done`].
///
/// Delayed adds and the periodic unfinished-work metrics use background Tokio
/// tasks. They start on the first call made inside a Tokio runtime (`new`,
/// `get` or `add_after`), hold only a weak reference to the queue, and end
/// when it is shut down or dropped. A queue may therefore be created outside
/// a runtime; delayed keys then wait until a worker first calls `get`.
pub struct Queue<K> {
    /// The state shared by all clones.
    shared: Arc<Shared<K>>,
}

/// What clones of a queue share.
struct Shared<K> {
    /// The queue's name (the metrics' `name` label).
    name: String,
    /// Keys, sets, delayed keys and metric bookkeeping.
    state: Mutex<State<K>>,
    /// Backoff used by `add_rate_limited`.
    limiter: RateLimiter<K>,
    /// Wakes workers waiting in `get`.
    ready: Notify,
    /// Wakes `shut_down_with_drain` when processing becomes empty.
    drained: Notify,
    /// Wakes the delay task; shared with it so it can wait without a strong reference.
    delay_wake: Arc<Notify>,
    /// Whether the background tasks were spawned.
    tasks_started: AtomicBool,
}

impl<K> Shared<K> {
    /// Locks the state, recovering it if a panicking thread poisoned the mutex.
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock()
    }
}

impl<K> Drop for Shared<K> {
    fn drop(&mut self) {
        // Let the delay task notice that the queue is gone.
        self.delay_wake.notify_one();
    }
}

/// What the delay task does next.
enum DelayStep {
    /// The queue shut down or was dropped.
    Stop,
    /// Sleep until this time (or forever), or until woken.
    Sleep(Option<Instant>),
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Queue<K> {
    /// Creates a queue called `name`, recording into `metrics` if given.
    pub fn new(name: &str, limiter: RateLimiter<K>, metrics: Option<&WorkqueueMetrics>) -> Self {
        let recorder = Recorder::new(metrics.map(|metrics| metrics.for_queue(name)));
        let queue = Self {
            shared: Arc::new(Shared {
                name: name.to_owned(),
                state: Mutex::new(State::new(recorder)),
                limiter,
                ready: Notify::new(),
                drained: Notify::new(),
                delay_wake: Arc::new(Notify::new()),
                tasks_started: AtomicBool::new(false),
            }),
        };
        queue.ensure_tasks();
        queue
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Marks `key` as needing processing (ignored while shutting down).
    pub fn add(&self, key: K) {
        let pushed = self.shared.lock().add(key, Instant::now());
        if pushed {
            self.shared.ready.notify_one();
        }
    }

    /// Waits for the next key; `None` once the queue is shut down and empty.
    ///
    /// The caller must call [`Queue::done`] with the key when finished.
    pub async fn get(&self) -> Option<K> {
        self.ensure_tasks();
        loop {
            let mut notified = pin!(self.shared.ready.notified());
            // Register before looking, so an add after the look wakes us.
            notified.as_mut().enable();
            {
                let mut state = self.shared.lock();
                if let Some(key) = state.pop(Instant::now()) {
                    let more = state.len() > 0;
                    drop(state);
                    if more {
                        // Pass the baton so queued keys never wait for an idle worker.
                        self.shared.ready.notify_one();
                    }
                    return Some(key);
                }
                if state.is_shutting_down() {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut state = self.shared.lock();
        let requeued = state.done(key, Instant::now());
        let drained = state.is_shutting_down() && state.processing_is_empty();
        drop(state);
        if requeued {
            self.shared.ready.notify_one();
        }
        if drained {
            self.shared.drained.notify_waiters();
        }
    }

    /// Adds `key` once `delay` has passed (at once if zero); counts as a retry.
    ///
    /// If the key is already waiting, the earlier of the two times is kept.
    pub fn add_after(&self, key: K, delay: Duration) {
        let scheduled = self.shared.lock().add_after(key, delay, Instant::now());
        match scheduled {
            Scheduled::Nothing | Scheduled::Delayed(false) => {}
            Scheduled::Queued => self.shared.ready.notify_one(),
            Scheduled::Delayed(true) => self.shared.delay_wake.notify_one(),
        }
        if matches!(scheduled, Scheduled::Delayed(_)) {
            self.ensure_tasks();
        }
    }

    /// Adds `key` after the delay the rate limiter assigns to it.
    pub fn add_rate_limited(&self, key: K) {
        let delay = self.shared.limiter.when(&key);
        self.add_after(key, delay);
    }

    /// Clears the rate limiter's failure count for `key` (call after success).
    pub fn forget(&self, key: &K) {
        self.shared.limiter.forget(key);
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.shared.limiter.num_requeues(key)
    }

    /// Number of keys ready to be handed out (not counting delayed or processing keys).
    pub fn len(&self) -> usize {
        self.shared.lock().len()
    }

    /// Whether no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops accepting keys and drops delayed ones; workers drain the queued keys.
    pub fn shut_down(&self) {
        self.shared.lock().shut_down();
        self.shared.ready.notify_waiters();
        self.shared.delay_wake.notify_one();
    }

    /// Like [`Queue::shut_down`], then waits until no key is being processed.
    pub async fn shut_down_with_drain(&self) {
        self.shut_down();
        loop {
            let mut notified = pin!(self.shared.drained.notified());
            notified.as_mut().enable();
            if self.shared.lock().processing_is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.lock().is_shutting_down()
    }

    /// Spawns the background tasks once, if inside a Tokio runtime.
    fn ensure_tasks(&self) {
        if self.shared.tasks_started.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared.tasks_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        runtime.spawn(delay_loop(
            weak.clone(),
            Arc::clone(&self.shared.delay_wake),
        ));
        if self.shared.lock().records_metrics() {
            runtime.spawn(unfinished_work_loop(weak));
        }
    }

    /// Whether the state's structural invariants hold (tests only).
    #[cfg(test)]
    pub(crate) fn invariants_hold(&self) -> bool {
        self.shared.lock().invariants_hold()
    }
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Queue")
            .field("name", &self.shared.name)
            .field("len", &state.len())
            .field("shutting_down", &state.is_shutting_down())
            .finish_non_exhaustive()
    }
}

/// Moves delayed keys into the queue when they become ready.
async fn delay_loop<K: Clone + Eq + Hash>(shared: Weak<Shared<K>>, wake: Arc<Notify>) {
    loop {
        let mut notified = pin!(wake.notified());
        notified.as_mut().enable();
        let step = match shared.upgrade() {
            Some(shared) => promote_ready(&shared),
            None => DelayStep::Stop,
        };
        match step {
            DelayStep::Stop => return,
            DelayStep::Sleep(Some(at)) => {
                // Timing out just means the next key is due.
                let _ = tokio::time::timeout_at(at, notified).await;
            }
            DelayStep::Sleep(None) => notified.await,
        }
    }
}

/// Queues the delayed keys that are due and says how long to sleep.
fn promote_ready<K: Clone + Eq + Hash>(shared: &Shared<K>) -> DelayStep {
    let mut state = shared.lock();
    if state.is_shutting_down() {
        return DelayStep::Stop;
    }
    let pushed = state.promote_ready(Instant::now());
    let next = state.next_ready_at();
    drop(state);
    for _ in 0..pushed {
        shared.ready.notify_one();
    }
    DelayStep::Sleep(next)
}

/// Refreshes the unfinished-work gauges periodically while the queue is in use.
async fn unfinished_work_loop<K: Clone + Eq + Hash>(shared: Weak<Shared<K>>) {
    let mut ticker = tokio::time::interval(UNFINISHED_WORK_UPDATE_PERIOD);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut state = shared.lock();
        state.update_unfinished_work(Instant::now());
        if state.is_shutting_down() && state.processing_is_empty() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;

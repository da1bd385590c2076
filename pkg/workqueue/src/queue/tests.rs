//! The queue's semantics: FIFO order, one worker per key, shut down and drain, delays, background tasks.

use std::collections::HashSet;
use std::future::Future;

use prometheus::Registry;
use tokio::task::JoinHandle;

use super::*;

mod metrics;
mod model;

const SECOND: Duration = Duration::from_secs(1);

fn queue<K: Clone + Eq + Hash + Send + Sync + 'static>() -> Queue<K> {
    Queue::new("test", RateLimiter::default_controller(), None)
}

fn metered(registry: &Registry) -> Queue<&'static str> {
    let metrics = WorkqueueMetrics::register(registry).expect("register metrics");
    Queue::new("metered", RateLimiter::default_controller(), Some(&metrics))
}

/// Lets every other task on a current-thread runtime run until it blocks.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Awaits `future`, failing instead of hanging if it never completes.
async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), future)
        .await
        .expect("future did not complete")
}

fn spawn_get<K: Clone + Eq + Hash + Send + Sync + 'static>(q: &Queue<K>) -> JoinHandle<Option<K>> {
    let q = q.clone();
    tokio::spawn(async move { q.get().await })
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test]
async fn added_keys_come_out_in_fifo_order() {
    let q = queue();
    for key in ["a", "b", "c"] {
        q.add(key);
    }
    assert_eq!(q.len(), 3);
    assert_eq!(q.get().await, Some("a"));
    assert_eq!(q.get().await, Some("b"));
    assert_eq!(q.get().await, Some("c"));
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_key_added_twice_before_get_is_handed_out_once() {
    let q = queue();
    q.add("a");
    q.add("b");
    q.add("a");
    assert_eq!(q.len(), 2);
    assert_eq!(q.get().await, Some("a"));
    assert_eq!(q.get().await, Some("b"));
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_key_readded_while_processing_runs_again_after_done() {
    let q = queue();
    q.add("a");
    assert_eq!(q.get().await, Some("a"));
    q.add("a");
    q.add("a");
    // Not handed out while the first worker still holds it.
    assert!(q.is_empty());
    let second = spawn_get(&q);
    settle().await;
    assert!(!second.is_finished());
    q.done(&"a");
    assert_eq!(second.await.expect("join"), Some("a"));
    q.done(&"a");
    assert!(q.is_empty());
    assert!(q.invariants_hold());
}

#[tokio::test(start_paused = true)]
async fn get_waits_until_a_key_is_added() {
    let q = queue();
    let worker = spawn_get(&q);
    settle().await;
    assert!(!worker.is_finished());
    q.add(7);
    assert_eq!(within(worker).await.expect("join"), Some(7));
}

#[tokio::test(start_paused = true)]
async fn every_key_reaches_a_worker_when_many_workers_wait() {
    let q = queue();
    let workers: Vec<_> = (0..8).map(|_| spawn_get(&q)).collect();
    settle().await;
    for key in 0..8 {
        q.add(key);
    }
    let mut got = HashSet::new();
    for worker in workers {
        let key = within(worker).await.expect("join").expect("a key");
        assert!(got.insert(key));
    }
    assert_eq!(got, (0..8).collect());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_get_does_not_swallow_the_wakeup() {
    let q = queue();
    let cancelled = spawn_get(&q);
    let waiting = spawn_get(&q);
    settle().await;
    q.add("a");
    // Cancel before the woken worker got to run.
    cancelled.abort();
    assert_eq!(within(waiting).await.expect("join"), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_never_hold_the_same_key() {
    let q = queue::<u32>();
    let held = Arc::new(Mutex::new(HashSet::new()));
    let processed = Arc::new(Mutex::new(0usize));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (q, held, processed) = (q.clone(), Arc::clone(&held), Arc::clone(&processed));
            tokio::spawn(async move {
                while let Some(key) = q.get().await {
                    assert!(held.lock().insert(key), "{key} held twice");
                    tokio::task::yield_now().await;
                    assert!(held.lock().remove(&key));
                    *processed.lock() += 1;
                    q.done(&key);
                }
            })
        })
        .collect();
    for round in 0..200 {
        for key in 0..5 {
            q.add(key);
        }
        if round % 10 == 0 {
            tokio::task::yield_now().await;
        }
    }
    q.shut_down_with_drain().await;
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    assert!(*processed.lock() >= 5);
    assert!(q.is_empty() && q.invariants_hold());
}

#[tokio::test(start_paused = true)]
async fn shut_down_wakes_idle_workers_with_none() {
    let q = queue::<u8>();
    let workers: Vec<_> = (0..3).map(|_| spawn_get(&q)).collect();
    settle().await;
    q.shut_down();
    assert!(q.is_shutting_down());
    for worker in workers {
        assert_eq!(within(worker).await.expect("join"), None);
    }
}

#[tokio::test]
async fn shut_down_lets_workers_drain_queued_keys_first() {
    let q = queue();
    q.add(1);
    q.add(2);
    q.shut_down();
    q.add(3);
    assert_eq!(q.get().await, Some(1));
    assert_eq!(q.get().await, Some(2));
    assert_eq!(q.get().await, None);
}

#[tokio::test]
async fn a_key_readded_while_processing_is_dropped_if_shut_down_meanwhile() {
    let q = queue();
    q.add("a");
    assert_eq!(q.get().await, Some("a"));
    q.shut_down();
    q.add("a");
    q.done(&"a");
    assert_eq!(q.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn shut_down_with_drain_waits_for_keys_being_processed() {
    let q = queue();
    q.add("a");
    q.add("b");
    let a = q.get().await.expect("a");
    let drain = tokio::spawn({
        let q = q.clone();
        async move { q.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    assert_eq!(q.get().await, Some("b"));
    q.done(&a);
    settle().await;
    assert!(!drain.is_finished());
    q.done(&"b");
    within(drain).await.expect("join");
    assert_eq!(q.get().await, None);
}

#[tokio::test]
async fn shut_down_with_drain_returns_at_once_when_idle() {
    let q = queue::<u8>();
    q.shut_down_with_drain().await;
    assert!(q.is_shutting_down());
}

#[tokio::test(start_paused = true)]
async fn add_after_hands_the_key_out_once_the_delay_passed() {
    let q = queue();
    let start = Instant::now();
    q.add_after("a", SECOND);
    assert!(q.is_empty());
    assert_eq!(within(q.get()).await, Some("a"));
    assert_eq!(start.elapsed(), SECOND);
}

#[tokio::test(start_paused = true)]
async fn add_after_zero_adds_at_once() {
    let q = queue();
    q.add_after("a", Duration::ZERO);
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn add_after_keeps_the_earlier_time_for_a_key_delayed_twice() {
    let q = queue();
    let start = Instant::now();
    q.add_after("a", 5 * SECOND);
    q.add_after("a", SECOND);
    q.add_after("a", 3 * SECOND);
    assert_eq!(within(q.get()).await, Some("a"));
    assert_eq!(start.elapsed(), SECOND);
    q.done(&"a");
    // The superseded schedules must not hand the key out again.
    tokio::time::sleep(10 * SECOND).await;
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn delayed_keys_come_out_in_ready_order() {
    let q = queue();
    let start = Instant::now();
    q.add_after("late", 3 * SECOND);
    q.add_after("early", SECOND);
    assert_eq!(within(q.get()).await, Some("early"));
    assert_eq!(start.elapsed(), SECOND);
    assert_eq!(within(q.get()).await, Some("late"));
    assert_eq!(start.elapsed(), 3 * SECOND);
}

#[tokio::test(start_paused = true)]
async fn delayed_keys_are_dropped_at_shut_down() {
    let q = queue();
    q.add_after("a", SECOND);
    q.shut_down();
    tokio::time::sleep(2 * SECOND).await;
    assert!(q.is_empty());
    assert_eq!(q.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn add_rate_limited_backs_off_exponentially_until_forgotten() {
    let limiter = RateLimiter::exponential(SECOND, 100 * SECOND);
    let q = Queue::new("limited", limiter, None);
    for expected in [SECOND, 2 * SECOND, 4 * SECOND] {
        let start = Instant::now();
        q.add_rate_limited("a");
        assert_eq!(within(q.get()).await, Some("a"));
        assert_eq!(start.elapsed(), expected);
        q.done(&"a");
    }
    assert_eq!(q.num_requeues(&"a"), 3);
    q.forget(&"a");
    assert_eq!(q.num_requeues(&"a"), 0);
    let start = Instant::now();
    q.add_rate_limited("a");
    assert_eq!(within(q.get()).await, Some("a"));
    assert_eq!(start.elapsed(), SECOND);
}

#[test]
fn a_queue_made_outside_a_runtime_works_inside_one() {
    let q = queue();
    q.add("now");
    q.add_after("later", Duration::from_millis(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let limit = Duration::from_secs(60);
        let now = tokio::time::timeout(limit, q.get()).await;
        assert_eq!(now, Ok(Some("now")));
        let later = tokio::time::timeout(limit, q.get()).await;
        assert_eq!(later, Ok(Some("later")));
    });
}

#[tokio::test(start_paused = true)]
async fn dropping_the_queue_ends_its_background_tasks() {
    let registry = Registry::new();
    let before = alive_tasks();
    let q = metered(&registry);
    q.add_after("a", 10 * SECOND);
    assert_eq!(alive_tasks(), before + 2);
    let weak = Arc::downgrade(&q.shared);
    drop(q);
    assert!(weak.upgrade().is_none(), "a task keeps the queue alive");
    tokio::time::sleep(SECOND).await;
    assert_eq!(alive_tasks(), before);
}

#[tokio::test(start_paused = true)]
async fn shutting_down_ends_the_background_tasks() {
    let registry = Registry::new();
    let before = alive_tasks();
    let q = metered(&registry);
    assert_eq!(alive_tasks(), before + 2);
    q.shut_down();
    tokio::time::sleep(SECOND).await;
    assert_eq!(alive_tasks(), before);
    drop(q);
}

#[test]
fn get_futures_can_move_between_threads() {
    fn assert_send<T: Send>(_: &T) {}
    let q = queue::<String>();
    assert_send(&q.get());
    assert_send(&q.shut_down_with_drain());
}

#[tokio::test]
async fn clones_share_one_queue() {
    let q = queue();
    let clone = q.clone();
    clone.add("a");
    assert_eq!(q.len(), 1);
    assert_eq!(q.get().await, Some("a"));
    clone.shut_down();
    assert!(q.is_shutting_down());
    assert_eq!(q.name(), "test");
    assert!(format!("{q:?}").contains("test"));
}

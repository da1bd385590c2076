//! The queue's seven metrics: depth, adds, latencies, unfinished work, retries — and none without a registry.

use prometheus::Registry;

use super::*;
use crate::metrics::testing::{histogram, queue_names, value};

#[tokio::test]
async fn depth_and_adds_follow_the_queue_contents() {
    let registry = Registry::new();
    let q = metered(&registry);
    q.add("a");
    q.add("b");
    q.add("a");
    assert_eq!(value(&registry, "workqueue_depth", "metered"), 2.0);
    assert_eq!(value(&registry, "workqueue_adds_total", "metered"), 2.0);
    let a = q.get().await.expect("a");
    assert_eq!(value(&registry, "workqueue_depth", "metered"), 1.0);
    // Re-added while processing: counted as an add, queued after done.
    q.add("a");
    assert_eq!(value(&registry, "workqueue_adds_total", "metered"), 3.0);
    assert_eq!(value(&registry, "workqueue_depth", "metered"), 1.0);
    q.done(&a);
    assert_eq!(value(&registry, "workqueue_depth", "metered"), 2.0);
    drop(q);
    assert_eq!(value(&registry, "workqueue_depth", "metered"), 0.0);
}

#[tokio::test(start_paused = true)]
async fn queue_and_work_durations_are_observed_in_seconds() {
    let registry = Registry::new();
    let q = metered(&registry);
    q.add("a");
    tokio::time::advance(2 * SECOND).await;
    q.add("a");
    let a = q.get().await.expect("a");
    let queued = histogram(&registry, "workqueue_queue_duration_seconds", "metered");
    assert_eq!(queued, (1, 2.0));
    tokio::time::advance(3 * SECOND).await;
    q.done(&a);
    let worked = histogram(&registry, "workqueue_work_duration_seconds", "metered");
    assert_eq!(worked, (1, 3.0));
}

#[tokio::test(start_paused = true)]
async fn unfinished_work_is_refreshed_while_keys_are_processed() {
    let registry = Registry::new();
    let q = metered(&registry);
    let unfinished = || value(&registry, "workqueue_unfinished_work_seconds", "metered");
    let longest = || {
        value(
            &registry,
            "workqueue_longest_running_processor_seconds",
            "metered",
        )
    };
    q.add("a");
    q.add("b");
    let a = q.get().await.expect("a");
    tokio::time::sleep(SECOND).await;
    let b = q.get().await.expect("b");
    // The periodic refresh runs every 500ms; 2.1s is between two refreshes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(unfinished(), 2.0 + 1.0);
    assert_eq!(longest(), 2.0);
    q.done(&a);
    assert!((unfinished() - 1.1).abs() < 1e-9, "{}", unfinished());
    q.done(&b);
    assert_eq!(unfinished(), 0.0);
    assert_eq!(longest(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn every_add_after_counts_as_a_retry() {
    let registry = Registry::new();
    let q = metered(&registry);
    q.add_after("a", Duration::ZERO);
    q.add_after("a", SECOND);
    q.add_rate_limited("b");
    q.add("c");
    assert_eq!(value(&registry, "workqueue_retries_total", "metered"), 3.0);
    q.shut_down();
    q.add_after("a", SECOND);
    assert_eq!(value(&registry, "workqueue_retries_total", "metered"), 3.0);
}

#[tokio::test(start_paused = true)]
async fn a_queue_without_metrics_records_nothing() {
    let registry = Registry::new();
    let metrics = WorkqueueMetrics::register(&registry).expect("register");
    let metered = Queue::new("metered", RateLimiter::default_controller(), Some(&metrics));
    let silent = Queue::new("silent", RateLimiter::default_controller(), None);
    for q in [&metered, &silent] {
        q.add("a");
        q.add_after("b", SECOND);
        let a = q.get().await.expect("a");
        q.done(&a);
    }
    let names = queue_names(&registry);
    assert!(names.iter().any(|n| n == "metered"));
    assert!(!names.iter().any(|n| n == "silent"));
}

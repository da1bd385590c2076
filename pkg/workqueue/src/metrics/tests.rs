//! The metrics' names, buckets and registration, and the recorder's durations, unfinished work and depth.

use super::testing::{bucket_bounds, families, histogram, value};
use super::*;

const FAMILIES: [&str; 7] = [
    "workqueue_depth",
    "workqueue_adds_total",
    "workqueue_queue_duration_seconds",
    "workqueue_work_duration_seconds",
    "workqueue_unfinished_work_seconds",
    "workqueue_longest_running_processor_seconds",
    "workqueue_retries_total",
];

#[test]
fn register_exposes_every_family_with_client_go_names() {
    let registry = Registry::new();
    let metrics = WorkqueueMetrics::register(&registry).expect("register");
    let mut recorder = Recorder::new(Some(metrics.for_queue("q")));
    recorder.added();
    let names = families(&registry);
    for family in FAMILIES {
        let found = names
            .iter()
            .any(|n| n == family || n.strip_suffix("_count") == Some(family));
        assert!(found, "missing {family} in {names:?}");
    }
}

#[test]
fn registering_twice_on_one_registry_fails_and_rolls_back() {
    let registry = Registry::new();
    let first = WorkqueueMetrics::register(&registry).expect("first register");
    assert!(matches!(
        WorkqueueMetrics::register(&registry),
        Err(Error::Metrics(prometheus::Error::AlreadyReg))
    ));
    // The first registration is untouched.
    first.for_queue("q").adds.inc();
    assert_eq!(value(&registry, "workqueue_adds_total", "q"), 1.0);
}

#[test]
fn duration_histograms_use_client_go_buckets() {
    let registry = Registry::new();
    let metrics = WorkqueueMetrics::register(&registry).expect("register");
    metrics.for_queue("q").queue_duration.observe(1.0);
    let bounds = bucket_bounds(&registry, "workqueue_queue_duration_seconds", "q");
    let expected = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];
    assert_eq!(bounds.len(), expected.len());
    for (bound, want) in bounds.iter().zip(expected) {
        assert!((bound - want).abs() <= want * 1e-9, "{bound} != {want}");
    }
}

#[test]
fn recorder_tracks_durations_and_unfinished_work() {
    let registry = Registry::new();
    let metrics = WorkqueueMetrics::register(&registry).expect("register");
    let mut recorder = Recorder::new(Some(metrics.for_queue("q")));
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);

    recorder.added();
    recorder.pushed();
    recorder.added();
    recorder.pushed();
    assert_eq!(value(&registry, "workqueue_depth", "q"), 2.0);
    recorder.started(at(0), at(2));
    recorder.started(at(1), at(4));
    assert_eq!(value(&registry, "workqueue_depth", "q"), 0.0);
    assert_eq!(
        histogram(&registry, "workqueue_queue_duration_seconds", "q"),
        (2, 5.0)
    );
    recorder.update_unfinished_work(at(10), [at(2), at(4)].into_iter());
    assert_eq!(
        value(&registry, "workqueue_unfinished_work_seconds", "q"),
        14.0
    );
    assert_eq!(
        value(
            &registry,
            "workqueue_longest_running_processor_seconds",
            "q"
        ),
        8.0
    );
    recorder.finished(at(2), at(12));
    recorder.update_unfinished_work(at(12), [at(4)].into_iter());
    assert_eq!(
        histogram(&registry, "workqueue_work_duration_seconds", "q"),
        (1, 10.0)
    );
    assert_eq!(
        value(&registry, "workqueue_unfinished_work_seconds", "q"),
        8.0
    );
    recorder.finished(at(4), at(12));
    recorder.update_unfinished_work(at(12), std::iter::empty());
    assert_eq!(
        value(&registry, "workqueue_unfinished_work_seconds", "q"),
        0.0
    );
    assert_eq!(
        value(
            &registry,
            "workqueue_longest_running_processor_seconds",
            "q"
        ),
        0.0
    );
}

#[test]
fn dropping_a_recorder_removes_its_items_from_the_depth() {
    let registry = Registry::new();
    let metrics = WorkqueueMetrics::register(&registry).expect("register");
    let mut recorder = Recorder::new(Some(metrics.for_queue("q")));
    recorder.added();
    recorder.pushed();
    recorder.added();
    recorder.pushed();
    assert_eq!(value(&registry, "workqueue_depth", "q"), 2.0);
    drop(recorder);
    assert_eq!(value(&registry, "workqueue_depth", "q"), 0.0);
}

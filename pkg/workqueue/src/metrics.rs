//! Prometheus metrics with client-go's workqueue names, and per-queue recording.

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use tokio::time::Instant;

/// How often the unfinished-work gauges are refreshed while work is in progress.
pub(crate) const UNFINISHED_WORK_UPDATE_PERIOD: Duration = Duration::from_millis(500);

/// The label holding the queue's name.
const NAME_LABEL: &str = "name";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A metric could not be created or registered (e.g. it is already registered).
    #[error("registering workqueue metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The workqueue metric families; register once per registry and share among queues.
#[derive(Clone, Debug)]
pub struct WorkqueueMetrics {
    /// `workqueue_depth`.
    depth: IntGaugeVec,
    /// `workqueue_adds_total`.
    adds: IntCounterVec,
    /// `workqueue_queue_duration_seconds`.
    queue_duration: HistogramVec,
    /// `workqueue_work_duration_seconds`.
    work_duration: HistogramVec,
    /// `workqueue_unfinished_work_seconds`.
    unfinished_work: GaugeVec,
    /// `workqueue_longest_running_processor_seconds`.
    longest_running: GaugeVec,
    /// `workqueue_retries_total`.
    retries: IntCounterVec,
}

impl WorkqueueMetrics {
    /// Creates the metric families and registers them with `registry`.
    ///
    /// Fails (registering nothing) if any of them is already registered there.
    pub fn register(registry: &Registry) -> Result<Self, Error> {
        let metrics = Self::new()?;
        for (index, collector) in metrics.collectors().into_iter().enumerate() {
            if let Err(err) = registry.register(collector) {
                for registered in metrics.collectors().into_iter().take(index) {
                    // Best effort rollback of what this call registered.
                    let _ = registry.unregister(registered);
                }
                return Err(err.into());
            }
        }
        Ok(metrics)
    }

    /// Creates the (unregistered) metric families.
    fn new() -> Result<Self, Error> {
        let labels = &[NAME_LABEL];
        let buckets = prometheus::exponential_buckets(10e-9, 10.0, 10)?;
        let histogram = |name: &str, help: &str| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.clone()),
                labels,
            )
        };
        Ok(Self {
            depth: IntGaugeVec::new(
                Opts::new("workqueue_depth", "Current depth of workqueue"),
                labels,
            )?,
            adds: IntCounterVec::new(
                Opts::new(
                    "workqueue_adds_total",
                    "Total number of adds handled by workqueue",
                ),
                labels,
            )?,
            queue_duration: histogram(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
            )?,
            work_duration: histogram(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
            )?,
            unfinished_work: GaugeVec::new(
                Opts::new(
                    "workqueue_unfinished_work_seconds",
                    "How many seconds of work has done that is in progress and hasn't been \
                     observed by work_duration. Large values indicate stuck threads. One can \
                     deduce the number of stuck threads by observing the rate at which this \
                     increases.",
                ),
                labels,
            )?,
            longest_running: GaugeVec::new(
                Opts::new(
                    "workqueue_longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been \
                     running.",
                ),
                labels,
            )?,
            retries: IntCounterVec::new(
                Opts::new(
                    "workqueue_retries_total",
                    "Total number of retries handled by workqueue",
                ),
                labels,
            )?,
        })
    }

    /// Every family, boxed for (un)registration.
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.depth.clone()),
            Box::new(self.adds.clone()),
            Box::new(self.queue_duration.clone()),
            Box::new(self.work_duration.clone()),
            Box::new(self.unfinished_work.clone()),
            Box::new(self.longest_running.clone()),
            Box::new(self.retries.clone()),
        ]
    }

    /// The series of the queue called `name`.
    pub(crate) fn for_queue(&self, name: &str) -> QueueMetrics {
        let label = &[name];
        QueueMetrics {
            depth: self.depth.with_label_values(label),
            adds: self.adds.with_label_values(label),
            queue_duration: self.queue_duration.with_label_values(label),
            work_duration: self.work_duration.with_label_values(label),
            unfinished_work: self.unfinished_work.with_label_values(label),
            longest_running: self.longest_running.with_label_values(label),
            retries: self.retries.with_label_values(label),
        }
    }
}

/// One queue's series.
pub(crate) struct QueueMetrics {
    /// Items waiting in the FIFO.
    depth: IntGauge,
    /// Keys newly marked dirty.
    adds: IntCounter,
    /// Time from first add to get.
    queue_duration: Histogram,
    /// Time from get to done.
    work_duration: Histogram,
    /// Summed age of in-progress work.
    unfinished_work: prometheus::Gauge,
    /// Age of the oldest in-progress work.
    longest_running: prometheus::Gauge,
    /// `add_after` calls.
    retries: IntCounter,
}

/// Records a queue's events; does nothing for a queue without metrics. The times it measures from (when a
/// key was added, when it was handed out) are kept by the queue's own maps beside each key, not in a second
/// map per key here, which would hold every key of a backlog once more per queue.
pub(crate) struct Recorder {
    /// The series and bookkeeping, if the queue has metrics.
    active: Option<ActiveRecorder>,
}

/// A recorder's state when metrics are enabled.
struct ActiveRecorder {
    /// The queue's series.
    metrics: QueueMetrics,
    /// How much this queue has added to the depth gauge.
    depth: i64,
    /// Whether the unfinished-work gauges were last set from work in progress.
    unfinished: bool,
}

impl Recorder {
    /// A recorder writing to `metrics`, or a no-op one for `None`.
    pub(crate) fn new(metrics: Option<QueueMetrics>) -> Self {
        Self {
            active: metrics.map(|metrics| ActiveRecorder {
                metrics,
                depth: 0,
                unfinished: false,
            }),
        }
    }

    /// A key was newly marked dirty.
    pub(crate) fn added(&mut self) {
        if let Some(active) = &mut self.active {
            active.metrics.adds.inc();
        }
    }

    /// A key was pushed onto the FIFO.
    pub(crate) fn pushed(&mut self) {
        if let Some(active) = &mut self.active {
            active.metrics.depth.inc();
            active.depth += 1;
        }
    }

    /// A key first added at `added` was handed to a worker at `now`.
    pub(crate) fn started(&mut self, added: Instant, now: Instant) {
        if let Some(active) = &mut self.active {
            active.metrics.depth.dec();
            active.depth -= 1;
            active
                .metrics
                .queue_duration
                .observe(seconds_since(added, now));
        }
    }

    /// The worker that was handed a key at `started` called done at `now`.
    pub(crate) fn finished(&mut self, started: Instant, now: Instant) {
        if let Some(active) = &mut self.active {
            active
                .metrics
                .work_duration
                .observe(seconds_since(started, now));
        }
    }

    /// `add_after` was called.
    pub(crate) fn retried(&mut self) {
        if let Some(active) = &mut self.active {
            active.metrics.retries.inc();
        }
    }

    /// Recomputes the unfinished-work and longest-running gauges at `now` from when each key in progress
    /// was handed out.
    pub(crate) fn update_unfinished_work(
        &mut self,
        now: Instant,
        started: impl Iterator<Item = Instant>,
    ) {
        if let Some(active) = &mut self.active {
            let (count, total, longest) = started.map(|started| seconds_since(started, now)).fold(
                (0_usize, 0.0, 0.0),
                |(count, total, longest): (usize, f64, f64), age| {
                    (count + 1, total + age, longest.max(age))
                },
            );
            active.metrics.unfinished_work.set(total);
            active.metrics.longest_running.set(longest);
            active.unfinished = count > 0;
        }
    }

    /// Whether metrics are recorded at all.
    pub(crate) fn is_active(&self) -> bool {
        self.active.is_some()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(active) = &self.active {
            // Items of a dropped queue no longer count towards its depth.
            active.metrics.depth.sub(active.depth);
            if active.unfinished {
                active.metrics.unfinished_work.set(0.0);
                active.metrics.longest_running.set(0.0);
            }
        }
    }
}

/// Seconds from `earlier` to `now`, zero if `now` is not later.
fn seconds_since(earlier: Instant, now: Instant) -> f64 {
    now.saturating_duration_since(earlier).as_secs_f64()
}

/// Helpers reading metric values back out of a registry.
///
/// They parse the text exposition format, which does not depend on whether
/// prometheus' `protobuf` feature is enabled.
#[cfg(test)]
pub(crate) mod testing {
    use prometheus::{Registry, TextEncoder};

    /// The registry's samples as `(series name, labels, value)`.
    fn samples(registry: &Registry) -> Vec<(String, String, f64)> {
        let text = TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode metrics");
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (name, labels) = series.split_once('{')?;
                let value = value.parse().ok()?;
                Some((
                    name.to_owned(),
                    labels.trim_end_matches('}').to_owned(),
                    value,
                ))
            })
            .collect()
    }

    /// The value of series `name` for queue `queue`, if present.
    pub(crate) fn sample(registry: &Registry, name: &str, queue: &str) -> Option<f64> {
        let labels = format!("name=\"{queue}\"");
        samples(registry)
            .into_iter()
            .find(|(n, l, _)| n == name && *l == labels)
            .map(|(_, _, value)| value)
    }

    /// The value of a gauge or counter series (0 if absent).
    pub(crate) fn value(registry: &Registry, name: &str, queue: &str) -> f64 {
        sample(registry, name, queue).unwrap_or(0.0)
    }

    /// Sample count and sum of a histogram series ((0, 0) if absent).
    pub(crate) fn histogram(registry: &Registry, family: &str, queue: &str) -> (u64, f64) {
        let count = sample(registry, &format!("{family}_count"), queue).unwrap_or(0.0);
        let sum = sample(registry, &format!("{family}_sum"), queue).unwrap_or(0.0);
        // Sample counts are small integers, exactly representable.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        (count as u64, sum)
    }

    /// The upper bounds of a histogram series' buckets, `+Inf` excluded.
    pub(crate) fn bucket_bounds(registry: &Registry, family: &str, queue: &str) -> Vec<f64> {
        let bucket = format!("{family}_bucket");
        let prefix = format!("name=\"{queue}\",le=\"");
        samples(registry)
            .into_iter()
            .filter(|(n, _, _)| *n == bucket)
            .filter_map(|(_, labels, _)| {
                let le = labels.strip_prefix(&prefix)?.trim_end_matches('"');
                le.parse().ok()
            })
            .filter(|bound: &f64| bound.is_finite())
            .collect()
    }

    /// Names of the metric families in the registry.
    pub(crate) fn families(registry: &Registry) -> Vec<String> {
        samples(registry)
            .into_iter()
            .map(|(name, _, _)| name)
            .collect()
    }

    /// Values of the `name` label across all series.
    pub(crate) fn queue_names(registry: &Registry) -> Vec<String> {
        samples(registry)
            .into_iter()
            .filter_map(|(_, labels, _)| {
                let rest = labels.strip_prefix("name=\"")?;
                Some(rest.split('"').next()?.to_owned())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

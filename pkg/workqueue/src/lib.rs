//! A rate-limited, delaying Tokio work queue with client-go's `workqueue` semantics.
//!
//! [`Queue`] hands keys to concurrent workers with the guarantees controllers
//! rely on:
//!
//! - a key added several times before a worker takes it is processed once;
//! - a key is never held by two workers at once;
//! - a key added while it is being processed is handed out again after
//!   [`Queue::done`];
//! - [`Queue::add_after`] delays a key (the earliest time wins when a waiting
//!   key is delayed again), and [`Queue::add_rate_limited`] delays it by the
//!   queue's [`RateLimiter`] (by default client-go's controller limiter);
//! - [`Queue::shut_down`] stops accepting keys, drops delayed ones and lets
//!   workers drain what is queued before [`Queue::get`] returns `None`.
//!
//! Each queue can record client-go's `workqueue_*` Prometheus metrics,
//! labelled with its name, through a shared [`WorkqueueMetrics`].
//!
//! [`TokenBucket`], the limiter behind the queue's overall rate, is the
//! workspace's one token bucket: netcm's API clients use it too.
//!
//! ```
//! use netcm_workqueue::{Queue, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue = Queue::new("example", RateLimiter::default_controller(), None);
//! queue.add("default/web".to_owned());
//! while let Some(key) = queue.get().await {
//!     // reconcile `key`; on failure call `queue.add_rate_limited(key.clone())`
//!     queue.forget(&key);
//!     queue.done(&key);
//!     queue.shut_down();
//! }
//! # }
//! ```

mod delay;
mod metrics;
mod queue;
mod rate_limiter;
mod state;
mod token_bucket;

pub use metrics::{Error, WorkqueueMetrics};
pub use queue::Queue;
pub use rate_limiter::RateLimiter;
pub use token_bucket::TokenBucket;

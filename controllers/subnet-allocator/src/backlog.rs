//! Tells the other controllers while this one has a backlog, so their writes give way to allocation
//! (why: `netcm_manager::allocation_backlog`).

use std::time::Duration;

use netcm_manager::{AllocationBacklog, Key};
use netcm_workqueue::Queue;
use tokio_util::sync::CancellationToken;

/// How often the queue is looked at: a writer gives way at most this long after the backlog ended.
const EVERY: Duration = Duration::from_millis(100);

/// Whether `ready` keys are a backlog for `workers`: more than they sync at once.
pub(crate) fn is_backlog(ready: usize, workers: usize) -> bool {
    ready > workers
}

/// Publishes whether `queue` holds a backlog until `shutdown`; then, or if the task is aborted, says it
/// has none.
pub(crate) async fn publish(
    queue: Queue<Key>,
    backlog: AllocationBacklog,
    workers: usize,
    shutdown: CancellationToken,
) {
    let backlog = ClearedOnDrop(backlog);
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        backlog.0.set_busy(is_backlog(queue.len(), workers));
    }
}

/// A stopped allocator holds nobody up, however its task ended.
struct ClearedOnDrop(AllocationBacklog);

impl Drop for ClearedOnDrop {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_ready_nodes_than_workers_is_a_backlog_and_a_full_round_of_workers_is_not() {
        assert!(!is_backlog(0, 32));
        assert!(!is_backlog(32, 32));
        assert!(is_backlog(33, 32));
    }

    /// A queue holding `ready` Nodes.
    fn queue_of(ready: usize) -> Queue<Key> {
        let queue = Queue::new(
            "backlog-test",
            netcm_workqueue::RateLimiter::default_controller(),
            None,
        );
        for i in 0..ready {
            queue.add(Key::from(format!("node-{i}")));
        }
        queue
    }

    #[tokio::test(start_paused = true)]
    async fn the_backlog_is_published_while_the_queue_holds_one_and_cleared_at_shutdown() {
        let queue = queue_of(3);
        let backlog = AllocationBacklog::default();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(publish(queue.clone(), backlog.clone(), 2, shutdown.clone()));
        tokio::time::sleep(EVERY * 2).await;
        assert!(backlog.is_busy(), "3 ready for 2 workers");
        let _ = queue.get().await;
        tokio::time::sleep(EVERY * 2).await;
        assert!(!backlog.is_busy(), "2 ready for 2 workers");
        queue.add(Key::from("node-3"));
        tokio::time::sleep(EVERY * 2).await;
        assert!(backlog.is_busy());
        shutdown.cancel();
        task.await.expect("publish ends at shutdown");
        assert!(!backlog.is_busy(), "a stopped allocator holds nobody up");
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_publisher_clears_the_backlog_too() {
        let backlog = AllocationBacklog::default();
        let task = tokio::spawn(publish(
            queue_of(3),
            backlog.clone(),
            2,
            CancellationToken::new(),
        ));
        tokio::time::sleep(EVERY * 2).await;
        assert!(backlog.is_busy());
        task.abort();
        let _ = task.await;
        assert!(!backlog.is_busy());
    }
}

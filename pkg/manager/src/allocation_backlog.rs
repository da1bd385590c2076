//! Whether the subnet-allocator has a backlog, so the other controllers' writes give way to it.
//!
//! On a server-bound cluster the controllers share one API server's writes. While a backlog of Nodes
//! waits for pod CIDRs, every lease PATCH the node-annotation-syncer sends is one allocation fewer per
//! second, and a Node's lease is worth nothing before its CIDR (see `NETCM_CONTROLLERS=subnet-allocator,
//! node-annotation-syncer hack/bench.sh allocation`). A Node needs both before its network works and
//! the second write comes either way (from netcm, or from flanneld on the node after
//! kube-controller-manager's CIDR), so allocating first moves the CIDRs earlier and the leases no later
//! in total. The allocator says when it has more ready Nodes
//! than workers ([`AllocationBacklog::set_busy`]); a writer waits for that to end, up to a bound
//! ([`AllocationBacklog::give_way`]), so it is slowed during a backlog and never stopped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// One per process, shared by every controller through [`crate::InitContext`]; idle unless the
/// subnet-allocator runs in this process and has a backlog.
#[derive(Clone)]
pub struct AllocationBacklog {
    busy: Arc<watch::Sender<bool>>,
}

impl Default for AllocationBacklog {
    fn default() -> Self {
        Self {
            busy: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl AllocationBacklog {
    /// Sets whether the allocator has more ready Nodes than it syncs at once.
    pub fn set_busy(&self, busy: bool) {
        self.busy
            .send_if_modified(|b| std::mem::replace(b, busy) != busy);
    }

    /// Whether the allocator has a backlog now.
    pub fn is_busy(&self) -> bool {
        *self.busy.borrow()
    }

    /// Waits until the allocator has no backlog, or `at_most`; whether it waited at all.
    pub async fn give_way(&self, at_most: Duration) -> bool {
        if !self.is_busy() {
            return false;
        }
        let mut busy = self.busy.subscribe();
        // The sender lives as long as `self`, so `wait_for` ends only by the value or the timeout.
        let _ = tokio::time::timeout(at_most, busy.wait_for(|b| !b)).await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_writer_does_not_wait_when_the_allocator_has_no_backlog() {
        let backlog = AllocationBacklog::default();
        let start = tokio::time::Instant::now();
        assert!(!backlog.give_way(Duration::from_secs(2)).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_waits_until_the_backlog_ends() {
        let backlog = AllocationBacklog::default();
        backlog.set_busy(true);
        let allocator = backlog.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            allocator.set_busy(false);
        });
        let start = tokio::time::Instant::now();
        assert!(backlog.give_way(Duration::from_secs(2)).await);
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_waits_no_longer_than_its_bound_behind_a_backlog_that_does_not_end() {
        let backlog = AllocationBacklog::default();
        backlog.set_busy(true);
        let start = tokio::time::Instant::now();
        assert!(backlog.give_way(Duration::from_secs(2)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(backlog.is_busy());
    }
}

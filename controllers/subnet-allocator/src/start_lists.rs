//! A list a new leader must read before its first allocation (the PodCIDRClaims, the Nodes after a
//! predecessor claims cannot cover) that keeps failing: a 403 after an RBAC change, 5xx, a broken
//! conversion webhook. Retrying in silence left the allocator stopped before it started with `/readyz`
//! green and no worker to notice a stalled queue. Instead each failure is counted
//! (`netcm_pod_cidr_start_list_failures_total{list}`), logged as an error and makes this controller's
//! readiness fail with the reason; past [`STEP_DOWN_AFTER`] the replica steps down and exits, so a
//! standby — perhaps through another API server — can try, and the Lease's next holder starts from its
//! own lists, as any new leader does.

use std::fmt::Display;
use std::time::Duration;

use netcm_manager::supervision::ControllerHealth;
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::allocator::NAME;

/// How long a start-up list may keep failing before the leader steps down: well past an API server's
/// restart or an etcd leader election (seconds), short enough that a standby takes over within minutes.
pub(crate) const STEP_DOWN_AFTER: Duration = Duration::from_secs(120);

/// One start-up list's failures in a row.
pub(crate) struct FailingList<'a> {
    list: &'static str,
    readiness: &'a ControllerHealth,
    failures: IntCounter,
    since: Option<Instant>,
}

impl<'a> FailingList<'a> {
    /// `list` names what is listed in the log, the readiness reason and the metric's label.
    pub(crate) fn new(
        list: &'static str,
        readiness: &'a ControllerHealth,
        failures: IntCounter,
    ) -> Self {
        Self {
            list,
            readiness,
            failures,
            since: None,
        }
    }

    /// A failed list: counted, logged, readiness failing with why. `Err(reason)` once the list has been
    /// failing for [`STEP_DOWN_AFTER`]: the leader steps down with it.
    pub(crate) fn failed(&mut self, error: &dyn Display) -> Result<(), String> {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.failures.inc();
        let failing_for = since.elapsed();
        let reason = format!(
            "cannot allocate pod CIDRs: listing {} has failed for {}s: {error}",
            self.list,
            failing_for.as_secs()
        );
        tracing::error!(controller = NAME, list = self.list, error = %error, failing_for = ?failing_for, "a list this leader must read before its first allocation failed; nothing is allocated until it succeeds, and the leader steps down if it keeps failing");
        self.readiness.set_broken(reason.clone());
        if failing_for >= STEP_DOWN_AFTER {
            return Err(format!(
                "{reason}; stepping down after {}s so a standby can try",
                STEP_DOWN_AFTER.as_secs()
            ));
        }
        Ok(())
    }

    /// The list worked: readiness passes again if a failure of this list had made it fail.
    pub(crate) fn succeeded(&mut self) {
        if self.since.take().is_some() {
            self.readiness.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> IntCounter {
        IntCounter::new("t", "t").expect("a valid counter")
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_list_fails_readiness_with_its_reason_and_is_counted() {
        let readiness = ControllerHealth::default();
        let failures = counter();
        let mut list = FailingList::new("PodCIDRClaims", &readiness, failures.clone());
        assert_eq!(list.failed(&"403 Forbidden"), Ok(()));
        let reason = readiness.check().expect_err("readiness fails");
        assert!(
            reason.contains("PodCIDRClaims") && reason.contains("403 Forbidden"),
            "{reason}"
        );
        assert_eq!(failures.get(), 1);
        list.succeeded();
        assert_eq!(readiness.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_failing_past_the_bound_steps_the_leader_down_and_a_success_resets_the_clock() {
        let readiness = ControllerHealth::default();
        let mut list = FailingList::new("Nodes", &readiness, counter());
        assert_eq!(list.failed(&"500"), Ok(()));
        tokio::time::advance(STEP_DOWN_AFTER - Duration::from_secs(1)).await;
        assert_eq!(list.failed(&"500"), Ok(()));
        tokio::time::advance(Duration::from_secs(1)).await;
        let reason = list.failed(&"500").expect_err("steps down");
        assert!(reason.contains("stepping down"), "{reason}");
        list.succeeded();
        assert_eq!(
            list.failed(&"500"),
            Ok(()),
            "a new run of failures starts its own clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_leaves_a_reason_set_by_someone_else_alone() {
        let readiness = ControllerHealth::default();
        readiness.set_broken("the CRD is missing".into());
        let mut list = FailingList::new("Nodes", &readiness, counter());
        list.succeeded();
        assert_eq!(readiness.check(), Err("the CRD is missing".to_string()));
    }
}

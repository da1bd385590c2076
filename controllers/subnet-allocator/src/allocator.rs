//! The sync handler: one Node key at a time, level-triggered from the cache.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_ipam::{Error as IpamError, HoldFinding, Pools};
use netcm_manager::{EventRecorder, EventType, LeaderGuard, SharedInformer, SyncOutcome};
use netcm_workqueue::Queue;

use crate::metrics::AllocatorMetrics;

/// The controller's name: its workqueue, metrics label and log field.
pub const NAME: &str = "subnet-allocator";

/// A sync that must be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Every CIDR of a family is taken.
    #[error("{0}")]
    NoCidrAvailable(IpamError),
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] netcm_manager::Fenced),
    /// The PATCH failed.
    #[error("patching spec.podCIDRs: {0}")]
    Patch(#[from] kube::Error),
}

/// The allocator's shared state.
pub struct Allocator {
    pub(crate) nodes: SharedInformer<Node>,
    pub(crate) api: Api<Node>,
    pub(crate) pools: Mutex<Pools>,
    pub(crate) queue: Queue<String>,
    pub(crate) recorder: EventRecorder,
    pub(crate) guard: LeaderGuard,
    pub(crate) metrics: AllocatorMetrics,
    /// Nodes waiting for a CIDR to be released; requeued at once when one is.
    pub(crate) waiting: Mutex<BTreeSet<String>>,
    /// Nodes whose pod CIDRs are currently bad data (for `netcm_node_cidr_conflicts`).
    pub(crate) flagged: Mutex<BTreeSet<String>>,
    pub(crate) record_assigned: bool,
}

/// Parses pod CIDR strings; returns the parsed ones and the unparsable ones.
pub fn parse_pod_cidrs(raw: &[String]) -> (Vec<IpNet>, Vec<String>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for s in raw {
        match s.trim().parse::<IpNet>() {
            Ok(net) => good.push(net),
            Err(_) => bad.push(s.clone()),
        }
    }
    (good, bad)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Allocator {
    fn publish_usage(&self, pools: &Pools) {
        self.metrics.publish(&pools.stats());
    }

    fn set_flagged(&self, node: &str, flagged: bool) {
        let mut set = lock(&self.flagged);
        if flagged {
            set.insert(node.to_string());
        } else {
            set.remove(node);
        }
        self.metrics.conflicts.set(set.len() as i64);
    }

    /// Releases what a vanished Node held and wakes the Nodes waiting for a CIDR.
    fn release(&self, name: &str) {
        let released = {
            let mut pools = lock(&self.pools);
            let released = pools.release_node(name);
            for cidr in &released {
                if let Some(set) = pools.sets().iter().find(|s| s.contains(*cidr)) {
                    self.metrics.released(&set.cluster().to_string());
                }
            }
            self.publish_usage(&pools);
            released
        };
        self.set_flagged(name, false);
        lock(&self.waiting).remove(name);
        if released.is_empty() {
            return;
        }
        tracing::info!(controller = NAME, node = name, cidrs = ?released.iter().map(ToString::to_string).collect::<Vec<_>>(), "released pod CIDRs of a deleted node");
        let waiting: Vec<String> = lock(&self.waiting).iter().cloned().collect();
        for w in waiting {
            self.queue.add(w);
        }
    }

    /// Records the CIDRs a Node already has and reports bad data on it.
    async fn record_existing(&self, node: &Node, name: &str, raw: &[String]) {
        let (parsed, unparsable) = parse_pod_cidrs(raw);
        let outcome = {
            let mut pools = lock(&self.pools);
            let o = pools.hold(name, &parsed);
            self.publish_usage(&pools);
            o
        };
        lock(&self.waiting).remove(name);
        let flagged = !unparsable.is_empty() || !outcome.is_clean();
        self.set_flagged(name, flagged);
        for bad in &unparsable {
            let note = format!("node {name} has an unparsable pod CIDR {bad:?}; it is ignored and nothing is allocated over it");
            tracing::warn!(controller = NAME, node = name, cidr = %bad, "unparsable pod CIDR");
            self.recorder
                .publish(node, EventType::Warning, "CIDRInvalid", "RecordCIDR", note)
                .await;
        }
        for finding in &outcome.findings {
            let (reason, other) = match finding {
                HoldFinding::Conflict { other_node, .. } => {
                    ("CIDRConflict", Some(other_node.clone()))
                }
                HoldFinding::OutOfRange { .. } => ("CIDROutOfRange", None),
                HoldFinding::ServiceRangeOverlap { .. } => ("CIDRServiceRangeOverlap", None),
            };
            let note = format!("node {name}: {finding}; netcm keeps it reserved and never hands out an overlapping range");
            tracing::warn!(controller = NAME, node = name, finding = %finding, "bad pod CIDR on node");
            self.recorder
                .publish(node, EventType::Warning, reason, "RecordCIDR", note.clone())
                .await;
            if let Some(other) = other {
                self.set_flagged(&other, true);
                if let Some(other_node) = self.nodes.get(&other) {
                    self.recorder
                        .publish(&other_node, EventType::Warning, reason, "RecordCIDR", note)
                        .await;
                }
            }
        }
    }

    /// The sync handler: allocate for a Node without pod CIDRs, record a Node that has them, release a
    /// Node that is gone. Decides from the cache alone.
    pub async fn sync_node(&self, name: &str) -> Result<SyncOutcome, SyncError> {
        let Some(node) = self.nodes.get(name) else {
            self.release(name);
            return Ok(SyncOutcome::Done);
        };
        let raw = netcm_manager::node::pod_cidrs(&node);
        if !raw.is_empty() {
            self.record_existing(&node, name, &raw).await;
            return Ok(SyncOutcome::Done);
        }
        if node.metadata.deletion_timestamp.is_some() {
            // Being deleted and never allocated: nothing to give it.
            return Ok(SyncOutcome::Done);
        }
        let allocation = {
            let mut pools = lock(&self.pools);
            let a = pools.allocate_detailed(name);
            if let Ok(a) = &a {
                self.metrics.allocated(&a.fresh);
                self.publish_usage(&pools);
            }
            a
        };
        let allocation = match allocation {
            Ok(a) => a,
            Err(e @ IpamError::Full { .. }) => {
                lock(&self.waiting).insert(name.to_string());
                tracing::warn!(controller = NAME, node = name, error = %e, "no pod CIDR available");
                self.recorder
                    .publish(
                        &node,
                        EventType::Warning,
                        "CIDRNotAvailable",
                        "AllocateCIDR",
                        format!("Node {name} status is now: CIDRNotAvailable ({e})"),
                    )
                    .await;
                return Err(SyncError::NoCidrAvailable(e));
            }
            Err(e) => return Err(SyncError::NoCidrAvailable(e)),
        };
        let cidrs: Vec<String> = allocation.cidrs.iter().map(ToString::to_string).collect();
        self.guard.ensure_leader()?;
        let patch = serde_json::json!({
            "spec": { "podCIDR": cidrs[0], "podCIDRs": cidrs }
        });
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(controller = NAME, node = name, cidrs = %cidrs.join(","), "assigned pod CIDRs");
                if self.record_assigned {
                    self.recorder
                        .publish(
                            &node,
                            EventType::Normal,
                            "CIDRAssigned",
                            "AllocateCIDR",
                            format!("Node {name} was assigned pod CIDRs {}", cidrs.join(",")),
                        )
                        .await;
                }
                Ok(SyncOutcome::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.release(name);
                Ok(SyncOutcome::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 422 => {
                // Someone else set the Node's pod CIDR since our cache saw it: give ours back and
                // record theirs when the update arrives.
                lock(&self.pools).release_node(name);
                tracing::info!(
                    controller = NAME,
                    node = name,
                    "node got pod CIDRs from elsewhere; released ours"
                );
                Ok(SyncOutcome::RetryAfter(Duration::from_secs(1)))
            }
            Err(e) => {
                // The allocation stays recorded for this Node, so the retry PATCHes the same CIDRs and
                // nothing leaks: a Node that disappears releases it.
                self.recorder
                    .publish(
                        &node,
                        EventType::Warning,
                        "CIDRAssignmentFailed",
                        "AllocateCIDR",
                        format!("Node {name} status is now: CIDRAssignmentFailed ({e})"),
                    )
                    .await;
                Err(SyncError::Patch(e))
            }
        }
    }

    /// Marks every CIDR any cached Node holds before the first allocation.
    pub async fn record_all_existing(self: &Arc<Self>) {
        let nodes = self.nodes.list();
        let mut recorded = 0usize;
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let raw = netcm_manager::node::pod_cidrs(&node);
            if !raw.is_empty() {
                self.record_existing(&node, &name, &raw).await;
                recorded += 1;
            }
        }
        let stats = lock(&self.pools).stats();
        for s in &stats {
            tracing::info!(controller = NAME, cluster_cidr = %s.cluster_cidr, allocated = s.allocated, max = s.max, "cluster CIDR usage after recording existing nodes");
        }
        tracing::info!(
            controller = NAME,
            nodes_with_cidrs = recorded,
            "recorded the pod CIDRs nodes already hold"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_pod_cidrs_are_separated_from_good_ones() {
        let (good, bad) = parse_pod_cidrs(&["10.0.0.0/24".into(), "banana".into()]);
        assert_eq!(good.len(), 1);
        assert_eq!(bad, ["banana"]);
    }
}

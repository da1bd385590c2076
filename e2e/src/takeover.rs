//! What the takeover tests (`split_brain`, `takeover_from_another_configuration`, `lagging_api_server`)
//! watch and count around a leader handing over: Nodes assigned, the Lease's new holder, CIDRs held twice,
//! `CIDRNotAvailable` Events, and an old leader's late Node PATCHes in the audit logs.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;

use crate::nodes::pod_cidrs;
use crate::{audit, Netcm, LEASE_NAME, LEASE_NAMESPACE};

/// Counts the Nodes whose names start with `prefix` that got pod CIDRs, as a Node watch through
/// `client` reports them. Started before a burst, it tells when the leader has written a few of it.
pub struct Assigned {
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Assigned {
    pub fn watch(client: &kube::Client, prefix: String) -> Assigned {
        let count = Arc::new(AtomicUsize::new(0));
        let stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default());
        let task = {
            let count = count.clone();
            tokio::spawn(async move {
                let mut seen = HashSet::new();
                let mut stream = std::pin::pin!(stream);
                while let Some(ev) = stream.next().await {
                    if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
                        let name = n.metadata.name.clone().unwrap_or_default();
                        if name.starts_with(&prefix) && !pod_cidrs(&n).is_empty() {
                            seen.insert(name);
                            count.store(seen.len(), Ordering::SeqCst);
                        }
                    }
                }
            })
        };
        Assigned { count, task }
    }

    /// Waits (polling every 2 ms) until `count` such Nodes were seen; the leader must keep running.
    pub async fn wait(&self, leader: &Netcm, count: usize) {
        let start = Instant::now();
        while self.count.load(Ordering::SeqCst) < count {
            leader.assert_running();
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{} assigned {} of {count} burst Nodes in 30 s",
                leader.label,
                self.count.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for Assigned {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `id` holds the Lease as seen through `client`; returns when it acquired it (acquireTime).
pub async fn wait_for_holder(
    client: &kube::Client,
    id: &str,
    timeout: Duration,
) -> jiff::Timestamp {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let start = Instant::now();
    loop {
        let spec = tokio::time::timeout(Duration::from_secs(2), leases.get_opt(LEASE_NAME))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .and_then(|l| l.spec);
        if let Some(spec) = spec.filter(|s| s.holder_identity.as_deref() == Some(id)) {
            return spec
                .acquire_time
                .map(|t| t.0)
                .expect("a held Lease has an acquireTime");
        }
        assert!(
            start.elapsed() < timeout,
            "{id} did not take the lease within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nodes holding a CIDR another Node holds too (for tests with one mask throughout, where an overlap is
/// an equal CIDR): each CIDR held n > 1 times counts n − 1; and the holders of each such CIDR.
pub fn shared_cidrs(nodes: &[Node]) -> (usize, BTreeMap<String, Vec<String>>) {
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in nodes {
        for c in pod_cidrs(n) {
            holders
                .entry(c)
                .or_default()
                .push(n.metadata.name.clone().unwrap_or_default());
        }
    }
    holders.retain(|_, names| names.len() > 1);
    let extra = holders.values().map(|v| v.len() - 1).sum();
    (extra, holders)
}

/// The Nodes `instance` recorded a CIDRNotAvailable Event about (none when the list fails).
pub async fn said_no_cidr(client: &kube::Client, instance: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("CIDRNotAvailable")
                        && e.reporting_instance.as_deref() == Some(instance)
                })
                .filter_map(|e| e.regarding.and_then(|r| r.name))
                .collect()
        })
        .unwrap_or_default()
}

/// One takeover: who was frozen out and when the new leader acquired the Lease.
pub struct Takeover {
    pub old_id: String,
    pub at: jiff::Timestamp,
}

/// Old leaders' Node PATCHes that the servers of `audit_logs` received after their successor acquired
/// the Lease: (received late, of which succeeded).
pub fn late_node_patches(
    audit_logs: impl IntoIterator<Item = impl AsRef<Path>>,
    takeovers: &[Takeover],
) -> (usize, usize) {
    let events: Vec<audit::AuditEvent> = audit_logs
        .into_iter()
        .flat_map(|p| audit::read(p.as_ref()))
        .collect();
    let late: Vec<&audit::AuditEvent> = events
        .iter()
        .filter(|e| e.verb == "patch" && e.resource() == "nodes")
        .filter(|e| {
            takeovers
                .iter()
                .any(|t| e.user_agent.contains(&t.old_id) && e.received().is_some_and(|r| r > t.at))
        })
        .collect();
    let landed = late.iter().filter(|e| e.succeeded()).count();
    (late.len(), landed)
}

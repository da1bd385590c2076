//! A leader that takes over from one that ran with another configuration (issue 26, item 2): the old
//! leader runs with `--pod-cidr-claims=false`, as during a rolling upgrade that turns claims on. It and its
//! API server are frozen (SIGSTOP) while its Node PATCHes are in flight, the new leader — claims on — takes
//! over through the other API server, and the frozen server is thawed and handles the old leader's PATCHes
//! late (the old leader, frozen too, has not abandoned them at their deadline). Without claims of the old leader there is nothing for the new one's quarantine to hold, and its
//! round-robin starts at the lowest free CIDR: the ones the old leader's late writes carry. netcm must read
//! the old leader's configuration from the Lease it takes and hand out nothing until those writes are over.
//!
//! The harness's two API servers on one etcd (`e2e/src/apiservers.rs`), as in `split_brain.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::audit;
use netcm_e2e::nodes::{all_nodes, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::{client_for, wait_for, Netcm, TestEnv, LEASE_NAME, LEASE_NAMESPACE};

/// Rounds, each with fresh replicas and a fresh cluster CIDR.
const ROUNDS: usize = 5;
/// A lease duration of 3 s (whole seconds, as the Lease stores them).
const ELECTION: [&str; 3] = [
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=500ms",
];
/// A /20 of /26s: 64 CIDRs, fewer than the burst, so the new leader's round-robin runs into the old
/// leader's in-flight CIDRs and some Nodes are left waiting.
const MASK: &str = "--node-cidr-mask-size=26";
/// Nodes waiting when the old leader starts; more than the pool holds.
const BURST: usize = 100;
const BURST_CONCURRENCY: usize = 32;
/// The freeze comes when the old leader has assigned this many Nodes: its other workers' PATCHes are on
/// the wire then.
const FREEZE_AFTER_ASSIGNED: usize = 1;
/// How long after the takeover the old leader's server is thawed: time for the new leader to list and
/// allocate (so the late writes land on what it has done), well inside the old leader's lease duration.
const THAW_AFTER_TAKEOVER: Duration = Duration::from_millis(1500);

/// Counts the Nodes named `prefix…` that got pod CIDRs, as a watch through `client` reports them.
struct Assigned {
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Assigned {
    fn watch(client: &kube::Client, prefix: String) -> Assigned {
        let count = Arc::new(AtomicUsize::new(0));
        let stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default());
        let task = {
            let count = count.clone();
            tokio::spawn(async move {
                let mut seen = std::collections::HashSet::new();
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

    /// Waits (polling every 2 ms) until `count` such Nodes were seen.
    async fn wait(&self, leader: &Netcm, count: usize) {
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

/// Waits until `id` holds the Lease as seen through `client`; returns when it acquired it.
async fn wait_for_holder(client: &kube::Client, id: &str) -> jiff::Timestamp {
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
            start.elapsed() < Duration::from_secs(30),
            "{id} did not take the lease within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nodes holding a CIDR another Node holds too (one mask throughout, so an overlap is an equal CIDR):
/// each CIDR held n > 1 times counts n − 1; and the holders of each such CIDR.
fn shared_cidrs(nodes: &[Node]) -> (usize, BTreeMap<String, Vec<String>>) {
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

/// The Node PATCHes of `old_id` that `audit_log`'s server received after `after`: (received, succeeded).
fn late_node_patches(
    audit_log: &std::path::Path,
    old_id: &str,
    after: jiff::Timestamp,
) -> (usize, usize) {
    let late: Vec<audit::AuditEvent> = audit::read(audit_log)
        .into_iter()
        .filter(|e| e.verb == "patch" && e.resource() == "nodes")
        .filter(|e| e.user_agent.contains(old_id) && e.received().is_some_and(|r| r > after))
        .collect();
    (late.len(), late.iter().filter(|e| e.succeeded()).count())
}

/// The Nodes `instance` recorded a CIDRNotAvailable Event about.
async fn said_no_cidr(client: &kube::Client, instance: &str) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_claims_that_follows_one_without_gives_out_no_cidr_the_old_leaders_late_writes_carry(
) {
    // Dropped in reverse: the replicas, the servers (thawed, the second stopped), the cluster lock.
    let env = TestEnv::new().await;
    let servers = tokio::task::spawn_blocking(ApiServers::start)
        .await
        .expect("start the second kube-apiserver");
    let clients = [
        env.client.clone(),
        client_for(servers.kubeconfig(Apiserver::Two)).await,
    ];
    let (frozen, live) = (Apiserver::One, Apiserver::Two);

    let mut overlaps = 0;
    for round in 0..ROUNDS {
        if round > 0 {
            env.clean().await;
        }
        let cidr = format!("--cluster-cidr=10.{}.0.0/20", 16 * (round + 1));
        let mut args = vec!["--controllers=subnet-allocator", cidr.as_str(), MASK];
        args.extend_from_slice(&ELECTION);
        let mut without_claims = args.clone();
        without_claims.push("--pod-cidr-claims=false");

        // A backlog the old leader works through with every worker, so PATCHes are on the wire when its
        // server freezes, once it has assigned a few.
        let prefix = format!("r{round}-");
        let names: Vec<String> = (0..BURST).map(|i| format!("{prefix}{i:03}")).collect();
        create_nodes(
            &clients[live.index()],
            names
                .iter()
                .map(|n| NodeFixture::named(n.clone()))
                .collect(),
            BURST_CONCURRENCY,
        )
        .await;
        let assigned = Assigned::watch(&clients[frozen.index()], prefix.clone());
        let mut old = Netcm::start(
            &format!("r{round}-old-without-claims"),
            servers.kubeconfig(frozen),
            &without_claims,
        );
        let old_id = old.identity().await;
        assigned.wait(&old, FREEZE_AFTER_ASSIGNED).await;
        drop(assigned);
        servers.freeze(frozen);
        // The old leader too, so it does not abandon those PATCHes at its write deadline: its API server
        // then handles them as sent, whenever it is thawed.
        old.signal("STOP");
        let frozen_at = Instant::now();
        // The new leader starts now: it sees the old leader's record and takes over a lease duration later.
        let new = Netcm::start(
            &format!("r{round}-new-with-claims"),
            servers.kubeconfig(live),
            &args,
        );
        let new_id = new.identity().await;
        let acquired = wait_for_holder(&clients[live.index()], &new_id).await;
        let took_over_after = frozen_at.elapsed();
        // The old leader's queued PATCHes land a moment after the takeover.
        tokio::time::sleep(THAW_AFTER_TAKEOVER).await;
        servers.thaw(frozen);
        old.signal("CONT");
        let status = old.wait_exit(Duration::from_secs(30)).await;
        assert!(
            !status.success(),
            "round {round}: the frozen-out leader must exit non-zero, got {status}"
        );
        let created = names;

        // Settled: the old leader is gone (its writes answered or abandoned) and the new one has either
        // given each burst Node a CIDR or said it has none for it.
        let nodes = wait_for(
            "every burst Node to hold a CIDR or to be told by the new leader there is none",
            Duration::from_secs(120),
            || async {
                let told = said_no_cidr(&clients[live.index()], &new_id).await;
                let nodes = all_nodes(&clients[live.index()]).await;
                let settled = created.iter().all(|name| {
                    told.contains(name)
                        || nodes.iter().any(|n| {
                            n.metadata.name.as_ref() == Some(name) && !pod_cidrs(n).is_empty()
                        })
                });
                settled.then_some(nodes)
            },
        )
        .await;
        let (shared, holders) = shared_cidrs(&nodes);
        let allocated = nodes.iter().filter(|n| !pod_cidrs(n).is_empty()).count();
        let (late, landed) = late_node_patches(servers.audit_log(frozen), &old_id, acquired);
        eprintln!(
            "[mixed-config] round {round}: took over {took_over_after:.1?} after the freeze; the old leader's PATCHes \
             received after it: {late} ({landed} succeeded); {allocated}/{} Nodes hold a CIDR; Nodes sharing one: {shared} {holders:?}",
            created.len()
        );
        overlaps += shared;
        drop(new);
        drop(old);
    }
    eprintln!("[mixed-config] {ROUNDS} rounds: {overlaps} Nodes hold a CIDR another Node holds");
    assert_eq!(
        overlaps, 0,
        "the new leader gave out CIDRs the old leader's late writes carried"
    );
}

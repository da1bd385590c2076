//! A leader that takes over from one that ran with another configuration: the old
//! leader runs with `--pod-cidr-claims=false`, as during a rolling upgrade that turns claims on. It and its
//! API server are frozen (SIGSTOP) while its Node PATCHes are in flight, the new leader — claims on — takes
//! over through the other API server, and the frozen server is thawed and handles the old leader's PATCHes
//! late (the old leader, frozen too, has not abandoned them at their deadline). Without claims of the old leader there is nothing for the new one's quarantine to hold, and its
//! round-robin starts at the lowest free CIDR: the ones the old leader's late writes carry. netcm must read
//! the old leader's configuration from the Lease it takes and hand out nothing until those writes are over.
//!
//! The harness's two API servers on one etcd (`e2e/src/apiservers.rs`), as in `split_brain.rs`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::nodes::{all_nodes, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::takeover::{
    late_node_patches, said_no_cidr, shared_cidrs, wait_for_holder, Assigned, Takeover,
};
use netcm_e2e::{client_for, wait_for, Netcm, TestEnv};

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
const NODE_MASK: u8 = 26;
/// Nodes waiting when the old leader starts; more than the pool holds.
const BURST: usize = 100;
const BURST_CONCURRENCY: usize = 32;
/// The freeze comes when the old leader has assigned this many Nodes: its other workers' PATCHes are on
/// the wire then. After the first one the burst had often not got going (in 4 of 5 rounds of one run
/// none of its PATCHes reached the server late); after eight, 10 of 10 rounds had some land late.
const FREEZE_AFTER_ASSIGNED: usize = 8;
/// How long after the takeover the old leader's server is thawed, for [`Thaw::SoonAfterTheTakeover`]:
/// inside the bound the new leader waits out, well inside the old leader's lease duration.
const THAW_AFTER_TAKEOVER: Duration = Duration::from_millis(1500);

/// When the frozen server handles the old leader's PATCHes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thaw {
    /// While the new leader still waits out the bound on the writes the old one could send: the late
    /// writes land, on Nodes the new leader has not served yet, and it records them.
    SoonAfterTheTakeover,
    /// Once the new leader has allocated, so past that bound: only the touch of every waiting Node voids
    /// the writes; not one may land.
    AfterTheNewLeadersFirstAllocation,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_claims_that_follows_one_without_gives_out_no_cidr_the_old_leaders_late_writes_carry(
) {
    let (late, landed) = rounds(Thaw::SoonAfterTheTakeover).await;
    // Else no freeze caught a write in flight, and no round tested what the new leader does about one.
    assert!(
        landed > 0,
        "in no round did a PATCH of the frozen-out leader land after the takeover ({late} received)"
    );
}

/// The wait bounds the writes the old leader could still send, not the ones already on the wire: a PATCH
/// a frozen API server delivers after the new leader's first allocation is refused (the new leader
/// touched the Node first), so none lands and no CIDR is held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_of_a_leader_without_claims_delivered_after_the_new_leaders_first_allocation_is_void(
) {
    let (late, landed) = rounds(Thaw::AfterTheNewLeadersFirstAllocation).await;
    assert!(
        late > 0,
        "in no round did the frozen-out leader's server receive a PATCH after the takeover: nothing was in flight"
    );
    assert_eq!(
        landed, 0,
        "{landed} of the old leader's {late} late PATCHes landed after the new leader's first allocation"
    );
}

/// [`ROUNDS`] takeovers from a leader without claims whose PATCHes a frozen server holds, thawed at
/// `thaw`; fails on any CIDR held twice. The old leaders' PATCHes received after the takeover, and how
/// many of them succeeded.
async fn rounds(thaw: Thaw) -> (usize, usize) {
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

    let (mut overlaps, mut late_received, mut late_landed) = (0, 0, 0);
    for round in 0..ROUNDS {
        if round > 0 {
            env.clean().await;
        }
        let cluster: IpNet = format!("10.{}.0.0/20", 16 * (round + 1))
            .parse()
            .expect("cluster CIDR");
        let cidr = format!("--cluster-cidr={cluster}");
        let mask = format!("--node-cidr-mask-size={NODE_MASK}");
        let mut args = vec![
            "--controllers=subnet-allocator",
            cidr.as_str(),
            mask.as_str(),
        ];
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
        let acquired =
            wait_for_holder(&clients[live.index()], &new_id, Duration::from_secs(30)).await;
        let took_over_after = frozen_at.elapsed();
        match thaw {
            Thaw::SoonAfterTheTakeover => tokio::time::sleep(THAW_AFTER_TAKEOVER).await,
            Thaw::AfterTheNewLeadersFirstAllocation => {
                // The frozen server wrote nothing since the freeze: a burst Node with a CIDR beyond
                // those the old leader's answered writes gave is the new leader's.
                let before = with_cidrs(&clients[live.index()], &prefix).await;
                wait_for(
                    "the new leader's first allocation",
                    Duration::from_secs(60),
                    || async {
                        (with_cidrs(&clients[live.index()], &prefix).await > before).then_some(())
                    },
                )
                .await;
            }
        }
        servers.thaw(frozen);
        old.signal("CONT");
        let status = old.wait_exit(Duration::from_secs(30)).await;
        assert!(
            !status.success(),
            "round {round}: the frozen-out leader must exit non-zero, got {status}"
        );
        let created = names;
        // More Nodes than CIDRs: once the old leader's writes are over, the new leader must hand out every
        // CIDR no Node holds. A leader that hands out nothing would leave the pool part empty and every
        // Node told there is none, and share no CIDR: settling on Events alone proved nothing.
        let pool = cluster
            .subnets(NODE_MASK)
            .expect("node CIDRs of the cluster CIDR")
            .count();

        // Settled: the old leader is gone (its writes answered or abandoned), every CIDR of the pool is
        // held, and the new leader has said it has none for each burst Node left without one.
        let nodes = wait_for(
            "every CIDR of the pool to be held and every other burst Node told by the new leader there is none",
            Duration::from_secs(120),
            || async {
                let told = said_no_cidr(&clients[live.index()], &new_id).await;
                let nodes = all_nodes(&clients[live.index()]).await;
                let held: HashSet<String> = nodes.iter().flat_map(pod_cidrs).collect();
                let settled = created.iter().all(|name| {
                    told.contains(name)
                        || nodes.iter().any(|n| {
                            n.metadata.name.as_ref() == Some(name) && !pod_cidrs(n).is_empty()
                        })
                });
                (settled && held.len() == pool.min(BURST)).then_some(nodes)
            },
        )
        .await;
        let (shared, holders) = shared_cidrs(&nodes);
        let allocated = nodes.iter().filter(|n| !pod_cidrs(n).is_empty()).count();
        netcm_e2e::audit::wait_logged_until_now(
            &clients[frozen.index()],
            servers.audit_log(frozen),
        )
        .await;
        let (late, landed) = late_node_patches(
            [servers.audit_log(frozen)],
            &[Takeover {
                old_id: old_id.clone(),
                at: acquired,
            }],
        );
        eprintln!(
            "[mixed-config] round {round}: took over {took_over_after:.1?} after the freeze; the old leader's PATCHes \
             received after it: {late} ({landed} succeeded); {allocated}/{} Nodes hold a CIDR; Nodes sharing one: {shared} {holders:?}",
            created.len()
        );
        overlaps += shared;
        late_received += late;
        late_landed += landed;
        drop(new);
        drop(old);
    }
    eprintln!(
        "[mixed-config] {thaw:?}, {ROUNDS} rounds: {overlaps} Nodes hold a CIDR another Node holds; \
         of the old leaders' PATCHes received after the takeover ({late_received}), {late_landed} landed"
    );
    assert_eq!(
        overlaps, 0,
        "the new leader gave out CIDRs the old leader's late writes carried"
    );
    (late_received, late_landed)
}

/// How many Nodes named `prefix…` hold pod CIDRs.
async fn with_cidrs(client: &kube::Client, prefix: &str) -> usize {
    all_nodes(client)
        .await
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(prefix))
                && !pod_cidrs(n).is_empty()
        })
        .count()
}

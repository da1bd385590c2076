//! A replica that takes over through an API server whose view of Nodes lags behind etcd. A
//! list "at any version" (`resourceVersion=0`) is served from that server's watch cache, older than
//! what the previous leader already wrote; a new leader that starts from it does not know a CIDR is held
//! and gives it out again. netcm's first list must be a consistent read.
//!
//! How the lag is made, with real parts only: the second kube-apiserver reaches etcd for Nodes — and only
//! for Nodes — through a TCP proxy in this test (`--etcd-servers-overrides=/nodes#http://127.0.0.1:<proxy>`)
//! that holds every byte etcd sends back for [`DELAY`]. Its Node watch cache then shows etcd as it was
//! `DELAY` ago, while Leases, Events and everything else it serves are current. A consistent read through
//! it still sees the present: it is answered from etcd (or from the cache once it has caught up), only
//! `DELAY` later. (Freezing the server, or its etcd connection as a whole, stops it answering at all; a
//! delay is what makes a cache stale.)
//!
//! Claims are off for both replicas: with claims, the quarantine's touches go through the lagging server
//! too, each waiting `DELAY` for its answer, and the cache has caught up before the quarantine ends — the
//! stale list would be hidden by timing, not prevented.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::nodes::{create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::takeover::{said_no_cidr, shared_cidrs};
use netcm_e2e::webhook::{SlowWebhook, SLOW_WRITES_LABEL};
use netcm_e2e::{audit, client_for, control_plane, wait_for, Netcm, TestEnv};

mod etcd_delay;
use etcd_delay::EtcdDelay;

/// How far the second server's Node watch cache lags behind etcd. Longer than a takeover takes (the old
/// leader releases on SIGTERM, the standby wakes on the Lease watch), shorter than the etcd client's
/// keepalive timeout (10 s), so the server never drops the connection as dead.
const DELAY: Duration = Duration::from_secs(8);
/// How long the webhook holds each write of the warm standby test's Nodes: longer than [`DELAY`], so the
/// old leader's write is still in flight when the standby's cache shows the Nodes; shorter than netcm's
/// write timeout (the renew deadline less a margin, 9.5 s), so it lands.
const WRITE_HOLD: Duration = Duration::from_millis(8_600);
/// Rounds of allocate, hand over, check: `NETCM_LAGGING_ROUNDS`, else `default` (at most 20: each round
/// has a range of its own in 10.200.0.0-10.255.255.255). More rounds by hand for a campaign.
fn rounds(default: usize) -> usize {
    std::env::var("NETCM_LAGGING_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0 && *r <= 20)
        .unwrap_or(default)
}

/// The cold takeover's rounds: a leader that started from the stale list gives the one CIDR to one of
/// [`NODES`] waiting Nodes in no particular order, so a round misses the overlap only if it picks the Node
/// the old leader wrote to: 1 in 11, 1 in 121 over two rounds.
const COLD_ROUNDS: usize = 2;
/// The warm standby's rounds: without the catch-up proof the stale cache gave a CIDR twice in 2 of 3
/// rounds (the rest caught up by timing), so three.
const WARM_ROUNDS: usize = 3;

/// Nodes created each round; the pool has one CIDR, so one gets it and the others wait.
const NODES: usize = 11;

/// The port etcd listens on, from the control plane's env file beside its kubeconfig.
fn etcd_port() -> u16 {
    let env = control_plane().kubeconfig.with_file_name("env");
    let text =
        std::fs::read_to_string(&env).unwrap_or_else(|e| panic!("read {}: {e}", env.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("ETCD_PORT="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ETCD_PORT in {}", env.display()))
}

/// The names of the Nodes a list at any version (`resourceVersion=0`: the watch cache) returns.
async fn cached_node_names(client: &kube::Client) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().match_any())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect()
        })
        .unwrap_or_default()
}

/// The second API server, whose Node watch cache lags [`DELAY`] behind etcd, beside the first.
struct Lagging {
    servers: ApiServers,
    _proxy: EtcdDelay,
    one: kube::Client,
    two: kube::Client,
}

impl Lagging {
    /// Starts the second server behind the delaying proxy; from then on its Node cache lags.
    async fn start(env: &TestEnv) -> Lagging {
        let proxy = EtcdDelay::start(etcd_port()).await;
        let override_flag = format!(
            "--etcd-servers-overrides=/nodes#http://127.0.0.1:{}",
            proxy.port
        );
        let servers = tokio::task::spawn_blocking(move || {
            ApiServers::start_with_flags(&[override_flag.as_str()])
        })
        .await
        .expect("start the second kube-apiserver");
        let two = client_for(servers.kubeconfig(Apiserver::Two)).await;
        // Started without delay (its readiness check reads etcd); from now on its Node cache lags.
        proxy.set_delay(DELAY);
        Lagging {
            servers,
            _proxy: proxy,
            one: env.client.clone(),
            two,
        }
    }
}

/// Sends the old leader SIGTERM, which it must exit from cleanly, and waits until the new one leads.
async fn hand_over(old: &mut Netcm, new: &Netcm) {
    old.signal("TERM");
    let status = old.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "the old leader stops cleanly on SIGTERM: {status}"
    );
    new.wait_leading(Duration::from_secs(30)).await;
}

/// Every Node, and those sharing a CIDR (how many beyond the first, and who), once the new leader `new_id`
/// has caught up with etcd: it has said it has no CIDR for `marker`, a Node created after the old leader's
/// write that the pool cannot serve.
async fn once_caught_up(
    one: &kube::Client,
    two: &kube::Client,
    new_id: &str,
    marker: &str,
) -> (
    Vec<Node>,
    usize,
    std::collections::BTreeMap<String, Vec<String>>,
) {
    wait_for(
        "the new leader to find no CIDR for the marker Node",
        Duration::from_secs(180),
        || async {
            said_no_cidr(two, new_id)
                .await
                .iter()
                .any(|n| n == marker)
                .then_some(())
        },
    )
    .await;
    let nodes = netcm_e2e::nodes::all_nodes(one).await;
    let (shared, holders) = shared_cidrs(&nodes);
    (nodes, shared, holders)
}

/// How long after the API server received the old leader's write of `holder`'s CIDR (through the
/// server that is current) the new leader `new_id` asked the lagging server for its first list of Nodes
/// (a LIST, or a watch that streams the initial objects), as the two audit logs show: both servers run
/// on this machine, one clock. A cache [`DELAY`] behind etcd holds the write only once that is over.
fn first_list_after_the_write(
    servers: &ApiServers,
    old_id: &str,
    holder: &str,
    new_id: &str,
) -> jiff::SignedDuration {
    let written = audit::read(servers.audit_log(Apiserver::One))
        .into_iter()
        .filter(|e| e.user_agent.contains(old_id) && e.verb == "patch" && e.succeeded())
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "nodes" && o.name == holder)
        })
        .filter_map(|e| e.received())
        .min()
        .unwrap_or_else(|| {
            panic!("no PATCH of {holder} by the old leader {old_id} in the audit log")
        });
    // A watch is logged at its start too (`ResponseStarted`): the streaming list is there while it runs.
    let listed = audit::read_every_request(servers.audit_log(Apiserver::Two))
        .into_iter()
        .filter(|e| e.user_agent.contains(new_id) && e.resource() == "nodes")
        .filter(|e| {
            let q = query_pairs(&e.request_uri);
            e.verb == "list" || (e.verb == "watch" && q.contains(&"sendInitialEvents=true"))
        })
        .filter_map(|e| e.received())
        .min()
        .unwrap_or_else(|| {
            panic!("no list of Nodes by the new leader {new_id} in the lagging server's audit log")
        });
    listed.duration_since(written)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_taking_over_through_a_lagging_api_server_never_gives_out_a_cidr_a_node_already_holds(
) {
    // Dropped in reverse: the replicas, the servers (the second stopped), the proxy, the cluster lock.
    let env = TestEnv::new().await;
    let lagging = Lagging::start(&env).await;
    let (servers, one, two) = (&lagging.servers, &lagging.one, &lagging.two);

    let mut overlaps = 0;
    let rounds = rounds(COLD_ROUNDS);
    for round in 0..rounds {
        if round > 0 {
            env.clean().await;
        }
        let cidr = format!("--cluster-cidr=10.{}.0.0/24", 200 + round);
        let args = [
            "--controllers=subnet-allocator",
            cidr.as_str(),
            "--node-cidr-mask-size=24",
            "--pod-cidr-claims=false",
            // Cold: its first list is made after it takes the Lease (the warm standby's test is below).
            "--warm-standby=false",
        ];
        let names: Vec<String> = (0..NODES).map(|i| format!("r{round}-{i:02}")).collect();
        create_nodes(
            one,
            names
                .iter()
                .map(|n| NodeFixture::named(n.clone()))
                .collect(),
            8,
        )
        .await;
        // The lagging server's cache has the Nodes, without pod CIDRs.
        wait_for(
            "the lagging server's cache to show the new Nodes",
            Duration::from_secs(60),
            || async {
                let cached = cached_node_names(two).await;
                names.iter().all(|n| cached.contains(n)).then_some(())
            },
        )
        .await;

        let mut old = Netcm::start(
            &format!("r{round}-old-leader"),
            servers.kubeconfig(Apiserver::One),
            &args,
        );
        let old_id = old.identity().await;
        let holder = wait_for(
            "the old leader to give the pool's one CIDR to a Node",
            Duration::from_secs(60),
            || async {
                let nodes = netcm_e2e::nodes::all_nodes(one).await;
                nodes
                    .into_iter()
                    .find(|n| !pod_cidrs(n).is_empty())
                    .and_then(|n| n.metadata.name)
            },
        )
        .await;
        let written = Instant::now();
        // Created after that write: once a replica has seen it, it has seen the write.
        let marker = format!("r{round}-marker");
        create_nodes(one, vec![NodeFixture::named(marker.clone())], 1).await;

        let new = Netcm::start(
            &format!("r{round}-new-leader"),
            servers.kubeconfig(Apiserver::Two),
            &args,
        );
        let new_id = new.identity().await;
        new.wait_standing_by(two, Duration::from_secs(30)).await;
        hand_over(&mut old, &new).await;
        let handed_over = written.elapsed();

        let (nodes, shared, holders) = once_caught_up(one, two, &new_id, &marker).await;
        let allocated = nodes.iter().filter(|n| !pod_cidrs(n).is_empty()).count();
        let listed_after = first_list_after_the_write(servers, &old_id, &holder, &new_id);
        eprintln!(
            "[lagging] round {round}: the old leader gave the CIDR to {holder}; the new leader led {handed_over:.1?} after that write \
             and asked for its first list of Nodes {listed_after:#} after the API server received it; \
             {allocated} Nodes hold a CIDR; Nodes sharing one: {shared} {holders:?}"
        );
        // Else the lagging cache held the write by the time the new leader listed, and even a list at any
        // version would have shown the CIDR held: the round would prove nothing.
        assert!(
            listed_after < jiff::SignedDuration::try_from(DELAY).expect("DELAY fits"),
            "round {round}: the new leader asked for its first list of Nodes {listed_after:#} after the old leader's \
             write reached the API server, by when the cache lagging {DELAY:?} behind etcd held it"
        );
        overlaps += shared;
        drop(new);
    }
    eprintln!("[lagging] {rounds} rounds: {overlaps} Nodes hold a CIDR another Node holds");
    assert_eq!(
        overlaps, 0,
        "a leader that started from a stale list gave out a CIDR a Node already held"
    );
}

/// A warm standby's cache is only as new as its watch. Here the standby's watch goes through the lagging
/// server. The old leader gives the pool's last CIDR to one of the Nodes created at once, and the webhook
/// holds that write for [`WRITE_HOLD`]; once the standby's cache shows those Nodes, the old leader is
/// stopped: its drain waits for the write to land, then it releases the Lease. The new leader's cache then
/// shows every Node waiting and the CIDR free, and the write only [`DELAY`] after it landed; a leader
/// that started from that cache gives the same CIDR to another of the Nodes (they are queued in no
/// particular order). netcm first proves its cache holds a write it made after taking the Lease
/// (`run/catch_up.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_standby_whose_watch_lags_proves_its_cache_fresh_before_it_gives_out_a_cidr() {
    let env = TestEnv::new().await;
    let lagging = Lagging::start(&env).await;
    let (servers, one, two) = (&lagging.servers, &lagging.one, &lagging.two);
    let (mut overlaps, mut catch_ups) = (0, Vec::new());
    let rounds = rounds(WARM_ROUNDS);
    for round in 0..rounds {
        if round > 0 {
            env.clean().await;
        }
        // Per round: the harness's clean removes webhook configurations.
        let webhook = SlowWebhook::start(one, "netcm-e2e-warm-lag", WRITE_HOLD).await;
        // Two CIDRs: the first Node's, and the last one, which the Nodes created at once wait for.
        let cidr = format!("--cluster-cidr=10.{}.0.0/23", 210 + 2 * round);
        let args = [
            "--controllers=subnet-allocator",
            cidr.as_str(),
            "--node-cidr-mask-size=24",
            "--pod-cidr-claims=false",
            "--warm-standby=true",
        ];
        let mut old = Netcm::start(
            &format!("w{round}-old-leader"),
            servers.kubeconfig(Apiserver::One),
            &args,
        );
        old.wait_leading(Duration::from_secs(30)).await;
        create_nodes(one, vec![NodeFixture::named(format!("w{round}-first"))], 1).await;
        netcm_e2e::nodes::wait_all_allocated(one, 1, Duration::from_secs(60)).await;
        let new = Netcm::start(
            &format!("w{round}-new-leader"),
            servers.kubeconfig(Apiserver::Two),
            &args,
        );
        let new_id = new.identity().await;
        new.wait_standing_by(two, Duration::from_secs(30)).await;
        new.wait_metric(
            "netcm_node_cache_nodes",
            "1",
            |v| v == 1.0,
            Duration::from_secs(60),
        )
        .await;

        let names: Vec<String> = (0..NODES).map(|i| format!("w{round}-{i:02}")).collect();
        let created = Instant::now();
        create_nodes(
            one,
            names
                .iter()
                .map(|n| NodeFixture::named(n.clone()).label(SLOW_WRITES_LABEL, "true"))
                .collect(),
            NODES,
        )
        .await;
        // The standby's cache shows them, waiting; the old leader's write is still held.
        let all = (1 + NODES) as f64;
        new.wait_metric(
            "netcm_node_cache_nodes",
            "every Node",
            |v| v == all,
            Duration::from_secs(60),
        )
        .await;
        hand_over(&mut old, &new).await;
        let led = created.elapsed();
        let holder = netcm_e2e::nodes::all_nodes(one)
            .await
            .into_iter()
            .filter(|n| n.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
            .find(|n| !pod_cidrs(n).is_empty())
            .and_then(|n| n.metadata.name);
        let marker = format!("w{round}-marker");
        create_nodes(one, vec![NodeFixture::named(marker.clone())], 1).await;
        let (_, shared, holders) = once_caught_up(one, two, &new_id, &marker).await;
        let proven = new
            .metric("netcm_node_cache_catch_ups_total{result=\"proven\"}")
            .await;
        let relisted = new
            .metric("netcm_node_cache_catch_ups_total{result=\"relisted\"}")
            .await;
        eprintln!(
            "[lagging] warm round {round}: the old leader gave the CIDR to {holder:?}; the new leader led {led:.1?} after the Nodes were created; \
             catch-ups proven {proven:?}, relisted {relisted:?}; Nodes sharing one: {shared} {holders:?}"
        );
        assert!(
            holder.is_some(),
            "the old leader's held write landed before it let go of the Lease"
        );
        assert!(
            led < WRITE_HOLD + DELAY,
            "the new leader led {led:?} after the Nodes were created: its cache could have caught up by itself"
        );
        webhook.remove(one).await;
        catch_ups.push(proven.unwrap_or(0.0) + relisted.unwrap_or(0.0));
        overlaps += shared;
        drop(new);
    }
    assert_eq!(
        overlaps, 0,
        "a leader that started from a warm cache behind its watch gave out a CIDR a Node already held"
    );
    assert_eq!(
        catch_ups,
        vec![1.0; rounds],
        "each new leader caught its warm cache up once"
    );
}

/// The query parameters of a request URI, as `key=value` strings.
fn query_pairs(uri: &str) -> Vec<&str> {
    uri.split_once('?')
        .map(|(_, q)| q.split('&').collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_list_of_nodes_the_informer_asks_for_is_a_consistent_read_as_the_api_server_received_it(
) {
    let env = TestEnv::new().await;
    let names: Vec<String> = (0..3).map(|i| format!("consistent-{i}")).collect();
    create_nodes(
        &env.client,
        names
            .iter()
            .map(|n| NodeFixture::named(n.clone()))
            .collect(),
        3,
    )
    .await;
    let n = Netcm::start(
        "consistent",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.250.0.0/16",
        ],
    );
    let id = n.identity().await;
    netcm_e2e::nodes::wait_all_allocated(&env.client, names.len(), Duration::from_secs(60)).await;
    // A watch is audited when it ends: stop netcm, then read every request once it completed.
    drop(n);
    let reads = wait_for(
        "netcm's Node watch to end in the audit log",
        Duration::from_secs(30),
        || async {
            let reads: Vec<audit::AuditEvent> = audit::read(&env.cp.audit_log)
                .into_iter()
                .filter(|e| e.user_agent.contains(&id) && e.resource() == "nodes")
                .filter(|e| e.verb == "list" || e.verb == "watch")
                .collect();
            reads
                .iter()
                .any(|e| query_pairs(&e.request_uri).contains(&"sendInitialEvents=true"))
                .then_some(reads)
        },
    )
    .await;
    let uris: Vec<&str> = reads.iter().map(|e| e.request_uri.as_str()).collect();
    // The lists: LIST requests, and watches that stream the initial objects (the probe among them).
    let lists: Vec<&str> = uris
        .iter()
        .copied()
        .filter(|u| {
            let q = query_pairs(u);
            !q.contains(&"watch=true") || q.contains(&"sendInitialEvents=true")
        })
        .collect();
    assert!(
        !lists.is_empty(),
        "no list of Nodes was received: {uris:#?}"
    );
    for uri in &lists {
        let version = query_pairs(uri)
            .into_iter()
            .find_map(|p| p.strip_prefix("resourceVersion="));
        assert!(
            version.is_none_or(str::is_empty),
            "a list of Nodes at resourceVersion {version:?}, not a consistent read: {uri}"
        );
    }
    assert!(
        uris.iter()
            .all(|u| !query_pairs(u).contains(&"resourceVersion=0")),
        "a request for Nodes at any version (resourceVersion=0): {uris:#?}"
    );
}

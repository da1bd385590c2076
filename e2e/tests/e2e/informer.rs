//! The shared Node informer on the real control plane: how it lists, judged by what the API server
//! received (its audit log), not by what netcm says it did.

use std::path::Path;
use std::time::Duration;

use netcm_e2e::apiservers::{ApiServers, Apiserver};
use netcm_e2e::audit::{self, AuditEvent};
use netcm_e2e::nodes::{create_nodes, wait_all_allocated, NodeFixture};
use netcm_e2e::{client_for, wait_for, Netcm, TestEnv};

const PROBE: &str = "streaming-list-probe";

/// Starts an allocator against `kubeconfig` with `nodes` Nodes waiting, waits until all have CIDRs, and
/// returns netcm's requests on Nodes that the API server audited (lists and watches).
async fn node_reads_of_an_allocator(
    kubeconfig: &Path,
    audit_log: &Path,
    prefix: &str,
    nodes: usize,
) -> Vec<AuditEvent> {
    let client = client_for(kubeconfig).await;
    create_nodes(
        &client,
        (0..nodes)
            .map(|i| NodeFixture::named(format!("{prefix}-{i}")))
            .collect(),
        8,
    )
    .await;
    let n = Netcm::start(
        prefix,
        kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.250.0.0/16",
        ],
    );
    let id = n.identity().await;
    wait_all_allocated(&client, nodes, Duration::from_secs(60)).await;
    // A watch is audited when it ends: stop netcm, then read every request once, at completion.
    drop(n);
    wait_for(
        "netcm's Node watch to end in the audit log",
        Duration::from_secs(30),
        || async {
            let reads: Vec<AuditEvent> = audit::read(audit_log)
                .into_iter()
                .filter(|e| e.user_agent.contains(&id) && e.resource() == "nodes")
                .filter(|e| e.stage == "ResponseComplete")
                .filter(|e| e.verb == "list" || e.verb == "watch")
                .collect();
            reads
                .iter()
                .any(|e| e.verb == "watch" && !probe(e))
                .then_some(reads)
        },
    )
    .await
}

fn streaming(e: &AuditEvent) -> bool {
    e.verb == "watch" && e.request_uri.contains("sendInitialEvents=true")
}

fn probe(e: &AuditEvent) -> bool {
    e.request_uri.contains(PROBE)
}

#[tokio::test]
async fn the_node_cache_is_filled_by_one_streaming_list_and_no_list_request_where_the_api_server_serves_them(
) {
    let env = TestEnv::new().await;
    let reads =
        node_reads_of_an_allocator(&env.cp.kubeconfig, &env.cp.audit_log, "streamed", 5).await;
    let uris: Vec<&str> = reads.iter().map(|e| e.request_uri.as_str()).collect();
    assert!(
        reads.iter().any(|e| streaming(e) && !probe(e)),
        "no streaming list of Nodes was received: {uris:#?}"
    );
    assert!(
        reads.iter().all(|e| e.verb != "list"),
        "Nodes were listed although the server streams lists: {uris:#?}"
    );
}

#[tokio::test]
async fn the_node_cache_falls_back_to_paged_lists_where_the_api_server_refuses_streaming_lists() {
    let env = TestEnv::new().await;
    let servers = ApiServers::start_with_flags(&["--feature-gates=WatchList=false"]);
    let reads = node_reads_of_an_allocator(
        servers.kubeconfig(Apiserver::Two),
        servers.audit_log(Apiserver::Two),
        "paged",
        5,
    )
    .await;
    drop(env);
    let uris: Vec<&str> = reads.iter().map(|e| e.request_uri.as_str()).collect();
    // The server really lacks streaming lists: it refused netcm's question.
    assert!(
        reads
            .iter()
            .any(|e| probe(e) && e.response_status.as_ref().is_some_and(|s| s.code >= 400)),
        "the probe was not refused, so this server streams lists after all: {uris:#?}"
    );
    assert!(
        reads
            .iter()
            .any(|e| e.verb == "list" && e.request_uri.contains("limit=100")),
        "no paged list of Nodes: {uris:#?}"
    );
    assert!(
        reads.iter().all(|e| probe(e) || !streaming(e)),
        "a streaming list was retried against a server that refuses it: {uris:#?}"
    );
}

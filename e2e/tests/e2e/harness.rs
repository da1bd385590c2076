//! The harness proves itself against the real control plane: watches, apiserver restarts, the audit
//! log and ServiceAccount RBAC.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{audit, restart_apiserver, serviceaccount_kubeconfig, wait_for, TestEnv};

#[tokio::test]
async fn a_node_created_through_the_api_is_seen_by_a_watch() {
    let env = TestEnv::new().await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let stream = watcher(nodes, watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    // The initial list of an empty cluster.
    loop {
        match stream.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("watch ended early: {other:?}"),
        }
    }
    create_node(&env.client, &NodeFixture::named("watched-node")).await;
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(n)) = ev {
                return n.metadata.name;
            }
        }
        None
    })
    .await
    .expect("watch event within 10s");
    assert_eq!(seen.as_deref(), Some("watched-node"));
}

#[tokio::test]
async fn the_api_comes_back_after_an_apiserver_restart_with_the_node_still_there() {
    let env = TestEnv::new().await;
    create_node(
        &env.client,
        &NodeFixture::named("survivor").internal_ip("192.0.2.7"),
    )
    .await;
    tokio::task::spawn_blocking(restart_apiserver)
        .await
        .expect("restart");
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node = wait_for(
        "the node after the restart",
        Duration::from_secs(60),
        || async { nodes.get_opt("survivor").await.ok().flatten() },
    )
    .await;
    let addr = node.status.and_then(|s| s.addresses).unwrap_or_default();
    assert_eq!(addr.first().map(|a| a.address.as_str()), Some("192.0.2.7"));
}

#[tokio::test]
async fn the_audit_log_shows_a_node_write_with_the_user_agent_that_made_it() {
    let env = TestEnv::new().await;
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&env.cp.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    let ua = "netcm-e2e-audit-probe/1";
    config
        .headers
        .push((http_header("user-agent"), ua.parse().expect("header value")));
    let client = kube::Client::try_from(config).expect("client");
    create_node(&client, &NodeFixture::named("audited")).await;
    let log = env.cp.audit_log.clone();
    wait_for(
        "the audit record of the node create",
        Duration::from_secs(10),
        || {
            let log = log.clone();
            async move {
                audit::read(&log).into_iter().find(|e| {
                    e.verb == "create"
                        && e.resource() == "nodes"
                        && e.object_ref.as_ref().is_some_and(|o| o.name == "audited")
                        && e.user_agent == ua
                        && e.succeeded()
                })
            }
        },
    )
    .await;
}

fn http_header(name: &'static str) -> http::HeaderName {
    http::HeaderName::from_static(name)
}

#[tokio::test]
async fn a_serviceaccount_token_is_refused_what_its_rbac_does_not_allow() {
    let env = TestEnv::new().await;
    let ns = "netcm-e2e";
    env.bind_cluster_role(
        "netcm-e2e-node-reader",
        vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["nodes".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..Default::default()
        }],
        ns,
        "node-reader",
    )
    .await;

    let (kubeconfig, _dir) = serviceaccount_kubeconfig(&env, ns, "node-reader").await;
    let sa_client = netcm_e2e::client_for(&kubeconfig).await;
    let nodes: Api<Node> = Api::all(sa_client);
    // RBAC bindings take effect within moments; the list is allowed.
    wait_for(
        "the service account to list nodes",
        Duration::from_secs(10),
        || async { nodes.list(&ListParams::default()).await.ok() },
    )
    .await;
    let create = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some("forbidden".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await;
    match create {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "expected Forbidden, got {s:?}"),
        other => panic!("creating a node must be forbidden for node-reader, got {other:?}"),
    }
}

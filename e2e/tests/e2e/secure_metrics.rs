//! `--secure-port` as kube-controller-manager serves metrics: TLS, bearer tokens checked by TokenReview,
//! paths authorized by SubjectAccessReview; health paths open to all; a flood of bogus tokens costs the
//! leader nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, ListParams};
use netcm_e2e::netcm::metric_sum;
use netcm_e2e::nodes::{create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::{
    claimed_cidrs, kubeconfig_token, serviceaccount_kubeconfig, wait_for, Netcm, TestEnv,
    LEASE_NAMESPACE,
};

const NS: &str = "netcm-e2e-metrics";

/// A token of a ServiceAccount that exists with no permissions.
async fn service_account_token(env: &TestEnv, name: &str) -> String {
    env.bind_cluster_role("netcm-e2e-nothing", vec![], NS, name)
        .await;
    let (kubeconfig, _dir) = serviceaccount_kubeconfig(env, NS, name).await;
    kubeconfig_token(&kubeconfig)
}

#[tokio::test]
async fn secure_metrics_need_a_token_with_the_metrics_role_and_health_needs_none() {
    let env = TestEnv::new().await;
    let scraper = service_account_token(&env, "scraper").await;
    let nobody = service_account_token(&env, "nobody").await;
    env.bind_cluster_role(
        "netcm-e2e-metrics-reader",
        vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }],
        NS,
        "scraper",
    )
    .await;
    let n = Netcm::start(
        "secure",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    n.wait_leading(Duration::from_secs(30)).await;

    let (code, body) = n.https_get("/metrics", None);
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = n.https_get("/metrics", Some("not-a-token"));
    assert_eq!(code, 401, "invalid token: {body}");
    let (code, body) = n.https_get("/metrics", Some(&nobody));
    assert_eq!(code, 403, "a token without the metrics role: {body}");
    // RBAC for the new binding settles within moments; the cache keeps answers 10 s, so ask fresh.
    let body = wait_for(
        "the scraper to be allowed",
        Duration::from_secs(20),
        || async {
            let (code, body) = n.https_get("/metrics", Some(&scraper));
            (code == 200).then_some(body)
        },
    )
    .await;
    for family in [
        "workqueue_depth",
        "leader_election_master_status",
        "netcm_build_info",
    ] {
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "secure /metrics lacks {family}"
        );
    }
    for path in ["/healthz", "/livez", "/readyz", "/healthz/leaderElection"] {
        let (code, body) = n.https_get(path, None);
        assert_eq!(code, 200, "{path} must need no token: {body}");
    }
}

/// GETs `path` on the secure port once per token, 64 at a time, in one curl process; the status codes
/// and how often each came back.
async fn https_get_many(n: &Netcm, path: &str, tokens: &[String]) -> BTreeMap<u16, usize> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("curl.config");
    let url = format!("https://127.0.0.1:{}{path}", n.secure_port);
    let blocks: Vec<String> = tokens
        .iter()
        .map(|t| {
            format!(
                "url = \"{url}\"\nheader = \"Authorization: Bearer {t}\"\ninsecure\nmax-time = 5\n\
                 output = \"/dev/null\"\nwrite-out = \"%{{http_code}}\\n\"\n"
            )
        })
        .collect();
    std::fs::write(&config, blocks.join("next\n")).expect("write curl config");
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--parallel", "--parallel-max", "64", "-K"])
        .arg(&config)
        .output()
        .await
        .expect("run curl (hack/install-prereqs.sh installs it)");
    let mut codes = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        *codes.entry(line.trim().parse().unwrap_or(0)).or_insert(0) += 1;
    }
    codes
}

/// (holder, leaseTransitions) of netcm's Lease.
async fn lease_state(env: &TestEnv) -> (Option<String>, Option<i32>) {
    let lease = Api::<Lease>::namespaced(env.client.clone(), LEASE_NAMESPACE)
        .get("netcm")
        .await
        .expect("get the Lease");
    let spec = lease.spec.unwrap_or_default();
    (spec.holder_identity, spec.lease_transitions)
}

#[tokio::test]
async fn a_thousand_bogus_tokens_cost_the_shared_client_nothing_and_leave_the_lease_and_the_allocation_alone(
) {
    let env = TestEnv::new().await;
    let nodes = 300;
    create_nodes(
        &env.client,
        (0..nodes)
            .map(|i| NodeFixture::named(format!("flood-{i:04}")))
            .collect(),
        16,
    )
    .await;
    // KCM's default client rate, so that ~1,000 reviews through the shared bucket would starve renewals.
    let n = Netcm::start(
        "flooded",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
            "--node-cidr-mask-size=26",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
        ],
    );
    n.wait_leading(Duration::from_secs(30)).await;
    let lease_before = lease_state(&env).await;
    let shared_posts = || metric_sum(&n, "rest_client_requests_total", &["method=\"POST\""]);
    // The allocator's own POSTs are PodCIDRClaims (one per block, not per allocation), counted as objects.
    let claims = || async { claimed_cidrs(&env.client).await.len() as f64 };
    let posts_before = shared_posts().await;
    let claims_before = claims().await;

    // While the allocator works through its backlog, in waves: each wave's first requests hold every
    // review slot and the rest of it are refused at once, so on a slow machine a single wave of 1,000 got
    // only the 16 slots reviewed — too few to tell the clients apart.
    let tokens: Vec<String> = (0..1000).map(|i| format!("bogus-token-{i:04}")).collect();
    let mut codes = BTreeMap::new();
    for wave in tokens.chunks(100) {
        for (code, count) in https_get_many(&n, "/metrics", wave).await {
            *codes.entry(code).or_insert(0) += count;
        }
    }
    eprintln!("[secure_metrics] status codes for 1,000 bogus tokens: {codes:?}");
    n.assert_running();
    assert_eq!(
        codes.values().sum::<usize>(),
        tokens.len(),
        "one answer per request: {codes:?}"
    );
    assert!(
        codes.keys().all(|c| *c == 401 || *c == 429),
        "bogus tokens are refused as unauthenticated or throttled, nothing else: {codes:?}"
    );
    let claims = claims().await - claims_before;
    let posts = shared_posts().await - posts_before - claims;
    eprintln!("[secure_metrics] the shared client sent {posts} POSTs during the flood besides {claims} PodCIDRClaims");
    assert!(
        posts >= 0.0,
        "every PodCIDRClaim created is a POST of netcm's clients: {posts} POSTs besides {claims} claims"
    );
    // Each reviewed (401) token is one TokenReview POST: through the shared client they would outnumber
    // everything else it sends. The rest (a claim retried after a write deadline, an Event) is a handful.
    let reviewed = codes.get(&401).copied().unwrap_or(0) as f64;
    assert!(
        reviewed >= 40.0,
        "the flood must get at least the review burst (40) reviewed to tell anything: {codes:?}"
    );
    assert!(
        posts < reviewed / 2.0,
        "the shared client sent {posts} POSTs during the flood besides claims, against {reviewed} reviews: reviews must not use its token bucket"
    );
    let reviews = metric_sum(
        &n,
        "netcm_delegated_auth_reviews_total",
        &["review=\"TokenReview\""],
    )
    .await;
    let unauthenticated = codes.get(&401).copied().unwrap_or(0) as f64;
    let throttled = codes.get(&429).copied().unwrap_or(0) as f64;
    assert_eq!(
        reviews,
        unauthenticated + throttled,
        "every distinct bogus token is either reviewed (401) or throttled (429): {codes:?}"
    );

    let all = wait_for(
        &format!("all {nodes} nodes to have pod CIDRs"),
        Duration::from_secs(120),
        || async {
            let list = Api::<Node>::all(env.client.clone())
                .list(&ListParams::default())
                .await
                .ok()?;
            list.items
                .iter()
                .all(|n| !pod_cidrs(n).is_empty())
                .then_some(list.items.len())
        },
    )
    .await;
    assert_eq!(all, nodes);
    assert_eq!(
        lease_state(&env).await,
        lease_before,
        "the Lease (holder, leaseTransitions) must not change"
    );

    // A refused token is remembered briefly: asking again sends no second review.
    let token = "bogus-token-again".to_string();
    wait_for(
        "a review slot after the flood",
        Duration::from_secs(10),
        || async {
            let codes = https_get_many(&n, "/metrics", std::slice::from_ref(&token)).await;
            codes.contains_key(&401).then_some(())
        },
    )
    .await;
    let reviewed = metric_sum(
        &n,
        "netcm_delegated_auth_reviews_total",
        &["review=\"TokenReview\"", "result=\"denied\""],
    )
    .await;
    let codes = https_get_many(&n, "/metrics", &[token.clone(), token]).await;
    assert_eq!(codes.get(&401), Some(&2), "{codes:?}");
    let reviewed_again = metric_sum(
        &n,
        "netcm_delegated_auth_reviews_total",
        &["review=\"TokenReview\"", "result=\"denied\""],
    )
    .await;
    assert_eq!(
        reviewed_again, reviewed,
        "a token refused moments ago must be answered from the cache"
    );
}

//! `--secure-port` as kube-controller-manager serves metrics: TLS, bearer tokens checked by TokenReview,
//! paths authorized by SubjectAccessReview; health paths open to all.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::PolicyRule;
use netcm_e2e::{kubeconfig_token, serviceaccount_kubeconfig, wait_for, Netcm, TestEnv};

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
    n.wait_log("serving /metrics over HTTPS", Duration::from_secs(30))
        .await;
    n.wait_log("this replica now leads", Duration::from_secs(30))
        .await;

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

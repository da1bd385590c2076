//! Reaching the API: the chart's RBAC missing a verb, and an API server that does not answer.

use super::*;

#[tokio::test]
async fn rbac_missing_a_verb_is_named_with_the_feature_and_how_to_restore_it() {
    let env = TestEnv::new().await;
    apply_chart_rbac(
        &env.cp.kubeconfig,
        RELEASE,
        LEASE_NAMESPACE,
        Some(("nodes", "patch")),
    );
    let run = netcm_check(&env.cp.kubeconfig, &[&format!("--as={SERVICE_ACCOUNT}")]);
    apply_chart_rbac(&env.cp.kubeconfig, RELEASE, LEASE_NAMESPACE, None);
    assert_eq!(run.code, 1);
    let denied = run.failed("rbac", "may not patch nodes");
    assert!(
        denied["message"]
            .as_str()
            .unwrap_or("")
            .contains("writing pod CIDRs"),
        "{}",
        run.text
    );
    let fix = CheckRun::fix(denied);
    assert!(
        fix.contains("helm upgrade netcm") && fix.contains("kubectl auth can-i patch nodes"),
        "{fix}"
    );
    let rbac = run.findings("rbac");
    assert_eq!(
        rbac.len(),
        1,
        "only the missing verb is reported:\n{}",
        run.text
    );
}

/// Starts the API server again when the test ends, even when it fails.
struct ApiServerBack;

impl Drop for ApiServerBack {
    fn drop(&mut self) {
        netcm_e2e::start_apiserver();
    }
}

#[tokio::test]
async fn an_unreachable_api_server_is_named_with_its_address_and_how_to_reach_one() {
    let env = TestEnv::new().await;
    let server = std::fs::read_to_string(&env.cp.kubeconfig)
        .expect("kubeconfig")
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .expect("server");
    netcm_e2e::stop_apiserver();
    let _back = ApiServerBack;
    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let checks = run.json["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1, "nothing else is checked:\n{}", run.text);
    let api = run.failed("api", "unreachable");
    assert!(
        api["message"]
            .as_str()
            .unwrap_or("")
            .contains(server.trim_end_matches('/')),
        "{}",
        run.text
    );
    assert!(
        CheckRun::fix(api).contains("start kube-apiserver"),
        "{}",
        run.text
    );
}

//! netcm started on a cluster without its PodCIDRClaim CRD (installed without Helm, or a Helm upgrade,
//! which never touches `crds/`): nothing is allocated — claims are what keep two leaders apart — and the
//! replica says why on `/readyz`, then allocates as soon as the CRD is applied.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use netcm_e2e::nodes::{create_node, pod_cidrs, NodeFixture};
use netcm_e2e::{install_crds, tool, wait_for, Netcm, ReinstallCrds, TestEnv};

const TIMEOUT: Duration = Duration::from_secs(60);
const CRD: &str = "podcidrclaims.ipam.netcm.io";

#[tokio::test]
async fn without_its_crd_the_allocator_allocates_nothing_reports_not_ready_and_starts_once_it_is_applied(
) {
    let env = TestEnv::new().await;
    let _reinstall = ReinstallCrds(env.cp.kubeconfig.clone());
    let out = Command::new(tool("kubectl"))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .args(["delete", "crd", CRD, "--wait=true"])
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    create_node(&env.client, &NodeFixture::named("no-crd-0")).await;

    let netcm = Netcm::start(
        "missing-crd",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.72.0.0/16",
        ],
    );
    netcm.wait_leading(TIMEOUT).await;
    let (code, body) = wait_for("/readyz to name the missing CRD", TIMEOUT, || async {
        netcm
            .http_get("/readyz?verbose")
            .await
            .filter(|(code, body)| *code != 200 && body.contains(CRD))
    })
    .await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("--pod-cidr-claims=false"), "{body}");
    assert!(body.contains("kubectl apply"), "{body}");
    let nodes: Api<Node> = Api::all(env.client.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = nodes.get("no-crd-0").await.expect("get node");
    assert!(
        pod_cidrs(&node).is_empty(),
        "allocated without claims: {node:?}"
    );
    netcm.assert_running();

    install_crds(&env.cp.kubeconfig);
    wait_for("the waiting Node to get its CIDR", TIMEOUT, || async {
        let node = nodes.get("no-crd-0").await.ok()?;
        (!pod_cidrs(&node).is_empty()).then_some(())
    })
    .await;
    wait_for("/readyz to pass", TIMEOUT, || async {
        netcm
            .http_get("/readyz")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
}

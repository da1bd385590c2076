//! The syncer's flags end to end: a custom `--annotation-prefix`. The flags it refuses (exit 2, before
//! any API call) are CLI transcripts in `cmd/netcm/tests/cmd/node-annotation-syncer.md`.

use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{Netcm, TestEnv};

use super::support::*;

#[tokio::test]
async fn a_custom_prefix_publishes_under_it_and_leaves_other_prefixes_alone() {
    let env = TestEnv::new().await;
    let ours = "netcm.example.com/lease";
    let old = [
        (k("public-ip"), "192.0.2.1"),
        (k("kube-subnet-manager"), "true"),
    ];
    let mut f = NodeFixture::named("pfx")
        .pod_cidrs(&["10.244.8.0/24"])
        .internal_ip("192.0.2.50")
        .annotation(
            "netcm.example.com/lease-public-ip-overwrite",
            "203.0.113.50",
        )
        .annotation("netcm.example.com/lease-custom", "mine");
    for (key, v) in &old {
        f = f.annotation(key, v);
    }
    create_node(&env.client, &f).await;
    let _netcm = Netcm::start(
        "syncer-prefix",
        &env.cp.kubeconfig,
        &[SYNCER, &format!("--annotation-prefix={ours}")],
    );
    let exp = Expected::host_gw("pfx")
        .v4("203.0.113.50", "10.244.8.0/24")
        .custom("mine");
    let node = wait_lease(&env, &exp, ours).await;
    let ann = annotations(&node);
    for (key, v) in &old {
        assert_eq!(
            ann.get(key).map(String::as_str),
            Some(*v),
            "{key} under another prefix was touched"
        );
    }
}

//! Credentials that change under a running netcm: the ServiceAccount token file a kubelet rewrites
//! before the bound token expires, and the API server's serving certificate renewed from the same CA.
//! netcm must go on leading and allocating through both without a restart.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use netcm_e2e::nodes::{count_allocated, create_named};
use netcm_e2e::{lease_holder, wait_for, Netcm, TestEnv, LEASE_NAME};

const NAMESPACE: &str = "netcm-token-rotation";
const SA: &str = "netcm";

fn allocator_args() -> Vec<&'static str> {
    vec![
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.244.0.0/16",
    ]
}

async fn wait_allocated(env: &TestEnv, names: &[String], n: &Netcm, timeout: Duration) {
    wait_for(
        &format!("{} Nodes to hold pod CIDRs", names.len()),
        timeout,
        || async {
            n.assert_running();
            (count_allocated(&env.client, names).await == names.len()).then_some(())
        },
    )
    .await;
}

/// A token for the ServiceAccount bound to the Secret `secret` (deleting the Secret revokes it, as the
/// end of a bound token's life does), for the shortest lifetime the API server grants (10 minutes).
async fn bound_token(env: &TestEnv, secret: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NAMESPACE);
    // An earlier run against the same control plane may have left it (a test that fails keeps it).
    if secrets.get_opt(secret).await.ok().flatten().is_some() {
        let _ = secrets
            .delete(secret, &kube::api::DeleteParams::default())
            .await;
        netcm_e2e::wait_for(
            &format!("the earlier run's Secret {secret} to be gone"),
            std::time::Duration::from_secs(30),
            || async { secrets.get_opt(secret).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
    let created = secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(secret.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create Secret {secret}: {e}"));
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Secret".into()),
                name: Some(secret.into()),
                uid: created.metadata.uid,
            }),
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(env.client.clone(), NAMESPACE)
        .create_token_request(SA, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest bound to {secret}: {e}"))
        .status
        .expect("token status")
        .token
}

/// Replaces the token file's content in one step, as the kubelet's atomic writer does.
fn write_token(path: &Path, token: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, token).expect("write token");
    std::fs::rename(&tmp, path).expect("rename token");
}

/// A kubeconfig that reads its bearer token from `token_file` (what in-cluster configuration does with
/// the projected token at /var/run/secrets/kubernetes.io/serviceaccount/token).
fn token_file_kubeconfig(env: &TestEnv, dir: &Path, token_file: &Path) -> std::path::PathBuf {
    let admin = std::fs::read_to_string(&env.cp.kubeconfig).expect("read admin kubeconfig");
    let field = |key: &str| {
        admin
            .lines()
            .find_map(|l| l.trim().strip_prefix(key).map(str::to_string))
            .unwrap_or_else(|| panic!("{key} in the admin kubeconfig"))
    };
    let (server, ca) = (field("server: "), field("certificate-authority: "));
    let path = dir.join("token-file.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    tokenFile: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            token_file.display()
        ),
    )
    .expect("write kubeconfig");
    path
}

/// Whether the API server still accepts `token`.
async fn token_accepted(env: &TestEnv, token: &str) -> bool {
    let admin = kube::config::Kubeconfig::read_from(&env.cp.kubeconfig).expect("read kubeconfig");
    let Ok(mut config) =
        kube::Config::from_custom_kubeconfig(admin, &kube::config::KubeConfigOptions::default())
            .await
    else {
        return true;
    };
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    let Ok(client) = kube::Client::try_from(config) else {
        return true;
    };
    Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .is_ok()
}

/// The kubelet rewrites a pod's projected token file well before the bound token expires; the old token
/// then dies. netcm reads its token from that file (in-cluster configuration), so it must pick up the
/// new one in time: here the old token is revoked 70 s after the file changed (kube's client re-reads a
/// token file at least once a minute), and netcm keeps its Lease — same identity, no restart — and
/// allocates the Nodes created after the revocation.
#[tokio::test]
async fn netcm_keeps_leading_and_allocating_after_its_token_file_is_rotated_and_the_old_token_revoked(
) {
    let env = TestEnv::new().await;
    env.bind_cluster_role(
        "netcm-token-rotation",
        vec![PolicyRule {
            api_groups: Some(vec!["*".into()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        }],
        NAMESPACE,
        SA,
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    let first = bound_token(&env, "token-first").await;
    write_token(&token_file, &first);
    let kubeconfig = token_file_kubeconfig(&env, dir.path(), &token_file);

    let n = Netcm::start("token-rotation", &kubeconfig, &allocator_args());
    n.wait_leading(Duration::from_secs(30)).await;
    let holder = lease_holder(&env.client, LEASE_NAME)
        .await
        .expect("netcm holds the Lease");
    let before = create_named(&env.client, "token-before", 3).await;
    wait_allocated(&env, &before, &n, Duration::from_secs(60)).await;

    let second = bound_token(&env, "token-second").await;
    write_token(&token_file, &second);
    tokio::time::sleep(Duration::from_secs(70)).await;
    Api::<Secret>::namespaced(env.client.clone(), NAMESPACE)
        .delete("token-first", &DeleteParams::default())
        .await
        .expect("revoke the first token");
    wait_for(
        "the API server to refuse the first token",
        Duration::from_secs(60),
        || async { (!token_accepted(&env, &first).await).then_some(()) },
    )
    .await;
    let after = create_named(&env.client, "token-after", 3).await;
    wait_allocated(&env, &after, &n, Duration::from_secs(60)).await;
    assert_eq!(
        lease_holder(&env.client, LEASE_NAME).await.as_deref(),
        Some(holder.as_str()),
        "the same process kept the Lease through the rotation"
    );
    drop(n);
    env.clean().await;
}

/// The API server's serving certificate renewed (new key, same CA) and the server restarted, so every
/// connection is made again against the new certificate: netcm trusts the CA, not the certificate, and
/// goes on allocating without a restart of its own.
#[tokio::test]
async fn netcm_reconnects_to_an_apiserver_whose_serving_certificate_was_renewed() {
    let env = TestEnv::new().await;
    // The restart takes the API server away for as long as it needs to start, which on a loaded
    // machine can outlast the default 10 s renew deadline; a leader that misses it exits by design
    // (as kube-controller-manager does). This test is about trusting the CA, so its lease outlasts
    // any restart.
    let mut args = allocator_args();
    args.extend([
        "--leader-elect-lease-duration=90s",
        "--leader-elect-renew-deadline=60s",
    ]);
    let n = Netcm::start("cert-rotation", &env.cp.kubeconfig, &args);
    n.wait_leading(Duration::from_secs(30)).await;
    let before = create_named(&env.client, "cert-before", 3).await;
    wait_allocated(&env, &before, &n, Duration::from_secs(60)).await;
    let serial = netcm_e2e::rotate_apiserver_serving_cert();
    assert!(serial.contains("serial="), "a new certificate: {serial}");
    let after = create_named(&env.client, "cert-after", 3).await;
    wait_allocated(&env, &after, &n, Duration::from_secs(90)).await;
    drop(n);
    env.clean().await;
}

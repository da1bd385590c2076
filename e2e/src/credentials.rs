//! A ServiceAccount's credentials for RBAC tests: a kubeconfig with a minted token, and the token in it.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use crate::TestEnv;

/// Mints a token for a ServiceAccount (TokenRequest) and writes a kubeconfig that uses it; the temp dir
/// holding the file lives as long as the returned guard.
pub async fn serviceaccount_kubeconfig(
    env: &TestEnv,
    namespace: &str,
    name: &str,
) -> (PathBuf, tempfile::TempDir) {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), namespace);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &tr)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"))
        .status
        .expect("token status")
        .token;
    let admin = std::fs::read_to_string(&env.cp.kubeconfig).expect("read admin kubeconfig");
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server in kubeconfig")
        .to_string();
    let ca = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority: "))
        .expect("CA in kubeconfig")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .expect("write kubeconfig");
    (path, dir)
}

/// The bearer token in a kubeconfig written by [`serviceaccount_kubeconfig`].
pub fn kubeconfig_token(kubeconfig: &Path) -> String {
    std::fs::read_to_string(kubeconfig)
        .expect("read kubeconfig")
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .expect("a token in the kubeconfig")
}

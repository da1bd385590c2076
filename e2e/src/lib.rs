//! The e2e harness: a real kube-apiserver + etcd (started once by `hack/controlplane.sh up`, or reused
//! from `NETCM_E2E_KUBECONFIG`), a clean cluster per test, Node fixtures, waits with clear failure
//! messages, the real `netcm` binary as a child process (its log shown when a test fails), the audit log,
//! and ServiceAccount tokens for RBAC tests.
//!
//! Tests that touch the cluster hold an exclusive file lock for their whole run, so no two tests (in any
//! test binary) race on cluster-scoped Nodes. There is no skip: without a control plane a test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod api_path;
pub mod apiservers;
pub mod audit;
pub mod cgroup;
pub mod chart;
pub mod flannel;
pub mod flannel_daemonset;
pub mod flannel_routes;
pub mod flanneld;
pub mod forget;
pub mod hostile_node;
pub mod jwt;
pub mod multinode;
pub mod netcm;
pub mod netns;
pub mod nodes;
pub mod overlaps;
pub mod pod_network;
pub mod probe;
pub mod proc_stats;
pub mod route_lab;
pub mod takeover;
pub mod token_expiry;
pub mod waiting;
pub mod webhook;

mod commands;
mod control_plane;
mod crds;
mod credentials;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use commands::{checked_stdout, command_output};
pub(crate) use control_plane::controlplane_sh;
pub use control_plane::{
    apiserver_pid, control_plane, kubectl, restart_apiserver, rotate_apiserver_serving_cert,
    start_apiserver, stop_apiserver, tool, ControlPlane, FrozenApiserver,
};
pub use crds::{
    apply_crds, claimed_cidrs, cluster_cidrs, install_crds, pod_cidr_claims, pod_cidr_migrations,
    ReinstallCrds,
};
pub use credentials::{kubeconfig_token, serviceaccount_kubeconfig};
pub use netcm::Netcm;

/// A benchmark's setting from the environment: `default` when unset; a value that does not parse stops
/// the run with the variable's name, rather than running with a setting nobody asked for.
pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?}: not a valid value")),
        Err(_) => default,
    }
}

/// The checkout's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Builds a client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig config");
    kube::Client::try_from(config).expect("client")
}

/// One test's hold on the cluster: exclusive, with a clean state.
pub struct TestEnv {
    pub cp: ControlPlane,
    pub client: kube::Client,
    _lock: std::fs::File,
}

/// The namespace netcm's Lease lives in during tests.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// The name of netcm's Lease (`--leader-elect-resource-name`'s default).
pub const LEASE_NAME: &str = "netcm";

impl TestEnv {
    /// Takes the cluster lock and removes every Node, Lease in kube-system, Event in default and PodCIDRClaim.
    pub async fn new() -> TestEnv {
        let started = Instant::now();
        let cp = control_plane().clone();
        let lock_path = cp.kubeconfig.with_file_name("e2e.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .expect("open e2e lock");
        let lock = tokio::task::spawn_blocking(move || {
            lock.lock().expect("take e2e lock");
            lock
        })
        .await
        .expect("lock task");
        let client = client_for(&cp.kubeconfig).await;
        let env = TestEnv {
            cp,
            client,
            _lock: lock,
        };
        let locked = started.elapsed();
        env.wait_api(Duration::from_secs(60)).await;
        env.clean().await;
        eprintln!(
            "[e2e] cluster locked after {locked:?}, clean after {:?}",
            started.elapsed()
        );
        env
    }

    async fn wait_api(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            match self.client.apiserver_version().await {
                Ok(_) => return,
                Err(e) if start.elapsed() > timeout => {
                    panic!("API server not reachable after {timeout:?}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Deletes every Node, Lease (kube-system), Event (default), PodCIDRClaim, ClusterCIDR and harness webhook, and
    /// waits until the Nodes and Leases are gone.
    pub async fn clean(&self) {
        // First the webhooks a failed test may have left, so they cannot hold the deletes below.
        let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        webhooks
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{}=true", webhook::HARNESS_LABEL)),
            )
            .await
            .expect("delete harness webhooks");
        let nodes: Api<Node> = Api::all(self.client.clone());
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        nodes
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete nodes");
        // Nodes a test left held by a finalizer (a deleting Node is a fixture too) go with it.
        for node in nodes
            .list(&ListParams::default())
            .await
            .expect("list Nodes")
        {
            if node
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            {
                let name = node.metadata.name.clone().unwrap_or_default();
                let strip = serde_json::json!({"metadata": {"finalizers": null}});
                let _ = nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&strip))
                    .await;
            }
        }
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        // Not kube-apiserver's own identity Leases: a (re)started API server re-creates them within
        // seconds, so waiting for them to be gone raced the API server and flaked.
        let not_apiserver = ListParams::default().labels("!apiserver.kubernetes.io/identity");
        leases
            .delete_collection(&dp, &not_apiserver)
            .await
            .expect("delete leases");
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete events");
        pod_cidr_claims(&self.client)
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete PodCIDRClaims");
        // A migration a test left running would close every pool but its destination for the next.
        // Their finalizer goes first: no netcm runs to remove it. (A test that removed the CRD leaves
        // none to delete.)
        let migrations = pod_cidr_migrations(&self.client);
        match migrations.list(&ListParams::default()).await {
            Ok(list) => {
                for m in list {
                    let name = m.metadata.name.clone().unwrap_or_default();
                    let strip = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ = migrations
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&strip))
                        .await;
                    let _ = migrations.delete(&name, &dp).await;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("list PodCIDRMigrations: {e}"),
        }
        // ClusterCIDRs a test left: their finalizer would hold them with no netcm to release it.
        let pools = cluster_cidrs(&self.client);
        for pool in pools
            .list(&ListParams::default())
            .await
            .expect("list ClusterCIDRs")
        {
            let name = pool.metadata.name.clone().unwrap_or_default();
            let strip = serde_json::json!({"metadata": {"finalizers": null}});
            let _ = pools
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&strip),
                )
                .await;
            let _ = pools.delete(&name, &dp).await;
        }
        wait_for(
            "nodes and leases to be deleted",
            Duration::from_secs(60),
            || async {
                let n = nodes.list(&ListParams::default()).await.ok()?.items.len();
                let l = leases.list(&not_apiserver).await.ok()?.items.len();
                (n == 0 && l == 0).then_some(())
            },
        )
        .await;
    }

    /// Creates a namespace if it does not exist.
    pub async fn ensure_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Creates a ServiceAccount (if missing), a ClusterRole `role` with `rules`, and binds them.
    pub async fn bind_cluster_role(
        &self,
        role: &str,
        rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
        namespace: &str,
        service_account: &str,
    ) {
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
        self.ensure_namespace(namespace).await;
        let meta = |name: &str| kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        };
        let created = |r: Result<(), kube::Error>, what: &str| match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create {what}: {e}"),
        };
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let sa = ServiceAccount {
            metadata: meta(service_account),
            ..Default::default()
        };
        created(
            sas.create(&PostParams::default(), &sa).await.map(drop),
            "service account",
        );
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let cr = ClusterRole {
            metadata: meta(role),
            rules: Some(rules),
            ..Default::default()
        };
        created(
            roles.create(&PostParams::default(), &cr).await.map(drop),
            "cluster role",
        );
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let binding = ClusterRoleBinding {
            metadata: meta(&format!("{role}-{service_account}")),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: service_account.into(),
                namespace: Some(namespace.into()),
                ..Default::default()
            }]),
        };
        created(
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .map(drop),
            "binding",
        );
    }

    /// Events recorded about a Node, as (type, reason, note).
    pub async fn node_events(&self, node: &str) -> Vec<(String, String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_every(what, timeout, Duration::from_millis(100), check).await
}

/// [`wait_for`], polling every `interval` (a benchmark timing a step polls more often).
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Deletes netcm's Lease, so a process started next leads at once instead of waiting out a killed
/// leader's term (a restart of the same pod would wait; this keeps tests short). Also forgets who led.
pub async fn forget_the_leader(client: &kube::Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let _ = leases
        .delete(LEASE_NAME, &kube::api::DeleteParams::default())
        .await;
}

/// The current holder of netcm's Lease (`kube-system/<name>`), if any.
pub async fn lease_holder(client: &kube::Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

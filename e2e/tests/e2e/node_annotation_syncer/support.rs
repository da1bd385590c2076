//! Helpers of the node-annotation-syncer e2e tests: expectations written down by hand, the check that
//! reads a Node through the flannel-rule parser, waits on the syncer's metrics, and the audit log.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_e2e::flannel::{node_to_lease, SubnetLease};
use netcm_e2e::{audit, wait_for, Netcm, TestEnv, LEASE_NAMESPACE};

pub const PREFIX: &str = "flannel.alpha.coreos.com";
pub const SYNCER: &str = "--controllers=node-annotation-syncer";
pub const WRITES: &str = "netcm_annotation_writes_total";
pub const ADDS: &str = r#"workqueue_adds_total{name="node-annotation-syncer"}"#;
pub const DONE: &str = r#"workqueue_work_duration_seconds_count{name="node-annotation-syncer"}"#;
pub const RETRIES: &str = r#"workqueue_retries_total{name="node-annotation-syncer"}"#;
pub const INVALID_V4: &str = r#"netcm_annotation_invalid_overwrites_total{family="ipv4"}"#;
pub const INVALID_V6: &str = r#"netcm_annotation_invalid_overwrites_total{family="ipv6"}"#;
pub const AGENT_MANAGED: &str = "netcm_annotation_agent_managed_nodes";
pub const TIMEOUT: Duration = Duration::from_secs(90);

pub fn k(name: &str) -> String {
    format!("{PREFIX}/{name}")
}

/// What flannel should read from a Node, written down by hand from the fixture.
#[derive(Debug, Clone)]
pub struct Expected {
    pub name: String,
    pub v4: Option<(Ipv4Addr, IpNet)>,
    pub v6: Option<(Ipv6Addr, IpNet)>,
    pub backend_type: String,
    pub backend_data: String,
    pub backend_v6_data: String,
    pub custom: Option<String>,
}

impl Expected {
    pub fn host_gw(name: &str) -> Self {
        Self {
            name: name.to_string(),
            v4: None,
            v6: None,
            backend_type: "host-gw".into(),
            backend_data: "null".into(),
            backend_v6_data: "null".into(),
            custom: None,
        }
    }

    pub fn v4(mut self, ip: &str, cidr: &str) -> Self {
        self.v4 = Some((ip.parse().expect("v4"), cidr.parse().expect("cidr")));
        self
    }

    pub fn v6(mut self, ip: &str, cidr: &str) -> Self {
        self.v6 = Some((ip.parse().expect("v6"), cidr.parse().expect("cidr")));
        self
    }

    pub fn custom(mut self, v: &str) -> Self {
        self.custom = Some(v.to_string());
        self
    }

    pub fn subnet_lease(&self) -> SubnetLease {
        SubnetLease {
            public_ip: self.v4.map(|(ip, _)| ip),
            backend_data: self.v4.map(|_| self.backend_data.clone()),
            subnet: self.v4.map(|(_, n)| n),
            public_ipv6: self.v6.map(|(ip, _)| ip),
            backend_v6_data: self.v6.map(|_| self.backend_v6_data.clone()),
            ipv6_subnet: self.v6.map(|(_, n)| n),
            backend_type: self.backend_type.clone(),
        }
    }
}

pub fn annotations(node: &Node) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

/// Reads the Node as a flanneld of the Node's own stack would, and compares with `exp`.
pub fn check_lease(node: &Node, exp: &Expected, prefix: &str) -> Result<(), String> {
    let lease = node_to_lease(node, prefix, exp.v4.is_some(), exp.v6.is_some())?;
    if lease != exp.subnet_lease() {
        return Err(format!("read {lease:?}, expected {:?}", exp.subnet_lease()));
    }
    let ann = annotations(node);
    let p = netcm_e2e::flannel::flannel_prefix(prefix);
    if exp.v4.is_none() && ann.contains_key(&format!("{p}public-ip")) {
        return Err("an IPv6-only node got public-ip".into());
    }
    if exp.v6.is_none() && ann.contains_key(&format!("{p}public-ipv6")) {
        return Err("a node without an IPv6 pod CIDR got public-ipv6".into());
    }
    if let Some(c) = &exp.custom {
        if ann.get(&format!("{p}custom")) != Some(c) {
            return Err(format!(
                "{p}custom changed: {:?}",
                ann.get(&format!("{p}custom"))
            ));
        }
    }
    Ok(())
}

pub async fn get(env: &TestEnv, name: &str) -> Node {
    let api: Api<Node> = Api::all(env.client.clone());
    api.get(name)
        .await
        .unwrap_or_else(|e| panic!("get node {name}: {e}"))
}

/// Sets (or with `None` removes) one annotation, as a user or node agent would.
pub async fn annotate(env: &TestEnv, name: &str, key: &str, value: Option<&str>) {
    let api: Api<Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("annotate node {name}: {e}"));
}

pub async fn wait_lease(env: &TestEnv, exp: &Expected, prefix: &str) -> Node {
    let api: Api<Node> = Api::all(env.client.clone());
    let mut last = String::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Ok(node) = api.get(&exp.name).await {
                match check_lease(&node, exp, prefix) {
                    Ok(()) => return node,
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "lease of {} not as expected after {TIMEOUT:?}: {last}",
            exp.name
        )
    })
}

pub async fn wait_annotation(env: &TestEnv, name: &str, key: &str, value: &str) -> Duration {
    let start = Instant::now();
    wait_for(&format!("{name} {key}={value}"), TIMEOUT, || async {
        let node = get(env, name).await;
        (annotations(&node).get(key).map(String::as_str) == Some(value)).then_some(())
    })
    .await;
    start.elapsed()
}

/// Waits until the syncer has finished at least `min_done` syncs and every queued key was processed.
pub async fn wait_idle(netcm: &Netcm, min_done: f64) -> f64 {
    wait_for(
        &format!(
            "{} to finish {min_done} syncs with an empty queue",
            netcm.label
        ),
        TIMEOUT,
        || async {
            let adds = netcm.metric(ADDS).await?;
            let done = netcm.metric(DONE).await?;
            (done >= min_done && adds == done).then_some(done)
        },
    )
    .await
}

pub async fn metric(netcm: &Netcm, series: &str) -> f64 {
    netcm
        .metric(series)
        .await
        .unwrap_or_else(|| panic!("{} does not expose {series}", netcm.label))
}

/// The leader's identity (its user agent contains it), once a holder other than `not` has the Lease.
pub async fn leader_identity(env: &TestEnv, not: Option<&str>) -> String {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), LEASE_NAMESPACE);
    wait_for("netcm to hold its Lease", TIMEOUT, || async {
        let l = leases.get_opt("netcm").await.ok()??;
        let holder = l.spec?.holder_identity?;
        (!holder.is_empty() && Some(holder.as_str()) != not).then_some(holder)
    })
    .await
}

/// Node PATCHes (any result) in the audit log made by the process with this identity's controllers (not
/// the catch-up proof of a new leader's warm cache).
pub fn node_patches_by(env: &TestEnv, identity: &str) -> usize {
    audit::read(&env.cp.audit_log)
        .iter()
        .filter(|e| {
            e.verb == "patch"
                && e.resource() == "nodes"
                && e.user_agent.contains(identity)
                && !e.is_catch_up()
        })
        .count()
}

/// Node PATCHes (any result) in the audit log made by the process with this identity's controllers to the
/// Node `node`.
pub fn node_patches_to(env: &TestEnv, identity: &str, node: &str) -> usize {
    audit::read(&env.cp.audit_log)
        .iter()
        .filter(|e| {
            e.verb == "patch"
                && e.resource() == "nodes"
                && e.user_agent.contains(identity)
                && !e.is_catch_up()
                && e.object_ref.as_ref().is_some_and(|o| o.name == node)
        })
        .count()
}

//! The route e2e lab: a cluster, a network namespace with on-link subnets, and the API forwarder.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::netns::{Forwarder, NetNs, NetnsNetcm};
use netcm_e2e::{audit, wait_for, TestEnv};

pub const TABLE: &str = "100";
pub const PROTO: &str = "199";
pub const PERIOD_SECS: u64 = 2;
pub const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";

/// A test's cluster, namespace and API forwarder.
pub struct Lab {
    pub env: TestEnv,
    pub ns: NetNs,
    _forwarder: Forwarder,
}

pub async fn lab() -> Lab {
    let env = TestEnv::new().await;
    let ns = NetNs::create();
    ns.add_subnets(&["192.0.2.1/24", "198.18.0.1/15", "2001:db8::1/64"]);
    let forwarder = ns.forward_apiserver(&env.cp.kubeconfig);
    Lab {
        env,
        ns,
        _forwarder: forwarder,
    }
}

impl Lab {
    /// netcm with only the route controller, table 100, protocol 199, a 2 s reconcile, then `args`.
    pub fn start(&self, args: &[&str], env: &[(&str, &str)]) -> NetnsNetcm {
        let period = format!("--route-reconciliation-period={PERIOD_SECS}s");
        let mut all = vec![
            "--controllers=route-controller",
            "--route-table=100",
            "--route-protocol=199",
            period.as_str(),
        ];
        all.extend_from_slice(args);
        NetnsNetcm::start(
            "route-controller",
            &self.ns,
            &self.env.cp.kubeconfig,
            &all,
            env,
        )
    }

    /// netcm's routes in table 100 (destination → gateway); panics on two routes to one destination.
    pub fn routes(&self) -> BTreeMap<IpNet, IpAddr> {
        let mut out = BTreeMap::new();
        for r in self.ns.routes(TABLE, Some(PROTO)) {
            let dst: IpNet = r.dst.parse().expect("route destination");
            let gw: IpAddr = r
                .gateway
                .as_deref()
                .unwrap_or_else(|| panic!("route to {dst} without a gateway"))
                .parse()
                .expect("gateway");
            assert!(out.insert(dst, gw).is_none(), "two routes to {dst}");
        }
        out
    }

    /// How many routes of netcm's are in table 100.
    pub fn route_count(&self) -> usize {
        self.ns.route_count(TABLE, PROTO)
    }

    pub async fn wait_routes(&self, want: &BTreeMap<IpNet, IpAddr>, timeout: Duration) {
        wait_for(
            "netcm's routes to be exactly the expected ones",
            timeout,
            || async { (self.routes() == *want).then_some(()) },
        )
        .await;
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.env.client.clone())
    }

    /// NetworkUnavailable of every Node: name → (status, reason, message).
    pub async fn conditions(&self) -> BTreeMap<String, (String, String, String)> {
        let list = self
            .nodes()
            .list(&ListParams::default())
            .await
            .expect("list nodes");
        list.items
            .into_iter()
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                let c = n
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "NetworkUnavailable")?;
                Some((
                    name,
                    (
                        c.status,
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default(),
                    ),
                ))
            })
            .collect()
    }
}

pub fn net(s: &str) -> IpNet {
    s.parse().expect("net")
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

pub fn created() -> (String, String, String) {
    (
        "False".into(),
        "RouteCreated".into(),
        "RouteController created a route".into(),
    )
}

pub fn not_created() -> (String, String, String) {
    (
        "True".into(),
        "NoRouteCreated".into(),
        "RouteController failed to create a route".into(),
    )
}

/// Successful status PATCHes by netcm on the given Nodes since `since`.
pub fn netcm_status_writes(
    env: &TestEnv,
    names: &BTreeSet<String>,
    since: jiff::Timestamp,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in audit::read(&env.cp.audit_log) {
        let name = e
            .object_ref
            .as_ref()
            .map(|o| o.name.clone())
            .unwrap_or_default();
        if e.resource() == "nodes/status"
            && e.verb == "patch"
            && e.user_agent.contains("netcm/")
            && e.succeeded()
            && names.contains(&name)
            && e.received().is_some_and(|t| t >= since)
        {
            *out.entry(name).or_default() += 1;
        }
    }
    out
}

//! The route lab of the route-controller e2e tests and `bench-routes`: a cluster, a network namespace
//! with on-link subnets (more namespaces as more hosts when a test needs them), and the API forwarder
//! into each.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::netns::{Forwarder, NetNs, NetnsNetcm};
use crate::{audit, wait_for, TestEnv};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

pub const TABLE: &str = "100";
pub const PROTO: &str = "199";
pub const PERIOD_SECS: u64 = 2;
pub const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";
/// The cluster CIDRs every test runs with: every pod CIDR the tests use lies inside them.
pub const CLUSTER_CIDR: &str = "--cluster-cidr=10.0.0.0/8,fd00::/8";
/// The on-link subnets of the lab's first host.
pub const SUBNETS: [&str; 3] = ["192.0.2.1/24", "198.18.0.1/15", "2001:db8::1/64"];

/// A host: a network namespace with its own on-link subnets, reaching the API server.
pub struct Host {
    pub ns: NetNs,
    _forwarder: Forwarder,
}

impl Host {
    /// A new namespace with `subnets` on a veth pair inside it, the API server forwarded into it.
    pub fn new(env: &TestEnv, subnets: &[&str]) -> Host {
        let ns = NetNs::create();
        ns.add_subnets(subnets);
        let forwarder = ns.forward_apiserver(&env.cp.kubeconfig);
        Host {
            ns,
            _forwarder: forwarder,
        }
    }

    /// netcm's routes in table 100 of this host (destination → gateway); panics on two routes to one
    /// destination.
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

    pub async fn wait_routes(&self, want: &BTreeMap<IpNet, IpAddr>, timeout: Duration) {
        wait_for(
            "netcm's routes to be exactly the expected ones",
            timeout,
            || async { (self.routes() == *want).then_some(()) },
        )
        .await;
    }
}

/// A test's cluster and its first host.
pub struct Lab {
    pub env: TestEnv,
    pub host: Host,
}

impl std::ops::Deref for Lab {
    type Target = Host;
    fn deref(&self) -> &Host {
        &self.host
    }
}

pub async fn lab() -> Lab {
    let env = TestEnv::new().await;
    let host = Host::new(&env, &SUBNETS);
    Lab { env, host }
}

impl Lab {
    /// netcm on the first host: only the route controller, table 100, protocol 199, the cluster CIDRs,
    /// a 2 s reconcile, then `args` (a later flag wins).
    pub fn start(&self, args: &[&str], env: &[(&str, &str)]) -> NetnsNetcm {
        self.start_on(&self.host, args, env)
    }

    /// [`Lab::start`] on another host.
    pub fn start_on(&self, host: &Host, args: &[&str], env: &[(&str, &str)]) -> NetnsNetcm {
        let period = format!("--route-reconciliation-period={PERIOD_SECS}s");
        let mut all = vec![
            "--controllers=route-controller",
            "--route-table=100",
            "--route-protocol=199",
            CLUSTER_CIDR,
            period.as_str(),
        ];
        all.extend_from_slice(args);
        NetnsNetcm::start(
            "route-controller",
            &host.ns,
            &self.env.cp.kubeconfig,
            &all,
            env,
        )
    }

    /// How many routes of netcm's are in table 100.
    pub fn route_count(&self) -> usize {
        self.ns.route_count(TABLE, PROTO)
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

    /// Waits for a Warning `FailedToCreateRoute` Event on `node` and returns its note.
    pub async fn failed_route_event(&self, node: &str, timeout: Duration) -> String {
        wait_for(
            &format!("a FailedToCreateRoute event on {node}"),
            timeout,
            || async {
                self.env
                    .node_events(node)
                    .await
                    .into_iter()
                    .find(|(t, r, _)| t == "Warning" && r == "FailedToCreateRoute")
                    .map(|(_, _, note)| note)
            },
        )
        .await
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

//! The route-controller's flags: the cloud route controller's `--route-reconciliation-period`, flannel's
//! NetworkUnavailable switch, netcm's own route-table settings and `--route-mode`, checked together with
//! the flags of others the controller depends on (`--cluster-cidr`, `--leader-elect`,
//! `--annotation-prefix`) into a [`Config`].

use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};
use ipnet::IpNet;
use netcm_manager::duration::{format_duration, parse_duration};
use netcm_node::{Keys, PrefixError};

use crate::ownership::is_default_like;
use crate::protocols::taken_by;

/// The only backend so far: the kernel routing table of the host netcm runs on, through rtnetlink.
pub const BACKEND_NETLINK: &str = "netlink";
/// The main routing table (`ip route` without `table`).
pub const TABLE_MAIN: u32 = 254;
/// The kernel's local table: addresses of this host, never a place for pod routes.
const TABLE_LOCAL: u32 = 255;
/// netcm's route protocol: no number in [`crate::protocols::TAKEN`] (the kernel's, iproute2's, FRR's
/// 186–198, Calico's 80), so no route of anyone else carries it.
pub const DEFAULT_ROUTE_PROTOCOL: u8 = 199;
/// A full reconcile more often than this would only burn CPU on dumps of the routing table.
const MIN_RECONCILIATION_PERIOD: Duration = Duration::from_secs(1);

/// Where the route controller routes from, and so whose condition it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RouteMode {
    /// This host routes every Node's pod CIDR and reports every Node's condition.
    Gateway,
    /// This host (one pod of a DaemonSet) routes to its peers and reports only its own Node.
    Node,
}

impl RouteMode {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gateway => "gateway",
            Self::Node => "node",
        }
    }
}

/// route-controller flags.
#[derive(Debug, Clone, Args)]
// clap names an argument group after the struct; every controller's struct is called `Flags`.
#[group(id = "route-controller-flags")]
pub struct Flags {
    /// gateway: this host routes to every Node and writes every Node's NetworkUnavailable condition, with or without --leader-elect (run one replica, or several with leader election); needs --cluster-cidr. node: one pod per Node (a DaemonSet with NODE_NAME and --leader-elect=false) routes to its peers and writes only its own Node's condition.
    #[arg(long, value_enum, default_value_t = RouteMode::Gateway)]
    pub route_mode: RouteMode,

    /// How routes are programmed. `netlink`: the kernel routing table of the host netcm runs on.
    #[arg(long, default_value = BACKEND_NETLINK)]
    pub route_backend: String,

    /// Routing table for pod routes: a number (1-4294967295, not 255) or `main` (254) / `default` (253).
    #[arg(long, default_value = "main", value_parser = parse_table)]
    pub route_table: u32,

    /// rtnetlink protocol number that marks netcm's routes; netcm lists, replaces and deletes only routes with it. Numbers the kernel, iproute2's rt_protos, FRR or Calico use are refused.
    #[arg(long, default_value_t = DEFAULT_ROUTE_PROTOCOL)]
    pub route_protocol: u8,

    /// Period of the full reconcile of every Node's route against the routing table (repairs routes removed by hand).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub route_reconciliation_period: Duration,

    /// Set the NetworkUnavailable condition on Nodes from the result of their route.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub set_node_network_unavailable: bool,

    /// Number of Nodes the route-controller syncs concurrently (each sync is a few microseconds of kernel work, pipelined on one netlink socket).
    #[arg(long, default_value_t = 16)]
    pub concurrent_route_syncs: usize,
}

/// A table id from a number or iproute2's names for the two tables pod routes may sensibly go to.
fn parse_table(value: &str) -> Result<u32, String> {
    match value.trim() {
        "main" => Ok(TABLE_MAIN),
        "default" => Ok(253),
        other => other
            .parse::<u32>()
            .map_err(|_| format!("expected a table number or main/default, got {value:?}")),
    }
}

/// The flags of other controllers the route controller depends on.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// `--cluster-cidr`: the routes netcm owns lie inside these.
    pub cluster_cidr: &'a str,
    /// `--leader-elect`.
    pub leader_elect: bool,
    /// `--annotation-prefix` (node-annotation-syncer's flag, in effect): gateways are read from the lease
    /// annotations under it, the keys the syncer writes.
    pub annotation_prefix: &'a str,
    /// The flag the prefix was given with (`--annotation-prefix` or its deprecated alias), for errors.
    pub annotation_prefix_flag: &'static str,
}

/// A flag value or combination the route controller refuses; one line naming the flag and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// Not a known backend.
    #[error("--route-backend: unknown backend {0:?}; supported: {BACKEND_NETLINK}")]
    Backend(String),
    /// 0 or the local table.
    #[error("--route-table must be a routing table id from 1 to 4294967295 other than 255 (local), got {0}")]
    Table(u32),
    /// A number other software marks its routes with.
    #[error("--route-protocol {number} is {name}, used by {used_by}: netcm deletes routes of its own protocol, so it must be a number no other software uses (the default is {DEFAULT_ROUTE_PROTOCOL})")]
    Protocol {
        /// The number.
        number: u8,
        /// Its name.
        name: &'static str,
        /// Whose routes carry it.
        used_by: &'static str,
    },
    /// Below the minimum period.
    #[error("--route-reconciliation-period must be at least 1s, got {0}")]
    Period(String),
    /// Not an annotation prefix flannel accepts.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// An entry of `--cluster-cidr` that does not parse.
    #[error("--cluster-cidr: {0:?} is not a CIDR")]
    ClusterCidr(String),
    /// A cluster CIDR that would make every route of the host netcm's.
    #[error("--cluster-cidr {0} is default-like (/0 or /1): the route controller would own every route of the host")]
    DefaultLikeClusterCidr(IpNet),
    /// Gateway mode without cluster CIDRs.
    #[error("--route-mode=gateway needs --cluster-cidr: the route controller creates and deletes only routes inside the cluster CIDRs")]
    NoClusterCidr,
    /// Node mode under leader election (only one Node would be served).
    #[error("--route-mode=node needs --leader-elect=false: every Node runs its own copy (a DaemonSet) and reports only its own Node")]
    NodeModeLeaderElection,
}

/// The validated settings the controller runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--route-mode`.
    pub mode: RouteMode,
    /// `--route-table`.
    pub table: u32,
    /// `--route-protocol`.
    pub protocol: u8,
    /// `--route-reconciliation-period`.
    pub period: Duration,
    /// `--set-node-network-unavailable`.
    pub set_node_network_unavailable: bool,
    /// The lease annotation keys gateways are read from.
    pub keys: Keys,
    /// `--cluster-cidr`, parsed (empty only in node mode).
    pub cluster_cidrs: Vec<IpNet>,
}

/// The CIDRs of `--cluster-cidr` (comma-separated; host bits cleared).
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, FlagError> {
    let mut out = Vec::new();
    for raw in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let net: IpNet = raw
            .parse()
            .map_err(|_| FlagError::ClusterCidr(raw.to_string()))?;
        let net = net.trunc();
        if is_default_like(&net) {
            return Err(FlagError::DefaultLikeClusterCidr(net));
        }
        out.push(net);
    }
    Ok(out)
}

impl Flags {
    /// Checks the flags, with the others' flags they depend on, before anything touches the API.
    pub fn config(&self, context: Context<'_>) -> Result<Config, FlagError> {
        if self.route_backend != BACKEND_NETLINK {
            return Err(FlagError::Backend(self.route_backend.clone()));
        }
        if self.route_table == 0 || self.route_table == TABLE_LOCAL {
            return Err(FlagError::Table(self.route_table));
        }
        if let Some(t) = taken_by(self.route_protocol) {
            return Err(FlagError::Protocol {
                number: t.number,
                name: t.name,
                used_by: t.used_by,
            });
        }
        if self.route_reconciliation_period < MIN_RECONCILIATION_PERIOD {
            return Err(FlagError::Period(format_duration(
                self.route_reconciliation_period,
            )));
        }
        let keys = Keys::new(context.annotation_prefix_flag, context.annotation_prefix)?;
        let cluster_cidrs = parse_cluster_cidrs(context.cluster_cidr)?;
        match self.route_mode {
            RouteMode::Gateway if cluster_cidrs.is_empty() => return Err(FlagError::NoClusterCidr),
            RouteMode::Node if context.leader_elect => {
                return Err(FlagError::NodeModeLeaderElection)
            }
            _ => {}
        }
        Ok(Config {
            mode: self.route_mode,
            table: self.route_table,
            protocol: self.route_protocol,
            period: self.route_reconciliation_period,
            set_node_network_unavailable: self.set_node_network_unavailable,
            keys,
            cluster_cidrs,
        })
    }

    /// The settings logged at startup.
    pub fn effective_config(&self) -> Vec<(String, String)> {
        vec![
            ("--route-mode".into(), self.route_mode.as_str().into()),
            ("--route-backend".into(), self.route_backend.clone()),
            ("--route-table".into(), self.route_table.to_string()),
            ("--route-protocol".into(), self.route_protocol.to_string()),
            (
                "--route-reconciliation-period".into(),
                format_duration(self.route_reconciliation_period),
            ),
            (
                "--set-node-network-unavailable".into(),
                self.set_node_network_unavailable.to_string(),
            ),
            (
                "--concurrent-route-syncs".into(),
                self.concurrent_route_syncs.to_string(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        netcm_manager::test_support::parse_flags(args).expect("flags parse")
    }

    const CLUSTER: Context<'static> = Context {
        cluster_cidr: "10.244.0.0/16,fd00:10:244::/56",
        leader_elect: true,
        annotation_prefix: "flannel.alpha.coreos.com",
        annotation_prefix_flag: "--annotation-prefix",
    };

    fn check(args: &[&str]) -> Result<Config, FlagError> {
        parse(args).config(CLUSTER)
    }

    fn error(args: &[&str]) -> String {
        check(args).expect_err("refused").to_string()
    }

    #[test]
    fn the_defaults_are_gateway_mode_netlink_main_table_protocol_199_every_10s_with_the_condition()
    {
        let f = parse(&[]);
        assert_eq!(f.route_mode, RouteMode::Gateway);
        assert_eq!(f.route_backend, "netlink");
        assert_eq!(f.route_table, 254);
        assert_eq!(f.route_protocol, 199);
        assert_eq!(f.route_reconciliation_period, Duration::from_secs(10));
        assert!(f.set_node_network_unavailable);
        let c = f.config(CLUSTER).expect("valid");
        assert_eq!(
            c.cluster_cidrs,
            [
                "10.244.0.0/16".parse::<IpNet>().expect("v4"),
                "fd00:10:244::/56".parse().expect("v6")
            ]
        );
    }

    #[test]
    fn boolean_and_duration_flags_take_kcm_style_values() {
        let f = parse(&[
            "--set-node-network-unavailable=false",
            "--route-reconciliation-period=2m",
            "--route-table=100",
        ]);
        assert!(!f.set_node_network_unavailable);
        assert_eq!(f.route_reconciliation_period, Duration::from_secs(120));
        assert_eq!(f.route_table, 100);
        assert_eq!(parse(&["--route-table=default"]).route_table, 253);
    }

    #[test]
    fn an_unknown_backend_is_rejected_naming_the_flag() {
        let e = error(&["--route-backend=bgp"]);
        assert!(e.starts_with("--route-backend"), "{e}");
        assert!(e.contains("netlink"), "{e}");
    }

    #[test]
    fn a_protocol_the_kernel_or_another_router_uses_is_refused_by_name() {
        for (p, name) in [
            ("0", "unspec"),
            ("2", "kernel"),
            ("3", "boot"),
            ("4", "static"),
            ("16", "dhcp"),
            ("12", "bird"),
            ("80", "felix"),
            ("186", "bgp"),
            ("198", "srte"),
        ] {
            let e = error(&[&format!("--route-protocol={p}")]);
            assert!(
                e.starts_with(&format!("--route-protocol {p} is {name}, used by ")),
                "{e}"
            );
            assert!(e.contains("the default is 199"), "{e}");
        }
        for p in ["5", "199", "200", "255"] {
            assert!(check(&[&format!("--route-protocol={p}")]).is_ok(), "{p}");
        }
    }

    #[test]
    fn tables_0_and_local_are_rejected() {
        for t in ["0", "255"] {
            assert!(error(&[&format!("--route-table={t}")]).starts_with("--route-table"));
        }
        assert!(check(&["--route-table=4000000"]).is_ok());
    }

    #[test]
    fn a_reconciliation_period_under_a_second_is_rejected() {
        let e = error(&["--route-reconciliation-period=0s"]);
        assert!(e.starts_with("--route-reconciliation-period"), "{e}");
    }

    #[test]
    fn gateway_mode_needs_cluster_cidrs_and_none_may_be_default_like_or_garbage() {
        let gateway = parse(&["--route-mode=gateway"]);
        let without = Context {
            cluster_cidr: "",
            ..CLUSTER
        };
        assert_eq!(
            gateway.config(without).err(),
            Some(FlagError::NoClusterCidr)
        );
        for (value, needle) in [
            ("0.0.0.0/0", "--cluster-cidr 0.0.0.0/0 is default-like"),
            (
                "10.0.0.0/8,128.0.0.0/1",
                "--cluster-cidr 128.0.0.0/1 is default-like",
            ),
            (
                "10.0.0.0/8,banana",
                "--cluster-cidr: \"banana\" is not a CIDR",
            ),
        ] {
            let e = gateway
                .config(Context {
                    cluster_cidr: value,
                    ..CLUSTER
                })
                .expect_err(value)
                .to_string();
            assert!(e.starts_with(needle), "{value}: {e}");
        }
        // Host bits are cleared, as the allocator reads the flag.
        let c = gateway
            .config(Context {
                cluster_cidr: " 10.1.2.3/8 ",
                ..CLUSTER
            })
            .expect("valid");
        assert_eq!(
            c.cluster_cidrs,
            ["10.0.0.0/8".parse::<IpNet>().expect("net")]
        );
    }

    #[test]
    fn node_mode_needs_leader_election_off_and_may_run_without_cluster_cidrs() {
        let node = parse(&["--route-mode=node"]);
        assert_eq!(
            node.config(CLUSTER).err(),
            Some(FlagError::NodeModeLeaderElection)
        );
        let daemonset = Context {
            cluster_cidr: "",
            leader_elect: false,
            ..CLUSTER
        };
        let c = node.config(daemonset).expect("valid");
        assert_eq!(c.mode, RouteMode::Node);
        assert!(c.cluster_cidrs.is_empty());
        // Gateway mode runs with or without leader election.
        assert!(parse(&[])
            .config(Context {
                leader_elect: false,
                ..CLUSTER
            })
            .is_ok());
    }

    #[test]
    fn annotation_prefixes_follow_flannels_rules_and_give_the_syncers_keys() {
        let keys = |prefix: &str| {
            parse(&[]).config(Context {
                annotation_prefix: prefix,
                ..CLUSTER
            })
        };
        let c = keys("flannel.alpha.coreos.com").expect("default");
        assert_eq!(c.keys.public_ip, "flannel.alpha.coreos.com/public-ip");
        // flannel appends "-" to a name part, so the syncer writes `lease-public-ip`: read the same.
        let c = keys("example.com/lease").expect("custom");
        assert_eq!(c.keys.public_ipv6, "example.com/lease-public-ipv6");
        assert!(keys("a/b/c").is_err());
        assert!(keys("Not_A_Domain").is_err());
        let e = keys("example.com/UPPER").expect_err("upper case");
        assert!(e.to_string().starts_with("--annotation-prefix"), "{e}");
    }
}

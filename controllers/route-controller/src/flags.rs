//! The route-controller's flags: the cloud route controller's `--route-reconciliation-period`, flannel's
//! NetworkUnavailable switch, and netcm's own route-table settings.

use std::time::Duration;

use clap::{ArgAction, Args};
use netcm_manager::duration::{format_duration, parse_duration};

/// The only backend so far: the kernel routing table of the host netcm runs on, through rtnetlink.
pub const BACKEND_NETLINK: &str = "netlink";
/// The main routing table (`ip route` without `table`).
pub const TABLE_MAIN: u32 = 254;
/// The kernel's local table: addresses of this host, never a place for pod routes.
const TABLE_LOCAL: u32 = 255;
/// netcm's route protocol. Unassigned in iproute2's `rt_protos` (which names 0–4, 8–18, 42, 99, 186–189
/// and 192) and not used by flannel (3, boot), Calico (80) or the routing daemons listed there.
pub const DEFAULT_ROUTE_PROTOCOL: u8 = 199;
/// Protocols 0–4 are unspec, redirect, kernel, boot and static: routes other software (or the kernel)
/// owns. Marking netcm's routes with one of them would make netcm delete routes it does not own.
const RESERVED_PROTOCOLS: u8 = 4;
/// flannel's `--kube-annotation-prefix` default, which node-annotation-syncer writes under.
pub const DEFAULT_ANNOTATION_PREFIX: &str = "flannel.alpha.coreos.com";
/// A full reconcile more often than this would only burn CPU on dumps of the routing table.
const MIN_RECONCILIATION_PERIOD: Duration = Duration::from_secs(1);

/// route-controller flags.
#[derive(Debug, Clone, Args)]
// clap names an argument group after the struct; every controller's struct is called `Flags`.
#[group(id = "route-controller-flags")]
pub struct Flags {
    /// How routes are programmed. `netlink`: the kernel routing table of the host netcm runs on.
    #[arg(long, default_value = BACKEND_NETLINK)]
    pub route_backend: String,

    /// Routing table for pod routes: a number (1-4294967295, not 255) or `main` (254) / `default` (253).
    #[arg(long, default_value = "main", value_parser = parse_table)]
    pub route_table: u32,

    /// rtnetlink protocol number that marks netcm's routes; netcm lists, replaces and deletes only routes with it (5-255).
    #[arg(long, default_value_t = DEFAULT_ROUTE_PROTOCOL)]
    pub route_protocol: u8,

    /// Period of the full reconcile of every Node's route against the routing table (repairs routes removed by hand).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub route_reconciliation_period: Duration,

    /// Set the NetworkUnavailable condition on Nodes from the result of their route.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub set_node_network_unavailable: bool,

    /// Annotation prefix of the lease annotations (`<prefix>/public-ip`, `<prefix>/public-ipv6`) routes are read from; keep it equal to --annotation-prefix.
    #[arg(long, default_value = DEFAULT_ANNOTATION_PREFIX)]
    pub route_lease_annotation_prefix: String,
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

/// The lease annotation keys routes are read from, by flannel's prefix rules (the same keys
/// node-annotation-syncer writes for the same prefix).
pub fn lease_keys(prefix: &str) -> Result<netcm_lease::Keys, netcm_lease::PrefixError> {
    netcm_lease::Keys::new("--route-lease-annotation-prefix", prefix)
}

impl Flags {
    /// Checks the flags before anything touches the API; one line naming the flag and the rule.
    pub fn validate(&self) -> Result<(), String> {
        if self.route_backend != BACKEND_NETLINK {
            return Err(format!(
                "--route-backend: unknown backend {:?}; supported: {BACKEND_NETLINK}",
                self.route_backend
            ));
        }
        if self.route_table == 0 || self.route_table == TABLE_LOCAL {
            return Err(format!(
                "--route-table must be a routing table id from 1 to 4294967295 other than 255 (local), got {}",
                self.route_table
            ));
        }
        if self.route_protocol <= RESERVED_PROTOCOLS {
            return Err(format!(
                "--route-protocol must be between 5 and 255: 0-4 (unspec, redirect, kernel, boot, static) mark routes netcm does not own, got {}",
                self.route_protocol
            ));
        }
        if self.route_reconciliation_period < MIN_RECONCILIATION_PERIOD {
            return Err(format!(
                "--route-reconciliation-period must be at least 1s, got {}",
                format_duration(self.route_reconciliation_period)
            ));
        }
        lease_keys(&self.route_lease_annotation_prefix).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The settings logged at startup.
    pub fn effective_config(&self) -> Vec<(String, String)> {
        vec![
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
                "--route-lease-annotation-prefix".into(),
                self.route_lease_annotation_prefix.clone(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn parse(args: &[&str]) -> Flags {
        let mut argv = vec!["netcm"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("flags parse").flags
    }

    #[test]
    fn the_defaults_are_netlink_main_table_protocol_199_every_10s_with_the_condition() {
        let f = parse(&[]);
        assert_eq!(f.route_backend, "netlink");
        assert_eq!(f.route_table, 254);
        assert_eq!(f.route_protocol, 199);
        assert_eq!(f.route_reconciliation_period, Duration::from_secs(10));
        assert!(f.set_node_network_unavailable);
        assert_eq!(f.route_lease_annotation_prefix, "flannel.alpha.coreos.com");
        assert_eq!(f.validate(), Ok(()));
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
        let e = parse(&["--route-backend=bgp"]).validate().expect_err("bgp");
        assert!(e.starts_with("--route-backend"), "{e}");
        assert!(e.contains("netlink"), "{e}");
    }

    #[test]
    fn the_reserved_protocols_0_to_4_are_rejected_and_5_is_allowed() {
        for p in ["0", "2", "3", "4"] {
            let e = parse(&[&format!("--route-protocol={p}")])
                .validate()
                .expect_err(p);
            assert!(
                e.starts_with("--route-protocol must be between 5 and 255"),
                "{e}"
            );
        }
        assert_eq!(parse(&["--route-protocol=5"]).validate(), Ok(()));
    }

    #[test]
    fn tables_0_and_local_are_rejected() {
        for t in ["0", "255"] {
            let e = parse(&[&format!("--route-table={t}")])
                .validate()
                .expect_err(t);
            assert!(e.starts_with("--route-table"), "{e}");
        }
        assert_eq!(parse(&["--route-table=4000000"]).validate(), Ok(()));
    }

    #[test]
    fn a_reconciliation_period_under_a_second_is_rejected() {
        let e = parse(&["--route-reconciliation-period=0s"])
            .validate()
            .expect_err("0s");
        assert!(e.starts_with("--route-reconciliation-period"), "{e}");
    }

    #[test]
    fn annotation_prefixes_follow_flannels_rules_and_give_the_syncers_keys() {
        let keys = lease_keys("flannel.alpha.coreos.com").expect("default");
        assert_eq!(keys.public_ip, "flannel.alpha.coreos.com/public-ip");
        // flannel appends "-" to a name part, so the syncer writes `lease-public-ip`: read the same.
        let keys = lease_keys("example.com/lease").expect("custom");
        assert_eq!(keys.public_ipv6, "example.com/lease-public-ipv6");
        assert!(lease_keys("a/b/c").is_err());
        assert!(lease_keys("Not_A_Domain").is_err());
        let e = lease_keys("example.com/UPPER").expect_err("upper case");
        assert!(
            e.to_string().starts_with("--route-lease-annotation-prefix"),
            "{e}"
        );
    }
}

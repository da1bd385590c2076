//! `netcm check [node NAME]`: a read-only diagnosis of a live cluster, one line per finding (✓ / ! / ✗,
//! what is wrong, the one command or change that fixes it), exit 0 when nothing failed and 1 otherwise,
//! `-o json` for scripts. The same client configuration precedence as the controller.
//!
//! Shape: `gather.rs` reads the API into a [`snapshot::Snapshot`]; every check is a pure function of it
//! (unit-tested on fixture objects); `report.rs` prints.

mod allocators;
mod claims;
mod flannel;
mod gather;
mod leader;
mod migrations;
mod node;
mod pools;
mod rbac;
mod report;
mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use report::{Finding, Report};
use snapshot::{GivenFlags, Snapshot};

/// Diagnoses netcm on a live cluster: API, RBAC, leader, pools, waiting Nodes, bad pod CIDRs, other
/// allocators, PodCIDRClaims, PodCIDRMigrations, flannel leases, route conditions. Read-only. Exit 0: nothing failed; 1: something did.
#[derive(Debug, Parser)]
#[command(name = "netcm check", version)]
pub struct CheckCli {
    /// Path to a kubeconfig file (else KUBECONFIG, in-cluster config, then ~/.kube/config).
    #[arg(long, env = "NETCM_KUBECONFIG", global = true)]
    kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, global = true)]
    master: Option<String>,
    /// Review RBAC as this user, e.g. system:serviceaccount:kube-system:netcm (impersonation). Default:
    /// yourself if you are a ServiceAccount, else the leader pod's ServiceAccount.
    #[arg(long = "as", global = true)]
    as_user: Option<String>,
    /// Groups to impersonate with --as.
    #[arg(long = "as-group", value_delimiter = ',', global = true)]
    as_groups: Vec<String>,
    /// Also review the route DaemonSet's account, e.g. system:serviceaccount:kube-system:netcm-node: that
    /// it may do what node mode needs and none of the controller's writes (root on every Node reads its
    /// token). Asked by SubjectAccessReview.
    #[arg(long = "daemonset-as", global = true)]
    daemonset_as: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text", global = true)]
    output: Output,
    /// The namespace of netcm's Lease (the chart's release namespace; inside netcm's pod, its own).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "kube-system",
        global = true
    )]
    leader_elect_resource_namespace: String,
    /// The name of netcm's Lease.
    #[arg(long, default_value = "netcm", global = true)]
    leader_elect_resource_name: String,
    /// The allocator's cluster CIDR(s); default: what the leader published on its Lease.
    #[arg(long, global = true)]
    cluster_cidr: Option<String>,
    /// The allocator's node mask (single stack); default: the leader's.
    #[arg(long, global = true)]
    node_cidr_mask_size: Option<u8>,
    /// The allocator's IPv4 node mask (dual stack); default: the leader's.
    #[arg(long, global = true)]
    node_cidr_mask_size_ipv4: Option<u8>,
    /// The allocator's IPv6 node mask (dual stack); default: the leader's.
    #[arg(long, global = true)]
    node_cidr_mask_size_ipv6: Option<u8>,
    /// The service range(s) never handed out; default: the leader's.
    #[arg(long, global = true)]
    service_cluster_ip_range: Option<String>,
    /// The lease annotation prefix; default: the leader's, else flannel.alpha.coreos.com.
    #[arg(long, global = true)]
    annotation_prefix: Option<String>,
    /// Node address types the public IP comes from; default: the leader's, else InternalIP,ExternalIP.
    #[arg(long, global = true)]
    public_ip_address_types: Option<String>,
    /// Timeout of each API request, in seconds.
    #[arg(long, default_value_t = 10, global = true)]
    request_timeout: u64,
    #[command(subcommand)]
    what: Option<What>,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Everything about one Node, and a one-sentence verdict.
    Node {
        /// The Node's name.
        name: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Runs `netcm check` with `args` (the words after `check`); `name` is how the user called it (`netcm
/// check`, or `kubectl netcm check` from the plugin), for help and usage errors.
pub fn main(name: &str, args: impl IntoIterator<Item = String>) -> ExitCode {
    let cli = CheckCli::command()
        .bin_name(name.to_string())
        .display_name(name.to_string());
    let cli = match cli
        .try_get_matches_from(std::iter::once(name.to_string()).chain(args))
        .and_then(|m| CheckCli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match crate::runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let target = gather::Target {
        kubeconfig: cli.kubeconfig.clone(),
        master: cli.master.clone(),
        as_user: cli.as_user.clone(),
        as_groups: cli.as_groups.clone(),
        daemonset_as: cli.daemonset_as.clone(),
        lease_namespace: cli.leader_elect_resource_namespace.clone(),
        lease_name: cli.leader_elect_resource_name.clone(),
        given: GivenFlags {
            cluster_cidr: cli.cluster_cidr.clone(),
            node_cidr_mask_size: cli.node_cidr_mask_size,
            node_cidr_mask_size_ipv4: cli.node_cidr_mask_size_ipv4,
            node_cidr_mask_size_ipv6: cli.node_cidr_mask_size_ipv6,
            service_cluster_ip_range: cli.service_cluster_ip_range.clone(),
            annotation_prefix: cli.annotation_prefix.clone(),
            public_ip_address_types: cli.public_ip_address_types.clone(),
        },
        timeout: Duration::from_secs(cli.request_timeout.max(1)),
    };
    let gathered = runtime.block_on(gather::gather(&target));
    let report = diagnose(gathered, cli.what.as_ref());
    match cli.output {
        Output::Text => print!("{}", report.text()),
        Output::Json => println!("{}", report.json()),
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn diagnose(g: gather::Gathered, what: Option<&What>) -> Report {
    let mut checks = vec![g.api];
    let Some(s) = g.snapshot else {
        return Report::new(checks, None);
    };
    match what {
        None => {
            checks.extend(g.rbac);
            checks.extend(cluster(&s));
            Report::new(checks, None)
        }
        Some(What::Node { name }) => {
            checks.push(leader::check(&s));
            let analysis = pools::analyse(&s);
            let (findings, verdict) = node::check(&s, analysis.as_ref(), name);
            checks.extend(findings);
            Report::new(checks, Some(verdict))
        }
    }
}

/// Every cluster-wide check, in the order an operator reads them.
fn cluster(s: &Snapshot) -> Vec<Finding> {
    let analysis = pools::analyse(s);
    let mut out = vec![leader::check(s)];
    out.extend(pools::check_pools(s, analysis.as_ref()));
    out.extend(pools::check_waiting(s, analysis.as_ref()));
    out.extend(pools::check_bad_data(s, analysis.as_ref()));
    out.extend(allocators::check(s));
    out.extend(claims::check(s));
    out.extend(migrations::check(s));
    out.extend(flannel::check(s));
    out.extend(flannel::check_routes(s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_check_command_line_fits_together() {
        CheckCli::command().debug_assert();
    }

    #[test]
    fn node_takes_a_name_and_flags_go_before_or_after_it() {
        let cli = CheckCli::parse_from([
            "netcm check",
            "node",
            "n1",
            "-o",
            "json",
            "--cluster-cidr=10.0.0.0/16",
        ]);
        assert!(matches!(cli.what, Some(What::Node { ref name }) if name == "n1"));
        assert!(matches!(cli.output, Output::Json));
        assert_eq!(cli.cluster_cidr.as_deref(), Some("10.0.0.0/16"));
    }

    #[test]
    fn an_unreachable_api_is_the_only_finding_and_fails_the_report() {
        let g = gather::Gathered {
            api: Finding::fail(
                "api",
                "API server https://127.0.0.1:1 unreachable",
                gather::unreachable_fix("https://127.0.0.1:1", "connection refused"),
            ),
            snapshot: None,
            rbac: Vec::new(),
        };
        let r = diagnose(g, None);
        assert!(!r.ok);
        assert_eq!(r.checks.len(), 1);
        assert!(r.checks[0]
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("start kube-apiserver"));
    }

    #[test]
    fn a_healthy_cluster_passes_every_check() {
        use snapshot::fixtures::*;
        let n = with_subnet_lease(node("a", "192.0.2.1", &["10.244.0.0/24"]), "192.0.2.1");
        let mut s = snapshot("10.244.0.0/16", vec![n]);
        s.claims = snapshot::ClaimsState::Listed(vec![snapshot::ClaimRecord {
            name: "10-244-0-0-18".into(),
            cidr: "10.244.0.0/18".into(),
        }]);
        let f = cluster(&s);
        assert!(
            f.iter()
                .all(|f| matches!(f.status, report::Status::Ok | report::Status::Skip)),
            "{f:#?}"
        );
    }
}

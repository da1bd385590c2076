//! `netcm`: parse flags, install logging, assemble the controller registry, hand both to the manager.

mod check;
mod controllers;

use std::process::ExitCode;

use clap::Parser;
use netcm_manager::client::ClientOptions;
use netcm_manager::run::{run, ManagerOptions, RunError};
use netcm_route_controller::StartupSweep;

/// netcm — a network controller manager for Kubernetes: pod CIDR allocation, flannel-format subnet
/// leases and node routes, leader-elected in the shape of kube-controller-manager.
#[derive(Debug, Parser)]
#[command(name = "netcm", version, about, long_about = None, args_override_self = true)]
#[command(
    after_help = "Subcommand:\n  netcm check [node NAME]  diagnose netcm on a live cluster, read-only (netcm check --help)"
)]
struct Cli {
    #[command(flatten)]
    generic: netcm_manager::flags::GenericFlags,
    #[command(flatten, next_help_heading = "subnet-allocator")]
    allocator: netcm_subnet_allocator::Flags,
    #[command(flatten, next_help_heading = "node-annotation-syncer")]
    annotations: netcm_node_annotation_syncer::Flags,
    #[command(flatten, next_help_heading = "route-controller")]
    routes: netcm_route_controller::Flags,
}

/// Exit code for bad flags, as clap and KCM use.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    // `check` is a separate, read-only command line; the controller's flags do not apply to it.
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("check") {
        return check::main(args.skip(1));
    }
    let cli = Cli::parse();
    let sweep = StartupSweep::new();
    let registry = match controllers::registry(&cli, &sweep) {
        Ok(r) => r,
        Err(e) => return usage_error(&e),
    };
    let routes = match validate(&cli, &registry) {
        Ok(routes) => routes,
        Err(e) => return usage_error(&e),
    };
    netcm_manager::logging::init(cli.generic.log_format, cli.generic.verbosity);
    if let Some(warning) = cli.annotations.deprecation_warning() {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A standby never runs the route controller, so the sweep of its stale routes starts here.
    if let Some(config) = routes.filter(|_| cli.generic.leader_elect) {
        let own_node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
        runtime.spawn(sweep.run(client_options(&cli.generic), config, own_node));
    }
    let opts = ManagerOptions {
        flags: cli.generic.clone(),
        effective_config: controllers::effective_config(&cli),
    };
    match runtime.block_on(run(opts, registry)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::LeadershipLost) => {
            tracing::error!("leaderelection lost; exiting so this replica restarts as a standby");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!(error = %e, "netcm failed");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(e: &anyhow::Error) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::from(EXIT_USAGE)
}

/// How the startup sweep reaches the API server: the manager's own flags.
fn client_options(flags: &netcm_manager::flags::GenericFlags) -> ClientOptions {
    ClientOptions {
        kubeconfig: flags.kubeconfig.clone(),
        master: flags.master.clone(),
        qps: flags.kube_api_qps,
        burst: flags.kube_api_burst,
        user_agent: format!("netcm/{} startup-sweep", netcm_manager::metrics::VERSION),
    }
}

/// Every flag rule, checked before anything touches the API; the route controller's settings when it
/// is enabled.
fn validate(
    cli: &Cli,
    registry: &netcm_manager::Registry,
) -> anyhow::Result<Option<netcm_route_controller::Config>> {
    cli.generic.validate()?;
    let enabled = registry.enabled(&cli.generic.controllers)?;
    let on = |name: &str| enabled.iter().any(|d| d.name == name);
    // One prefix for both readers of it; checked first, so an error names the flag that was given.
    if on(netcm_node_annotation_syncer::NAME) || on(netcm_route_controller::NAME) {
        cli.annotations.lease_keys()?;
    }
    if on(netcm_subnet_allocator::NAME) {
        cli.allocator.config()?;
    }
    if on(netcm_node_annotation_syncer::NAME) {
        cli.annotations.validate().map_err(anyhow::Error::msg)?;
    }
    if !on(netcm_route_controller::NAME) {
        return Ok(None);
    }
    let context = netcm_route_controller::flags::Context {
        cluster_cidr: &cli.allocator.cluster_cidr,
        leader_elect: cli.generic.leader_elect,
        annotation_prefix: cli.annotations.annotation_prefix()?.1,
    };
    Ok(Some(cli.routes.config(context)?))
}

//! `netcm`: parse flags, install logging, assemble the controller registry, hand both to the manager.

mod check;
mod controllers;
#[cfg(test)]
mod flags_doc;
mod plugin;

use std::process::ExitCode;

use clap::Parser;
use netcm_manager::client::ClientOptions;
use netcm_manager::logging::sink::write_stderr_line;
use netcm_manager::run::{run, ManagerOptions, RunError};
use netcm_manager::StandbyContext;

/// jemalloc, not glibc's malloc: a backlog replaces every cached Node twice (its CIDR, then its lease),
/// each by a larger one, amid each write's short-lived buffers; glibc keeps the holes this leaves inside
/// its arena resident, jemalloc reuses them by size class and gives whole free pages back at once (its
/// settings are compiled in: `.cargo/config.toml`). Measured in docs/performance.md, "Memory per Node".
#[global_allocator]
static MALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `netcm --version`: the crate version, and the test-only features a build carries, so a check (and an
/// operator) can tell a test build from the shipped one by asking the binary.
#[cfg(feature = "test-faults")]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: test-faults)");
#[cfg(not(feature = "test-faults"))]
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// netcm — a network controller manager for Kubernetes: pod CIDR allocation, flannel-format subnet
/// leases and node routes, leader-elected in the shape of kube-controller-manager.
#[derive(Debug, Parser)]
#[command(name = "netcm", version = VERSION, about, long_about = None, args_override_self = true)]
#[command(
    after_help = "Subcommand:\n  netcm check [node NAME]  diagnose netcm on a live cluster, read-only (netcm check --help)"
)]
struct Cli {
    #[command(flatten)]
    generic: netcm_manager::flags::GenericFlags,
    #[command(flatten)]
    controllers: controllers::ControllerFlags,
}

/// How long the error exit waits for queued log lines before its own last line.
const LAST_LINES_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// Exit code for bad flags, as clap and KCM use.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Builds the async runtime, or says on stderr why it could not (logging may not be installed yet).
fn runtime(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        write_stderr_line(&format!("error: starting the async runtime: {e}"));
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let mut argv = std::env::args();
    if argv
        .next()
        .is_some_and(|argv0| plugin::invoked_as_plugin(&argv0))
    {
        return plugin::main(argv);
    }
    // `check` is a separate, read-only command line; the controller's flags do not apply to it.
    let mut args = argv.peekable();
    if args.peek().map(String::as_str) == Some("check") {
        return check::main("netcm check", args.skip(1));
    }
    let cli = Cli::parse();
    let registry = match controllers::registry(&cli.controllers) {
        Ok(r) => r,
        Err(e) => return usage_error(&e),
    };
    if let Err(e) = validate(&cli, &registry) {
        return usage_error(&e);
    }
    // Kept until exit: dropping it writes the lines still queued, for a bounded time.
    let logs = netcm_manager::logging::init(cli.generic.log_format, cli.generic.verbosity);
    for warning in controllers::deprecation_warnings(&cli.controllers) {
        tracing::warn!("{warning}");
    }
    let runtime = match runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // The manager starts controllers only on the leader; what a standby does starts here.
    if cli.generic.leader_elect {
        let standby = StandbyContext {
            client: client_options(&cli.generic),
            node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
        };
        // `--controllers` was checked above, so this finds every enabled controller's work.
        for task in registry
            .standby_tasks(&cli.generic, &standby)
            .unwrap_or_default()
        {
            runtime.spawn(task);
        }
    }
    let opts = ManagerOptions {
        flags: cli.generic.clone(),
        effective_config: registry.effective_config(),
    };
    match runtime.block_on(run(opts, registry)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::LeadershipLost) => {
            tracing::error!("leaderelection lost; exiting so this replica restarts as a standby");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!(error = %e, "netcm failed");
            // The log lines go through the writer thread; the summary line goes last, after them.
            logs.flush(LAST_LINES_FLUSH);
            write_stderr_line(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn usage_error(e: &anyhow::Error) -> ExitCode {
    write_stderr_line(&format!("error: {e:#}"));
    ExitCode::from(EXIT_USAGE)
}

/// How standby work reaches the API server: the manager's own flags.
fn client_options(flags: &netcm_manager::flags::GenericFlags) -> ClientOptions {
    ClientOptions {
        kubeconfig: flags.kubeconfig.clone(),
        master: flags.master.clone(),
        qps: flags.kube_api_qps,
        burst: flags.kube_api_burst,
        user_agent: format!("netcm/{} standby", netcm_manager::metrics::VERSION),
    }
}

/// Every flag rule, checked before anything touches the API.
fn validate(cli: &Cli, registry: &netcm_manager::Registry) -> anyhow::Result<()> {
    cli.generic.validate()?;
    registry.validate_flags(&cli.generic)?;
    Ok(())
}

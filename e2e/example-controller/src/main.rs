//! `netcm-example`: the manager with the taint-labeler as its only controller — the registry a binary
//! assembles, in miniature. `cmd/netcm` assembles the real one the same way.

use std::process::ExitCode;

use clap::Parser;
use netcm_manager::flags::GenericFlags;
use netcm_manager::run::{run, ManagerOptions};
use netcm_manager::Registry;

/// netcm's manager running the example taint-labeler.
#[derive(Debug, Parser)]
#[command(name = "netcm-example", args_override_self = true)]
struct Cli {
    #[command(flatten)]
    generic: GenericFlags,
    #[command(flatten, next_help_heading = "taint-labeler")]
    labeler: netcm_example_controller::Flags,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let registry = Registry::new(vec![netcm_example_controller::descriptor(
        cli.labeler.clone(),
    )]);
    let registry = match registry {
        Ok(r) => r,
        Err(e) => return usage_error(&e),
    };
    if let Err(e) = cli.generic.validate() {
        return usage_error(&e);
    }
    if let Err(e) = registry.validate_flags(&cli.generic) {
        return usage_error(&e);
    }
    let _logs = netcm_manager::logging::init(cli.generic.log_format, cli.generic.verbosity);
    let opts = ManagerOptions {
        flags: cli.generic.clone(),
        effective_config: registry.effective_config(),
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map(|rt| rt.block_on(run(opts, registry)));
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

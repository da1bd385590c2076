//! Helpers for the unit tests of the manager and of every controller crate. Compiled for this crate's
//! own tests and, through the `test-support` feature, for other crates' tests only: each enables it
//! from its `[dev-dependencies]`, so the production binary never carries it.
//!
//! [`harness`] runs a controller in-process against a scripted API server.

pub mod harness;

/// Parses `args` (without the program name) as a `netcm` command line made of `F`'s flags alone.
pub fn parse_flags<F: clap::Args>(args: &[&str]) -> Result<F, clap::Error> {
    let command = F::augment_args(clap::Command::new("netcm"));
    let matches =
        command.try_get_matches_from(std::iter::once("netcm").chain(args.iter().copied()))?;
    F::from_arg_matches(&matches)
}

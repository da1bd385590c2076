//! The node-annotation-syncer controller (being built; registered so the binary and flags are wired).

use clap::Args;
use netcm_manager::{InitContext, InitResult};

/// The controller's canonical name.
pub const NAME: &str = "node-annotation-syncer";

/// node-annotation-syncer flags.
#[derive(Debug, Clone, Args)]
pub struct Flags {}

impl Flags {
    /// Checks the flags before anything touches the API.
    pub fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// The settings logged at startup.
    pub fn effective_config(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// The init function.
pub fn init(_ctx: &InitContext, _flags: &Flags) -> InitResult {
    Ok(None)
}

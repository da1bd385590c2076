//! The route controller's options: its flags with the values it takes from other controllers' flags and
//! the startup sweep, and how the manager validates, starts and stands it by. Apart from [`crate::flags`]
//! so the flags stay free of the sweep, which itself runs on the flags'
//! [`Config`](crate::flags::Config).

use futures::future::BoxFuture;
use netcm_manager::client::ClientOptions;
use netcm_manager::flags::GenericFlags;
use netcm_manager::metrics::VERSION;
use netcm_manager::{ControllerOptions, InitContext, InitResult, StandbyContext};

use crate::flags::{Context, FlagError, Flags};
use crate::standby::StartupSweep;

/// The route controller's flags with what it takes from others: the allocator's `--cluster-cidr` and
/// `--cluster-cidr-objects`, the
/// syncer's `--annotation-prefix`, and the startup sweep its standby runs and its init stops.
pub struct Options {
    /// Its own flags.
    pub flags: Flags,
    /// `--cluster-cidr`.
    pub cluster_cidr: String,
    /// `--cluster-cidr-objects`: the allocator also gives CIDRs from ClusterCIDR objects, so their
    /// ranges are routed too ([`crate::pools`]).
    pub cluster_cidr_objects: bool,
    /// `--annotation-prefix` in effect.
    pub annotation_prefix: String,
    /// The flag that gave it.
    pub annotation_prefix_flag: &'static str,
    /// The sweep of this host's stale routes while standing by.
    pub sweep: StartupSweep,
}

impl Options {
    /// What the controller takes from others' flags, under `leader_elect`.
    pub fn context(&self, leader_elect: bool) -> Context<'_> {
        Context {
            cluster_cidr: &self.cluster_cidr,
            leader_elect,
            annotation_prefix: &self.annotation_prefix,
            annotation_prefix_flag: self.annotation_prefix_flag,
        }
    }
}

impl ControllerOptions for Options {
    type FlagError = FlagError;

    fn validate(&self, generic: &GenericFlags) -> Result<(), FlagError> {
        self.flags
            .config(self.context(generic.leader_elect))
            .map(|_| ())
    }

    fn effective_config(&self) -> Vec<(String, String)> {
        self.flags.effective_config()
    }

    fn workers(&self) -> usize {
        self.flags.concurrent_route_syncs
    }

    fn init(&self, ctx: &InitContext) -> InitResult {
        crate::init(self, ctx)
    }

    /// A standby never runs the controller, so it removes its routes to Nodes that no longer exist.
    fn standby(&self, ctx: &StandbyContext) -> Option<BoxFuture<'static, ()>> {
        let config = self.flags.config(self.context(true)).ok()?;
        let client = ClientOptions {
            user_agent: format!("netcm/{VERSION} startup-sweep"),
            ..ctx.client.clone()
        };
        let sweep = self.sweep.clone();
        Some(Box::pin(sweep.run(
            client,
            config,
            ctx.node_name.clone(),
            self.cluster_cidr_objects,
        )))
    }
}

//! node-annotation-syncer: publishes every Node's subnet lease in flannel's kube-subnet-manager
//! annotation format, centrally, so node agents need only read access to Nodes.
//!
//! Watches Nodes through the manager's shared informer. For each Node with pod CIDR(s) it writes, under
//! `--annotation-prefix`, `kube-subnet-manager: "true"`, `backend-type`, `backend-data` (`null` for
//! host-gw, plus `backend-v6-data` when the Node has an IPv6 pod CIDR; other backends keep what their
//! agent wrote), `public-ip` and `public-ipv6` — from the `public-ip(v6)-overwrite` annotation when it is
//! a usable address, else from `status.addresses` in `--public-ip-address-types` order. Only the keys
//! that differ go into one JSON merge PATCH, behind the leader fence; annotations it does not own are
//! never touched. An unusable overwrite keeps the last good value and raises a Warning Event and
//! `netcm_annotation_invalid_overwrites_total`. A Node without a pod CIDR or an address of the right
//! family gets nothing until it changes. A Node whose lease a node agent publishes (a flanneld in
//! kube-subnet-manager mode: another field manager owns a lease key, see [`owner`]) is left alone.
//!
//! The pure decisions live in [`subnet_lease::plan`] and [`owner::agent_lease`]; start reading at
//! [`syncer::Syncer::sync_node`].

pub mod flags;
pub mod metrics;
pub mod owner;
pub mod subnet_lease;
pub mod syncer;

use kube::api::Api;
use netcm_manager::{Controller, ControllerDescriptor, InitContext, InitError, InitResult};

pub use flags::{Config, Flags};
pub use syncer::{Syncer, NAME};

/// Other names `--controllers` accepts for the syncer.
pub const ALIASES: &[&str] = &["annotations"];

/// The registry entry: on by default (`*` starts it).
pub fn descriptor(flags: Flags) -> ControllerDescriptor {
    ControllerDescriptor::new(NAME, ALIASES, flags)
}

/// Whether netcm started with `--controllers=controllers` runs the syncer, as its registry decides.
pub fn is_enabled(controllers: &[String]) -> bool {
    netcm_manager::registry::enables(controllers, NAME, ALIASES, false)
}

/// Builds the syncer: its metrics, and a queue fed by every Node event.
fn init(flags: &Flags, ctx: &InitContext) -> InitResult {
    let config = flags.config().map_err(InitError::new)?;
    let metrics = metrics::SyncerMetrics::register(&ctx.registry).map_err(InitError::new)?;
    let queue = ctx.node_queue(NAME)?;
    tracing::info!(
        controller = NAME,
        prefix = %config.keys.prefix,
        backend_type = %config.backend_type,
        address_types = %config.address_types.join(","),
        "publishing subnet leases as node annotations"
    );
    let syncer = Syncer::new(
        ctx.nodes.clone(),
        Api::all(ctx.client.clone()),
        config,
        ctx.recorder.clone(),
        ctx.leader.clone(),
        metrics,
        ctx.allocation_backlog.clone(),
    );
    Ok(Some(Controller::new().reconciler(
        syncer,
        queue,
        ctx.workers,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netcm_manager::Registry;

    #[test]
    fn is_enabled_answers_as_the_registry_holding_the_syncers_descriptor() {
        let flags = netcm_manager::test_support::parse_flags(&[]).expect("flags parse");
        let registry = Registry::new(vec![descriptor(flags)]).expect("a valid registry");
        for controllers in [
            "*",
            "-node-annotation-syncer,*",
            "*,-annotations",
            "annotations,-node-annotation-syncer",
        ] {
            let list: Vec<String> = controllers.split(',').map(str::to_owned).collect();
            let by_registry = registry
                .enabled(&list)
                .expect("every name in the list is the syncer's")
                .iter()
                .any(|d| d.name == NAME);
            assert_eq!(
                is_enabled(&list),
                by_registry,
                "--controllers={controllers}"
            );
        }
    }
}

//! Re-numbering a live cluster: every selected Node moves from the pools it holds CIDRs from (the
//! *origins*) to one pool (the *destination*) — a new cluster range, a new per-Node size or a second
//! family are each just a destination pool (a ClusterCIDR) — Node by Node, while the rest of the pod
//! network stays up.
//!
//! Start reading at [`plan::plan`]: given what the operator asked ([`plan::Spec`]), what the API shows
//! of each Node ([`plan::NodeFacts`]) and how far each moving Node has come ([`plan::Progress`], which
//! lives in the API so a new leader resumes where the last stopped), it says what to do next
//! ([`plan::Action`]) and where the migration stands ([`plan::Phase`]). It is pure: no I/O and no clock
//! of its own, so every rule below is a unit test.
//!
//! Why a Node moves by leaving and coming back: `spec.podCIDRs` cannot change once set, not even to add
//! a family, so a Node gets CIDRs from the destination only by being deleted and registering again —
//! its pods evicted first (the Eviction API, so PodDisruptionBudgets hold), the kubelet's restart being
//! the node's own step. While a migration runs the origins give out nothing new, so a Node that
//! registers again can only be served from the destination; a Node that comes back with CIDRs from
//! anywhere else stops the migration.
//!
//! The rules, each a test in `plan/tests.rs`:
//! - at most `max_unavailable` Nodes are out of service at once (draining or re-registering), started
//!   in name order;
//! - a drain that outlasts its timeout, or a Node that does not come back with CIDRs from the
//!   destination in time, fails that Node: it is put back in service if it still runs (uncordoned), and
//!   no further Node starts until an operator looks (the migration is *stalled*);
//! - a rollback turns the direction around: Nodes still draining are put back in service, Nodes
//!   already deleted finish coming back (now served by the origin), and every Node that reached the
//!   destination moves back the same way;
//! - a Node is done when every CIDR it holds comes from the destination and it has one of each family
//!   the destination gives, whether it moved or registered there to begin with.
//!
//! The controller around it ([`migrator`]) reads the PodCIDRMigration objects
//! (`netcm_api::pod_cidr_migration`, which hold [`plan::Spec`] and, in their status, [`plan::Progress`]
//! as [`progress`] writes it), works out each Node's pools from the pools' ranges ([`pools`]) and
//! carries the planner's actions out: cordon, evictions, delete, status. The allocator closes every
//! other pool while a migration it can see has been accepted; the kubelet's registering again is the
//! node's own step. It is off by default (`--controllers=*,pod-cidr-migration`): it deletes Nodes.

pub mod metrics;
pub mod migrator;
pub mod plan;
pub mod pools;
pub mod progress;

use std::sync::Arc;

use clap::Args;
use ipnet::IpNet;
use kube::api::Api;
use netcm_manager::flags::GenericFlags;
use netcm_manager::{
    Controller, ControllerDescriptor, ControllerOptions, InitContext, InitError, InitResult,
};

use migrator::{on_node_change, watch_migrations, Migrator, Store};

/// The controller's canonical name: its queue, metrics label and log field.
pub const NAME: &str = "pod-cidr-migration";

/// pod-cidr-migration flags.
#[derive(Debug, Clone, Args)]
#[group(id = "pod-cidr-migration-flags")]
pub struct Flags {
    /// Number of PodCIDRMigrations synced concurrently. One runs at a time, so more only lets a Pending or Invalid one be reported while another runs.
    #[arg(long, default_value_t = 1)]
    pub concurrent_pod_cidr_migration_syncs: usize,
}

/// A flag value the controller refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// An entry of `--cluster-cidr` that does not parse.
    #[error("--cluster-cidr: {0:?} is not a CIDR")]
    ClusterCidr(String),
    /// No worker.
    #[error("--concurrent-pod-cidr-migration-syncs must be at least 1")]
    Workers,
    /// The allocator would not close its pools: every Node coming back would fail its move.
    #[error("pod-cidr-migration needs --cluster-cidr-objects=true: the subnet-allocator closes every pool but a running migration's destination only while it reads ClusterCIDR objects and PodCIDRMigrations")]
    NoClusterCidrObjects,
}

/// The flags with the allocator's `--cluster-cidr`, whose pool Nodes may move from or to.
#[derive(Debug, Clone)]
struct Options {
    flags: Flags,
    cluster_cidr: String,
    cluster_cidr_objects: bool,
}

impl Options {
    fn flag_ranges(&self) -> Result<Vec<IpNet>, FlagError> {
        self.cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|_| FlagError::ClusterCidr(s.to_string()))
            })
            .collect()
    }
}

/// The registry entry, handed the allocator's `--cluster-cidr` (the flag pool's ranges) and
/// `--cluster-cidr-objects` (without which the allocator closes no pool). Off by default: it cordons,
/// drains and deletes Nodes, which an operator turns on knowingly.
pub fn descriptor(
    flags: Flags,
    cluster_cidr: &str,
    cluster_cidr_objects: bool,
) -> ControllerDescriptor {
    let options = Options {
        flags,
        cluster_cidr: cluster_cidr.to_string(),
        cluster_cidr_objects,
    };
    ControllerDescriptor::new(NAME, &["renumbering"], options).disabled_by_default()
}

impl ControllerOptions for Options {
    type FlagError = FlagError;

    fn validate(&self, _generic: &GenericFlags) -> Result<(), FlagError> {
        if self.flags.concurrent_pod_cidr_migration_syncs == 0 {
            return Err(FlagError::Workers);
        }
        if !self.cluster_cidr_objects {
            return Err(FlagError::NoClusterCidrObjects);
        }
        self.flag_ranges().map(|_| ())
    }

    fn effective_config(&self) -> Vec<(String, String)> {
        vec![(
            "--concurrent-pod-cidr-migration-syncs".into(),
            self.flags.concurrent_pod_cidr_migration_syncs.to_string(),
        )]
    }

    fn workers(&self) -> usize {
        self.flags.concurrent_pod_cidr_migration_syncs
    }

    fn init(&self, ctx: &InitContext) -> InitResult {
        let flag_ranges = self.flag_ranges().map_err(InitError::new)?;
        let queue = ctx.new_queue(NAME);
        let writer = kube::runtime::reflector::store::Writer::new(
            netcm_api::pod_cidr_migration::api_resource(),
        );
        let store: Store = writer.as_reader();
        ctx.nodes
            .subscribe(Arc::new(on_node_change(store.clone(), queue.clone())))
            .map_err(InitError::new)?;
        let migrations = Api::all_with(
            ctx.client.clone(),
            &netcm_api::pod_cidr_migration::api_resource(),
        );
        let metrics = metrics::MigrationMetrics::register(&ctx.registry).map_err(InitError::new)?;
        let migrator = Arc::new(Migrator {
            nodes: ctx.nodes.clone(),
            store: store.clone(),
            migrations: migrations.clone(),
            cluster_cidrs: Api::all_with(ctx.client.clone(), &cluster_cidr_resource()),
            node_api: Api::all(ctx.client.clone()),
            pods: Api::all(ctx.client.clone()),
            guard: ctx.leader.clone(),
            recorder: ctx.recorder.clone(),
            flag_ranges,
            metrics,
        });
        Ok(Some(
            Controller::new()
                .service(watch_migrations(migrations, writer, queue.clone()))
                .reconciler(migrator, queue, ctx.workers),
        ))
    }
}

/// The ClusterCIDR resource, read for its ranges.
pub(crate) fn cluster_cidr_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "networking.x-k8s.io".into(),
        version: "v1".into(),
        api_version: "networking.x-k8s.io/v1".into(),
        kind: "ClusterCIDR".into(),
        plural: "clustercidrs".into(),
    }
}

#[cfg(test)]
mod tests;

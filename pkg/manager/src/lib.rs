//! netcm's controller-manager core, in the shape of kube-controller-manager.
//!
//! It owns everything that is not a controller: the API client ([`client`]: rate limit, user agent,
//! fence, metrics), the one shared Node informer ([`informer`]), leader election with fencing
//! ([`leader`]), the controller registry and `--controllers` rules ([`registry`]), what a controller is
//! to `cmd` ([`descriptor`]: its flags, effective configuration, init) and to the manager
//! ([`controller`]: [`Reconciler`]s and the one worker loop that runs them), what of a Node each
//! reconciler reads ([`node_fields`]: the cache keeps only that, as a [`CachedNode`]), Events ([`events`]), the HTTP endpoints ([`http`], [`health`],
//! and [`secure`] for TLS with delegated auth),
//! process metrics ([`metrics`]), the allocator's backlog other writers give way to ([`allocation_backlog`]), logs ([`logging`]), what stops a replica that cannot work ([`supervision`]), the generic flags ([`flags`]) and the main
//! sequence ([`run`]). It never depends on a controller: `cmd/netcm` hands it the registry.
//!
//! Start reading at [`run::run`].

pub mod allocation_backlog;
pub mod client;
pub mod controller;
pub mod descriptor;
pub mod duration;
pub mod events;
pub mod flags;
pub mod health;
pub mod http;
pub mod informer;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod node_fields;
pub mod published;
pub mod registry;
pub mod run;
pub mod secure;
pub mod supervision;
pub mod sync_metrics;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod ttl_cache;

pub use allocation_backlog::AllocationBacklog;
pub use controller::{
    Controller, InitContext, InitError, InitResult, Key, Prepared, Reconciler, SyncError,
    SyncOutcome,
};
pub use descriptor::{
    ControllerDescriptor, ControllerFlagError, ControllerOptions, StandbyContext,
};
pub use events::{EventRecorder, EventType};
pub use informer::{Cached, InformerEvent, SharedInformer};
pub use leader::{Fenced, LeaderGuard, WriteTicket};
pub use netcm_node::{Address, CachedNode, Condition, Taint};
pub use node_fields::NodeFields;
pub use registry::{InvalidFlags, Registry};

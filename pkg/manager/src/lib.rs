//! netcm's controller-manager core, in the shape of kube-controller-manager.
//!
//! It owns everything that is not a controller: the API client ([`client`]: rate limit, user agent,
//! fence, metrics), the one shared Node informer ([`informer`]), leader election with fencing
//! ([`leader`]), the controller registry and `--controllers` rules ([`registry`]), what a controller is
//! and the worker loop ([`controller`]), Events ([`events`]), the HTTP endpoints ([`http`], [`health`],
//! and [`secure`] for TLS with delegated auth),
//! process metrics ([`metrics`]), logs ([`logging`]), the generic flags ([`flags`]) and the main
//! sequence ([`run`]). It never depends on a controller: `cmd/netcm` hands it the registry.
//!
//! Start reading at [`run::run`].

pub mod client;
pub mod controller;
pub mod duration;
pub mod events;
pub mod flags;
pub mod health;
pub mod http;
pub mod informer;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod published;
pub mod registry;
pub mod run;
pub mod secure;
pub mod sync_metrics;
pub mod ttl_cache;

pub use controller::{
    run_workers, Controller, InitContext, InitError, InitFn, InitResult, SyncOutcome,
};
pub use events::{EventRecorder, EventType};
pub use informer::{InformerEvent, SharedInformer};
pub use leader::{Fenced, LeaderGuard, WriteTicket};
pub use registry::{ControllerDescriptor, Registry};

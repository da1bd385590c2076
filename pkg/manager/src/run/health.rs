//! What the probes report: a standby is ready once it has reached the API server; the leader once its
//! Node cache has synced; `/healthz` and `/livez` fail when the leader's renewals stall (the watchdog).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::Registry;

use crate::health::HealthChecks;
use crate::http::Endpoints;
use crate::leader::LeaderGuard;
use crate::supervision::ControllerHealth;

/// The health checks served and the two facts readiness waits for: a standby is ready once it has
/// reached the API server; the leader once its cache has synced.
pub(super) struct Health {
    /// /healthz; the controllers add themselves when they start.
    pub(super) healthz: HealthChecks,
    /// /livez; the controllers add themselves when they start, as on /healthz.
    pub(super) livez: HealthChecks,
    readyz: HealthChecks,
    /// Set once the API server answered.
    pub(super) api_reachable: Arc<AtomicBool>,
    /// Set once the leader's cache has synced (from the start without leader election).
    pub(super) cache_synced: Arc<AtomicBool>,
}

impl Health {
    /// The checks, with readiness not yet reached.
    pub(super) fn new(guard: &LeaderGuard, leader_elect: bool) -> Self {
        let health = Self {
            healthz: HealthChecks::default(),
            livez: HealthChecks::default(),
            readyz: HealthChecks::default(),
            api_reachable: Arc::new(AtomicBool::new(false)),
            cache_synced: Arc::new(AtomicBool::new(!leader_elect)),
        };
        for checks in [&health.healthz, &health.livez] {
            checks.add("ping", Arc::new(|| Ok(())));
            let g = guard.clone();
            checks.add("leaderElection", Arc::new(move || g.watchdog()));
        }
        let reach = health.api_reachable.clone();
        health.readyz.add(
            "apiserver",
            Arc::new(move || {
                reach
                    .load(Ordering::SeqCst)
                    .then_some(())
                    .ok_or_else(|| "the API server has not been reached yet".to_string())
            }),
        );
        let (g, synced) = (guard.clone(), health.cache_synced.clone());
        health.readyz.add(
            "informer-sync",
            Arc::new(move || {
                if !g.is_leader() || synced.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("leading, but the Node cache has not synced yet".into())
                }
            }),
        );
        health
    }

    /// A controller's own readiness check, by its name, on `/readyz` (replacing the last term's).
    pub(super) fn add_readiness(&self, controller: &str, readiness: ControllerHealth) {
        self.readyz
            .add(controller, Arc::new(move || readiness.check()));
    }

    /// What the listeners serve.
    pub(super) fn endpoints(&self, registry: &Registry) -> Endpoints {
        Endpoints {
            registry: registry.clone(),
            healthz: self.healthz.clone(),
            livez: self.livez.clone(),
            readyz: self.readyz.clone(),
        }
    }
}

//! Init: each enabled controller's init function called in registry order, with KCM's start interval
//! and jitter, each with its own client and readiness, all sharing one informer and one allocation
//! backlog.

use rand::Rng;

use super::process::own_node_name;
use super::{Initialized, Manager, RunError};
use crate::controller::InitContext;
use crate::events::EventRecorder;
use crate::informer::SharedInformer;
use crate::supervision::ControllerHealth;
use netcm_node::CachedNode;

impl Manager {
    /// Init: call each enabled controller's init function, in registry order and with KCM's start
    /// interval and jitter. Inits subscribe to `nodes` and build queues; they spawn nothing.
    pub(super) async fn init(
        &self,
        nodes: &SharedInformer<CachedNode>,
    ) -> Result<Initialized, RunError> {
        let flags = &self.opts.flags;
        let ctx = InitContext {
            client: self.client.clone(),
            nodes: nodes.clone(),
            registry: self.registry.clone(),
            workqueue_metrics: self.workqueue_metrics.clone(),
            recorder: EventRecorder::new(self.client.clone(), "netcm", &self.lease.identity),
            leader: self.guard.clone(),
            node_name: own_node_name(&self.client).await,
            leader_elected: flags.leader_elect,
            workers: 1,
            readiness: ControllerHealth::default(),
            allocation_backlog: crate::AllocationBacklog::default(),
        };
        let mut initialized: Initialized = Vec::new();
        for d in self.controllers.descriptors() {
            if !self.enabled.contains(&d.name) {
                tracing::info!(
                    controller = d.name,
                    "skipping controller: disabled by --controllers"
                );
                continue;
            }
            if !flags.controller_start_interval.is_zero() {
                let jitter = rand::rng().random_range(0.0..1.0);
                tokio::time::sleep(flags.controller_start_interval.mul_f64(1.0 + jitter)).await;
            }
            let ctx = InitContext {
                client: self.clients.fenced()?,
                workers: d.workers(),
                readiness: ControllerHealth::default(),
                ..ctx.clone()
            };
            self.health.add_readiness(d.name, ctx.readiness.clone());
            match d.init(&ctx).map_err(|source| RunError::Init {
                name: d.name,
                source,
            })? {
                Some(c) => initialized.push((d.name, c)),
                None => tracing::info!(
                    controller = d.name,
                    "skipping controller: disabled by its configuration"
                ),
            }
        }
        Ok(initialized)
    }
}

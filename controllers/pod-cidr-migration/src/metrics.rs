//! The migration controller's own metrics (netcm_ prefix): where the running migration's Nodes stand,
//! whether it stalled, and the actions it took. One migration runs at a time, so no series carries a
//! migration's name (a label an operator's object names would grow without bound).

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::plan::{Action, Counts, Phase};

/// The states a Node is counted in.
const STATES: [&str; 6] = [
    "waiting",
    "draining",
    "registering",
    "done",
    "failed",
    "unallocated",
];
/// The actions, by the word their label takes.
const ACTIONS: [&str; 4] = ["cordon", "evict", "delete", "uncordon"];

/// The metric families the controller updates.
#[derive(Clone)]
pub struct MigrationMetrics {
    nodes: IntGaugeVec,
    stalled: IntGauge,
    actions: IntCounterVec,
    registered: Histogram,
}

impl MigrationMetrics {
    /// Registers the families, with every label value present from the start.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let nodes = IntGaugeVec::new(
            Opts::new(
                "netcm_pod_cidr_migration_nodes",
                "Nodes of the running PodCIDRMigration by state: waiting to move, draining, registering again, done (CIDRs from the destination alone), failed, unallocated.",
            ),
            &["state"],
        )?;
        let stalled = IntGauge::with_opts(Opts::new(
            "netcm_pod_cidr_migration_stalled",
            "1 while the running PodCIDRMigration is Stalled: a Node failed toward its destination and no further Node starts until an operator looks.",
        ))?;
        let actions = IntCounterVec::new(
            Opts::new(
                "netcm_pod_cidr_migration_actions_total",
                "Actions the pod-cidr-migration controller took on Nodes (an eviction counts once per Node and pass), by result.",
            ),
            &["action", "result"],
        )?;
        let registered = Histogram::with_opts(
            HistogramOpts::new(
                "netcm_pod_cidr_migration_node_registered_seconds",
                "Seconds from a moving Node's deletion being seen to its registering again with CIDRs from the destination (the drain excluded): the kubelet's restart and the allocation.",
            )
            .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
        )?;
        for s in STATES {
            nodes.with_label_values(&[s]);
        }
        for a in ACTIONS {
            for r in ["ok", "error"] {
                actions.with_label_values(&[a, r]);
            }
        }
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(stalled.clone()))?;
        registry.register(Box::new(actions.clone()))?;
        registry.register(Box::new(registered.clone()))?;
        Ok(Self {
            nodes,
            stalled,
            actions,
            registered,
        })
    }

    /// Publishes where the running migration stands after a pass.
    pub fn publish(&self, counts: &Counts, phase: &Phase) {
        let values = [
            counts.waiting,
            counts.draining,
            counts.registering,
            counts.done,
            counts.failed,
            counts.unallocated,
        ];
        for (state, v) in STATES.iter().zip(values) {
            self.nodes
                .with_label_values(&[state])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
        self.stalled
            .set(i64::from(matches!(phase, Phase::Stalled(_))));
    }

    /// Observes one Node back with CIDRs from the destination, `seconds` after its deletion was seen.
    pub fn registered(&self, seconds: f64) {
        self.registered.observe(seconds);
    }

    /// Counts one action's result.
    pub fn action(&self, action: &Action, ok: bool) {
        let word = match action {
            Action::Cordon { .. } => "cordon",
            Action::Evict { .. } => "evict",
            Action::Delete { .. } => "delete",
            Action::Uncordon { .. } => "uncordon",
        };
        self.actions
            .with_label_values(&[word, if ok { "ok" } else { "error" }])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_and_the_stall_are_published_from_a_pass() {
        let registry = Registry::new();
        let m = MigrationMetrics::register(&registry).expect("registers");
        let counts = Counts {
            waiting: 3,
            failed: 1,
            ..Default::default()
        };
        m.publish(&counts, &Phase::Stalled(vec!["a".into()]));
        assert_eq!(m.nodes.with_label_values(&["waiting"]).get(), 3);
        assert_eq!(m.nodes.with_label_values(&["failed"]).get(), 1);
        assert_eq!(m.stalled.get(), 1);
        m.publish(&Counts::default(), &Phase::Complete);
        assert_eq!(m.stalled.get(), 0);
        m.action(
            &Action::Delete {
                node: "a".into(),
                uid: "u".into(),
            },
            true,
        );
        assert_eq!(m.actions.with_label_values(&["delete", "ok"]).get(), 1);
    }
}

//! The syncer's own metrics (netcm_ prefix); its workqueue metrics carry `name="node-annotation-syncer"`.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::subnet_lease::Waiting;
use netcm_node::Family;

/// The metric families the syncer updates.
#[derive(Clone)]
pub struct SyncerMetrics {
    /// PATCHes of lease annotations sent to the API server.
    pub writes: IntCounter,
    /// Lease writes that waited for the subnet-allocator's backlog first.
    pub given_way: IntCounter,
    pub(crate) invalid: IntCounterVec,
    pub(crate) waiting: IntGaugeVec,
    pub(crate) agent_managed: IntGauge,
}

impl SyncerMetrics {
    /// Registers the families, with every label value present from the start.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let writes = IntCounter::with_opts(Opts::new(
            "netcm_annotation_writes_total",
            "Lease annotation PATCHes the node-annotation-syncer sent to the API server.",
        ))?;
        let given_way = IntCounter::with_opts(Opts::new(
            "netcm_annotation_writes_given_way_total",
            "Lease writes that waited (up to 2 s each) for the subnet-allocator's backlog to end, then were decided again: a Node's CIDR comes before its lease.",
        ))?;
        let invalid = IntCounterVec::new(
            Opts::new(
                "netcm_annotation_invalid_overwrites_total",
                "Public-IP overwrite annotation values found unusable (each distinct value counted once per Node).",
            ),
            &["family"],
        )?;
        let waiting = IntGaugeVec::new(
            Opts::new(
                "netcm_annotation_nodes_waiting",
                "Nodes with no lease published yet, by reason (no pod CIDR, unusable pod CIDR, no address of a pod CIDR's family).",
            ),
            &["reason"],
        )?;
        let agent_managed = IntGauge::with_opts(Opts::new(
            "netcm_annotation_agent_managed_nodes",
            "Nodes whose lease differs from what netcm would publish and is left to the node agent that publishes it (another field manager owns a lease annotation).",
        ))?;
        for f in [Family::V4, Family::V6] {
            invalid.with_label_values(&[f.label()]);
        }
        for r in Waiting::LABELS {
            waiting.with_label_values(&[r]);
        }
        registry.register(Box::new(writes.clone()))?;
        registry.register(Box::new(given_way.clone()))?;
        registry.register(Box::new(invalid.clone()))?;
        registry.register(Box::new(waiting.clone()))?;
        registry.register(Box::new(agent_managed.clone()))?;
        Ok(Self {
            writes,
            given_way,
            invalid,
            waiting,
            agent_managed,
        })
    }

    /// Counts one newly seen invalid overwrite.
    pub fn invalid_overwrite(&self, family: Family) {
        self.invalid.with_label_values(&[family.label()]).inc();
    }

    /// Sets how many Nodes' leases are left to their node agents.
    pub fn set_agent_managed(&self, nodes: usize) {
        self.agent_managed
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
    }

    /// Moves one Node between waiting reasons (`None` = not waiting).
    pub fn waiting_moved(&self, from: Option<&'static str>, to: Option<&'static str>) {
        if from == to {
            return;
        }
        if let Some(r) = from {
            self.waiting.with_label_values(&[r]).dec();
        }
        if let Some(r) = to {
            self.waiting.with_label_values(&[r]).inc();
        }
    }
}

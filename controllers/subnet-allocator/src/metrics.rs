//! The allocator's metrics, with kube-controller-manager's names (label `clusterCIDR`), plus
//! `netcm_node_cidr_conflicts`.

use netcm_ipam::{PoolStats, PoolTries};
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

/// The metric families the allocator updates.
#[derive(Clone)]
pub struct AllocatorMetrics {
    allocations: IntCounterVec,
    releases: IntCounterVec,
    usage: GaugeVec,
    max: GaugeVec,
    tries: HistogramVec,
    /// Nodes whose pod CIDRs are currently unparsable, out of range or overlapping another Node's.
    pub conflicts: IntGauge,
}

const SUBSYSTEM: &str = "node_ipam_controller";

impl AllocatorMetrics {
    /// Registers the families.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let opts = |name: &str, help: &str| Opts::new(name, help).subsystem(SUBSYSTEM);
        let allocations = IntCounterVec::new(
            opts(
                "cidrset_cidrs_allocations_total",
                "Counter measuring total number of CIDR allocations.",
            ),
            &["clusterCIDR"],
        )?;
        let releases = IntCounterVec::new(
            opts(
                "cidrset_cidrs_releases_total",
                "Counter measuring total number of CIDR releases.",
            ),
            &["clusterCIDR"],
        )?;
        let usage = GaugeVec::new(
            opts(
                "cidrset_usage_cidrs",
                "Gauge measuring the fraction of the CIDRs of a cluster CIDR that are allocated.",
            ),
            &["clusterCIDR"],
        )?;
        let max = GaugeVec::new(
            opts(
                "cirdset_max_cidrs",
                "Maximum number of CIDRs that can be allocated.",
            ),
            &["clusterCIDR"],
        )?;
        let tries = HistogramVec::new(
            HistogramOpts::new(
                "cidrset_allocation_tries_per_request",
                "Number of candidate CIDRs examined per allocation request.",
            )
            .subsystem(SUBSYSTEM)
            .buckets(prometheus::exponential_buckets(1.0, 5.0, 5)?),
            &["clusterCIDR"],
        )?;
        let conflicts = IntGauge::with_opts(Opts::new(
            "netcm_node_cidr_conflicts",
            "Nodes whose pod CIDRs are unparsable, outside every cluster CIDR, or overlap another Node's.",
        ))?;
        registry.register(Box::new(allocations.clone()))?;
        registry.register(Box::new(releases.clone()))?;
        registry.register(Box::new(usage.clone()))?;
        registry.register(Box::new(max.clone()))?;
        registry.register(Box::new(tries.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        Ok(Self {
            allocations,
            releases,
            usage,
            max,
            tries,
            conflicts,
        })
    }

    /// Counts fresh allocations and their effort.
    pub fn allocated(&self, fresh: &[PoolTries]) {
        for t in fresh {
            let label = t.cluster.to_string();
            self.allocations.with_label_values(&[&label]).inc();
            // KCM counts tries from 1 (the candidate taken); `tries` counts the occupied ones skipped.
            self.tries
                .with_label_values(&[&label])
                .observe((t.tries + 1) as f64);
        }
    }

    /// Counts one released CIDR in its cluster CIDR.
    pub fn released(&self, cluster: &str) {
        self.releases.with_label_values(&[cluster]).inc();
    }

    /// Publishes usage and capacity of every cluster CIDR.
    pub fn publish(&self, stats: &[PoolStats]) {
        for s in stats {
            self.usage
                .with_label_values(&[&s.cluster_cidr])
                .set(s.usage);
            self.max
                .with_label_values(&[&s.cluster_cidr])
                .set(s.max as f64);
        }
    }
}

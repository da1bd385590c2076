//! The allocator's metrics: kube-controller-manager's `cidrset_*` (label `clusterCIDR`) for the flag pool,
//! node-ipam-controller's `multicidrset_*` (labels `clusterCIDR`, `clusterCIDRName`) for every pool, plus
//! `netcm_node_cidr_conflicts`, `netcm_node_cidr_oversized` and `netcm_pod_cidr_quarantine_nodes`.

use std::collections::HashSet;
use std::sync::Arc;

use netcm_ipam::{PoolStats, PoolTries, DEFAULT_POOL};
use parking_lot::Mutex;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

/// The metric families the allocator updates.
#[derive(Clone)]
pub struct AllocatorMetrics {
    allocations: IntCounterVec,
    releases: IntCounterVec,
    usage: GaugeVec,
    max: GaugeVec,
    tries: HistogramVec,
    multi_allocations: IntCounterVec,
    multi_releases: IntCounterVec,
    multi_usage: GaugeVec,
    multi_max: GaugeVec,
    /// (cluster CIDR, pool) pairs the gauges show, so a dropped pool's series go with it.
    shown: Arc<Mutex<HashSet<(String, String)>>>,
    /// Nodes whose pod CIDRs are currently unparsable, out of range or overlapping another Node's.
    pub conflicts: IntGauge,
    /// Nodes holding a pod CIDR wider than the node CIDRs of a pool it overlaps.
    pub oversized: IntGauge,
    /// Nodes the quarantine of earlier leaders' blocks waits for.
    pub quarantine_nodes: IntGauge,
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
        let pair = ["clusterCIDR", "clusterCIDRName"];
        let multi_allocations = IntCounterVec::new(
            opts(
                "multicidrset_cidrs_allocations_total",
                "Counter measuring total number of CIDR allocations, per pool.",
            ),
            &pair,
        )?;
        let multi_releases = IntCounterVec::new(
            opts(
                "multicidrset_cidrs_releases_total",
                "Counter measuring total number of CIDR releases, per pool.",
            ),
            &pair,
        )?;
        let multi_usage = GaugeVec::new(
            opts(
                "multicidrset_usage_cidrs",
                "Gauge measuring the fraction of a pool's cluster CIDR that is in use.",
            ),
            &pair,
        )?;
        let multi_max = GaugeVec::new(
            opts(
                "multicidrset_max_cidrs",
                "Maximum number of CIDRs that can be allocated, per pool.",
            ),
            &pair,
        )?;
        let conflicts = IntGauge::with_opts(Opts::new(
            "netcm_node_cidr_conflicts",
            "Nodes whose pod CIDRs are unparsable, outside every cluster CIDR, or overlap another Node's.",
        ))?;
        let oversized = IntGauge::with_opts(Opts::new(
            "netcm_node_cidr_oversized",
            "Nodes holding a pod CIDR wider than the node CIDRs of a pool it overlaps; netcm hands out no address inside it, so it may keep a whole pool full (its CIDROversized Event names it).",
        ))?;
        let quarantine_nodes = IntGauge::with_opts(Opts::new(
            "netcm_pod_cidr_quarantine_nodes",
            "Nodes without pod CIDRs that an earlier leader may still be writing to; while above 0, the free CIDRs of earlier leaders' claimed blocks are not handed out.",
        ))?;
        registry.register(Box::new(quarantine_nodes.clone()))?;
        registry.register(Box::new(allocations.clone()))?;
        registry.register(Box::new(releases.clone()))?;
        registry.register(Box::new(usage.clone()))?;
        registry.register(Box::new(max.clone()))?;
        registry.register(Box::new(tries.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        registry.register(Box::new(oversized.clone()))?;
        for m in [&multi_allocations, &multi_releases] {
            registry.register(Box::new(m.clone()))?;
        }
        for m in [&multi_usage, &multi_max] {
            registry.register(Box::new(m.clone()))?;
        }
        Ok(Self {
            allocations,
            releases,
            usage,
            max,
            tries,
            multi_allocations,
            multi_releases,
            multi_usage,
            multi_max,
            shown: Arc::new(Mutex::new(HashSet::new())),
            conflicts,
            oversized,
            quarantine_nodes,
        })
    }

    /// Counts fresh allocations from `pool` and their effort.
    pub fn allocated(&self, pool: &str, fresh: &[PoolTries]) {
        for t in fresh {
            let label = t.cluster.to_string();
            self.multi_allocations
                .with_label_values(&[&label, pool])
                .inc();
            if pool != DEFAULT_POOL {
                continue;
            }
            self.allocations.with_label_values(&[&label]).inc();
            // KCM counts tries from 1 (the candidate taken); `tries` counts the occupied ones skipped.
            self.tries
                .with_label_values(&[&label])
                .observe((t.tries + 1) as f64);
        }
    }

    /// Counts one released CIDR in its pool and cluster CIDR.
    pub fn released(&self, pool: &str, cluster: &str) {
        self.multi_releases
            .with_label_values(&[cluster, pool])
            .inc();
        if pool == DEFAULT_POOL {
            self.releases.with_label_values(&[cluster]).inc();
        }
    }

    /// Publishes usage and capacity of every cluster CIDR.
    pub fn publish(&self, stats: &[PoolStats]) {
        let now: HashSet<(String, String)> = stats
            .iter()
            .map(|s| (s.cluster_cidr.clone(), s.pool.clone()))
            .collect();
        {
            let mut shown = self.shown.lock();
            for (cidr, pool) in shown.difference(&now) {
                let _ = self.multi_usage.remove_label_values(&[cidr, pool]);
                let _ = self.multi_max.remove_label_values(&[cidr, pool]);
            }
            *shown = now;
        }
        for s in stats {
            let pair = [s.cluster_cidr.as_str(), s.pool.as_str()];
            self.multi_usage.with_label_values(&pair).set(s.usage);
            self.multi_max.with_label_values(&pair).set(s.max as f64);
            if s.pool != DEFAULT_POOL {
                continue;
            }
            self.usage
                .with_label_values(&[&s.cluster_cidr])
                .set(s.usage);
            self.max
                .with_label_values(&[&s.cluster_cidr])
                .set(s.max as f64);
        }
    }
}

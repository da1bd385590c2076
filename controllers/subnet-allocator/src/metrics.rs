//! The allocator's metrics: kube-controller-manager's `cidrset_*` (label `clusterCIDR`) for the flag pool,
//! node-ipam-controller's `multicidrset_*` (labels `clusterCIDR`, `clusterCIDRName`) for every pool, plus
//! `netcm_node_cidr_conflicts`, `netcm_node_cidr_oversized`, `netcm_pod_cidr_quarantine_nodes`, `netcm_pod_cidr_quarantine_touch_refused_nodes`, and per pool
//! and family what it can still hand out (`netcm_pool_*`, from netcm-ipam's `PoolSpace`, as `netcm check`
//! prints it), and what became of release holds and their records.

use std::collections::HashSet;
use std::sync::Arc;

use netcm_ipam::{PoolSpace, PoolStats, PoolTries, DEFAULT_POOL};
use parking_lot::Mutex;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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
    space: SpaceGauges,
    /// Nodes whose pod CIDRs are currently unparsable, out of range or overlapping another Node's.
    pub conflicts: IntGauge,
    /// Nodes holding a pod CIDR wider than the node CIDRs of a pool it overlaps.
    pub oversized: IntGauge,
    /// Nodes the quarantine of earlier leaders' blocks waits for.
    pub quarantine_nodes: IntGauge,
    /// Nodes the quarantine waits for whose touch the API refused for good.
    pub quarantine_touch_refused: IntGauge,
    /// CIDRs handed out before their release hold ended, per pool.
    release_hold_cut_short: IntCounterVec,
    /// Release holds that ended, per pool and why.
    release_holds_ended: IntCounterVec,
    /// Release-hold records on PodCIDRClaims a new leader did not take as written, per why.
    release_hold_records_distrusted: IntCounterVec,
    /// Failed lists before the first allocation, per list.
    pub start_list_failures: IntCounterVec,
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
        let quarantine_touch_refused = IntGauge::with_opts(Opts::new(
            "netcm_pod_cidr_quarantine_touch_refused_nodes",
            "Nodes the quarantine waits for whose touch the API refused for good (CIDRQuarantineTouchRefused): one alone is given pod CIDRs from the quarantine once it is the last one waiting; while two or more are, the quarantine stays until they have pod CIDRs or are gone.",
        ))?;
        let release_hold_cut_short = IntCounterVec::new(
            Opts::new(
                "netcm_pool_release_hold_cut_short_total",
                "Allocations that took CIDRs a deleted Node released before their --cidr-release-hold ended, because the pool had nothing else free.",
            ),
            &["pool"],
        )?;
        registry.register(Box::new(release_hold_cut_short.clone()))?;
        let release_holds_ended = IntCounterVec::new(
            Opts::new(
                "netcm_pool_release_holds_ended_total",
                "Release holds (--cidr-release-hold) that ended, per pool and reason: expired and given_back (to the Node re-joining as the held one) on time; handed_out (its room went to another Node of a full pool), no_longer_valid, node_holds_cidr, pool_deleted and replaced early, each with a CIDRReleaseHoldEnded Warning Event.",
            ),
            &["pool", "reason"],
        )?;
        registry.register(Box::new(release_holds_ended.clone()))?;
        let release_hold_records_distrusted = IntCounterVec::new(
            Opts::new(
                "netcm_pod_cidr_release_hold_records_distrusted_total",
                "Release-hold records on PodCIDRClaims a new leader did not take as written, per reason: ignored (unreadable, outside_block: a CIDR outside the claim's block, not_on_every_block: missing from the claim of another of its CIDRs) or cut down (until_beyond_hold: ending later than --cidr-release-hold from now).",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(release_hold_records_distrusted.clone()))?;
        let start_list_failures = IntCounterVec::new(
            Opts::new(
                "netcm_pod_cidr_start_list_failures_total",
                "Failed lists of what a new leader must read before its first allocation (PodCIDRClaims, Nodes); while they fail nothing is allocated and /readyz says why, and past a bound the leader steps down.",
            ),
            &["list"],
        )?;
        registry.register(Box::new(start_list_failures.clone()))?;
        registry.register(Box::new(quarantine_nodes.clone()))?;
        registry.register(Box::new(quarantine_touch_refused.clone()))?;
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
            space: SpaceGauges::register(registry)?,
            conflicts,
            oversized,
            quarantine_nodes,
            quarantine_touch_refused,
            release_hold_cut_short,
            release_holds_ended,
            release_hold_records_distrusted,
            start_list_failures,
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

    /// Counts an allocation that cut a release hold short in `pool`.
    pub fn release_hold_cut_short(&self, pool: &str) {
        self.release_hold_cut_short.with_label_values(&[pool]).inc();
    }

    /// Counts a release hold of `pool` that ended, and why (`reason`, [`netcm_ipam::ReleaseHoldEnd::label`]).
    pub fn release_hold_ended(&self, pool: &str, reason: &str) {
        self.release_holds_ended
            .with_label_values(&[pool, reason])
            .inc();
    }

    /// Counts a release-hold record a new leader did not take as written, and why.
    pub fn release_hold_record_distrusted(&self, reason: &str) {
        self.release_hold_records_distrusted
            .with_label_values(&[reason])
            .inc();
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

    /// Publishes usage and capacity of every cluster CIDR, and what every pool can still hand out.
    pub fn publish(&self, stats: &[PoolStats]) {
        self.space.publish(&PoolSpace::of(stats));
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

/// Per pool and family: the largest block it can still hand out, its free blocks per size, and the CIDRs
/// in release hold. Labels are netcm's own (`pool`, `family`, `prefix_length`), snake_case as Prometheus
/// asks; `pool` is the value of node-ipam-controller's `clusterCIDRName`.
#[derive(Clone)]
struct SpaceGauges {
    largest: IntGaugeVec,
    free: IntGaugeVec,
    release_hold: IntGaugeVec,
    /// (pool, family) and (pool, family, prefix length) shown, so a dropped pool's series go with it.
    shown: Arc<Mutex<Shown>>,
}

/// Label values of the space gauges' series: (pool, family), and (pool, family, prefix length).
type Shown = (HashSet<[String; 2]>, HashSet<[String; 3]>);

impl SpaceGauges {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let largest = IntGaugeVec::new(
            Opts::new(
                "netcm_pool_largest_free_block_prefix_length",
                "Prefix length of the largest block a pool can still hand out in a family (24 for a /24); 0 when it can hand out none (full, or draining).",
            ),
            &["pool", "family"],
        )?;
        let free = IntGaugeVec::new(
            Opts::new(
                "netcm_pool_free_blocks",
                "Blocks of one size (prefix_length) a pool can still hand out in a family; one size per pool while pools hand out fixed-size node CIDRs.",
            ),
            &["pool", "family", "prefix_length"],
        )?;
        let release_hold = IntGaugeVec::new(
            Opts::new(
                "netcm_pool_release_hold_cidrs",
                "CIDRs of a pool released by deleted Nodes and kept out of allocation by --cidr-release-hold.",
            ),
            &["pool", "family"],
        )?;
        for g in [&largest, &free, &release_hold] {
            registry.register(Box::new(g.clone()))?;
        }
        Ok(Self {
            largest,
            free,
            release_hold,
            shown: Arc::new(Mutex::new((HashSet::new(), HashSet::new()))),
        })
    }

    fn publish(&self, space: &[PoolSpace]) {
        let mut pairs = HashSet::new();
        let mut sizes = HashSet::new();
        for s in space {
            let pair = [s.pool.clone(), s.family.to_string()];
            let pair_refs = [pair[0].as_str(), pair[1].as_str()];
            self.largest
                .with_label_values(&pair_refs)
                .set(s.largest().map_or(0, i64::from));
            self.release_hold
                .with_label_values(&pair_refs)
                .set(i64::try_from(s.release_hold).unwrap_or(i64::MAX));
            for &(prefix, count) in &s.free_blocks {
                let size = [pair[0].clone(), pair[1].clone(), prefix.to_string()];
                self.free
                    .with_label_values(&[&size[0], &size[1], &size[2]])
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
                sizes.insert(size);
            }
            pairs.insert(pair);
        }
        let mut shown = self.shown.lock();
        for [pool, family] in shown.0.difference(&pairs) {
            let _ = self.largest.remove_label_values(&[pool, family]);
            let _ = self.release_hold.remove_label_values(&[pool, family]);
        }
        for [pool, family, prefix] in shown.1.difference(&sizes) {
            let _ = self.free.remove_label_values(&[pool, family, prefix]);
        }
        *shown = (pairs, sizes);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use netcm_ipam::Family;
    use prometheus::Encoder;

    fn scrape(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn stat(pool: &str, cidr: &str, prefix: u8, free: u64) -> PoolStats {
        PoolStats {
            pool: pool.into(),
            cluster_cidr: cidr.into(),
            family: Family::V4,
            allocated: 0,
            max: free,
            usage: 0.0,
            free_blocks: vec![(prefix, free)],
            release_hold: 0,
        }
    }

    #[test]
    fn each_pool_shows_its_largest_free_block_and_free_blocks_per_size() {
        let registry = Registry::new();
        let m = AllocatorMetrics::register(&registry).unwrap();
        m.publish(&[
            stat(DEFAULT_POOL, "10.244.0.0/16", 24, 250),
            stat("gpu", "10.100.0.0/24", 26, 0),
        ]);
        let text = scrape(&registry);
        for line in [
            "netcm_pool_largest_free_block_prefix_length{family=\"IPv4\",pool=\"default-cluster-cidr\"} 24",
            "netcm_pool_largest_free_block_prefix_length{family=\"IPv4\",pool=\"gpu\"} 0",
            "netcm_pool_free_blocks{family=\"IPv4\",pool=\"default-cluster-cidr\",prefix_length=\"24\"} 250",
            "netcm_pool_free_blocks{family=\"IPv4\",pool=\"gpu\",prefix_length=\"26\"} 0",
            "netcm_pool_release_hold_cidrs{family=\"IPv4\",pool=\"gpu\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_dropped_pools_space_series_go_with_it() {
        let registry = Registry::new();
        let m = AllocatorMetrics::register(&registry).unwrap();
        m.publish(&[
            stat(DEFAULT_POOL, "10.244.0.0/16", 24, 250),
            stat("gpu", "10.100.0.0/24", 26, 4),
        ]);
        m.publish(&[stat(DEFAULT_POOL, "10.244.0.0/16", 24, 249)]);
        let text = scrape(&registry);
        assert!(!text.contains("pool=\"gpu\""), "{text}");
        assert!(text.contains("prefix_length=\"24\"} 249"), "{text}");
    }
}

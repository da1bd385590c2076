//! Process-wide metric families that belong to no single component: `netcm_build_info`,
//! `running_managed_controllers`, the Node cache's size and catch-ups, and the process collector.

use netcm_node::CachedNode;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::informer::SharedInformer;

/// The version baked into the binary.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Families the manager itself updates.
#[derive(Clone)]
pub struct ManagerMetrics {
    /// `running_managed_controllers{name,manager="netcm"}`.
    pub running_controllers: IntGaugeVec,
    /// `netcm_node_cache_catch_ups_total{result}`: how a leader's warm Node cache was shown fresh.
    pub catch_ups: IntCounterVec,
}

impl ManagerMetrics {
    /// Registers the families (and process metrics) in `registry`.
    pub fn register(
        registry: &Registry,
        nodes: &SharedInformer<CachedNode>,
    ) -> Result<Self, prometheus::Error> {
        let build_info = IntGaugeVec::new(
            Opts::new(
                "netcm_build_info",
                "A metric with a constant '1' value labeled by the netcm version.",
            ),
            &["version"],
        )?;
        build_info.with_label_values(&[VERSION]).set(1);
        registry.register(Box::new(build_info))?;
        let running_controllers = IntGaugeVec::new(
            Opts::new(
                "running_managed_controllers",
                "Indicates where instances of a controller are currently running",
            ),
            &["name", "manager"],
        )?;
        registry.register(Box::new(running_controllers.clone()))?;
        let catch_ups = IntCounterVec::new(
            Opts::new(
                "netcm_node_cache_catch_ups_total",
                "Times a new leader's warm Node cache was shown to hold every earlier write, by result: proven (it held this leader's own write on a Node), relisted (no proof: every Node listed again).",
            ),
            &["result"],
        )?;
        for result in ["proven", "relisted"] {
            catch_ups.with_label_values(&[result]);
        }
        registry.register(Box::new(catch_ups.clone()))?;
        registry.register(Box::new(CacheSize::new(nodes.clone())?))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            running_controllers,
            catch_ups,
        })
    }
}

/// `netcm_node_cache_nodes`: the Nodes the shared informer caches, read at each scrape (a warm standby's
/// too).
struct CacheSize {
    nodes: SharedInformer<CachedNode>,
    gauge: IntGauge,
}

impl CacheSize {
    fn new(nodes: SharedInformer<CachedNode>) -> Result<Self, prometheus::Error> {
        let gauge = IntGauge::new(
            "netcm_node_cache_nodes",
            "Nodes in the shared Node informer's cache; a warm standby caches them before it leads.",
        )?;
        Ok(Self { nodes, gauge })
    }
}

impl Collector for CacheSize {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.gauge.set(self.nodes.len() as i64);
        self.gauge.collect()
    }
}

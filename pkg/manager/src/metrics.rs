//! Process-wide metric families that belong to no single component: `netcm_build_info`,
//! `running_managed_controllers`, and the process collector.

use prometheus::{IntGaugeVec, Opts, Registry};

/// The version baked into the binary.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Families the manager itself updates.
#[derive(Clone)]
pub struct ManagerMetrics {
    /// `running_managed_controllers{name,manager="netcm"}`.
    pub running_controllers: IntGaugeVec,
}

impl ManagerMetrics {
    /// Registers the families (and process metrics) in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
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
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            running_controllers,
        })
    }
}

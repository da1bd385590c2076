//! The route controller's metrics: the cloud route controller's `route_controller_route_sync_total`, and
//! netcm's own gauges and error counter. The netlink backend sets the nexthop gauges ([`NexthopGauges`]),
//! so a gateway whose routes fell back to plain gateway routes shows as routes not via a nexthop.
//!
//! `route_controller_route_sync_total` is exactly kube 1.36's (k8s.io/cloud-provider v0.36.3,
//! controllers/route/metrics.go): a counter without labels, one per reconcile pass, counted when the pass
//! starts. The `outcome` and `trigger` labels arrive only in v0.37.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::backend::Operation;

/// The metric families the route controller updates.
#[derive(Clone)]
pub struct RouteMetrics {
    /// Full reconciles of the routing table, each counted when it starts (upstream's name and rule).
    pub sync_total: IntCounter,
    /// netcm's routes in the table, as of the last change or listing.
    pub programmed: IntGauge,
    /// Nodes with a pod CIDR whose route could not be created.
    pub failing_nodes: IntGauge,
    /// Those of them with a pod CIDR that overlaps the pod CIDR of a Node created earlier.
    pub conflicting_nodes: IntGauge,
    /// What the netlink backend counts of nexthops at each listing.
    pub nexthops: NexthopGauges,
    errors: IntCounterVec,
}

/// netcm's routes naming a nexthop object and the nexthops themselves, as of the last listing.
#[derive(Clone)]
pub struct NexthopGauges {
    /// netcm's routes that name a nexthop object; the rest of `netcm_routes_programmed` name a gateway.
    pub routes_via_nexthop: IntGauge,
    /// netcm's nexthop objects, one per gateway in use.
    pub objects: IntGauge,
}

impl RouteMetrics {
    /// Registers the families.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let sync_total = IntCounter::with_opts(Opts::new(
            "route_controller_route_sync_total",
            "A metric counting the amount of times routes have been synced with the cloud provider.",
        ))?;
        let programmed = IntGauge::with_opts(Opts::new(
            "netcm_routes_programmed",
            "Routes netcm has programmed in its routing table (its table and protocol).",
        ))?;
        let failing_nodes = IntGauge::with_opts(Opts::new(
            "netcm_route_failing_nodes",
            "Nodes with a pod CIDR that has no route (NoRouteCreated).",
        ))?;
        let conflicting_nodes = IntGauge::with_opts(Opts::new(
            "netcm_route_conflicting_nodes",
            "Nodes with a pod CIDR that overlaps the pod CIDR of a Node the API server created earlier: they get no route to it (RouteCIDRConflict).",
        ))?;
        let routes_via_nexthop = IntGauge::with_opts(Opts::new(
            "netcm_routes_via_nexthop",
            "netcm's routes that name a nexthop object, at the last listing; the others name their gateway (a kernel without nexthops, or a gateway it refuses on one).",
        ))?;
        let nexthop_objects = IntGauge::with_opts(Opts::new(
            "netcm_route_nexthops",
            "Nexthop objects netcm holds in the kernel, one per gateway in use, at the last listing.",
        ))?;
        let errors = IntCounterVec::new(
            Opts::new(
                "netcm_route_errors_total",
                "Route backend calls that failed, by operation (list, create, replace, delete).",
            ),
            &["operation"],
        )?;
        registry.register(Box::new(sync_total.clone()))?;
        registry.register(Box::new(programmed.clone()))?;
        registry.register(Box::new(failing_nodes.clone()))?;
        registry.register(Box::new(conflicting_nodes.clone()))?;
        registry.register(Box::new(routes_via_nexthop.clone()))?;
        registry.register(Box::new(nexthop_objects.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        // Every label exists from the start, so dashboards and alerts see 0 rather than nothing.
        for op in [
            Operation::List,
            Operation::Create,
            Operation::Replace,
            Operation::Delete,
        ] {
            errors.with_label_values(&[op.as_str()]);
        }
        Ok(Self {
            sync_total,
            programmed,
            failing_nodes,
            conflicting_nodes,
            nexthops: NexthopGauges {
                routes_via_nexthop,
                objects: nexthop_objects,
            },
            errors,
        })
    }

    /// Counts one failed backend call.
    pub fn error(&self, operation: Operation) {
        self.errors.with_label_values(&[operation.as_str()]).inc();
    }
}

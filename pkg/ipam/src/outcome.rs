//! What [`crate::Pools`] reports back: hold outcomes, allocations, statistics.

use std::fmt;

use ipnet::IpNet;

use crate::addr::Family;

/// How a [`crate::Pools::record_and_check`] call changed the node's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordChange {
    /// The node already held exactly these CIDRs; nothing changed.
    Unchanged,
    /// The node held nothing before and now holds these CIDRs.
    New,
    /// The node held other CIDRs, which were released (blocks another
    /// holder still holds stay in use).
    Replaced {
        /// What the node held before.
        previous: Vec<IpNet>,
    },
}

/// Something wrong with a CIDR a node holds, found by [`crate::Pools::record_and_check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CidrFinding {
    /// The CIDR overlaps one held by another node. Both stay recorded, so
    /// nothing overlapping either is handed out.
    Conflict {
        /// The node's CIDR.
        cidr: IpNet,
        /// The other node.
        other_node: String,
        /// The other node's overlapping CIDR.
        other_cidr: IpNet,
    },
    /// The CIDR is not inside any cluster CIDR (it may still overlap one,
    /// whose overlapping blocks are then kept in use). Harmless to the pools.
    OutOfRange {
        /// The node's CIDR.
        cidr: IpNet,
    },
    /// The CIDR overlaps a service range.
    ServiceRangeOverlap {
        /// The node's CIDR.
        cidr: IpNet,
        /// The service range it overlaps.
        service_range: IpNet,
    },
}

impl CidrFinding {
    /// The node's CIDR the finding is about.
    pub fn cidr(&self) -> IpNet {
        match self {
            CidrFinding::Conflict { cidr, .. }
            | CidrFinding::OutOfRange { cidr }
            | CidrFinding::ServiceRangeOverlap { cidr, .. } => *cidr,
        }
    }

    /// A short machine-friendly name (for event reasons and metric labels).
    pub fn kind(&self) -> &'static str {
        match self {
            CidrFinding::Conflict { .. } => "conflict",
            CidrFinding::OutOfRange { .. } => "out_of_range",
            CidrFinding::ServiceRangeOverlap { .. } => "service_range_overlap",
        }
    }
}

impl fmt::Display for CidrFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrFinding::Conflict {
                cidr,
                other_node,
                other_cidr,
            } => write!(
                f,
                "pod CIDR {cidr} overlaps {other_cidr} held by node {other_node}"
            ),
            CidrFinding::OutOfRange { cidr } => {
                write!(f, "pod CIDR {cidr} is not inside any cluster CIDR")
            }
            CidrFinding::ServiceRangeOverlap {
                cidr,
                service_range,
            } => write!(f, "pod CIDR {cidr} overlaps service range {service_range}"),
        }
    }
}

/// The result of [`crate::Pools::record_and_check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOutcome {
    /// How the node's record changed.
    pub change: RecordChange,
    /// Problems with the node's CIDRs as they stand now (reported again on
    /// every call while they last, even when `change` is `Unchanged`).
    pub findings: Vec<CidrFinding>,
}

impl RecordOutcome {
    /// Whether no problem was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Allocation effort in one cluster CIDR, for the `allocation_tries_per_request` histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTries {
    /// The cluster CIDR the node CIDR came from.
    pub cluster: IpNet,
    /// The node CIDR handed out.
    pub cidr: IpNet,
    /// Occupied candidates skipped (see [`crate::Allocation::tries`]).
    pub tries: u64,
}

/// The result of [`crate::Pools::allocate_detailed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocation {
    /// The node's CIDRs, primary family first.
    pub cidrs: Vec<IpNet>,
    /// One entry per CIDR carved in this call; empty when the node already
    /// held CIDRs and those were returned unchanged.
    pub fresh: Vec<PoolTries>,
    /// The pool the CIDRs came from (empty if none contains them).
    pub pool: String,
    /// Set when the CIDRs were in release hold: the Node's own, back, or another's, early.
    pub release_hold: Option<crate::ReleaseHoldUse>,
}

/// Usage of one cluster CIDR, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStats {
    /// The pool's name (node-ipam-controller's `clusterCIDRName` label).
    pub pool: String,
    /// The cluster CIDR as text (KCM's `clusterCIDR` metric label).
    pub cluster_cidr: String,
    /// Its address family.
    pub family: Family,
    /// Node CIDRs in use (in a sized set: blocks of its smallest size, so usage stays a share of
    /// addresses).
    pub allocated: u64,
    /// Node CIDRs that fit (in a sized set: of its smallest size).
    pub max: u64,
    /// `allocated / max`.
    pub usage: f64,
    /// Blocks it can still hand out, as (prefix length, count), largest block first: one size (the
    /// node mask) for a fixed-size pool, every size between its bounds for a sized one, none counted (0) while its pool is not active.
    pub free_blocks: Vec<(u8, u64)>,
    /// Node CIDRs in release hold (`--cidr-release-hold`): released by deleted Nodes, not free yet.
    pub release_hold: u64,
}

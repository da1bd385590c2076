//! Pools as ClusterCIDR objects describe them (`networking.x-k8s.io/v1`, node-ipam-controller's API),
//! without Kubernetes types: what a pool asks for ([`PoolSpec`]), whether netcm allocates from it
//! ([`PoolState`], [`Refusal`]) and what it reports ([`PoolReport`]).

use std::fmt;

use ipnet::IpNet;

use crate::addr::Family;
use crate::cidr_set::max_node_bits;
use crate::selector::NodeSelector;
use crate::sizing::NodeSizing;

/// The flag pool's name: node-ipam-controller's name for the ClusterCIDR it builds from the flags.
pub const DEFAULT_POOL: &str = "default-cluster-cidr";

/// The smallest `perNodeHostBits` a ClusterCIDR may ask for (16 addresses per Node).
pub const MIN_PER_NODE_HOST_BITS: i64 = 4;

/// A ClusterCIDR's spec, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// `nodeSelector` (unset: [`NodeSelector::Fallback`]).
    pub selector: NodeSelector,
    /// `perNodeHostBits`.
    pub per_node_host_bits: i64,
    /// `ipv4`, if set.
    pub ipv4: Option<IpNet>,
    /// `ipv6`, if set.
    pub ipv6: Option<IpNet>,
    /// netcm's per-Node size from capacity for the `ipv4` range ([`SIZE_FROM_PODS_ANNOTATION`]); `None`:
    /// `perNodeHostBits` for every Node, as node-ipam-controller.
    pub sizing: Option<HostBitsRange>,
}

/// The annotation that sizes a ClusterCIDR's IPv4 node CIDRs from each Node's pod capacity, as host bits
/// `"<min>-<max>"` (`"5-8"`: /27 to /24), `perNodeHostBits` lying between them being the size of a Node
/// without capacity. An annotation, not a field: the spec is node-ipam-controller's schema, which would
/// prune an unknown field, and a controller that does not know it still reads a valid fixed-size pool.
pub const SIZE_FROM_PODS_ANNOTATION: &str = "ipam.netcm.io/node-cidr-size-from-pods";

/// [`SIZE_FROM_PODS_ANNOTATION`]'s value: the host bits of the smallest and the largest node CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBitsRange {
    /// Host bits of the smallest node CIDR.
    pub min: i64,
    /// Host bits of the largest node CIDR.
    pub max: i64,
}

impl std::str::FromStr for HostBitsRange {
    type Err = String;

    /// Parses `"<min>-<max>"` (spaces allowed around either number).
    fn from_str(s: &str) -> Result<HostBitsRange, String> {
        let bad = || format!("{s:?} is not <min>-<max> host bits, like \"5-8\"");
        let (min, max) = s.split_once('-').ok_or_else(bad)?;
        let num = |v: &str| v.trim().parse::<i64>().map_err(|_| bad());
        Ok(HostBitsRange {
            min: num(min)?,
            max: num(max)?,
        })
    }
}

/// A pool range and its node mask, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolRange {
    pub family: Family,
    pub cidr: IpNet,
    pub node_mask: u8,
    /// Per-Node size from capacity (IPv4 only); `node_mask` is then its default.
    pub sizing: Option<NodeSizing>,
}

impl PoolSpec {
    /// The ranges to allocate from (IPv4 first, as node-ipam-controller orders a Node's CIDRs) with
    /// their node masks, or why the spec cannot be used.
    pub(crate) fn ranges(&self) -> Result<Vec<PoolRange>, Refusal> {
        let invalid = |why: String| Refusal::Invalid(why);
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(invalid(
                "one or both of ipv4 and ipv6 must be specified".into(),
            ));
        }
        if self.per_node_host_bits < MIN_PER_NODE_HOST_BITS {
            return Err(invalid(format!(
                "perNodeHostBits {} must be at least {MIN_PER_NODE_HOST_BITS}",
                self.per_node_host_bits
            )));
        }
        let mut out = Vec::new();
        for (want, cidr) in [(Family::V4, self.ipv4), (Family::V6, self.ipv6)] {
            let Some(cidr) = cidr else { continue };
            let cidr = cidr.trunc();
            if Family::of(&cidr) != want {
                return Err(invalid(format!("{cidr} is not an {want} CIDR")));
            }
            let room = i64::from(want.bits() - cidr.prefix_len());
            if self.per_node_host_bits > room {
                return Err(invalid(format!(
                    "perNodeHostBits {} is more than {cidr} has ({room})",
                    self.per_node_host_bits
                )));
            }
            // Cannot truncate: 0 <= host bits <= room <= 128.
            let node_mask = want.bits() - self.per_node_host_bits as u8;
            let max = max_node_bits(want);
            if node_mask - cidr.prefix_len() > max {
                return Err(invalid(format!(
                    "{cidr} with perNodeHostBits {} holds more than 2^{max} node CIDRs, more than netcm tracks",
                    self.per_node_host_bits
                )));
            }
            let sizing = match (want, self.sizing) {
                (Family::V4, Some(range)) => Some(self.sizing_of(range, cidr)?),
                _ => None,
            };
            out.push(PoolRange {
                family: want,
                cidr,
                node_mask,
                sizing,
            });
        }
        Ok(out)
    }

    /// The [`NodeSizing`] `range` gives the IPv4 range `cidr`, checked like `perNodeHostBits`.
    fn sizing_of(&self, range: HostBitsRange, cidr: IpNet) -> Result<NodeSizing, Refusal> {
        let invalid = |why: String| Refusal::Invalid(format!("{SIZE_FROM_PODS_ANNOTATION}: {why}"));
        let HostBitsRange { min, max } = range;
        if min < MIN_PER_NODE_HOST_BITS {
            return Err(invalid(format!(
                "{min} host bits is less than {MIN_PER_NODE_HOST_BITS}"
            )));
        }
        if !(min..=max).contains(&self.per_node_host_bits) {
            return Err(invalid(format!(
                "perNodeHostBits {} must lie between {min} and {max}",
                self.per_node_host_bits
            )));
        }
        let room = i64::from(Family::V4.bits() - cidr.prefix_len());
        if max > room {
            return Err(invalid(format!(
                "{max} host bits is more than {cidr} has ({room})"
            )));
        }
        // Cannot truncate: MIN_PER_NODE_HOST_BITS <= min <= max <= room <= 32.
        let mask = |bits: i64| Family::V4.bits() - bits as u8;
        let limit = max_node_bits(Family::V4);
        if mask(min) - cidr.prefix_len() > limit {
            return Err(invalid(format!(
                "{cidr} holds more than 2^{limit} node CIDRs of {min} host bits, more than netcm tracks"
            )));
        }
        NodeSizing::new(
            Family::V4,
            mask(max),
            mask(min),
            mask(self.per_node_host_bits),
        )
        .map_err(|e| invalid(e.to_string()))
    }
}

/// A ClusterCIDR as the allocator sees it, for [`crate::Pools::sync_objects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectPool {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`: an object re-created under its name is a new pool.
    pub uid: String,
    /// The spec, or why it could not be read (an unknown operator, a CIDR that does not parse).
    pub spec: Result<PoolSpec, String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The spec was changed after creation (`metadata.generation` > 1): node-ipam-controller's rule,
    /// so every leader agrees without having seen the original.
    pub modified: bool,
}

/// Why netcm does not allocate from a ClusterCIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The spec is unusable.
    Invalid(String),
    /// The spec changed after creation; ClusterCIDRs are immutable.
    Modified,
    /// A range shares addresses with another pool's range without being the same range.
    PoolOverlap {
        /// This pool's range.
        range: IpNet,
        /// The other pool.
        pool: String,
        /// The other pool's range.
        other: IpNet,
    },
    /// A range overlaps a service range.
    ServiceRangeOverlap {
        /// This pool's range.
        range: IpNet,
        /// The service range.
        service_range: IpNet,
    },
    /// A Node holds a CIDR that covers more than this range, outside every pool.
    NodeCidrOverlap {
        /// This pool's range.
        range: IpNet,
        /// The Node's CIDR.
        cidr: IpNet,
        /// The ledger owner holding it (a Node UID or a claim reservation).
        owner: String,
    },
}

impl Refusal {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Invalid(_) => "InvalidClusterCIDR",
            Refusal::Modified => "ClusterCIDRModified",
            Refusal::PoolOverlap { .. }
            | Refusal::ServiceRangeOverlap { .. }
            | Refusal::NodeCidrOverlap { .. } => "ClusterCIDROverlap",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Invalid(why) => write!(f, "invalid ClusterCIDR: {why}"),
            Refusal::Modified => f.write_str(
                "the spec was changed after creation; ClusterCIDRs are immutable: delete it and create a new one",
            ),
            Refusal::PoolOverlap { range, pool, other } => write!(
                f,
                "{range} overlaps {other} of pool {pool}; pools must use the same range or disjoint ones"
            ),
            Refusal::ServiceRangeOverlap {
                range,
                service_range,
            } => write!(f, "{range} overlaps the service range {service_range}"),
            Refusal::NodeCidrOverlap { range, cidr, .. } => write!(
                f,
                "{range} lies inside pod CIDR {cidr} that a Node holds outside every pool"
            ),
        }
    }
}

/// Whether a pool gives out CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolState {
    /// Allocates.
    Active,
    /// Being deleted: gives out nothing new; its finalizer stays until no Node holds a CIDR from it.
    Draining,
    /// Never allocates, for this reason (re-checked whenever the pools change).
    Refused(Refusal),
}

impl PoolState {
    /// A one-word name for status and metrics.
    pub fn phase(&self) -> &'static str {
        match self {
            PoolState::Active => "Active",
            PoolState::Draining => "Draining",
            PoolState::Refused(_) => "Refused",
        }
    }
}

/// One pool as [`crate::Pools::reports`] describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolReport {
    /// The pool's name ([`DEFAULT_POOL`] for the flags').
    pub name: String,
    /// Whether it comes from a ClusterCIDR object.
    pub is_object: bool,
    /// Whether it allocates.
    pub state: PoolState,
    /// Its ranges (for a refused pool, those its spec asked for).
    pub ranges: Vec<IpNet>,
    /// Node mask per range, in the order of `ranges` (empty for a refused pool).
    pub node_masks: Vec<u8>,
    /// The selector, shortened for people.
    pub selector: String,
    /// Owners (Nodes, pending allocations, claim reservations) holding a CIDR from it; counted for
    /// ClusterCIDR pools only (0 for the flag pool, whose count no status shows).
    pub holders: usize,
    /// How many Nodes it can serve in all.
    pub capacity: u64,
}

/// What [`crate::Pools::sync_objects`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Pools that started allocating (new, or no longer refused): waiting Nodes should try again.
    pub activated: Vec<String>,
    /// Pools that were dropped (their objects are gone).
    pub removed: Vec<String>,
}

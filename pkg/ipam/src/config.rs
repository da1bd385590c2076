//! [`AllocatorConfig`]: kube-controller-manager's node IPAM flag rules.
//!
//! Follows `cmd/kube-controller-manager/app/core.go` (`processCIDRs`,
//! `setNodeCIDRMaskSizes`) and the node IPAM controller's checks, with KCM's
//! wording, plus one netcm extension: a family may have several cluster CIDRs,
//! tried in the order given, so a full pool can be grown by appending one.

use std::str::FromStr;

use ipnet::IpNet;

use crate::addr::{Family, Span};
use crate::cidr_set::max_node_bits;
use crate::sizing::NodeSizing;

mod sizing;
pub use sizing::{
    SizingFlagError, SizingFlags, DEFAULT_MAX_MASK_V4, FLAG_MAX_MASK_V4, FLAG_MIN_MASK_V4,
    FLAG_SIZE_FROM_PODS,
};

/// Default node mask for IPv4 (`--node-cidr-mask-size-ipv4`).
pub const DEFAULT_NODE_MASK_V4: u8 = 24;
/// Default node mask for IPv6 (`--node-cidr-mask-size-ipv6`).
pub const DEFAULT_NODE_MASK_V6: u8 = 64;

const FLAG_MASK: &str = "--node-cidr-mask-size";
const FLAG_MASK_V4: &str = "--node-cidr-mask-size-ipv4";
const FLAG_MASK_V6: &str = "--node-cidr-mask-size-ipv6";

/// The raw allocator flags, as given on the command line.
///
/// A mask size of `Some(0)` means "not set", as in kube-controller-manager
/// whose flags default to 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatorFlags {
    /// `--cluster-cidr`: comma-separated cluster CIDRs.
    pub cluster_cidr: String,
    /// `--node-cidr-mask-size` (single-stack only).
    pub node_cidr_mask_size: Option<u8>,
    /// `--node-cidr-mask-size-ipv4`.
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// `--node-cidr-mask-size-ipv6`.
    pub node_cidr_mask_size_ipv6: Option<u8>,
    /// `--service-cluster-ip-range`: comma-separated service ranges, may be empty.
    pub service_cluster_ip_range: String,
}

/// The cluster CIDRs of one address family and their node mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPool {
    /// The address family.
    pub family: Family,
    /// Prefix length of every node CIDR of this family.
    pub node_mask: u8,
    /// Cluster CIDRs (normalized), in the order they are tried.
    pub cluster_cidrs: Vec<IpNet>,
    /// Per-Node size from capacity ([`AllocatorConfig::with_sizing`]; IPv4 only): `node_mask` is then
    /// the size of a Node without capacity. `None`, kube-controller-manager's fixed size, by default.
    pub sizing: Option<NodeSizing>,
}

/// Validated allocator configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// One entry per family, primary (first listed in `--cluster-cidr`) first.
    pub families: Vec<FamilyPool>,
    /// Service ranges (normalized), never handed out to nodes.
    pub service_ranges: Vec<IpNet>,
}

/// A flag combination kube-controller-manager (or netcm) refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// netcm's per-Node sizing flags are inconsistent ([`AllocatorConfig::with_sizing`]).
    #[error("invalid sizing flags: {0}")]
    Sizing(SizingFlagError),

    /// `--cluster-cidr` is empty.
    #[error("Must specify --cluster-cidr if --allocate-node-cidrs is set")]
    MissingClusterCidr,

    /// A `--cluster-cidr` entry is not a CIDR.
    #[error("invalid --cluster-cidr entry {value:?}: {reason}")]
    InvalidClusterCidr {
        /// The entry as given.
        value: String,
        /// Why it did not parse.
        #[source]
        reason: ipnet::AddrParseError,
    },

    /// Two `--cluster-cidr` entries share addresses.
    #[error("invalid --cluster-cidr: entries {first} and {second} overlap; cluster CIDRs must be disjoint")]
    OverlappingClusterCidrs {
        /// The earlier entry.
        first: IpNet,
        /// The later entry.
        second: IpNet,
    },

    /// `--node-cidr-mask-size` with both families present.
    #[error("usage of --node-cidr-mask-size is not allowed with dual-stack clusters")]
    MaskSizeWithDualStack,

    /// `--node-cidr-mask-size` together with a per-family mask flag.
    #[error(
        "usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if \
         --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily \
         specific flags"
    )]
    MaskSizeWithFamilyMaskSize,

    /// `--node-cidr-mask-size-ipv4` on an IPv6-only cluster.
    #[error("usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster")]
    Ipv4MaskOnSingleStackIpv6,

    /// `--node-cidr-mask-size-ipv6` on an IPv4-only cluster.
    #[error("usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster")]
    Ipv6MaskOnSingleStackIpv4,

    /// A node mask longer than an address of its family.
    #[error("invalid {flag}={node_mask}: an {family} node CIDR mask size must be at most {}", .family.bits())]
    NodeMaskTooLong {
        /// The flag that set the mask.
        flag: &'static str,
        /// The mask size.
        node_mask: u8,
        /// The family it applies to.
        family: Family,
    },

    /// A cluster CIDR whose prefix is longer than the family's node mask.
    #[error(
        "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal \
         to --node-cidr-mask-size configured for CIDR family ({cluster} is longer than \
         {flag}={node_mask})"
    )]
    ClusterPrefixLongerThanNodeMask {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The flag that set the mask (or would have, for a default).
        flag: &'static str,
        /// The node mask of the family.
        node_mask: u8,
    },

    /// A cluster CIDR holding more node CIDRs than netcm tracks.
    #[error(
        "New CIDR set failed; the node CIDR size is too big: {flag}={node_mask} is more than \
         {max_diff} bits longer than --cluster-cidr {cluster}"
    )]
    NodeCidrTooBig {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The flag that set the mask (or would have, for a default).
        flag: &'static str,
        /// The node mask of the family.
        node_mask: u8,
        /// Largest allowed difference (16 for IPv6, 24 for IPv4).
        max_diff: u8,
    },

    /// More than two service ranges.
    #[error("--service-cluster-ip-range can not contain more than two entries (got {count})")]
    TooManyServiceRanges {
        /// Number of entries given.
        count: usize,
    },

    /// A `--service-cluster-ip-range` entry is not a CIDR.
    #[error("invalid --service-cluster-ip-range entry {value:?}: {reason}")]
    InvalidServiceRange {
        /// The entry as given.
        value: String,
        /// Why it did not parse.
        #[source]
        reason: ipnet::AddrParseError,
    },

    /// Two service ranges of the same family.
    #[error(
        "invalid --service-cluster-ip-range: serviceCIDR and secondaryServiceCIDR are not \
         dualstack (from different IPfamiles): {first}, {second}"
    )]
    ServiceRangesNotDualStack {
        /// The primary service range.
        first: IpNet,
        /// The secondary service range.
        second: IpNet,
    },
}

impl AllocatorConfig {
    /// Validates the flags and builds the configuration.
    pub fn from_flags(flags: &AllocatorFlags) -> Result<AllocatorConfig, ConfigError> {
        let clusters = parse_cluster_cidrs(&flags.cluster_cidr)?;
        let mut order: Vec<Family> = Vec::with_capacity(2);
        for c in &clusters {
            let f = Family::of(c);
            if !order.contains(&f) {
                order.push(f);
            }
        }
        let masks = node_masks(flags, &order)?;
        let families = order
            .iter()
            .zip(masks)
            .map(|(&family, (node_mask, flag))| {
                let cluster_cidrs: Vec<IpNet> = clusters
                    .iter()
                    .copied()
                    .filter(|c| Family::of(c) == family)
                    .collect();
                check_mask(family, node_mask, flag, &cluster_cidrs)?;
                Ok(FamilyPool {
                    family,
                    node_mask,
                    cluster_cidrs,
                    sizing: None,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let service_ranges = parse_service_ranges(&flags.service_cluster_ip_range)?;
        Ok(AllocatorConfig {
            families,
            service_ranges,
        })
    }

    /// The primary family (that of the first `--cluster-cidr` entry).
    pub fn primary_family(&self) -> Option<Family> {
        self.families.first().map(|f| f.family)
    }

    /// Whether both IPv4 and IPv6 cluster CIDRs are configured.
    pub fn is_dual_stack(&self) -> bool {
        self.families.len() > 1
    }
}

fn parse_net(value: &str) -> Result<IpNet, ipnet::AddrParseError> {
    IpNet::from_str(value).map(|n| n.trunc())
}

/// Parses `--cluster-cidr`, refusing empty, malformed and overlapping entries.
fn parse_cluster_cidrs(list: &str) -> Result<Vec<IpNet>, ConfigError> {
    let list = list.trim();
    if list.is_empty() {
        return Err(ConfigError::MissingClusterCidr);
    }
    let mut out: Vec<IpNet> = Vec::new();
    for raw in list.split(',') {
        let value = raw.trim();
        let net = parse_net(value).map_err(|reason| ConfigError::InvalidClusterCidr {
            value: value.to_string(),
            reason,
        })?;
        let span = Span::of(&net);
        if let Some(first) = out.iter().find(|o| Span::of(o).overlaps(&span)) {
            return Err(ConfigError::OverlappingClusterCidrs {
                first: *first,
                second: net,
            });
        }
        out.push(net);
    }
    Ok(out)
}

/// Node mask and the flag that (would have) set it, per family in `order`.
/// Mirrors KCM's `setNodeCIDRMaskSizes`; dual-stack means both families.
fn node_masks(
    flags: &AllocatorFlags,
    order: &[Family],
) -> Result<Vec<(u8, &'static str)>, ConfigError> {
    let set = |v: Option<u8>| v.filter(|&m| m != 0);
    let (mask, v4, v6) = (
        set(flags.node_cidr_mask_size),
        set(flags.node_cidr_mask_size_ipv4),
        set(flags.node_cidr_mask_size_ipv6),
    );
    let dual = order.len() > 1;
    let per_family = |family: Family| match family {
        Family::V4 => (v4.unwrap_or(DEFAULT_NODE_MASK_V4), FLAG_MASK_V4),
        Family::V6 => (v6.unwrap_or(DEFAULT_NODE_MASK_V6), FLAG_MASK_V6),
    };
    if dual {
        if mask.is_some() {
            return Err(ConfigError::MaskSizeWithDualStack);
        }
        return Ok(order.iter().map(|&f| per_family(f)).collect());
    }
    if let Some(mask) = mask {
        if v4.is_some() || v6.is_some() {
            return Err(ConfigError::MaskSizeWithFamilyMaskSize);
        }
        return Ok(order.iter().map(|_| (mask, FLAG_MASK)).collect());
    }
    let single_v6 = order.first() == Some(&Family::V6);
    if v4.is_some() && single_v6 {
        return Err(ConfigError::Ipv4MaskOnSingleStackIpv6);
    }
    if v6.is_some() && !single_v6 {
        return Err(ConfigError::Ipv6MaskOnSingleStackIpv4);
    }
    Ok(order.iter().map(|&f| per_family(f)).collect())
}

/// Checks a family's node mask against the address size and each cluster CIDR.
fn check_mask(
    family: Family,
    node_mask: u8,
    flag: &'static str,
    clusters: &[IpNet],
) -> Result<(), ConfigError> {
    if node_mask > family.bits() {
        return Err(ConfigError::NodeMaskTooLong {
            flag,
            node_mask,
            family,
        });
    }
    for &cluster in clusters {
        if cluster.prefix_len() > node_mask {
            return Err(ConfigError::ClusterPrefixLongerThanNodeMask {
                cluster,
                flag,
                node_mask,
            });
        }
        let max_diff = max_node_bits(family);
        if node_mask - cluster.prefix_len() > max_diff {
            return Err(ConfigError::NodeCidrTooBig {
                cluster,
                flag,
                node_mask,
                max_diff,
            });
        }
    }
    Ok(())
}

/// Parses `--service-cluster-ip-range`: at most two entries, of different
/// families. Empty entries are ignored, as KCM ignores an empty secondary.
fn parse_service_ranges(list: &str) -> Result<Vec<IpNet>, ConfigError> {
    let list = list.trim();
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.len() > 2 {
        return Err(ConfigError::TooManyServiceRanges {
            count: entries.len(),
        });
    }
    let ranges = entries
        .into_iter()
        .filter(|e| !e.is_empty())
        .map(|value| {
            parse_net(value).map_err(|reason| ConfigError::InvalidServiceRange {
                value: value.to_string(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let [first, second] = ranges[..] {
        if Family::of(&first) == Family::of(&second) {
            return Err(ConfigError::ServiceRangesNotDualStack { first, second });
        }
    }
    Ok(ranges)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

//! Per-Node size from capacity for the flag pool: netcm's flags, off by default, and how
//! they turn a family's fixed node mask into a [`NodeSizing`].
//!
//! Only IPv4 is sized. IPv6 node CIDRs keep the fixed `--node-cidr-mask-size-ipv6`: addresses are not
//! scarce there, a /64 per Node is the norm (SLAAC, and what CNIs expect), and sizing a /64 down by pod
//! count would buy nothing while breaking that expectation.

use ipnet::IpNet;

use super::{AllocatorConfig, ConfigError};
use crate::addr::Family;
use crate::cidr_set::max_node_bits;
use crate::sizing::NodeSizing;

/// `--node-cidr-size-from-pods`.
pub const FLAG_SIZE_FROM_PODS: &str = "--node-cidr-size-from-pods";
/// `--node-cidr-mask-size-ipv4-min`: the shortest mask, so the largest block.
pub const FLAG_MIN_MASK_V4: &str = "--node-cidr-mask-size-ipv4-min";
/// `--node-cidr-mask-size-ipv4-max`: the longest mask, so the smallest block.
pub const FLAG_MAX_MASK_V4: &str = "--node-cidr-mask-size-ipv4-max";

/// The smallest IPv4 node CIDR when `--node-cidr-mask-size-ipv4-max` is not given: a /28, 16 addresses
/// for 8 pods — the size ClusterCIDR's smallest `perNodeHostBits` (4) allows.
pub const DEFAULT_MAX_MASK_V4: u8 = 28;

/// netcm's sizing flags for the flag pool. All unset (the default) is kube-controller-manager's
/// behaviour: one fixed node mask per family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SizingFlags {
    /// `--node-cidr-size-from-pods`: size each Node's IPv4 CIDR from its `status.capacity.pods`.
    pub size_from_pods: bool,
    /// `--node-cidr-mask-size-ipv4-min` (default: the IPv4 node mask, so no Node gets more than today).
    pub min_mask_ipv4: Option<u8>,
    /// `--node-cidr-mask-size-ipv4-max` (default [`DEFAULT_MAX_MASK_V4`]).
    pub max_mask_ipv4: Option<u8>,
}

/// Why the sizing flags were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizingFlagError {
    /// A bound without the flag that turns sizing on.
    #[error("{flag} needs {FLAG_SIZE_FROM_PODS}")]
    BoundWithoutSizing {
        /// The bound given.
        flag: &'static str,
    },
    /// Sizing asked for on a cluster without IPv4 cluster CIDRs.
    #[error("{FLAG_SIZE_FROM_PODS} sizes IPv4 node CIDRs, and --cluster-cidr has no IPv4 entry")]
    NoIpv4,
    /// The bounds and the default do not nest.
    #[error(
        "invalid {FLAG_MIN_MASK_V4}={largest} / {FLAG_MAX_MASK_V4}={smallest} with an IPv4 node mask of \
         /{default}: they must satisfy min <= node mask <= max <= 32"
    )]
    Bounds {
        /// The shortest mask (largest block).
        largest: u8,
        /// The longest mask (smallest block).
        smallest: u8,
        /// The IPv4 node mask, given to Nodes without capacity.
        default: u8,
    },
    /// A cluster CIDR smaller than the largest block.
    #[error("{FLAG_MIN_MASK_V4}={largest} is larger than --cluster-cidr {cluster}")]
    ClusterSmallerThanLargest {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The shortest mask.
        largest: u8,
    },
    /// A cluster CIDR holding more smallest blocks than netcm tracks.
    #[error(
        "{FLAG_MAX_MASK_V4}={smallest} is more than {max_diff} bits longer than --cluster-cidr {cluster}"
    )]
    TooManySmallest {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The longest mask.
        smallest: u8,
        /// Largest allowed difference.
        max_diff: u8,
    },
}

impl From<SizingFlagError> for ConfigError {
    fn from(e: SizingFlagError) -> ConfigError {
        ConfigError::Sizing(e)
    }
}

impl AllocatorConfig {
    /// Applies the sizing flags: with `--node-cidr-size-from-pods` the IPv4 family gets a
    /// [`NodeSizing`] whose default is its node mask; without it nothing changes.
    pub fn with_sizing(mut self, flags: &SizingFlags) -> Result<AllocatorConfig, ConfigError> {
        if !flags.size_from_pods {
            let given = [
                (flags.min_mask_ipv4, FLAG_MIN_MASK_V4),
                (flags.max_mask_ipv4, FLAG_MAX_MASK_V4),
            ];
            if let Some((_, flag)) = given.iter().find(|(v, _)| v.is_some()) {
                return Err(SizingFlagError::BoundWithoutSizing { flag }.into());
            }
            return Ok(self);
        }
        let fam = self
            .families
            .iter_mut()
            .find(|f| f.family == Family::V4)
            .ok_or(SizingFlagError::NoIpv4)?;
        let default = fam.node_mask;
        let largest = flags.min_mask_ipv4.unwrap_or(default);
        let smallest = flags
            .max_mask_ipv4
            .unwrap_or(DEFAULT_MAX_MASK_V4.max(default));
        let sizing = NodeSizing::new(Family::V4, largest, smallest, default).map_err(|_| {
            SizingFlagError::Bounds {
                largest,
                smallest,
                default,
            }
        })?;
        for &cluster in &fam.cluster_cidrs {
            if cluster.prefix_len() > largest {
                return Err(SizingFlagError::ClusterSmallerThanLargest { cluster, largest }.into());
            }
            let max_diff = max_node_bits(Family::V4);
            if smallest - cluster.prefix_len() > max_diff {
                return Err(SizingFlagError::TooManySmallest {
                    cluster,
                    smallest,
                    max_diff,
                }
                .into());
            }
        }
        fam.sizing = Some(sizing);
        Ok(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::AllocatorFlags;

    fn config(cluster: &str) -> AllocatorConfig {
        AllocatorConfig::from_flags(&AllocatorFlags {
            cluster_cidr: cluster.into(),
            ..AllocatorFlags::default()
        })
        .unwrap()
    }

    fn sized(min: Option<u8>, max: Option<u8>) -> SizingFlags {
        SizingFlags {
            size_from_pods: true,
            min_mask_ipv4: min,
            max_mask_ipv4: max,
        }
    }

    #[test]
    fn without_the_flag_the_configuration_is_unchanged() {
        let c = config("10.0.0.0/16,fd00::/48");
        assert_eq!(c.clone().with_sizing(&SizingFlags::default()).unwrap(), c);
    }

    #[test]
    fn the_flag_alone_sizes_ipv4_from_the_node_mask_down_to_a_slash_28() {
        let c = config("fd00::/48,10.0.0.0/16")
            .with_sizing(&sized(None, None))
            .unwrap();
        assert_eq!(c.families[0].sizing, None, "IPv6 keeps its fixed mask");
        assert_eq!(
            c.families[1].sizing,
            Some(NodeSizing {
                largest: 24,
                smallest: 28,
                default: 24
            })
        );
    }

    #[test]
    fn bounds_are_taken_as_given() {
        let c = config("10.0.0.0/16")
            .with_sizing(&sized(Some(22), Some(27)))
            .unwrap();
        let s = c.families[0].sizing.unwrap();
        assert_eq!((s.largest, s.smallest, s.default), (22, 27, 24));
    }

    #[test]
    fn a_bound_without_the_flag_is_refused() {
        let flags = SizingFlags {
            max_mask_ipv4: Some(27),
            ..SizingFlags::default()
        };
        let err = config("10.0.0.0/16").with_sizing(&flags).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid sizing flags: --node-cidr-mask-size-ipv4-max needs --node-cidr-size-from-pods"
        );
    }

    #[test]
    fn sizing_an_ipv6_only_cluster_is_refused() {
        let err = config("fd00::/48")
            .with_sizing(&sized(None, None))
            .unwrap_err();
        assert_eq!(err, ConfigError::Sizing(SizingFlagError::NoIpv4));
    }

    #[test]
    fn bounds_that_leave_out_the_node_mask_are_refused() {
        for (min, max) in [(Some(25), None), (None, Some(23)), (Some(27), Some(25))] {
            let err = config("10.0.0.0/16")
                .with_sizing(&sized(min, max))
                .unwrap_err();
            assert!(
                matches!(err, ConfigError::Sizing(SizingFlagError::Bounds { .. })),
                "{min:?}..{max:?}: {err}"
            );
        }
    }

    #[test]
    fn a_cluster_cidr_smaller_than_the_largest_block_is_refused() {
        let err = config("10.0.0.0/16,10.1.0.0/23")
            .with_sizing(&sized(Some(22), None))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid sizing flags: --node-cidr-mask-size-ipv4-min=22 is larger than --cluster-cidr 10.1.0.0/23"
        );
    }

    #[test]
    fn a_smallest_block_too_far_below_the_cluster_cidr_is_refused() {
        let err = config("10.0.0.0/7")
            .with_sizing(&sized(None, Some(32)))
            .unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Sizing(SizingFlagError::TooManySmallest { max_diff: 24, .. })
        ));
    }
}

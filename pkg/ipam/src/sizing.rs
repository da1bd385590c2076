//! Per-Node size from capacity: the rule that turns a Node's pod capacity into the prefix
//! length of its pod CIDR, and the bounds an operator sets on it.
//!
//! The rule is GKE's: at least two addresses per pod (so a Node replacing every pod still has an
//! address for each new one while the old ones drain), rounded up to a power of two, within the
//! pool's bounds — 110 pods → /24, 33–64 → /25, 17–32 → /26, 16 → /27 for IPv4.

use crate::addr::Family;

/// Addresses a Node gets per pod of its capacity.
pub const ADDRESSES_PER_POD: u64 = 2;

/// The prefix length of the smallest block holding at least [`ADDRESSES_PER_POD`] × `pods` addresses
/// of `family`, clamped to `largest..=smallest` (prefix lengths of the largest and smallest block
/// allowed; `largest <= smallest`).
///
/// A capacity of 0 asks for no address and gets the smallest block: the clamp, not an error, because a
/// kubelet reporting 0 pods is odd but harmless, and one size too small is fixed by the operator's
/// bounds, never by refusing the Node.
pub fn prefix_for_pods(pods: u64, family: Family, largest: u8, smallest: u8) -> u8 {
    let addresses = pods.saturating_mul(ADDRESSES_PER_POD);
    // ceil(log2(addresses)): 0 for 0 or 1 address, 64 for anything above 2^63.
    let host_bits = if addresses <= 1 {
        0
    } else {
        64 - (addresses - 1).leading_zeros()
    };
    // host_bits <= 64, so the cast cannot truncate; a family of 32 bits caps it first.
    let host_bits = (host_bits as u8).min(family.bits());
    (family.bits() - host_bits).clamp(largest, smallest.max(largest))
}

/// How a pool sizes its node CIDRs in one family: its largest and smallest block, and the size of a
/// Node whose capacity is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSizing {
    /// Prefix length of the largest block a Node may get (the operator's "max" size).
    pub largest: u8,
    /// Prefix length of the smallest block a Node may get (the operator's "min" size); the pool's
    /// [`crate::CidrSet`]s use it as their node mask, the granularity every size is built of.
    pub smallest: u8,
    /// Prefix length given to a Node that reports no pod capacity (`largest..=smallest`).
    pub default: u8,
}

/// Bounds a [`NodeSizing`] cannot be built from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizingError {
    /// The largest block is smaller than the smallest one.
    #[error(
        "the largest node CIDR /{largest} must be at least as large as the smallest /{smallest}"
    )]
    Inverted {
        /// Prefix length of the largest block.
        largest: u8,
        /// Prefix length of the smallest block.
        smallest: u8,
    },
    /// The default size lies outside the bounds.
    #[error("the default node CIDR /{default} must lie between /{largest} and /{smallest}")]
    DefaultOutside {
        /// Prefix length of the default block.
        default: u8,
        /// Prefix length of the largest block.
        largest: u8,
        /// Prefix length of the smallest block.
        smallest: u8,
    },
    /// The smallest block is longer than an address of the family.
    #[error("node CIDR /{smallest} is longer than an {family} address")]
    TooLong {
        /// Prefix length of the smallest block.
        smallest: u8,
        /// The family.
        family: Family,
    },
}

impl NodeSizing {
    /// Checks the bounds: `largest <= default <= smallest <= family.bits()`.
    pub fn new(
        family: Family,
        largest: u8,
        smallest: u8,
        default: u8,
    ) -> Result<NodeSizing, SizingError> {
        if smallest > family.bits() {
            return Err(SizingError::TooLong { smallest, family });
        }
        if largest > smallest {
            return Err(SizingError::Inverted { largest, smallest });
        }
        if !(largest..=smallest).contains(&default) {
            return Err(SizingError::DefaultOutside {
                default,
                largest,
                smallest,
            });
        }
        Ok(NodeSizing {
            largest,
            smallest,
            default,
        })
    }

    /// The prefix length for a Node with `pods` capacity, or the default when it reports none.
    pub fn prefix_for(&self, family: Family, pods: Option<u64>) -> u8 {
        match pods {
            Some(pods) => prefix_for_pods(pods, family, self.largest, self.smallest),
            None => self.default,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v4(pods: u64) -> u8 {
        prefix_for_pods(pods, Family::V4, 16, 28)
    }

    #[test]
    fn gke_capacities_get_gke_sizes() {
        assert_eq!(v4(110), 24);
        for pods in 33..=64 {
            assert_eq!(v4(pods), 25, "{pods} pods");
        }
        for pods in 17..=32 {
            assert_eq!(v4(pods), 26, "{pods} pods");
        }
        assert_eq!(v4(16), 27);
        assert_eq!(v4(30), 26);
    }

    #[test]
    fn every_size_holds_at_least_two_addresses_per_pod_and_no_smaller_one_would() {
        for pods in 1..=5000u64 {
            let prefix = prefix_for_pods(pods, Family::V4, 0, 32);
            let size = 1u64 << (32 - prefix);
            assert!(size >= 2 * pods, "{pods} pods in /{prefix}");
            assert!(size / 2 < 2 * pods, "{pods} pods would fit /{}", prefix + 1);
        }
    }

    #[test]
    fn sizes_are_clamped_to_the_operators_bounds() {
        assert_eq!(prefix_for_pods(110, Family::V4, 25, 27), 25);
        assert_eq!(prefix_for_pods(1, Family::V4, 25, 27), 27);
        assert_eq!(prefix_for_pods(0, Family::V4, 25, 27), 27);
    }

    #[test]
    fn huge_capacities_saturate_at_the_largest_block() {
        assert_eq!(prefix_for_pods(u64::MAX, Family::V4, 8, 28), 8);
        assert_eq!(prefix_for_pods(u64::MAX, Family::V6, 0, 128), 64);
        assert_eq!(prefix_for_pods(1 << 40, Family::V4, 0, 32), 0);
    }

    #[test]
    fn the_rule_applies_to_ipv6_host_bits_alike() {
        assert_eq!(prefix_for_pods(110, Family::V6, 64, 124), 120);
        assert_eq!(prefix_for_pods(110, Family::V6, 64, 112), 112);
    }

    #[test]
    fn a_node_without_capacity_gets_the_default() {
        let s = NodeSizing::new(Family::V4, 22, 27, 24).unwrap();
        assert_eq!(s.prefix_for(Family::V4, None), 24);
        assert_eq!(s.prefix_for(Family::V4, Some(16)), 27);
        assert_eq!(s.prefix_for(Family::V4, Some(1000)), 22);
    }

    #[test]
    fn bounds_out_of_order_are_refused() {
        assert_eq!(
            NodeSizing::new(Family::V4, 27, 24, 25),
            Err(SizingError::Inverted {
                largest: 27,
                smallest: 24
            })
        );
        assert!(matches!(
            NodeSizing::new(Family::V4, 24, 27, 28),
            Err(SizingError::DefaultOutside { .. })
        ));
        assert!(matches!(
            NodeSizing::new(Family::V4, 24, 33, 28),
            Err(SizingError::TooLong { .. })
        ));
        assert!(NodeSizing::new(Family::V4, 24, 24, 24).is_ok());
    }
}

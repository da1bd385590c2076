//! Address families and the `u128` arithmetic every other module builds on.
//!
//! IPv4 and IPv6 networks are both handled as an inclusive range of `u128`
//! values plus a prefix length; [`Family`] says how many of those bits are
//! meaningful (32 or 128).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// An IP address family: the one definition every netcm crate uses (`netcm-node` re-exports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (32-bit addresses).
    V4,
    /// IPv6 (128-bit addresses).
    V6,
}

impl Family {
    /// The family of a network.
    pub fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    /// The lowercase name metric labels and log fields use (`ipv4`, `ipv6`).
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// Number of bits in an address of this family (32 or 128).
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Mask with the low `host_bits` bits set (`host_bits` may be 0..=128).
pub(crate) fn host_mask(host_bits: u32) -> u128 {
    if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

/// An address as a `u128` (IPv4 addresses occupy the low 32 bits).
pub(crate) fn addr_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// A network as an inclusive `u128` range: `(family, first, last, prefix)`.
///
/// Host bits of the network address are ignored, so `10.0.0.1/8` is the
/// same range as `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// Address family.
    pub family: Family,
    /// First address (network address).
    pub first: u128,
    /// Last address (broadcast address).
    pub last: u128,
    /// Prefix length.
    pub prefix: u8,
}

impl Span {
    /// The span covered by `net`.
    pub fn of(net: &IpNet) -> Span {
        let family = Family::of(net);
        let prefix = net.prefix_len();
        let hm = host_mask(u32::from(family.bits() - prefix));
        let first = addr_to_u128(net.addr()) & !hm;
        Span {
            family,
            first,
            last: first | hm,
            prefix,
        }
    }

    /// Whether the two spans share at least one address.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Whether `other` lies entirely inside `self`.
    pub fn contains(&self, other: &Span) -> bool {
        self.family == other.family && self.first <= other.first && other.last <= self.last
    }

    /// The overlapping part of two spans; CIDRs either nest or are disjoint,
    /// so this is the smaller of the two when they overlap.
    pub fn intersect(&self, other: &Span) -> Option<Span> {
        if !self.overlaps(other) {
            None
        } else if self.prefix >= other.prefix {
            Some(*self)
        } else {
            Some(*other)
        }
    }

    /// This span widened to the enclosing block of prefix length `prefix`
    /// (a no-op when the span is already at least that large).
    pub fn widen_to(&self, prefix: u8) -> Span {
        if self.prefix <= prefix {
            return *self;
        }
        let hm = host_mask(u32::from(self.family.bits() - prefix));
        Span {
            family: self.family,
            first: self.first & !hm,
            last: self.first | hm,
            prefix,
        }
    }

    /// The span as a normalized [`IpNet`].
    pub fn to_net(self) -> IpNet {
        net_from(self.family, self.first, self.prefix)
    }
}

/// Builds the network `start/prefix` of `family` (host bits are cleared and
/// an out-of-range prefix is clamped to the family's address size).
pub(crate) fn net_from(family: Family, start: u128, prefix: u8) -> IpNet {
    let prefix = prefix.min(family.bits());
    let start = start & !host_mask(u32::from(family.bits() - prefix));
    match family {
        Family::V4 => {
            // Truncation keeps the low 32 bits, which are the only ones an
            // IPv4 span ever uses.
            let addr = Ipv4Addr::from(start as u32);
            IpNet::V4(Ipv4Net::new_assert(addr, prefix))
        }
        Family::V6 => IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::from(start), prefix)),
    }
}

/// Formats a list of networks as `a, b, c`.
pub(crate) fn join_nets(nets: &[IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn a_span_ignores_host_bits() {
        let s = Span::of(&net("10.0.0.1/8"));
        assert_eq!(s.first, 0x0a00_0000);
        assert_eq!(s.last, 0x0aff_ffff);
        assert_eq!(s.to_net(), net("10.0.0.0/8"));
    }

    #[test]
    fn a_zero_prefix_covers_the_whole_family() {
        let v6 = Span::of(&net("::/0"));
        assert_eq!((v6.first, v6.last), (0, u128::MAX));
        let v4 = Span::of(&net("0.0.0.0/0"));
        assert_eq!((v4.first, v4.last), (0, u128::from(u32::MAX)));
    }

    #[test]
    fn families_never_overlap_even_when_numbers_do() {
        let a = Span::of(&net("0.0.0.0/0"));
        let b = Span::of(&net("::/0"));
        assert!(!a.overlaps(&b));
        assert!(!b.contains(&a));
    }

    #[test]
    fn intersection_of_nested_cidrs_is_the_smaller_one() {
        let big = Span::of(&net("10.0.0.0/8"));
        let small = Span::of(&net("10.1.0.0/16"));
        assert_eq!(big.intersect(&small), Some(small));
        assert_eq!(small.intersect(&big), Some(small));
        assert_eq!(small.intersect(&Span::of(&net("10.2.0.0/16"))), None);
    }

    #[test]
    fn widening_rounds_down_to_the_enclosing_block() {
        let s = Span::of(&net("10.1.2.64/26")).widen_to(24);
        assert_eq!(s.to_net(), net("10.1.2.0/24"));
        let big = Span::of(&net("10.0.0.0/8"));
        assert_eq!(big.widen_to(24), big);
    }

    #[test]
    fn family_displays_as_its_common_name() {
        assert_eq!(Family::V4.to_string(), "IPv4");
        assert_eq!(Family::V6.to_string(), "IPv6");
    }
}

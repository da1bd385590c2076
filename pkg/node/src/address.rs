//! The one rule for what may be a Node's public IP: what the syncer publishes in a lease and what the
//! route controller routes a pod CIDR via. One rule in both places, so a value the syncer refuses is
//! never a gateway, and a gateway is always a value the syncer could have written.

use std::net::IpAddr;

use crate::CachedNode;

use crate::Family;

/// Why a value cannot be a Node's public IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// Not exactly the text of one address (spaces, a zone, leading zeros and garbage all land here).
    #[error("not an IP address")]
    NotAnAddress,
    /// `0.0.0.0` or `::`.
    #[error("the unspecified address")]
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    #[error("a loopback address")]
    Loopback,
    /// A multicast group.
    #[error("a multicast address")]
    Multicast,
    /// `255.255.255.255`.
    #[error("the broadcast address")]
    Broadcast,
    /// `fe80::/10`: only meaningful together with an interface, which a lease cannot carry.
    #[error("a link-local address")]
    LinkLocal,
    /// `::ffff:a.b.c.d`: an IPv4 address in IPv6 clothing; the IPv4 key is the place for it.
    #[error("an IPv4-mapped address")]
    Ipv4Mapped,
    /// An IPv4 address where IPv6 is expected.
    #[error("an IPv4 address where IPv6 is expected")]
    WantedV6,
    /// An IPv6 address where IPv4 is expected.
    #[error("an IPv6 address where IPv4 is expected")]
    WantedV4,
}

impl Unusable {
    /// The reason as static text, for callers that keep it in their own types.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotAnAddress => "not an IP address",
            Self::Unspecified => "the unspecified address",
            Self::Loopback => "a loopback address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::LinkLocal => "a link-local address",
            Self::Ipv4Mapped => "an IPv4-mapped address",
            Self::WantedV6 => "an IPv4 address where IPv6 is expected",
            Self::WantedV4 => "an IPv6 address where IPv4 is expected",
        }
    }
}

/// Parses `raw` as a Node's public IP of `family`. The text must be exactly one address: it is not
/// trimmed, because flannel parses the annotation as written and a padded value would be one flannel
/// refuses. Unspecified, loopback, multicast, broadcast, IPv6 link-local and IPv4-mapped addresses are
/// refused: none of them can be a next hop to another Node.
pub fn public_ip(raw: &str, family: Family) -> Result<IpAddr, Unusable> {
    let ip: IpAddr = raw.parse().map_err(|_| Unusable::NotAnAddress)?;
    match (ip, family) {
        (IpAddr::V4(v4), Family::V4) => {
            if v4.is_unspecified() {
                Err(Unusable::Unspecified)
            } else if v4.is_loopback() {
                Err(Unusable::Loopback)
            } else if v4.is_multicast() {
                Err(Unusable::Multicast)
            } else if v4.is_broadcast() {
                Err(Unusable::Broadcast)
            } else {
                Ok(ip)
            }
        }
        (IpAddr::V6(v6), Family::V6) => {
            if v6.is_unspecified() {
                Err(Unusable::Unspecified)
            } else if v6.is_loopback() {
                Err(Unusable::Loopback)
            } else if v6.is_multicast() {
                Err(Unusable::Multicast)
            } else if v6.to_ipv4_mapped().is_some() {
                Err(Unusable::Ipv4Mapped)
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Err(Unusable::LinkLocal)
            } else {
                Ok(ip)
            }
        }
        (IpAddr::V6(_), Family::V4) => Err(Unusable::WantedV4),
        (IpAddr::V4(_), Family::V6) => Err(Unusable::WantedV6),
    }
}

/// The first address of `family` in the Node's `status.addresses` that passes [`public_ip`], by type in
/// `types` order, then in the order the Node lists them.
pub fn first_address<T: AsRef<str>>(
    node: &CachedNode,
    types: &[T],
    family: Family,
) -> Option<IpAddr> {
    types.iter().find_map(|t| {
        node.addresses()
            .filter(|a| a.type_ == t.as_ref())
            .find_map(|a| public_ip(a.address, family).ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;

    fn node(addresses: &[(&str, &str)]) -> CachedNode {
        test_support::node("n", &[], addresses, &[])
    }

    #[test]
    fn the_first_address_follows_the_type_order_then_the_nodes_order_and_skips_unusable_ones() {
        let n = node(&[
            ("ExternalIP", "203.0.113.1"),
            ("InternalIP", "127.0.0.1"),
            ("InternalIP", "192.0.2.10"),
            ("InternalIP", "192.0.2.11"),
            ("InternalIP", "2001:db8::10"),
        ]);
        let ip = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
        assert_eq!(
            first_address(&n, &["InternalIP", "ExternalIP"], Family::V4),
            ip("192.0.2.10")
        );
        assert_eq!(
            first_address(&n, &["ExternalIP", "InternalIP"], Family::V4),
            ip("203.0.113.1")
        );
        assert_eq!(
            first_address(&n, &["InternalIP"], Family::V6),
            ip("2001:db8::10")
        );
        assert_eq!(first_address(&n, &["ExternalIP"], Family::V6), None);
        assert_eq!(first_address(&node(&[]), &["InternalIP"], Family::V4), None);
    }

    #[test]
    fn ordinary_addresses_of_the_asked_family_are_accepted_in_canonical_form() {
        assert_eq!(
            public_ip("192.0.2.1", Family::V4),
            Ok("192.0.2.1".parse().expect("ip"))
        );
        assert_eq!(
            public_ip("2001:0db8::0:1", Family::V6).map(|ip| ip.to_string()),
            Ok("2001:db8::1".into())
        );
        // IPv4 link-local works as a next hop without an interface, unlike IPv6's.
        assert!(public_ip("169.254.1.1", Family::V4).is_ok());
    }

    #[test]
    fn addresses_that_can_never_be_a_next_hop_to_another_node_are_refused_with_the_reason() {
        for (raw, family, why) in [
            ("0.0.0.0", Family::V4, Unusable::Unspecified),
            ("127.0.0.1", Family::V4, Unusable::Loopback),
            ("224.0.0.1", Family::V4, Unusable::Multicast),
            ("255.255.255.255", Family::V4, Unusable::Broadcast),
            ("::", Family::V6, Unusable::Unspecified),
            ("::1", Family::V6, Unusable::Loopback),
            ("ff02::1", Family::V6, Unusable::Multicast),
            ("fe80::1", Family::V6, Unusable::LinkLocal),
            ("febf::1", Family::V6, Unusable::LinkLocal),
            ("::ffff:192.0.2.1", Family::V6, Unusable::Ipv4Mapped),
            ("2001:db8::1", Family::V4, Unusable::WantedV4),
            ("192.0.2.1", Family::V6, Unusable::WantedV6),
        ] {
            assert_eq!(public_ip(raw, family), Err(why), "{raw}");
            assert_eq!(why.as_str(), why.to_string());
        }
    }

    #[test]
    fn only_the_exact_text_of_one_address_parses() {
        for raw in [
            "",
            " 192.0.2.1",
            "192.0.2.1 ",
            "192.0.2.01",
            "fe80::1%eth0",
            "192.0.2.1/24",
            "banana",
        ] {
            assert_eq!(
                public_ip(raw, Family::V4).or_else(|_| public_ip(raw, Family::V6)),
                Err(Unusable::NotAnAddress),
                "{raw:?}"
            );
        }
    }
}

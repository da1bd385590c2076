//! Reading the kernel's route and address messages: which routes are netcm's, their destination, gateway
//! and nexthop, and the networks of the host's addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use rtnetlink::packet_route::AddressFamily;

use crate::backend::Route;

/// `destination via gateway` of a dumped route, if it is one (multipath and gateway-less routes are not
/// shapes netcm writes).
pub(super) fn parse_route(msg: &RouteMessage) -> Option<Route> {
    let (destination, gateway) = destination_and_gateway(msg);
    Some(Route {
        destination: destination?,
        gateway: gateway?,
    })
}

/// The destination of a route message (a default route has no destination attribute) and its gateway.
pub(super) fn destination_and_gateway(msg: &RouteMessage) -> (Option<IpNet>, Option<IpAddr>) {
    let len = msg.header.destination_prefix_length;
    let mut destination = None;
    let mut gateway = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => {
                destination = IpNet::new(IpAddr::V4(*a), len).ok()
            }
            RouteAttribute::Destination(RouteAddress::Inet6(a)) => {
                destination = IpNet::new(IpAddr::V6(*a), len).ok()
            }
            RouteAttribute::Gateway(RouteAddress::Inet(a)) => gateway = Some(IpAddr::V4(*a)),
            RouteAttribute::Gateway(RouteAddress::Inet6(a)) => gateway = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    let destination = destination.or_else(|| match msg.header.address_family {
        AddressFamily::Inet => IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).ok(),
        AddressFamily::Inet6 => IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).ok(),
        _ => None,
    });
    (destination, gateway)
}

/// Whether a route message is netcm's: its table and protocol, a unicast route.
pub(super) fn is_ours(msg: &RouteMessage, table: u32, protocol: u8) -> bool {
    table_of(msg) == table
        && u8::from(msg.header.protocol) == protocol
        && msg.header.kind == RouteType::Unicast
}

/// The table a route message is in (`RTA_TABLE` carries ids above 255).
pub(super) fn table_of(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

/// The nexthop a route names, if it names one.
pub(super) fn nexthop_id(msg: &RouteMessage) -> Option<u32> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::NhId(id) => Some(*id),
        _ => None,
    })
}

/// The network of one of the host's addresses (`IFA_LOCAL`, the host's own end, wins over
/// `IFA_ADDRESS`, which is the peer's on a point-to-point link).
pub(super) fn address_network(msg: &AddressMessage) -> Option<IpNet> {
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    IpNet::new(local.or(address)?, msg.header.prefix_len)
        .ok()
        .map(|n| n.trunc())
}

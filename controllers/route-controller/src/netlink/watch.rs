//! The kernel's notifications of route and address changes (rtnetlink multicast groups
//! `RTNLGRP_IPV4_ROUTE`, `RTNLGRP_IPV6_ROUTE`, `RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`), reduced to
//! the [`TableChange`]s of netcm's table. The kernel does not report routes it flushes itself when a
//! link goes down or an address goes away (IPv4 sends no RTM_DELROUTE then), which is one reason the
//! periodic reconcile stays.

use std::future::Future;

use futures::{future, Stream, StreamExt};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::route::{RouteMessage, RouteType};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::AsyncSocket;
use rtnetlink::MulticastGroup;

use super::messages::{destination_and_gateway, table_of};
use super::OpenError;
use crate::backend::TableChange;

/// The receive buffer asked for: netcm's own burst of a few thousand creates comes back as as many
/// notifications, and an overflow costs a full reconcile. The kernel caps it at `net.core.rmem_max`.
const RECEIVE_BUFFER: usize = 4 << 20;

/// Subscribes to the changes of `table`; `protocol` tells netcm's routes from others'. The returned
/// future drives the socket; spawn it. The stream ends if the socket fails.
pub fn watch(
    table: u32,
    protocol: u8,
) -> Result<
    (
        impl Stream<Item = TableChange> + Send + Unpin + 'static,
        impl Future<Output = ()> + Send + 'static,
    ),
    OpenError,
> {
    let (mut connection, _handle, messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])
    .map_err(OpenError::Socket)?;
    if let Err(e) = connection
        .socket_mut()
        .socket_mut()
        .set_rx_buf_sz(RECEIVE_BUFFER)
    {
        tracing::debug!(error = %e, "could not enlarge the notification buffer; overflows cost a full reconcile");
    }
    let changes = messages
        .filter_map(move |(message, _)| future::ready(table_change(&message, table, protocol)));
    Ok((changes, connection))
}

/// The change one notification reports about `table`, if any.
fn table_change(
    message: &NetlinkMessage<RouteNetlinkMessage>,
    table: u32,
    protocol: u8,
) -> Option<TableChange> {
    match &message.payload {
        NetlinkPayload::Overrun(_) => Some(TableChange::Lost),
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m)) => {
            route_change(m, table, protocol, true)
        }
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(m)) => {
            route_change(m, table, protocol, false)
        }
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewAddress(_) | RouteNetlinkMessage::DelAddress(_),
        ) => Some(TableChange::Addresses),
        _ => None,
    }
}

fn route_change(msg: &RouteMessage, table: u32, protocol: u8, added: bool) -> Option<TableChange> {
    if table_of(msg) != table {
        return None;
    }
    let (destination, gateway) = destination_and_gateway(msg);
    let destination = destination?;
    let ours = u8::from(msg.header.protocol) == protocol && msg.header.kind == RouteType::Unicast;
    Some(if added {
        TableChange::Added {
            destination,
            gateway,
            ours,
        }
    } else {
        TableChange::Removed {
            destination,
            gateway,
            ours,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::route::RouteProtocol;
    use rtnetlink::RouteMessageBuilder;
    use std::net::IpAddr;

    fn message(table: u32, protocol: u8) -> RouteMessage {
        RouteMessageBuilder::<IpAddr>::new()
            .table_id(table)
            .protocol(RouteProtocol::from(protocol))
            .destination_prefix("10.244.1.0".parse().expect("ip"), 24)
            .and_then(|b| b.gateway("192.0.2.10".parse().expect("gw")))
            .map(RouteMessageBuilder::build)
            .expect("message")
    }

    fn notification(m: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
        NetlinkMessage::from(m)
    }

    #[test]
    fn a_deleted_route_of_netcms_table_is_reported_with_whether_it_was_netcms() {
        let del = notification(RouteNetlinkMessage::DelRoute(message(100, 199)));
        assert_eq!(
            table_change(&del, 100, 199),
            Some(TableChange::Removed {
                destination: "10.244.1.0/24".parse().expect("net"),
                gateway: Some("192.0.2.10".parse().expect("gw")),
                ours: true,
            })
        );
        let static_route = notification(RouteNetlinkMessage::NewRoute(message(100, 4)));
        assert!(matches!(
            table_change(&static_route, 100, 199),
            Some(TableChange::Added { ours: false, .. })
        ));
    }

    #[test]
    fn other_tables_are_ignored_and_address_changes_and_overruns_are_reported() {
        let elsewhere = notification(RouteNetlinkMessage::DelRoute(message(254, 199)));
        assert_eq!(table_change(&elsewhere, 100, 199), None);
        let address = notification(RouteNetlinkMessage::NewAddress(Default::default()));
        assert_eq!(
            table_change(&address, 100, 199),
            Some(TableChange::Addresses)
        );
        let overrun = NetlinkMessage::<RouteNetlinkMessage>::new(
            Default::default(),
            NetlinkPayload::Overrun(Vec::new()),
        );
        assert_eq!(table_change(&overrun, 100, 199), Some(TableChange::Lost));
    }
}

//! The netlink backend: routes in the kernel routing table of the host (or network namespace) netcm runs
//! in, through rtnetlink. Every route netcm writes carries `--route-table` and `--route-protocol`; listing
//! and deleting match both, so routes of other software, or in other tables, are never touched.
//!
//! All calls share one netlink socket: rtnetlink pipelines requests on it, so many creates can be in
//! flight at once and a few thousand routes take well under a second. The kernel's notifications of
//! changes to the table come on a second socket ([`watch`]).
//!
//! A route names a nexthop object per gateway ([`gateways`]) where the kernel has them: with a plain
//! gateway on every route, IPv4 inserts are quadratic in the routes of the table ([`nexthop`]).

mod errors;
mod gateways;
mod messages;
mod nexthop;
mod watch;

pub use watch::watch;

use std::collections::HashSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use rtnetlink::RouteMessageBuilder;

use crate::backend::{BackendError, Route, Routes};
use crate::metrics::NexthopGauges;
use errors::{errno, failure, nexthop_failure, EEXIST, ENOENT, EPERM, ESRCH};
use gateways::GatewayNexthops;
use messages::{address_network, is_ours, nexthop_id, parse_route};
use nexthop::NexthopClient;

/// Why the netlink backend could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No netlink socket (not Linux, or netlink unavailable in this sandbox).
    #[error("netlink backend: cannot open a netlink route socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The kernel refuses route changes from this process.
    #[error(
        "netlink backend: the kernel refuses route changes from this process ({0}); it needs CAP_NET_ADMIN in the host's network namespace (hostNetwork: true and securityContext.capabilities.add: [NET_ADMIN])"
    )]
    PermissionDenied(String),
}

/// netcm's routes in one table of the kernel, through rtnetlink.
#[derive(Clone)]
pub struct NetlinkRoutes {
    handle: rtnetlink::Handle,
    table: u32,
    protocol: u8,
    nexthops: Arc<Nexthops>,
    gauges: Option<NexthopGauges>,
}

/// Whether routes name nexthop objects, settled by the first call that needs to know.
struct Nexthops {
    gateways: GatewayNexthops,
    enabled: tokio::sync::OnceCell<bool>,
}

/// Sends one request on a fresh synchronous socket and returns the kernel's errno (0 = success).
fn ask_kernel(message: RouteNetlinkMessage) -> Result<i32, std::io::Error> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut request = NetlinkMessage::from(message);
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    request.header.sequence_number = 1;
    request.finalize();
    let mut buf = vec![0u8; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;
    // The kernel handles a request to itself inside send(): the answer is queued before send returns, so
    // a non-blocking read cannot miss it, and cannot hang if something is odd.
    socket.set_non_blocking(true)?;
    let (answer, _) = socket.recv_from_full()?;
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer)
        .map_err(|e| std::io::Error::other(format!("undecodable netlink answer: {e}")))?;
    match reply.payload {
        NetlinkPayload::Error(e) => Ok(e.raw_code().abs()),
        _ => Ok(0),
    }
}

/// Proves the process may change routes, before anything else runs: a delete with an impossible prefix
/// length (33 bits of IPv4) in netcm's table and protocol. The kernel checks CAP_NET_ADMIN first
/// (EPERM), then rejects the request itself, so nothing can ever match and nothing is deleted.
fn probe_write_permission(table: u32, protocol: u8) -> Result<(), OpenError> {
    let mut message = RouteMessage::default();
    message.header.address_family = AddressFamily::Inet;
    message.header.destination_prefix_length = 33;
    message.header.protocol = RouteProtocol::from(protocol);
    message.header.scope = RouteScope::Universe;
    message.header.kind = RouteType::Unicast;
    message.header.table = 0;
    message.attributes.push(RouteAttribute::Table(table));
    match ask_kernel(RouteNetlinkMessage::DelRoute(message)).map_err(OpenError::Socket)? {
        EPERM => Err(OpenError::PermissionDenied(
            std::io::Error::from_raw_os_error(EPERM).to_string(),
        )),
        _ => Ok(()),
    }
}

impl NetlinkRoutes {
    /// Opens the backend: checks that route changes are permitted, then opens the socket all calls share.
    /// The returned future drives that socket; spawn it on the runtime before the first call completes.
    pub fn open(
        table: u32,
        protocol: u8,
    ) -> Result<(Self, impl Future<Output = ()> + Send + 'static), OpenError> {
        probe_write_permission(table, protocol)?;
        let (connection, handle, _) = rtnetlink::new_connection().map_err(OpenError::Socket)?;
        let (client, nexthop_connection) = NexthopClient::open().map_err(OpenError::Socket)?;
        let nexthops = Nexthops {
            gateways: GatewayNexthops::new(client, protocol),
            enabled: tokio::sync::OnceCell::new(),
        };
        Ok((
            Self {
                handle,
                table,
                protocol,
                nexthops: Arc::new(nexthops),
                gauges: None,
            },
            async move {
                futures::future::join(connection, nexthop_connection).await;
            },
        ))
    }

    /// This backend, setting `gauges` at each listing.
    pub fn with_gauges(mut self, gauges: NexthopGauges) -> Self {
        self.gauges = Some(gauges);
        self
    }

    /// netcm's nexthop per gateway, if routes name nexthop objects on this kernel.
    async fn gateways(&self) -> Option<&GatewayNexthops> {
        let gateways = &self.nexthops.gateways;
        let enabled = self
            .nexthops
            .enabled
            .get_or_init(|| async {
                if !gateways::kernel_reports_gateways() {
                    tracing::info!("routes name their gateways: net.ipv4.nexthop_compat_mode is 0 or absent, so the kernel would report nexthop routes without them");
                    return false;
                }
                match gateways.supported().await {
                    Ok(()) => {
                        tracing::info!("routes name one nexthop object per gateway");
                        true
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "routes name their gateways: this kernel has no nexthop objects");
                        false
                    }
                }
            })
            .await;
        enabled.then_some(gateways)
    }

    /// The interface the kernel would send to `gateway` through.
    async fn oif_towards(&self, gateway: IpAddr) -> Result<u32, String> {
        let mut query = RouteMessage::default();
        let (family, len, address) = match gateway {
            IpAddr::V4(a) => (AddressFamily::Inet, 32, RouteAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, 128, RouteAddress::Inet6(a)),
        };
        query.header.address_family = family;
        query.header.destination_prefix_length = len;
        query.attributes.push(RouteAttribute::Destination(address));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetRoute(query));
        request.header.flags = NLM_F_REQUEST;
        let mut answers = self
            .handle
            .clone()
            .request(request)
            .map_err(|e| format!("looking up the interface towards {gateway}: {e}"))?;
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m)) => {
                    if let Some(oif) = m.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Oif(i) => Some(*i),
                        _ => None,
                    }) {
                        return Ok(oif);
                    }
                }
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(format!("no route towards gateway {gateway}: {}", e.to_io()))
                }
                _ => {}
            }
        }
        Err(format!("no interface towards gateway {gateway}"))
    }

    /// Adds (or with `replace`, replaces) a route: through a nexthop where the kernel has them. A nexthop
    /// someone deleted under netcm is made again once.
    async fn write(&self, route: &Route, replace: bool) -> Result<(), BackendError> {
        let operation = if replace { "replace" } else { "create" };
        let send = |message: RouteMessage| {
            let request = self.handle.route().add(message);
            let request = if replace { request.replace() } else { request };
            request.execute()
        };
        let answer = |result: Result<(), rtnetlink::Error>| match result {
            Ok(()) => Ok(()),
            Err(e) if !replace && errno(&e) == Some(EEXIST) => {
                Err(BackendError::Exists(route.destination))
            }
            Err(e) => Err(failure(operation, route.to_string(), &e)),
        };
        let Some(gateways) = self.gateways().await else {
            return answer(send(self.message(operation, route, None)?).await);
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let id = match gateways
                .id_for(route.gateway, self.oif_towards(route.gateway), replace)
                .await
            {
                Ok(id) => id,
                Err(e) => match nexthop_failure(operation, route, e) {
                    host @ BackendError::Host { .. } => return Err(host),
                    // The kernel takes some gateways on a route that it refuses on a nexthop (an
                    // address of this host's): such a route names its gateway, as before nexthops.
                    _ => return answer(send(self.message(operation, route, None)?).await),
                },
            };
            match send(self.message(operation, route, Some(id))?).await {
                Err(e)
                    if errno(&e) != Some(EEXIST)
                        && attempts == 1
                        && gateways.forget_if_gone(route.gateway, id).await => {}
                result => return answer(result),
            }
        }
    }

    /// Deletes netcm's route: by its nexthop, or by its gateway (a route written before nexthops, or
    /// on a kernel without them). Either way a route re-pointed meanwhile does not match and stays.
    async fn remove(&self, route: &Route) -> Result<(), BackendError> {
        let gone = |e: &rtnetlink::Error| matches!(errno(e), Some(ESRCH | ENOENT));
        if let Some(gateways) = self.gateways().await {
            if let Some(id) = gateways.known(route.gateway).await {
                let message = self.message("delete", route, Some(id))?;
                match self.handle.route().del(message).execute().await {
                    Ok(()) => return Ok(()),
                    Err(e) if gone(&e) => {}
                    Err(e) => return Err(failure("delete", route.to_string(), &e)),
                }
            }
        }
        let message = self.message("delete", route, None)?;
        match self.handle.route().del(message).execute().await {
            Ok(()) => Ok(()),
            Err(e) if gone(&e) => Ok(()),
            Err(e) => Err(failure("delete", route.to_string(), &e)),
        }
    }

    /// netcm's route messages of one family.
    async fn dump(&self, family: AddressFamily) -> Result<Vec<RouteMessage>, BackendError> {
        let mut query = RouteMessage::default();
        query.header.address_family = family;
        let messages: Vec<RouteMessage> = self
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|e| failure("list", format!("table {}", self.table), &e))?;
        Ok(messages.into_iter().filter(|m| self.is_ours(m)).collect())
    }

    /// A route message in netcm's table and protocol, naming nexthop `nexthop` where given, else the
    /// route's gateway.
    fn message(
        &self,
        operation: &'static str,
        route: &Route,
        nexthop: Option<u32>,
    ) -> Result<RouteMessage, BackendError> {
        let builder = RouteMessageBuilder::<IpAddr>::new()
            .table_id(self.table)
            .protocol(RouteProtocol::from(self.protocol))
            .destination_prefix(route.destination.network(), route.destination.prefix_len());
        let builder = match nexthop {
            Some(_) => builder,
            None => builder.and_then(|b| b.gateway(route.gateway)),
        };
        let mut message =
            builder
                .map(RouteMessageBuilder::build)
                .map_err(|e| BackendError::Refused {
                    operation,
                    subject: route.to_string(),
                    message: e.to_string(),
                })?;
        if let Some(id) = nexthop {
            message.attributes.push(RouteAttribute::NhId(id));
        }
        Ok(message)
    }

    /// Whether a dumped route is netcm's: its table and protocol, a unicast route.
    fn is_ours(&self, msg: &RouteMessage) -> bool {
        is_ours(msg, self.table, self.protocol)
    }
}

impl Routes for NetlinkRoutes {
    fn list_routes(&self) -> BoxFuture<'_, Result<Vec<Route>, BackendError>> {
        Box::pin(async move {
            let gateways = self.gateways().await;
            let generation = match gateways {
                Some(g) => Some(g.begin_listing().await),
                None => None,
            };
            let mut messages = self.dump(AddressFamily::Inet).await?;
            messages.extend(self.dump(AddressFamily::Inet6).await?);
            if let (Some(gateways), Some(generation)) = (gateways, generation) {
                let named: HashSet<u32> = messages.iter().filter_map(nexthop_id).collect();
                match gateways.collect(generation, &named).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::debug!(deleted, "deleted nexthops no route names"),
                    // The routes are right either way; unused nexthops wait for the next period.
                    Err(e) => tracing::warn!(error = %e, "could not tidy netcm's nexthops"),
                }
            }
            if let Some(g) = &self.gauges {
                let via_nexthop = messages.iter().filter(|m| nexthop_id(m).is_some()).count();
                let objects = match gateways {
                    Some(gateways) => gateways.installed().await,
                    None => 0,
                };
                g.routes_via_nexthop.set(via_nexthop as i64);
                g.objects.set(objects as i64);
            }
            Ok(messages.iter().filter_map(parse_route).collect())
        })
    }

    fn create_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move { self.write(&route, false).await })
    }

    fn replace_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move { self.write(&route, true).await })
    }

    fn delete_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move { self.remove(&route).await })
    }

    fn connected_networks(&self) -> BoxFuture<'_, Result<Vec<IpNet>, BackendError>> {
        Box::pin(async move {
            let messages: Vec<AddressMessage> = self
                .handle
                .address()
                .get()
                .execute()
                .try_collect()
                .await
                .map_err(|e| failure("list", "addresses".into(), &e))?;
            Ok(messages.iter().filter_map(address_network).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> NetlinkRoutes {
        // A handle without a running connection: only the message builders are exercised.
        let (_, handle, _) = rtnetlink::new_connection().expect("netlink socket");
        let (client, _) = NexthopClient::open().expect("netlink socket");
        NetlinkRoutes {
            handle,
            table: 100,
            protocol: 199,
            nexthops: Arc::new(Nexthops {
                gateways: GatewayNexthops::new(client, 199),
                enabled: tokio::sync::OnceCell::new(),
            }),
            gauges: None,
        }
    }

    #[tokio::test]
    async fn a_route_message_carries_the_table_protocol_destination_and_gateway_and_parses_back() {
        let r = routes();
        for (dst, gw) in [
            ("10.244.3.0/24", "192.0.2.3"),
            ("fd00:1::/64", "2001:db8::3"),
        ] {
            let route = Route {
                destination: dst.parse().expect("dst"),
                gateway: gw.parse().expect("gw"),
            };
            let msg = r.message("create", &route, None).expect("message");
            assert!(r.is_ours(&msg), "{msg:?}");
            assert_eq!(parse_route(&msg), Some(route));
        }
    }

    #[tokio::test]
    async fn a_route_message_naming_a_nexthop_carries_its_id_and_no_gateway() {
        let r = routes();
        let route = Route {
            destination: "10.244.3.0/24".parse().expect("dst"),
            gateway: "192.0.2.3".parse().expect("gw"),
        };
        let msg = r.message("create", &route, Some(7)).expect("message");
        assert!(r.is_ours(&msg), "{msg:?}");
        assert_eq!(nexthop_id(&msg), Some(7));
        assert!(!msg
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Gateway(_))));
        assert_eq!(parse_route(&msg), None, "no gateway to parse back");
    }

    #[tokio::test]
    async fn routes_of_another_protocol_or_table_are_not_ours() {
        let r = routes();
        let route = Route {
            destination: "10.244.3.0/24".parse().expect("dst"),
            gateway: "192.0.2.3".parse().expect("gw"),
        };
        let mut other_protocol = r.message("create", &route, None).expect("message");
        other_protocol.header.protocol = RouteProtocol::Static;
        assert!(!r.is_ours(&other_protocol));
        let big_table = NetlinkRoutes {
            table: 1000,
            ..r.clone()
        };
        let in_big_table = big_table.message("create", &route, None).expect("message");
        assert!(!r.is_ours(&in_big_table));
        assert!(big_table.is_ours(&in_big_table));
    }
}

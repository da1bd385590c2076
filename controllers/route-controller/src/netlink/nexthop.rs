//! Nexthop objects (`RTM_*NEXTHOP`, Linux ≥ 5.3) on the wire: the `nhmsg` header and the attributes
//! netcm writes and reads (`NHA_ID`, `NHA_OIF`, `NHA_GATEWAY`), and a client on its own netlink socket.
//! netlink-packet-route has no nexthop messages, so this module encodes them itself.
//!
//! Why netcm uses them: IPv4 finds an existing `fib_info` through a hash that leaves the gateway out, so
//! when every route has its own gateway each insert walks every earlier route (quadratic; see
//! `hack/bench.sh kernel-routes`). A route that names a nexthop object by id is hashed by that id instead.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::StreamExt;
use rtnetlink::packet_core::{
    DecodeError, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable, NlaBuffer, NlasIterator, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, SocketAddr};

/// Message types (`linux/rtnetlink.h`).
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;

/// Attributes (`linux/nexthop.h`).
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// `sizeof(struct nhmsg)`.
const HEADER_LEN: usize = 8;

/// One nexthop message: the request netcm sends or the kernel's description of a nexthop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NexthopMessage {
    /// `RTM_NEWNEXTHOP`, `RTM_DELNEXTHOP` or `RTM_GETNEXTHOP`.
    pub message_type: u16,
    /// `AF_INET`, `AF_INET6`, or 0 (a group, a blackhole, a dump request).
    pub family: u8,
    /// Who installed it (netcm: `--route-protocol`).
    pub protocol: u8,
    /// `NHA_ID`.
    pub id: Option<u32>,
    /// `NHA_OIF`: the interface.
    pub oif: Option<u32>,
    /// `NHA_GATEWAY`.
    pub gateway: Option<IpAddr>,
    /// A group or a blackhole: never a shape netcm writes.
    pub not_a_gateway: bool,
}

impl NexthopMessage {
    /// The nexthop the kernel describes, if the message names one.
    fn nexthop(&self) -> Option<Nexthop> {
        Some(Nexthop {
            id: self.id?,
            protocol: self.protocol,
            gateway: if self.not_a_gateway {
                None
            } else {
                self.gateway
            },
        })
    }

    fn attributes_len(&self) -> usize {
        let mut len = 0;
        if self.id.is_some() {
            len += 8;
        }
        if self.oif.is_some() {
            len += 8;
        }
        match self.gateway {
            Some(IpAddr::V4(_)) => len += 8,
            Some(IpAddr::V6(_)) => len += 20,
            None => {}
        }
        len
    }
}

/// Writes one attribute at `at` and returns where the next one starts (values here are 4-byte multiples).
fn put_attribute(buffer: &mut [u8], at: usize, kind: u16, value: &[u8]) -> usize {
    let len = 4 + value.len();
    buffer[at..at + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    buffer[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
    buffer[at + 4..at + len].copy_from_slice(value);
    at + len
}

impl NetlinkSerializable for NexthopMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        HEADER_LEN + self.attributes_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..HEADER_LEN].fill(0);
        buffer[0] = self.family;
        buffer[2] = self.protocol;
        let mut at = HEADER_LEN;
        if let Some(id) = self.id {
            at = put_attribute(buffer, at, NHA_ID, &id.to_ne_bytes());
        }
        if let Some(oif) = self.oif {
            at = put_attribute(buffer, at, NHA_OIF, &oif.to_ne_bytes());
        }
        match self.gateway {
            Some(IpAddr::V4(a)) => {
                put_attribute(buffer, at, NHA_GATEWAY, &a.octets());
            }
            Some(IpAddr::V6(a)) => {
                put_attribute(buffer, at, NHA_GATEWAY, &a.octets());
            }
            None => {}
        }
    }
}

fn u32_of(value: &[u8]) -> Result<u32, DecodeError> {
    let bytes: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| DecodeError::from("a nexthop attribute of 4 bytes is shorter"))?;
    Ok(u32::from_ne_bytes(bytes))
}

fn address_of(value: &[u8]) -> Result<IpAddr, DecodeError> {
    if let Ok(v4) = <[u8; 4]>::try_from(value) {
        return Ok(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    if let Ok(v6) = <[u8; 16]>::try_from(value) {
        return Ok(IpAddr::V6(Ipv6Addr::from(v6)));
    }
    Err(DecodeError::from(
        "a nexthop gateway is neither 4 nor 16 bytes",
    ))
}

impl NetlinkDeserializable for NexthopMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if payload.len() < HEADER_LEN {
            return Err(DecodeError::from(
                "a nexthop message shorter than its header",
            ));
        }
        let mut message = NexthopMessage {
            message_type: header.message_type,
            family: payload[0],
            protocol: payload[2],
            ..Default::default()
        };
        for nla in NlasIterator::new(&payload[HEADER_LEN..]) {
            let nla: NlaBuffer<&[u8]> = nla?;
            match nla.kind() {
                NHA_ID => message.id = Some(u32_of(nla.value())?),
                NHA_OIF => message.oif = Some(u32_of(nla.value())?),
                NHA_GATEWAY => message.gateway = Some(address_of(nla.value())?),
                NHA_GROUP | NHA_BLACKHOLE => message.not_a_gateway = true,
                _ => {}
            }
        }
        Ok(message)
    }
}

/// One nexthop of the kernel's, as a dump lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nexthop {
    /// Its id.
    pub id: u32,
    /// Who installed it.
    pub protocol: u8,
    /// Its gateway; `None` for groups, blackholes and device-only nexthops.
    pub gateway: Option<IpAddr>,
}

/// A nexthop call the kernel refused, with its errno.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexthopError {
    /// The kernel's errno (0 when the socket itself failed).
    pub errno: i32,
    /// What failed.
    pub message: String,
}

impl fmt::Display for NexthopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// errno values the nexthop client tells apart.
pub const EEXIST: i32 = 17;
/// The id names no nexthop.
pub const ENOENT: i32 = 2;

/// Nexthop calls on their own netlink socket; cheap to clone.
#[derive(Clone)]
pub struct NexthopClient {
    handle: ConnectionHandle<NexthopMessage>,
}

impl NexthopClient {
    /// Opens the socket. The returned future drives it; spawn it.
    pub fn open() -> std::io::Result<(Self, impl Future<Output = ()> + Send + 'static)> {
        let (connection, handle, _) =
            rtnetlink::proto::new_connection::<NexthopMessage>(NETLINK_ROUTE)?;
        Ok((Self { handle }, connection))
    }

    /// Sends one request and collects the messages of its answer; a NACK is the kernel's errno.
    async fn ask(
        &self,
        message: NexthopMessage,
        flags: u16,
    ) -> Result<Vec<NexthopMessage>, NexthopError> {
        let mut request = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(message),
        );
        request.header.flags = NLM_F_REQUEST | flags;
        request.finalize();
        let mut answers = self
            .handle
            .request(request, SocketAddr::new(0, 0))
            .map_err(|e| NexthopError {
                errno: 0,
                message: format!("netlink socket: {e}"),
            })?;
        let mut messages = Vec::new();
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(NexthopError {
                        errno: e.raw_code().abs(),
                        message: e.to_io().to_string(),
                    })
                }
                NetlinkPayload::InnerMessage(m) => messages.push(m),
                _ => {}
            }
        }
        Ok(messages)
    }

    /// Every nexthop of this network namespace.
    pub async fn dump(&self) -> Result<Vec<Nexthop>, NexthopError> {
        let query = NexthopMessage {
            message_type: RTM_GETNEXTHOP,
            ..Default::default()
        };
        Ok(self
            .ask(query, NLM_F_DUMP)
            .await?
            .iter()
            .filter_map(NexthopMessage::nexthop)
            .collect())
    }

    /// Creates nexthop `id` via `gateway` on interface `oif`; [`EEXIST`] if the id is taken.
    pub async fn create(
        &self,
        id: u32,
        gateway: IpAddr,
        oif: u32,
        protocol: u8,
    ) -> Result<(), NexthopError> {
        let message = NexthopMessage {
            message_type: RTM_NEWNEXTHOP,
            family: family_of(gateway),
            protocol,
            id: Some(id),
            oif: Some(oif),
            gateway: Some(gateway),
            not_a_gateway: false,
        };
        self.ask(message, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            .await
            .map(drop)
    }

    /// Deletes nexthop `id` (and, in the kernel, every route that uses it); [`ENOENT`] if there is none.
    pub async fn delete(&self, id: u32) -> Result<(), NexthopError> {
        let message = NexthopMessage {
            message_type: RTM_DELNEXTHOP,
            id: Some(id),
            ..Default::default()
        };
        self.ask(message, NLM_F_ACK).await.map(drop)
    }

    /// Nexthop `id`, if the kernel has it.
    pub async fn get(&self, id: u32) -> Result<Option<Nexthop>, NexthopError> {
        let message = NexthopMessage {
            message_type: RTM_GETNEXTHOP,
            id: Some(id),
            ..Default::default()
        };
        match self.ask(message, 0).await {
            Ok(messages) => Ok(messages.iter().find_map(NexthopMessage::nexthop)),
            Err(e) if e.errno == ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The address family of a gateway.
fn family_of(gateway: IpAddr) -> u8 {
    match gateway {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(message: &NexthopMessage) -> NexthopMessage {
        let mut buffer = vec![0u8; message.buffer_len()];
        message.serialize(&mut buffer);
        let mut header = NetlinkHeader::default();
        header.message_type = message.message_type;
        NexthopMessage::deserialize(&header, &buffer).expect("decodes")
    }

    #[test]
    fn a_nexthop_of_either_family_encodes_and_decodes_back() {
        for gateway in ["192.0.2.7", "2001:db8::7"] {
            let message = NexthopMessage {
                message_type: RTM_NEWNEXTHOP,
                family: family_of(gateway.parse().expect("gw")),
                protocol: 199,
                id: Some(70_001),
                oif: Some(3),
                gateway: Some(gateway.parse().expect("gw")),
                not_a_gateway: false,
            };
            assert_eq!(round_trip(&message), message);
        }
    }

    #[test]
    fn a_dump_request_is_an_all_zero_header_and_nothing_else() {
        let query = NexthopMessage {
            message_type: RTM_GETNEXTHOP,
            ..Default::default()
        };
        let mut buffer = vec![0xffu8; query.buffer_len()];
        query.serialize(&mut buffer);
        assert_eq!(buffer, vec![0u8; HEADER_LEN]);
    }

    #[test]
    fn a_group_or_a_short_attribute_is_told_apart_from_a_gateway() {
        let mut header = NetlinkHeader::default();
        header.message_type = RTM_NEWNEXTHOP;
        let mut group = vec![0u8; HEADER_LEN + 8 + 12];
        let at = put_attribute(&mut group, HEADER_LEN, NHA_ID, &9u32.to_ne_bytes());
        put_attribute(&mut group, at, NHA_GROUP, &[1, 0, 0, 0, 0, 0, 0, 0]);
        let decoded = NexthopMessage::deserialize(&header, &group).expect("decodes");
        assert!(decoded.not_a_gateway);
        assert_eq!(decoded.id, Some(9));

        let mut short = vec![0u8; HEADER_LEN + 8];
        put_attribute(&mut short, HEADER_LEN, NHA_GATEWAY, &[10, 0, 0, 1]);
        short[HEADER_LEN + 4..].copy_from_slice(&[1, 2, 3, 4]);
        short[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&6u16.to_ne_bytes());
        assert!(NexthopMessage::deserialize(&header, &short).is_err());
        assert!(NexthopMessage::deserialize(&header, &[0u8; 4]).is_err());
    }
}

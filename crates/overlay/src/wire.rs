//! The underlay datagram formats.
//!
//! Every datagram starts with a kind byte:
//!
//! | kind | message | layout |
//! |---|---|---|
//! | 2, 3, 4 | WireGuard handshake response, cookie reply, transport data | verbatim (the receiver index names the tunnel) |
//! | `H` (0x48) | hello | `H, version, flags, 0, tag[8], peer id[32], mac[16]` = 60 bytes |
//! | `I` (0x49) | handshake initiation | `I, version, 0, 0, tag[8]` + WireGuard initiation (148 bytes) |
//! | `R` (0x52) | relayed | `R, version, 0, 0, session[4]` + one of the above but a hello |
//!
//! WireGuard's own initiation (kind 1) names no namespace, so it travels wrapped with the
//! namespace tag; a bare one is malformed. Hello lets two members that know only each other's
//! underlay address learn each other's identity key; its MAC is keyed by the namespace
//! secret, so strangers get nothing back.
//!
//! A relayed datagram is end-to-end encrypted between two members; the relay (a third
//! member that agreed to carry the session, see [`Control::RelayOffer`]) forwards it
//! verbatim between the two endpoints it knows for the session and reads nothing else.
//!
//! Inside a tunnel, members exchange control messages as IPv4 packets from and to 0.0.0.0
//! with protocol 253 (RFC 3692, experimentation), which no host behind a TAP can send
//! through a switch: a 4-byte magic, then the message ([`Control`]).
//!
//! A node parses each datagram once, with [`Datagram::parse`]: the kind byte and the
//! fields that tell where the datagram goes (namespace tag, receiver index, relay session).
//! The WireGuard messages themselves are boringtun's to parse and authenticate.
//!
//! No-panic contract: every parser checks lengths before reading.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use blake2::digest::consts::U16;
use blake2::digest::{KeyInit, Mac};
use blake2::Blake2sMac;

use crate::keys::{NamespaceKeys, TAG_LEN};
use crate::PeerId;

mod parts;

use parts::address_len;
pub use parts::{AddressPart, AddressParts, MacPart, MacParts, Parts};

/// Kind byte of a hello.
pub const KIND_HELLO: u8 = b'H';
/// Kind byte of a wrapped handshake initiation.
pub const KIND_INIT: u8 = b'I';
/// Kind of a bare WireGuard handshake initiation (not accepted unwrapped).
pub const KIND_WG_INIT: u8 = 1;
/// Kind of a WireGuard handshake response.
pub const KIND_WG_RESPONSE: u8 = 2;
/// Kind of a WireGuard cookie reply.
pub const KIND_WG_COOKIE: u8 = 3;
/// Kind of a WireGuard transport data message.
pub const KIND_WG_DATA: u8 = 4;
/// Kind byte of a relayed datagram.
pub const KIND_RELAY: u8 = b'R';
/// Bytes in front of a relayed datagram: kind, version, 2 reserved, session.
pub const RELAY_HEADER_LEN: usize = 8;

/// Wire format version of hello and wrapped initiations.
pub const VERSION: u8 = 1;

/// Length of a hello.
pub const HELLO_LEN: usize = 60;
/// Bytes in front of a WireGuard initiation: kind, version, shard, 1 reserved, tag.
pub const INIT_PREFIX_LEN: usize = 4 + TAG_LEN;
/// Length of a WireGuard handshake initiation.
pub const WG_INIT_LEN: usize = 148;
/// WireGuard transport data overhead: 16-byte header and 16-byte tag.
pub const WG_DATA_OVERHEAD: usize = 32;

const HELLO_MAC_AT: usize = 44;
const FLAG_REPLY: u8 = 1;

/// Protocol number of in-tunnel control packets (RFC 3692).
pub const CONTROL_PROTOCOL: u8 = 253;
const ANNOUNCE_MAGIC: &[u8; 4] = b"HYA1";
const RELAY_REQUEST_MAGIC: &[u8; 4] = b"HYR1";
const RELAY_OFFER_MAGIC: &[u8; 4] = b"HYO1";
const PROBE_MAGIC: &[u8; 4] = b"HYP1";
const UPLINKS_MAGIC: &[u8; 4] = b"HYU1";
const MACS_MAGIC: &[u8; 4] = b"HYM2";
const ADDRESSES_MAGIC: &[u8; 4] = b"HYX1";

/// Most MACs one [`Control::Macs`] part carries (200 of 6 bytes fit a tunnel of 1280).
pub const MAX_MACS_PER_PART: usize = 200;
/// Most parts one member's MAC announcement is cut into.
pub const MAX_MAC_PARTS: usize = 5;
/// Most MACs one member announces in a namespace (a LAN of a /22 and then some).
pub const MAX_ANNOUNCED_MACS: usize = MAX_MACS_PER_PART * MAX_MAC_PARTS;
const FLAG_ACK: u8 = 1;
/// Encoded length of an underlay endpoint: family (4 or 6), 16 address bytes, port.
const ENDPOINT_LEN: usize = 19;
const FLAG_HAVE_YOURS: u8 = 1;
/// In an announcement: the sender reads [`Control::Uplinks`] (an agent that does not, never
/// gets one).
const FLAG_UPLINKS: u8 = 2;
/// In an announcement: the sender reads IPv6 address lists (dual stack). (Bit 4 was a
/// development version's, which read them in a message of their own.)
const FLAG_ADDRESSES6: u8 = 16;
/// In an announcement: an IPv6 address list follows (sent only to members that set
/// [`FLAG_ADDRESSES6`]); the certificate's length is then always there, 0 for none.
const FLAG_LIST6: u8 = 32;
/// Most uplinks one member announces.
pub const MAX_UPLINKS: usize = 8;
/// Most addresses of each family one announcement may carry; a member that holds more
/// sends them all in [`Control::Addresses`] parts to members that read them.
pub const MAX_ANNOUNCED: usize = 64;
/// In an announcement: the sender reads [`Control::Addresses`] parts.
const FLAG_READS_PARTS: u8 = 64;
/// In an announcement: the sender's whole address lists follow in [`Control::Addresses`]
/// parts of the generation that ends the announcement (sent only to members that set
/// [`FLAG_READS_PARTS`]); the certificate's length is then always there, 0 for none.
const FLAG_IN_PARTS: u8 = 128;
/// Most address bytes one [`Control::Addresses`] part carries (256 IPv4 or 64 IPv6
/// addresses, well within a tunnel of 1280).
pub const MAX_ADDRESS_BYTES_PER_PART: usize = 1024;
/// Most parts one member's address lists are cut into (8192 IPv4 or 2048 IPv6 addresses).
pub const MAX_ADDRESS_PARTS: usize = 32;

/// Why a datagram did not parse. The node counts every one as
/// [`DropReason::Malformed`](crate::DropReason::Malformed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Zero bytes.
    #[error("empty datagram")]
    Empty,
    /// A kind byte no member sends (a relayed datagram carries only tunnel messages).
    #[error("unknown datagram kind {0:#04x}")]
    UnknownKind(u8),
    /// A WireGuard initiation without the namespace prefix.
    #[error("bare WireGuard initiation")]
    BareInitiation,
    /// Shorter than its kind's fixed header.
    #[error("truncated datagram of kind {0:#04x}")]
    Truncated(u8),
    /// A hello of the wrong length or version.
    #[error("malformed hello")]
    Hello,
    /// A relay header of an unknown version.
    #[error("relay header of unknown version")]
    RelayVersion,
}

/// Every datagram a node accepts at its underlay port, parsed once: the fields that tell
/// where it goes (namespace tag, receiver index, relay session) are read here and nowhere
/// else. The WireGuard messages themselves are boringtun's to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datagram<'a> {
    /// A hello, not yet authenticated: check `bytes` with [`Hello::verify`].
    Hello {
        /// Its fields.
        hello: Hello,
        /// The whole datagram, which the MAC covers.
        bytes: &'a [u8],
    },
    /// A tunnel message sent directly.
    Tunnel(TunnelMessage<'a>),
    /// A datagram through a relay.
    Relayed {
        /// The relay session.
        session: u32,
        /// The whole datagram, header included: a relay forwards it verbatim.
        bytes: &'a [u8],
        /// What it carries, for the end of the session. A relay forwards what it cannot
        /// read: only the ends hold the keys that give it meaning.
        inner: Result<TunnelMessage<'a>, ParseError>,
    },
}

/// A message of a tunnel, as it may travel directly or through a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelMessage<'a> {
    /// A handshake initiation wrapped with the namespace tag.
    Init {
        /// The namespace tag.
        tag: [u8; TAG_LEN],
        /// The shard of the tunnel it starts a session for (0 from agents without shards,
        /// whose prefix had the byte reserved).
        shard: u8,
        /// The WireGuard initiation after the prefix.
        message: &'a [u8],
    },
    /// A WireGuard handshake response, cookie reply or transport data message.
    WireGuard {
        /// [`KIND_WG_RESPONSE`], [`KIND_WG_COOKIE`] or [`KIND_WG_DATA`].
        kind: u8,
        /// Our index of the tunnel (the receiver index).
        receiver: u32,
        /// The whole message.
        message: &'a [u8],
    },
}

impl<'a> Datagram<'a> {
    /// Parses a datagram from the underlay; after this, nothing reads a header again.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        match *datagram.first().ok_or(ParseError::Empty)? {
            KIND_HELLO => match Hello::parse(datagram) {
                Ok(hello) => Ok(Datagram::Hello {
                    hello,
                    bytes: datagram,
                }),
                Err(_) => Err(ParseError::Hello),
            },
            KIND_RELAY => {
                let (session, inner) =
                    parse_relay(datagram).ok_or(if datagram.len() < RELAY_HEADER_LEN {
                        ParseError::Truncated(KIND_RELAY)
                    } else {
                        ParseError::RelayVersion
                    })?;
                Ok(Datagram::Relayed {
                    session,
                    bytes: datagram,
                    inner: TunnelMessage::parse(inner),
                })
            }
            _ => TunnelMessage::parse(datagram).map(Datagram::Tunnel),
        }
    }
}

impl<'a> TunnelMessage<'a> {
    /// Parses a tunnel message (a datagram that is neither a hello nor relayed).
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        let kind = *datagram.first().ok_or(ParseError::Empty)?;
        match kind {
            KIND_INIT => {
                let tag = datagram
                    .get(4..INIT_PREFIX_LEN)
                    .and_then(|b| <[u8; TAG_LEN]>::try_from(b).ok())
                    .ok_or(ParseError::Truncated(kind))?;
                Ok(TunnelMessage::Init {
                    tag,
                    shard: datagram[2],
                    message: &datagram[INIT_PREFIX_LEN..],
                })
            }
            KIND_WG_RESPONSE | KIND_WG_COOKIE | KIND_WG_DATA => {
                // The response carries the sender's index first (bytes 4..8) and ours at
                // 8..12; cookie and data carry ours at 4..8.
                let at = if kind == KIND_WG_RESPONSE { 8 } else { 4 };
                let b = datagram
                    .get(at..at + 4)
                    .ok_or(ParseError::Truncated(kind))?;
                Ok(TunnelMessage::WireGuard {
                    kind,
                    receiver: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    message: datagram,
                })
            }
            KIND_WG_INIT => Err(ParseError::BareInitiation),
            other => Err(ParseError::UnknownKind(other)),
        }
    }
}

/// A parsed, not yet authenticated hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Namespace tag.
    pub tag: [u8; TAG_LEN],
    /// True for an answer to a hello.
    pub reply: bool,
    /// The sender's identity.
    pub peer: [u8; 32],
}

/// Why a hello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloError {
    /// Wrong length or version.
    Malformed,
    /// The MAC does not match the namespace key.
    BadMac,
}

impl Hello {
    /// Parses the fixed fields; [`Hello::verify`] checks the MAC.
    pub fn parse(datagram: &[u8]) -> Result<Self, HelloError> {
        if datagram.len() != HELLO_LEN || datagram[0] != KIND_HELLO || datagram[1] != VERSION {
            return Err(HelloError::Malformed);
        }
        let mut peer = [0u8; 32];
        peer.copy_from_slice(&datagram[12..44]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&datagram[4..4 + TAG_LEN]);
        Ok(Self {
            tag,
            reply: datagram[2] & FLAG_REPLY != 0,
            peer,
        })
    }

    /// Checks the MAC of a hello datagram with the namespace's key.
    pub fn verify(datagram: &[u8], keys: &NamespaceKeys) -> Result<(), HelloError> {
        if datagram.len() != HELLO_LEN {
            return Err(HelloError::Malformed);
        }
        hello_mac(keys, &datagram[..HELLO_MAC_AT])
            .verify_slice(&datagram[HELLO_MAC_AT..])
            .map_err(|_| HelloError::BadMac)
    }

    /// Builds an authenticated hello.
    pub fn emit(keys: &NamespaceKeys, me: &PeerId, reply: bool) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0] = KIND_HELLO;
        out[1] = VERSION;
        out[2] = if reply { FLAG_REPLY } else { 0 };
        out[4..12].copy_from_slice(&keys.tag);
        out[12..44].copy_from_slice(me.as_bytes());
        let mac = hello_mac(keys, &out[..HELLO_MAC_AT])
            .finalize()
            .into_bytes();
        out[HELLO_MAC_AT..].copy_from_slice(&mac);
        out
    }
}

fn hello_mac(keys: &NamespaceKeys, msg: &[u8]) -> Blake2sMac<U16> {
    let mut mac = <Blake2sMac<U16> as KeyInit>::new_from_slice(&keys.hello_key)
        .unwrap_or_else(|_| unreachable!("32-byte key"));
    mac.update(msg);
    mac
}

/// Writes the prefix of a wrapped initiation for `shard` of a tunnel in front of the
/// WireGuard initiation that starts at `buf[INIT_PREFIX_LEN..]`.
pub fn emit_init_prefix(buf: &mut [u8], tag: &[u8; TAG_LEN], shard: u8) {
    buf[0] = KIND_INIT;
    buf[1] = VERSION;
    buf[2] = shard;
    buf[3] = 0;
    buf[4..INIT_PREFIX_LEN].copy_from_slice(tag);
}

/// Writes a relay header for `session` into `buf[..RELAY_HEADER_LEN]`.
pub fn emit_relay_header(buf: &mut [u8], session: u32) {
    buf[0] = KIND_RELAY;
    buf[1] = VERSION;
    buf[2] = 0;
    buf[3] = 0;
    buf[4..RELAY_HEADER_LEN].copy_from_slice(&session.to_be_bytes());
}

/// The session of a relayed datagram and the datagram it carries.
pub fn parse_relay(datagram: &[u8]) -> Option<(u32, &[u8])> {
    let header = datagram.get(..RELAY_HEADER_LEN)?;
    if header[0] != KIND_RELAY || header[1] != VERSION {
        return None;
    }
    let session = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    Some((session, &datagram[RELAY_HEADER_LEN..]))
}

/// Whether a decrypted packet is a control packet rather than a host's.
pub fn is_control(packet: &[u8]) -> bool {
    packet.len() >= 20
        && packet[0] >> 4 == 4
        && packet[9] == CONTROL_PROTOCOL
        && packet[12..20] == [0; 8]
}

/// A control message between two members, inside their tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// The sender's addresses.
    Announce(Announce),
    /// "Carry my traffic to `target`": sent to a member both ends can reach. `endpoint` is
    /// where the sender last knew the target, for a relay that has no tunnel with it yet.
    RelayRequest {
        /// The member to reach.
        target: [u8; 32],
        /// Where it may be.
        endpoint: SocketAddr,
    },
    /// "I carry relay `session` between you and `peer`", sent by the relay to both ends.
    RelayOffer {
        /// The member at the other end.
        peer: [u8; 32],
        /// Where the relay sees it.
        endpoint: SocketAddr,
        /// The session id to put in front of datagrams sent through the relay.
        session: u32,
    },
    /// A path probe (answered with `ack` set, on the path it came by): measures the round
    /// trip and tells whether the direct path works.
    Probe {
        /// Matches an answer to its probe.
        nonce: u32,
        /// Set on the answer.
        ack: bool,
    },
    /// The sender's underlay links (bonding, issue 32): where it listens on each and the
    /// rate it takes there, bits a second. Sent only to members whose announcement set
    /// [`Announce::uplinks`]; at most [`MAX_UPLINKS`]; none means "do not bond to me".
    Uplinks(Vec<(SocketAddr, u64)>),
    /// A layer-2 namespace: part `part` of `parts` of every MAC the sender holds there,
    /// the only ones its frames may come from ([`MacParts`]). Sent with each announcement.
    Macs(MacPart),
    /// Part `part` of `parts` of every address the sender holds, when it holds more than
    /// one announcement carries ([`Announce::in_parts`]).
    Addresses(AddressPart),
}

impl Control {
    /// Builds the control packet.
    pub fn emit(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        match self {
            Control::Announce(a) => return a.emit(),
            Control::RelayRequest { target, endpoint } => {
                body.extend_from_slice(RELAY_REQUEST_MAGIC);
                body.extend_from_slice(target);
                emit_endpoint(&mut body, *endpoint);
            }
            Control::RelayOffer {
                peer,
                endpoint,
                session,
            } => {
                body.extend_from_slice(RELAY_OFFER_MAGIC);
                body.extend_from_slice(peer);
                emit_endpoint(&mut body, *endpoint);
                body.extend_from_slice(&session.to_be_bytes());
            }
            Control::Probe { nonce, ack } => {
                body.extend_from_slice(PROBE_MAGIC);
                body.push(if *ack { FLAG_ACK } else { 0 });
                body.extend_from_slice(&nonce.to_be_bytes());
            }
            Control::Uplinks(links) => {
                let n = links.len().min(MAX_UPLINKS);
                body.extend_from_slice(UPLINKS_MAGIC);
                body.push(n as u8);
                for (endpoint, rate) in &links[..n] {
                    emit_endpoint(&mut body, *endpoint);
                    body.extend_from_slice(&rate.to_be_bytes());
                }
            }
            Control::Addresses(p) => {
                // (Parts come from `AddressPart::split`; a longer one is cut.)
                let mut taken = Vec::new();
                let mut bytes = 0;
                for a in &p.addresses {
                    bytes += address_len(a);
                    if bytes > MAX_ADDRESS_BYTES_PER_PART {
                        break;
                    }
                    taken.push(*a);
                }
                let v4 = taken.iter().filter_map(|a| match a {
                    IpAddr::V4(a) => Some(a.octets()),
                    IpAddr::V6(_) => None,
                });
                let v6 = taken.iter().filter_map(|a| match a {
                    IpAddr::V6(a) => Some(a.octets()),
                    IpAddr::V4(_) => None,
                });
                body.extend_from_slice(ADDRESSES_MAGIC);
                body.extend_from_slice(&p.generation.to_be_bytes());
                body.push(p.part);
                body.push(p.parts);
                body.extend_from_slice(&(v4.clone().count() as u16).to_be_bytes());
                body.extend_from_slice(&(v6.clone().count() as u16).to_be_bytes());
                v4.for_each(|a| body.extend_from_slice(&a));
                v6.for_each(|a| body.extend_from_slice(&a));
            }
            Control::Macs(p) => {
                let n = p.macs.len().min(MAX_MACS_PER_PART);
                body.extend_from_slice(MACS_MAGIC);
                body.extend_from_slice(&p.generation.to_be_bytes());
                body.push(p.part);
                body.push(p.parts);
                body.extend_from_slice(&(n as u16).to_be_bytes());
                for mac in &p.macs[..n] {
                    body.extend_from_slice(mac);
                }
            }
        }
        control_packet(&body)
    }

    /// Parses a control packet; `None` if it is not a well-formed control message.
    pub fn parse(packet: &[u8]) -> Option<Self> {
        let header_len = usize::from(*packet.first()? & 0x0f) * 4;
        let body = packet.get(header_len..)?;
        let (magic, rest) = (body.get(..4)?, body.get(4..)?);
        match magic {
            m if m == ANNOUNCE_MAGIC => Announce::parse(packet).map(Control::Announce),
            m if m == RELAY_REQUEST_MAGIC => Some(Control::RelayRequest {
                target: array32(rest)?,
                endpoint: parse_endpoint(rest.get(32..)?)?,
            }),
            m if m == RELAY_OFFER_MAGIC => {
                let session = rest.get(32 + ENDPOINT_LEN..32 + ENDPOINT_LEN + 4)?;
                Some(Control::RelayOffer {
                    peer: array32(rest)?,
                    endpoint: parse_endpoint(rest.get(32..)?)?,
                    session: u32::from_be_bytes([session[0], session[1], session[2], session[3]]),
                })
            }
            m if m == PROBE_MAGIC => {
                let b = rest.get(..5)?;
                Some(Control::Probe {
                    ack: b[0] & FLAG_ACK != 0,
                    nonce: u32::from_be_bytes([b[1], b[2], b[3], b[4]]),
                })
            }
            m if m == UPLINKS_MAGIC => {
                let n = usize::from(*rest.first()?);
                let each = ENDPOINT_LEN + 8;
                if n > MAX_UPLINKS || rest.len() != 1 + n * each {
                    return None;
                }
                let links = rest[1..]
                    .chunks_exact(each)
                    .map(|c| {
                        let rate = u64::from_be_bytes(c[ENDPOINT_LEN..].try_into().ok()?);
                        Some((parse_endpoint(c)?, rate))
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some(Control::Uplinks(links))
            }
            m if m == MACS_MAGIC => {
                let head = rest.get(..6)?;
                let (part, parts) = (head[2], head[3]);
                let n = usize::from(u16::from_be_bytes([head[4], head[5]]));
                if n > MAX_MACS_PER_PART
                    || rest.len() != 6 + 6 * n
                    || parts == 0
                    || part >= parts
                    || usize::from(parts) > MAX_MAC_PARTS
                {
                    return None;
                }
                let macs = rest[6..]
                    .chunks_exact(6)
                    .map(|c| <[u8; 6]>::try_from(c).ok())
                    .collect::<Option<Vec<_>>>()?;
                Some(Control::Macs(MacPart {
                    generation: u16::from_be_bytes([head[0], head[1]]),
                    part,
                    parts,
                    macs,
                }))
            }
            m if m == ADDRESSES_MAGIC => {
                let head = rest.get(..8)?;
                let (part, parts) = (head[2], head[3]);
                let n4 = usize::from(u16::from_be_bytes([head[4], head[5]]));
                let n6 = usize::from(u16::from_be_bytes([head[6], head[7]]));
                let bytes = 4 * n4 + 16 * n6;
                if bytes > MAX_ADDRESS_BYTES_PER_PART
                    || rest.len() != 8 + bytes
                    || parts == 0
                    || part >= parts
                    || usize::from(parts) > MAX_ADDRESS_PARTS
                {
                    return None;
                }
                let (v4, v6) = rest[8..].split_at(4 * n4);
                let v4 = v4
                    .chunks_exact(4)
                    .map(|c| IpAddr::V4(Ipv4Addr::new(c[0], c[1], c[2], c[3])));
                let v6 = v6
                    .chunks_exact(16)
                    .filter_map(|c| <[u8; 16]>::try_from(c).ok())
                    .map(|c| IpAddr::V6(Ipv6Addr::from(c)));
                Some(Control::Addresses(AddressPart {
                    generation: u16::from_be_bytes([head[0], head[1]]),
                    part,
                    parts,
                    addresses: v4.chain(v6).collect(),
                }))
            }
            _ => None,
        }
    }
}

/// An IPv4 packet from and to 0.0.0.0, protocol [`CONTROL_PROTOCOL`], carrying `body`.
fn control_packet(body: &[u8]) -> Vec<u8> {
    let total = 20 + body.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 1, CONTROL_PROTOCOL, 0, 0]);
    p.extend_from_slice(&[0; 8]); // from and to 0.0.0.0
    p.extend_from_slice(body);
    p
}

fn array32(b: &[u8]) -> Option<[u8; 32]> {
    b.get(..32)?.try_into().ok()
}

fn emit_endpoint(out: &mut Vec<u8>, endpoint: SocketAddr) {
    let mut ip = [0u8; 16];
    match endpoint.ip() {
        IpAddr::V4(a) => {
            out.push(4);
            ip[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out.push(6);
            ip.copy_from_slice(&a.octets());
        }
    }
    out.extend_from_slice(&ip);
    out.extend_from_slice(&endpoint.port().to_be_bytes());
}

fn parse_endpoint(b: &[u8]) -> Option<SocketAddr> {
    let b = b.get(..ENDPOINT_LEN)?;
    let port = u16::from_be_bytes([b[17], b[18]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::new(b[1], b[2], b[3], b[4])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[1..17]).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Most shards a tunnel has: WireGuard sessions of one member pair, one per worker, each
/// inner flow on one of them (see `node/shared.rs`). Receiver indices carry the shard in 3
/// bits.
pub const MAX_SHARDS: u8 = 8;

/// An address announcement: the virtual addresses a member owns in a namespace, and how
/// many shards its tunnels may have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    /// Set when the sender already has the receiver's announcement.
    pub have_yours: bool,
    /// Set by an agent that reads [`Control::Uplinks`] (a flag bit older agents ignore).
    pub uplinks: bool,
    /// Set by an agent that reads IPv6 address lists (a flag bit older agents ignore).
    pub addresses6: bool,
    /// The sender's IPv6 addresses in a dual-stack namespace (at most [`MAX_ANNOUNCED`]),
    /// the only IPv6 sources its packets may have: sent only to members whose
    /// announcement set [`Announce::addresses6`] (an older agent's parser refuses a longer
    /// announcement). `None`: not sent.
    pub list6: Option<Vec<Ipv6Addr>>,
    /// Set by an agent that reads [`Control::Addresses`] parts (a flag bit older agents
    /// ignore).
    pub reads_parts: bool,
    /// The sender's whole lists follow in [`Control::Addresses`] parts of this generation
    /// (its lists here are their first [`MAX_ANNOUNCED`] only): sent only to members that
    /// set [`Announce::reads_parts`]. `None`: the lists here are whole.
    pub in_parts: Option<u16>,
    /// The sender's addresses.
    pub addresses: Vec<Ipv4Addr>,
    /// Shards the sender accepts, 1 to [`MAX_SHARDS`] (a trailing byte: an agent that
    /// does not send it accepts 1, one that does not read it ignores it).
    pub shards: u8,
    /// The sender's certificate in a namespace with an authority (after the shard
    /// count: a 2-byte length and the bytes; empty: none).
    pub certificate: Vec<u8>,
}

impl Announce {
    /// Builds the control packet (an IPv4 packet, see the module doc).
    pub fn emit(&self) -> Vec<u8> {
        let n = self.addresses.len().min(MAX_ANNOUNCED);
        let mut body = Vec::with_capacity(6 + 4 * n);
        body.extend_from_slice(ANNOUNCE_MAGIC);
        let mut flags = if self.have_yours { FLAG_HAVE_YOURS } else { 0 };
        if self.uplinks {
            flags |= FLAG_UPLINKS;
        }
        if self.addresses6 {
            flags |= FLAG_ADDRESSES6;
        }
        if self.list6.is_some() {
            flags |= FLAG_LIST6;
        }
        if self.reads_parts {
            flags |= FLAG_READS_PARTS;
        }
        if self.in_parts.is_some() {
            flags |= FLAG_IN_PARTS;
        }
        body.push(flags);
        body.push(n as u8);
        for a in &self.addresses[..n] {
            body.extend_from_slice(&a.octets());
        }
        body.push(self.shards.clamp(1, MAX_SHARDS));
        let certificate = Some(&self.certificate[..])
            .filter(|c| !c.is_empty() && c.len() <= crate::cert::MAX_CERT_LEN)
            .unwrap_or_default();
        if !certificate.is_empty() || self.list6.is_some() || self.in_parts.is_some() {
            body.extend_from_slice(&(certificate.len() as u16).to_be_bytes());
            body.extend_from_slice(certificate);
        }
        if let Some(list) = &self.list6 {
            let n6 = list.len().min(MAX_ANNOUNCED);
            body.push(n6 as u8);
            for a in &list[..n6] {
                body.extend_from_slice(&a.octets());
            }
        }
        if let Some(generation) = self.in_parts {
            body.extend_from_slice(&generation.to_be_bytes());
        }
        control_packet(&body)
    }

    /// Parses a control packet; `None` if it is not a well-formed announcement.
    pub fn parse(packet: &[u8]) -> Option<Self> {
        let header_len = usize::from(*packet.first()? & 0x0f) * 4;
        let body = packet.get(header_len..)?;
        if body.get(..4)? != ANNOUNCE_MAGIC {
            return None;
        }
        let flags = *body.get(4)?;
        let n = usize::from(*body.get(5)?);
        if n > MAX_ANNOUNCED {
            return None;
        }
        let list = body.get(6..6 + 4 * n)?;
        let shards = body.get(6 + 4 * n).copied().unwrap_or(1);
        let tail = flags & (FLAG_LIST6 | FLAG_IN_PARTS) != 0;
        let (certificate, list6, in_parts) = match body.get(7 + 4 * n..) {
            None | Some([]) if !tail => (Vec::new(), None, None),
            None | Some([]) => return None,
            Some(rest) => {
                let len = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
                let cert = rest.get(2..2 + len)?;
                let mut after = &rest[2 + len..];
                if len > crate::cert::MAX_CERT_LEN {
                    return None;
                }
                let list6 = if flags & FLAG_LIST6 == 0 {
                    None
                } else {
                    let n6 = usize::from(*after.first()?);
                    let list = after.get(1..1 + 16 * n6).filter(|_| n6 <= MAX_ANNOUNCED)?;
                    let list = list
                        .chunks_exact(16)
                        .map(|c| <[u8; 16]>::try_from(c).ok().map(Ipv6Addr::from))
                        .collect::<Option<Vec<_>>>()?;
                    after = &after[1 + 16 * n6..];
                    Some(list)
                };
                let in_parts = if flags & FLAG_IN_PARTS == 0 {
                    None
                } else {
                    let g = after.get(..2)?;
                    let generation = u16::from_be_bytes([g[0], g[1]]);
                    after = &after[2..];
                    Some(generation)
                };
                if !after.is_empty() {
                    return None;
                }
                (cert.to_vec(), list6, in_parts)
            }
        };
        Some(Self {
            have_yours: flags & FLAG_HAVE_YOURS != 0,
            uplinks: flags & FLAG_UPLINKS != 0,
            addresses6: flags & FLAG_ADDRESSES6 != 0,
            list6,
            reads_parts: flags & FLAG_READS_PARTS != 0,
            in_parts,
            addresses: list
                .chunks_exact(4)
                .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]))
                .collect(),
            shards: shards.clamp(1, MAX_SHARDS),
            certificate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;

    #[test]
    fn hello_round_trip_and_mac() {
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let other = NamespaceKeys::derive("lab", b"another secret!!");
        let me = Identity::from_seed([3; 32]).peer_id();
        let h = Hello::emit(&keys, &me, true);
        let parsed = Hello::parse(&h).unwrap();
        assert!(parsed.reply);
        assert_eq!(&parsed.peer, me.as_bytes());
        assert_eq!(parsed.tag, keys.tag());
        assert_eq!(Hello::verify(&h, &keys), Ok(()));
        assert_eq!(Hello::verify(&h, &other), Err(HelloError::BadMac));
        let mut forged = h;
        forged[20] ^= 1;
        assert_eq!(Hello::verify(&forged, &keys), Err(HelloError::BadMac));
        for n in 0..HELLO_LEN {
            assert_eq!(Hello::parse(&h[..n]), Err(HelloError::Malformed));
        }
    }

    #[test]
    fn ipv6_lists_ride_the_announcement_and_malformed_ones_are_refused() {
        let list: Vec<Ipv6Addr> = (1..=3u128)
            .map(|i| Ipv6Addr::from(0xfd00_0000_0000_0000_0000_0000_0000_0000 | i))
            .collect();
        for certificate in [Vec::new(), vec![7u8; 40]] {
            let a = Announce {
                have_yours: false,
                uplinks: true,
                addresses6: true,
                list6: Some(list.clone()),
                reads_parts: false,
                in_parts: None,
                addresses: vec![Ipv4Addr::new(10, 201, 0, 1)],
                shards: 2,
                certificate,
            };
            let p = a.emit();
            assert_eq!(Announce::parse(&p), Some(a.clone()));
            // Short, long, or counting more than it carries: refused.
            assert_eq!(Announce::parse(&p[..p.len() - 1]), None);
            let mut long = p.clone();
            long.push(0);
            assert_eq!(Announce::parse(&long), None);
            // An empty list says "none"; without the flag nothing may follow the certificate.
            let none = Announce {
                list6: Some(Vec::new()),
                ..a.clone()
            };
            assert_eq!(Announce::parse(&none.emit()), Some(none));
            let plain = Announce { list6: None, ..a };
            assert_eq!(Announce::parse(&plain.emit()), Some(plain));
        }
        // At most MAX_ANNOUNCED are sent.
        let many = Announce {
            have_yours: true,
            uplinks: true,
            addresses6: true,
            list6: Some((0..MAX_ANNOUNCED as u128 + 5).map(Ipv6Addr::from).collect()),
            reads_parts: false,
            in_parts: None,
            addresses: Vec::new(),
            shards: 1,
            certificate: Vec::new(),
        };
        let sent = Announce::parse(&many.emit()).and_then(|a| a.list6);
        assert_eq!(sent.map(|l| l.len()), Some(MAX_ANNOUNCED));
    }

    #[test]
    fn lists_beyond_an_announcement_travel_in_parts_of_its_generation() {
        let v4: Vec<Ipv4Addr> = (0..300u32)
            .map(|i| Ipv4Addr::from(0x0ac9_0000 + i))
            .collect();
        let v6: Vec<Ipv6Addr> = (0..100u128)
            .map(|i| Ipv6Addr::from(0xfd00_u128 << 112 | i))
            .collect();
        // The announcement says who reads parts and which generation its lists are in.
        for list6 in [None, Some(v6[..MAX_ANNOUNCED].to_vec())] {
            for certificate in [Vec::new(), vec![7u8; 40]] {
                let a = Announce {
                    have_yours: true,
                    uplinks: true,
                    addresses6: true,
                    list6: list6.clone(),
                    reads_parts: true,
                    in_parts: Some(0xbeef),
                    addresses: v4[..MAX_ANNOUNCED].to_vec(),
                    shards: 2,
                    certificate,
                };
                let p = a.emit();
                assert_eq!(Announce::parse(&p), Some(a.clone()));
                assert_eq!(Announce::parse(&p[..p.len() - 1]), None);
                let mut long = p.clone();
                long.push(0);
                assert_eq!(Announce::parse(&long), None);
                let whole = Announce {
                    in_parts: None,
                    ..a
                };
                assert_eq!(Announce::parse(&whole.emit()), Some(whole));
            }
        }
        // 300 IPv4 and 100 IPv6 addresses: 1200 + 1600 bytes, in parts of at most 1024.
        let parts = AddressPart::split(7, &v4, &v6);
        assert_eq!(parts.len(), 3);
        let mut gathered = AddressParts::default();
        let mut whole = None;
        // Out of order, one twice, through the wire: whole once every part is in.
        for i in [2, 0, 0, 1] {
            let p = Control::Addresses(parts[i].clone()).emit();
            assert!(p.len() <= 20 + 12 + MAX_ADDRESS_BYTES_PER_PART);
            let Some(Control::Addresses(part)) = Control::parse(&p) else {
                panic!("part {i} does not parse");
            };
            assert_eq!(part, parts[i]);
            assert!(whole.is_none());
            whole = gathered.take(part);
        }
        let (generation, mut all) = whole.expect("whole after the last part");
        assert_eq!(generation, 7);
        let mut expected: Vec<IpAddr> = v4.iter().map(|a| IpAddr::V4(*a)).collect();
        expected.extend(v6.iter().map(|a| IpAddr::V6(*a)));
        all.sort();
        expected.sort();
        assert_eq!(all, expected);
        // A part of the next generation starts over: the old parts never mix in.
        let next = AddressPart::split(8, &v4[..10], &[]);
        assert_eq!(next.len(), 1);
        assert_eq!(gathered.take(parts[0].clone()), None);
        assert_eq!(
            gathered.take(next[0].clone()).map(|(g, l)| (g, l.len())),
            Some((8, 10))
        );
        // What does not fit MAX_ADDRESS_PARTS is left out.
        let lots: Vec<Ipv4Addr> = (0..10_000u32).map(Ipv4Addr::from).collect();
        let cut = AddressPart::split(1, &lots, &[]);
        assert_eq!(cut.len(), MAX_ADDRESS_PARTS);
        assert_eq!(
            cut.iter().map(|p| p.addresses.len()).sum::<usize>(),
            MAX_ADDRESS_PARTS * MAX_ADDRESS_BYTES_PER_PART / 4
        );
        // The two families share the room, but the first of each always fit: an IPv4 list
        // too long does not push the IPv6 one out.
        let both = AddressPart::split(1, &lots, &v6);
        let sent6 = both
            .iter()
            .flat_map(|p| &p.addresses)
            .filter(|a| a.is_ipv6())
            .count();
        assert_eq!(sent6, MAX_ANNOUNCED);
        // Malformed parts: counts beyond the bytes or the limit, a part past the count.
        let good = Control::Addresses(parts[1].clone()).emit();
        assert_eq!(Control::parse(&good[..good.len() - 1]), None);
        let mut long = good.clone();
        long.extend_from_slice(&[0; 4]);
        assert_eq!(Control::parse(&long), None);
        let body = 20 + 4;
        for (at, value) in [(2, 3u8), (3, 0), (3, 33)] {
            let mut bad = good.clone();
            bad[body + at] = value;
            assert_eq!(Control::parse(&bad), None, "byte {at} = {value}");
        }
        let mut over = good;
        over[body + 4..body + 6].copy_from_slice(&257u16.to_be_bytes());
        assert_eq!(Control::parse(&over), None);
    }

    #[test]
    fn an_ipv6_packet_is_never_taken_for_a_control_packet() {
        // Bytes 9 and 12..20 of an IPv6 header lie in its source address: one whose
        // bytes match the control pattern is still a host's packet.
        let mut p = vec![0u8; 60];
        p[0] = 0x60;
        p[9] = CONTROL_PROTOCOL;
        assert!(!is_control(&p));
        p[0] = 0x45;
        assert!(is_control(&p));
    }

    #[test]
    fn announce_round_trip_and_truncation() {
        let a = Announce {
            have_yours: true,
            uplinks: true,
            addresses6: true,
            list6: None,
            reads_parts: false,
            in_parts: None,
            addresses: vec![Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 7)],
            shards: 4,
            certificate: Vec::new(),
        };
        let p = a.emit();
        assert!(is_control(&p));
        assert_eq!(Announce::parse(&p), Some(a.clone()));
        assert_eq!(Control::parse(&p), Some(Control::Announce(a.clone())));
        // Without the trailing shard count (an older agent's), one shard.
        assert_eq!(
            Announce::parse(&p[..p.len() - 1]),
            Some(Announce {
                shards: 1,
                ..a.clone()
            })
        );
        for n in 0..p.len() - 1 {
            assert_eq!(Announce::parse(&p[..n]), None);
        }
        // An older agent's flags: no uplinks.
        let mut older = p.clone();
        older[24] = FLAG_HAVE_YOURS;
        assert_eq!(
            Announce::parse(&older).map(|x| (x.have_yours, x.uplinks)),
            Some((true, false))
        );

        // With a certificate: round trip; any cut into it, or a byte more, is malformed.
        let c = Announce {
            certificate: vec![0xc3; 300],
            ..a.clone()
        };
        let p = c.emit();
        assert_eq!(Announce::parse(&p), Some(c));
        for n in p.len() - 301..p.len() {
            assert_eq!(Announce::parse(&p[..n]), None, "{n}");
        }
        let mut longer = p.clone();
        longer.push(0);
        assert_eq!(Announce::parse(&longer), None);
        // One too large to be a certificate is not sent.
        let huge = Announce {
            certificate: vec![1; crate::cert::MAX_CERT_LEN + 1],
            ..a
        };
        assert_eq!(
            Announce::parse(&huge.emit()).map(|x| x.certificate),
            Some(Vec::new())
        );
    }

    #[test]
    fn control_round_trip_and_truncation() {
        let messages = [
            Control::RelayRequest {
                target: [7; 32],
                endpoint: "10.200.0.3:7400".parse().unwrap(),
            },
            Control::RelayOffer {
                peer: [9; 32],
                endpoint: "[fd00::1]:7401".parse().unwrap(),
                session: 0xdead_beef,
            },
            Control::Probe {
                nonce: 42,
                ack: true,
            },
            Control::Probe {
                nonce: 7,
                ack: false,
            },
            Control::Uplinks(vec![
                ("10.201.0.1:7400".parse().unwrap(), 200_000_000),
                ("[fd00::2]:7400".parse().unwrap(), 100_000_000),
            ]),
            Control::Uplinks(Vec::new()),
            Control::Macs(MacPart {
                generation: 7,
                part: 1,
                parts: 3,
                macs: vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]],
            }),
            Control::Macs(MacPart::split(0, &[]).remove(0)),
        ];
        for m in messages {
            let p = m.emit();
            assert!(is_control(&p));
            assert_eq!(Control::parse(&p), Some(m));
            for n in 0..p.len() {
                assert_eq!(Control::parse(&p[..n]), None, "truncated to {n}");
            }
        }
        let mut bad_family = Control::RelayRequest {
            target: [1; 32],
            endpoint: "10.0.0.1:1".parse().unwrap(),
        }
        .emit();
        bad_family[20 + 4 + 32] = 5;
        assert_eq!(Control::parse(&bad_family), None);
        let mut unknown = Control::Probe {
            nonce: 1,
            ack: false,
        }
        .emit();
        unknown[20..24].copy_from_slice(b"HYZ9");
        assert_eq!(Control::parse(&unknown), None);
        // More uplinks than a member may have, or a count the bytes do not match: refused.
        let nine = Control::Uplinks(vec![("10.0.0.1:1".parse().unwrap(), 1); 9]).emit();
        assert_eq!(
            Control::parse(&nine),
            Some(Control::Uplinks(vec![
                ("10.0.0.1:1".parse().unwrap(), 1);
                MAX_UPLINKS
            ])),
            "only the first eight are sent"
        );
        let mut lying = Control::Uplinks(vec![("10.0.0.1:1".parse().unwrap(), 1)]).emit();
        lying[24] = 2;
        assert_eq!(Control::parse(&lying), None);
        lying[24] = 9;
        assert_eq!(Control::parse(&lying), None);
        // MACs: a count the bytes do not match, over the bound, or a part out of its
        // parts, is refused.
        let one = MacPart::split(3, &[[2, 0, 0, 0, 0, 1]]).remove(0);
        let mut lying = Control::Macs(one.clone()).emit();
        lying[29] = 2;
        assert_eq!(Control::parse(&lying), None);
        let mut over = vec![0u8; 20 + 10 + 6 * (MAX_MACS_PER_PART + 1)];
        over[..30].copy_from_slice(&Control::Macs(MacPart::split(0, &[]).remove(0)).emit());
        over[28..30].copy_from_slice(&((MAX_MACS_PER_PART + 1) as u16).to_be_bytes());
        assert_eq!(Control::parse(&over), None);
        for (part, parts) in [(1, 1), (0, 0), (0, MAX_MAC_PARTS as u8 + 1)] {
            let mut bad = Control::Macs(one.clone()).emit();
            bad[26] = part;
            bad[27] = parts;
            assert_eq!(Control::parse(&bad), None, "part {part} of {parts}");
        }
    }

    #[test]
    fn a_mac_announcement_of_many_parts_stands_once_all_its_parts_are_in() {
        let many: Vec<[u8; 6]> = (0..MAX_ANNOUNCED_MACS as u16 + 10)
            .map(|i| [2, 0, 0, 0, (i >> 8) as u8, i as u8])
            .collect();
        let parts = MacPart::split(9, &many);
        assert_eq!(
            parts.len(),
            MAX_MAC_PARTS,
            "at most MAX_ANNOUNCED_MACS are sent"
        );
        for p in &parts {
            let bytes = Control::Macs(p.clone()).emit();
            assert!(
                bytes.len() <= 1280,
                "{} bytes: over the smallest tunnel MTU",
                bytes.len()
            );
            assert_eq!(Control::parse(&bytes), Some(Control::Macs(p.clone())));
        }
        // In any order, a part twice: the set stands when the last one arrives.
        let mut whole = MacParts::default();
        for i in [4, 0, 0, 2, 1] {
            assert_eq!(whole.take(parts[i].clone()), None);
        }
        let mut got = whole.take(parts[3].clone()).unwrap();
        got.sort_unstable();
        assert_eq!(got, many[..MAX_ANNOUNCED_MACS].to_vec());
        // A new generation midway: the old one's parts are forgotten.
        let next = MacPart::split(10, &many[..450]);
        assert_eq!(next.len(), 3);
        assert_eq!(whole.take(parts[0].clone()), None);
        assert_eq!(whole.take(next[0].clone()), None);
        assert_eq!(whole.take(parts[1].clone()), None);
        assert_eq!(
            whole.take(next[1].clone()),
            None,
            "generation 9's part reset it"
        );
        assert_eq!(whole.take(next[2].clone()), None);
        assert_eq!(whole.take(next[0].clone()).map(|m| m.len()), Some(450));
        // The empty set is one part.
        assert_eq!(
            whole.take(MacPart::split(11, &[]).remove(0)),
            Some(Vec::new())
        );
    }

    #[test]
    fn relay_header_round_trip() {
        let mut d = vec![0u8; RELAY_HEADER_LEN + 3];
        emit_relay_header(&mut d, 0x0102_0304);
        d[RELAY_HEADER_LEN..].copy_from_slice(&[4, 5, 6]);
        assert_eq!(parse_relay(&d), Some((0x0102_0304, &[4u8, 5, 6][..])));
        for n in 0..RELAY_HEADER_LEN {
            assert_eq!(parse_relay(&d[..n]), None);
        }
        d[1] = 9;
        assert_eq!(parse_relay(&d), None);
    }

    /// One captured datagram of every kind (a real hello; the WireGuard messages with
    /// their fixed headers and filler), parsed once, and every truncation of each.
    #[test]
    fn datagram_parse_of_every_kind() {
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let me = Identity::from_seed([3; 32]).peer_id();
        let hello = Hello::emit(&keys, &me, false);
        match Datagram::parse(&hello) {
            Ok(Datagram::Hello { hello: h, bytes }) => {
                assert!(!h.reply);
                assert_eq!(h.tag, keys.tag());
                assert_eq!(bytes, &hello[..]);
            }
            other => panic!("{other:?}"),
        }

        let mut init = vec![0u8; INIT_PREFIX_LEN + WG_INIT_LEN];
        emit_init_prefix(&mut init, &keys.tag(), 3);
        init[INIT_PREFIX_LEN] = KIND_WG_INIT;
        assert_eq!(
            Datagram::parse(&init),
            Ok(Datagram::Tunnel(TunnelMessage::Init {
                tag: keys.tag(),
                shard: 3,
                message: &init[INIT_PREFIX_LEN..],
            }))
        );

        // Data and cookie carry our index at 4..8, a response at 8..12 (little-endian).
        let data = [4, 0, 0, 0, 0x01, 0x02, 0, 0, 9, 9, 9, 9];
        let response = [2, 0, 0, 0, 7, 7, 7, 7, 0x01, 0x03, 0, 0];
        let cookie = [3, 0, 0, 0, 0x01, 0x04, 0, 0];
        for (d, kind, receiver) in [
            (&data[..], KIND_WG_DATA, 0x0201),
            (&response[..], KIND_WG_RESPONSE, 0x0301),
            (&cookie[..], KIND_WG_COOKIE, 0x0401),
        ] {
            assert_eq!(
                Datagram::parse(d),
                Ok(Datagram::Tunnel(TunnelMessage::WireGuard {
                    kind,
                    receiver,
                    message: d,
                }))
            );
        }

        let mut relayed = vec![0u8; RELAY_HEADER_LEN + data.len()];
        emit_relay_header(&mut relayed, 0xdead_beef);
        relayed[RELAY_HEADER_LEN..].copy_from_slice(&data);
        assert_eq!(
            Datagram::parse(&relayed),
            Ok(Datagram::Relayed {
                session: 0xdead_beef,
                bytes: &relayed,
                inner: Ok(TunnelMessage::WireGuard {
                    kind: KIND_WG_DATA,
                    receiver: 0x0201,
                    message: &relayed[RELAY_HEADER_LEN..],
                }),
            })
        );

        // Truncations: never a panic, always a reason.
        for d in [&hello[..], &init, &data, &response, &cookie, &relayed] {
            assert!(Datagram::parse(d).is_ok());
            for n in 0..d.len() {
                let _ = Datagram::parse(&d[..n]);
            }
        }
        assert_eq!(Datagram::parse(&[]), Err(ParseError::Empty));
        assert_eq!(Datagram::parse(&hello[..59]), Err(ParseError::Hello));
        assert_eq!(
            Datagram::parse(&init[..11]),
            Err(ParseError::Truncated(KIND_INIT))
        );
        assert_eq!(
            Datagram::parse(&data[..7]),
            Err(ParseError::Truncated(KIND_WG_DATA))
        );
        assert_eq!(
            Datagram::parse(&response[..11]),
            Err(ParseError::Truncated(KIND_WG_RESPONSE))
        );
        assert_eq!(
            Datagram::parse(&relayed[..7]),
            Err(ParseError::Truncated(KIND_RELAY))
        );
    }

    #[test]
    fn datagram_parse_refuses_what_no_member_sends() {
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let mut bare = vec![0u8; WG_INIT_LEN];
        bare[0] = KIND_WG_INIT;
        assert_eq!(Datagram::parse(&bare), Err(ParseError::BareInitiation));
        assert_eq!(Datagram::parse(&[0]), Err(ParseError::UnknownKind(0)));
        assert_eq!(
            Datagram::parse(&[0xff; 64]),
            Err(ParseError::UnknownKind(0xff))
        );
        let mut hello = Hello::emit(&keys, &Identity::from_seed([3; 32]).peer_id(), true);
        hello[1] = VERSION + 1;
        assert_eq!(Datagram::parse(&hello), Err(ParseError::Hello));

        // A relay header of another version is refused; what a relayed datagram carries is
        // parsed for its ends, but a relay forwards it all the same.
        let mut relayed = vec![0u8; RELAY_HEADER_LEN];
        emit_relay_header(&mut relayed, 1);
        relayed[1] = VERSION + 1;
        assert_eq!(Datagram::parse(&relayed), Err(ParseError::RelayVersion));
        for (inner, why) in [
            (&[][..], ParseError::Empty),
            (&hello[..], ParseError::UnknownKind(KIND_HELLO)),
            (&bare[..], ParseError::BareInitiation),
            (
                &[KIND_RELAY, VERSION, 0, 0, 0, 0, 0, 1][..],
                ParseError::UnknownKind(KIND_RELAY),
            ),
        ] {
            let mut d = vec![0u8; RELAY_HEADER_LEN];
            emit_relay_header(&mut d, 5);
            d.extend_from_slice(inner);
            match Datagram::parse(&d) {
                Ok(Datagram::Relayed {
                    session: 5, inner, ..
                }) => assert_eq!(inner, Err(why)),
                other => panic!("{other:?}"),
            }
        }
    }
}

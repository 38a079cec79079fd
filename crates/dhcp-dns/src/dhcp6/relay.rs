//! Relay agents (RFC 8415 9, 13.1, 19): the RELAY-FORW wrappers a relayed request comes in,
//! the RELAY-REPL ones its answer goes back in, and the client's link they name.

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

/// Relay agents a message may have passed (RFC 8415 7.6's HOP_COUNT_LIMIT).
pub const MAX_RELAYS: usize = 8;
/// RELAY-FORW and RELAY-REPL (RFC 8415 7.3).
pub(super) const RELAY_FORW: u8 = 12;
pub(super) const RELAY_REPL: u8 = 13;
/// A relay message's fixed part: type, hop count, link-address, peer-address.
pub(super) const RELAY_HEADER: usize = 34;
/// The Relay Message and Interface-ID options (RFC 8415 21.10, 21.18).
const OPTION_RELAY_MSG: u16 = 9;
const OPTION_INTERFACE_ID: u16 = 18;

/// One relay agent a request passed (RFC 8415 9): what its RELAY-REPL repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hop {
    pub(super) hop_count: u8,
    pub(super) link: Ipv6Addr,
    pub(super) peer: Ipv6Addr,
    pub(super) interface_id: Option<Vec<u8>>,
}

/// Where a request came from and its answer goes: the sender on the LAN (the client, or
/// the nearest relay agent), and the relays it passed, nearest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Path {
    pub(super) sender: (Ipv6Addr, [u8; 6]),
    pub(super) relays: Vec<Hop>,
}

impl Path {
    /// The address that names the client's link: the link-address of the relay nearest
    /// the client that set one (RFC 8415 13.1: a zero one, as lightweight relays in
    /// switches send, is ignored); none for the agent's own LAN.
    pub(super) fn link_address(&self) -> Option<Ipv6Addr> {
        let mut links = self.relays.iter().rev().map(|h| h.link);
        links.find(|a| !a.is_unspecified())
    }

    /// The part of `prefix` the client's link has. In a prefix wider than a /64 (a site of
    /// /64 links), the /64 of its link-address; the agent's own LAN is the prefix's first.
    /// In a /64 or narrower, the whole prefix.
    pub(super) fn link(&self, prefix: Ipv6Net) -> Ipv6Net {
        if prefix.prefix_len() >= 64 {
            return prefix;
        }
        let at = self.link_address().unwrap_or(prefix.network());
        Ipv6Net::new(at, 64).map_or(prefix, |n| n.trunc())
    }
}

/// Takes the relay agents' RELAY-FORW wrappers off `payload` (RFC 8415 9): the client's
/// message inside, and the relays it passed, nearest the server first. `None` for a
/// wrapper that is cut short, lacks its Relay Message option, or is nested deeper than
/// [`MAX_RELAYS`]. The wrappers are read here, not by `dhcproto` 0.15, which decodes a
/// Relay Message option's content as another relay message, never as a client's.
pub(super) fn unwrap_relays(mut payload: &[u8]) -> Option<(&[u8], Vec<Hop>)> {
    let mut relays = Vec::new();
    while payload.first() == Some(&RELAY_FORW) {
        if relays.len() == MAX_RELAYS {
            return None;
        }
        let header = payload.get(..RELAY_HEADER)?;
        let address = |at: usize| {
            <[u8; 16]>::try_from(&header[at..at + 16])
                .ok()
                .map(Ipv6Addr::from)
        };
        let (mut inner, mut interface_id) = (None, None);
        let mut options = &payload[RELAY_HEADER..];
        while !options.is_empty() {
            let head = options.get(..4)?;
            let code = u16::from_be_bytes([head[0], head[1]]);
            let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
            let body = options.get(4..4 + len)?;
            match code {
                OPTION_RELAY_MSG => inner = Some(body),
                OPTION_INTERFACE_ID => interface_id = Some(body.to_vec()),
                _ => {}
            }
            options = &options[4 + len..];
        }
        relays.push(Hop {
            hop_count: header[1],
            link: address(2)?,
            peer: address(18)?,
            interface_id,
        });
        payload = inner?;
    }
    Some((payload, relays))
}

/// The RELAY-REPL that carries `message` back through `hop` (RFC 8415 19.3): its hop
/// count, link- and peer-address, and Interface-ID repeated. `None` if it would not fit
/// an option.
pub(super) fn relay_reply(hop: &Hop, message: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![RELAY_REPL, hop.hop_count];
    out.extend_from_slice(&hop.link.octets());
    out.extend_from_slice(&hop.peer.octets());
    let mut option = |code: u16, body: &[u8]| -> Option<()> {
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&u16::try_from(body.len()).ok()?.to_be_bytes());
        out.extend_from_slice(body);
        Some(())
    };
    if let Some(id) = &hop.interface_id {
        option(OPTION_INTERFACE_ID, id)?;
    }
    option(OPTION_RELAY_MSG, message)?;
    Some(out)
}

//! The underlay datagram formats.
//!
//! Every datagram starts with a kind byte:
//!
//! | kind | message | layout |
//! |---|---|---|
//! | 2, 3, 4 | WireGuard handshake response, cookie reply, transport data | verbatim (the receiver index names the tunnel) |
//! | `H` (0x48) | hello | `H, version, flags, 0, tag[8], peer id[32], mac[16]` = 60 bytes |
//! | `I` (0x49) | handshake initiation | `I, version, 0, 0, tag[8]` + WireGuard initiation (148 bytes) |
//!
//! WireGuard's own initiation (kind 1) names no namespace, so it travels wrapped with the
//! namespace tag; a bare one is malformed. Hello lets two members that know only each other's
//! underlay address learn each other's identity key; its MAC is keyed by the namespace
//! secret, so strangers get nothing back.
//!
//! Inside a tunnel, members exchange control messages as IPv4 packets from and to 0.0.0.0
//! with protocol 253 (RFC 3692, experimentation), which no host behind a TAP can send
//! through a switch. The only one so far is the address announcement.
//!
//! No-panic contract: every parser checks lengths before reading.

use std::net::Ipv4Addr;

use blake2::digest::consts::U16;
use blake2::digest::{KeyInit, Mac};
use blake2::Blake2sMac;

use crate::keys::{NamespaceKeys, TAG_LEN};
use crate::PeerId;

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

/// Wire format version of hello and wrapped initiations.
pub const VERSION: u8 = 1;

/// Length of a hello.
pub const HELLO_LEN: usize = 60;
/// Bytes in front of a WireGuard initiation: kind, version, 2 reserved, tag.
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
const FLAG_HAVE_YOURS: u8 = 1;
/// Most addresses one announcement may carry.
pub const MAX_ANNOUNCED: usize = 64;

/// Receiver index of a WireGuard response, cookie or data message: the response carries
/// the sender's index first (bytes 4..8) and ours at 8..12; cookie and data carry ours at 4..8.
pub fn receiver_index(datagram: &[u8]) -> Option<u32> {
    let at = if *datagram.first()? == KIND_WG_RESPONSE {
        8
    } else {
        4
    };
    let b = datagram.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Namespace tag of a wrapped initiation or a hello.
pub fn tag(datagram: &[u8]) -> Option<[u8; TAG_LEN]> {
    let b = datagram.get(4..4 + TAG_LEN)?;
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(b);
    Some(t)
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
        let tag = tag(datagram).ok_or(HelloError::Malformed)?;
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

/// Writes the prefix of a wrapped initiation in front of the WireGuard initiation that
/// starts at `buf[INIT_PREFIX_LEN..]`.
pub fn emit_init_prefix(buf: &mut [u8], keys: &NamespaceKeys) {
    buf[0] = KIND_INIT;
    buf[1] = VERSION;
    buf[2] = 0;
    buf[3] = 0;
    buf[4..INIT_PREFIX_LEN].copy_from_slice(&keys.tag);
}

/// An address announcement: the virtual addresses a member owns in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    /// Set when the sender already has the receiver's announcement.
    pub have_yours: bool,
    /// The sender's addresses.
    pub addresses: Vec<Ipv4Addr>,
}

impl Announce {
    /// Builds the control packet (an IPv4 packet, see the module doc).
    pub fn emit(&self) -> Vec<u8> {
        let n = self.addresses.len().min(MAX_ANNOUNCED);
        let total = 20 + 6 + 4 * n;
        let mut p = Vec::with_capacity(total);
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 1, CONTROL_PROTOCOL, 0, 0]);
        p.extend_from_slice(&[0; 8]); // from and to 0.0.0.0
        p.extend_from_slice(ANNOUNCE_MAGIC);
        p.push(if self.have_yours { FLAG_HAVE_YOURS } else { 0 });
        p.push(n as u8);
        for a in &self.addresses[..n] {
            p.extend_from_slice(&a.octets());
        }
        p
    }

    /// Whether a decrypted packet is a control packet rather than a host's.
    pub fn is_control(packet: &[u8]) -> bool {
        packet.len() >= 20 && packet[9] == CONTROL_PROTOCOL && packet[12..20] == [0; 8]
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
        Some(Self {
            have_yours: flags & FLAG_HAVE_YOURS != 0,
            addresses: list
                .chunks_exact(4)
                .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]))
                .collect(),
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
    fn announce_round_trip_and_truncation() {
        let a = Announce {
            have_yours: true,
            addresses: vec![Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 7)],
        };
        let p = a.emit();
        assert!(Announce::is_control(&p));
        assert_eq!(Announce::parse(&p), Some(a));
        for n in 0..p.len() {
            assert_eq!(Announce::parse(&p[..n]), None);
        }
    }
}

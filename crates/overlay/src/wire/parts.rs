//! Sets too large for one control packet, sent in parts that stand together only when
//! every part of one generation has arrived: a layer-2 member's MACs ([`MacPart`]) and the
//! address lists of a member holding more than an announcement carries ([`AddressPart`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    MAX_ADDRESS_BYTES_PER_PART, MAX_ADDRESS_PARTS, MAX_ANNOUNCED, MAX_ANNOUNCED_MACS,
    MAX_MACS_PER_PART, MAX_MAC_PARTS,
};

/// One part of a member's MAC announcement: a set too large for one control packet is
/// sent as up to [`MAX_MAC_PARTS`] parts, which stand together only when every part of
/// the same `generation` has arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacPart {
    /// Changes whenever the set does.
    pub generation: u16,
    /// This part's place, from 0.
    pub part: u8,
    /// How many parts the set is in (1 to [`MAX_MAC_PARTS`]).
    pub parts: u8,
    /// At most [`MAX_MACS_PER_PART`].
    pub macs: Vec<[u8; 6]>,
}

impl MacPart {
    /// `macs` (at most [`MAX_ANNOUNCED_MACS`] taken) as the parts of one announcement.
    pub fn split(generation: u16, macs: &[[u8; 6]]) -> Vec<MacPart> {
        let macs = &macs[..macs.len().min(MAX_ANNOUNCED_MACS)];
        let parts = macs.len().div_ceil(MAX_MACS_PER_PART).max(1);
        (0..parts)
            .map(|i| MacPart {
                generation,
                part: i as u8,
                parts: parts as u8,
                macs: macs
                    .iter()
                    .skip(i * MAX_MACS_PER_PART)
                    .take(MAX_MACS_PER_PART)
                    .copied()
                    .collect(),
            })
            .collect()
    }
}

/// A set sent in parts ([`MacPart`], [`AddressPart`]) put back together.
#[derive(Debug, Clone)]
pub struct Parts<T> {
    generation: u16,
    parts: u8,
    /// One bit per part received.
    received: u32,
    items: Vec<T>,
}

impl<T> Default for Parts<T> {
    fn default() -> Self {
        Self {
            generation: 0,
            parts: 0,
            received: 0,
            items: Vec::new(),
        }
    }
}

impl<T: Clone> Parts<T> {
    /// Takes part `part` of `parts` (at most `most`) of `generation`; the whole set once
    /// every part of its generation is in. A part of another generation starts that one
    /// over (a set that changed midway, or an old part late).
    fn gather(
        &mut self,
        generation: u16,
        (part, parts): (u8, u8),
        most: usize,
        items: &[T],
    ) -> Option<Vec<T>> {
        if parts == 0 || part >= parts || usize::from(parts) > most.min(32) {
            return None;
        }
        if self.received == 0 || generation != self.generation || parts != self.parts {
            *self = Self {
                generation,
                parts,
                received: 0,
                items: Vec::new(),
            };
        }
        let bit = 1u32 << part;
        if self.received & bit == 0 {
            self.received |= bit;
            self.items.extend_from_slice(items);
        }
        if self.received.count_ones() < u32::from(self.parts) {
            return None;
        }
        self.received = 0;
        Some(std::mem::take(&mut self.items))
    }
}

/// A member's MAC announcement put back together from its parts.
pub type MacParts = Parts<[u8; 6]>;

impl MacParts {
    /// Takes `part`; the whole set once every part of its generation is in.
    pub fn take(&mut self, part: MacPart) -> Option<Vec<[u8; 6]>> {
        self.gather(
            part.generation,
            (part.part, part.parts),
            MAX_MAC_PARTS,
            &part.macs,
        )
    }
}

/// One part of a member's address lists, for a member that holds more addresses than an
/// announcement carries ([`MAX_ANNOUNCED`] of each family): up to
/// [`MAX_ADDRESS_PARTS`] parts, which stand together only when every part of the
/// generation the announcement named has arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPart {
    /// Changes whenever the lists do; named by the announcement.
    pub generation: u16,
    /// This part's place, from 0.
    pub part: u8,
    /// How many parts the lists are in (1 to [`MAX_ADDRESS_PARTS`]).
    pub parts: u8,
    /// IPv4 addresses first, then IPv6; at most [`MAX_ADDRESS_BYTES_PER_PART`] bytes of
    /// them.
    pub addresses: Vec<IpAddr>,
}

impl AddressPart {
    /// `v4` and `v6` as the parts of one generation: the first [`MAX_ANNOUNCED`] of each
    /// family (what an announcement carries), then the rest of the IPv4 ones, then the
    /// rest of the IPv6 ones; what does not fit [`MAX_ADDRESS_PARTS`] is left out (the two
    /// families share the room).
    pub fn split(generation: u16, v4: &[Ipv4Addr], v6: &[Ipv6Addr]) -> Vec<AddressPart> {
        let (k4, k6) = (v4.len().min(MAX_ANNOUNCED), v6.len().min(MAX_ANNOUNCED));
        let all = v4[..k4]
            .iter()
            .map(|a| IpAddr::V4(*a))
            .chain(v6[..k6].iter().map(|a| IpAddr::V6(*a)))
            .chain(v4[k4..].iter().map(|a| IpAddr::V4(*a)))
            .chain(v6[k6..].iter().map(|a| IpAddr::V6(*a)));
        let mut parts: Vec<Vec<IpAddr>> = vec![Vec::new()];
        let mut bytes = 0;
        for a in all {
            let len = address_len(&a);
            if bytes + len > MAX_ADDRESS_BYTES_PER_PART {
                if parts.len() == MAX_ADDRESS_PARTS {
                    break;
                }
                parts.push(Vec::new());
                bytes = 0;
            }
            bytes += len;
            if let Some(last) = parts.last_mut() {
                last.push(a);
            }
        }
        let n = parts.len() as u8;
        parts
            .into_iter()
            .enumerate()
            .map(|(i, mut addresses)| {
                // As the wire has them: a part's IPv4 addresses before its IPv6 ones
                // (each family keeps its order).
                addresses.sort_by_key(IpAddr::is_ipv6);
                (i, addresses)
            })
            .map(|(i, addresses)| AddressPart {
                generation,
                part: i as u8,
                parts: n,
                addresses,
            })
            .collect()
    }
}

pub(super) fn address_len(a: &IpAddr) -> usize {
    match a {
        IpAddr::V4(_) => 4,
        IpAddr::V6(_) => 16,
    }
}

/// A member's address lists put back together from their parts.
pub type AddressParts = Parts<IpAddr>;

impl AddressParts {
    /// Takes `part`; the generation and the whole lists once every part of it is in.
    pub fn take(&mut self, part: AddressPart) -> Option<(u16, Vec<IpAddr>)> {
        let set = self.gather(
            part.generation,
            (part.part, part.parts),
            MAX_ADDRESS_PARTS,
            &part.addresses,
        )?;
        Some((part.generation, set))
    }
}

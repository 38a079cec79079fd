//! The envelope a layer-2 frame crosses a tunnel in (EtherIP in IPv4 from and to 0.0.0.0),
//! and the pieces (IPv4 fragments of the envelope) of a frame too large for one.

use std::time::Duration;

use super::ETH_HEADER_LEN;

/// IP protocol number of EtherIP (RFC 3378).
pub const IPPROTO_ETHERIP: u8 = 97;

/// Bytes of the envelope in front of a frame: an IPv4 header without options and the
/// EtherIP header.
pub const ENVELOPE_LEN: usize = 20 + 2;

/// EtherIP header: version 3, reserved bits zero (RFC 3378 section 3).
pub(super) const ETHERIP_HEADER: [u8; 2] = [0x30, 0x00];

/// Largest frame a layer-2 namespace carries (a jumbo frame with an 802.1Q tag); larger
/// ones are dropped ([`L2Drop::TooBig`]).
pub const MAX_FRAME: usize = 9216 + 18;

/// Most frames being reassembled at once, from all members together; a fragment that
/// would start another is dropped ([`L2Counters::reassembly_dropped`]).
pub const MAX_REASSEMBLIES: usize = 64;

/// Most frames one member has under reassembly at once (each worker of its agent may be
/// sending one).
pub const MAX_REASSEMBLIES_PER_MEMBER: usize = 8;

/// How long a frame's fragments may take to arrive.
pub const REASSEMBLY_TIMEOUT: Duration = Duration::from_millis(500);

/// IPv4 "more fragments" flag, in the flags and offset field.
const MORE_FRAGMENTS: u16 = 0x2000;

/// Writes the envelope of a whole frame of `frame_len` bytes into `buf[..ENVELOPE_LEN]`:
/// an IPv4 header from and to 0.0.0.0, protocol 97, with its checksum, and EtherIP's.
/// Returns `None` if `buf` is too short or the envelope would exceed an IPv4 packet.
pub fn emit_envelope(buf: &mut [u8], frame_len: usize) -> Option<()> {
    emit_ipv4(buf, 2 + frame_len, 0, 0, false)?;
    buf.get_mut(20..ENVELOPE_LEN)?
        .copy_from_slice(&ETHERIP_HEADER);
    Some(())
}

/// Writes the IPv4 header of an envelope (or of one of its fragments) carrying
/// `payload_len` bytes at byte `offset` (a multiple of 8) of the EtherIP payload.
fn emit_ipv4(buf: &mut [u8], payload_len: usize, id: u16, offset: usize, more: bool) -> Option<()> {
    let total = u16::try_from(20 + payload_len).ok()?;
    let units = u16::try_from(offset / 8).ok().filter(|u| *u < 0x2000)?;
    let header = buf.get_mut(..20)?;
    header.fill(0);
    header[0] = 0x45;
    header[2..4].copy_from_slice(&total.to_be_bytes());
    header[4..6].copy_from_slice(&id.to_be_bytes());
    let flags = units | if more { MORE_FRAGMENTS } else { 0 };
    header[6..8].copy_from_slice(&flags.to_be_bytes());
    header[8] = 64;
    header[9] = IPPROTO_ETHERIP;
    let sum = crate::wire::ipv4_header_checksum(header);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
    Some(())
}

/// What a tunnel packet of a layer-2 namespace carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// A whole frame.
    Whole(&'a [u8]),
    /// A piece of a frame too large for one tunnel packet.
    Fragment(Piece<'a>),
}

/// A piece of a frame: `payload` lies at byte `offset` of the EtherIP header and frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The frame's identification (the sender's counter).
    pub id: u16,
    /// Where the piece lies.
    pub offset: usize,
    /// Whether pieces follow.
    pub more: bool,
    /// The piece.
    pub payload: &'a [u8],
}

/// Reads an envelope: protocol 97 from and to 0.0.0.0, an IPv4 header without options;
/// a whole one holds EtherIP version 3 and a whole Ethernet header.
pub fn parse_envelope(packet: &[u8]) -> Option<Envelope<'_>> {
    let header = packet.get(..20)?;
    let total = usize::from(u16::from_be_bytes([header[2], header[3]]));
    if header[0] != 0x45
        || header[9] != IPPROTO_ETHERIP
        || header[12..20] != [0; 8]
        || total > packet.len()
        || total < 20
    {
        return None;
    }
    let flags = u16::from_be_bytes([header[6], header[7]]);
    let (offset, more) = (usize::from(flags & 0x1fff) * 8, flags & MORE_FRAGMENTS != 0);
    let payload = &packet[20..total];
    if offset == 0 && !more {
        if payload.get(..2)? != ETHERIP_HEADER || payload.len() < 2 + ETH_HEADER_LEN {
            return None;
        }
        return Some(Envelope::Whole(&payload[2..]));
    }
    // Every piece but the last fills whole 8-byte units.
    if payload.is_empty() || (more && !payload.len().is_multiple_of(8)) {
        return None;
    }
    Some(Envelope::Fragment(Piece {
        id: u16::from_be_bytes([header[4], header[5]]),
        offset,
        more,
        payload,
    }))
}

/// The frame an envelope carries, if `packet` is a whole one.
pub fn envelope_frame(packet: &[u8]) -> Option<&[u8]> {
    match parse_envelope(packet)? {
        Envelope::Whole(frame) => Some(frame),
        Envelope::Fragment(_) => None,
    }
}

/// The pieces of a frame of `frame_len` bytes for tunnel packets of at most `mtu` bytes:
/// for each, its IPv4 header (written by [`Pieces::header`]) and which bytes of the EtherIP
/// header and frame follow it, as the range `start..end` of their concatenation.
#[derive(Debug, Clone)]
pub struct Pieces {
    id: u16,
    len: usize,
    step: usize,
    at: usize,
}

impl Pieces {
    /// The pieces of a frame of `frame_len` bytes, identified by `id`; `None` if `mtu`
    /// cannot carry a piece of 8 bytes.
    pub fn new(frame_len: usize, mtu: usize, id: u16) -> Option<Self> {
        let step = (mtu.checked_sub(20)? / 8) * 8;
        (step > 0).then_some(Self {
            id,
            len: 2 + frame_len,
            step,
            at: 0,
        })
    }

    /// Writes the IPv4 header of the piece `start..end` (as the iterator gave it) into
    /// `buf[..20]`; `None` for a range that is no piece or a short `buf`.
    pub fn header(&self, buf: &mut [u8], start: usize, end: usize) -> Option<()> {
        if start >= end || end > self.len {
            return None;
        }
        emit_ipv4(buf, end - start, self.id, start, end < self.len)
    }

    /// Copies bytes `start..end` of the EtherIP header and `frame` into `buf`; `None` if
    /// the range does not lie in them or `buf` is short.
    pub fn copy(buf: &mut [u8], frame: &[u8], start: usize, end: usize) -> Option<()> {
        if start >= end || end > 2 + frame.len() || buf.len() < end - start {
            return None;
        }
        let mut at = 0;
        for byte in ETHERIP_HEADER.iter().take(end.min(2)).skip(start) {
            buf[at] = *byte;
            at += 1;
        }
        let from = start.max(2) - 2;
        let to = end.saturating_sub(2);
        if from < to {
            buf[at..at + to - from].copy_from_slice(&frame[from..to]);
        }
        Some(())
    }
}

impl Iterator for Pieces {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if self.at >= self.len {
            return None;
        }
        let start = self.at;
        self.at = (start + self.step).min(self.len);
        Some((start, self.at))
    }
}

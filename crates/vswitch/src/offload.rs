//! TAP offloads: the virtio-net header in front of every frame of a TAP opened with
//! `IFF_VNET_HDR`, segmentation of the kernel's TCP and UDP super-frames (TSO/USO) into
//! tunnel-sized frames, and coalescing (GRO) of one flow's frames into a super-frame for one
//! write.
//!
//! With `TUNSETOFFLOAD` (`TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6`, and `TUN_F_USO4/6` on Linux
//! 6.2+) the kernel hands the TAP up to 64 KiB of one TCP flow in one read and leaves
//! checksums for the reader to fill in. Reads and writes then start with a
//! [`VirtioHeader`] (virtio 1.x 5.1.6, `struct virtio_net_hdr`, 10 bytes without
//! `num_buffers`):
//!
//! - [`VirtioHeader::parse`] reads it; [`complete_checksum`] fills in the checksum of a
//!   frame marked `NEEDS_CSUM` without segmentation;
//! - [`Segments`] cuts a super-frame into frames of `gso_size` payload bytes each, with
//!   their IPv4 header checksum and ID (the ID of the first plus the segment's index, as the
//!   kernel's own segmentation does), TCP sequence number, length and full TCP/UDP checksum;
//!   FIN and PSH stay on the last segment, CWR on the first;
//! - [`Coalescer`] merges consecutive frames of one TCP flow (same addresses, ports, ACK,
//!   options and flags, contiguous sequence numbers, IPv4 IDs counting up, every payload but
//!   the last of one size) into a super-frame with a GSO header and a partial checksum, as
//!   Linux's `tcp_gro_receive` does; anything else is written as it came.
//!
//! No function here panics on any input: lengths are checked once before a frame is
//! sliced, and a frame that cannot be handled is an [`Error`] (the caller counts a drop).

use crate::mtu::IPPROTO_TCP;
use crate::wire::{ipv4_header_checksum, ETHERTYPE_IPV4, ETH_HEADER_LEN, IPPROTO_UDP};

/// Bytes of the virtio-net header in front of each frame (`sizeof(struct virtio_net_hdr)`,
/// the TAP's default `TUNSETVNETHDRSZ`).
pub const VIRTIO_HEADER_LEN: usize = 10;

/// 802.1Q and 802.1ad tag protocol identifiers: a tagged super-frame is cut past its tags.
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;

/// Largest super-frame the coalescer builds: an IP packet of 65535 bytes behind its
/// Ethernet header (it takes no tagged frame).
pub const MAX_SUPER_FRAME: usize = ETH_HEADER_LEN + 65535;

/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

/// `flags`: the checksum from `csum_start` to the end of the frame is left to the reader.
pub const F_NEEDS_CSUM: u8 = 1;

const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_UDP: u8 = 3;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
/// High bit of `gso_type`: the flow uses ECN (CWR may be set on the first segment).
const GSO_ECN: u8 = 0x80;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_CWR: u8 = 0x80;
/// Offset of the checksum in the TCP header.
const TCP_CSUM_OFFSET: u16 = 16;
const TCP_MIN_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
const UDP_CSUM_OFFSET: usize = 6;
const IPV6_HEADER_LEN: usize = 40;
const IPV4_MF_OFFSET_MASK: u16 = 0x3fff;

/// Why a frame from the TAP could not be taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Shorter than its virtio header, or than the headers or lengths it declares.
    Truncated,
    /// A `gso_type` this code does not segment (`VIRTIO_NET_HDR_GSO_UDP`, IP fragmentation).
    UnknownGsoType(u8),
    /// A super-frame that is not IPv4 or IPv6 directly behind Ethernet (VLAN tags, IPv6
    /// extension headers), or whose transport does not match its `gso_type`.
    Unsupported,
    /// `gso_size` is zero.
    ZeroGsoSize,
    /// The checksum field `csum_start + csum_offset` lies outside the frame.
    ChecksumOutside,
}

/// What the kernel asks of a frame: segmentation (`gso_type`, `gso_size`) and checksum
/// completion (`flags`, `csum_start`, `csum_offset`). Fields in host byte order (the legacy
/// virtio header of a TAP without `TUNSETVNETLE`/`BE` is native-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioHeader {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

/// What a super-frame is to be cut into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gso {
    /// One frame as it is (its checksum may still need filling in).
    None,
    /// TCP over IPv4 or IPv6.
    Tcp,
    /// UDP (`VIRTIO_NET_HDR_GSO_UDP_L4`): datagrams of `gso_size` bytes.
    Udp,
}

impl VirtioHeader {
    /// A frame that needs nothing: no segmentation, checksums complete.
    pub const PLAIN: Self = Self {
        flags: 0,
        gso_type: GSO_NONE,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };

    /// Reads the header at the start of `bytes` (what a read of the TAP returned).
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        let b = bytes.get(..VIRTIO_HEADER_LEN).ok_or(Error::Truncated)?;
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        Ok(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// Writes the header into the first [`VIRTIO_HEADER_LEN`] bytes of `buf`; `None` if
    /// `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> Option<()> {
        let b = buf.get_mut(..VIRTIO_HEADER_LEN)?;
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        Some(())
    }

    /// The segmentation asked for.
    pub fn gso(&self) -> Result<Gso, Error> {
        match self.gso_type & !GSO_ECN {
            GSO_NONE => Ok(Gso::None),
            GSO_TCPV4 | GSO_TCPV6 => Ok(Gso::Tcp),
            GSO_UDP_L4 => Ok(Gso::Udp),
            // UFO: one datagram in IP fragments; never offered (TUN_F_UFO is not asked for).
            GSO_UDP => Err(Error::UnknownGsoType(GSO_UDP)),
            other => Err(Error::UnknownGsoType(other)),
        }
    }
}

/// Fills in the checksum of a frame the kernel marked `NEEDS_CSUM` (its checksum field holds
/// the pseudo-header sum): the one's complement sum from `csum_start` to the end of the
/// frame, as `skb_checksum_help` computes it. A frame without the flag is left alone.
pub fn complete_checksum(header: &VirtioHeader, frame: &mut [u8]) -> Result<(), Error> {
    if header.flags & F_NEEDS_CSUM == 0 {
        return Ok(());
    }
    let start = usize::from(header.csum_start);
    let field = start + usize::from(header.csum_offset);
    if field + 2 > frame.len() {
        return Err(Error::ChecksumOutside);
    }
    let sum = !fold(sum_words(0, &frame[start..]));
    // A computed zero goes out as 0xffff (zero means "no checksum" to UDP).
    let sum = if sum == 0 { 0xffff } else { sum };
    frame[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// Where the headers of an IPv4 or IPv6 frame end, and what they hold.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ipv6: bool,
    /// Offset of the IP header: after the Ethernet header and its VLAN tags, if any (a
    /// layer-2 namespace carries a host's tagged super-frames as they are).
    ip: usize,
    /// Offset of the transport header (after Ethernet and IP).
    l4: usize,
    /// Offset of the payload (after the transport header).
    payload: usize,
    /// End of the IP packet (its declared length; anything after is padding).
    end: usize,
    protocol: u8,
}

impl Layout {
    /// Reads the Ethernet (up to two VLAN tags), IP and transport headers of `frame`.
    /// IPv4 options are allowed (copied into every segment); IPv6 extension headers are
    /// not.
    fn parse(frame: &[u8]) -> Result<Self, Error> {
        if frame.len() < ETH_HEADER_LEN + 20 {
            return Err(Error::Truncated);
        }
        let mut ethertype = be16(frame, 12);
        let mut ip = ETH_HEADER_LEN;
        for _ in 0..2 {
            if ethertype != ETHERTYPE_VLAN && ethertype != ETHERTYPE_QINQ {
                break;
            }
            if frame.len() < ip + 4 + 20 {
                return Err(Error::Truncated);
            }
            ethertype = be16(frame, ip + 2);
            ip += 4;
        }
        let (ipv6, l4, end, protocol) = match ethertype {
            ETHERTYPE_IPV4 => {
                let ihl = usize::from(frame[ip] & 0x0f) * 4;
                if frame[ip] >> 4 != 4 || ihl < 20 {
                    return Err(Error::Unsupported);
                }
                let total = usize::from(be16(frame, ip + 2));
                (false, ip + ihl, ip + total, frame[ip + 9])
            }
            ETHERTYPE_IPV6 => {
                if frame[ip] >> 4 != 6 {
                    return Err(Error::Unsupported);
                }
                let payload = usize::from(be16(frame, ip + 4));
                let next = *frame.get(ip + 6).ok_or(Error::Truncated)?;
                (
                    true,
                    ip + IPV6_HEADER_LEN,
                    ip + IPV6_HEADER_LEN + payload,
                    next,
                )
            }
            _ => return Err(Error::Unsupported),
        };
        if end > frame.len() || end < l4 {
            return Err(Error::Truncated);
        }
        let payload = match protocol {
            IPPROTO_TCP => {
                let offset = usize::from(*frame.get(l4 + 12).ok_or(Error::Truncated)? >> 4) * 4;
                if offset < TCP_MIN_HEADER_LEN {
                    return Err(Error::Unsupported);
                }
                l4 + offset
            }
            IPPROTO_UDP => l4 + UDP_HEADER_LEN,
            _ => return Err(Error::Unsupported),
        };
        if payload > end {
            return Err(Error::Truncated);
        }
        Ok(Self {
            ipv6,
            ip,
            l4,
            payload,
            end,
            protocol,
        })
    }

    /// The pseudo-header sum (RFC 793 3.1, RFC 8200 8.1) for a transport segment of `len`
    /// bytes.
    fn pseudo_sum(&self, frame: &[u8], len: usize) -> u64 {
        let ip = self.ip;
        let addresses = if self.ipv6 {
            &frame[ip + 8..ip + 40]
        } else {
            &frame[ip + 12..ip + 20]
        };
        sum_words(u64::from(self.protocol) + len as u64, addresses)
    }
}

/// The frames of one super-frame, written one at a time into a caller's buffer.
#[derive(Debug)]
pub struct Segments<'a> {
    frame: &'a [u8],
    layout: Layout,
    gso: Gso,
    /// Payload bytes per segment.
    size: usize,
    /// Payload bytes already written.
    done: usize,
    index: u16,
}

impl<'a> Segments<'a> {
    /// Prepares to cut `frame` (what followed the virtio header) as `header` asks. A frame
    /// without segmentation is one segment, its checksum completed if asked.
    pub fn new(header: &VirtioHeader, frame: &'a [u8]) -> Result<Self, Error> {
        let gso = header.gso()?;
        let layout = Layout::parse(frame)?;
        let size = match gso {
            Gso::None => layout.end - layout.payload,
            Gso::Tcp | Gso::Udp => usize::from(header.gso_size),
        };
        if gso != Gso::None && size == 0 {
            return Err(Error::ZeroGsoSize);
        }
        let transport = match gso {
            Gso::None => layout.protocol,
            Gso::Tcp => IPPROTO_TCP,
            Gso::Udp => IPPROTO_UDP,
        };
        if transport != layout.protocol {
            return Err(Error::Unsupported);
        }
        Ok(Self {
            frame,
            layout,
            gso,
            size,
            done: 0,
            index: 0,
        })
    }

    /// How many segments the frame is cut into.
    pub fn count(&self) -> usize {
        (self.layout.end - self.layout.payload)
            .div_ceil(self.size.max(1))
            .max(1)
    }

    /// Writes the next segment into `buf` and returns its length; `None` once all are
    /// written, or if `buf` is shorter than the segment.
    pub fn next_into(&mut self, buf: &mut [u8]) -> Option<usize> {
        let Layout {
            ipv6,
            ip,
            l4,
            payload,
            end,
            ..
        } = self.layout;
        let data = &self.frame[payload..end];
        if self.done >= data.len() && !(self.index == 0 && data.is_empty()) {
            return None;
        }
        let take = self.size.min(data.len() - self.done);
        let first = self.index == 0;
        let last = self.done + take >= data.len();
        let len = payload + take;
        let out = buf.get_mut(..len)?;
        out[..payload].copy_from_slice(&self.frame[..payload]);
        out[payload..].copy_from_slice(&data[self.done..self.done + take]);
        if ipv6 {
            let ip_payload = (len - ip - IPV6_HEADER_LEN) as u16;
            out[ip + 4..ip + 6].copy_from_slice(&ip_payload.to_be_bytes());
        } else {
            out[ip + 2..ip + 4].copy_from_slice(&((len - ip) as u16).to_be_bytes());
            let id = be16(self.frame, ip + 4).wrapping_add(self.index);
            out[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
            out[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
            let sum = ipv4_header_checksum(&out[ip..l4]);
            out[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        }
        let csum_field = match self.layout.protocol {
            IPPROTO_TCP => {
                let seq = be32(self.frame, l4 + 4).wrapping_add(self.done as u32);
                out[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
                let mut flags = out[l4 + 13];
                if !last {
                    flags &= !(TCP_FIN | TCP_PSH);
                }
                if !first {
                    flags &= !TCP_CWR;
                }
                out[l4 + 13] = flags;
                l4 + usize::from(TCP_CSUM_OFFSET)
            }
            _ => {
                out[l4 + 4..l4 + 6].copy_from_slice(&((len - l4) as u16).to_be_bytes());
                l4 + UDP_CSUM_OFFSET
            }
        };
        // An IPv4 UDP datagram sent without a checksum (zero) keeps none.
        let udp_unchecked = self.layout.protocol == IPPROTO_UDP
            && !ipv6
            && self.gso == Gso::None
            && be16(self.frame, csum_field) == 0;
        if !udp_unchecked {
            out[csum_field..csum_field + 2].copy_from_slice(&[0, 0]);
            let pseudo = self.layout.pseudo_sum(out, len - l4);
            let sum = !fold(sum_words(pseudo, &out[l4..len]));
            let sum = if sum == 0 && self.layout.protocol == IPPROTO_UDP {
                0xffff
            } else {
                sum
            };
            out[csum_field..csum_field + 2].copy_from_slice(&sum.to_be_bytes());
        }
        self.done += take;
        self.index = self.index.wrapping_add(1);
        if data.is_empty() {
            // A frame without payload is one segment; mark it written.
            self.done = 1;
        }
        Some(len)
    }
}

/// What [`Coalescer::handle_frame`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The frame is part of the pending super-frame.
    Held,
    /// The pending super-frame cannot take it: write [`Coalescer::poll_frame`] first, then
    /// offer the frame again.
    Busy,
    /// Not a frame to coalesce (not TCP with data, other flags, a bad checksum): write it as
    /// it is, behind [`VirtioHeader::PLAIN`].
    Refused,
}

/// The flow of the pending super-frame and where it stands.
#[derive(Debug, Clone, Copy)]
struct Pending {
    layout: Layout,
    /// Payload bytes of the first frame: the `gso_size` of the super-frame.
    size: usize,
    next_seq: u32,
    next_id: u16,
    frames: usize,
    /// A frame shorter than `size` or with PSH ended it.
    closed: bool,
}

/// Coalesces consecutive TCP frames of one flow into one super-frame (GRO) for one write to
/// the TAP, and, where the TAP takes UDP segmentation offload ([`Coalescer::with_udp`]),
/// consecutive UDP datagrams of one flow too. Call order:
/// [`handle_frame`](Self::handle_frame) for each frame, [`poll_frame`](Self::poll_frame)
/// when it answers [`Offer::Busy`] and once after the last frame of a batch.
#[derive(Debug)]
pub struct Coalescer {
    /// The virtio header followed by the super-frame.
    buf: Vec<u8>,
    pending: Option<Pending>,
    merged: u64,
    /// UDP datagrams are coalesced too (the TAP has `TUN_F_USO4`/`TUN_F_USO6`).
    udp: bool,
}

/// Most datagrams in one UDP super-frame: what older kernels allow a UDP GSO packet
/// (`UDP_MAX_SEGMENTS`, 64 before Linux 6.10).
const MAX_UDP_SEGMENTS: usize = 64;

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    /// A coalescer with room for the largest super-frame.
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(VIRTIO_HEADER_LEN + MAX_SUPER_FRAME),
            pending: None,
            merged: 0,
            udp: false,
        }
    }

    /// Whether UDP datagrams are coalesced too: only where the TAP was opened with UDP
    /// segmentation offload (`VIRTIO_NET_HDR_GSO_UDP_L4` writes), Linux 6.2 and later.
    pub fn with_udp(mut self, udp: bool) -> Self {
        self.udp = udp;
        self
    }

    /// Frames merged into a super-frame so far (each beyond the first of its super-frame).
    pub fn merged(&self) -> u64 {
        self.merged
    }

    /// Offers the next frame for the TAP.
    pub fn handle_frame(&mut self, frame: &[u8]) -> Offer {
        let Some(candidate) = Candidate::parse(frame, self.udp) else {
            return if self.pending.is_some() {
                // Keep order: what is pending leaves before the frame that follows it.
                Offer::Busy
            } else {
                Offer::Refused
            };
        };
        let Some(p) = self.pending else {
            self.start(frame, candidate);
            return Offer::Held;
        };
        if !self.joins(&p, frame, &candidate) {
            return Offer::Busy;
        }
        let data = &frame[candidate.layout.payload..candidate.layout.end];
        self.buf.extend_from_slice(data);
        self.merged += 1;
        if candidate.is_udp() {
            self.pending = Some(Pending {
                next_id: p.next_id.wrapping_add(1),
                frames: p.frames + 1,
                closed: data.len() < p.size || p.frames + 1 == MAX_UDP_SEGMENTS,
                ..p
            });
            return Offer::Held;
        }
        // The last frame's window is the receiver's latest word.
        let window_at = VIRTIO_HEADER_LEN + p.layout.l4 + 14;
        let l4 = candidate.layout.l4;
        if let Some(w) = self.buf.get_mut(window_at..window_at + 2) {
            w.copy_from_slice(&frame[l4 + 14..l4 + 16]);
        }
        self.pending = Some(Pending {
            next_seq: p.next_seq.wrapping_add(data.len() as u32),
            next_id: p.next_id.wrapping_add(1),
            frames: p.frames + 1,
            closed: data.len() < p.size || candidate.flags & TCP_PSH != 0,
            ..p
        });
        if candidate.flags & TCP_PSH != 0 {
            // The last segment's PSH is the super-frame's.
            let flags_at = VIRTIO_HEADER_LEN + p.layout.l4 + 13;
            if let Some(f) = self.buf.get_mut(flags_at) {
                *f |= TCP_PSH;
            }
        }
        Offer::Held
    }

    fn start(&mut self, frame: &[u8], candidate: Candidate) {
        let layout = candidate.layout;
        self.buf.clear();
        self.buf.resize(VIRTIO_HEADER_LEN, 0);
        self.buf.extend_from_slice(&frame[..layout.end]);
        let size = layout.end - layout.payload;
        self.pending = Some(Pending {
            layout,
            size,
            next_seq: be32(frame, layout.l4 + 4).wrapping_add(size as u32),
            next_id: be16(frame, ETH_HEADER_LEN + 4).wrapping_add(1),
            frames: 1,
            closed: !candidate.is_udp() && candidate.flags & TCP_PSH != 0,
        });
    }

    /// Whether `frame` continues the pending super-frame.
    fn joins(&self, p: &Pending, frame: &[u8], c: &Candidate) -> bool {
        let held = &self.buf[VIRTIO_HEADER_LEN..];
        let (a, b) = (p.layout, c.layout);
        let data = b.end - b.payload;
        if p.closed
            || data > p.size
            || self.buf.len() + data > VIRTIO_HEADER_LEN + ETH_HEADER_LEN + 65535
            || a.ipv6 != b.ipv6
            || a.protocol != b.protocol
            || a.l4 != b.l4
            || a.payload != b.payload
            || (!c.is_udp() && be32(frame, b.l4 + 4) != p.next_seq)
        {
            return false;
        }
        let ip = ETH_HEADER_LEN;
        // Ethernet header, then the IP fields that must match.
        let same_ip = if a.ipv6 {
            // Version, traffic class, flow label; next header and hop limit; addresses.
            held[ip..ip + 4] == frame[ip..ip + 4] && held[ip + 6..ip + 40] == frame[ip + 6..ip + 40]
        } else {
            // TOS; flags (DF); TTL and protocol; addresses and options.
            held[ip + 1] == frame[ip + 1]
                && held[ip + 6..ip + 8] == frame[ip + 6..ip + 8]
                && held[ip + 8..ip + 10] == frame[ip + 8..ip + 10]
                && held[ip + 12..a.l4] == frame[ip + 12..b.l4]
                && be16(frame, ip + 4) == p.next_id
        };
        // Ports; ACK number; data offset; flags but PSH; options (the whole header but
        // sequence number, window, checksum and urgent pointer). `a.l4 == b.l4` and
        // `a.payload == b.payload` keep every index inside both frames. UDP: the ports.
        let l4 = a.l4;
        if c.is_udp() {
            return held[..ETH_HEADER_LEN] == frame[..ETH_HEADER_LEN]
                && same_ip
                && held[l4..l4 + 4] == frame[l4..l4 + 4];
        }
        let same_tcp = held[l4..l4 + 4] == frame[l4..l4 + 4]
            && held[l4 + 8..l4 + 13] == frame[l4 + 8..l4 + 13]
            && held[l4 + 13] & !TCP_PSH == c.flags & !TCP_PSH
            && held[l4 + 20..a.payload] == frame[l4 + 20..b.payload];
        held[..ETH_HEADER_LEN] == frame[..ETH_HEADER_LEN] && same_ip && same_tcp
    }

    /// The pending super-frame, virtio header first, ready for one write; `None` if nothing
    /// is pending. One frame goes out as it came, behind a plain header.
    pub fn poll_frame(&mut self) -> Option<&[u8]> {
        let p = self.pending.take()?;
        if p.frames == 1 {
            VirtioHeader::PLAIN.emit(&mut self.buf)?;
            return Some(&self.buf);
        }
        let layout = p.layout;
        let frame = self.buf.get_mut(VIRTIO_HEADER_LEN..)?;
        let len = frame.len();
        let ip = ETH_HEADER_LEN;
        if layout.ipv6 {
            let payload = (len - ip - IPV6_HEADER_LEN) as u16;
            frame[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
        } else {
            frame[ip + 2..ip + 4].copy_from_slice(&((len - ip) as u16).to_be_bytes());
            frame[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
            let sum = ipv4_header_checksum(&frame[ip..layout.l4]);
            frame[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        }
        let l4 = layout.l4;
        let (gso_type, csum_offset) = match (layout.protocol, layout.ipv6) {
            (IPPROTO_UDP, _) => {
                // The whole super-frame's UDP length; segmentation gives each its own.
                frame[l4 + 4..l4 + 6].copy_from_slice(&((len - l4) as u16).to_be_bytes());
                (GSO_UDP_L4, UDP_CSUM_OFFSET as u16)
            }
            (_, true) => (GSO_TCPV6, TCP_CSUM_OFFSET),
            (_, false) => (GSO_TCPV4, TCP_CSUM_OFFSET),
        };
        // CHECKSUM_PARTIAL: the field holds the folded pseudo-header sum over the whole
        // segment, which the kernel's segmentation adjusts per segment.
        let pseudo = fold(layout.pseudo_sum(frame, len - l4));
        let field = l4 + usize::from(csum_offset);
        frame[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
        let header = VirtioHeader {
            flags: F_NEEDS_CSUM,
            gso_type,
            hdr_len: layout.payload as u16,
            gso_size: p.size as u16,
            csum_start: l4 as u16,
            csum_offset,
        };
        header.emit(&mut self.buf)?;
        Some(&self.buf)
    }
}

/// A frame that may join a super-frame: TCP with data, only ACK (and PSH, ECE) set, or a
/// UDP datagram with data and a checksum (IPv4 may send none; such stay as they are); no
/// IPv4 fragmentation, and a checksum that verifies (the merged frame's is only partial,
/// so a bad one must not be hidden by merging).
#[derive(Debug, Clone, Copy)]
struct Candidate {
    layout: Layout,
    flags: u8,
}

impl Candidate {
    /// `udp`: whether UDP datagrams may be candidates (checked before any checksum).
    fn parse(frame: &[u8], udp: bool) -> Option<Self> {
        let layout = Layout::parse(frame).ok()?;
        // Tagged frames are written as they are: what follows reads an untagged header.
        if layout.payload == layout.end || layout.ip != ETH_HEADER_LEN {
            return None;
        }
        if !layout.ipv6 && be16(frame, ETH_HEADER_LEN + 6) & IPV4_MF_OFFSET_MASK != 0 {
            return None;
        }
        let l4 = layout.l4;
        let flags = match layout.protocol {
            IPPROTO_TCP => {
                let flags = frame[l4 + 13];
                let control = TCP_FIN | TCP_SYN | TCP_RST | TCP_URG | TCP_CWR;
                if flags & TCP_ACK == 0 || flags & control != 0 {
                    return None;
                }
                flags
            }
            // A UDP length short of the IP packet's (trailing bytes) would not survive
            // segmentation: such datagrams stay as they are.
            IPPROTO_UDP
                if udp
                    && be16(frame, l4 + UDP_CSUM_OFFSET) != 0
                    && usize::from(be16(frame, l4 + 4)) == layout.end - l4 =>
            {
                0
            }
            _ => return None,
        };
        let pseudo = layout.pseudo_sum(frame, layout.end - l4);
        if fold(sum_words(pseudo, &frame[l4..layout.end])) != 0xffff {
            return None;
        }
        Some(Self { layout, flags })
    }

    fn is_udp(&self) -> bool {
        self.layout.protocol == IPPROTO_UDP
    }
}

/// Adds `bytes` as big-endian 16-bit words (RFC 1071) to `acc`, four bytes at a time (a
/// 32-bit word folds to the sum of its halves). Only the last slice of a sum may be odd.
fn sum_words(mut acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc + u64::from(u32::from_be_bytes(tail))
}

/// Folds a sum to 16 bits (end-around carry).
fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests;

//! The switch of a layer-2 namespace (`layer = 2`): every Ethernet frame crosses, whatever
//! its EtherType or 802.1Q tag, forwarded by destination MAC.
//!
//! A [`Layer2`] learns the MACs behind its own TAP (the host's device in interface mode,
//! the LAN's hosts in router mode) from the source of every frame it reads there, and
//! reports the set when it changes ([`Layer2::take_local_changed`]): the agent announces
//! it to the namespace's members, and each member's announced MACs are the only ones it
//! may send from (the node checks every frame's source against them before the switch
//! sees it). Frames from the TAP go:
//!
//! - to the member that announced the destination MAC ([`L2Action::ToPeer`]);
//! - to every member ([`L2Action::Flood`]) when the destination is broadcast, multicast
//!   or a MAC nobody announced (unknown unicast), within a token bucket per namespace
//!   (`flood_rate` a second, also the burst; drops counted);
//! - nowhere when the destination is a MAC on this side (the LAN bridge delivered it).
//!
//! Frames from a member go to the TAP. A flooded one passes a token bucket per member
//! (`flood_rate` each), and no frame from the overlay is ever sent back into it: a
//! member's flood reaches each member once, from its sender. A MAC that a member
//! announced and that shows up on this side too (a loop, a spoof, or a VM that moved
//! here) is counted ([`L2Counters::mac_conflicts`]); it is learned here (and so announced,
//! and taken from the member's entry) at most once a second per MAC, and a member's
//! announcement takes a MAC from this side only once this side has not heard from it for a
//! second (at once, or when that second is up), so a loop cannot make the table flap at
//! line rate and a migrated VM's MAC follows it.
//!
//! On a VLAN trunk ([`L2Config::vlan`]) the switch takes only its VLAN's frames, untagged
//! ([`Layer2::untag`]), and members' frames are written tagged ([`tag_in_place`]).
//!
//! Across the tunnel a frame travels inside an IPv4 envelope (EtherIP, RFC 3378: protocol
//! 97, a 2-byte header, then the frame) from and to 0.0.0.0, which no host behind a TAP of
//! an IP namespace can send: [`emit_envelope`] and [`envelope_frame`]. WireGuard carries
//! only IP packets, so the envelope is what lets it carry any frame.
//!
//! Like [`Switch`](crate::Switch) it does no I/O, reads no clock and never panics on any
//! input; tables are bounded ([`MAX_MACS`]), and what does not fit is counted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::ndp::ADVERTISEMENT_FRAME_LEN;
use crate::wire::{emit_arp_reply, ArpPacket, Mac, ARP_REQUEST, ETHERTYPE_ARP, ETH_HEADER_LEN};

/// Most MACs one switch learns on its own side, and most it keeps of all members'
/// announcements; beyond, new ones are not learned (counted).
pub const MAX_MACS: usize = 4096;

/// How long a MAC learned on this side stays without a frame from it (a bridge's
/// default ageing time, 802.1D).
pub const MAC_AGE: Duration = Duration::from_secs(300);

/// Most addresses one member's host (one MAC) may be bound to for ARP and neighbour
/// suppression: an IPv4 address, IPv6 link-local, stable and temporary ones.
pub const MAX_BINDINGS_PER_MAC: usize = 8;

/// A MAC that moves from a member to this side is learned here at most this often.
pub const RELEARN_INTERVAL: Duration = Duration::from_secs(1);

/// Where a switch sits (the agent's deployment mode, as far as layer 2 cares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Mode {
    /// The TAP is the host's own interface: frames from the overlay are for its MAC, the
    /// broadcast or a multicast group.
    Interface,
    /// The TAP is a port of a LAN bridge: frames from the overlay go to the bridge, which
    /// delivers them.
    Router,
}

/// Settings of one layer-2 switch.
#[derive(Debug, Clone)]
pub struct L2Config {
    /// Where the switch sits.
    pub mode: L2Mode,
    /// Interface mode: the MAC of the host's device (the TAP).
    pub device_mac: Mac,
    /// Broadcast, multicast and unknown-unicast frames a second (also the burst): out of
    /// this switch to the namespace, and in from each member. 0 floods nothing.
    pub flood_rate: u32,
    /// Largest tunnel packet (the namespace MTU): a frame that does not fit whole in one
    /// with its envelope is sent in pieces ([`Layer2::pieces`]).
    pub tunnel_mtu: usize,
    /// Router mode on a VLAN trunk: the namespace is this VLAN (1 to 4094). Only frames
    /// the TAP reads tagged with it are taken, untagged ([`Layer2::untag`]); members'
    /// frames are written tagged with it ([`tag_in_place`], [`tag_into`]).
    pub vlan: Option<u16>,
    /// If not empty, the only EtherTypes that cross either way (looked up past up to two
    /// 802.1Q or 802.1ad tags: a tagged frame is judged by what it carries); others are
    /// dropped ([`L2Drop::EtherType`]). [`ETHERTYPE_LLC`] stands for every 802.3 frame with
    /// a length instead of a type (STP BPDUs, LLC).
    pub ethertypes: Vec<u16>,
    /// Most MACs learned on this side (at most [`MAX_MACS`]): no more than one
    /// announcement carries. Beyond, a new MAC is not learned (counted), and members drop
    /// its frames.
    pub max_local: usize,
}

/// In [`L2Config::ethertypes`]: 802.3 frames, whose type field is a length (below 0x0600).
pub const ETHERTYPE_LLC: u16 = 0;

/// What to do with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Action<P> {
    /// Send the frame (in an envelope) to the member that announced its destination.
    ToPeer(P),
    /// Send the frame to every member of the namespace.
    Flood,
    /// Write the frame to the TAP (a reassembled one: [`Layer2::assembled`]).
    ToTap,
    /// An ARP request or IPv6 neighbour solicitation for a member's host, answered here:
    /// write [`Layer2::answer`] to the TAP, and send nothing to the members (EVPN's ARP
    /// and ND suppression).
    Answer,
    /// A piece of a frame, kept until the rest arrives.
    Held,
    /// Drop it, for this reason (counted).
    Drop(L2Drop),
}

/// Why a layer-2 frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Drop {
    /// Shorter than an Ethernet header, or from a multicast source MAC.
    Malformed,
    /// For a MAC on this side: the LAN delivered it.
    Local,
    /// A flood over the rate (out, or in from one member).
    FloodRateLimited,
    /// Larger than [`MAX_FRAME`].
    TooBig,
    /// Interface mode: a member's unicast frame for a MAC other than the device's.
    NotForUs,
    /// On a trunk: a frame of another VLAN, or untagged.
    OtherVlan,
    /// An EtherType the namespace does not carry ([`L2Config::ethertypes`]).
    EtherType,
    /// A frame from this side's TAP from a MAC a member announced, within
    /// [`RELEARN_INTERVAL`] of the last move (a loop or a spoof); or a member's frame from
    /// a MAC learned on this side.
    Conflict,
    /// A piece of a frame that cannot be put together (out of order, its first piece
    /// missing, beyond [`MAX_REASSEMBLIES`] or [`MAX_FRAME`]); a frame whose pieces did
    /// not all come within [`REASSEMBLY_TIMEOUT`], or that its member gave up for the next;
    /// a reassembled frame from a MAC its member did not announce.
    Reassembly,
    /// The namespace's policy denied it ([`Layer2::count_denied`]; the policy counts it
    /// too).
    Policy,
}

impl L2Drop {
    /// Every reason, in counter order.
    pub const ALL: [L2Drop; 10] = [
        L2Drop::Malformed,
        L2Drop::Local,
        L2Drop::FloodRateLimited,
        L2Drop::TooBig,
        L2Drop::NotForUs,
        L2Drop::OtherVlan,
        L2Drop::EtherType,
        L2Drop::Conflict,
        L2Drop::Reassembly,
        L2Drop::Policy,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            L2Drop::Malformed => "malformed",
            L2Drop::Local => "local",
            L2Drop::FloodRateLimited => "flood_rate_limited",
            L2Drop::TooBig => "too_big",
            L2Drop::NotForUs => "not_for_us",
            L2Drop::OtherVlan => "other_vlan",
            L2Drop::EtherType => "ethertype",
            L2Drop::Conflict => "conflict",
            L2Drop::Reassembly => "reassembly",
            L2Drop::Policy => "policy",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a layer-2 switch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L2Counters {
    /// Frames sent to one member.
    pub to_peer: u64,
    /// Frames flooded to every member: broadcast and multicast.
    pub floods_out: u64,
    /// Frames flooded to every member because no member announced their destination.
    pub unknown_unicast: u64,
    /// Frames from members written to the TAP.
    pub to_tap: u64,
    /// Of those, flooded ones (broadcast, multicast, unknown unicast).
    pub floods_in: u64,
    /// MACs learned on this side (new entries).
    pub learned: u64,
    /// MACs that moved between a member and this side (either way).
    pub moves: u64,
    /// Frames and announcements that showed a MAC on both sides (see [`L2Drop::Conflict`]);
    /// moves included.
    pub mac_conflicts: u64,
    /// MACs not learned because the table was full.
    pub table_full: u64,
    /// Frames sent in pieces (too large for one tunnel packet).
    pub fragmented: u64,
    /// Frames put back together from pieces.
    pub reassembled: u64,
    /// ARP requests answered here from what members' hosts said, instead of flooded.
    pub arp_suppressed: u64,
    /// ARP requests flooded to the members (no binding known for their target).
    pub arp_flooded: u64,
    /// IPv6 neighbour solicitations answered here from members' hosts' advertisements.
    pub nd_suppressed: u64,
    /// Neighbour solicitations flooded to the members (no binding known).
    pub nd_flooded: u64,
    /// Addresses two members' hosts spoke for at once (ARP or advertisements): no longer
    /// answered here for either.
    pub neighbour_conflicts: u64,
    /// Drops by reason, in [`L2Drop::ALL`] order.
    pub drops: [u64; 10],
}

impl L2Counters {
    /// Drops for `reason`.
    pub fn dropped(&self, reason: L2Drop) -> u64 {
        self.drops[reason.index()]
    }
}

/// The layer-2 switch of one namespace. `P` names a member (the overlay's peer handle).
#[derive(Debug)]
pub struct Layer2<P> {
    config: L2Config,
    /// MACs on this side, and when each was last seen.
    local: HashMap<Mac, Instant>,
    /// MACs members announced, and who (one member each: the last to announce it).
    remote: HashMap<Mac, P>,
    /// What each member announced last: the only sources its frames may have.
    announced: HashMap<P, Vec<Mac>>,
    /// MACs on this side that a member announced too while this side still heard them:
    /// the member's once this side has been silent for [`RELEARN_INTERVAL`].
    contested: HashMap<Mac, P>,
    /// When a MAC last moved from a member to this side.
    moved: HashMap<Mac, Instant>,
    out: Bucket,
    inbound: HashMap<P, Bucket>,
    local_changed: bool,
    /// Frames being reassembled, oldest first.
    partials: Vec<Partial<P>>,
    /// The last frame reassembled.
    assembled: Vec<u8>,
    /// Identification of the next frame sent in pieces.
    next_id: u16,
    /// Members' hosts' addresses and MACs, from their ARP packets and neighbour
    /// advertisements (for themselves, from the frame's own source MAC).
    bindings: HashMap<IpAddr, Binding>,
    /// Addresses two members' hosts spoke for, and since when: bound to neither for
    /// [`MAC_AGE`].
    conflicted: HashMap<IpAddr, Instant>,
    /// The last answer built ([`L2Action::Answer`]), the longer of an ARP reply and a
    /// neighbour advertisement, and its length.
    answer: [u8; ADVERTISEMENT_FRAME_LEN],
    answer_len: usize,
    counters: L2Counters,
}

impl<P: Copy + Eq + std::hash::Hash> Layer2<P> {
    /// A switch that knows no MAC but, in interface mode, the device's, from `now`.
    pub fn new(config: L2Config, now: Instant) -> Self {
        let mut local = HashMap::new();
        if config.mode == L2Mode::Interface {
            // The device's own MAC is ours before it sends anything.
            local.insert(config.device_mac, now);
        }
        Self {
            local_changed: !local.is_empty(),
            config,
            local,
            remote: HashMap::new(),
            announced: HashMap::new(),
            contested: HashMap::new(),
            moved: HashMap::new(),
            out: Bucket::default(),
            inbound: HashMap::new(),
            partials: Vec::new(),
            assembled: Vec::new(),
            next_id: 0,
            bindings: HashMap::new(),
            conflicted: HashMap::new(),
            answer: [0; ADVERTISEMENT_FRAME_LEN],
            answer_len: 0,
            counters: L2Counters::default(),
        }
    }

    /// The switch's settings.
    pub fn config(&self) -> &L2Config {
        &self.config
    }

    /// The namespace's policy denied the frame the switch just sent to one member
    /// (`to_peer`: counted there no more) or took from one (`to_peer` false).
    pub fn count_denied(&mut self, to_peer: bool) {
        if to_peer {
            self.counters.to_peer = self.counters.to_peer.saturating_sub(1);
        }
        self.counters.drops[L2Drop::Policy.index()] += 1;
    }

    /// What the switch has done so far.
    pub fn counters(&self) -> &L2Counters {
        &self.counters
    }

    /// MACs learned on this side.
    pub fn local_macs(&self) -> Vec<Mac> {
        let mut macs: Vec<Mac> = self.local.keys().copied().collect();
        macs.sort_unstable();
        macs
    }

    /// The MACs `peer` announced last (none if it announced none).
    pub fn peer_macs(&self, peer: P) -> &[Mac] {
        self.announced.get(&peer).map_or(&[], Vec::as_slice)
    }

    /// How many MACs members announced (that this switch keeps).
    pub fn remote_count(&self) -> usize {
        self.remote.len()
    }

    /// Whether the MACs on this side changed since the last call: then the agent
    /// announces [`Layer2::local_macs`] again.
    pub fn take_local_changed(&mut self) -> bool {
        std::mem::take(&mut self.local_changed)
    }

    /// `peer` announced `macs` (all it holds in this namespace) at `now`: they replace what
    /// it announced before. A MAC on this side goes to the member only if this side has
    /// not heard from it for [`RELEARN_INTERVAL`] (a host that moved there); else it stays
    /// ours, counted as a conflict.
    ///
    /// A MAC kept here because it was heard within the second is contested: it goes to the
    /// member as soon as this side has been silent for a second ([`Layer2::handle_timeout`]),
    /// so a migrated VM's MAC follows it within about a second of its last frame here.
    pub fn set_peer_macs(&mut self, now: Instant, peer: P, macs: &[Mac]) {
        self.remote.retain(|_, p| *p != peer);
        self.contested.retain(|_, p| *p != peer);
        let mut list: Vec<Mac> = macs
            .iter()
            .filter(|m| !is_group(**m))
            .take(MAX_MACS)
            .copied()
            .collect();
        list.sort_unstable();
        list.dedup();
        for mac in &list {
            if let Some(seen) = self.local.get(mac) {
                self.counters.mac_conflicts += 1;
                if self.config.mode == L2Mode::Interface && *mac == self.config.device_mac {
                    continue;
                }
                if now.saturating_duration_since(*seen) < RELEARN_INTERVAL {
                    self.contested.insert(*mac, peer);
                    continue;
                }
                self.local.remove(mac);
                self.moved.insert(*mac, now);
                self.local_changed = true;
                self.counters.moves += 1;
            }
            if self.remote.len() >= MAX_MACS && !self.remote.contains_key(mac) {
                self.counters.table_full += 1;
                continue;
            }
            self.remote.insert(*mac, peer);
        }
        self.announced.insert(peer, list);
    }

    /// `peer`'s tunnel is gone: its MACs and its flood bucket go with it.
    pub fn remove_peer(&mut self, peer: P) {
        self.remote.retain(|_, p| *p != peer);
        self.announced.remove(&peer);
        self.contested.retain(|_, p| *p != peer);
        self.inbound.remove(&peer);
        self.partials.retain(|p| p.from != peer);
    }

    /// Handles a frame the kernel wrote to the TAP at `now` (untagged by
    /// [`Layer2::untag`] on a trunk).
    pub fn handle_tap_frame(&mut self, now: Instant, frame: &[u8]) -> L2Action<P> {
        let action = self.classify_tap_frame(now, frame);
        match action {
            L2Action::ToPeer(_) => self.counters.to_peer += 1,
            L2Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
            L2Action::Flood | L2Action::ToTap | L2Action::Held | L2Action::Answer => {}
        }
        action
    }

    /// Whether the namespace carries `frame`'s EtherType (past up to two 802.1Q tags).
    fn carries(&self, frame: &[u8]) -> bool {
        self.config.ethertypes.is_empty()
            || ethertype(frame).is_some_and(|t| self.config.ethertypes.contains(&t))
    }

    fn classify_tap_frame(&mut self, now: Instant, frame: &[u8]) -> L2Action<P> {
        let Some((dst, src)) = macs(frame) else {
            return L2Action::Drop(L2Drop::Malformed);
        };
        if is_group(src) {
            return L2Action::Drop(L2Drop::Malformed);
        }
        if !self.learn(now, src) {
            return L2Action::Drop(L2Drop::Conflict);
        }
        self.unbind_local(frame);
        if frame.len() > MAX_FRAME {
            return L2Action::Drop(L2Drop::TooBig);
        }
        if !self.carries(frame) {
            return L2Action::Drop(L2Drop::EtherType);
        }
        if !is_group(dst) {
            if let Some(peer) = self.remote.get(&dst) {
                return L2Action::ToPeer(*peer);
            }
            if self.local.contains_key(&dst) {
                return L2Action::Drop(L2Drop::Local);
            }
        }
        let request = request(frame);
        if let Some(request) = request {
            if self.suppress(now, request) {
                return L2Action::Answer;
            }
        }
        if !self.out.take(self.config.flood_rate, now) {
            return L2Action::Drop(L2Drop::FloodRateLimited);
        }
        if let Some(request) = request {
            self.count_flooded(request);
        }
        if is_group(dst) {
            self.counters.floods_out += 1;
        } else {
            self.counters.unknown_unicast += 1;
        }
        L2Action::Flood
    }

    /// Learns `src` on this side; false if it is a member's and moved too recently.
    fn learn(&mut self, now: Instant, src: Mac) -> bool {
        if let Some(seen) = self.local.get_mut(&src) {
            *seen = now;
            return true;
        }
        if self.remote.contains_key(&src) {
            self.counters.mac_conflicts += 1;
            let recent = self
                .moved
                .get(&src)
                .is_some_and(|t| now.saturating_duration_since(*t) < RELEARN_INTERVAL);
            if recent {
                return false;
            }
            if self.local.len() >= self.config.max_local {
                self.counters.table_full += 1;
                return true;
            }
            // A VM that moved here, or a loop: ours from now on, once a second at most.
            self.moved.insert(src, now);
            self.remote.remove(&src);
            self.counters.moves += 1;
        }
        if self.local.len() >= self.config.max_local {
            self.counters.table_full += 1;
            return true;
        }
        self.local.insert(src, now);
        self.counters.learned += 1;
        self.local_changed = true;
        true
    }

    /// Handles a frame from member `from` (its source MAC already checked against what
    /// the member announced) at `now`.
    pub fn handle_peer_frame(&mut self, now: Instant, from: P, frame: &[u8]) -> L2Action<P> {
        let action = self.classify_peer_frame(now, from, frame);
        match action {
            L2Action::ToTap => self.counters.to_tap += 1,
            L2Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
            L2Action::ToPeer(_) | L2Action::Flood | L2Action::Held | L2Action::Answer => {}
        }
        action
    }

    fn classify_peer_frame(&mut self, now: Instant, from: P, frame: &[u8]) -> L2Action<P> {
        let Some((dst, src)) = macs(frame) else {
            return L2Action::Drop(L2Drop::Malformed);
        };
        if is_group(src) {
            return L2Action::Drop(L2Drop::Malformed);
        }
        if self.local.contains_key(&src) {
            self.counters.mac_conflicts += 1;
            return L2Action::Drop(L2Drop::Conflict);
        }
        self.bind(now, frame);
        if !self.carries(frame) {
            return L2Action::Drop(L2Drop::EtherType);
        }
        let known_here = self.local.contains_key(&dst);
        if is_group(dst) || !known_here {
            if self.config.mode == L2Mode::Interface && !is_group(dst) {
                return L2Action::Drop(L2Drop::NotForUs);
            }
            let rate = self.config.flood_rate;
            if !self.inbound.entry(from).or_default().take(rate, now) {
                return L2Action::Drop(L2Drop::FloodRateLimited);
            }
            self.counters.floods_in += 1;
        }
        L2Action::ToTap
    }

    /// When [`Layer2::handle_timeout`] wants to run next, if anything waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let device = self.config.device_mac;
        let aged = self
            .local
            .iter()
            .filter(|(mac, _)| !(self.config.mode == L2Mode::Interface && **mac == device))
            .map(|(_, seen)| *seen + MAC_AGE)
            .min();
        let partial = self.partials.iter().map(|p| p.deadline).min();
        let contested = self
            .contested
            .keys()
            .filter_map(|mac| self.local.get(mac))
            .map(|seen| *seen + RELEARN_INTERVAL)
            .min();
        [aged, partial, contested].into_iter().flatten().min()
    }

    /// Forgets MACs on this side silent for [`MAC_AGE`] (never the device's own), and
    /// gives contested MACs silent for [`RELEARN_INTERVAL`] to the member that announced
    /// them.
    pub fn handle_timeout(&mut self, now: Instant) {
        let settled: Vec<(Mac, P)> = self
            .contested
            .iter()
            .filter(|(mac, _)| {
                self.local
                    .get(*mac)
                    .is_none_or(|seen| now.saturating_duration_since(*seen) >= RELEARN_INTERVAL)
            })
            .map(|(mac, peer)| (*mac, *peer))
            .collect();
        for (mac, peer) in settled {
            self.contested.remove(&mac);
            if self.local.remove(&mac).is_some() {
                self.local_changed = true;
                self.moved.insert(mac, now);
                self.counters.moves += 1;
            }
            if self.remote.len() < MAX_MACS || self.remote.contains_key(&mac) {
                self.remote.insert(mac, peer);
            }
        }
        let (mode, device) = (self.config.mode, self.config.device_mac);
        let before = self.local.len();
        self.local.retain(|mac, seen| {
            (mode == L2Mode::Interface && *mac == device)
                || now.saturating_duration_since(*seen) < MAC_AGE
        });
        if self.local.len() != before {
            self.local_changed = true;
        }
        self.moved
            .retain(|_, t| now.saturating_duration_since(*t) < RELEARN_INTERVAL);
        self.expire(now);
    }
}

/// The destination and source MACs of a frame.
fn macs(frame: &[u8]) -> Option<(Mac, Mac)> {
    let header = frame.get(..ETH_HEADER_LEN)?;
    let dst = <Mac>::try_from(&header[..6]).ok()?;
    let src = <Mac>::try_from(&header[6..12]).ok()?;
    Some((dst, src))
}

/// The EtherType a frame carries, past up to two VLAN tags (802.1Q, 802.1ad); every 802.3
/// frame (a length, not a type) is [`ETHERTYPE_LLC`]. `None` if the frame ends first.
pub fn ethertype(frame: &[u8]) -> Option<u16> {
    let mut at = 12;
    let mut ethertype = None;
    for _ in 0..3 {
        let Some(t) = frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
        else {
            break;
        };
        ethertype = Some(t);
        if t != TPID_8021Q && t != 0x88a8 {
            break;
        }
        at += VLAN_TAG_LEN;
    }
    ethertype.map(|t| if t < 0x0600 { ETHERTYPE_LLC } else { t })
}

/// What [`parse_ethertype`] takes, for errors.
pub const ETHERTYPE_NAMES: &str =
    "ipv4, arp, rarp, ipv6, lldp, llc (802.3 frames) or a hex EtherType from 0x0600 (as 0x88b5)";

/// An EtherType by name (`ipv4`, `arp`, `rarp`, `ipv6`, `lldp`; `llc`: every 802.3 frame)
/// or in hex from 0x0600 (`0x88b5`); `None` for anything else.
pub fn parse_ethertype(text: &str) -> Option<u16> {
    match text.to_ascii_lowercase().as_str() {
        "ipv4" => Some(0x0800),
        "arp" => Some(0x0806),
        "rarp" => Some(0x8035),
        "ipv6" => Some(0x86dd),
        "lldp" => Some(0x88cc),
        "llc" => Some(ETHERTYPE_LLC),
        other => other
            .strip_prefix("0x")
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok())
            .filter(|v| *v >= 0x0600),
    }
}

/// Broadcast or multicast: the group bit of the first octet.
fn is_group(mac: Mac) -> bool {
    mac[0] & 1 == 1
}

mod envelope;
mod neighbours;
mod reassembly;
mod vlan;

use crate::switch::broadcast::Bucket;
use neighbours::{request, Binding};
use reassembly::Partial;

pub use envelope::*;
pub use vlan::*;

#[cfg(test)]
mod tests;

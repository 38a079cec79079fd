//! One tunnel to one member in one namespace: its WireGuard state (boringtun's `Tunn`), the
//! path its datagrams take (direct, or through a relay while the direct path is silent),
//! path probes and round trip, liveness, and what the member announced.
//!
//! A [`Peer`] decides; the [`Node`](super::Node) carries out what needs other tunnels (a
//! relay request goes through another member) or the transmit queue.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::{Tunn, TunnResult};

use super::hello::{ANNOUNCE_INTERVAL, HELLO_INTERVAL};
use super::relay::{RELAY_AFTER, RELAY_RETRY};
use super::shared::Tunnel;
use super::stats::{DropReason, PeerDropReason, PeerStats};
use super::{NamespaceId, PeerHandle, Received, SEND_HEADROOM};
use crate::wire::{self, is_control, WG_DATA_OVERHEAD};
use crate::PeerId;

/// WireGuard persistent keepalive, seconds: keeps NAT mappings open and proves liveness.
pub const KEEPALIVE_SECS: u16 = 25;

/// A member we sent packets to and heard nothing from for this long is gone. A live one
/// answers data within WireGuard's keepalive timeout (10 s) even when it has nothing to say.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(15);

/// A configured endpoint is hello'd again when nothing was heard from it for this long
/// (twice the keepalive, plus slack): the member behind it may have restarted with no
/// memory of us.
pub const PEER_SILENT_AFTER: Duration = Duration::from_secs(60);

/// A probe sent because a member stopped answering must be answered within this long, or
/// the path is silent. A working path answers within a round trip; one slower than a
/// second is no path for interactive traffic either.
pub(super) const SILENCE_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// While relayed, the direct path is probed this often.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The round trip of each live tunnel's current path is measured this often.
pub const RTT_INTERVAL: Duration = Duration::from_secs(10);

/// Probes awaiting an answer, per tunnel.
const MAX_PROBES: usize = 4;

/// After our own underlay address changed, a member that has not answered our roaming
/// probe yet is probed again this often...
pub const ROAM_PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// ...this many times in all (the first at once): two seconds, twice the one-second target
/// for traffic to come back, before the path's own silence detection takes over.
pub const ROAM_PROBES: u32 = 10;

/// Probes telling a member that our underlay address changed, until one is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Roam {
    next: Instant,
    left: u32,
}

/// Where a datagram goes, or came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// The member's own endpoint.
    Direct(SocketAddr),
    /// Through a relay at `via`, in `session`.
    Relay { via: SocketAddr, session: u32 },
}

impl Route {
    /// The underlay address the datagram came from or goes to.
    pub(super) fn addr(self) -> SocketAddr {
        match self {
            Route::Direct(a) | Route::Relay { via: a, .. } => a,
        }
    }

    pub(super) fn source_ip(self) -> IpAddr {
        self.addr().ip()
    }

    pub(super) fn is_direct(self) -> bool {
        matches!(self, Route::Direct(_))
    }
}

/// A relay session carrying one member's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Relay {
    pub(super) via: PeerHandle,
    pub(super) session: u32,
    /// The member's endpoint as the relay sees it: behind a NAT, its public mapping, which
    /// the direct probes try too (UDP hole punching: both ends probe at once).
    pub(super) observed: SocketAddr,
}

/// What a tunnel's path needs from the node at a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathAction {
    /// Ask a member we reach directly to relay; `attempt` picks the candidate.
    RequestRelay { attempt: u32 },
    /// While relayed: probe the direct path, at the endpoint we know and at the one the
    /// relay observed.
    ProbeDirect {
        known: SocketAddr,
        observed: Option<SocketAddr>,
    },
    /// Measure the round trip of the current path.
    ProbeRtt,
}

/// The state of one tunnel.
pub(super) struct Peer {
    pub(super) ns: NamespaceId,
    pub(super) id: PeerId,
    /// Its WireGuard state, shared with the workers: shard 0, then the others both ends
    /// accept (`shared.rs`).
    pub(super) shards: Vec<Arc<Tunnel>>,
    /// Its certificate, once it showed a good one (namespaces with an authority).
    pub(super) certificate: Option<crate::cert::Certificate>,
    /// The direct path (WireGuard roaming: the last address an authenticated packet came
    /// from directly).
    pub(super) endpoint: SocketAddr,
    /// The relay session for this member, once one was offered.
    pub(super) relay: Option<Relay>,
    /// Sending through `relay`: the direct path did not answer.
    pub(super) relayed: bool,
    /// When we first sent this member something it has not answered yet.
    pub(super) unanswered_since: Option<Instant>,
    /// When the probe asking whether the quiet path still works left, until anything of
    /// the member's arrives.
    silence_probe: Option<Instant>,
    next_relay_request: Instant,
    relay_requests: u32,
    /// Next direct-path probe (while relayed) or round-trip probe.
    next_probe: Instant,
    next_rtt_probe: Instant,
    probes: VecDeque<(u32, Instant)>,
    pub(super) rtt: Option<Duration>,
    /// Our underlay address changed and the member has not answered from it yet.
    roam: Option<Roam>,
    pub(super) addresses: Vec<Ipv4Addr>,
    /// `addresses` sorted, for the source check of every packet.
    sorted: Vec<Ipv4Addr>,
    /// Its IPv6 addresses (`dual_stack.rs`), sorted.
    pub(super) addresses6: Vec<Ipv6Addr>,
    /// A layer-2 namespace: the MACs it announced, the only ones its frames may come from,
    /// and the parts of its next announcement.
    pub(super) macs: Vec<[u8; 6]>,
    mac_parts: crate::wire::MacParts,
    /// Of `macs`, those the DHT says are another member's ([`super::Node::refuse_mac`]):
    /// its frames from them are dropped, and frames to them do not go to it.
    pub(super) refused_macs: Vec<[u8; 6]>,
    /// Addresses this member may forward packets to from any source, until when: it held
    /// them until a LAN host moved here, and sends on what still reaches it for a grace
    /// period ([`crate::Node::accept_forwarded`]).
    pub(super) forwards: Vec<(IpAddr, Instant)>,
    pub(super) have_their_announce: bool,
    /// Its announcement carried its IPv6 list (it reads ours too: `speaks_addresses6`).
    pub(super) got_list6: bool,
    /// When we last sent our announcement because its packets came without its own.
    pub(super) announce_asked: Option<Instant>,
    /// Its announcement said it reads our uplinks (`bond.rs`).
    pub(super) speaks_uplinks: bool,
    /// Its announcement said it reads our IPv6 addresses (`dual_stack.rs`).
    pub(super) speaks_addresses6: bool,
    /// Its announcement said it reads address lists in parts (`address_parts.rs`).
    pub(super) reads_parts: bool,
    /// Its last announcement said its lists follow in parts of this generation, and they
    /// have not all come yet.
    pub(super) parts_expected: Option<u16>,
    /// The parts of its lists gathered so far, and the last whole set not yet taken (its
    /// generation and addresses).
    pub(super) address_parts: crate::wire::AddressParts,
    pub(super) parts_whole: Option<(u16, Vec<std::net::IpAddr>)>,
    /// The generation of its lists we took last: an announcement naming it again (its
    /// periodic one, or its answer to ours) waits for nothing.
    pub(super) parts_taken: Option<u16>,
    /// The links it announced and the bond over them.
    pub(super) bond: Option<super::bond::Bonded>,
    /// We initiate handshakes with this member: the side with the lower X25519 key.
    pub(super) initiator: bool,
    /// Send our announcement once the handshake in flight completes.
    pub(super) announce_pending: bool,
    /// Our announcement went out (or waits in the tunnel) since this tunnel opened: a host
    /// packet sent before it would be dropped as spoofed, its source not yet announced.
    pub(super) announced: bool,
    /// Last time a hello request made us restart the handshake.
    last_forced: Option<Instant>,
    pub(super) next_announce: Instant,
    pub(super) last_heard: Instant,
    /// `stats.tx_packets` at the previous timeout, to tell whether we are sending.
    tx_seen: u64,
    pub(super) stats: PeerStats,
}

impl Peer {
    /// A tunnel opened at `now`, not yet handshaken.
    pub(super) fn new(
        now: Instant,
        ns: NamespaceId,
        id: PeerId,
        tunnel: Arc<Tunnel>,
        endpoint: SocketAddr,
        initiator: bool,
    ) -> Self {
        Self {
            ns,
            id,
            shards: vec![tunnel],
            certificate: None,
            endpoint,
            relay: None,
            relayed: false,
            unanswered_since: None,
            silence_probe: None,
            next_relay_request: now,
            relay_requests: 0,
            next_probe: now,
            next_rtt_probe: now + RTT_INTERVAL,
            probes: VecDeque::new(),
            rtt: None,
            roam: None,
            addresses: Vec::new(),
            sorted: Vec::new(),
            addresses6: Vec::new(),
            macs: Vec::new(),
            mac_parts: Default::default(),
            refused_macs: Vec::new(),
            forwards: Vec::new(),
            have_their_announce: false,
            announce_asked: None,
            got_list6: false,
            speaks_uplinks: false,
            speaks_addresses6: false,
            reads_parts: false,
            parts_expected: None,
            address_parts: Default::default(),
            parts_whole: None,
            parts_taken: None,
            bond: None,
            initiator,
            announce_pending: false,
            announced: false,
            last_forced: None,
            // A responder whose initiator has not completed a handshake a second from now
            // asks it again (the timer path sends a hello rather than initiating).
            next_announce: now
                + if initiator {
                    ANNOUNCE_INTERVAL
                } else {
                    HELLO_INTERVAL
                },
            last_heard: now,
            tx_seen: 0,
            stats: PeerStats::default(),
        }
    }

    /// A handshake completed and its session has not expired.
    pub(super) fn has_session(&self) -> bool {
        self.tunn().stats().0.is_some()
    }

    /// The WireGuard state of shard 0 (handshakes on hellos, keepalives, control), locked.
    pub(super) fn tunn(&self) -> std::sync::MutexGuard<'_, Tunn> {
        self.shards[0].lock()
    }

    /// With a session, and heard from recently.
    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.has_session() && now.saturating_duration_since(self.last_heard) < PEER_SILENT_AFTER
    }

    /// Reached directly, with a session, and heard recently: fit to relay through.
    pub(super) fn is_direct_and_live(&self, now: Instant) -> bool {
        !self.relayed && self.is_live(now)
    }

    /// The relay carrying our datagrams now, if the direct path is not in use.
    pub(super) fn relayed_via(&self) -> Option<Relay> {
        self.relay.filter(|_| self.relayed)
    }

    /// Where datagrams go now: through the relay (found at `relay_endpoint`) while
    /// relayed, else direct.
    pub(super) fn route(&self, relay_endpoint: Option<SocketAddr>) -> Route {
        match (self.relayed_via(), relay_endpoint) {
            (Some(r), Some(via)) => Route::Relay {
                via,
                session: r.session,
            },
            _ => Route::Direct(self.endpoint),
        }
    }

    /// Encrypts `packet` into `out[SEND_HEADROOM..]`; the length of the WireGuard message
    /// written there. Without a session the packet is queued in the tunnel and an
    /// initiation is written instead.
    pub(super) fn encapsulate(&mut self, packet: &[u8], out: &mut [u8]) -> Option<usize> {
        let needed = SEND_HEADROOM + (packet.len() + WG_DATA_OVERHEAD).max(wire::WG_INIT_LEN);
        if out.len() < needed {
            self.stats.count_drop(PeerDropReason::TooLarge);
            return None;
        }
        let len = match self.tunn().encapsulate(packet, &mut out[SEND_HEADROOM..]) {
            TunnResult::WriteToNetwork(d) => d.len(),
            _ => return None,
        };
        if !is_control(packet) {
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += packet.len() as u64;
        }
        Some(len)
    }

    /// Writes a fresh handshake initiation into `out[SEND_HEADROOM..]`; its length.
    pub(super) fn format_initiation(&mut self, out: &mut [u8]) -> Option<usize> {
        match self
            .tunn()
            .format_handshake_initiation(&mut out[SEND_HEADROOM..], true)
        {
            TunnResult::WriteToNetwork(d) => Some(d.len()),
            _ => None,
        }
    }

    /// A decrypted host packet from `src`: counted and delivered if the member owns `src`
    /// (or forwards it from another namespace as the gateway of a link: `via_link`). A
    /// packet to `dst` from another source is taken while the member forwards to it.
    pub(super) fn accept_packet(
        &mut self,
        now: Instant,
        src: Ipv4Addr,
        dst: Option<Ipv4Addr>,
        len: usize,
        via_link: bool,
    ) -> Result<(), PeerDropReason> {
        if !via_link && self.sorted.binary_search(&src).is_err() {
            self.take_forwarded(now, dst.map(IpAddr::V4))?;
        }
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += len as u64;
        Ok(())
    }

    /// A packet to `dst` from an address the member does not hold: taken while it
    /// forwards to `dst` (a LAN host that moved here from its LAN), else spoofed.
    fn take_forwarded(&mut self, now: Instant, dst: Option<IpAddr>) -> Result<(), PeerDropReason> {
        if self.forwards.is_empty() {
            return Err(PeerDropReason::SpoofedSource);
        }
        self.forwards.retain(|(_, until)| now < *until);
        if !dst.is_some_and(|d| self.forwards.iter().any(|(a, _)| *a == d)) {
            return Err(PeerDropReason::SpoofedSource);
        }
        self.stats.rx_forwarded += 1;
        Ok(())
    }

    /// A decrypted IPv6 host packet from `src` to `dst`: counted and delivered if the
    /// member holds `src` (or forwards to `dst`, as [`Peer::accept_packet`]).
    pub(super) fn accept_packet6(
        &mut self,
        now: Instant,
        (src, dst): (Ipv6Addr, Option<Ipv6Addr>),
        len: usize,
    ) -> Result<(), PeerDropReason> {
        if self.addresses6.binary_search(&src).is_err() {
            self.take_forwarded(now, dst.map(IpAddr::V6))?;
        }
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += len as u64;
        Ok(())
    }

    /// Something the member's keys produced arrived by `route`: it is alive, and a direct
    /// packet moves its endpoint (WireGuard roaming), unless it came on one of the links
    /// the tunnel is bonded over: that link is alive, and the endpoint stays.
    pub(super) fn heard(&mut self, now: Instant, route: Route) {
        if let Route::Direct(from) = route {
            let bonded = self.bond.as_mut().is_some_and(|b| match b.link_of(from) {
                Some(link) => {
                    b.bond.heard(link, now);
                    true
                }
                None => false,
            });
            if !bonded && from != self.endpoint {
                tracing::info!(peer = ?self.id, old = %self.endpoint, new = %from, "member endpoint moved");
                self.stats.endpoint_changes += 1;
                self.endpoint = from;
            }
        }
        self.last_heard = now;
        self.unanswered_since = None;
        self.silence_probe = None;
    }

    /// Notes whether we sent since the last timeout; true once the member has not answered
    /// for [`UNREACHABLE_AFTER`].
    pub(super) fn is_unreachable(&mut self, now: Instant) -> bool {
        if self.stats.tx_packets > self.tx_seen && self.unanswered_since.is_none() {
            self.unanswered_since = Some(now);
        }
        self.tx_seen = self.stats.tx_packets;
        self.unanswered_since
            .is_some_and(|t| now.saturating_duration_since(t) >= UNREACHABLE_AFTER)
    }

    /// The path's timers: a member that answered nothing on its path for [`RELAY_AFTER`]
    /// is asked with a probe; if that goes unanswered for [`SILENCE_PROBE_TIMEOUT`] the
    /// path is silent and the member goes back to the relay it had, or asks for one (every
    /// [`RELAY_RETRY`]). A relayed one has its direct path probed; a live one has its round
    /// trip measured.
    pub(super) fn poll_path(&mut self, now: Instant) -> Option<PathAction> {
        let quiet = self
            .unanswered_since
            .is_some_and(|t| now.saturating_duration_since(t) >= RELAY_AFTER);
        // Sending and hearing nothing back is not silence by itself: one-way traffic gets
        // no answer either (WireGuard's passive keepalive comes only after 10 s). With a
        // session, a probe asks; without one, the handshake itself went unanswered.
        let silent = quiet
            && (!self.has_session()
                || self
                    .silence_probe
                    .is_some_and(|t| now.saturating_duration_since(t) >= SILENCE_PROBE_TIMEOUT));
        if quiet && !silent {
            if self.silence_probe.is_some() {
                return None;
            }
            self.silence_probe = Some(now);
            return Some(PathAction::ProbeRtt);
        }
        if silent {
            if self.relay.is_some() && !self.relayed {
                // The direct path stopped answering: back to the relay we had.
                tracing::info!(peer = ?self.id, "direct path silent: relaying");
                self.relayed = true;
                self.unanswered_since = Some(now);
                // The relay is asked the same way before it is given up.
                self.silence_probe = None;
                self.next_probe = now + PROBE_INTERVAL;
            } else if now >= self.next_relay_request {
                self.next_relay_request = now + RELAY_RETRY;
                self.relay_requests = self.relay_requests.wrapping_add(1);
                return Some(PathAction::RequestRelay {
                    attempt: self.relay_requests,
                });
            }
            return None;
        }
        if !self.has_session() {
            return None;
        }
        if self.relayed && now >= self.next_probe {
            self.next_probe = now + PROBE_INTERVAL;
            let observed = self.relay.map(|r| r.observed);
            Some(PathAction::ProbeDirect {
                known: self.endpoint,
                observed: observed.filter(|o| *o != self.endpoint),
            })
        } else if now >= self.next_rtt_probe
            && now.saturating_duration_since(self.last_heard) < PEER_SILENT_AFTER
        {
            self.next_rtt_probe = now + RTT_INTERVAL;
            Some(PathAction::ProbeRtt)
        } else {
            None
        }
    }

    /// A probe with `nonce` leaves now; the oldest unanswered one is forgotten.
    pub(super) fn start_probe(&mut self, now: Instant, nonce: u32) {
        if self.probes.len() >= MAX_PROBES {
            self.probes.pop_front();
        }
        self.probes.push_back((nonce, now));
    }

    /// The answer to probe `nonce` came by `route`: the round trip of the current path,
    /// and a working direct path ends the relay.
    pub(super) fn handle_probe_ack(&mut self, now: Instant, route: Route, nonce: u32) {
        let Some(i) = self.probes.iter().position(|(n, _)| *n == nonce) else {
            return;
        };
        let Some((_, sent)) = self.probes.remove(i) else {
            return;
        };
        let direct = route.is_direct();
        // The round trip shown is the current path's (a late relayed answer is not it).
        if direct || self.relayed {
            self.rtt = Some(now.saturating_duration_since(sent));
        }
        if direct && self.relayed {
            tracing::info!(peer = ?self.id, "direct path answers: leaving the relay");
            self.relayed = false;
        }
        // The member answered the address our probe came from: it knows where we are now.
        if direct {
            self.roam = None;
        }
    }

    /// Our underlay address changed: the member must hear from the new one. A member with
    /// a session is probed on the direct path from `now` on (see [`Peer::poll_roam`]);
    /// false if it has none (its handshake, or a hello, has to tell it instead).
    pub(super) fn start_roam(&mut self, now: Instant) -> bool {
        if !self.has_session() {
            return false;
        }
        self.roam = Some(Roam {
            next: now,
            left: ROAM_PROBES,
        });
        true
    }

    /// Whether a roaming probe is due now (our address changed and the member has not
    /// answered one yet): at most [`ROAM_PROBES`], [`ROAM_PROBE_INTERVAL`] apart.
    pub(super) fn poll_roam(&mut self, now: Instant) -> bool {
        let Some(roam) = self.roam.as_mut() else {
            return false;
        };
        if now < roam.next {
            return false;
        }
        roam.left -= 1;
        roam.next = now + ROAM_PROBE_INTERVAL;
        if roam.left == 0 {
            self.roam = None;
        }
        true
    }

    /// When the next roaming probe is due, if one is.
    pub(super) fn roam_timeout(&self) -> Option<Instant> {
        self.roam.map(|r| r.next)
    }

    /// Whether a hello request should make us start a fresh handshake: only the initiator
    /// does, at most once per [`HELLO_INTERVAL`]. When it should, our announcement is sent
    /// once the handshake completes.
    ///
    /// Even with a member heard a moment ago: a member killed and restarted at once sends
    /// its hello while we still hear its last packets, and waiting for silence kept it
    /// unreachable for seconds. A replayed hello costs at most one handshake per interval,
    /// and the old session carries traffic until the new one completes.
    pub(super) fn should_restart_handshake(&mut self, now: Instant) -> bool {
        let recent = self
            .last_forced
            .is_some_and(|t| now.saturating_duration_since(t) < HELLO_INTERVAL);
        if self.initiator && !recent {
            self.last_forced = Some(now);
            self.announce_pending = true;
            true
        } else {
            false
        }
    }

    /// Sends through `relay` from now on; the session it replaces, if another.
    pub(super) fn use_relay(&mut self, now: Instant, relay: Relay) -> Option<u32> {
        let old = self.relay.replace(relay);
        self.relayed = true;
        self.next_probe = now;
        old.map(|r| r.session).filter(|s| *s != relay.session)
    }

    /// The member relaying for us through `via` is gone: back to the direct path (a relay
    /// is asked again if it stays silent). The session it carried, if it did.
    pub(super) fn forget_relay_via(&mut self, via: PeerHandle) -> Option<u32> {
        if self.relay.is_none_or(|r| r.via != via) {
            return None;
        }
        self.relayed = false;
        self.relay.take().map(|r| r.session)
    }

    /// Whether we have its announcement, and its IPv6 list if it sends one (what our
    /// `have_yours` says: until then it announces again when it hears ours).
    pub(super) fn has_their_announcement(&self) -> bool {
        self.have_their_announce
            && (!self.speaks_addresses6 || self.got_list6)
            && self.parts_expected.is_none()
    }

    /// The member announced `addresses`; true if they changed.
    pub(super) fn handle_announce(&mut self, addresses: &[Ipv4Addr]) -> bool {
        self.have_their_announce = true;
        if self.addresses == addresses {
            return false;
        }
        tracing::info!(peer = ?self.id, n = addresses.len(), first = ?addresses.first(), "member addresses");
        self.addresses = addresses.to_vec();
        self.sorted = addresses.to_vec();
        self.sorted.sort_unstable();
        true
    }

    /// A part of the member's MAC announcement: once its last part is in, what it holds
    /// now (sorted, deduplicated here), less the MACs refused it.
    pub(super) fn handle_macs(&mut self, part: crate::wire::MacPart) -> Option<Vec<[u8; 6]>> {
        let mut macs = self.mac_parts.take(part)?;
        macs.sort_unstable();
        macs.dedup();
        if self.macs != macs {
            tracing::debug!(peer = ?self.id, macs = macs.len(), "member MACs");
            // A refusal lasts while the MAC is announced (the driver refuses it again if
            // it comes back).
            self.refused_macs.retain(|m| macs.contains(m));
            self.macs = macs;
        }
        Some(self.usable_macs())
    }

    /// The MACs it announced that it may use: not refused.
    pub(super) fn usable_macs(&self) -> Vec<[u8; 6]> {
        self.macs
            .iter()
            .filter(|m| !self.refused_macs.contains(m))
            .copied()
            .collect()
    }

    /// A piece of a frame from a layer-2 namespace's member: counted (the switch that
    /// puts the frame together checks its source).
    pub(super) fn accept_piece(&mut self, len: usize) -> Result<(), PeerDropReason> {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += len as u64;
        Ok(())
    }

    /// A frame from a layer-2 namespace's member: counted and delivered if it comes from
    /// a MAC the member announced.
    pub(super) fn accept_frame(&mut self, frame: &[u8], len: usize) -> Result<(), PeerDropReason> {
        let src = frame.get(6..12).and_then(|s| <[u8; 6]>::try_from(s).ok());
        if src
            .is_none_or(|s| self.macs.binary_search(&s).is_err() || self.refused_macs.contains(&s))
        {
            return Err(PeerDropReason::SpoofedSource);
        }
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += len as u64;
        Ok(())
    }
}

/// What a boringtun error means for the datagram that caused it.
pub(super) fn tunnel_error(handle: PeerHandle, e: WireGuardError) -> Received {
    tracing::debug!(?handle, error = ?e, "tunnel error");
    match e {
        WireGuardError::InvalidAeadTag => Received::PeerDropped(handle, PeerDropReason::Decrypt),
        WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => {
            Received::PeerDropped(handle, PeerDropReason::Replay)
        }
        WireGuardError::InvalidPacket => Received::PeerDropped(handle, PeerDropReason::BadPayload),
        WireGuardError::WrongIndex
        | WireGuardError::NoCurrentSession
        | WireGuardError::ConnectionExpired => Received::Dropped(DropReason::UnknownSession),
        _ => Received::Dropped(DropReason::Handshake),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::test_epoch;
    use crate::Identity;

    fn peer(now: Instant, initiator: bool) -> Peer {
        let me = Identity::from_seed([1; 32]);
        let them = Identity::from_seed([2; 32]);
        let tunn = Tunn::new(
            me.x25519(),
            x25519_dalek::PublicKey::from(&them.x25519()),
            Some([7; 32]),
            Some(KEEPALIVE_SECS),
            0,
            None,
        );
        let endpoint = SocketAddr::from(([192, 0, 2, 1], 7400));
        Peer::new(
            now,
            NamespaceId(0),
            them.peer_id(),
            Arc::new(Tunnel::new(PeerHandle(0), 0, tunn)),
            endpoint,
            initiator,
        )
    }

    /// A tunnel whose handshake with the member completed.
    fn handshaken(now: Instant) -> Peer {
        let p = peer(now, true);
        let me = Identity::from_seed([1; 32]);
        let them = Identity::from_seed([2; 32]);
        let mut remote = Tunn::new(
            them.x25519(),
            x25519_dalek::PublicKey::from(&me.x25519()),
            Some([7; 32]),
            None,
            1,
            None,
        );
        let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
        let mut tunn = p.tunn();
        let TunnResult::WriteToNetwork(init) = tunn.format_handshake_initiation(&mut a, false)
        else {
            panic!("no initiation");
        };
        let TunnResult::WriteToNetwork(response) = remote.decapsulate(None, init, &mut b) else {
            panic!("no response");
        };
        let _ = tunn.decapsulate(None, response, &mut a);
        drop(tunn);
        assert!(p.has_session());
        p
    }

    /// Runs `p` for `steps` ticks of 100 ms from `t` while we send every tick and the
    /// member sends nothing (one-way traffic); probes are answered 20 ms later if
    /// `answered`. Returns the time after the last tick.
    fn one_way(p: &mut Peer, mut t: Instant, steps: u32, answered: bool) -> Instant {
        let tick = Duration::from_millis(100);
        for nonce in 0..steps {
            p.stats.tx_packets += 1;
            let _ = p.is_unreachable(t);
            if p.poll_path(t) == Some(PathAction::ProbeRtt) {
                p.start_probe(t, nonce);
                if answered {
                    let at = t + Duration::from_millis(20);
                    p.heard(at, Route::Direct(p.endpoint));
                    p.handle_probe_ack(at, Route::Direct(p.endpoint), nonce);
                }
            }
            t += tick;
        }
        t
    }

    #[test]
    fn one_way_traffic_relays_only_when_a_probe_goes_unanswered() {
        let t0 = test_epoch();
        let mut p = handshaken(t0);
        // A relay is known: a silent direct path would switch to it at once.
        p.use_relay(t0, relay(3));
        p.relayed = false;
        // A minute of one-way traffic with every probe answered: never relayed, and the
        // path is asked about once per RELAY_AFTER at most, not every tick.
        let t = one_way(&mut p, t0, 600, true);
        assert!(!p.relayed, "relayed on one-way traffic");
        assert!(p.rtt.is_some(), "the probes were answered");
        // The member stops answering after one last packet: after RELAY_AFTER a probe goes
        // out, and once it is unanswered for SILENCE_PROBE_TIMEOUT, the relay takes over.
        p.heard(t, Route::Direct(p.endpoint));
        let quiet = t;
        let t = one_way(&mut p, t, 10, false);
        assert!(!p.relayed, "not before RELAY_AFTER");
        let steps = ((RELAY_AFTER + SILENCE_PROBE_TIMEOUT).as_millis() / 100) as u32 + 2;
        let t = one_way(&mut p, t, steps, false);
        assert!(p.relayed, "silent path not relayed");
        assert!(t.saturating_duration_since(quiet) >= RELAY_AFTER + SILENCE_PROBE_TIMEOUT);
    }

    const OBSERVED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 9)), 40000);
    const RELAY_AT: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3)), 7400);

    fn relay(session: u32) -> Relay {
        Relay {
            via: PeerHandle(5),
            session,
            observed: OBSERVED,
        }
    }

    #[test]
    fn route_is_direct_until_relayed_and_relayed_only_with_a_reachable_relay() {
        let now = test_epoch();
        let mut p = peer(now, true);
        assert_eq!(p.route(Some(RELAY_AT)), Route::Direct(p.endpoint));
        assert_eq!(p.use_relay(now, relay(9)), None);
        assert_eq!(
            p.route(Some(RELAY_AT)),
            Route::Relay {
                via: RELAY_AT,
                session: 9
            }
        );
        // The relay's tunnel is gone: direct is all that is left.
        assert_eq!(p.route(None), Route::Direct(p.endpoint));
        // A new session replaces the old one, which the node forgets.
        assert_eq!(p.use_relay(now, relay(10)), Some(9));
        assert_eq!(p.use_relay(now, relay(10)), None);
        assert_eq!(p.forget_relay_via(PeerHandle(6)), None);
        assert_eq!(p.forget_relay_via(PeerHandle(5)), Some(10));
        assert_eq!(p.route(Some(RELAY_AT)), Route::Direct(p.endpoint));
    }

    #[test]
    fn silence_asks_for_a_relay_once_per_retry_then_falls_back_to_the_known_relay() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        p.unanswered_since = Some(t0);
        assert_eq!(p.poll_path(t0 + RELAY_AFTER / 2), None, "not silent yet");
        let t = t0 + RELAY_AFTER;
        assert_eq!(
            p.poll_path(t),
            Some(PathAction::RequestRelay { attempt: 1 })
        );
        assert_eq!(p.poll_path(t), None, "one request per retry interval");
        assert_eq!(
            p.poll_path(t + RELAY_RETRY),
            Some(PathAction::RequestRelay { attempt: 2 }),
            "the next attempt asks the next candidate"
        );

        // It had a relay and went direct; the direct path went silent: back to the relay,
        // with no request.
        let mut p = peer(t0, true);
        p.use_relay(t0, relay(3));
        p.relayed = false;
        p.unanswered_since = Some(t0);
        assert_eq!(p.poll_path(t), None);
        assert!(p.relayed);
        assert_eq!(p.unanswered_since, Some(t), "the relay gets its own chance");
    }

    #[test]
    fn no_probes_without_a_session() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        p.use_relay(t0, relay(3));
        assert_eq!(p.poll_path(t0 + RTT_INTERVAL), None);
    }

    #[test]
    fn a_direct_probe_answer_ends_the_relay_and_measures_the_round_trip() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        p.use_relay(t0, relay(3));
        let via = Route::Relay {
            via: RELAY_AT,
            session: 3,
        };
        p.start_probe(t0, 1);
        p.start_probe(t0, 2);
        // An answer to a probe never sent changes nothing.
        p.handle_probe_ack(t0, Route::Direct(p.endpoint), 99);
        assert!(p.relayed);
        // Answered through the relay: the relayed round trip, still relayed.
        p.handle_probe_ack(t0 + Duration::from_millis(80), via, 1);
        assert_eq!(p.rtt, Some(Duration::from_millis(80)));
        assert!(p.relayed);
        // Answered directly: direct again.
        p.handle_probe_ack(t0 + Duration::from_millis(20), Route::Direct(OBSERVED), 2);
        assert_eq!(p.rtt, Some(Duration::from_millis(20)));
        assert!(!p.relayed);
        // A late relayed answer does not overwrite the direct round trip.
        p.start_probe(t0, 3);
        p.handle_probe_ack(t0 + Duration::from_millis(500), via, 3);
        assert_eq!(p.rtt, Some(Duration::from_millis(20)));
    }

    #[test]
    fn only_the_newest_probes_are_remembered() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        for nonce in 0..MAX_PROBES as u32 + 1 {
            p.start_probe(t0, nonce);
        }
        p.handle_probe_ack(t0 + Duration::from_millis(5), Route::Direct(p.endpoint), 0);
        assert_eq!(p.rtt, None, "the oldest probe was forgotten");
        p.handle_probe_ack(t0 + Duration::from_millis(5), Route::Direct(p.endpoint), 1);
        assert_eq!(p.rtt, Some(Duration::from_millis(5)));
    }

    #[test]
    fn unreachable_after_sending_into_silence() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        assert!(!p.is_unreachable(t0));
        assert_eq!(p.unanswered_since, None, "nothing sent, nothing expected");
        p.stats.tx_packets += 1;
        assert!(!p.is_unreachable(t0));
        assert_eq!(p.unanswered_since, Some(t0));
        assert!(!p.is_unreachable(t0 + UNREACHABLE_AFTER / 2));
        p.heard(t0 + UNREACHABLE_AFTER / 2, Route::Direct(OBSERVED));
        assert_eq!(p.endpoint, OBSERVED, "an authenticated direct packet roams");
        assert!(!p.is_unreachable(t0 + UNREACHABLE_AFTER));
        p.stats.tx_packets += 1;
        let t1 = t0 + UNREACHABLE_AFTER;
        assert!(!p.is_unreachable(t1));
        assert!(p.is_unreachable(t1 + UNREACHABLE_AFTER));
    }

    #[test]
    fn a_relayed_packet_does_not_move_the_endpoint() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        let before = p.endpoint;
        p.heard(
            t0,
            Route::Relay {
                via: RELAY_AT,
                session: 1,
            },
        );
        assert_eq!(p.endpoint, before);
    }

    #[test]
    fn only_the_initiator_restarts_and_at_most_once_per_hello_interval() {
        let t0 = test_epoch();
        let mut responder = peer(t0, false);
        assert!(!responder.should_restart_handshake(t0));
        let mut p = peer(t0, true);
        assert!(p.should_restart_handshake(t0));
        assert!(p.announce_pending);
        assert!(!p.should_restart_handshake(t0 + HELLO_INTERVAL / 2));
        assert!(p.should_restart_handshake(t0 + HELLO_INTERVAL));
        // A member heard a moment ago that asks (it was killed and restarted at once): a
        // fresh handshake now, not once its old session has gone quiet.
        let mut p = handshaken(t0);
        p.heard(t0, Route::Direct(p.endpoint));
        assert!(p.should_restart_handshake(t0 + Duration::from_millis(100)));
    }

    #[test]
    fn spoofed_sources_are_refused() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        assert!(!p.handle_announce(&[]), "no addresses, no change");
        assert!(p.have_their_announce);
        let mine = Ipv4Addr::new(10, 201, 0, 2);
        assert!(p.handle_announce(&[mine]));
        assert!(!p.handle_announce(&[mine]));
        assert_eq!(p.accept_packet(t0, mine, None, 84, false), Ok(()));
        let other = Ipv4Addr::new(10, 201, 0, 99);
        let moved = Ipv4Addr::new(10, 201, 0, 50);
        assert_eq!(
            p.accept_packet(t0, other, Some(moved), 84, false),
            Err(PeerDropReason::SpoofedSource)
        );
        assert_eq!((p.stats.rx_packets, p.stats.rx_bytes), (1, 84));
        // A LAN host moved away from this member: what it forwards to the host is taken,
        // from any source, until the grace period ends; nothing to another address.
        p.forwards.push((moved.into(), t0 + Duration::from_secs(5)));
        assert_eq!(p.accept_packet(t0, other, Some(moved), 84, false), Ok(()));
        assert_eq!(
            p.accept_packet(t0, other, Some(mine), 84, false),
            Err(PeerDropReason::SpoofedSource)
        );
        assert_eq!(
            p.accept_packet(t0 + Duration::from_secs(5), other, Some(moved), 84, false),
            Err(PeerDropReason::SpoofedSource)
        );
        assert_eq!(p.stats.rx_forwarded, 1);
    }

    #[test]
    fn ipv6_packets_to_a_host_that_moved_here_are_taken_in_its_grace_period() {
        let t0 = test_epoch();
        let mut p = peer(t0, true);
        let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("an address");
        let (mine, other, moved) = (v6("fd00::2"), v6("fd00::99"), v6("fd00::50"));
        p.addresses6 = vec![mine];
        assert_eq!(p.accept_packet6(t0, (mine, Some(other)), 80), Ok(()));
        assert_eq!(
            p.accept_packet6(t0, (other, Some(moved)), 80),
            Err(PeerDropReason::SpoofedSource)
        );
        p.forwards.push((moved.into(), t0 + Duration::from_secs(5)));
        assert_eq!(p.accept_packet6(t0, (other, Some(moved)), 80), Ok(()));
        assert_eq!(
            p.accept_packet6(t0, (other, Some(mine)), 80),
            Err(PeerDropReason::SpoofedSource),
            "only what goes to the moved host"
        );
        assert_eq!(
            p.accept_packet6(t0, (other, None), 80),
            Err(PeerDropReason::SpoofedSource)
        );
        assert_eq!(
            p.accept_packet6(t0 + Duration::from_secs(5), (other, Some(moved)), 80),
            Err(PeerDropReason::SpoofedSource),
            "not after the grace period"
        );
        // An IPv4 forward is not an IPv6 one of the same bits.
        p.forwards = vec![(
            Ipv4Addr::new(0, 0, 0, 0).into(),
            t0 + Duration::from_secs(5),
        )];
        assert_eq!(
            p.accept_packet6(t0, (other, Some(Ipv6Addr::UNSPECIFIED)), 80),
            Err(PeerDropReason::SpoofedSource)
        );
        assert_eq!((p.stats.rx_packets, p.stats.rx_forwarded), (2, 1));
    }
}

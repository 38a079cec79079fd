//! What the migration handoff (`hyphae_migrate`, driven by the agent) asks of a router's
//! membership: who holds a LAN host's address and for how long, a claim for it now, and
//! the host's DHCP client kept with the address it moved with. The lease transfer itself
//! is [`Membership::hand_off_hosted`] and [`Membership::adopt_hosted`]. Each takes an IPv4
//! or an IPv6 address: a LAN host's IPv6 addresses move by the same handoff, one by one.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use super::{Event, Membership, Purpose, Request};
use crate::records::{Envelope, MemberInfo};
use crate::PeerId;

/// How a claim for a LAN host's address ended (router mode), as [`Event::HostedClaimed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostedClaim {
    /// The address is this member's.
    Won,
    /// Another member holds it: the host may have moved here from its LAN.
    Held(PeerId),
    /// No quorum answered.
    Unanswered,
}

impl Membership {
    /// Reads who holds `address` and for how long yet: answered as [`Event::Holder`].
    pub fn look_up_holder(&mut self, address: IpAddr) {
        let key = self.ip_key(address);
        self.start_op(Request::Get { key }, Purpose::Holder(address));
    }

    /// The DHT key of `address`'s lease.
    fn ip_key(&self, address: IpAddr) -> crate::records::RecordKey {
        match address {
            IpAddr::V4(a) => self.keys.address_key(a),
            IpAddr::V6(a) => self.keys.address6_key(a),
        }
    }

    pub(super) fn holder_found(&mut self, now: Instant, address: IpAddr, envelopes: &[Envelope]) {
        let key = self.ip_key(address);
        let unix = self.clock.unix(now);
        // The replica with the longest lease left speaks: a transfer renews the record,
        // so the newest holder's lease runs longest.
        let holder = envelopes
            .iter()
            .filter_map(|e| {
                let (owner, _) = e.read::<MemberInfo>(&self.keys, &key, unix).ok()?;
                let member = PeerId::from_bytes(owner).ok()?;
                Some((member, Duration::from_secs(e.expires.saturating_sub(unix))))
            })
            .max_by_key(|(_, remaining)| *remaining);
        self.events.push_back(Event::Holder { address, holder });
    }

    /// Claims the LAN host `address` now, whatever its retry timer says (a handoff found it
    /// free, or the silent holder's lease lapsed). The outcome is [`Event::HostedClaimed`].
    pub fn claim_hosted_now(&mut self, address: IpAddr, now: Instant) {
        match address {
            IpAddr::V4(a) => match self.hosted.get_mut(&a) {
                Some(h) if h.claiming.is_none() => h.next = Some(now),
                Some(_) => {}
                None => self.add_hosted(a, now),
            },
            IpAddr::V6(a) => self.claim_hosted6_now(a, now),
        }
    }

    /// Migration target: the host that moved here with `address` is the DHCP client
    /// `client` (its lease came with it): the address stays that client's.
    pub fn adopt_dhcp_client(&mut self, address: Ipv4Addr, client: Vec<u8>) {
        if self.holds(address) {
            self.dhcp_clients.insert(address, client);
        }
    }

    /// A LAN host uses an address another member holds, and the handoff did not bring it
    /// here (the other member's host still answers, or it gave up): counted as a conflict.
    pub fn hosted_conflict(&mut self) {
        self.hosted_conflicts += 1;
    }
}
